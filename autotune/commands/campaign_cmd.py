"""`autotune campaign FILE`: tune a list of shapes (a TOML, JSON or YAML file), one study per shape.

Shapes run grouped by what their kernels are compiled for (dtype, head_dim, causal), each group growing outward
from its first shape in the file (--order file keeps the file's order). Each new shape first tries the best
configs of the shapes already tuned nearby (same GPU, dtype, head_dim and causal flag; nearest by log2 seqlen and
log2 batch·heads; --warm-from adds rows of shipped tables), then searches as `autotune search` does, on one
evaluator process and one builder for the whole campaign.

Resumable: running the same command again skips the shapes finished before and resumes a shape left half-way.
--budget-s stops the run cleanly before a wall-clock limit (a GPU host's per-command limit), and --snapshot
copies a SQLite storage after every shape, so a run killed anyway keeps what it finished. One progress line per
shape; at the end the table of every shape of the file (--markdown FILE writes it for docs/benchmarks.md).
The file format is in autotune/search/campaign.py and docs/distributed.md.

A shape's second pass (its finalists re-timed in another process) stores its row over the row an earlier pass of
the same study stored, whatever the figures. Each run first re-records the second-pass rows that older versions
let the table keep out; --repair-passes does only that, with no GPU, and exits.
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
    from autotune.measure.evaluate import BASELINE_NAMES

    p = subparsers.add_parser("campaign", help="tune a list of shapes from a file, warm-starting each from its "
                                               "tuned neighbours (needs a GPU)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", help="the campaign: .toml, .json, or .yaml/.yml (PyYAML)")
    p.add_argument("--dry-run", action="store_true", help="print each shape's search, in the order they would run, "
                                                          "and stop")
    p.add_argument("--order", choices=("neighbours", "file"), default="neighbours",
                   help="neighbours (default): grouped by compiled problem, each group grown outward from its first "
                        "shape, so warm starts have near neighbours; file: the file's order")
    r = p.add_argument_group("budget, resuming and the table")
    r.add_argument("--budget-s", type=float, default=None, metavar="SECONDS",
                   help="stop cleanly within this many seconds of wall time (no new shape starts without "
                        "--reserve-s + 10 s left; a shape's trial loop ends --reserve-s before it); the same command "
                        "continues")
    r.add_argument("--reserve-s", type=float, default=None, metavar="SECONDS",
                   help="with --budget-s: kept free after each trial loop for re-timing, peers and storing "
                        "(default 20)")
    r.add_argument("--snapshot", default=None, metavar="PATH",
                   help="after every shape, copy the SQLite storage to PATH (a consistent copy, replaced atomically)")
    r.add_argument("--markdown", default=None, metavar="PATH", help="also write the closing table as markdown")
    r.add_argument("--versus", default=None, choices=BASELINE_NAMES, metavar="PEER",
                   help="compare each shape's winner with this peer (measured beside it) instead of the fastest one, "
                        "e.g. sdpa_flash for the mma_sync family, whose yardstick is FlashAttention-2; one of "
                        + ", ".join(BASELINE_NAMES))
    r.add_argument("--repair-passes", action="store_true",
                   help="only re-record, without a GPU, the rows of the file's shapes whose recorded second pass "
                        "the table kept out (an earlier pass's row of the same study stayed in its place: older "
                        "versions kept it when it was faster than the figure across both passes), from the "
                        "studies' attrs; the replaced rows move to the replaced-rows table. Every campaign run "
                        "does this first")
    r.add_argument("--warm-from", action="append", default=[], metavar="FILE",
                   help="exported tables (e.g. studies/tuned/h200.json) whose rows warm-start shapes like the "
                        "storage's own best rows do; repeatable")
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
    if args.order == "neighbours":
        plans = campaign.neighbour_order(plans)
    if args.repair_passes:
        return _fail("--repair-passes: runs alone; leave out --dry-run") if args.dry_run else _repair_passes(plans)
    if args.dry_run:
        return _dry_run(plans)
    if args.reserve_s is not None and args.budget_s is None:
        return _fail("--reserve-s: only means something with --budget-s")
    return execute(plans, args.evaluator is None, budget_s=args.budget_s, reserve_s=args.reserve_s,
                   snapshot=args.snapshot, markdown=args.markdown, warm_from=args.warm_from, versus=args.versus)


def _dry_run(plans: list) -> int:
    """Each shape's search as it would run (the file's keys applied), after the checks that need no GPU and
    touch nothing: the storage URLs are read (a plain path is refused here as in a real run), not opened."""
    from autotune.store import storage_url

    try:
        urls = sorted({storage_url.resolve_storage_url(p.storage or None) for p in plans})
    except ValueError as err:  # storage_url.StorageError
        return _fail(str(err))
    print(f"storage: {', '.join(storage_url.describe(u) for u in urls)}")
    for n, opts in enumerate(plans, 1):
        print(f"{n}. {opts.shape.key}: {opts.trials} trials, sampler {opts.sampler}, warm start {opts.warm_start}, "
              f"family {'+'.join(opts.families) if opts.families else 'every family of the arch'}, "
              f"retime top {opts.retime_top} in {opts.retime_rounds} rounds"
              f"{', study ' + opts.study_name if opts.study_name else ''}"
              f"{', workers ' + str(opts.workers) if opts.workers > 1 else ''}")
    return 0


def _repair_passes(plans: list) -> int:
    """--repair-passes: campaign_passes.repair over the file's studies in each storage they use (which must
    exist: nothing is created), found by the GPU each study's attrs name."""
    from autotune.search import campaign_passes, campaign_run
    from autotune.store import storage_url

    groups: dict[str, list] = {}
    try:
        for p in plans:
            groups.setdefault(storage_url.resolve_storage_url(p.storage or None), []).append(p)
        urls = {url: storage_url.prepare(url, create=False) for url in groups}
    except ValueError as err:  # storage_url.StorageError
        return _fail(str(err))
    for url, group in groups.items():
        found = campaign_run.recorded_studies(group, urls[url])
        done = campaign_passes.repair(found, urls[url])
        recorded = sum(campaign_passes.ATTR in s.user_attrs for s in found)
        print(f"campaign: --repair-passes {storage_url.describe(url)}: {len(done)} row(s) re-recorded; "
              f"{len(found)} of the file's {len(group)} shape(s) have a study, {recorded} a recorded second pass")
    return 0


def execute(plans: list, needs_gpu: bool, *, budget_s: float | None = None, reserve_s: float | None = None,
            snapshot: str | None = None, markdown: str | None = None, warm_from: list[str] = (),
            versus: str | None = None) -> int:
    """Run the plans and print the campaign table (shared with `autotune search` given several --seqlen)."""
    from pathlib import Path

    from autotune.search import campaign_run, campaign_table
    from autotune.search.loop import SearchInterrupted
    from autotune.search.warm_start import WarmStore
    from autotune.store import storage_url

    try:  # a storage mistake is one line before any shape starts, not a traceback from the first one
        urls = sorted({storage_url.prepare(storage_url.resolve_storage_url(p.storage or None)) for p in plans})
        budget = campaign_run.Budget(budget_s, **({"reserve_s": reserve_s} if reserve_s is not None else {}))
        campaign_run.check_shareable(plans)
        after_shape = _snapshotter(urls, snapshot) if snapshot else None
        if warm_from and len(urls) > 1:
            raise ValueError(f"--warm-from: the shapes use {len(urls)} storages; give one --storage")
    except ValueError as err:  # storage_url.StorageError, a bad budget, options that differ
        return _fail(str(err))
    if needs_gpu:
        from autotune.launch.gpu_arch import NoGpuError, detect_arch

        try:
            detect_arch()
        except NoGpuError:
            return _fail("needs a CUDA GPU to time kernels, and none is visible (see `autotune space --compile` "
                         "for compile-only work)")
    try:
        store = WarmStore.open(urls[0], warm_from) if warm_from else None
    except ValueError as err:  # a --warm-from file that is not an export
        return _fail(str(err))
    code = 0
    try:
        done = campaign_run.run(plans, budget=budget, after_shape=after_shape, store=store)
    except SearchInterrupted as e:
        done = getattr(e, "campaign", None)
        print("campaign interrupted: the same command resumes it")
        code = INTERRUPTED
        if done is None:
            return code
    finally:
        if store is not None:
            store.close()
    if after_shape is not None:
        after_shape()
    rows = campaign_table.shape_rows(plans, done.gpu_name, versus)
    print()
    print(f"campaign: {len(rows)} shape(s){'; stopped early: ' + done.stopped if done.stopped else ''}")
    print(campaign_table.format_table(rows, versus=versus))
    if markdown:
        Path(markdown).write_text(campaign_table.format_table(rows, markdown=True, versus=versus) + "\n")
        print(f"campaign: the table as markdown in {markdown}")
    if code:
        return code
    return 0 if all(r.state == "finished" and r.tflops for r in rows) else NO_RESULT


def _snapshotter(urls: list[str], dest: str):
    """after_shape for --snapshot: a consistent copy of the SQLite storage (sqlite3's backup API, which never
    copies a half-written page), written beside `dest` and renamed over it."""
    import os
    import sqlite3
    from pathlib import Path

    from autotune.store import storage_url

    source = storage_url.sqlite_path(urls[0])
    if len(urls) != 1 or source is None:
        raise ValueError(f"--snapshot: copies one SQLite storage; this campaign uses {', '.join(urls)}")
    target = Path(dest)
    if not target.parent.is_dir():
        raise ValueError(f"--snapshot {dest}: its directory does not exist")

    def copy() -> None:
        tmp = target.with_name(f".{target.name}.tmp")
        with sqlite3.connect(source) as src, sqlite3.connect(tmp) as dst:
            src.backup(dst)
        src.close()
        dst.close()
        os.replace(tmp, target)

    return copy
