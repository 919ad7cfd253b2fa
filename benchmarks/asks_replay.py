"""Asks per evaluated trial and trials to 98 % of the optimum, replayed on recorded landscapes (CPU only).

Runs the sampler comparison's simulated search (search/sampler_comparison.simulate: the search's own TrialLoop,
lag 16, the heuristic default first, capped at 4 x 60 trials) for each seed, and prints per landscape the median
[25th-75th percentile] of: trials to 98 %, stored asks per evaluated trial, sampler proposals per evaluated
trial, and the seconds one simulated search took. Works on any checkout whose simulate() has this signature, so
the same command measures the code before and after a change (PYTHONPATH=that checkout):

    python3 benchmarks/asks_replay.py studies/landscapes/h200-b4-h16-n4096-d128-fp16-full-wgmma.json \\
        studies/landscapes/h200-b4-h32-n4096-d64-fp16-causal-wgmma.json --seeds 20 --samplers tpe --jobs 2
"""
from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time

BUDGET = 60


def one(args):
    path, sampler, seed, lag = args
    from autotune.landscapes import landscape_file
    from autotune.search import sampler_comparison as sc

    ls = landscape_file.load(path)
    cap = min(4 * BUDGET, len(ls.rows))
    t0 = time.monotonic()
    run = sc.simulate(ls, sampler, seed, cap, lag, True, 0.99, min(BUDGET, cap))
    seconds = time.monotonic() - t0
    evaluated = len(run.values)
    # Stored asks that were judged: a run stopped early (99 % reached) leaves up to `lag` asked configs in flight,
    # which a real search would have built (it never asks beyond --trials).
    asked = run.asks - getattr(run, "unjudged", 0)
    return (path, sampler, seed, run.trials_to(0.98 * ls.optimum), asked / evaluated,
            getattr(run, "proposals", run.asks) / evaluated, seconds)


def spread(xs):
    xs = sorted(float("inf") if x is None else x for x in xs)
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return f"{statistics.median(xs):.3g} [{q[0]:.3g}-{q[2]:.3g}]"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("landscapes", nargs="+")
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--samplers", nargs="+", default=["tpe"])
    p.add_argument("--lag", type=int, default=16)
    p.add_argument("--jobs", type=int, default=1)
    a = p.parse_args()
    work = [(path, s, seed, a.lag) for path in a.landscapes for s in a.samplers for seed in range(a.seeds)]
    results = []

    def done(r):
        results.append(r)
        name = r[0].rsplit("/", 1)[-1]
        print(f"  [{len(results)}/{len(work)}] {name} {r[1]} seed {r[2]}: trials to 98 % {r[3]}, stored asks per "
              f"evaluated trial {r[4]:.2f}, proposals per evaluated trial {r[5]:.2f}, {r[6]:.1f} s", flush=True)

    if a.jobs > 1:
        with multiprocessing.get_context("spawn").Pool(a.jobs) as pool:
            for r in pool.imap_unordered(one, work, chunksize=1):
                done(r)
    else:
        for w in work:
            done(one(w))
    print("| landscape | sampler | trials to 98 % | stored asks / evaluated | proposals / evaluated | s per search |")
    print("|---|---|---|---|---|---|")
    for path in a.landscapes:
        for s in a.samplers:
            rows = [r for r in results if r[0] == path and r[1] == s]
            name = path.rsplit("/", 1)[-1].removesuffix(".json")
            print(f"| {name} | {s} | {spread([r[3] for r in rows])} | {spread([r[4] for r in rows])} | "
                  f"{spread([r[5] for r in rows])} | {spread([r[6] for r in rows])} |")


if __name__ == "__main__":
    main()
