#!/usr/bin/env python3
"""How fast can the wgmma family's TMA producer stream a decode cache? benchmarks/probes/tma_stream.cu is the
producer with the attention taken out (a consumer stand-in that holds each slot SPIN_CYCLES), timed over variants
of the ring, CTAs per SM, splits, consumer hold time and the tensor maps' L2 promotion, on one decode cache.

    python benchmarks/tma_stream_probe.py [--batch 32 --kv-heads 8 --seqlen-k 4096] [--out DIR]

Why: on B32 H32/8 Nk4096 d128 bf16 the decode kernel reads K/V at 4.06-4.09 TB/s (85.5 % of DRAM peak in ncu),
cuDNN at 4.26 (89 %), and neither deeper rings, two CTAs per SM nor a balanced (stream) split scheduler moved ours
(docs/benchmarks.md, "Decode: the large rows' gap, measured"). This separates the producer's own limit from the
consumer's: if the stand-in with SPIN 0 already stops near 4.1 TB/s, the producer pattern (box shape, one thread,
L2 promotion) is the limit; if it reaches cuDNN's rate and falls as SPIN grows, the consumer's hold time is.

Each variant is timed inside a captured CUDA graph (autotune.measure.timing.bench_graph; the cache is > 2 × L2 so
nothing stays in L2 between calls), beside the device's own read rate (a sum over 2 GiB) and SDPA cuDNN on the
same cache (one query token, 4 query heads per K/V head). Prints a markdown table; OUT/tma_stream.json has it all.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import ctypes
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SOURCE = ROOT / "benchmarks" / "probes" / "tma_stream.cu"
SMEM_OPTIN = 232448
SMEM_PER_SM = 233472
# (BC, STAGES, SPLITS, SPIN_CYCLES, MIN_BLOCKS, L2 promotion); the first block varies one thing at a time around
# the shipped B32 Nk4096 row (BC 128, 2 stages, 1 split, 1 CTA per SM).
VARIANTS = (
    [(128, 2, 1, spin, 1, "256B") for spin in (0, 500, 1000, 2000, 4000)]
    + [(128, st, 1, 1000, 1, "256B") for st in (3, 4, 6) if st * 2 * 128 * 256 + 2048 <= SMEM_OPTIN]
    + [(bc, st, 1, 1000 * bc // 128, 1, "256B") for bc, st in ((64, 2), (64, 4), (64, 6), (192, 2))]
    + [(64, st, 1, 500, 2, "256B") for st in (2, 3)]
    + [(128, 2, s, 1000, 1, "256B") for s in (2, 4)]
    + [(128, 2, 1, 0, 1, promo) for promo in ("128B", "none")]
    + [(128, 2, 1, 1000, 1, promo) for promo in ("128B", "none")]
    + [(64, 6, 1, 0, 1, "none"), (64, 3, 1, 0, 2, "none")]
)


def smem_bytes(bc: int, stages: int) -> int:
    return 1024 + 2 * stages * bc * 128 * 2 + 16 * stages


def fits(bc: int, stages: int, min_blocks: int) -> bool:
    need = smem_bytes(bc, stages)
    return need <= SMEM_OPTIN and (min_blocks == 1 or min_blocks * (need + 1024) <= SMEM_PER_SM)


def compile_variant(nvcc: str, bc: int, stages: int, splits: int, spin: int, min_blocks: int, out_dir: Path) -> bytes:
    cubin = out_dir / f"tma_stream_{bc}_{stages}_{splits}_{spin}_{min_blocks}.cubin"
    if not cubin.exists():
        cmd = [nvcc, "-arch=sm_90a", "-cubin", "-O3", "-std=c++17", f"-DBC={bc}", f"-DSTAGES={stages}",
               f"-DSPLITS={splits}", f"-DSPIN_CYCLES={spin}", f"-DMIN_BLOCKS={min_blocks}", str(SOURCE), "-o",
               str(cubin)]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
    return cubin.read_bytes()


class ProbeParams(ctypes.Structure):
    _fields_ = [("seqlen_k", ctypes.c_int), ("kv_heads", ctypes.c_int), ("sink", ctypes.c_void_p)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--seqlen-k", type=int, default=4096)
    ap.add_argument("--out", type=Path, default=Path("tma-stream-out"))
    args = ap.parse_args(argv)
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from autotune.build.nvcc import find_nvcc
    from autotune.launch import tma
    from autotune.launch.loader import load_kernel
    from autotune.measure.timing import bench_graph

    if not torch.cuda.is_available():
        print("tma_stream_probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    variants = [v for v in dict.fromkeys(VARIANTS) if fits(v[0], v[1], v[4])]
    nvcc = str(find_nvcc())
    build_dir = Path(tempfile.mkdtemp(prefix="tma-stream-"))
    t0 = time.monotonic()
    with cf.ThreadPoolExecutor(16) as pool:
        cubins = list(pool.map(lambda v: compile_variant(nvcc, v[0], v[1], v[2], v[3], v[4], build_dir), variants))
    print(f"{len(variants)} variants compiled in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)

    b, h, n, d = args.batch, args.kv_heads, args.seqlen_k, 128
    k = torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    kv_bytes = 2 * k.numel() * k.element_size()
    sink = torch.zeros(1, dtype=torch.int64, device="cuda")
    params = ProbeParams(n, h, sink.data_ptr())
    big = torch.ones(1 << 29, dtype=torch.float32, device="cuda")
    acc = torch.empty((), dtype=torch.float32, device="cuda")
    read_us = bench_graph([lambda: torch.sum(big, dim=0, out=acc)]).median_ms * 1e3
    read_tbs = big.numel() * 4 / (read_us * 1e-6) / 1e12
    q = torch.randn(b, 4 * h, 1, d, device="cuda", dtype=torch.bfloat16)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    cudnn_us = bench_graph([cudnn]).median_ms * 1e3

    rows = []
    for (bc, stages, splits, spin, min_blocks, promo), cubin in zip(variants, cubins):
        maps = []
        for t, name in ((k, "k"), (v, "v")):
            maps.append(tma.encode(t, bc, name, promo))
        smem = smem_bytes(bc, stages)
        kernel = load_kernel(cubin, "tma_stream", smem)
        grid = (b * h * splits, 1, 1)
        per_sm = kernel.blocks_per_sm(256, smem)

        def run(kernel=kernel, grid=grid, smem=smem, maps=maps):
            kernel.launch(params, grid, (256, 1, 1), smem, None, maps)
        us = bench_graph([run]).median_ms * 1e3
        rows.append({"bc": bc, "stages": stages, "splits": splits, "spin_cycles": spin, "min_blocks": min_blocks,
                     "l2_promotion": promo, "ctas_per_sm": per_sm, "us": us, "tbs": kv_bytes / (us * 1e-6) / 1e12})
        print(f"  bc {bc} stages {stages} splits {splits} spin {spin} mb {min_blocks} {promo}: {us:.1f} µs "
              f"{rows[-1]['tbs']:.2f} TB/s", file=sys.stderr, flush=True)

    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
            "command": " ".join(sys.argv), "cache": f"B{b} Hkv{h} Nk{n} d128 bf16", "kv_bytes": kv_bytes,
            "read_tbs": read_tbs, "cudnn_us": cudnn_us, "cudnn_tbs": kv_bytes / (cudnn_us * 1e-6) / 1e12}
    (args.out / "tma_stream.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    print(f"\n{meta['gpu']}, {meta['date']}; cache {meta['cache']} ({kv_bytes / 1e6:.0f} MB); device read "
          f"{read_tbs:.2f} TB/s; SDPA cuDNN decode on it {cudnn_us:.1f} µs = {meta['cudnn_tbs']:.2f} TB/s\n")
    print("| Bc | stages | splits | consumer hold (cycles) | min_blocks | CTAs/SM | L2 promotion | µs | TB/s | % of read |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['bc']} | {r['stages']} | {r['splits']} | {r['spin_cycles']} | {r['min_blocks']} | "
              f"{r['ctas_per_sm']} | {r['l2_promotion']} | {r['us']:.1f} | {r['tbs']:.2f} | "
              f"{100 * r['tbs'] / read_tbs:.0f} % |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
