"""What capture (autotune/runtime/capture.py) adds to one warm autotune.attention call, on any machine.

The kernel launch is replaced by a stand-in that returns at once (the launcher of attention_op's memo), so what is
timed is attention's own host path: flag checks, the memo lookup and, with capture on, the capture hook. The
difference of the two medians is capture's cost per call.

    PYTHONPATH=. python3 benchmarks/capture_overhead.py [--calls 100000] [--rounds 9]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from autotune.runtime import attention_op as op
from autotune.runtime import capture


def per_call_us(fn, calls: int) -> float:
    """The mean time of one fn() call over `calls` calls, in µs."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=9)
    args = p.parse_args()
    op._new_launcher = lambda q, k, v, *rest: (lambda q, k, v: (q, None))  # the stand-in kernel: returns at once
    q = torch.empty(4, 32, 1000, 128, dtype=torch.bfloat16)
    k = torch.empty(4, 8, 1000, 128, dtype=torch.bfloat16)

    def call():
        op.forward(q, k, k, True, None, False)

    off, on, hook = [], [], []
    with tempfile.TemporaryDirectory() as d:
        cap = capture.CaptureFile(Path(d) / "shapes.toml")
        for _ in range(args.rounds):  # interleaved, so that a busy machine slows both alike
            off.append(per_call_us(call, args.calls))
            capture._active, capture.recording = cap, True
            on.append(per_call_us(call, args.calls))
            hook.append(per_call_us(lambda: capture.record(q, k, True), args.calls))
            capture._active, capture.recording = None, False
        cap.close()
    m = statistics.median
    print(f"attention host path with a stand-in launch: capture off {m(off):.2f} µs/call, on {m(on):.2f} µs/call "
          f"(difference {m(on) - m(off):.2f}); the capture hook alone {m(hook):.2f} µs/call "
          f"(medians of {args.rounds} interleaved rounds of {args.calls} calls; torch {torch.__version__})")


if __name__ == "__main__":
    main()
