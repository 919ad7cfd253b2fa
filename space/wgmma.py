"""The Hopper-native family (TMA + mbarrier ring, warp-specialised, wgmma): kernels/sm90/, sm_90a only.

Every formula here has a twin in kernels/sm90/traits.cuh; the rule names are the prefixes of its static_assert
messages, and tests/test_wgmma_compile.py compiles a sample to check that both sides agree.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

from .arch import Arch
from .config import PACK_TILE_ROWS, Axis, Config, Family, Layout, register_family
from .problem import Problem, Shape
from .resource_rules import (min_blocks_smem, rule, smem_optin_limit, static_smem_limit, threads_per_block,
                             threads_per_sm)
from .split_kv import GOOD_FILL, MIN_TILES_PER_SPLIT, splits_for, valid_expanded

ELEM_BYTES = 2         # fp16 / bf16
ROWS_PER_WG = 64       # the M of wgmma: each consumer warpgroup owns 64 query rows
SWIZZLE_COLS = 64      # 128-byte swizzle span in elements: head_dim is loaded in boxes this wide
SMEM_ALIGN = 1024      # slack to align the dynamic base to a swizzle atom
PRODUCER_REGS = 24     # setmaxnreg.dec target of the producer warpgroup
MAX_CONSUMER_REGS = 240
# Registers beyond S + O + P: row statistics, indices, addresses; the overlapped loop keeps more alive across the
# asynchronous P·V. Calibrated on ptxas 13.0 (smallest margins with no spill in the sampled space).
REG_OVERHEAD = {False: 8, True: 32}
# o_rescale=before keeps the correction factors alive across the loop's back edge; with the persistent loop's state
# too, d256 causal spilled 64 B at 32: 72 prunes d256 (every Bc) and d128 with Bc >= 176 (traits.cuh kRegOverhead).
# The persistent overlapped loop at d256 causal spills with o_rescale=after too (4-64 B at Bc 64/80), so it gets the
# same margin; d128 causal does not (Bc 192 compiles without spill at 32). So does d256 with softmax_reduce=tree
# (its partial maxima and sums: the non-causal d256 default, persistent, spilled) and with exp2_fma (the polynomial's
# temporaries: Bc 80 persistent, non-causal, spilled 24 B), and with tail_split (its second copy of the tile loop: the
# d256 default spilled 56 B; its own rule, tail_split_fits_registers, as the decode axes' rules read them alone).
REG_OVERHEAD_PERSISTENT_TIGHT = 72
SCHEDULERS = ("grid", "lpt", "persistent")  # AT_SCHEDULER = index; "grid" is the kernel as it was before the axis
O_RESCALES = ("after", "before", "fused")    # AT_O_RESCALE = index (traits.cuh kORescale)
# sm_90's per-block opt-in shared memory and per-SM capacity (traits.cuh's static_asserts use the same figures)
SMEM_OPTIN_SM90 = 232448
SMEM_PER_SM_SM90 = 233472
L2_SECTION_BYTES = 8 << 20  # K/V bytes of one section of heads in the lpt order (traits.cuh: kL2SectionBytes)
KV_SPLITS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)  # traits.cuh: at most 32 (one lane of a combine warp per split)

AXES = (
    Axis("consumer_wgs", (1, 2, 3), "AT_CONSUMER_WGS",
         "consumer warpgroups (64 query rows each): Br = 64 × consumer_wgs"),
    Axis("bc", (64, 80, 96, 112, 128, 176, 192), "AT_BC",
         "key columns per K/V tile: the N of S = Q·Kᵀ (any multiple of 16 the instruction and smem allow)"),
    Axis("stages", (2, 3, 4, 5, 6), "AT_STAGES",
         "K/V slots in the TMA/mbarrier shared-memory ring (5-6 fit with small tiles: decode keeps more K/V in flight)"),
    Axis("setmaxnreg", (True, False), "AT_SETMAXNREG",
         "producer warpgroup gives registers to the consumers (setmaxnreg.dec 24 / .inc)"),
    Axis("overlap", (True, False), "AT_OVERLAP",
         "issue S(n) with P(n-1)·V(n-1) and run softmax(n) while P·V is on the tensor cores"),
    Axis("pingpong", (True, False), "AT_PINGPONG",
         "two consumer warpgroups alternate GEMM turns on named barriers (one's softmax under the other's GEMMs)"),
    Axis("o_store", ("direct", "smem"), "AT_O_STORE_SMEM",
         "O written from the accumulator fragments (4-byte stores), or staged in the warpgroup's Q slot of shared "
         "memory and written as 16-byte row chunks", lambda v: v == "smem"),
    Axis("min_blocks", (1, 2), "AT_MIN_BLOCKS", "__launch_bounds__ minimum resident CTAs per SM"),
    Axis("scheduler", SCHEDULERS, "AT_SCHEDULER",
         "which tiles a CTA runs: grid (one CTA per (query block, head, batch), causal blocks reversed), lpt (one "
         "CTA per tile, tiles in L2-sized head sections, longest first when causal) or persistent (SMs × resident "
         "CTAs, each striding through the lpt order, or when causal taking its next tile from a counter as it frees "
         "up; the next tile's loads overlap the current tile's epilogue)",
         SCHEDULERS.index, default="grid"),
    Axis("o_rescale", O_RESCALES, "AT_O_RESCALE",
         "when O shrinks by a tile's max correction: after P(n-1)·V(n-1) completes (skipped when no row's max grew), "
         "before P(n-1)·V(n-1) is issued, under the S(n) GEMM (overlapped loop; FA3's order for head_dim > 128), or "
         "fused: after P·V, unconditionally, in one stretch with the exponentials and P's conversion, so the FMULs "
         "and conversions issue between the MUFU.EX2s (FlashAttention-4's order)", O_RESCALES.index, default="after"),
    Axis("softmax_reduce", ("chain", "tree"), "AT_SOFTMAX_TREE",
         "a tile's row max and row sum: one dependent chain per row, row after row, or four independent partials "
         "per row with both rows side by side (shorter dependency chains, a few more registers)",
         lambda v: v == "tree", default="chain"),
    Axis("exp2_fma", ("none", "quarter"), "AT_EXP2_FMA_EVERY",
         "unmasked tiles: every fourth exponential of P computed on the FMA pipe (a degree-3 polynomial, 1.2e-4 "
         "relative error) instead of MUFU.EX2, whose 8 cycles per warp instruction bound the softmax",
         lambda v: {"none": 0, "quarter": 4}[v], default="none"),
    Axis("tail_split", (False, True), "AT_TAIL_SPLIT",
         "persistent, non-causal: the full rounds of tiles run whole and the last, part-empty round's tiles are cut "
         "along the keys into about equal pieces over all the CTAs (stream-K's tail), merged by a small combine "
         "kernel", default=False),
    Axis("kv_splits", KV_SPLITS, "AT_KV_SPLITS",
         "CTAs one tile's key range is cut into (grid.z = batch × splits); each writes fp32 partials that a small "
         "combine kernel merges by their logsumexp: fills the SMs when batch × heads × query blocks is small "
         "(decode against a long cache)", default=1),
    Axis("pack_gqa", (False, True), "AT_PACK_GQA",
         "the query heads sharing one K/V head are the rows of one tile (64 / G query rows of G heads), so each K/V "
         "tile is read once per K/V head and wgmma's 64 rows are filled by heads (decode with grouped heads)",
         default=False),
)


def br(c: Config) -> int:
    return ROWS_PER_WG * c.consumer_wgs


def threads(c: Config) -> int:
    return 128 * (1 + c.consumer_wgs)


def q_buffers(c: Config, p: Problem) -> int:
    """Q slots: 2 for a persistent CTA whenever they fit (the opt-in limit, and MIN_BLOCKS CTAs per SM), else 1; the
    producer then loads the next tile's Q while the current one runs (traits.cuh: kQBuffers)."""
    if c.scheduler != "persistent":
        return 1
    q = br(c) * p.head_dim * ELEM_BYTES
    two = (SMEM_ALIGN + 2 * q + 2 * c.stages * c.bc * p.head_dim * ELEM_BYTES + 8 * (2 + 4 * c.stages + 2)
           + 2 * tile_word_bytes(c, p))
    fits = two <= SMEM_OPTIN_SM90 and (c.min_blocks == 1 or c.min_blocks * (two + 1024) <= SMEM_PER_SM_SM90)
    return 2 if fits else 1


def tile_counter(c: Config, p: Problem) -> bool:
    """Whether the CTAs take their tiles from a counter in global memory (traits.cuh kTileCounter): persistent and
    causal, where tiles differ in length and CTAs that take the next one as they free up finish together."""
    return c.scheduler == "persistent" and p.causal


def tile_word_bytes(c: Config, p: Problem) -> int:
    """Shared memory per Q slot for the index of the tile it holds (traits.cuh kTileWordBytes)."""
    return 8 if tile_counter(c, p) else 0


TAIL_MIN_KEY_TILES = 2  # the smallest share of the cut tiles' units, in key tiles
# What a piece costs beyond its key tiles (a second Q load and prologue, the fp32 partials, the combine's share), in
# key tiles: a model's figure (tests/test_tail_split.py), not a measurement. A round is cut only where a share plus this
# is shorter than a tile, so a nearly full last round (B1 H64 N1024: 116 of 132 tiles, 8 key tiles) and short tiles
# (N512 d64: 4) run whole.
TAIL_PIECE_COST = 2
# What the cut costs once, in key tiles: the combine kernel after the main one (its launch, its wait for the whole grid,
# the partials read back). Calibrated on an H100 (docs/benchmarks.md, tail_split measured): the search's timing gained
# 5-10 us less than ncu's main kernel did on the d128 rows (4-6 key tiles of 1.6 us), and the ViT (4 tiles of 5 key
# tiles cut into shares of 2) lost 2.2 %. With it a cut must save more than a few key tiles: the ViT runs whole.
TAIL_COMBINE_COST = 4


@dataclass(frozen=True)
class TailPlan:
    """How a tail-split kernel cuts its last round: tiles [0, full_end) run whole in full rounds, the tail_tiles
    after them are units = tail_tiles × key_tiles (one key tile of one tile) that CTAs 0 .. ctas-1 share out as equal
    contiguous ranges, a piece of at most two tiles each. The loader passes full_end and ctas to the kernel
    (FlashFwdParams.tail_full_end, tail_ctas); kernels/sm90/tail_plan.h is the twin of the shares, pieces and slots."""

    full_end: int
    tail_tiles: int
    ctas: int
    key_tiles: int

    @property
    def units(self) -> int:
        return self.tail_tiles * self.key_tiles

    def start(self, cta: int) -> int:
        """The first unit of CTA `cta`'s share (the share ends where the next one's starts)."""
        return cta * self.units // self.ctas

    def cta_of(self, unit: int) -> int:
        """The CTA whose share holds `unit`."""
        return ((unit + 1) * self.ctas - 1) // self.units

    def pieces(self, cta: int) -> list[tuple[int, int, int, int]]:
        """(tile index in the order, first key tile, key tile end, partial slot) of each piece CTA `cta` runs after
        its full rounds (tail_plan.h: piece; flash_fwd.cu: tail_pieces)."""
        out = []
        if cta >= self.ctas:
            return out
        u, end, slot = self.start(cta), self.start(cta + 1), 2 * cta
        while u < end:
            j = u // self.key_tiles
            n_end = min(self.key_tiles, end - j * self.key_tiles)
            out.append((self.full_end + j, u - j * self.key_tiles, n_end, slot))
            u, slot = j * self.key_tiles + n_end, slot + 1
        return out

    def slots_of_tile(self, j: int) -> list[int]:
        """The partial slots of cut tile j (0 .. tail_tiles-1) that flash_fwd_tail_combine merges, in key order."""
        first = j * self.key_tiles
        return [2 * i + (1 if self.start(i) < first else 0)
                for i in range(self.cta_of(first), self.cta_of(first + self.key_tiles - 1) + 1)]


def tail_plan(tiles: int, ctas: int, key_tiles: int) -> TailPlan | None:
    """The cut of a tail-split kernel's last round (the loader's decision, passed to the kernel in the parameter
    block), or None where it runs whole as without the axis: fewer tiles than one full round, no tile left over,
    tiles shorter than two pieces (2 × TAIL_MIN_KEY_TILES key tiles), or a longest share that with TAIL_PIECE_COST
    and TAIL_COMBINE_COST is not shorter than a whole tile (a nearly full last round, short tiles).
    Otherwise as many CTAs as have TAIL_MIN_KEY_TILES units each, at most all of them."""
    if ctas < 1 or tiles < 1 or key_tiles < 1:
        raise ValueError(f"tail_plan: tiles, ctas and key_tiles must be >= 1, got {tiles}, {ctas}, {key_tiles}")
    full, rest = divmod(tiles, ctas)
    if full < 1 or rest == 0 or key_tiles < 2 * TAIL_MIN_KEY_TILES:
        return None
    plan = TailPlan(full * ctas, rest, min(ctas, rest * key_tiles // TAIL_MIN_KEY_TILES), key_tiles)
    if -(-plan.units // plan.ctas) + TAIL_PIECE_COST + TAIL_COMBINE_COST >= key_tiles:
        return None
    return plan


def num_barriers(c: Config, p: Problem) -> int:
    # Q full per Q slot; K full, V full, K empty, V empty per stage; persistent: Q empty per Q slot
    q = q_buffers(c, p)
    return q + 4 * c.stages + (q if c.scheduler == "persistent" else 0)


def smem_regions(c: Config, p: Problem) -> dict[str, int]:
    d = p.head_dim
    return {
        "align": SMEM_ALIGN,
        "q": q_buffers(c, p) * br(c) * d * ELEM_BYTES,
        "kv": 2 * c.stages * c.bc * d * ELEM_BYTES,
        "barriers": 8 * num_barriers(c, p),
        "tile_words": q_buffers(c, p) * tile_word_bytes(c, p),
    }


def layout(c: Config, p: Problem) -> Layout:
    return Layout(threads=threads(c), smem_static=0, smem_dynamic=sum(smem_regions(c, p).values()),
                  rows_per_block=br(c), scheduler=c.scheduler, kv_splits=c.kv_splits, pack_gqa=c.pack_gqa,
                  tile_counter=tile_counter(c, p), tail_split=c.tail_split)


def tile_order(batch: int, heads: int, kv_heads: int, seqlen_q: int, seqlen_k: int, head_dim: int, rows: int,
               causal: bool) -> list[tuple[int, int, int]]:
    """(query block, head, batch) of every tile in the lpt/persistent order: the CPU twin of flash_fwd.cu's
    tile_order/tile_at. Sections of `group` (batch, head) pairs whose K and V fit in L2_SECTION_BYTES (a whole
    number of GQA groups); causal: each run query block by query block with its heads side by side, last block
    first; non-causal: head by head, the query blocks of one head consecutive (the grid order)."""
    num_m = -(-seqlen_q // rows)
    pairs = batch * heads
    group = _sections(batch, heads, kv_heads, seqlen_k, head_dim)
    out = []
    for t in range(num_m * pairs):
        section, r = divmod(t, group * num_m)
        first = section * group
        if causal:
            mb, k = divmod(r, min(group, pairs - first))
        else:
            k, mb = divmod(r, num_m)
        b, h = divmod(first + k, heads)
        out.append((num_m - 1 - mb if causal else mb, h, b))
    return out


def _sections(batch: int, heads: int, kv_heads: int, seqlen_k: int, head_dim: int) -> int:
    """(batch, head) pairs per L2 section: whole GQA groups whose K and V fit in L2_SECTION_BYTES."""
    kv_fit = L2_SECTION_BYTES // (2 * seqlen_k * head_dim * ELEM_BYTES)
    return min(max(1, kv_fit) * (heads // kv_heads), batch * heads)


def persistent_units(cta: int, ctas: int, units: int) -> list[int]:
    """The work units persistent CTA `cta` of `ctas` takes, in order (flash_fwd.cu: Cursor::next): in round k the
    unit k·ctas + (cta + k) mod ctas, while it is below `units` (only the last round can run out: the kernel stops
    there). Each round is one contiguous stretch of the order; a CTA's place in it turns by one per round."""
    out = []
    for k in range(-(-units // ctas)):
        u = k * ctas + (cta + k) % ctas
        if u >= units:
            break
        out.append(u)
    return out


def persistent_tiles(cta: int, ctas: int, batch: int, heads: int, kv_heads: int, seqlen_q: int, seqlen_k: int,
                     head_dim: int, rows: int, causal: bool) -> list[tuple[int, int, int]]:
    """(query block, head, batch) of the tiles persistent CTA `cta` of `ctas` runs, in order (flash_fwd.cu:
    for_each_tile): the tiles of tile_order at the indices persistent_units gives it. Non-causal only: causal CTAs
    take their tiles from a counter (tile_counter; counter_schedule models who gets which)."""
    if causal:
        raise ValueError("causal: persistent causal CTAs take their tiles from a counter, in the order tile_order "
                         "gives, as they free up (counter_schedule), not from a fixed share")
    order = tile_order(batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim, rows, causal)
    return [order[u] for u in persistent_units(cta, ctas, len(order))]


def counter_schedule(ctas: int, costs: list[float]) -> list[list[int]]:
    """Which tiles (indices into the order) each of `ctas` persistent CTAs runs when they take them from a counter
    (flash_fwd.cu: producer_tiles) and tile i costs costs[i]: CTA c starts with tile c, and each further tile goes
    to the CTA that frees up first (the lowest-numbered on a tie); the kernel's producer claims it a ring's worth
    of key tiles earlier, once the current tile's loads are issued. A model of the kernel's behaviour, for tests and
    for reasoning about balance: on the GPU the order in which CTAs reach the counter is the hardware's."""
    out: list[list[int]] = [[] for _ in range(ctas)]
    free = []
    for c in range(min(ctas, len(costs))):
        out[c].append(c)
        heapq.heappush(free, (costs[c], c))
    for i in range(ctas, len(costs)):
        at, c = heapq.heappop(free)
        out[c].append(i)
        heapq.heappush(free, (at + costs[i], c))
    return out


def register_cap(n_threads: int, min_blocks: int) -> int:
    """ptxas' per-thread cap under __launch_bounds__(threads, min_blocks): 65536 / (threads·blocks), ≤ 255."""
    return min(255, (65536 // (n_threads * min_blocks)) // 8 * 8)


def consumer_registers(consumer_wgs: int) -> int:
    """setmaxnreg.inc target: what is left of the register file after the producer's 24, split evenly."""
    return min(MAX_CONSUMER_REGS, (65536 - 128 * PRODUCER_REGS) // (128 * consumer_wgs) // 8 * 8)


def accumulator_registers(c: Config, p: Problem) -> int:
    """Registers per consumer thread live across a tile: S and O in f32, P as packed 16-bit pairs, + overhead."""
    overhead = REG_OVERHEAD[c.overlap]
    if c.overlap and c.scheduler == "persistent" and (
            c.o_rescale == "before" or (p.head_dim == 256 and (p.causal or c.softmax_reduce == "tree"
                                                               or c.exp2_fma != "none"))):
        overhead = REG_OVERHEAD_PERSISTENT_TIGHT
    return c.bc // 2 + p.head_dim // 2 + c.bc // 4 + overhead


def accumulator_registers_tail(c: Config, p: Problem) -> int:
    """accumulator_registers with tail_split's margin: its second copy of the tile loop spills the persistent
    overlapped d256 loop at 32 (traits.cuh kAccumulatorRegsTail)."""
    if c.tail_split and c.overlap and c.scheduler == "persistent" and p.head_dim == 256:
        return c.bc // 2 + p.head_dim // 2 + c.bc // 4 + REG_OVERHEAD_PERSISTENT_TIGHT
    return accumulator_registers(c, p)


@rule("head_dim_chunks", "head_dim must be a multiple of 64 (TMA boxes one 128-byte swizzle span wide)")
def head_dim_chunks(c, p, a, lay):
    if p.head_dim % SWIZZLE_COLS:
        return f"head_dim={p.head_dim} is not a multiple of {SWIZZLE_COLS}"


@rule("bc_multiple_of_16", "Bc must be a multiple of 16 in [16, 256] (k16 steps of P·V, wgmma N, TMA box)")
def bc_multiple_of_16(c, p, a, lay):
    if c.bc % 16 or not 16 <= c.bc <= 256:
        return f"bc={c.bc} is not a multiple of 16 in [16, 256]"


@rule("pingpong_needs_two_consumers", "ping-pong alternates exactly two consumer warpgroups")
def pingpong_needs_two_consumers(c, p, a, lay):
    if c.pingpong and c.consumer_wgs != 2:
        return f"pingpong needs consumer_wgs=2, got {c.consumer_wgs}"


@rule("pingpong_needs_overlap", "a ping-pong turn is the S(n) + P(n-1)·V(n-1) issue of the overlapped loop")
def pingpong_needs_overlap(c, p, a, lay):
    if c.pingpong and not c.overlap:
        return "pingpong needs overlap=True"


@rule("rescale_before_needs_overlap", "o_rescale=before reorders the overlapped loop's S(n) + P(n-1)·V(n-1) issue")
def rescale_before_needs_overlap(c, p, a, lay):
    if c.o_rescale == "before" and not c.overlap:
        return "o_rescale=before needs overlap=True"


@rule("fused_overlap_needs_split_release", "o_rescale=fused orders the P·V wait behind the K slot's own release "
      "(overlapped loop with 2 stages)")
def fused_overlap_needs_split_release(c, p, a, lay):
    # ptxas hoists a wait that reads nothing computed in its block to the block's top; in the fused softmax the K
    # slot's release (split from V's only with two stages, traits kKVReleaseSplit) is what keeps the P·V wait behind
    # the first row's exponentials (flash_fwd.cu softmax_fused_tile)
    if c.o_rescale == "fused" and c.overlap and c.stages != 2:
        return f"o_rescale=fused with overlap=True needs stages=2, got {c.stages}"


@rule("setmaxnreg_needs_two_consumers", "with one consumer warpgroup every thread already gets 255 registers")
def setmaxnreg_needs_two_consumers(c, p, a, lay):
    if c.setmaxnreg and c.consumer_wgs < 2:
        return f"setmaxnreg needs consumer_wgs >= 2, got {c.consumer_wgs}"


@rule("setmaxnreg_one_block", "register reallocation needs __launch_bounds__(threads, 1)")
def setmaxnreg_one_block(c, p, a, lay):
    if c.setmaxnreg and c.min_blocks != 1:
        return f"setmaxnreg needs min_blocks=1, got {c.min_blocks}"


@rule("accumulators_fit_registers", "S + O + P (+ overhead) per consumer thread must fit its register budget")
def accumulators_fit_registers(c, p, a, lay):
    budget = consumer_registers(c.consumer_wgs) if c.setmaxnreg else register_cap(lay.threads, c.min_blocks)
    need = accumulator_registers(c, p)
    if need > budget:
        return f"{need} accumulator registers per consumer thread > budget {budget} (certain spill)"


@rule("kv_splits_range", "1 to 32 key splits (the combine kernel gives each split one lane of a warp)")
def kv_splits_range(c, p, a, lay):
    if not 1 <= c.kv_splits <= 32:
        return f"kv_splits={c.kv_splits} is not in [1, 32]"


@rule("split_pack_need_grid", "kv_splits > 1 and pack_gqa index tiles by the grid (blockIdx.y, blockIdx.z)")
def split_pack_need_grid(c, p, a, lay):
    if (c.kv_splits > 1 or c.pack_gqa) and c.scheduler != "grid":
        return f"kv_splits={c.kv_splits}, pack_gqa={int(c.pack_gqa)} need scheduler=grid, got {c.scheduler}"


@rule("kv_splits_store_direct", "split partials are fp32, written from the accumulators (o_store=direct)")
def kv_splits_store_direct(c, p, a, lay):
    if c.kv_splits > 1 and c.o_store != "direct":
        return f"kv_splits={c.kv_splits} needs o_store=direct, got {c.o_store}"


@rule("tail_split_needs_equal_rounds", "tail_split cuts the last of the persistent scheduler's fixed rounds of "
      "equal tiles (not causal, whose CTAs take tiles from a counter, nor seqused_k)")
def tail_split_needs_equal_rounds(c, p, a, lay):
    if c.tail_split and (c.scheduler != "persistent" or p.causal or p.seqused_k):
        return (f"tail_split needs scheduler=persistent on a non-causal problem without seqused_k, got "
                f"scheduler={c.scheduler}, causal={int(p.causal)}, seqused_k={int(p.seqused_k)}")


@rule("tail_split_fits_registers", "S + O + P (+ overhead) per consumer thread must fit its register budget with "
      "tail_split's second tile loop")
def tail_split_fits_registers(c, p, a, lay):
    if not c.tail_split:
        return None
    budget = consumer_registers(c.consumer_wgs) if c.setmaxnreg else register_cap(lay.threads, c.min_blocks)
    need = accumulator_registers_tail(c, p)
    if need > budget:
        return f"{need} accumulator registers per consumer thread with tail_split > budget {budget} (certain spill)"


RULES = (head_dim_chunks, bc_multiple_of_16, pingpong_needs_two_consumers, pingpong_needs_overlap,
         rescale_before_needs_overlap, fused_overlap_needs_split_release, kv_splits_range, split_pack_need_grid,
         kv_splits_store_direct, tail_split_needs_equal_rounds, setmaxnreg_needs_two_consumers, setmaxnreg_one_block,
         threads_per_block, threads_per_sm, static_smem_limit, smem_optin_limit, min_blocks_smem,
         accumulators_fit_registers, tail_split_fits_registers)


def default(p: Problem, a: Arch) -> Config:
    """The fastest config of a first H200 sweep (benchmarks/h200_sweep.py, 2026-11-29, ~12 sampled wgmma configs
    per shape; docs/benchmarks.md): 2 consumer warpgroups ping-ponging with intra-warpgroup overlap for d128,
    3 warpgroups without ping-pong for d64. FlashAttention-3's own picks (Bc 176 for d128) measured slower here.
    d256 keeps FA3's Bc 80 with two stages, intra-warpgroup overlap without ping-pong and O staged in smem: 711
    TFLOPS on B2 H8 N4096 d256 bf16 once K is released as soon as S has read it (benchmarks/wgmma_levers_ab.sh,
    2026-12-01; the non-overlapped loop, the previous default, 631; FlashAttention-4 717)."""
    if p.head_dim == 64:
        return Config.make("wgmma", consumer_wgs=3, bc=112, stages=4, setmaxnreg=True, overlap=True,
                           pingpong=False, o_store="smem", min_blocks=1)
    if p.head_dim == 256:
        return Config.make("wgmma", consumer_wgs=2, bc=80, stages=2, setmaxnreg=True, overlap=True,
                           pingpong=False, o_store="smem", min_blocks=1)
    if p.causal:
        return Config.make("wgmma", consumer_wgs=2, bc=96, stages=3, setmaxnreg=False, overlap=True,
                           pingpong=True, o_store="direct", min_blocks=1)
    return Config.make("wgmma", consumer_wgs=2, bc=128, stages=3, setmaxnreg=True, overlap=True,
                       pingpong=True, o_store="smem", min_blocks=1)


DECODE_BC = 128


def decode_default(shape: Shape, arch: Arch) -> Config | None:
    """The untuned default for decode (Shape.is_decode: seqlen_q <= DECODE_MAX_QUERIES): a pure function of the shape and the
    arch's SM count. Memory-bound, so the aim is to read K/V once and keep every SM streaming: one consumer
    warpgroup with a three-deep ring of 128-key tiles; the query heads of a GQA group packed into one tile (the K/V
    tile is read once for all of them); and the key range split so that the CTAs fill whole waves of the SMs best
    (the fewest splits whose waves are GOOD_FILL full, each split keeping MIN_TILES_PER_SPLIT key tiles). None for prefill."""
    if not shape.is_decode:
        return None
    group = shape.heads // shape.kv_heads
    pack = 1 < group <= PACK_TILE_ROWS
    c = Config.make("wgmma", consumer_wgs=1, bc=DECODE_BC, stages=3, setmaxnreg=False, overlap=True,
                    pingpong=False, o_store="direct", min_blocks=1, scheduler="grid", o_rescale="after",
                    kv_splits=1, pack_gqa=pack)
    lay = layout(c, shape.problem)
    per_sm = max(1, SMEM_PER_SM_SM90 // (lay.smem_dynamic + 1024))
    slots = arch.sms * per_sm
    gx, gy, gz = lay.grid(shape.batch, shape.heads, shape.seqlen_q, kv_heads=shape.kv_heads)
    n_tiles = -(-shape.seqlen_k // DECODE_BC)
    return c.replace(kv_splits=splits_for(gx * gy * gz, slots, n_tiles, KV_SPLITS))


# The decode axes come last, and only these rules read them (the layout, and so every resource rule, does not):
# valid_wgmma_configs checks the other rules once per combination of the other axes, then expands.
DECODE_AXES = ("tail_split", "kv_splits", "pack_gqa")  # tail_split is prefill's, but read by its rule alone too
DECODE_RULES = (kv_splits_range, split_pack_need_grid, kv_splits_store_direct, tail_split_needs_equal_rounds,
                tail_split_fits_registers)


def valid_wgmma_configs(p: Problem, a: Arch) -> list[Config]:
    """space.valid_configs for this family, in the same order, without checking the whole cross product (the
    decode axes multiply it by 20): tests/test_wgmma_compile.py compares it with the brute force on a sample."""
    return valid_expanded("wgmma", p, a)


FAMILY = register_family(Family(
    name="wgmma", source="sm90/flash_fwd.cu", entry="flash_fwd_wgmma",
    axes=AXES, rules=RULES, layout=layout, default=default, shape_default=decode_default,
    valid=valid_wgmma_configs, decode_axes=DECODE_AXES, decode_rules=DECODE_RULES,
))
