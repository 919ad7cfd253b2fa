"""The SM80-style family (mma.sync m16n8k16, ldmatrix, cp.async): kernels/sm80/.

Every formula here has a twin in kernels/sm80/traits.cuh; the rule names are the prefixes of its static_assert
messages, and tests/test_space_vs_compiler.py compiles a sample to check that both sides agree.
"""
from __future__ import annotations

from .arch import Arch
from .config import Axis, Config, Family, Layout, register_family
from .problem import Problem, Shape
from .resource_rules import (min_blocks_smem, rule, smem_optin_limit, static_smem_limit, threads_per_block,
                             threads_per_sm)
from .split_kv import splits_for, valid_expanded

ELEM_BYTES = 2   # fp16 / bf16
SMEM_PAD = 8     # elements of padding per shared-memory row: rows shift by 16 B, so ldmatrix hits all banks

KV_SLOTS = {"shared": 1, "separate": 2, "double": 4}
# Split counts: the powers of two up to the combine's 32 (traits.cuh, kv_splits_range). Decode grids here are
# batch × heads CTAs (no packed heads), mostly a power of two, so these fill the SMs' waves about as well as the
# wgmma family's finer list (1-32 with 3, 6, 12, 24) while keeping the cross product at 6× the prefill space's, not
# 10×: enumerating and checking the space stays fast (valid_mma_sync_configs, `autotune space`).
KV_SPLITS = (1, 2, 4, 8, 16, 32)

AXES = (
    Axis("br", (64, 128, 256), "AT_BR", "query rows per CTA"),
    Axis("bc", (32, 64, 128), "AT_BC", "key columns per K/V tile"),
    Axis("warps_m", (1, 2, 4, 8), "AT_WARPS_M", "compute warps along the query rows"),
    Axis("warps_n", (1, 2, 4), "AT_WARPS_N",
         "compute warps along the key columns of S (and along head_dim of O when P goes through smem)"),
    Axis("p_path", ("regs", "smem"), "AT_P_IN_REGS",
         "P reused from registers as the A operand of P·V, or written to shared memory", lambda v: v == "regs"),
    Axis("smem_mode", ("static", "dynamic", "hybrid"), "AT_SMEM_MODE",
         "static __shared__ (≤ 48 KB), extern dynamic (opt-in), or Q/O static + K/V/P dynamic",
         lambda v: ("static", "dynamic", "hybrid").index(v)),
    Axis("kv_buffering", ("shared", "separate", "double"), "AT_KV_SLOTS",
         "one buffer for K then V, separate K and V buffers, or separate and double-buffered",
         lambda v: KV_SLOTS[v]),
    Axis("loader_warps", (0, 1, 2), "AT_LOADER_WARPS", "extra warps that only issue cp.async for K/V"),
    Axis("min_blocks", (1, 2, 3, 4), "AT_MIN_BLOCKS", "__launch_bounds__ minimum resident CTAs per SM"),
    Axis("q_in_regs", (True, False), "AT_Q_IN_REGS", "Q fragments held in registers across the K/V loop"),
    Axis("softmax_reduce", ("chain", "tree"), "AT_SOFTMAX_TREE",
         "a tile's row max and row sum as one dependent chain (fewer live registers) or a pairwise tree (more ILP)",
         lambda v: v == "tree", default="chain"),
    Axis("o_rescale", ("every_tile", "on_growth"), "AT_RESCALE_ON_GROWTH",
         "O and the row sums rescaled at every K/V tile, or only when a row max of the warp outgrows the kept one by "
         "more than 2^8 (FlashAttention-4's conditional rescaling; exact)", lambda v: v == "on_growth",
         default="every_tile"),
    Axis("kv_splits", KV_SPLITS, "AT_KV_SPLITS",
         "CTAs one block's key range is cut into (grid.z = batch × splits); each writes fp32 partials that a small "
         "combine kernel merges by their logsumexp: fills the SMs when batch × heads × query blocks is small "
         "(decode against a long cache)", default=1),
)


def smem_regions(c: Config, p: Problem) -> dict[str, int]:
    d = p.head_dim
    return {
        "q": c.br * (d + SMEM_PAD) * ELEM_BYTES,
        "kv": KV_SLOTS[c.kv_buffering] * c.bc * (d + SMEM_PAD) * ELEM_BYTES,
        "p": c.br * (c.bc + SMEM_PAD) * ELEM_BYTES if c.p_path == "smem" else 0,
        # per-warp-column partial row max and row sum, exchanged when a row spans several warps
        "stats": 2 * c.warps_n * c.br * 4 if c.warps_n > 1 else 0,
    }


def layout(c: Config, p: Problem) -> Layout:
    r = smem_regions(c, p)
    total = sum(r.values())
    if c.smem_mode == "static":
        static, dynamic = total, 0
    elif c.smem_mode == "dynamic":
        static, dynamic = 0, total
    else:  # hybrid: Q (and the O staging that reuses it) static, the rest dynamic
        static, dynamic = r["q"], total - r["q"]
    threads = (c.warps_m * c.warps_n + c.loader_warps) * 32
    return Layout(threads=threads, smem_static=static, smem_dynamic=dynamic, rows_per_block=c.br,
                  kv_splits=c.kv_splits)


@rule("rows_per_warp", "BR / WARPS_M must be a multiple of 16 (the mma M dimension)")
def rows_per_warp(c, p, a, lay):
    if c.br % (c.warps_m * 16):
        return f"br={c.br} is not a multiple of 16·warps_m={16 * c.warps_m}"


@rule("cols_per_warp", "BC / WARPS_N must be a multiple of 16 (two n8 tiles per ldmatrix.x4, k16 of P·V)")
def cols_per_warp(c, p, a, lay):
    if c.bc % (c.warps_n * 16):
        return f"bc={c.bc} is not a multiple of 16·warps_n={16 * c.warps_n}"


@rule("p_regs_one_warp_per_row", "P kept in registers needs one warp per row strip (WARPS_N == 1)")
def p_regs_one_warp_per_row(c, p, a, lay):
    if c.p_path == "regs" and c.warps_n != 1:
        return f"p_path=regs needs warps_n=1, got warps_n={c.warps_n}"


@rule("out_cols_per_warp", "HEAD_DIM / WARPS_N must be a multiple of 16 (O columns per warp)")
def out_cols_per_warp(c, p, a, lay):
    if p.head_dim % (c.warps_n * 16):
        return f"head_dim={p.head_dim} is not a multiple of 16·warps_n={16 * c.warps_n}"


def accumulator_registers(c: Config, p: Problem) -> int:
    """32-bit registers per thread that must stay live across the K/V loop: O and S accumulators (+ Q)."""
    rows_w = c.br // c.warps_m
    o = (rows_w // 16) * (p.head_dim // c.warps_n // 8) * 4
    s = (rows_w // 16) * (c.bc // c.warps_n // 8) * 4
    q = (rows_w // 16) * (p.head_dim // 16) * 4 if c.q_in_regs else 0
    return o + s + q


def register_cap(threads: int, min_blocks: int) -> int:
    """ptxas' per-thread cap under __launch_bounds__(threads, min_blocks): 65536 / (threads·blocks), ≤ 255."""
    return min(255, (65536 // (threads * min_blocks)) // 8 * 8)


@rule("accumulators_fit_registers", "O + S (+ Q) accumulators per thread must fit the launch-bounds register cap")
def accumulators_fit_registers(c, p, a, lay):
    if c.br % (c.warps_m * 16) or c.bc % (c.warps_n * 16) or p.head_dim % (c.warps_n * 16):
        return None  # the shape rules above already reject it
    need = accumulator_registers(c, p)
    cap = register_cap(lay.threads, c.min_blocks)
    if need > cap:
        return f"{need} accumulator registers per thread > cap {cap} (certain spill)"


@rule("kv_splits_range", "1 to 32 key splits (the combine kernel gives each split one lane of a warp)")
def kv_splits_range(c, p, a, lay):
    if not 1 <= c.kv_splits <= 32:
        return f"kv_splits={c.kv_splits} is not in [1, 32]"


RULES = (rows_per_warp, cols_per_warp, p_regs_one_warp_per_row, out_cols_per_warp, kv_splits_range,
         threads_per_block, threads_per_sm, static_smem_limit, smem_optin_limit, min_blocks_smem,
         accumulators_fit_registers)


# An SM with about 100 KB of shared memory (sm_86, sm_89, sm_120) rather than 164-228 KB. FlashAttention-2 keys its
# d128 tiles on sm8x (cc 8.6/8.9) for exactly this reason (two 48 KB CTAs per SM); sm_120 has the same 100 KB.
SMALL_SMEM_PER_SM = 128 * 1024


def default(p: Problem, a: Arch) -> Config:
    """The heuristic default: FlashAttention-2's tile for the arch, with Bc halved where its tile spills here.

    FlashAttention-2's picks (csrc/flash_attn/src/flash_fwd_launch_template.h, run_mha_fwd_hdim{64,128,256};
    4 warps that own whole rows, Q in shared memory, separate K and V tiles, no __launch_bounds__ minimum):
      d64   128×128 (its dropout path: 128×64);
      d128  128×64, or on ~100 KB-smem SMs 128×32 (non-causal: "2 CTAs per SM") and 64×64 (causal: "square");
      d256  128×64 with 8 warps where a block may have ≥ 128 KB and an SM has < 192 KB (the A100), else 64×64.
    In this kernel FlashAttention-2's d64 128×128 tile spills, so d64 takes Bc/2: 128×64. Its d128 128×64 tile
    spilled too until the K/V loop stopped holding its sources and indices in registers (2026-12-05): it now builds
    at 255 registers with no spill on sm_80/90/100/103 with o_rescale=on_growth (rescaling every tile still spills
    32-52 B), and measured 1.02-1.08× SDPA flash on the four N4096 rows of an H100, 5-6 % ahead of 128×32
    (docs/benchmarks.md, 2026-12-05), so d128 takes it there. The ~100 KB parts keep FlashAttention-2's 128×32 /
    64×64. The decode default (below) keeps every_tile.
    Q stays in shared memory as in FlashAttention-2 (Q in registers makes d64 128×64 spill on sm_90). Every other
    pick is FlashAttention-2's as it is. tests/test_defaults.py builds every arch × problem and fails on a spill.
    """
    small_smem = a.smem_per_sm < SMALL_SMEM_PER_SM
    warps_m = 4
    o_rescale = "every_tile"
    if p.head_dim == 64:
        br, bc = 128, 64
    elif p.head_dim == 128:
        if small_smem:
            br, bc = (64, 64) if p.causal else (128, 32)
        else:  # 128×64 builds at 255 registers rescaling on growth, spills 32-52 B rescaling every tile
            br, bc, o_rescale = 128, 64, "on_growth"
    elif a.smem_optin_per_block >= 128 * 1024 and a.smem_per_sm < 192 * 1024:
        br, bc, warps_m = 128, 64, 8
    else:
        br, bc = 64, 64
    return Config.make(
        "mma_sync", br=br, bc=bc, warps_m=warps_m, warps_n=1, p_path="regs", smem_mode="dynamic",
        kv_buffering="separate", loader_warps=0, min_blocks=1, q_in_regs=False, softmax_reduce="chain",
        o_rescale=o_rescale, kv_splits=1,
    )


# Decode tiles: 64 query rows (the family's smallest Br; a decode step has at most 16 queries per head, so every
# row beyond them is work thrown away) by 64 keys, 4 warps owning whole rows, P in registers. It is the d256 default
# of every arch but sm_80, and the d128 causal default of the ~100 KB parts, all of them without spills
# (docs/arches.md); tests/test_defaults.py builds it with splits on every arch.
DECODE_BR, DECODE_BC = 64, 64


def resident_ctas_per_sm(c: Config, p: Problem, a: Arch) -> int:
    """CTAs of `c` an SM of `a` is sure to hold, before any compile: shared memory and threads, and registers at
    the most ptxas may give a thread (the compiled kernel can only do better)."""
    lay = layout(c, p)
    by_smem = a.smem_per_sm // (lay.smem_total + a.smem_reserved_per_block)
    by_threads = a.max_threads_per_sm // lay.threads
    # ptxas allocates registers in units of 8 per thread and never past the launch bounds' cap (255 → 256)
    regs = -(-register_cap(lay.threads, c.min_blocks) // 8) * 8
    by_regs = a.registers_per_sm // (lay.threads * regs)
    return max(1, min(by_smem, by_threads, by_regs))


def decode_default(shape: Shape, arch: Arch) -> Config | None:
    """The untuned default for decode (Shape.is_decode) on the archs that run this family: a pure function of the
    shape and the arch's SM count (Arch.sms). The DECODE_BR × DECODE_BC tile with 4 warps, and the key range split
    so that batch × heads × query blocks × splits CTAs fill whole waves of the SMs (the CTAs every SM is sure to
    hold, resident_ctas_per_sm), each split keeping split_kv.MIN_TILES_PER_SPLIT key tiles: split_kv.splits_for, the
    wgmma family's choice too. None for prefill."""
    if not shape.is_decode:
        return None
    p = shape.problem
    # every_tile: the prefill default's on_growth (d128) is there for a 128×64 tile's registers, not a decode tile's
    c = default(p, arch).replace(br=DECODE_BR, bc=DECODE_BC, warps_m=4, warps_n=1, kv_splits=1,
                                 o_rescale="every_tile")
    slots = arch.sms * resident_ctas_per_sm(c, p, arch)
    gx, gy, gz = layout(c, p).grid(shape.batch, shape.heads, shape.seqlen_q)
    n_tiles = -(-shape.seqlen_k // DECODE_BC)
    return c.replace(kv_splits=splits_for(gx * gy * gz, slots, n_tiles, KV_SPLITS))


# The decode axis comes last, and only its rule reads it (the layout's resources do not depend on it):
# valid_mma_sync_configs checks the other rules once per combination of the other axes, then expands.
DECODE_AXES = ("kv_splits",)
DECODE_RULES = (kv_splits_range,)


def valid_mma_sync_configs(p: Problem, a: Arch) -> list[Config]:
    """space.valid_configs for this family, in the same order, without checking the whole cross product (kv_splits
    multiplies it by 6): tests/test_space_vs_compiler.py compares it with the brute force on a sample."""
    return valid_expanded("mma_sync", p, a)


FAMILY = register_family(Family(
    name="mma_sync", source="sm80/flash_fwd.cu", entry="flash_fwd_mma_sync",
    axes=AXES, rules=RULES, layout=layout, default=default, shape_default=decode_default,
    valid=valid_mma_sync_configs, decode_axes=DECODE_AXES, decode_rules=DECODE_RULES,
))
