#!/usr/bin/env python3
"""A/B a kernel source change on the GPU: the same configs built from two kernel trees, timed in one process.

    git archive <rev> kernels | tar -x -C .ab/<rev>          # the "before" tree (any directory laid out like kernels/)
    python benchmarks/kernel_ab.py --before .ab/<rev>/kernels [--shape KEY ...] [--config KEY ...] [--out DIR]

For each shape (default: the five of benchmarks/h200_sweep.py) the configs are the --config ones valid for it, or
else the default config of each --family (default: mma_sync). Each config is built from the "before" tree and
from this checkout's kernels/ (one Builder cache: the source digest keeps them apart), then both builds are
checked against the fp32 reference and timed alternately, before/after/before/after, in one child process
(h200_sweep.Runner: a kernel that faults costs its row, and the next row gets a fresh CUDA context), and SDPA's
flash, cuDNN and memory-efficient backends are timed the same way beside them. A row's time is the better of its
two runs (the alternation keeps clock drift from favouring either side). The compiler's
figures (registers, spill bytes) of both builds go in the table too, since a source change often moves them.

`--before-ptxas` / `--after-ptxas` assemble a side with another ptxas (autotune/build/ptxas_swap.py): with
`--before kernels` and `--after-ptxas`, the A/B of the assembler release alone.

Output: a markdown table per shape (printed, and in OUT/ab.md), everything in OUT/ab.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import space  # noqa: E402
from h200_sweep import DEFAULT_SHAPES, Runner, parse_shape  # noqa: E402


def log(*parts) -> None:
    print(*parts, flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, type=Path,
                    help="the kernel tree to compare against (a directory laid out like kernels/)")
    ap.add_argument("--shape", action="append", default=[], help="shape key, e.g. b4-h16-n4096-d128-fp16-full")
    ap.add_argument("--config", action="append", default=[], help="config key (repeatable)")
    ap.add_argument("--family", action="append", default=[], help="family whose default config to time (default "
                    "mma_sync when no --config is given)")
    for side in ("before", "after"):
        ap.add_argument(f"--{side}-ptxas", type=Path, help=f"assemble the {side} side with this ptxas (default: "
                        "$AUTOTUNE_PTXAS if set, else nvcc's own; autotune/build/ptxas_swap.py); with --before "
                        "kernels, an A/B of the assembler alone")
    ap.add_argument("--rounds", type=int, default=2, help="before/after alternations per config (default 2)")
    ap.add_argument("--warmup-ms", type=float, default=25)
    ap.add_argument("--rep-ms", type=float, default=100)
    ap.add_argument("--out", type=Path, default=Path("ab-out"))
    ap.add_argument("--build-only", action="store_true", help="build both sides and print the compiler's figures "
                    "(no GPU needed; pass --arch)")
    ap.add_argument("--arch", help="target arch (default: the visible GPU's)")
    args = ap.parse_args(argv)
    if not (args.before / "common").is_dir():
        ap.error(f"--before {args.before}: expected a kernel tree (with common/), not found")
    if args.rounds < 1:
        ap.error(f"--rounds: expected a count ≥ 1, got {args.rounds}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from autotune.build.builder import Builder, default_kernels_dir

    if args.arch:
        arch = space.get_arch(args.arch)
    else:
        import torch

        arch = space.get_arch(torch.cuda.get_device_capability(0))
    shapes = [parse_shape(k) for k in (args.shape or DEFAULT_SHAPES)]
    families = args.family or (["mma_sync"] if not args.config else [])
    configs_given = [space.Config.from_key(k) for k in args.config]
    cache = os.environ.get("AUTOTUNE_CACHE_DIR")
    trees = {"before": args.before.resolve(), "after": default_kernels_dir()}
    ptxas = {"before": args.before_ptxas, "after": args.after_ptxas}
    builders = {side: Builder(arch, cache_dir=cache, kernels_dir=tree, ptxas=ptxas[side])
                for side, tree in trees.items()}
    for side, builder in builders.items():
        log(f"{side}: {trees[side]}, {builder.nvcc_version}")

    plan = []  # (shape, config)
    for shape in shapes:
        problem = shape.problem
        chosen = [c for c in configs_given if space.is_valid(c, problem, arch)]
        chosen += [space.default_config(problem, arch, f) for f in families]
        plan += [(shape, c) for c in dict.fromkeys(chosen)]
    t0 = time.monotonic()
    builds = {}
    for side, builder in builders.items():
        for (shape, config), b in zip(plan, builder.build([(c, s.problem) for s, c in plan])):
            builds[(side, shape, config)] = b
    log(f"built {len(builds)} kernels from {trees['before']} and {trees['after']} in {time.monotonic() - t0:.0f} s")
    if args.build_only:
        for shape, config in plan:
            log(f"{shape.key} {config.key}: " + " → ".join(_regs(builds[(side, shape, config)]) for side in trees))
        return 0

    runner = Runner(timeout_s=300)
    rows, tables = [], []
    try:
        gpu = runner.device()["gpu_name"]
        for shape in shapes:
            timings, reasons = runner.baselines(shape, "bhnd", args.warmup_ms, args.rep_ms)
            base = {k: (shape.flops / (t.median_ms * 1e-3) / 1e12 if t else None) for k, t in timings.items()}
            lines = [f"### {shape.key} — SDPA flash {_f(base['flash'])}, cuDNN {_f(base['cudnn'])} TFLOPS", "",
                     "| config | before | after | change | after vs flash | regs / spill st+ld B (before → after) |",
                     "|---|---|---|---|---|---|"]
            for s, config in plan:
                if s != shape:
                    continue
                best: dict[str, float | None] = {"before": None, "after": None}
                notes = []
                for r in range(args.rounds):
                    for side in ("before", "after"):
                        b = builds[(side, shape, config)]
                        if not b.ok:
                            notes.append(f"{side}: {b.status} {b.error or ''}".strip())
                            continue
                        ev = runner.evaluate(b, shape, 1000 + r, "bhnd", args.warmup_ms, args.rep_ms)
                        if ev.status != "complete":
                            notes.append(f"{side}: {ev.status} {ev.reason or ''}"[:200])
                            continue
                        best[side] = max(best[side] or 0.0, ev.tflops)
                regs = " → ".join(_regs(builds[(side, shape, config)]) for side in ("before", "after"))
                change = (f"{(best['after'] / best['before'] - 1) * 100:+.1f} %"
                          if best["before"] and best["after"] else "—")
                vs_flash = f"{best['after'] / base['flash']:.2f}×" if best["after"] and base["flash"] else "—"
                lines.append(f"| `{config.key}` | {_f(best['before'])} | {_f(best['after'])} | {change} | {vs_flash} "
                             f"| {regs} |")
                rows.append({"shape": shape.key, "config": config.key, "before": best["before"],
                             "after": best["after"], "sdpa": base, "notes": notes, "registers": regs})
                log(lines[-1] + (f"  ({'; '.join(notes)})" if notes else ""))
            tables.append("\n".join(lines))
            log(tables[-1])
    finally:
        runner.close()
    args.out.mkdir(parents=True, exist_ok=True)
    header = f"GPU: {gpu}; before: {trees['before']}; after: {trees['after']}\n\n"
    (args.out / "ab.md").write_text(header + "\n\n".join(tables) + "\n")
    (args.out / "ab.json").write_text(json.dumps({"gpu": gpu, "rows": rows}, indent=1))
    return 0


def _regs(build) -> str:
    r = build.report
    return f"{r.registers} / {r.spill_stores}+{r.spill_loads}" if r else build.status


def _f(x) -> str:
    return f"{x:.1f}" if x else "—"


if __name__ == "__main__":
    sys.exit(main())
