"""What the families' decode axes share: the split count of an untuned decode shape, and the valid configs found
without checking the cross product the decode axes multiply.

Both families give split-KV the same meaning (grid.z = batch × splits, fp32 partials merged by the combine kernel of
kernels/common/split_combine.cuh) and their decode axes come last, read by their own rules only.
"""
from __future__ import annotations

import itertools
from typing import Sequence

from .arch import Arch
from .config import Axis, Config, Rule, violations
from .problem import Problem

# Split only while each split keeps at least this many key tiles (the combine's cost and the prologue amortised).
MIN_TILES_PER_SPLIT = 2
# Fewest splits whose CTAs fill at least this share of the last wave (or the best fill any split count reaches).
GOOD_FILL = 0.9


def splits_for(ctas: int, slots: int, n_tiles: int, options: Sequence[int]) -> int:
    """The fewest of `options` splits whose ctas × splits CTAs fill the last of their waves over `slots` resident
    CTAs at least GOOD_FILL full (or as full as any option gets), each split keeping MIN_TILES_PER_SPLIT of the
    n_tiles key tiles (1 always qualifies)."""
    def fill(s: int) -> float:
        waves = -(-ctas * s // slots)
        return ctas * s / (waves * slots)

    allowed = [s for s in options if s == 1 or n_tiles // s >= MIN_TILES_PER_SPLIT]
    good = min(GOOD_FILL, max(fill(s) for s in allowed))
    return min(s for s in allowed if fill(s) >= good - 1e-9)


def valid_expanded(family: str, axes: Sequence[Axis], decode_axes: Sequence[str], decode_rules: Sequence[Rule],
                   layout, p: Problem, a: Arch) -> list[Config]:
    """space.valid_configs for a family whose last axes are `decode_axes`, read by `decode_rules` alone (the layout,
    and so every resource rule, does not read them), in the same order: every other rule is checked once per
    combination of the other axes, then the combination is expanded by the decode axes' values."""
    assert tuple(ax.name for ax in axes[-len(decode_axes):]) == tuple(decode_axes)
    base_axes = axes[:-len(decode_axes)]
    names = tuple(ax.name for ax in base_axes)
    expansions = tuple(itertools.product(*(ax.values for ax in axes[-len(decode_axes):])))
    out = []
    for combo in itertools.product(*(ax.values for ax in base_axes)):
        base = Config(family, tuple(zip(names, combo)) + tuple(zip(decode_axes, expansions[0])))
        if violations(base, p, a):
            continue
        lay = layout(base, p)
        for values in expansions:
            c = base if values == expansions[0] else Config(family, base.values[:len(names)] + tuple(zip(decode_axes, values)))
            if not any(rule.check(c, p, a, lay) for rule in decode_rules):
                out.append(c)
    return out
