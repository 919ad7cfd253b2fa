"""What each design axis did to speed, read from finished search studies (no GPU needed).

    python benchmarks/axis_effects.py --storage sqlite:///studies/h200.db [--study NAME ...]

For every family and axis: per axis value, how many complete trials had it, their best and median TFLOPS.
Search studies are not balanced experiments (the sampler goes where speed is), so read the best column as
"the fastest config seen with this value" rather than as an isolated effect of the axis.
"""
from __future__ import annotations

import argparse
import statistics
from collections import defaultdict

import optuna

import space
from autotune.store.storage_url import resolve_storage_url


def complete_configs(study: optuna.Study) -> list[tuple[space.Config, float]]:
    out = []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        key = t.user_attrs.get("config_key")
        if key and t.value is not None and not t.user_attrs.get("duplicate_of"):
            out.append((space.Config.from_key(key), float(t.value)))
    return out


def axis_table(rows: list[tuple[space.Config, float]], family: str) -> str:
    fam = space.get_family(family)
    mine = [(c, v) for c, v in rows if c.family == family]
    if not mine:
        return f"(no complete {family} trials)\n"
    lines = [f"| axis | value | trials | best TFLOPS | median TFLOPS |", "|---|---|---|---|---|"]
    for axis in fam.axes:
        by_value = defaultdict(list)
        for c, v in mine:
            by_value[getattr(c, axis.name)].append(v)
        for value in axis.values:
            vals = by_value.get(value)
            if vals:
                lines.append(f"| {axis.name} | {value} | {len(vals)} | {max(vals):.0f} | {statistics.median(vals):.0f} |")
            else:
                lines.append(f"| {axis.name} | {value} | 0 | | |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--storage", default=None, help="storage URL (default: autotune's default storage)")
    p.add_argument("--study", action="append", default=None, help="study name (repeatable; default: all)")
    args = p.parse_args(argv)
    url = resolve_storage_url(args.storage)
    names = args.study or [s.study_name for s in optuna.get_all_study_summaries(url)]
    for name in names:
        study = optuna.load_study(study_name=name, storage=url)
        rows = complete_configs(study)
        print(f"### {name} ({len(rows)} complete trials)\n")
        for family in sorted({c.family for c, _ in rows}):
            print(f"**{family}**\n")
            print(axis_table(rows, family))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
