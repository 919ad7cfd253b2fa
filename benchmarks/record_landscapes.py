#!/usr/bin/env python3
"""Record the H200 landscapes over today's whole space (every axis), then two re-measurement sessions of each,
in as many commands of a bounded wall time as it takes (each resumes what the last one returned).

    PYTHONPATH=. python3 benchmarks/record_landscapes.py [--budget-s 500] [--jobs N] [--sessions 2]
    PYTHONPATH=. python3 benchmarks/record_landscapes.py --build-only --arch sm_90 --limit 8      # no GPU
    PYTHONPATH=.:tests AUTOTUNE_DOUBLE_ARCH=sm_90 python3 benchmarks/record_landscapes.py \\
        --evaluator search_doubles:evaluate --limit 8                                          # fake GPU

Shapes (SHAPES; docs/search.md): d128 fp16 N4096 B4 H16; d128 fp16 causal N4096 B4 H16; d64 fp16 causal N4096
B4 H32; d256 bf16 N4096 B2 H8; a small N, B16 H16 N1024 d128 fp16 (its cubins are the first shape's); and a GQA
shape, Llama-3-8B's B1 H32/8 N8192 d128 bf16 causal. `--shapes KEY ...` picks some of them. Each landscape is
exhaustive over the wgmma family, every axis (1110-1914 valid configs per shape at d64/d128, 120 at d256; the
mma_sync family has thousands more, beyond minutes of GPU time), which the file header says (`families`).

1. the sweeps: one autotune.landscapes.sweep.run_sweeps call: one parallel build of every config (shape n+1
   compiles while shape n is measured) and one warm evaluation worker; --budget-s bounds it, shared by config
   count; configs left out are missing (the header says `complete: false`) and the next command resumes. A file
   of the same shape recorded with other kernel sources or nvcc (the shipped landscapes of 2026-11-29 and
   2026-12-01) is replaced, not resumed: it stays in git's history.
2. once every landscape is complete: --sessions re-measurement sessions of each (benchmarks/landscape_noise.py:
   top 20 configs, 3 interleaved rounds, each session its own evaluator process), counting the sessions of these
   kernel sources the files already hold.

Files: with $OUT set (the GPU machine, where only $OUT comes back), landscapes are written straight into
$OUT/landscapes/ — so a run cut short still returns what it saved — resuming from studies/landscapes/ (copy
$OUT/landscapes/*.json back there between commands). Without $OUT they are written into studies/landscapes/.
A compact summary is printed and written to $OUT/landscapes/SUMMARY.txt. Afterwards, on any machine:
`autotune compare-samplers --replay studies/landscapes/h200-*.json --seeds 20 --best-at 20 30 40 --markdown
docs/search.md` regenerates docs/search.md's tables from every landscape there.
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
    space.Shape(batch=4, heads=16, seqlen_q=4096, head_dim=128, dtype="fp16", causal=True),
    space.Shape(batch=4, heads=32, seqlen_q=4096, head_dim=64, dtype="fp16", causal=True),
    space.Shape(batch=2, heads=8, seqlen_q=4096, head_dim=256, dtype="bf16"),
    space.Shape(batch=16, heads=16, seqlen_q=1024, head_dim=128, dtype="fp16"),
    space.Shape(batch=1, heads=32, kv_heads=8, seqlen_q=8192, head_dim=128, dtype="bf16", causal=True),
)
FAMILIES = ("wgmma",)
STUDIES_DIR = ROOT / "studies" / "landscapes"


def log(text: str) -> None:
    print(text, flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget-s", type=float, default=500.0,
                   help="seconds for this command's sweeps (worker start, baselines and measuring), shared by the "
                        "shapes by config count (default 500: a command of < 10 minutes with the sessions' check)")
    p.add_argument("--shapes", nargs="+", default=None, metavar="KEY",
                   help=f"only these of the shapes (default all: {', '.join(s.key for s in SHAPES)})")
    p.add_argument("--sessions", type=int, default=2,
                   help="re-measurement sessions of each complete landscape with these kernel sources (default 2)")
    p.add_argument("--sessions-budget-s", type=float, default=400.0,
                   help="start no session's landscape after this many seconds of the command (default 400)")
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


def sessions(results, args, out_dir: Path, started: float) -> list[str]:
    """Step 2 of the module docstring: the missing re-measurement sessions of the complete landscapes, each
    session one benchmarks/landscape_noise.py run (its own evaluator process) over all of them."""
    from autotune.landscapes import landscape_file
    from autotune.landscapes.noise import comparable_sessions

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import landscape_noise

    lines = []
    ready = [r.path for r in results if r.landscape is not None and r.landscape.is_complete]
    if len(ready) < len(results):
        return [f"sessions: not yet ({len(results) - len(ready)} landscape(s) incomplete; run this command again)"]
    for k in range(args.sessions):
        have = min(len(_sessions_like_this(landscape_file.load(p), comparable_sessions)) for p in ready)
        if have >= args.sessions:
            break
        left = args.sessions_budget_s - (time.monotonic() - started)
        if left <= 0:
            lines.append(f"sessions: {have} of {args.sessions} recorded; --sessions-budget-s reached, run this "
                         "command again for the rest")
            break
        argv = [*map(str, ready), "--out-dir", str(out_dir), "--budget-s", f"{left:.0f}"]
        argv += ["--evaluator", args.evaluator] if args.evaluator else []
        argv += ["--cache-dir", args.cache_dir] if args.cache_dir else []
        status = landscape_noise.main(argv)
        lines.append(f"session {have + 1}: landscape_noise exit {status}")
    return lines


def _sessions_like_this(landscape, comparable_sessions) -> set:
    """The landscape's sessions with its own kernel sources and nvcc (the latest session's otherwise)."""
    same = {s["id"] for s in landscape.sessions
            if s.get("kernel_source_hash") == landscape.header.get("kernel_source_hash")
            and s.get("nvcc_version") == landscape.header.get("nvcc_version")}
    return same & comparable_sessions(landscape)


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
    shapes = SHAPES
    if args.shapes:
        unknown = sorted(set(args.shapes) - {s.key for s in SHAPES})
        if unknown:
            log(f"--shapes: {unknown} are not among {[s.key for s in SHAPES]}")
            return 2
        shapes = tuple(s for s in SHAPES if s.key in args.shapes)
    options = SweepOptions(shapes=shapes, families=FAMILIES, arch=args.arch, out_dir=str(out_dir), jobs=jobs,
                           cache_dir=args.cache_dir, evaluator=args.evaluator or SWEEP_EVALUATOR,
                           budget=args.budget_s, fresh=args.fresh, replace_stale=True, build_only=args.build_only,
                           limit=args.limit)
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
    lines = summary(results)
    if not args.build_only and args.sessions:
        lines += sessions(results, args, out_dir, started)
    lines.append(f"total {time.monotonic() - started:.0f} s")
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
