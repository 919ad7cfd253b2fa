"""`autotune compare-samplers`: which sampler finds the best kernel in fewest trials, on recorded landscapes.

Simulates `autotune search` on each landscape (autotune sweep's files) with every sampler and many seeds, the
GPU step answered by the replay (autotune/search/sampler_comparison.py), and reports per sampler the trials
needed to reach 95/98/99 % of the landscape's optimum and the best found within the default budget. --markdown rewrites the
generated section of a file (docs/search.md) and draws the plot next to it. No GPU, no nvcc.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

USAGE_ERROR = 2


def add_parser(subparsers) -> None:
    from autotune.search.sampler_comparison import (BUDGET_MULTIPLE, DEFAULT_LAG, DEFAULT_SAMPLERS, DEFAULT_SEEDS,
                                                    VARIANTS)
    from autotune.search.loop import DEFAULT_TRIALS

    p = subparsers.add_parser("compare-samplers", help="compare samplers on recorded landscapes (no GPU)",
                              description=__doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n")[1],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replay", nargs="+", required=True, metavar="FILE",
                   help="landscape files (e.g. studies/landscapes/*.json)")
    p.add_argument("--samplers", nargs="+", default=list(DEFAULT_SAMPLERS), metavar="NAME",
                   help=f"samplers to compare (default: {' '.join(DEFAULT_SAMPLERS)}; all: {' '.join(VARIANTS)}; "
                        "gp is slow to simulate: minutes per seed)")
    p.add_argument("--seeds", type=int, default=DEFAULT_SEEDS, help=f"seeds per sampler (default {DEFAULT_SEEDS})")
    p.add_argument("--trials", type=int, default=None, metavar="N",
                   help=f"cap per simulated search (default: {BUDGET_MULTIPLE} × --budget, at most every config of "
                        "the landscape); seeds that do not get there within it show as (k/n)")
    p.add_argument("--budget", type=int, default=DEFAULT_TRIALS, metavar="N",
                   help=f"report the best found within N trials (default {DEFAULT_TRIALS}, `autotune search`'s)")
    p.add_argument("--best-at", type=int, nargs="+", default=[], metavar="N",
                   help="also report the best found within N trials (each ≤ --budget), e.g. a candidate budget")
    p.add_argument("--lag", type=int, default=DEFAULT_LAG, metavar="K",
                   help=f"configs asked but not yet told when the sampler is asked again (default {DEFAULT_LAG}, "
                        "as the search's pipeline with 16 build jobs; 0: sequential)")
    p.add_argument("--cold", action="store_true",
                   help="do not enqueue the heuristic default first (the search does)")
    p.add_argument("--noise", action="store_true",
                   help="every evaluation draws its figure from the landscape's recorded re-measurement sessions "
                        "(or their spread), seeded by the run's seed; trials count the configs' recorded figures")
    p.add_argument("--jobs", type=int, default=None, help="parallel simulations (default: CPU count)")
    p.add_argument("--markdown", default=None, metavar="FILE",
                   help="rewrite the generated section of FILE (e.g. docs/search.md) with the tables")
    p.add_argument("--plot", default=None, metavar="PNG",
                   help="draw the curves here (default with --markdown: search-samplers.png next to it)")
    p.set_defaults(run=run)


def _fail(message: str) -> int:
    print(f"autotune compare-samplers: {message}", file=sys.stderr)
    return USAGE_ERROR


def run(args: argparse.Namespace) -> int:
    from autotune.search import comparison_report as compare_report
    from autotune.search.sampler_comparison import compare
    from autotune.landscapes.landscape_file import LandscapeError

    jobs = args.jobs or os.cpu_count() or 1
    if jobs < 1:
        return _fail(f"--jobs: expected a count ≥ 1, got {jobs}")
    try:
        comparison = compare(args.replay, samplers=args.samplers, seeds=args.seeds, trials=args.trials,
                             budget=args.budget, best_at=args.best_at, lag=args.lag, enqueue_default=not args.cold, jobs=jobs,
                             noise=args.noise,
                             log=lambda line: print(line, file=sys.stderr, flush=True))
    except (LandscapeError, ValueError) as err:
        return _fail(str(err))
    plot = Path(args.plot) if args.plot else (Path(args.markdown).with_name("search-samplers.png")
                                              if args.markdown else None)
    plot_name = None
    if plot is not None:
        try:
            compare_report.render_png(comparison, plot)
        except ImportError:
            return _fail("--plot needs matplotlib (`pip install 'autotune[report]'`)")
        plot_name = plot.name if args.markdown and plot.parent.resolve() == Path(args.markdown).parent.resolve() \
            else str(plot)
        print(f"wrote {plot}", file=sys.stderr)
    print(compare_report.markdown(comparison, plot_name))
    if args.markdown:
        compare_report.write_markdown(comparison, args.markdown, plot_name)
        print(f"wrote the generated section of {args.markdown}", file=sys.stderr)
    return 0
