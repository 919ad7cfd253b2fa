#!/usr/bin/env python3
"""`autotune.attention` against the best kernels a user can install, all in one process, shape by shape.

    python benchmarks/peers_table.py [--shape KEY ...] [--out DIR]

Rows: the shapes of docs/benchmarks.md's peer table (default) or --shape keys (b4-h16-n4096-d128-fp16-full,
...-causal, b2-h8-n4096-d256-bf16-full). Columns: ours = `autotune.attention` exactly as a user calls it (the
config comes from the storage, else the tables shipped in studies/tuned/, else the nearest tuned shape, else
the heuristic default; the config that ran is printed under the table), SDPA's flash (FlashAttention-2) and
cuDNN backends, and FlashAttention-4 (flash_attn.cute; its SM90 path is the FlashAttention-3 design) where it
imports. Each kernel runs on its own layout: ours and SDPA on (B, H, N, D), FlashAttention-4 on (B, N, H, D).
Every output is checked against torch SDPA on the same inputs before anything is timed; every time is
autotune.measure.timing.bench's median (L2 flushed before each repetition, CUDA events), taken --rounds times
per kernel, interleaved across the row's kernels, the best round kept (one pass alone moved a row by up to 4 %
on the H200 between alternations of one binary). TFLOPS = 4·B·H·N²·D / time,
halved for causal; "ours / best" is against the fastest peer of the row.

Output: a markdown table (printed last) and OUT/peers.json.

--decode: also the decode rows (benchmarks/decode_table.py's, B1 / B32 / B128 × Nk 4096 / 32768 and the rest), in
the same process after the prefill rows: those kernels run for tens of µs, so they are timed as decode_table times
them (inside a captured CUDA graph, K/V rotated past L2, µs and TB/s against the device's own rates measured in the
same run), never by the eager timer above. Their table is printed after the prefill one and written to
OUT/decode.json.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from h200_sweep import DEFAULT_SHAPES  # noqa: E402
from h200_sweep import parse_shape as parse_shape_key  # noqa: E402
from space import Shape  # noqa: E402

# h200_sweep's five, the two where the peers led by most on 2026-12-01 (short sequences, d256), and the shapes real
# models run: a DiT's joint attention, Llama-3-8B's prefill (GQA, causal), a ViT-L/14 at 336 px, and a query chunk
# against a GQA cache (the prefill issue's table)
SHAPES = DEFAULT_SHAPES + (
    "b16-h16-n512-d64-fp16-full", "b2-h8-n4096-d256-bf16-full",
    "b1-h24-n4608-d128-bf16-full", "b1-h32-kv8-n8192-d128-bf16-causal", "b64-h16-n577-d64-bf16-full",
    "b1-h32-kv8-n512-k8192-d128-bf16-full",
)
PEERS = ("sdpa_flash", "sdpa_cudnn", "fa4")
TOLERANCE = 2e-2  # vs torch SDPA in the same 16-bit dtype (see autotune.measure.peer_fa4.PEER_TOLERANCE)


def parse_shape(key: str) -> Shape:
    try:
        return parse_shape_key(key)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--shape: {e}") from None


def rel_error(got, want) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


def measure_shape(shape: Shape, warmup_ms: float, rep_ms: float, rounds: int = 1) -> dict:
    """Every kernel of the row checked against torch SDPA, then timed `rounds` times, interleaved (ours, the SDPA
    backends, FlashAttention-4, then the next round from the next kernel on), so that a slow or fast stretch of the
    GPU's clocks lands on every column alike; a column's number is its best round's median, `spread` its rounds'
    (max - min) / max, `samples` every round's TFLOPS."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import autotune
    from autotune.measure import peer_fa4
    from autotune.measure.check import make_inputs
    from autotune.measure.timing import bench

    if shape.causal and shape.seqlen_q != shape.seqlen_k:
        raise ValueError(f"--shape {shape.key}: causal rows need seqlen_q == seqlen_k here (SDPA's is_causal is "
                         "aligned top-left, FlashAttention's bottom-right: not one function to compare)")
    q, k, v = make_inputs(shape, "bhnd", seed=1)
    gqa = {"enable_gqa": True} if shape.kv_heads != shape.heads else {}  # K/V heads go in grouped, as they are
    row: dict = {"shape": shape.key, "notes": {}, "rounds": rounds}
    calls = {}  # name -> (call, the SDPA backend it runs under or None)
    with torch.no_grad():
        want = F.scaled_dot_product_attention(q, k, v, is_causal=shape.causal, **gqa)
        ours = lambda: autotune.attention(q, k, v, causal=shape.causal)  # noqa: E731
        err = rel_error(ours(), want)
        # the config and where it came from (shipped exact, another GPU's row of the arch, nearest, heuristic)
        row["config"], row["source"] = autotune.explain(q, k, v, causal=shape.causal).splitlines()[:2]
        if not err <= TOLERANCE:
            row["notes"]["ours"] = f"wrong: relative error {err:.3g} vs SDPA"
        else:
            calls["ours"] = (ours, None)
        for name, backend in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
            fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=shape.causal, **gqa)  # noqa: E731
            try:
                with sdpa_kernel(backend):
                    err = rel_error(fn(), want)
            except RuntimeError as e:
                row["notes"][name] = f"refused: {str(e).splitlines()[0]}"
                continue
            if not err <= TOLERANCE:
                row["notes"][name] = f"wrong: relative error {err:.3g}"
                continue
            calls[name] = (fn, backend)
    try:
        calls["fa4"] = (peer_fa4.fa4_checked_call(shape), None)
    except peer_fa4.PeerUnavailable as e:
        row["notes"]["fa4"] = str(e)
    def tflops(name):
        fn, backend = calls[name]
        with torch.no_grad(), sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
            return shape.tflops(bench(fn, warmup_ms=warmup_ms, rep_ms=rep_ms).median_ms / 1e3)

    row["tflops"], row["spread"], row["samples"] = interleaved_best(list(calls), rounds, tflops)
    best = max((row["tflops"][p] for p in PEERS if p in row["tflops"]), default=None)
    row["best_peer"] = best
    row["ours_vs_best"] = row["tflops"]["ours"] / best if best and "ours" in row["tflops"] else None
    return row


def prebuild(shapes: list[Shape]) -> None:
    """The kernels `autotune.attention` will pick for the rows on this GPU, built in parallel into the cache it
    reads (on first use it builds them one at a time, minutes on a fresh host)."""
    import torch

    from autotune.build.builder import Builder
    from autotune.runtime import lookup

    gpu_name, arch = lookup.device_info(torch.cuda.current_device())
    items = list(dict.fromkeys((lookup.select_config(s, gpu_name, arch).config, s.problem) for s in shapes))
    t0 = time.monotonic()
    results = Builder(arch, jobs=os.cpu_count() or 1).build(items)
    failed = [r for r in results if not r.ok]
    print(f"prebuilt {len(results)} kernels for {gpu_name} in {time.monotonic() - t0:.0f} s"
          + (f" ({len(failed)} failed: the rows fall back as autotune.attention does)" if failed else ""),
          file=sys.stderr, flush=True)


def interleaved_best(names: list[str], rounds: int, measure) -> tuple[dict[str, float], dict[str, float],
                                                                      dict[str, list[float]]]:
    """measure(name) (a rate: higher is better) for every name, round after round, each round starting one name
    further on (so no name is always the first timed after the row's set-up, when the GPU has idled through a
    JIT compile): each name's best round, its (max - min) / max, and its samples in round order."""
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        start = r % len(names) if names else 0
        for name in names[start:] + names[:start]:
            samples[name].append(measure(name))
    best = {name: max(got) for name, got in samples.items()}
    return best, {name: (best[name] - min(got)) / best[name] for name, got in samples.items()}, samples


def markdown(rows: list[dict]) -> str:
    def cell(row, name):
        t = row["tflops"].get(name)
        if t is None:
            return "—"
        best = row["best_peer"]
        return f"**{t:.0f}**" if name in PEERS and best and t == best else f"{t:.0f}"

    lines = ["| shape | `autotune.attention` | SDPA flash (FA2) | SDPA cuDNN | FlashAttention-4 | ours / best peer |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r['ours_vs_best']:.2f}×" if r["ours_vs_best"] else "—"
        lines.append(f"| {r['shape']} | {cell(r, 'ours')} | {cell(r, 'sdpa_flash')} | {cell(r, 'sdpa_cudnn')} | "
                     f"{cell(r, 'fa4')} | {ratio} |")
    lines.append("")
    for r in rows:
        lines.append(f"- {r['config']}")
        if r.get("source"):
            lines.append(f"  - {r['source'].strip()}")
        if r.get("samples"):
            lines.append(f"  - {r['rounds']} rounds (TFLOPS each; each round starts one kernel further on): "
                         + "; ".join(f"{name} {' / '.join(f'{t:.0f}' for t in got)}"
                                     for name, got in r["samples"].items()))
        for name, note in r["notes"].items():
            lines.append(f"  - {name}: {note}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", action="append", type=parse_shape, default=None, help="shape key (repeatable)")
    ap.add_argument("--warmup-ms", type=float, default=25)
    ap.add_argument("--rep-ms", type=float, default=200)
    ap.add_argument("--rounds", type=int, default=4,
                    help="times each kernel is timed, interleaved with the others, each round starting one kernel "
                         "further on; a column is its best round (4: each of the four kernels goes first once)")
    ap.add_argument("--out", type=Path, default=Path("peers-out"))
    ap.add_argument("--kv-l2-promotion", choices=("256B", "128B", "none"), default=None,
                    help="A/B: the K/V tensor maps' L2 promotion for every call (default: the product's choice, "
                         "autotune.launch.tma.kv_l2_promotion: none for decode, 256B for prefill)")
    ap.add_argument("--decode", action="store_true",
                    help="also the decode rows, graph-timed as benchmarks/decode_table.py times them")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds: expected a positive count, got {args.rounds}")
    import torch

    if args.kv_l2_promotion:
        from autotune.launch import tma

        tma.kv_l2_promotion = lambda seqlen_q, choice=args.kv_l2_promotion: choice  # noqa: E731

    if not torch.cuda.is_available():
        print("peers_table: needs a CUDA GPU", file=sys.stderr)
        return 2
    shapes = args.shape or [parse_shape(k) for k in SHAPES]
    prebuild(shapes)
    rows = []
    for shape in shapes:
        t0 = time.monotonic()
        rows.append(measure_shape(shape, args.warmup_ms, args.rep_ms, args.rounds))
        print(f"{shape.key}: {({k: round(v, 1) for k, v in rows[-1]['tflops'].items()})} "
              f"({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
            "kv_l2_promotion": args.kv_l2_promotion or "product"}
    (args.out / "peers.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    print(f"\n{meta['gpu']}, torch {meta['torch']}, {meta['date']}\n")
    print(markdown(rows))
    if args.decode:
        print("\n" + decode_rows(args.out, meta))
    return 0


def decode_rows(out: Path, meta: dict) -> str:
    """decode_table.py's default rows and device rates, measured now (this process); its markdown."""
    import decode_table  # imports this module's shape parser: imported here, not at the top

    copy_tbs, read_tbs = decode_table.device_rates_tbs()
    rows = decode_table.measure_rows([decode_table.parse_shape(k) for k in decode_table.SHAPES],
                                     decode_table.sm90_builder())
    (out / "decode.json").write_text(json.dumps({"meta": {**meta, "copy_tbs": copy_tbs, "read_tbs": read_tbs},
                                                 "rows": rows}, indent=2) + "\n")
    return (f"Decode (inside a CUDA graph; device copy {copy_tbs:.2f} TB/s read + write, read {read_tbs:.2f} TB/s)\n\n"
            + decode_table.markdown(rows, max(copy_tbs, read_tbs)))


if __name__ == "__main__":
    sys.exit(main())
