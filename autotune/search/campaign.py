"""A tuning campaign's file and plan: a list of shapes, one study each, each new shape warm-started with the best
configs of the shapes already tuned nearby (warm_start.py), in an order that puts those neighbours first
(neighbour_order). Running it: campaign_run.py; its closing table: campaign_table.py.

The file is TOML, JSON or YAML (YAML needs PyYAML), e.g.

    # campaign.toml
    [defaults]          # optional; applies to every shape
    head_dim = 128
    batch = 4
    heads = 16
    trials = 40

    [[shapes]]
    seqlen = 1024

    [[shapes]]
    seqlen = 4096
    causal = true
    trials = 60         # a shape's own keys win over the defaults

    [[shapes]]          # decode with 4 new tokens: the mask aligned to the end of the keys
    seqlen = 4
    seqlen_k = 4096
    causal = "lower_right"

In JSON or YAML the same structure ({"defaults": {...}, "shapes": [...]}), or just the list of shapes.

Keys: the shape (seqlen, seqlen_k, batch, heads, kv_heads, head_dim, dtype, causal; space.Shape's defaults for the
rest; causal as autotune.attention takes it: false, true or "upper_left" for SDPA's top-left mask, "lower_right" for
the mask aligned to the end of the keys) and the search options below (SEARCH_KEYS). Precedence, most specific first: the shape's keys, the file's
defaults, the command line, the built-in defaults. Each shape's search is an ordinary `autotune search`:
resumable (running the campaign again skips finished shapes and continues the others' studies toward their
trials) and, with --workers, spread over worker processes.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from space import Config, Shape, causal_mask

from ..build.spill_policy import SpillPolicy
from ..store.nearest import distance

SHAPE_KEYS = {"seqlen": "seqlen_q", "seqlen_k": "seqlen_k", "batch": "batch", "heads": "heads",
              "kv_heads": "kv_heads", "head_dim": "head_dim", "dtype": "dtype", "causal": "causal"}
DEFAULT_WARM_START = 4


def _families(value) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(str(v) for v in value)


def _configs(value) -> tuple[Config, ...]:
    return tuple(Config.from_key(k) for k in ([value] if isinstance(value, str) else value))


def _spill(value):

    return SpillPolicy.parse(str(value))


def _number(kind):
    def convert(value):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
            raise ValueError(f"expected {'an integer' if kind is int else 'a number'}, got {value!r}")
        return kind(value)
    return convert


# file key → (SearchOptions field, converter)
SEARCH_KEYS: dict[str, tuple[str, Callable]] = {
    "trials": ("trials", _number(int)), "timeout": ("timeout", _number(float)), "sampler": ("sampler", str),
    "seed": ("seed", _number(int)), "family": ("families", _families), "spill_policy": ("spill_policy", _spill),
    "enqueue": ("enqueue", _configs), "retime": ("retime_top", _number(int)),
    "retime_rounds": ("retime_rounds", _number(int)), "retime_max_rounds": ("retime_max_rounds", _number(int)),
    "retime_within": ("retime_within", _number(float)), "retime_cap": ("retime_cap", _number(int)),
    "warm_start": ("warm_start", _number(int)), "study": ("study_name", str), "max_asks": ("max_asks", _number(int)),
    "ahead": ("ahead", _number(int)), "eval_timeout": ("eval_timeout", _number(float)),
}


class CampaignError(ValueError):
    """The campaign file cannot be read or says something we cannot do; the message names file, entry, key."""


@dataclass(frozen=True)
class Entry:
    shape: Shape
    options: dict = field(default_factory=dict)  # SearchOptions fields set by the file


def read(path: str | Path) -> Any:
    """The parsed document (by extension: .toml, .json, .yaml/.yml)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise CampaignError(f"{path}: cannot read it: {e.strerror}") from None
    suffix = path.suffix.lower()
    try:
        if suffix == ".toml":
            try:
                import tomllib
            except ModuleNotFoundError:  # Python 3.10
                import tomli as tomllib
            return tomllib.loads(text)
        if suffix == ".json":
            return json.loads(text)
        if suffix in (".yaml", ".yml"):
            try:
                import yaml
            except ModuleNotFoundError:
                raise CampaignError(f"{path}: YAML needs PyYAML (pip install pyyaml), or write the campaign as "
                                    "TOML or JSON") from None
            return yaml.safe_load(text)
    except CampaignError:
        raise
    except Exception as e:  # each parser has its own error type; all of them mean "not valid <format>"
        raise CampaignError(f"{path}: not valid {suffix[1:].upper()}: {e}") from None
    raise CampaignError(f"{path}: expected a .toml, .json, .yaml or .yml file")


def parse(doc: Any, where: str = "campaign") -> list[Entry]:
    """Entries from a parsed document; errors name the entry and the key."""
    if isinstance(doc, list):
        doc = {"shapes": doc}
    if not isinstance(doc, dict):
        raise CampaignError(f"{where}: expected a table with `shapes` (and optional `defaults`), or a list of shapes")
    unknown = sorted(set(doc) - {"defaults", "shapes"})
    if unknown:
        raise CampaignError(f"{where}: unknown top-level key(s) {unknown}; expected `defaults` and `shapes`")
    defaults = doc.get("defaults") or {}
    shapes = doc.get("shapes")
    if not isinstance(defaults, dict):
        raise CampaignError(f"{where}: defaults: expected a table of keys")
    if not isinstance(shapes, list) or not shapes:
        raise CampaignError(f"{where}: shapes: expected a non-empty list")
    entries = []
    for i, item in enumerate(shapes):
        if not isinstance(item, dict):
            raise CampaignError(f"{where}: shapes[{i}]: expected a table of keys, got {item!r}")
        entries.append(_entry({**defaults, **item}, f"{where}: shapes[{i}]"))
    keys = [e.shape for e in entries]
    for i, shape in enumerate(keys):
        if shape in keys[:i]:
            raise CampaignError(f"{where}: shapes[{i}] repeats shapes[{keys.index(shape)}] ({shape.key})")
    return entries


def _entry(values: dict, where: str) -> Entry:
    unknown = sorted(set(values) - set(SHAPE_KEYS) - set(SEARCH_KEYS))
    if unknown:
        raise CampaignError(f"{where}: unknown key(s) {unknown}; shape keys are {sorted(SHAPE_KEYS)}, search keys "
                            f"{sorted(SEARCH_KEYS)}")
    try:
        fields = {SHAPE_KEYS[k]: v for k, v in values.items() if k in SHAPE_KEYS}
        if "causal" in fields:  # true, false, "upper_left" or "lower_right", as autotune.attention takes it
            fields["causal"], fields["causal_align"] = causal_mask(fields["causal"])
        shape = Shape(**fields)
    except (TypeError, ValueError) as e:
        raise CampaignError(f"{where}: {e}") from None
    options = {}
    for key, value in values.items():
        if key in SEARCH_KEYS:
            name, convert = SEARCH_KEYS[key]
            try:
                options[name] = convert(value)
            except (TypeError, ValueError, KeyError) as e:
                raise CampaignError(f"{where}: {key}: {e}") from None
    return Entry(shape, options)


def load(path: str | Path) -> list[Entry]:
    return parse(read(path), str(path))


def plan(entries: list[Entry], base) -> list:
    """One SearchOptions per entry: `base` (the command line) under the file's values."""
    out = []
    for e in entries:
        opts = dataclasses.replace(base, **e.options, shape=e.shape)
        opts.check()
        out.append(opts)
    return out


def neighbour_order(plans: list) -> list:
    """The plans reordered so that each shape's tuned neighbours come before it (campaign.run keeps this order).

    Shapes are grouped by what their binaries depend on (dtype, head_dim, causal: space.Problem) and by the
    families searched: a group shares every cubin, and warm starts draw only on shapes of the same group
    (warm_start.py). Groups come in the order of their first shape in the file; a group starts with that shape,
    then repeatedly takes the shape nearest (store.nearest.distance) to any shape already placed, ties in file
    order. So a file that lists the seqlen-4096 shape of each group first grows each group outward from it."""
    groups: dict[tuple, list] = {}
    for p in plans:
        groups.setdefault((p.shape.problem, p.families), []).append(p)
    out = []
    for members in groups.values():
        placed, left = [members[0]], list(members[1:])
        while left:
            nearest = min(left, key=lambda p: min(distance(p.shape, q.shape) for q in placed))
            placed.append(nearest)
            left.remove(nearest)
        out.extend(placed)
    return out

__all__ = ["CampaignError", "DEFAULT_WARM_START", "Entry", "SEARCH_KEYS", "SHAPE_KEYS", "load", "neighbour_order", "parse",
           "plan", "read"]
