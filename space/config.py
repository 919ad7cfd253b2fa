"""Axes, families and the frozen Config they produce.

A family is one kernel body (kernels/<family dir>/) with its own axes and constraints. The space is plain data:
each Axis lists its domain and the macro it becomes; each Rule is a small named predicate that says why a config
is invalid. The kernel's traits header asserts the same rules with the same names.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

from .arch import Arch
from .problem import Problem


@dataclass(frozen=True)
class Axis:
    name: str
    values: tuple
    macro: str
    doc: str = ""
    encode: Callable[[Any], int] = int  # value -> integer macro value
    # For an axis added after configs were stored: the value that reproduces the kernel as it was before, used
    # when a stored config (a key, a dict) lacks the axis, so older studies and tables stay readable.
    default: Any = None

    def macro_value(self, value) -> int:
        return int(self.encode(value))


@dataclass(frozen=True)
class Violation:
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.message}"


@dataclass(frozen=True)
class Rule:
    """check(config, problem, arch, layout) returns None when satisfied, else a message saying why not."""

    name: str
    check: Callable[..., str | None]
    doc: str = ""


@dataclass(frozen=True)
class Layout:
    """Launch geometry derived from a config: the loader launches with exactly these figures."""

    threads: int
    smem_static: int
    smem_dynamic: int
    rows_per_block: int  # query rows covered by one tile (and by one CTA unless the scheduler is persistent)
    scheduler: str = "grid"  # how tiles map to CTAs: "grid", "lpt" (1-D, one tile each) or "persistent"
    kv_splits: int = 1       # CTAs per tile along the keys (grid.z = batch × kv_splits), merged by a combine kernel
    # Packed GQA: a tile's rows are (query row, head of the K/V head's group) pairs in tiles of PACK_TILE_ROWS rows,
    # each holding PACK_TILE_ROWS // G query rows of G = heads / kv_heads heads; grid.y runs over K/V heads.
    pack_gqa: bool = False
    # The kernel takes its tiles from an int32 counter in global memory (params.tile_counter), which must be zero
    # when it starts: the loader zeroes one before every launch.
    tile_counter: bool = False
    # Persistent, non-causal: the last round's tiles may be cut along the keys (space.wgmma.tail_plan); the loader then
    # allocates fp32 partials and launches flash_fwd_tail_combine after the kernel.
    tail_split: bool = False

    @property
    def smem_total(self) -> int:
        return self.smem_static + self.smem_dynamic

    @property
    def needs_residency(self) -> bool:
        """The grid depends on the device: SMs × resident CTAs per SM (grid() wants both)."""
        return self.scheduler == "persistent"

    def query_rows(self, heads: int, kv_heads: int | None = None) -> int:
        """Query rows (per head) one tile covers: rows_per_block, or packed, PACK_TILE_ROWS // G per tile."""
        if not self.pack_gqa:
            return self.rows_per_block
        group = heads // (kv_heads or heads)
        if group > PACK_TILE_ROWS:
            raise ValueError(f"kv_heads: pack_gqa packs at most {PACK_TILE_ROWS} query heads per K/V head into a "
                             f"tile, got {heads} heads on {kv_heads} K/V heads")
        return self.rows_per_block // PACK_TILE_ROWS * (PACK_TILE_ROWS // group)

    def grid(self, batch: int, heads: int, seqlen_q: int, resident_ctas: int | None = None,
             kv_heads: int | None = None) -> tuple[int, int, int]:
        """The launch grid, the one formula every launch uses (autotune.loader.KernelRunner.grid):
        grid: (ceil(seqlen_q / rows), heads, batch × kv_splits), packed GQA: (ceil(seqlen_q / query_rows),
        kv_heads, batch × kv_splits); lpt: (tiles, 1, 1); persistent: (min(tiles, resident_ctas), 1, 1) with
        resident_ctas = SMs × CTAs of this kernel resident per SM."""
        if self.scheduler == "grid":
            m_blocks = -(-seqlen_q // self.query_rows(heads, kv_heads))
            return m_blocks, (kv_heads or heads) if self.pack_gqa else heads, batch * self.kv_splits
        m_blocks = -(-seqlen_q // self.rows_per_block)
        tiles = m_blocks * heads * batch
        if self.scheduler == "lpt":
            return tiles, 1, 1
        if self.scheduler == "persistent":
            if not resident_ctas or resident_ctas < 1:
                raise ValueError(f"resident_ctas: a persistent grid needs SMs × resident CTAs (>= 1), "
                                 f"got {resident_ctas!r}")
            return min(tiles, resident_ctas), 1, 1
        raise ValueError(f"scheduler: expected grid, lpt or persistent, got {self.scheduler!r}")


PACK_TILE_ROWS = 64  # packed GQA tiles are one warpgroup's 64 wgmma rows (space/wgmma.py ROWS_PER_WG)


@dataclass(frozen=True)
class Family:
    name: str
    source: str             # kernel source, relative to kernels/
    entry: str              # extern "C" kernel symbol
    axes: tuple[Axis, ...]
    rules: tuple[Rule, ...]
    layout: Callable[["Config", Problem], Layout]
    default: Callable[[Problem, Arch], "Config"]
    # Optional: the valid configs of a problem, in enumerate_configs order, found faster than by checking the whole
    # cross product (the family knows which axes its rules read); valid_configs uses it, a test compares the two.
    valid: Callable[[Problem, Arch], list["Config"]] | None = None
    # A default for shapes the problem-level one serves badly (decode: split-KV, packed GQA), or None to keep it.
    shape_default: Callable[[Any, Arch], "Config | None"] | None = None
    # The decode axes: the last of `axes`, read by `decode_rules` alone (not by the layout nor any other rule), so a
    # space is judged once per combination of the other axes and then expanded (space/split_kv.py).
    decode_axes: tuple[str, ...] = ()
    decode_rules: tuple[Rule, ...] = ()

    def __post_init__(self):
        if self.decode_axes and tuple(a.name for a in self.axes[-len(self.decode_axes):]) != self.decode_axes:
            raise ValueError(f"family {self.name!r}: decode_axes {self.decode_axes} must be its last axes")

    def axis(self, name: str) -> Axis:
        for a in self.axes:
            if a.name == name:
                return a
        raise KeyError(f"family {self.name!r} has no axis {name!r}")


FAMILIES: dict[str, Family] = {}


def register_family(family: Family) -> Family:
    FAMILIES[family.name] = family
    return family


def get_family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"family: expected one of {sorted(FAMILIES)}, got {name!r}") from None


@dataclass(frozen=True)
class Config:
    """One point of the space: a family and a value for each of its axes (in axis order)."""

    family: str
    values: tuple[tuple[str, Any], ...] = field(default=())

    def __post_init__(self):
        # Each axis also as a plain instance attribute: rules read them millions of times when a space is
        # enumerated, and __getattr__'s scan of `values` was half of that time. (Equality and hashing stay those of
        # the two fields.) Written to the instance dict directly, and whether a name is free asked once per name:
        # a space's valid configs are hundreds of thousands of Configs, and hasattr per axis was a third of that.
        attrs = self.__dict__
        for n, v in self.values:
            free = _FREE_NAMES.get(n)
            if free is None:
                free = _FREE_NAMES[n] = not hasattr(Config, n)  # never shadow a field, method or property
            if free:
                attrs[n] = v

    def with_tail(self, tail: tuple[tuple[str, Any], ...]) -> "Config":
        """This config with its last len(tail) axes set to `tail` ((name, value) pairs of those axes, in order),
        unchecked, its other attributes copied rather than set again: the expansion of a space's decode axes makes
        a million of these (space/split_kv.py), and __post_init__ was a quarter of that time."""
        c = object.__new__(Config)
        attrs = c.__dict__
        attrs.update(self.__dict__)
        attrs["values"] = self.values[:len(self.values) - len(tail)] + tail
        for n, v in tail:
            if n in attrs:
                attrs[n] = v
        return c

    @classmethod
    def make(cls, family: str = "mma_sync", **values) -> "Config":
        fam = get_family(family)
        names = [a.name for a in fam.axes]
        unknown = set(values) - set(names)
        if unknown:
            raise ValueError(f"config: family {family!r} has no axis {sorted(unknown)}; axes are {names}")
        for a in fam.axes:
            if a.name not in values and a.default is not None:
                values[a.name] = a.default
        missing = [n for n in names if n not in values]
        if missing:
            raise ValueError(f"config: missing value for axis {missing} of family {family!r}")
        for a in fam.axes:
            if values[a.name] not in a.values:
                raise ValueError(f"config: axis {a.name!r} expects one of {list(a.values)}, got {values[a.name]!r}")
        return cls(family, tuple((n, values[n]) for n in names))

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        for n, v in object.__getattribute__(self, "values"):
            if n == name:
                return v
        raise AttributeError(f"Config of family {self.family!r} has no axis {name!r}")

    def as_dict(self) -> dict[str, Any]:
        return {"family": self.family, **dict(self.values)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Config":
        d = dict(d)
        family = d.pop("family", "mma_sync")
        return cls.make(family, **d)

    def replace(self, **changes) -> "Config":
        d = dict(self.values)
        d.update(changes)
        return Config.make(self.family, **d)

    @property
    def key(self) -> str:
        """Stable, readable, parseable: 'mma_sync:br=128,bc=64,...'."""
        return self.family + ":" + ",".join(f"{n}={_fmt(v)}" for n, v in self.values)

    @classmethod
    def from_key(cls, key: str) -> "Config":
        family, _, rest = key.partition(":")
        fam = get_family(family)
        out = {}
        for part in filter(None, rest.split(",")):
            n, eq, raw = part.partition("=")
            axis = fam.axis(n)
            if not eq or not raw:  # 'consumer_wgs' or 'consumer_wgs=': say so, rather than "value ''"
                raise ValueError(f"config key: axis {n!r} is given no value ({part!r}); expected {n}=VALUE, one "
                                 f"of {[_fmt(v) for v in axis.values]}")
            out[n] = _parse(n, raw, axis.values)
        return cls.make(family, **out)

    def __str__(self) -> str:
        return self.key


_FREE_NAMES: dict[str, bool] = {}  # axis name -> not an attribute of Config's own (Config.__post_init__)


def _fmt(v) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    return str(v)


def _parse(name: str, raw: str, domain: tuple):
    for v in domain:
        if _fmt(v) == raw:
            return v
    raise ValueError(f"config key: axis {name!r} has no value {raw!r}; its values: {[_fmt(v) for v in domain]}")


def defines(config: Config, problem: Problem) -> dict[str, int]:
    """All -D macros for one build: problem, axes, and the launch figures the kernel must agree with."""
    fam = get_family(config.family)
    out = dict(problem.defines())
    for a in fam.axes:
        out[a.macro] = a.macro_value(getattr(config, a.name))
    lay = fam.layout(config, problem)
    out["AT_EXPECT_THREADS"] = lay.threads
    out["AT_EXPECT_SMEM_STATIC"] = lay.smem_static
    out["AT_EXPECT_SMEM_DYNAMIC"] = lay.smem_dynamic
    return out


def layout(config: Config, problem: Problem) -> Layout:
    return get_family(config.family).layout(config, problem)


def violations(config: Config, problem: Problem, arch: Arch) -> list[Violation]:
    fam = get_family(config.family)
    out = []
    if fam.name not in arch.families:
        out.append(Violation("family_arch", f"family {fam.name!r} does not exist on {arch.name}"))
        return out
    lay = fam.layout(config, problem)
    for rule in fam.rules:
        msg = rule.check(config, problem, arch, lay)
        if msg:
            out.append(Violation(rule.name, msg))
    return out


def is_valid(config: Config, problem: Problem, arch: Arch) -> bool:
    return not violations(config, problem, arch)


def enumerate_configs(family: str, domains: Mapping[str, tuple] | None = None) -> Iterator[Config]:
    """Every point of the family's axes, valid or not (the cross product); `domains` ({axis: values}) narrows
    the axes it names to those values."""
    import itertools

    fam = get_family(family)
    names = [a.name for a in fam.axes]
    values = [tuple(domains[a.name]) if domains and a.name in domains else a.values for a in fam.axes]
    for combo in itertools.product(*values):
        yield Config(family, tuple(zip(names, combo)))


def valid_configs(problem: Problem, arch: Arch, families: tuple[str, ...] | None = None) -> list[Config]:
    fams = families or arch.families
    out = []
    for f in fams:
        if f not in FAMILIES:
            continue
        fam = FAMILIES[f]
        if fam.valid is not None and f in arch.families:
            out += fam.valid(problem, arch)
        else:
            out += [c for c in enumerate_configs(f) if is_valid(c, problem, arch)]
    return out


def default_config(problem: Problem, arch: Arch, family: str | None = None) -> Config:
    """The heuristic default: a pure function of problem and arch (used for untuned shapes)."""
    if family is None:
        # The arch's newest family: on sm_90 the Hopper-native one, which measured far ahead (docs/benchmarks.md).
        family = "wgmma" if "wgmma" in arch.families and "wgmma" in FAMILIES else "mma_sync"
    return get_family(family).default(problem, arch)


def default_config_for_shape(shape, arch: Arch, family: str | None = None) -> Config:
    """The heuristic default for one shape (space.Shape): the family's shape-level default where it has one for
    this shape (the wgmma family's for decode), else default_config(shape.problem, arch). A pure function."""
    if family is None:
        family = "wgmma" if "wgmma" in arch.families and "wgmma" in FAMILIES else "mma_sync"
    fam = get_family(family)
    if fam.shape_default is not None:
        found = fam.shape_default(shape, arch)
        if found is not None:
            return found
    return fam.default(shape.problem, arch)

