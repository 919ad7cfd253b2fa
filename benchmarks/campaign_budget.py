"""Where a campaign's per-shape budget comes from (docs/benchmarks.md, "The H200 table by campaign"); CPU only.

A campaign shape's first trials are its tuned neighbours' best configs (warm_start.py). How much does that buy
over sampling? The recorded landscapes (studies/landscapes/, every valid wgmma config of a shape measured on the
H200) answer it for configs carried from one shape to another: for each pair of landscapes with the same head_dim,
the source's top-k configs measured on the target (best, as % of the target's optimum), against the median best
of k configs drawn at random (2000 draws); and each shipped winner (studies/tuned/h200.json) measured on a
landscape of another shape with its head_dim.

    python3 benchmarks/campaign_budget.py
"""
from __future__ import annotations

import itertools
import random
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from autotune.landscapes import landscape_file  # noqa: E402
from autotune.store.best_table import read_export  # noqa: E402
from autotune.store.nearest import distance  # noqa: E402
from space import Config  # noqa: E402

KS = (1, 2, 4, 8, 12, 16)


def complete(ls) -> dict[str, float]:
    """config key (today's spelling) → TFLOPS of every config the landscape timed."""
    return {Config.from_key(k).key: r.tflops for k, r in ls.rows.items() if r.status == "complete"}


def main() -> None:
    landscapes = [landscape_file.load(p) for p in sorted((REPO / "studies" / "landscapes").glob("*.json"))]
    timed = {ls.shape: complete(ls) for ls in landscapes}
    print("top-k configs of one landscape measured on another (best, % of the target's optimum) vs k random:")
    for (src, s), (dst, d) in itertools.permutations(timed.items(), 2):
        if src.head_dim != dst.head_dim:
            continue
        optimum = max(d.values())
        ranked = [k for k in sorted(s, key=lambda k: -s[k]) if k in d]
        carried = " ".join(f"k={k}: {max(d[x] for x in ranked[:k]) / optimum:.1%}" for k in KS)
        keys = list(d)
        drawn = " ".join(f"k={k}: {statistics.median(max(d[x] for x in random.Random(i).sample(keys, k)) for i in range(2000)) / optimum:.1%}"
                         for k in KS)
        print(f"  {src.key} → {dst.key}\n    carried {carried}\n    random  {drawn}")
    print("shipped winners measured on a landscape (same head_dim):")
    for ls in landscapes:
        d = timed[ls.shape]
        optimum = max(d.values())
        for e in read_export(REPO / "studies" / "tuned" / "h200.json").entries:
            key = Config.from_key(e.config_key).key
            if e.shape.head_dim == ls.shape.head_dim and e.shape != ls.shape and key in d:
                print(f"  {e.shape.key:<34} on {ls.shape.key:<34} (distance {distance(ls.shape, e.shape):.2f}): "
                      f"{d[key] / optimum:.1%}")


if __name__ == "__main__":
    main()
