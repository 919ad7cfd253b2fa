#!/usr/bin/env python3
"""Is a short shape's time ours on the GPU, or the host's? `autotune.attention` and SDPA cuDNN, eager and replayed
from a CUDA graph, on the same inputs, plus the host's own cost per call.

    python benchmarks/host_overhead.py [--shape KEY ...] [--out DIR]

For each shape (default: the peer table's two short ones and d128 N4096 as the long control):
- eager: `autotune.measure.timing.bench` of the call, as benchmarks/peers_table.py times it (L2 flushed before each
  repetition; the host enqueues ahead, so its cost per call shows only where it exceeds the GPU's per repetition);
- graph: the same call captured once in a CUDA graph and replayed (no Python, no launch path: the kernel alone);
- host µs/call: wall time of 200 back-to-back calls without synchronising, divided by 200, once the queue is warm
  (an upper bound of what the host spends per call; if it exceeds the kernel's time, eager measures the host).
If eager is well below graph on a shape, the gap to the peers there is on the host, not in the kernel.
Output: a markdown table (printed, and OUT/host_overhead.md).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from h200_sweep import parse_shape  # noqa: E402

SHAPES = ("b16-h16-n512-d64-fp16-full", "b1-h64-n1024-d128-fp16-full", "b4-h16-n4096-d128-fp16-full")
HOST_CALLS = 200


def graph_of(fn):
    """fn captured in a CUDA graph (after a warm-up call on a side stream, as torch requires); None if it cannot be."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def host_us(fn) -> float:
    import torch

    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(HOST_CALLS):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / HOST_CALLS * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", action="append", default=[], help="shape key (default: %s)" % ", ".join(SHAPES))
    ap.add_argument("--out", type=Path, default=Path("host-overhead-out"))
    args = ap.parse_args(argv)
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import autotune
    from autotune.measure.check import make_inputs
    from autotune.measure.timing import bench

    lines = ["| shape | kernel | eager TFLOPS | graph TFLOPS | eager / graph | host µs/call | graph µs |",
             "|---|---|---|---|---|---|---|"]
    for key in args.shape or SHAPES:
        shape = parse_shape(key)
        q, k, v = make_inputs(shape, "bhnd", seed=1)

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=shape.causal)

        calls = {"ours": lambda: autotune.attention(q, k, v, causal=shape.causal), "sdpa cudnn": cudnn}
        for name, fn in calls.items():
            row = [shape.key, name]
            try:
                eager = bench(fn).median_ms
                host = host_us(fn)
            except Exception as e:  # noqa: BLE001  (a peer that cannot run on this shape costs its row only)
                lines.append(f"| {shape.key} | {name} | failed: {type(e).__name__}: {str(e)[:120]} | | | | |")
                print(lines[-1], flush=True)
                continue
            try:
                g = graph_of(fn)
                graph = bench(g.replay).median_ms
            except Exception as e:  # noqa: BLE001
                graph = None
                row_note = f"capture failed: {type(e).__name__}: {str(e)[:100]}"
            tf = lambda ms: shape.tflops(ms / 1e3)  # noqa: E731
            row += [f"{tf(eager):.1f}", f"{tf(graph):.1f}" if graph else row_note,
                    f"{graph / eager:.2f}" if graph else "—", f"{host:.1f}", f"{graph * 1e3:.1f}" if graph else "—"]
            lines.append("| " + " | ".join(row) + " |")
            print(lines[-1], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    table = "\n".join(lines) + "\n"
    (args.out / "host_overhead.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
