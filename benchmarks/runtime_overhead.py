#!/usr/bin/env python3
"""autotune.attention end to end vs torch SDPA, and the Python-side cost of a warm call.

    python benchmarks/runtime_overhead.py [--shape KEY ...] [--quick] [--iters 20000] [--out DIR]

Part 1, speed: for each shape (default: the shipped matrix, B·N = 16384 and H = 2048/D as in docs/DESIGN.md's
table: d64/d128 × fp16/bf16 × full/causal × seqlen 512..16384; --quick: seqlen 4096 only) time
`autotune.attention(q, k, v, causal=...)` end to end (lookup memo, allocation, launch) and SDPA's flash and cuDNN
backends with one discipline (autotune.measure.timing.bench: L2 flush, CUDA events, median). The selection source
(storage / shipped / nearest / heuristic) and the max |difference| to SDPA's output are shown per row. Kernels a
shape needs are built on first use (one stderr line each) and come from the shared cache afterwards.

Part 2, overhead: a 1×1×128×64 fp16 call, timed on the host with time.perf_counter over --iters calls after a
warm-up, with a single synchronize after the loop (host time per call is what the loop took before it; the GPU
finishes its ~µs kernels faster than the host issues them, so the queue never fills). Compared with:
  * bare launch:   the loader's prepared Launch (same kernel, prebuilt params, no allocation), the floor;
  * relaunch:      the loader's Relaunch of that Launch with the same pointers (what a warm attention call runs
                   after allocating its output: pointers written, stream read, launch);
  * op path:       torch.ops.autotune.flash_attention_fwd, i.e. through the torch dispatcher (what compiled graphs
                   and autograd-recording calls use);
  * sdpa:          F.scaled_dot_product_attention on the same tensors, for scale.
The target is autotune.attention − bare launch < 20 µs. Each figure is the median of 5 rounds.

Output: a compact table on stdout; OUT/runtime_overhead.md (the same tables) and OUT/runtime_overhead.json.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from space import Shape  # noqa: E402

SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
OVERHEAD_TARGET_US = 20.0
_SHAPE_KEY = re.compile(r"b(\d+)-h(\d+)(?:-kv(\d+))?-n(\d+)(?:-k(\d+))?-d(\d+)-(fp16|bf16)-(full|causal)")


def parse_shape(key: str) -> Shape:
    """Inverse of space.Shape.key, e.g. 'b4-h16-n4096-d128-fp16-causal' or 'b2-h32-kv8-n1000-d64-bf16-full'."""
    m = _SHAPE_KEY.fullmatch(key.strip())
    if not m:
        raise ValueError(f"--shape: expected a key like 'b4-h16-n4096-d128-fp16-full' (optional -kvK, -kN), got {key!r}")
    b, h, kv, n, nk, d, dtype, mask = m.groups()
    return Shape(batch=int(b), heads=int(h), kv_heads=int(kv) if kv else None, seqlen_q=int(n),
                 seqlen_k=int(nk) if nk else None, head_dim=int(d), dtype=dtype, causal=mask == "causal")


def shipped_matrix(seqlens=SEQLENS) -> list[Shape]:
    return [Shape(batch=max(1, 16384 // n), heads=2048 // d, seqlen_q=n, head_dim=d, dtype=dt, causal=c)
            for d in (64, 128) for dt in ("fp16", "bf16") for c in (False, True) for n in seqlens]


# ---- part 1: speed ----------------------------------------------------------------------------------------

def speed_row(shape: Shape) -> dict:
    import torch

    import autotune
    from autotune.runtime import attention_op as op
    from autotune.measure.check import make_inputs
    from autotune.measure.evaluate import BackendUnavailable, sdpa_baseline
    from autotune.measure.timing import bench

    q, k, v = make_inputs(shape, "bhnd", seed=0)  # the inputs sdpa_baseline uses too
    row = {"shape": shape.key}
    try:
        inputs = op.check_inputs(q, k, v)
        plan = op.runtime.resolve(q.device.index, op.shape_of(inputs, shape.causal))
        row.update(source=plan.selection.source, config=plan.selection.config.key,
                   distance=plan.selection.distance)
        out = autotune.attention(q, k, v, causal=shape.causal)
        expected = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=shape.causal, enable_gqa=shape.kv_heads != shape.heads)
        row["max_diff_vs_sdpa"] = (out.float() - expected.float()).abs().max().item()
        t = bench(lambda: autotune.attention(q, k, v, causal=shape.causal))
        row.update(ms=t.median_ms, tflops=shape.tflops(t.median_ms / 1e3))
    except Exception as e:  # one broken shape is a row, not the end of the benchmark
        row["error"] = f"{type(e).__name__}: {e}"
    for backend in ("flash", "cudnn"):
        try:
            t = sdpa_baseline(shape, backend)
            row[f"sdpa_{backend}_tflops"] = shape.tflops(t.median_ms / 1e3)
        except BackendUnavailable as e:
            row[f"sdpa_{backend}_error"] = str(e)
        if row.get("tflops") and row.get(f"sdpa_{backend}_tflops"):
            row[f"vs_{backend}"] = row["tflops"] / row[f"sdpa_{backend}_tflops"]
    return row


def speed_table(rows: list[dict]) -> str:
    def num(x, fmt):
        return format(x, fmt) if isinstance(x, (int, float)) else "-"

    lines = ["| shape | source | autotune TFLOPS | SDPA flash | SDPA cuDNN | ×flash | ×cuDNN | max diff | config |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['shape']} | {r.get('source', '-')} | {num(r.get('tflops'), '.1f')} | "
                     f"{num(r.get('sdpa_flash_tflops'), '.1f')} | {num(r.get('sdpa_cudnn_tflops'), '.1f')} | "
                     f"{num(r.get('vs_flash'), '.2f')} | {num(r.get('vs_cudnn'), '.2f')} | "
                     f"{num(r.get('max_diff_vs_sdpa'), '.1e')} | {r.get('error') or r.get('config', '-')} |")
    return "\n".join(lines)


# ---- part 2: overhead -------------------------------------------------------------------------------------

def host_us_per_call(fn, iters: int, rounds: int = 5, warmup: int = 500) -> dict:
    """Median over rounds of host µs per call (loop time before the final sync), plus the time with the sync."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    per_round, with_sync = [], []
    n = max(1, iters // rounds)
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        issued = time.perf_counter()
        torch.cuda.synchronize()
        done = time.perf_counter()
        per_round.append((issued - start) / n * 1e6)
        with_sync.append((done - start) / n * 1e6)
    return {"us": statistics.median(per_round), "us_with_sync": statistics.median(with_sync),
            "rounds_us": per_round, "calls_per_round": n}


def overhead(iters: int) -> dict:
    import torch
    import torch.nn.functional as F

    import autotune
    from autotune.launch import loader
    from autotune.runtime import attention_op as op

    q, k, v = (torch.randn(1, 1, 128, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    inputs = op.check_inputs(q, k, v)
    plan = op.runtime.resolve(q.device.index, op.shape_of(inputs, False))
    o = torch.empty_like(q)
    bare = plan.runner.prepare(q, k, v, o)  # prebuilt params: only cuLaunchKernel's Python path remains
    relaunch = loader.Relaunch(bare)
    pointers = (q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr())
    # the same result from every route (a benchmark of a wrong call is worth nothing)
    ref = autotune.attention(q, k, v)
    bare()
    via_op = torch.ops.autotune.flash_attention_fwd(q, k, v, False, None, False)[0]
    torch.cuda.synchronize()
    assert torch.equal(ref, o) and torch.equal(ref, via_op), "routes disagree"

    with torch.no_grad():
        routes = {
            "bare_launch": host_us_per_call(bare, iters),
            "relaunch": host_us_per_call(lambda: relaunch(*pointers), iters),
            "attention": host_us_per_call(lambda: autotune.attention(q, k, v), iters),
            "attention_lse": host_us_per_call(lambda: autotune.attention(q, k, v, return_lse=True), iters),
            "op_path": host_us_per_call(lambda: torch.ops.autotune.flash_attention_fwd(q, k, v, False, None, False),
                                        iters),
            "torch_empty_x1": host_us_per_call(lambda: torch.empty(q.shape, dtype=q.dtype, device=q.device), iters),
            "sdpa": host_us_per_call(lambda: F.scaled_dot_product_attention(q, k, v), iters),
        }
    extra = routes["attention"]["us"] - routes["bare_launch"]["us"]
    return {"shape": "b1-h1-n128-d64-fp16-full", "config": plan.selection.config.key,
            "source": plan.selection.source, "routes": routes, "extra_us": extra,
            "extra_op_path_us": routes["op_path"]["us"] - routes["bare_launch"]["us"],
            "target_us": OVERHEAD_TARGET_US, "within_target": extra < OVERHEAD_TARGET_US}


def overhead_table(o: dict) -> str:
    base = o["routes"]["bare_launch"]["us"]
    lines = ["| route (1×1×128×64 fp16, warm) | host µs/call | − bare launch | with final sync |",
             "|---|---:|---:|---:|"]
    for name, r in o["routes"].items():
        lines.append(f"| {name} | {r['us']:.2f} | {r['us'] - base:+.2f} | {r['us_with_sync']:.2f} |")
    verdict = "within" if o["within_target"] else "OVER"
    lines.append(f"\nautotune.attention − bare launch = {o['extra_us']:.2f} µs ({verdict} the "
                 f"{o['target_us']:.0f} µs target); config {o['config']} ({o['source']})")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", action="append", default=[], metavar="KEY", help="a shape key (repeatable)")
    p.add_argument("--quick", action="store_true", help="the shipped matrix at seqlen 4096 only")
    p.add_argument("--iters", type=int, default=20000, help="calls per overhead route (default 20000)")
    p.add_argument("--skip-speed", action="store_true", help="only the overhead part")
    p.add_argument("--out", type=Path, default=None, help="directory for runtime_overhead.{md,json}")
    args = p.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("runtime_overhead: needs a CUDA GPU", file=sys.stderr)
        return 2
    shapes = [parse_shape(s) for s in args.shape] or shipped_matrix((4096,) if args.quick else SEQLENS)
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "cudnn": torch.backends.cudnn.version(), "speed": [], "overhead": None}

    def save(md: str) -> None:
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "runtime_overhead.json").write_text(json.dumps(result, indent=2) + "\n")
            (args.out / "runtime_overhead.md").write_text(md + "\n")

    print(f"# autotune.attention on {result['gpu']} (torch {result['torch']}, cuDNN {result['cudnn']})", flush=True)
    if not args.skip_speed:
        for i, shape in enumerate(shapes, 1):
            row = speed_row(shape)
            result["speed"].append(row)
            print(f"[{i}/{len(shapes)}] {shape.key}: {row.get('tflops', float('nan')):.1f} TFLOPS "
                  f"({row.get('source', '-')}) {row.get('error', '')}", flush=True)
            save(speed_table(result["speed"]))
        print("\n" + speed_table(result["speed"]))
    result["overhead"] = overhead(args.iters)
    md = (speed_table(result["speed"]) + "\n\n" if result["speed"] else "") + overhead_table(result["overhead"])
    print("\n" + overhead_table(result["overhead"]))
    save(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
