"""The wgmma family's `scheduler` axis on CPU: the tile order's arithmetic (space/wgmma.py's twin of flash_fwd.cu's
tile_order / tile_at / persistent_tile), the launch grid (space.Layout.grid, the one formula every launch uses),
and that configs, tables and landscapes stored before the axis existed still mean `grid`."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import space
import space.wgmma as wg
from space import Config, Problem

ARCH = space.get_arch("sm_90")
ROOT = Path(__file__).resolve().parent.parent
OLD_KEY = "wgmma:consumer_wgs=2,bc=128,stages=3,setmaxnreg=1,overlap=1,pingpong=0,o_store=smem,min_blocks=1"


def work(tile, seqlen_q, seqlen_k, rows, causal):
    """Key tiles a query tile walks (flash_fwd.cu: num_kv_tiles), with Bc = 128."""
    m_block = tile[0]
    end = min(seqlen_k, min((m_block + 1) * rows, seqlen_q)) if causal else seqlen_k
    return -(-end // 128)


@pytest.mark.parametrize("batch,heads,kv_heads,seqlen,head_dim,rows", [
    (4, 16, 16, 4096, 128, 128),   # group 16: one section per batch
    (1, 64, 64, 1024, 128, 128),
    (16, 16, 16, 512, 64, 192),
    (2, 8, 8, 4096, 256, 128),
    (3, 12, 4, 777, 64, 64),       # GQA 3:1
    (1, 6, 2, 300_000, 128, 128),  # one K/V head fills the L2 share: sections of one GQA group
    (5, 3, 1, 1, 128, 192),
])
@pytest.mark.parametrize("causal", [False, True])
def test_tile_order_is_a_permutation_in_l2_sections(batch, heads, kv_heads, seqlen, head_dim, rows, causal):
    order = wg.tile_order(batch, heads, kv_heads, seqlen, seqlen, head_dim, rows, causal)
    num_m = -(-seqlen // rows)
    assert sorted(order) == sorted((m, h, b) for m in range(num_m) for h in range(heads) for b in range(batch))
    ratio = heads // kv_heads
    kv_fit = wg.L2_SECTION_BYTES // (2 * seqlen * head_dim * wg.ELEM_BYTES)
    group = min(max(1, kv_fit) * ratio, batch * heads)
    for start in range(0, len(order), group * num_m):
        section = order[start:start + group * num_m]
        pairs = {(b, h) for _, h, b in section}
        assert len(pairs) <= group
        # whole GQA groups: a K/V head's query heads are all in one section
        assert all(all((b, (h // ratio) * ratio + j) in pairs for j in range(ratio)) for b, h in pairs)
        if causal:  # longest first inside a section
            lengths = [work(t, seqlen, seqlen, rows, causal) for t in section]
            assert lengths == sorted(lengths, reverse=True)


def test_the_l2_section_has_one_size_on_both_sides():
    # the CPU order mirrors the kernel's only if both use the same section (traits.cuh: kL2SectionBytes = N << 20)
    traits = (ROOT / "kernels" / "sm90" / "traits.cuh").read_text()
    mb = re.search(r"constexpr long long kL2SectionBytes = (\d+)ll << 20;", traits)
    assert mb, "traits.cuh: kL2SectionBytes not found in the form the test reads"
    assert int(mb.group(1)) << 20 == wg.L2_SECTION_BYTES


def test_the_l2_section_follows_kv_bytes():
    # d128 fp16 N4096: a K/V head is 2 MB, 4 of them in the 8 MB share
    assert wg.L2_SECTION_BYTES == 8 << 20
    order = wg.tile_order(2, 32, 32, 4096, 4096, 128, 128, False)
    assert {h for _, h, b in order[:4 * 32]} == set(range(4)) and {b for *_, b in order[:4 * 32]} == {0}
    assert order[:3] == [(0, 0, 0), (1, 0, 0), (2, 0, 0)]  # non-causal: the query blocks of one head together
    causal = wg.tile_order(2, 32, 32, 4096, 4096, 128, 128, True)
    assert {h for _, h, b in causal[:4 * 32]} == set(range(4)) and {b for *_, b in causal[:4 * 32]} == {0}
    # causal: the heads of a section side by side
    assert causal[:5] == [(31, 0, 0), (31, 1, 0), (31, 2, 0), (31, 3, 0), (30, 0, 0)]


@pytest.mark.parametrize("batch,heads,kv_heads,seqlen,head_dim,rows", [
    (4, 16, 16, 4096, 128, 128), (1, 64, 64, 1024, 128, 128), (16, 16, 16, 512, 64, 192), (3, 12, 4, 777, 64, 64)])
def test_non_causal_order_is_the_grid_order(batch, heads, kv_heads, seqlen, head_dim, rows):
    # the ~132 tiles in flight share the K/V of a few heads, as under the grid scheduler (blockIdx.x fastest)
    order = wg.tile_order(batch, heads, kv_heads, seqlen, seqlen, head_dim, rows, False)
    num_m = -(-seqlen // rows)
    assert order == [(m, h, b) for b in range(batch) for h in range(heads) for m in range(num_m)]


SHAPES = [(4, 16, 16, 4096, 128, 128), (4, 32, 32, 4096, 64, 192), (1, 64, 64, 1024, 128, 128),
          (16, 16, 16, 512, 64, 128), (2, 8, 8, 4096, 256, 128), (3, 12, 4, 777, 64, 64), (1, 2, 1, 100, 128, 192)]


@pytest.mark.parametrize("batch,heads,kv_heads,seqlen,head_dim,rows", SHAPES)
@pytest.mark.parametrize("ctas", [132, 264, 7, 1])
def test_persistent_ctas_share_out_every_tile_once(batch, heads, kv_heads, seqlen, head_dim, rows, ctas):
    order = wg.tile_order(batch, heads, kv_heads, seqlen, seqlen, head_dim, rows, False)
    ctas = min(ctas, len(order))
    seen = [t for cta in range(ctas)
            for t in wg.persistent_tiles(cta, ctas, batch, heads, kv_heads, seqlen, seqlen, head_dim, rows, False)]
    assert sorted(seen) == sorted(order)


def test_causal_persistent_takes_tiles_from_a_counter():
    p = Problem(128, "bf16", True)
    config = Config.from_key(OLD_KEY).replace(scheduler="persistent")
    assert wg.tile_counter(config, p) and space.layout(config, p).tile_counter
    assert not space.layout(config, Problem(128, "bf16", False)).tile_counter
    assert not space.layout(config.replace(scheduler="lpt"), p).tile_counter
    # one 8-byte word per Q slot for the index of the tile it holds (traits.cuh kTileWordBytes)
    assert wg.smem_regions(config, p)["tile_words"] == 8 * wg.q_buffers(config, p)
    with pytest.raises(ValueError, match="counter"):
        wg.persistent_tiles(0, 132, 4, 16, 16, 4096, 4096, 128, 128, True)


@pytest.mark.parametrize("batch,heads,kv_heads,seqlen", [(4, 16, 16, 4096), (1, 32, 8, 8192), (1, 32, 32, 4096),
                                                         (8, 32, 8, 2048), (2, 8, 8, 1000)])
def test_the_counter_finishes_causal_ctas_together(batch, heads, kv_heads, seqlen):
    # Tiles cost their key tiles plus one for the prologue and epilogue. Taken from the counter in the causal order
    # (longest first within each L2 section), the last CTA finishes within one short tile of the mean; the block
    # pairs the counter replaced, alike in cost but 1024 of them on 132 CTAs (7.76 rounds), left 3 % idle.
    rows, ctas = 128, 132
    order = wg.tile_order(batch, heads, kv_heads, seqlen, seqlen, 128, rows, True)
    costs = [work(t, seqlen, seqlen, rows, True) + 1 for t in order]
    per_cta = wg.counter_schedule(ctas, costs)
    assert sorted(i for tiles in per_cta for i in tiles) == list(range(len(order)))  # every tile once
    assert all(tiles[0] == c for c, tiles in enumerate(per_cta) if tiles)  # CTA c starts with tile c
    finish = [sum(costs[i] for i in tiles) for tiles in per_cta]
    mean = sum(costs) / ctas
    num_m = -(-seqlen // rows)
    pair = num_m + 1 + 2  # a pair's key tiles, two prologues
    units = (num_m + 1) // 2 * batch * heads
    pairs_finish = -(-units // ctas) * pair if len(order) > ctas else max(costs)
    assert max(finish) <= mean + work((0,), seqlen, seqlen, rows, True) + 1 or max(finish) == max(costs)
    assert max(finish) <= pairs_finish


@pytest.mark.parametrize("ctas,units", [(132, 4096), (132, 768), (7, 50), (5, 5), (1, 9), (132, 131)])
def test_each_persistent_round_is_one_stretch_of_the_order_and_a_ctas_place_turns(ctas, units):
    seqs = [wg.persistent_units(c, ctas, units) for c in range(ctas)]
    assert sorted(u for s in seqs for u in s) == list(range(units))  # every unit once
    for k in range(-(-units // ctas)):  # round k: the units k·ctas .. (k+1)·ctas - 1, one per CTA
        assert sorted(s[k] for s in seqs if len(s) > k) == list(range(k * ctas, min(units, (k + 1) * ctas)))
    if ctas > 1 and units >= 2 * ctas:
        assert [u % ctas for u in seqs[0][:3]] == [0, 1, 2]  # not the same place (query block) every round


def test_persistent_ctas_share_the_vit_rows_short_block_instead_of_one_ctas_in_four_taking_all():
    # B64 H16 N577, Br 192: 4 query blocks per head, the last of 1 row; 132 CTAs = 33 × 4. A plain stride gave each
    # CTA one block of every head, so 33 CTAs did all the 1-row blocks and the other 99 all the full ones.
    batch, heads, seqlen, rows, ctas = 64, 16, 577, 192, 132
    num_m = -(-seqlen // rows)

    def cost(tile):  # warpgroups with rows (the idle ones only walk the ring)
        return -(-min(rows, seqlen - tile[0] * rows) // 64)

    per_cta = [[cost(t) for t in wg.persistent_tiles(c, ctas, batch, heads, heads, seqlen, seqlen, 64, rows, False)]
               for c in range(ctas)]
    assert all({t[0] for t in wg.persistent_tiles(c, ctas, batch, heads, heads, seqlen, seqlen, 64, rows, False)}
               == set(range(num_m)) for c in range(ctas))  # every CTA meets every query block
    mean = sum(map(sum, per_cta)) / ctas
    assert max(map(sum, per_cta)) <= mean + 3  # within one tile of the mean (a plain stride: 93 against 82.5)


def test_layout_grid_per_scheduler():
    base = Config.from_key(OLD_KEY)
    problem = Problem(128, "fp16", False)
    assert space.layout(base, problem).grid(4, 16, 4096) == (32, 16, 4)
    assert space.layout(base.replace(scheduler="lpt"), problem).grid(4, 16, 4097) == (33 * 64, 1, 1)
    persistent = space.layout(base.replace(scheduler="persistent"), problem)
    assert persistent.needs_residency and not space.layout(base, problem).needs_residency
    assert persistent.grid(4, 16, 4096, resident_ctas=132) == (132, 1, 1)
    assert persistent.grid(1, 1, 100, resident_ctas=132) == (1, 1, 1)
    with pytest.raises(ValueError, match="resident_ctas"):
        persistent.grid(4, 16, 4096)


def test_persistent_has_one_more_barrier():
    base = Config.from_key(OLD_KEY)
    problem = Problem(128, "fp16", False)
    grid, lpt, persistent = (space.layout(base.replace(scheduler=s), problem).smem_dynamic for s in wg.SCHEDULERS)
    assert grid == lpt == persistent - 8
    assert space.defines(base.replace(scheduler="persistent"), problem)["AT_SCHEDULER"] == 2
    assert space.defines(base, problem)["AT_SCHEDULER"] == 0


# the decode axes came later still: a key without them reads as one split, heads unpacked (the kernel as it was)
# the axes added after scheduler and o_rescale
DECODE_DEFAULTS = ",softmax_reduce=chain,exp2_fma=none,tail_split=0,kv_splits=1,pack_gqa=0"


def test_keys_from_before_the_axis_mean_grid():
    config = Config.from_key(OLD_KEY)
    assert config.scheduler == "grid" and config.key == OLD_KEY + ",scheduler=grid,o_rescale=after" + DECODE_DEFAULTS
    assert Config.from_dict({"family": "wgmma", **dict(config.values)}) == config
    d = config.as_dict()
    del d["scheduler"]
    assert Config.from_dict(d) == config


def test_shipped_rows_without_the_axis_mean_grid():
    table = json.loads((ROOT / "studies" / "tuned" / "h200.json").read_text())
    old = [row for row in table["rows"] if row["family"] == "wgmma" and "scheduler" not in row["config"]]
    assert old, "the shipped table no longer has rows from before the axis: test that case another way"
    for row in old:
        assert "scheduler=" not in row["config_key"]
        assert Config.from_key(row["config_key"]).scheduler == "grid"
        assert Config.from_dict(row["config"]).scheduler == "grid"


def test_recorded_landscapes_load_with_keys_of_today(tmp_path):
    from autotune.landscapes import landscape_file as landscape

    paths = sorted((ROOT / "studies" / "landscapes").glob("*.json"))
    assert paths
    for path in paths:  # every shipped landscape loads, its rows under today's keys
        loaded = landscape.load(path)
        assert loaded.rows and all(Config.from_key(key).key == key for key in loaded.rows)
    # A file as written before the scheduler/o_rescale axes (the shipped ones were re-saved with today's keys by
    # the noise sessions): keys without the two axes read as grid/after.
    suffix = ",scheduler=grid,o_rescale=after"
    data = json.loads(paths[0].read_text())
    data["rows"] = [dict(row, config_key=row["config_key"].removesuffix(suffix)) for row in data["rows"]
                    if row["config_key"].endswith(suffix)]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    loaded = landscape.load(old)
    assert loaded.rows and all(key.endswith(suffix + DECODE_DEFAULTS) for key in loaded.rows)
    best = loaded.best
    assert best.config.scheduler == "grid" and loaded.row(best.config) is best


def test_a_landscape_key_out_of_order_is_still_refused():
    from autotune.landscapes import landscape_file as landscape

    assert landscape.upgrade_key(OLD_KEY) == OLD_KEY + ",scheduler=grid,o_rescale=after" + DECODE_DEFAULTS
    shuffled = "wgmma:bc=128,consumer_wgs=2,stages=3,setmaxnreg=1,overlap=1,pingpong=0,o_store=smem,min_blocks=1"
    assert landscape.upgrade_key(shuffled) == shuffled  # left for validate() to reject
    # a key from between the decode axes and softmax_reduce: the newer axis goes in its place, not at the end
    decode_era = OLD_KEY + ",scheduler=persistent,o_rescale=before,kv_splits=4,pack_gqa=1"
    assert landscape.upgrade_key(decode_era) == (OLD_KEY + ",scheduler=persistent,o_rescale=before,"
                                                 "softmax_reduce=chain,exp2_fma=none,tail_split=0,kv_splits=4,"
                                                 "pack_gqa=1")
    # and one from before exp2_fma: it goes between softmax_reduce and kv_splits (with tail_split after it)
    tree_era = OLD_KEY + ",scheduler=persistent,o_rescale=before,softmax_reduce=tree,kv_splits=1,pack_gqa=0"
    assert landscape.upgrade_key(tree_era) == (OLD_KEY + ",scheduler=persistent,o_rescale=before,"
                                               "softmax_reduce=tree,exp2_fma=none,tail_split=0,kv_splits=1,pack_gqa=0")
    # and one from before tail_split: it goes between exp2_fma and kv_splits
    fma_era = OLD_KEY + (",scheduler=persistent,o_rescale=fused,softmax_reduce=tree,exp2_fma=quarter,kv_splits=1,"
                         "pack_gqa=0")
    assert landscape.upgrade_key(fma_era) == (OLD_KEY + ",scheduler=persistent,o_rescale=fused,softmax_reduce=tree,"
                                              "exp2_fma=quarter,tail_split=0,kv_splits=1,pack_gqa=0")
    assert landscape.upgrade_key(decode_era.replace(",kv_splits=4,pack_gqa=1", ",pack_gqa=1,kv_splits=4")) \
        == decode_era.replace(",kv_splits=4,pack_gqa=1", ",pack_gqa=1,kv_splits=4")  # out of order: as it is
