"""Every arch we name gets a default kernel that builds without spilling.

The default config (`space.default_config`) is what `autotune.attention` runs on a GPU with nothing tuned and what
`autotune build` builds without --config; a default that spills is a slow first kernel on that GPU, and one that the
search's own spill policy (`--spill-policy prune`) would drop. So: every family of every arch in space.ARCHES, every
head_dim × dtype × causal, built for that arch through the Builder (one batched ninja build per arch, since a
Builder targets one arch), must compile with 0 bytes of spill stores and loads.

Decode shapes (space.Shape.is_decode) get their own default (`space.default_config_for_shape`): split-KV on the
decode tile for the mma_sync family. Per arch, that default with splits at every head_dim (dtype and causal taken
in turn over the archs, so each arch builds 3, not 12) and once without splits join the same batch.
"""
from __future__ import annotations

import itertools

import pytest

import space
from autotune.build.builder import Builder
from autotune.launch.loader import COMBINE_ENTRY

PROBLEMS = tuple(space.Problem(d, t, c) for d, t, c in itertools.product(space.HEAD_DIMS, space.DTYPES, (False, True)))


def default_items(arch: space.Arch) -> list[tuple[space.Config, space.Problem]]:
    """(default config, problem) for every family of the arch and every problem."""
    return [(space.default_config(p, arch, f), p) for f in arch.families if f in space.FAMILIES for p in PROBLEMS]


def decode_items(arch: space.Arch) -> list[tuple[space.Config, space.Problem]]:
    """The mma_sync family's decode defaults: one B1 H32/8 Nk 32768 step per head_dim (which splits the keys on
    every arch) and one B8 H32/8 Nk 100 step (two key tiles: too few to split)."""
    turn = list(space.ARCHES).index(arch.name)
    out = []
    for i, d in enumerate(space.HEAD_DIMS):
        dtype, causal = space.DTYPES[(turn + i) % 2], bool((turn + i) // 2 % 2)
        for batch, seqlen_k in ((1, 32768), (8, 100)) if i == turn % 3 else ((1, 32768),):
            shape = space.Shape(batch=batch, heads=32, kv_heads=8, seqlen_q=1, seqlen_k=seqlen_k, head_dim=d,
                                dtype=dtype, causal=causal)
            out.append((space.default_config_for_shape(shape, arch, "mma_sync"), shape.problem))
    return out


def spill_failures(results) -> list[str]:
    """One line per build that is not a clean compile: what it was, its status and ptxas' figures or error."""
    lines = []
    for r in results:
        if r.status == "compiled":
            continue
        rep = r.report
        figures = (f"{rep.registers} registers, {rep.spill_stores} B spill stores, {rep.spill_loads} B spill loads"
                   if rep else ((r.error or "").strip() or "no compiler report").splitlines()[0])
        lines.append(f"{r.arch.name} {r.problem.key} {r.config.key}: {r.status}: {figures}")
    return lines


def test_the_cases_cover_every_arch_family_and_problem():
    # the names the issue lists: a new arch in space/ joins the test by itself, one dropped must be noticed
    assert {"sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_103", "sm_120"} <= set(space.ARCHES)
    assert len(PROBLEMS) == len(space.HEAD_DIMS) * len(space.DTYPES) * 2
    assert {c.family for c, _ in default_items(space.get_arch("sm_90"))} == {"mma_sync", "wgmma"}


def test_the_decode_defaults_split_and_cover_every_head_dim_dtype_and_masking():
    every = [pair for a in space.ARCHES.values() for pair in decode_items(a)]
    for arch in space.ARCHES.values():
        items = decode_items(arch)
        assert {p.head_dim for _, p in items} == set(space.HEAD_DIMS), arch.name
        assert {c.kv_splits > 1 for c, _ in items} == {True, False}, arch.name  # the split and the unsplit kernel
        assert all(c.family == "mma_sync" and space.is_valid(c, p, arch) for c, p in items)
    assert {(p.dtype, p.causal) for _, p in every} == {(t, c) for t in space.DTYPES for c in (False, True)}


def test_spill_failures_names_a_spilled_build():
    # the check below is only as good as this reading of a BuildResult: a spilled report must be reported
    from autotune.build.builder import BuildResult
    from autotune.build.ptxas import BuildReport

    arch, problem = space.get_arch("sm_80"), PROBLEMS[0]
    config = space.default_config(problem, arch)
    spilled = BuildResult(config, problem, arch, ok=True, cubin_path=None, cached=False, key="k", error=None,
                          report=BuildReport(255, 60, 72, 64, 0, 1.0))
    clean = BuildResult(config, problem, arch, ok=True, cubin_path=None, cached=False, key="k", error=None,
                        report=BuildReport(255, 0, 0, 0, 0, 1.0))
    (line,) = spill_failures([spilled, clean])
    assert line.startswith(f"sm_80 {problem.key} {config.key}: spilled: 255 registers, 60 B spill stores")


@pytest.mark.parametrize("arch_name", list(space.ARCHES))
def test_every_default_builds_without_spilling(arch_name, build_cache_dir):
    arch = space.get_arch(arch_name)
    items = default_items(arch) + decode_items(arch)
    results = Builder(arch, cache_dir=build_cache_dir).build(items)
    assert len(results) == len(items)
    bad = spill_failures(results)
    assert not bad, f"{len(bad)} of {len(items)} defaults on {arch_name} do not build cleanly:\n" + "\n".join(bad)
    # every cubin exports split-KV's merge beside the attention kernel: the loader launches both from one module
    for r in results:
        symbols = r.cubin_bytes()
        for entry in (space.get_family(r.config.family).entry, COMBINE_ENTRY):
            assert b"\0" + entry.encode() + b"\0" in symbols, f"{r.config.key}: no {entry} in {r.cubin_path}"


def test_untuned_decode_off_hopper_splits_the_keys_to_fill_the_sms():
    """space.default_config_for_shape for decode on the archs without wgmma: the mma_sync decode tile, split so that
    the CTAs fill their last wave (split_kv.GOOD_FILL) over Arch.sms × resident CTAs; prefill keeps its default."""
    from dataclasses import replace

    from space import split_kv

    decode = space.Shape(batch=1, heads=32, kv_heads=8, seqlen_q=1, seqlen_k=32768)
    assert space.default_config_for_shape(decode, space.get_arch("sm_90")).family == "wgmma"
    for arch in (a for a in space.ARCHES.values() if "wgmma" not in a.families):
        c = space.default_config_for_shape(decode, arch)
        assert c.family == "mma_sync" and (c.br, c.bc, c.kv_splits > 1) == (64, 64, True), arch.name
        slots = arch.sms * space.mma_sync.resident_ctas_per_sm(c, decode.problem, arch)

        def fill(s: int) -> float:
            return decode.batch * decode.heads * s / (-(-decode.batch * decode.heads * s // slots) * slots)

        best = max(fill(s) for s in space.mma_sync.KV_SPLITS)  # every count keeps >= 2 of 512 tiles here
        assert fill(c.kv_splits) >= min(split_kv.GOOD_FILL, best) - 1e-9, arch.name
        assert all(fill(s) < min(split_kv.GOOD_FILL, best) - 1e-9 for s in space.mma_sync.KV_SPLITS
                   if s < c.kv_splits), arch.name  # and it is the fewest that do
        # a short cache keeps one split (two would leave a split fewer than MIN_TILES_PER_SPLIT tiles)
        assert space.default_config_for_shape(replace(decode, seqlen_k=100), arch).kv_splits == 1
        # more sequences fill the SMs by themselves: never more splits
        assert space.default_config_for_shape(replace(decode, batch=64), arch).kv_splits <= c.kv_splits
        prefill = space.Shape(batch=1, heads=32, kv_heads=8, seqlen_q=4096)
        assert space.default_config_for_shape(prefill, arch) == space.default_config(prefill.problem, arch)
