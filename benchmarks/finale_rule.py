#!/usr/bin/env python3
"""The finale's decision rule on synthetic noisy finalists with known true speeds (CPU, seconds):

    PYTHONPATH=.:tests python3 benchmarks/finale_rule.py [--seeds 200] [--sigmas 0.01 0.015 0.027]

Per scenario (true TFLOPS of the finalists, in trial rank order) and per-round noise σ (the H200's rounds: 0.24 %
at N1024, 1.5-2.7 % at N4096, autotune/search/separation.py), over seeded sessions of tests/finale_doubles.NoisyGPU
through the real finale (autotune/search/retime.py: 3 rounds, then rounds for the contenders up to 8):
how often the kept config is ≥ 2 % slower than the true best, the kept config's mean true speed / the best's, how
often the leader was separated (and of those, how often wrongly: not the true best), and the cost in rounds and
evaluations. docs/search.md ("The end of a search") quotes its output.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from finale_doubles import sessions  # noqa: E402

SCENARIOS = {
    "six finalists 0-6 % below": [500, 497, 485, 492, 480, 470],
    "three equal": [500, 500, 500],
    "two, 1.5 % apart": [500, 492.5],
    "four, 6-10 % apart": [500, 470, 465, 450],
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=200)
    p.add_argument("--sigmas", type=float, nargs="+", default=[0.01, 0.015, 0.027])
    p.add_argument("--max-rounds", type=int, default=8)
    args = p.parse_args(argv)
    print("| finalists (true TFLOPS) | σ per round | kept ≥ 2 % slower | kept / best, mean | separated | wrongly "
          "separated | rounds, mean | evaluations, mean |")
    print("|---|---|---|---|---|---|---|---|")
    for name, truths in SCENARIOS.items():
        best = max(truths)
        for sigma in args.sigmas:
            runs = sessions(truths, sigma, args.seeds, max_rounds=args.max_rounds)
            kept = [truth[v.chosen.config] for v, _, truth in runs]
            separated = [truth[v.chosen.config] for v, _, truth in runs if v.separated]
            wrong = sum(1 for k in separated if k < best) if len(set(truths)) > 1 else len(separated)
            print(f"| {name} | {100 * sigma:.1f} % | {100 * sum(k < 0.98 * best for k in kept) / len(runs):.1f} % | "
                  f"{100 * statistics.mean(kept) / best:.2f} % | {100 * len(separated) / len(runs):.0f} % | "
                  f"{100 * wrong / len(runs):.1f} % | {statistics.mean(v.rounds for v, _, _ in runs):.1f} | "
                  f"{statistics.mean(len(g.calls) for _, g, _ in runs):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
