"""`autotune sweep`: measure every valid config of one shape and save the landscape (studies/landscapes/).

Builds all valid configs of the chosen families in parallel, then checks and times each one that built without
spilling, in the search's evaluation worker with a lean measurement (autotune/landscapes/sweep_eval.py); spilled,
compile_error, wrong, crashed and timeout configs get rows too. Running it again resumes the file. The
landscape feeds `autotune search --replay` and `autotune compare-samplers` (docs/search.md). Needs a CUDA GPU,
except with --build-only.
"""
from __future__ import annotations

import argparse
import sys

USAGE_ERROR = 2
FAILED = 1


def add_parser(subparsers) -> None:
    from autotune.commands.search_cmd import add_shape_arguments
    from autotune.landscapes.sweep import DEFAULT_EVAL_TIMEOUT

    p = subparsers.add_parser("sweep", help="measure every valid config of one shape into a landscape file (GPU)",
                              description=__doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n")[1],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shape_arguments(p)
    s = p.add_argument_group("sweep")
    s.add_argument("--family", action="append", default=None, metavar="NAME",
                   help="only this kernel family (repeatable; default: every family of the arch). On sm_90, "
                        "`--family wgmma` (hundreds of configs) is what fits minutes of GPU time; mma_sync has "
                        "thousands")
    s.add_argument("--out", default=None, metavar="FILE",
                   help="landscape file (default: studies/landscapes/<gpu>-<shape>-<families>.json)")
    s.add_argument("--arch", default=None, help="build for this arch (default: the GPU's; required with --build-only)")
    s.add_argument("--time-cap", type=float, default=None, metavar="SECONDS",
                   help="stop measuring after this long; configs left are not recorded and a later run resumes")
    s.add_argument("--fresh", action="store_true", help="overwrite an existing landscape file instead of resuming it")
    s.add_argument("--seed", type=int, default=0, help="seed of the measuring order (default 0)")
    s.add_argument("--spill-policy", default="prune", metavar="prune|allow|max-bytes=N",
                   help="spilling builds: recorded as spilled without timing (prune, default), or timed")
    s.add_argument("--build-only", action="store_true", help="build every config and report; no GPU, no file")
    s.add_argument("--limit", type=int, default=None, metavar="N", help="only the first N configs (smoke tests)")

    e = p.add_argument_group("build and evaluation")
    e.add_argument("--jobs", type=int, default=None, help="parallel nvcc processes (default: CPU count)")
    e.add_argument("--cache-dir", default=None,
                   help="kernel cache (default: $AUTOTUNE_CACHE_DIR or ~/.cache/autotune/kernels)")
    e.add_argument("--eval-timeout", type=float, default=DEFAULT_EVAL_TIMEOUT, metavar="SECONDS",
                   help=f"an evaluation taking longer is killed and recorded as timeout (default {DEFAULT_EVAL_TIMEOUT:g})")
    e.add_argument("--evaluator", default=None, metavar="MODULE:FUNCTION",
                   help="for tests: evaluate with this function instead of autotune.landscapes.sweep_eval:evaluate")
    p.set_defaults(run=run)


def _fail(message: str) -> int:
    print(f"autotune sweep: {message}", file=sys.stderr)
    return USAGE_ERROR


def options_from_args(args: argparse.Namespace):
    import space
    from autotune.commands.search_cmd import shape_from_args
    from autotune.landscapes.sweep import SWEEP_EVALUATOR, SweepOptions
    from autotune.build.spill_policy import SpillPolicy

    if args.arch is not None:
        space.get_arch(args.arch)
    return SweepOptions(
        shapes=(shape_from_args(args),), families=tuple(args.family) if args.family else None, arch=args.arch,
        out=args.out, jobs=args.jobs, cache_dir=args.cache_dir, evaluator=args.evaluator or SWEEP_EVALUATOR,
        eval_timeout=args.eval_timeout, time_cap=args.time_cap, spill_policy=SpillPolicy.parse(args.spill_policy),
        seed=args.seed, fresh=args.fresh, build_only=args.build_only, limit=args.limit,
    )


def run(args: argparse.Namespace) -> int:
    from autotune.build.builder import BuildError
    from autotune.landscapes.landscape_file import LandscapeError
    from autotune.build.nvcc import NvccNotFoundError
    from autotune.landscapes.sweep import SweepError, run_sweeps
    from autotune.measure.child_process import EvaluatorError, WorkerStartError

    try:
        options = options_from_args(args)
        options.check()
    except ValueError as err:
        return _fail(str(err))
    if args.evaluator is None and not args.build_only:
        from autotune.launch.gpu_arch import NoGpuError, detect_arch

        try:
            detect_arch()
        except NoGpuError:
            return _fail("needs a CUDA GPU to time kernels, and none is visible; --build-only --arch sm_XX "
                         "compiles every config without one")
    try:
        results = run_sweeps(options)
    except (NvccNotFoundError, LandscapeError, ValueError) as err:
        return _fail(str(err))
    except (SweepError, WorkerStartError, EvaluatorError, BuildError) as err:
        print(f"autotune sweep: {err}", file=sys.stderr)
        return FAILED
    for r in results:
        if r.path is not None:
            print(f"wrote {r.path}")
    if options.build_only:
        return 0 if all(set(r.build_counts) <= {"compiled", "spilled"} for r in results) else FAILED
    return 0
