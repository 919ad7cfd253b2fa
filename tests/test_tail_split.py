"""tail_split on CPU: the cut of the last round (space.wgmma.tail_plan, twin of flash_fwd.cu's tail_plan /
tail_pieces / tail_combine), its rules against the traits' static_asserts, the loader's partials and combine, and
a model of what the cut buys on the benchmark rows."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import space
import space.wgmma  # noqa: F401  (registers the family)
from space import Config, Problem
from space.wgmma import TAIL_COMBINE_COST, TAIL_MIN_KEY_TILES, TAIL_PIECE_COST, TailPlan, tail_plan

ARCH = space.get_arch("sm_90")
# the shipped d128 ping-pong config (persistent), with the tail cut
SHIP_P = Config.from_key("wgmma:consumer_wgs=2,bc=128,stages=2,setmaxnreg=1,overlap=1,pingpong=1,o_store=smem,"
                         "min_blocks=1,scheduler=persistent,o_rescale=before,softmax_reduce=chain,exp2_fma=none,"
                         "tail_split=1,kv_splits=1,pack_gqa=0")


def _cases():
    for tiles in (133, 200, 263, 264, 265, 511, 512, 864, 1000, 2048, 4093):
        for ctas in (1, 2, 7, 132, 264):
            for key_tiles in (1, 3, 4, 5, 8, 12, 16, 24, 32, 37, 64, 100):
                yield tiles, ctas, key_tiles


@pytest.mark.parametrize("tiles,ctas,key_tiles", list(_cases()))
def test_every_unit_of_the_cut_tiles_is_run_once_in_pieces_of_two_tiles_at_most(tiles, ctas, key_tiles):
    plan = tail_plan(tiles, ctas, key_tiles)
    full, rest = divmod(tiles, ctas)
    if full < 1 or rest == 0 or key_tiles < 2 * TAIL_MIN_KEY_TILES:
        assert plan is None
        return
    share = -(-rest * key_tiles // min(ctas, rest * key_tiles // TAIL_MIN_KEY_TILES))
    if share + TAIL_PIECE_COST + TAIL_COMBINE_COST >= key_tiles:  # not worth the pieces' costs and the combine's
        assert plan is None
        return
    assert plan.full_end == full * ctas and plan.tail_tiles == rest and plan.ctas <= ctas
    assert plan.ctas > rest  # so that no share is longer than a tile
    seen = {}
    for cta in range(ctas):
        pieces = plan.pieces(cta)
        assert len(pieces) <= 2 and (pieces == []) == (cta >= plan.ctas)
        assert sum(end - begin for _, begin, end, _ in pieces) >= TAIL_MIN_KEY_TILES if pieces else True
        assert [slot for *_, slot in pieces] == [2 * cta + k for k in range(len(pieces))]
        for tile, begin, end, slot in pieces:
            assert plan.full_end <= tile < tiles and 0 <= begin < end <= key_tiles
            for n in range(begin, end):
                assert (tile, n) not in seen
                seen[(tile, n)] = slot
    assert len(seen) == rest * key_tiles  # every key tile of every cut tile
    for j in range(rest):  # the combine reads exactly the slots that wrote tile j, in key order
        slots = [seen[(plan.full_end + j, n)] for n in range(key_tiles)]
        assert plan.slots_of_tile(j) == list(dict.fromkeys(slots))


TAIL_PLAN_H = Path(__file__).resolve().parent.parent / "kernels" / "sm90" / "tail_plan.h"


def test_the_kernels_arithmetic_is_the_twins(tmp_path):
    """kernels/sm90/tail_plan.h, compiled for the host, against space.wgmma.TailPlan on every cut case above: every
    CTA's pieces and the slots the combine reads for every cut tile."""
    cxx = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler on PATH")
    plans = [(tiles, ctas, plan) for tiles, ctas, key_tiles in sorted(set(_cases()))
             if (plan := tail_plan(tiles, ctas, key_tiles)) is not None]
    assert len(plans) > 100
    rows = ", ".join(f"{{{tiles}, {ctas}, {p.full_end}, {p.ctas}, {p.key_tiles}}}" for tiles, ctas, p in plans)
    source = tmp_path / "tail.cpp"
    source.write_text(
        f'#include <cstdio>\n#include "{TAIL_PLAN_H}"\n'
        "int main() {\n"
        f"    const int cases[][5] = {{{rows}}};\n"
        "    for (const auto& c : cases) {\n"
        "        const tail_split::Plan t = tail_split::make_plan(c[0], c[2], c[3], c[4]);\n"
        "        std::printf(\"plan %d %d %lld\\n\", c[0], c[1], t.units);\n"
        "        for (int i = 0; i < c[1]; ++i)\n"
        "            for (int k = 0; k < 2; ++k) {\n"
        "                tail_split::Piece p;\n"
        "                if (tail_split::piece(t, i, k, p))\n"
        "                    std::printf(\"piece %d %d %d %d\\n\", i, p.tile, p.n_begin, p.n_end);\n"
        "            }\n"
        "        for (int j = 0; j < c[0] - t.full_end; ++j) {\n"
        "            std::printf(\"slots %d\", j);\n"
        "            const long long first = static_cast<long long>(j) * t.n;\n"
        "            const int i0 = tail_split::cta_of(t, first), slot0 = tail_split::slot(t, i0, j);\n"
        "            for (int i = i0; i <= tail_split::cta_of(t, first + t.n - 1); ++i)\n"
        "                std::printf(\" %d\", tail_split::slot_after(i, i0, slot0));\n"
        "            std::printf(\"\\n\");\n"
        "        }\n"
        "    }\n"
        "    return 0;\n"
        "}\n")
    exe = tmp_path / "tail"
    subprocess.run([cxx, "-std=c++17", "-O1", str(source), "-o", str(exe)], check=True, capture_output=True)
    got = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.splitlines()
    want = []
    for tiles, ctas, plan in plans:
        want.append(f"plan {tiles} {ctas} {plan.units}")
        for cta in range(ctas):
            want += [f"piece {cta} {tile - plan.full_end} {begin} {end}" for tile, begin, end, _ in plan.pieces(cta)]
        want += [" ".join(["slots", str(j)] + [str(s) for s in plan.slots_of_tile(j)]) for j in range(plan.tail_tiles)]
    assert got == want


def test_a_round_that_is_whole_or_absent_is_not_cut():
    assert tail_plan(132, 132, 32) is None   # one round, full
    assert tail_plan(128, 128, 64) is None   # the persistent grid is min(tiles, CTAs): fewer tiles, one round
    assert tail_plan(264, 132, 32) is None
    assert tail_plan(200, 132, 3) is None    # three key tiles cannot make two pieces of two
    assert tail_plan(512, 132, 8) is None    # B1 H64 N1024: 116 of 132 tiles in the last round, shares of 8 - 1
    assert tail_plan(768, 132, 4) is None    # N512 d64 (Br 192): shares of 4 key tiles, the tile's own length
    # the ViT: 4 tiles of 5 key tiles left would be shares of 2 on 10 CTAs; cut so, it lost 2.2 % on an H100
    assert tail_plan(4096, 132, 5) is None
    assert tail_plan(4096, 132, 16) is not None  # the same tiles with 16 key tiles: shares of 5
    with pytest.raises(ValueError, match="tail_plan"):
        tail_plan(200, 0, 32)


def test_the_d128_row_is_cut_into_halves_of_a_tile():
    # B4 H16 N4096 d128, Br 128 / Bc 128: 2048 tiles of 32 key tiles on 132 CTAs = 15 rounds + 68 tiles
    plan = tail_plan(2048, 132, 32)
    assert plan == TailPlan(full_end=1980, tail_tiles=68, ctas=132, key_tiles=32)
    lengths = {sum(e - b for _, b, e, _ in plan.pieces(c)) for c in range(132)}
    assert lengths == {16, 17}  # 2176 key tiles over 132 CTAs, against 32 for the 68 CTAs that ran the last round


def test_tail_split_is_valid_only_on_equal_rounds():
    full, causal = Problem(128, "bf16", False), Problem(128, "bf16", True)
    assert space.is_valid(SHIP_P, full, ARCH)
    assert space.layout(SHIP_P, full).tail_split
    assert [v.rule for v in space.violations(SHIP_P, causal, ARCH)] == ["tail_split_needs_equal_rounds"]
    assert [v.rule for v in space.violations(SHIP_P, Problem(128, "bf16", False, seqused_k=True), ARCH)] == [
        "tail_split_needs_equal_rounds"]
    grid = SHIP_P.replace(scheduler="grid")
    assert [v.rule for v in space.violations(grid, full, ARCH)] == ["tail_split_needs_equal_rounds"]
    # d256's persistent overlapped loop is at its register budget: a second copy of it spills (ptxas 13.0: 56 B)
    d256 = space.default_config(Problem(256, "bf16", False), ARCH, "wgmma").replace(scheduler="persistent",
                                                                                   tail_split=True)
    assert [v.rule for v in space.violations(d256, Problem(256, "bf16", False), ARCH)] == [
        "tail_split_fits_registers"]
    assert space.is_valid(d256.replace(overlap=False, pingpong=False, o_rescale="after"),
                          Problem(256, "bf16", False), ARCH)


def test_the_fast_enumeration_agrees_with_the_rules_on_the_tail_axis():
    problem = Problem(128, "bf16", False)
    configs = space.valid_configs(problem, ARCH, ("wgmma",))
    tail = [c for c in configs if c.tail_split]
    assert tail and all(c.scheduler == "persistent" for c in tail)
    assert all(space.is_valid(c, problem, ARCH) for c in tail[:: max(1, len(tail) // 300)])
    assert not any(c.tail_split for c in space.valid_configs(Problem(128, "bf16", True), ARCH, ("wgmma",)))


def test_the_loader_allocates_the_pieces_partials_and_launches_the_tail_combine(monkeypatch):
    torch = pytest.importorskip("torch")
    from autotune.launch import loader
    from autotune.launch.params import InputShape

    loaded = []
    monkeypatch.setattr(loader, "load_kernel", lambda cubin, entry, smem, device: loaded.append(entry) or _Kernel(entry))
    runner = loader.KernelRunner.__new__(loader.KernelRunner)
    runner.config, runner.layout, runner._cubin = SHIP_P, space.layout(SHIP_P, Problem(128, "bf16", False)), b""
    shape = InputShape(batch=4, heads=16, kv_heads=16, seqlen_q=4096, seqlen_k=4096, head_dim=128, dtype="bf16")
    plan = runner.tail_plan(shape, (132, 1, 1))
    assert plan == tail_plan(2048, 132, 32)
    combine = runner.combine(shape, grid=(132, 1, 1))
    assert combine.kernel.entry == loader.TAIL_COMBINE_ENTRY == "flash_fwd_tail_combine"
    assert combine.grid == (68 * 128 // 4, 1, 1) and combine.block == (128, 1, 1)  # a warp per row of a cut tile
    assert not combine.programmatic  # a plain launch: PDL cost it 3 us after the persistent kernel
    o, lse = loader.tail_partials(plan, 128, 128, "cpu")
    assert o.shape == (2 * 132, 128, 128) and lse.shape == (2 * 132, 128) and o.dtype == torch.float32
    assert loader.tail_partials(None, 128, 128, "cpu") == ()
    with pytest.raises(ValueError, match="grid"):
        runner.combine(shape)
    # a shape whose last round is whole: nothing to merge
    whole = InputShape(batch=1, heads=33, kv_heads=33, seqlen_q=512, seqlen_k=4096, head_dim=128, dtype="bf16")
    assert runner.tail_plan(whole, (132, 1, 1)) is None and runner.combine(whole, grid=(132, 1, 1)) is None
    runner.layout = space.layout(SHIP_P.replace(tail_split=False), Problem(128, "bf16", False))
    assert runner.tail_plan(shape, (132, 1, 1)) is None and runner.combine(shape, grid=(132, 1, 1)) is None


class _Kernel:
    def __init__(self, entry):
        self.entry = entry

    def compute_capability(self):
        return (9, 0)


def _tail_time(tiles: int, ctas: int, key_tiles: int, fixed: float) -> tuple[float, float]:
    """Kernel time in key-tile units, whole last round against cut (a tile costs key_tiles + fixed, a piece its
    key tiles + fixed): the tail-split model docs/benchmarks.md quotes."""
    rounds = -(-tiles // ctas)
    whole = rounds * (key_tiles + fixed)
    plan = tail_plan(tiles, ctas, key_tiles)
    if plan is None:
        return whole, whole
    longest = max(sum(e - b + fixed for _, b, e, _ in plan.pieces(c)) for c in range(ctas))
    return whole, (tiles // ctas) * (key_tiles + fixed) + longest


def test_the_model_of_the_rows_gain():
    # d128 N4096 (2048 tiles of 32), the DiT (864 of 36): the cut saves about half of a round
    whole, cut = _tail_time(2048, 132, 32, fixed=2)
    assert 0.02 < 1 - cut / whole < 0.035
    whole, cut = _tail_time(864, 132, 36, fixed=2)
    assert 0.05 < 1 - cut / whole < 0.07
