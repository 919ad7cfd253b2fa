"""What the families' decode axes share: the split count of an untuned decode shape, and the valid configs found
without checking the cross product the decode axes multiply.

Both families give split-KV the same meaning (grid.z = batch × splits, fp32 partials merged by the combine kernel of
kernels/common/split_combine.cuh) and their decode axes come last, read by their own rules only.
"""
from __future__ import annotations

import itertools
from typing import Iterator, Mapping, Sequence

from .arch import Arch
from .config import Config, Family, Violation, enumerate_configs, get_family, violations
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


def _expansion(fam: Family, domains: Mapping[str, tuple] | None = None):
    """(names of the other axes, their value combinations, the decode axes' value combinations); `domains` narrows
    the axes it names as in enumerate_configs."""
    n = len(fam.decode_axes)
    values = [tuple(domains[ax.name]) if domains and ax.name in domains else ax.values for ax in fam.axes]
    return (tuple(ax.name for ax in fam.axes[:-n]), itertools.product(*values[:-n]),
            tuple(itertools.product(*values[-n:])))


def valid_expanded(family: str, p: Problem, a: Arch) -> list[Config]:
    """space.valid_configs for a family with decode axes (Family.decode_axes), in the same order: every other rule
    is checked once per combination of the other axes, and a valid combination is expanded by the decode axes'
    values that its decode rules allow."""
    fam = get_family(family)
    names, combos, expansions = _expansion(fam)
    tails = [tuple(zip(fam.decode_axes, values)) for values in expansions]
    out = []
    for combo in combos:
        base = Config(family, tuple(zip(names, combo)) + tails[0])
        if violations(base, p, a):
            continue
        lay = fam.layout(base, p)
        for tail in tails:
            c = base if tail is tails[0] else base.with_tail(tail)
            if not any(rule.check(c, p, a, lay) for rule in fam.decode_rules):
                out.append(c)
    return out


def judged_configs(family: str, p: Problem, a: Arch,
                   domains: Mapping[str, tuple] | None = None) -> Iterator[tuple[Config, list[Violation]]]:
    """Every config of the family's cross product (narrowed by `domains` as in enumerate_configs) with
    space.violations' verdict on it, in enumerate_configs order: the other rules judged once per combination of
    the other axes, the decode rules per config (for a family without decode axes, or one not on the arch, simply
    violations() of each)."""
    fam = get_family(family)
    if not fam.decode_axes or fam.name not in a.families:
        for c in enumerate_configs(family, domains):
            yield c, violations(c, p, a)
        return
    names, combos, expansions = _expansion(fam, domains)
    tails = [tuple(zip(fam.decode_axes, values)) for values in expansions]
    decode_ids = {id(r) for r in fam.decode_rules}
    decode = [(i, r) for i, r in enumerate(fam.rules) if id(r) in decode_ids]
    others = [(i, r) for i, r in enumerate(fam.rules) if id(r) not in decode_ids]
    for combo in combos:
        base = Config(family, tuple(zip(names, combo)) + tails[0])
        lay = fam.layout(base, p)
        found = [(i, Violation(r.name, msg)) for i, r in others if (msg := r.check(base, p, a, lay))]
        broken = [v for _, v in found]
        for tail in tails:
            c = base if tail is tails[0] else base.with_tail(tail)
            more = [(i, Violation(r.name, msg)) for i, r in decode if (msg := r.check(c, p, a, lay))]
            yield c, [v for _, v in sorted(found + more, key=lambda iv: iv[0])] if more else list(broken)
