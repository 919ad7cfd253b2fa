"""How far ahead of the GPU a search should ask (`--ahead`, configs per batch), on a simulated GPU host (CPU only).

Runs the real search (`run_search` with `--replay`: the pipeline, the sampler, the storage) with paced builds and
evaluations ($AUTOTUNE_REPLAY_BUILD_SECONDS per build call, $AUTOTUNE_REPLAY_SECONDS per evaluation) and 16 build
jobs, for each seed, pacing and --ahead, and prints per (pacing, --ahead) the median [25th-75th percentile] of:
the trial loop's seconds, the GPU's share idle waiting for builds, the configs in flight at an ask (the sampler's
blind spot), and the trials to 98 % of the landscape's optimum (the trials asked up to the first config within
98 %; "-" when 60 trials did not get there). The pacings follow the H200's default search (docs/search.md,
2026-12-01: a first evaluation 1.5-1.7 s after the start from an empty cache, so one nvcc round; 60 evaluations in
12-13 s): a build call 2 s from an empty cache, 0.5 s half cached, 20 ms warm; an evaluation 0.2 s.

    PYTHONPATH=. python3 benchmarks/ahead_replay.py \\
        studies/landscapes/h200-b4-h16-n4096-d128-fp16-full-wgmma-2026-12-01.json --seeds 8 --aheads 2 8 16 32
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import tempfile

# (seconds per build call, per evaluation)
PACINGS = {"empty cache": (2.0, 0.2), "half cached": (0.5, 0.2), "warm cache": (0.02, 0.2)}
TRIALS = 60


def one(args):
    path, pacing, ahead, seed = args
    build_s, eval_s = PACINGS[pacing]
    os.environ["AUTOTUNE_REPLAY_BUILD_SECONDS"] = str(build_s)
    os.environ["AUTOTUNE_REPLAY_SECONDS"] = str(eval_s)
    import optuna

    from autotune.landscapes import landscape_file
    from autotune.search.loop import SearchOptions, run_search

    ls = landscape_file.load(path)
    with tempfile.TemporaryDirectory() as tmp:
        result = run_search(SearchOptions(shape=ls.shape, trials=TRIALS, seed=seed, replay=ls, jobs=16,
                                          ahead=ahead, retime_top=1, retime_rounds=1,
                                          storage=f"sqlite:///{tmp}/ahead.db"), log=lambda line: None)
        trials = optuna.load_study(study_name=result.study_name, storage=f"sqlite:///{tmp}/ahead.db").trials
    evaluated = [t for t in sorted(trials, key=lambda t: t.number) if t.state.name in ("COMPLETE", "PRUNED")]
    goal = 0.98 * ls.optimum
    reached = next((i + 1 for i, t in enumerate(evaluated) if t.value is not None and t.value >= goal), None)
    lag = statistics.median(result.in_flight_at_ask) if result.in_flight_at_ask else 0
    return (pacing, ahead, seed, result.loop_seconds, result.idle_seconds / result.loop_seconds, lag, reached,
            statistics.median(result.batch_sizes) if result.batch_sizes else 0)


def spread(xs, fmt="{:.3g}"):
    xs = sorted(float("inf") if x is None else x for x in xs)
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    show = (lambda x: "-" if x == float("inf") else fmt.format(x))
    return f"{show(statistics.median(xs))} [{show(q[0])}-{show(q[2])}]"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("landscape")
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--pacings", nargs="+", choices=list(PACINGS), default=list(PACINGS))
    p.add_argument("--aheads", type=int, nargs="+", default=[2, 8, 16, 32], help="the --ahead values to compare")
    p.add_argument("--parallel", type=int, default=2, help="simulated searches at once (mostly asleep: paced)")
    a = p.parse_args()
    # seeds outermost: every setting sees the same load on this machine, whenever in the run it comes
    seeds = range(a.first_seed, a.first_seed + a.seeds)
    work = [(a.landscape, pacing, ahead, seed) for seed in seeds for pacing in a.pacings for ahead in a.aheads]
    results = []
    with multiprocessing.get_context("spawn").Pool(a.parallel) as pool:
        for r in pool.imap_unordered(one, work):
            results.append(r)
            print(f"  [{len(results)}/{len(work)}] {r[0]}, --ahead {r[1]}, seed {r[2]}: loop {r[3]:.1f} s, "
                  f"idle for builds {r[4]:.0%}, in flight at an ask {r[5]:g}, trials to 98 % {r[6] or '-'}, "
                  f"batch {r[7]:g}",
                  flush=True)
    print(f"\n{a.landscape}: seeds {seeds.start}-{seeds.stop - 1}, {TRIALS} trials, 16 build jobs; "
          "median [25th-75th percentile]\n")
    print("| pacing (build call, evaluation) | --ahead | trial loop s | GPU idle for builds | in flight at an ask | "
          "trials to 98 % |")
    print("|---|---|---|---|---|---|")
    for pacing in a.pacings:
        build_s, eval_s = PACINGS[pacing]
        for ahead in a.aheads:
            rs = [r for r in results if r[0] == pacing and r[1] == ahead]
            print(f"| {pacing} ({build_s:g} s, {eval_s:g} s) | {ahead} | {spread([r[3] for r in rs])} | "
                  f"{spread([100 * r[4] for r in rs], '{:.0f} %')} | {spread([r[5] for r in rs])} | "
                  f"{spread([r[6] for r in rs])} |")


if __name__ == "__main__":
    main()
