"""`autotune campaign FILE`: tune a list of shapes (a TOML, JSON or YAML file), one study per shape, in order.

Each new shape first tries the best configs of the shapes already tuned nearby (same GPU, dtype, head_dim and
causal flag; nearest by log2 seqlen and log2 batch·heads), then searches as `autotune search` does. Running the
same campaign again resumes every study. The file format is in autotune/search/campaign.py and docs/distributed.md.
"""
from __future__ import annotations

import argparse
import sys

USAGE_ERROR = 2
NO_RESULT = 1
INTERRUPTED = 130


def add_parser(subparsers) -> None:
    from autotune.search.campaign import DEFAULT_WARM_START
    from autotune.search.coordination import DEFAULT_GRACE, DEFAULT_HEARTBEAT
    from autotune.search.sampling import SAMPLERS
    from autotune.search.loop import DEFAULT_EVAL_TIMEOUT, DEFAULT_TRIALS

    p = subparsers.add_parser("campaign", help="tune a list of shapes from a file, warm-starting each from its "
                                               "tuned neighbours (needs a GPU)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", help="the campaign: .toml, .json, or .yaml/.yml (PyYAML)")
    p.add_argument("--dry-run", action="store_true", help="print each shape's search and stop")
    s = p.add_argument_group("search (the file's keys win over these)")
    s.add_argument("--trials", type=int, default=DEFAULT_TRIALS, help=f"per shape (default {DEFAULT_TRIALS})")
    s.add_argument("--warm-start", type=int, default=DEFAULT_WARM_START, metavar="K",
                   help=f"configs from tuned neighbours tried first by each fresh study (default {DEFAULT_WARM_START}; "
                        "0: cold starts)")
    s.add_argument("--sampler", default="tpe", choices=SAMPLERS)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--storage", default=None, metavar="URL",
                   help="SQLAlchemy URL (default: $AUTOTUNE_STORAGE, else studies/autotune.db)")
    s.add_argument("--arch", default=None, help="build for this arch (default: the GPU's)")
    w = p.add_argument_group("workers (docs/distributed.md)")
    w.add_argument("--workers", type=int, default=1, help="worker processes per shape (> 1 needs PostgreSQL)")
    w.add_argument("--gpus", default=None, metavar="LIST", help="CUDA devices for the workers, e.g. 0,1")
    w.add_argument("--heartbeat", type=int, default=DEFAULT_HEARTBEAT, metavar="SECONDS")
    w.add_argument("--grace", type=int, default=DEFAULT_GRACE, metavar="SECONDS")
    e = p.add_argument_group("build and evaluation")
    e.add_argument("--jobs", type=int, default=None, help="parallel nvcc processes (default: CPU count)")
    e.add_argument("--cache-dir", default=None, help="kernel cache (a shared path for several hosts)")
    e.add_argument("--eval-timeout", type=float, default=DEFAULT_EVAL_TIMEOUT, metavar="SECONDS")
    e.add_argument("--evaluator", default=None, metavar="MODULE:FUNCTION", help="for tests: see `autotune search`")
    p.set_defaults(run=run)


def _fail(message: str) -> int:
    print(f"autotune campaign: {message}", file=sys.stderr)
    return USAGE_ERROR


def base_options(args: argparse.Namespace, shape):
    from autotune.search.loop import SearchOptions

    gpus = tuple(d for d in args.gpus.split(",") if d.strip()) if args.gpus else None
    return SearchOptions(shape=shape, trials=args.trials, sampler=args.sampler, seed=args.seed, storage=args.storage,
                         arch=args.arch, jobs=args.jobs, eval_timeout=args.eval_timeout, cache_dir=args.cache_dir,
                         warm_start=args.warm_start, workers=args.workers, gpus=gpus, heartbeat=args.heartbeat,
                         grace=args.grace, **({"evaluator": args.evaluator} if args.evaluator else {}))


def run(args: argparse.Namespace) -> int:
    from autotune.search import campaign

    try:
        entries = campaign.load(args.file)
        base = base_options(args, entries[0].shape)
        plans = campaign.plan(entries, base)
    except ValueError as err:  # CampaignError, SearchOptions.check
        return _fail(str(err))
    if args.dry_run:
        for n, opts in enumerate(plans, 1):
            print(f"{n}. {opts.shape.key}: {opts.trials} trials, sampler {opts.sampler}, warm start {opts.warm_start}"
                  f"{', study ' + opts.study_name if opts.study_name else ''}"
                  f"{', workers ' + str(opts.workers) if opts.workers > 1 else ''}")
        return 0
    return execute(plans, args.evaluator is None)


def execute(plans: list, needs_gpu: bool) -> int:
    """Run the plans and print the campaign table (shared with `autotune search` given several --seqlen)."""
    from autotune.search import campaign
    from autotune.search.loop import SearchInterrupted
    from autotune.search.progress import format_result
    from autotune.store import storage_url

    try:  # a storage mistake is one line before any shape starts, not a traceback from the first one
        for storage in sorted({p.storage or "" for p in plans}):
            storage_url.prepare(storage_url.resolve_storage_url(storage or None))
    except ValueError as err:  # storage_url.StorageError
        return _fail(str(err))
    if needs_gpu:
        from autotune.launch.gpu_arch import NoGpuError, detect_arch

        try:
            detect_arch()
        except NoGpuError:
            return _fail("needs a CUDA GPU to time kernels, and none is visible (see `autotune space --compile` "
                         "for compile-only work)")
    try:
        rows = campaign.run(plans)
    except SearchInterrupted as e:
        print()
        print(format_result(e.result))
        print()
        print(campaign.format_rows(getattr(e, "rows", [])))
        print("campaign interrupted: the same command resumes it")
        return INTERRUPTED
    for row in rows:
        if row.result is not None:
            print()
            print(format_result(row.result))
    print()
    print(f"campaign: {len(rows)} shape(s)")
    print(campaign.format_rows(rows))
    return 0 if all(r.result is not None and r.result.best is not None for r in rows) else NO_RESULT
