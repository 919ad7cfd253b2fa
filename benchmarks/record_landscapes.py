#!/usr/bin/env python3
"""Record the first three H200 landscapes of docs/search.md in one command, within a fixed wall-time budget.

    PYTHONPATH=. python3 benchmarks/record_landscapes.py [--budget-s 210] [--jobs N]
    PYTHONPATH=. python3 benchmarks/record_landscapes.py --build-only --arch sm_90 --limit 8      # no GPU
    PYTHONPATH=.:tests AUTOTUNE_DOUBLE_ARCH=sm_90 python3 benchmarks/record_landscapes.py \\
        --evaluator search_doubles:evaluate --limit 8                                          # fake GPU

Shapes (docs/search.md): fp16 d128 N4096 B4 H16; fp16 d64 N4096 causal B4 H32; bf16 d128 N1024 B1 H64. Each
landscape is exhaustive over the wgmma family only (252-430 valid configs per shape on sm_90; the mma_sync
family has 3594-8461, far beyond a few minutes of GPU time), which the file header says (`families`).

All three go through one autotune.landscapes.sweep.run_sweeps call: one parallel build of every config (shape n+1 compiles
while shape n is measured) and one warm evaluation worker. --budget-s bounds the measuring of all three,
shared by config count; configs left out are simply missing (the header says `complete: false`) and running
the command again resumes.

Files: with $OUT set (the GPU machine, where only $OUT comes back), landscapes are written straight into
$OUT/landscapes/ — so a run cut short still returns what it saved — resuming from studies/landscapes/ if an
earlier run left files there, and copied into studies/landscapes/ at the end. Without $OUT they are written
into studies/landscapes/. A compact summary (rows per status, best config, TFLOPS, SDPA baselines) is printed
and written to $OUT/landscapes/SUMMARY.txt.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

import space  # noqa: E402

SHAPES = (
    space.Shape(batch=4, heads=16, seqlen_q=4096, head_dim=128, dtype="fp16"),
    space.Shape(batch=4, heads=32, seqlen_q=4096, head_dim=64, dtype="fp16", causal=True),
    space.Shape(batch=1, heads=64, seqlen_q=1024, head_dim=128, dtype="bf16"),
)
FAMILIES = ("wgmma",)
STUDIES_DIR = ROOT / "studies" / "landscapes"


def log(text: str) -> None:
    print(text, flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget-s", type=float, default=210.0,
                   help="seconds for the whole sweep (worker start, baselines and measuring), shared by the "
                        "shapes by config count (default 210: ~4 minutes of GPU time with start-up)")
    p.add_argument("--jobs", type=int, default=None,
                   help="parallel nvcc (default: CPU count - 2, leaving the measuring processes a core each)")
    p.add_argument("--arch", default=None, help="default: the GPU's (required with --build-only)")
    p.add_argument("--cache-dir", default=None, help="kernel cache (default: the Builder's)")
    p.add_argument("--evaluator", default=None, metavar="MODULE:FUNCTION", help="tests: a fake evaluator")
    p.add_argument("--build-only", action="store_true", help="build and report only (no GPU, no files)")
    p.add_argument("--limit", type=int, default=None, help="only the first N configs per shape (smoke tests)")
    p.add_argument("--out-dir", default=None, help="where to write (default: $OUT/landscapes, else studies/landscapes)")
    p.add_argument("--fresh", action="store_true", help="do not resume existing files")
    return p.parse_args(argv)


def summary(results) -> list[str]:
    lines = []
    for r in results:
        ls = r.landscape
        if ls is None:
            lines.append(f"{r.shape.key}: builds {dict(sorted(r.build_counts.items()))}")
            continue
        best = ls.best
        base = ls.header.get("baselines") or {}
        lines.append(ls.summary())
        lines.append(f"    measured now {r.measured}, kept {r.resumed}, left out by the budget {r.not_measured}; "
                     f"{r.seconds:.0f} s; SDPA " + ", ".join(f"{k} {v}" for k, v in base.items())
                     + (f"; best/cuDNN {best.tflops / base['sdpa_cudnn']:.2f}" if best and base.get("sdpa_cudnn") else ""))
    return lines


def main(argv=None) -> int:
    args = parse_args(argv)
    from autotune.landscapes.sweep import SWEEP_EVALUATOR, SweepOptions, run_sweeps

    started = time.monotonic()
    out_env = os.environ.get("OUT")
    out_dir = Path(args.out_dir) if args.out_dir else (Path(out_env) / "landscapes" if out_env else STUDIES_DIR)
    if not args.build_only:  # build-only writes nothing
        out_dir.mkdir(parents=True, exist_ok=True)
    if not args.build_only and out_dir.resolve() != STUDIES_DIR.resolve() and STUDIES_DIR.is_dir() and not args.fresh:
        for f in STUDIES_DIR.glob("*.json"):  # resume from an earlier run's files
            if not (out_dir / f.name).exists():
                shutil.copy2(f, out_dir / f.name)
    jobs = args.jobs or max(1, (os.cpu_count() or 1) - 2)
    options = SweepOptions(shapes=SHAPES, families=FAMILIES, arch=args.arch, out_dir=str(out_dir), jobs=jobs,
                           cache_dir=args.cache_dir, evaluator=args.evaluator or SWEEP_EVALUATOR,
                           budget=args.budget_s, fresh=args.fresh, build_only=args.build_only, limit=args.limit)
    try:
        results = run_sweeps(options, log=log)
    except Exception as e:  # what was saved is still worth bringing back: say what is on disk, then fail
        log(f"record_landscapes: {type(e).__name__}: {e}")
        if not args.build_only:
            from autotune.landscapes.landscape_file import LandscapeError, load

            for f in sorted(out_dir.glob("*.json")):
                try:
                    log(load(f).summary())
                except LandscapeError as err:
                    log(str(err))
        return 1
    lines = summary(results) + [f"total {time.monotonic() - started:.0f} s"]
    log("")
    log("\n".join(lines))
    if args.build_only:
        return 0
    (out_dir / "SUMMARY.txt").write_text("\n".join(lines) + "\n")
    if out_dir.resolve() != STUDIES_DIR.resolve() and args.evaluator is None:  # fake numbers stay out of studies/
        STUDIES_DIR.mkdir(parents=True, exist_ok=True)
        for r in results:
            shutil.copy2(r.path, STUDIES_DIR / r.path.name)
        log(f"copied {len(results)} landscape(s) to {STUDIES_DIR}")
    return 0 if all(r.landscape is not None and r.landscape.best for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
