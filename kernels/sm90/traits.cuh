// The only place that interprets the wgmma family's macros. Every figure here has a twin in space/wgmma.py, and
// every static_assert message starts with the name of the space/ rule that prunes the same configurations.
#pragma once

#if !defined(AT_HEAD_DIM) || !defined(AT_DTYPE_BF16) || !defined(AT_CAUSAL) || !defined(AT_CONSUMER_WGS) ||     \
    !defined(AT_BC) || !defined(AT_STAGES) || !defined(AT_SETMAXNREG) || !defined(AT_OVERLAP) ||                 \
    !defined(AT_PINGPONG) || !defined(AT_O_STORE_SMEM) || !defined(AT_MIN_BLOCKS) || !defined(AT_SCHEDULER) ||  \
    !defined(AT_O_RESCALE) || !defined(AT_EXPECT_THREADS) || !defined(AT_EXPECT_SMEM_STATIC) || !defined(AT_EXPECT_SMEM_DYNAMIC)
#error "wgmma family: build through space.defines(config, problem); a macro is missing"
#endif

#if !defined(AT_KV_SPLITS) || !defined(AT_PACK_GQA) || !defined(AT_SOFTMAX_TREE) || !defined(AT_EXP2_FMA_EVERY) ||     \
    !defined(AT_TAIL_SPLIT)
#error "wgmma family: build through space.defines(config, problem); a decode or late axis macro is missing"
#endif

// Optional (absent from every build but space.Problem(seqused_k=True)'s): a per-batch-row used key length read from
// FlashFwdParams.seqused_k on the device (kernels/common/seqused.cuh).
#ifndef AT_SEQUSED_K
#define AT_SEQUSED_K 0
#endif

namespace sm90 {

// ---- problem ----------------------------------------------------------------------------------------------------
constexpr int kHeadDim = AT_HEAD_DIM;
constexpr bool kBf16 = AT_DTYPE_BF16 != 0;
constexpr bool kCausal = AT_CAUSAL != 0;
constexpr bool kSeqUsedK = AT_SEQUSED_K != 0;

// ---- axes -------------------------------------------------------------------------------------------------------
constexpr int kConsumerWGs = AT_CONSUMER_WGS;  // warpgroups running wgmma; each owns 64 query rows
constexpr int kBc = AT_BC;                     // key columns per K/V tile (the N of S = Q·Kᵀ, the K of P·V)
constexpr int kStages = AT_STAGES;             // K/V slots in the shared-memory ring
constexpr bool kSetMaxNReg = AT_SETMAXNREG != 0;
constexpr bool kOverlap = AT_OVERLAP != 0;     // issue S(n) together with P(n-1)·V(n-1); softmax(n) runs under P·V
constexpr bool kPingPong = AT_PINGPONG != 0;   // two consumer warpgroups take turns on the tensor cores
constexpr bool kOStoreSmem = AT_O_STORE_SMEM != 0;  // stage O in shared memory for 16-byte row stores
constexpr int kMinBlocks = AT_MIN_BLOCKS;
// When O shrinks by a tile's max correction (AT_O_RESCALE): 0 after P(n-1)·V(n-1) completes, skipped when no row's
// max grew; 1 (overlapped loop only) right after S(n) is issued, before P(n-1)·V(n-1) (FA3's RescaleOBeforeGemm,
// its choice for head_dim > 128); 2 after P·V completes too, but unconditionally and in the same straight-line
// code as the tile's exponentials and P's conversion (FlashAttention-4's order): ptxas then issues the FMULs and
// F2FPs in the slots between the MUFU.EX2s, which issue one per 8 cycles, instead of after them.
constexpr int kORescale = AT_O_RESCALE;
constexpr bool kRescaleBefore = kORescale == 1;
constexpr bool kRescaleFused = kORescale == 2;
// A tile's row max and row sum: one dependent chain per row, row after row (0), or four independent partials per row
// with both rows side by side (1: shorter dependency chains; flash_fwd.cu softmax_tile_tree).
constexpr bool kSoftmaxTree = AT_SOFTMAX_TREE != 0;
// Unmasked tiles: every kExp2FmaEvery-th exponential of a thread's P on the FMA pipe (ptx.cuh exp2_fma) instead of
// MUFU.EX2 (0: none). MUFU issues one warp instruction per 8 cycles per SM sub-partition, the bound of a warp's
// exponentials; the polynomial's ~8 FMA-pipe instructions issue one per cycle beside them.
constexpr int kExp2FmaEvery = AT_EXP2_FMA_EVERY;
// Which tile (query block, head, batch) a CTA works on: 0 grid (one CTA per tile, blockIdx = (query block, head,
// batch), causal query blocks reversed), 1 lpt (one CTA per tile on a 1-D grid, in L2-sized head sections, longest
// first when causal), 2 persistent (each CTA strides through the lpt order; the producer prefetches the next tile's
// K/V and Q under the current tile's epilogue).
constexpr int kScheduler = AT_SCHEDULER;
constexpr bool kSchedLpt = kScheduler == 1;
constexpr bool kPersistent = kScheduler == 2;
// Split-KV: the key range of one (query block, head, batch) is cut into kSplits parts, one CTA each (grid.z =
// batch × kSplits); each writes fp32 partials and flash_fwd_combine merges them with their logsumexp weights. Puts
// enough CTAs on the SMs when batch × heads × query blocks is small (decode against a long cache).
constexpr int kSplits = AT_KV_SPLITS;
constexpr bool kSplit = kSplits > 1;
// Tail split (persistent, non-causal): equal tiles in fixed rounds of gridDim.x leave the last round part-empty (d128
// N4096: 2048 tiles on 132 CTAs = 15.52 rounds, 3 % of the kernel idle; a DiT's 864: 6.5 %). With it the full rounds
// run as before and the last round's tiles are cut along the keys into about equal pieces, one or two per CTA, over
// all the CTAs (stream-K's tail); each piece writes fp32 partials that flash_fwd_tail_combine merges by their
// logsumexp. The loader decides the cut (space/wgmma.py: tail_plan); tail_plan.h: its shares, pieces and slots.
constexpr bool kTailSplit = AT_TAIL_SPLIT != 0;
// Packed GQA: the heads/kv_heads query heads that share one K/V head are the rows of one tile (local row r is query
// row r / G of head r % G, G = heads / kv_heads), grid.y runs over K/V heads: a decode step reads each K/V tile once
// per K/V head instead of once per query head, and wgmma's 64 rows are filled by heads. Q is then loaded by the
// consumers (a row's heads are not one TMA box dimension), not by TMA.
constexpr bool kPackGqa = AT_PACK_GQA != 0;

// ---- derived ----------------------------------------------------------------------------------------------------
constexpr int kRowsPerWG = 64;                 // the M of wgmma
constexpr int kBr = kRowsPerWG * kConsumerWGs;
constexpr int kThreads = 128 * (1 + kConsumerWGs);  // warpgroup 0 is the TMA producer
constexpr int kElemBytes = 2;
constexpr int kSwizzleCols = 64;               // 128-byte swizzle span in 16-bit elements: one TMA box width
constexpr int kDChunks = kHeadDim / kSwizzleCols;
constexpr int kChunkRowBytes = kSwizzleCols * kElemBytes;  // 128

// Shared memory, all dynamic: [alignment slack][Q: wg × chunk × 64 rows][K: stage × chunk × Bc rows][V: same]
// [mbarriers: Q full, then K full, V full, K empty and V empty per stage, then Q empty if persistent]. Swizzled TMA boxes
// and wgmma descriptors assume 1024-byte-aligned atoms, and the dynamic base is only promised 16-byte alignment,
// hence the slack. Nothing is static (ptxas rounds static sizes, which would blur the contract with space/).
constexpr int kSmemAlign = 1024;
constexpr int kQWGBytes = kRowsPerWG * kHeadDim * kElemBytes;
constexpr int kQBytes = kBr * kHeadDim * kElemBytes;  // one Q slot
constexpr int kKVChunkBytes = kBc * kChunkRowBytes;
constexpr int kKVTileBytes = kBc * kHeadDim * kElemBytes;
// Q slots: persistent CTAs get a second one whenever it fits (the opt-in limit, and MIN_BLOCKS CTAs per SM), so the
// producer loads the next tile's Q while the current tile runs instead of after its last P·V, when the consumers give
// the one slot back (that wait sat at every tile's start: short sequences lost ~10 % of their warp samples to it).
// Not an axis: one more slot only ever moves a load earlier. space/wgmma.py: q_buffers.
// Causal persistent CTAs take tiles from a counter (p.tile_counter) instead of walking a fixed sequence: tiles of a
// causal order differ in length, and a fixed share of them leaves CTAs idle at the end (the block pairs this
// replaced cost alike, but 1024 of them on 132 CTAs are 7.76 rounds, and the last leaves a quarter of the SMs idle:
// 3 % of the kernel; taken in order as CTAs free up, the longest first, the tail is about one short tile: H100, ncu,
// B4 H16 N4096 d128 causal 438 -> 422 us, Llama-3-8B prefill 784 -> 764 us). The producer hands each tile's index to
// the consumers in a word beside its Q slot (kTileWordBytes per slot, after the barriers). space/wgmma.py:
// tile_counter.
constexpr bool kTileCounter = kPersistent && kCausal;
constexpr int kTileWordBytes = kTileCounter ? 8 : 0;
constexpr int kSmemTwoQ =
    kSmemAlign + 2 * kQBytes + 2 * kStages * kKVTileBytes + 8 * (2 + 4 * kStages + 2) + 2 * kTileWordBytes;
// K/V release: K and V of a ring slot go back separately (K once S = Q·Kᵀ has read it) only in the overlapped loop
// with two stages, where one release after P·V would put K(n+1)'s whole load on every iteration (docs/benchmarks.md:
// +26-61 % there); elsewhere the joint release after P·V leaves a whole iteration of slack, and the split one measured
// 1-4 % slower on the shipped 3-stage configs. Derived, not an axis: both ends are measured.
constexpr bool kKVReleaseSplit = kOverlap && kStages == 2;
constexpr int kQBuffers =
    kPersistent && kSmemTwoQ <= 232448 && (kMinBlocks == 1 || kMinBlocks * (kSmemTwoQ + 1024) <= 233472) ? 2 : 1;
// L2 bytes one section of heads may fill with its K and V. 8 MB, a sixth of the H100's and H200's 50 MB: with 32 the
// causal Llama-3-8B prefill (a section = all 8 K/V heads) read 264 MB from DRAM for 32 MB of K/V and Q, at 8 it read
// 114 (cuDNN: 101), because the section's K/V shares L2 with Q, O and the other half's copies (docs/benchmarks.md).
constexpr long long kL2SectionBytes = 8ll << 20;
// Q full per Q slot; K full, V full, K empty, V empty per stage (K and V of a slot are released separately: K once
// S = Q·Kᵀ has read it); persistent: Q empty per Q slot (the slot, and the O staged in it, is free).
constexpr int kNumBarriers = kQBuffers + 4 * kStages + (kPersistent ? kQBuffers : 0);
constexpr int kSmemDynamic =
    kSmemAlign + kQBuffers * kQBytes + 2 * kStages * kKVTileBytes + 8 * kNumBarriers + kQBuffers * kTileWordBytes;
constexpr int kSmemStatic = 0;

// Register budget: the launch-bounds cap, and what setmaxnreg hands each role.
constexpr int kRegCap = (65536 / (kThreads * kMinBlocks)) / 8 * 8 > 255 ? 255
                                                                       : (65536 / (kThreads * kMinBlocks)) / 8 * 8;
constexpr int kProducerRegs = 24;
constexpr int kConsumerRegsRaw = (65536 - 128 * kProducerRegs) / (128 * kConsumerWGs) / 8 * 8;
constexpr int kConsumerRegs = kConsumerRegsRaw > 240 ? 240 : kConsumerRegsRaw;
// S + O (f32) + P (f16x2) per consumer thread, plus row statistics, indices and addresses; the overlapped loop
// keeps more alive across the asynchronous P·V. Calibrated on ptxas 13.0: 8 / 32 are the smallest margins with
// no spill in the sampled space (e.g. overlapped 3 warpgroups d128 Bc=96 spill at 160 with a margin of 24).
// o_rescale=before carries the correction factors across the loop's back edge; under the persistent scheduler that
// spills at d256 (64 B, causal), hence 72 there: it prunes exactly d256 (any Bc) and d128 with Bc >= 176. The
// persistent overlapped loop at d256 causal spills with o_rescale=after too (4-64 B for Bc 64/80 on ptxas 13.0, before
// and after K/V got separate releases), so the 72 applies there as well; d128 causal at Bc 192 has no spill at 32.
// softmax_reduce=tree's partials spill the persistent overlapped d256 loop too (non-causal, o_rescale=after), and so
// do exp2_fma's polynomial temporaries (Bc 80: 24 B), and tail_split's second copy of the tile loop (the d256
// default: 56 B; its own rule, tail_split_fits_registers, so that the other rules never read the tail axes).
constexpr bool kTightRegs = kOverlap && kPersistent &&
                            (kRescaleBefore || (kHeadDim == 256 && (kCausal || kSoftmaxTree || kExp2FmaEvery > 0)));
constexpr bool kTightRegsTail = kOverlap && kPersistent && kHeadDim == 256 && kTailSplit;
constexpr int kRegOverhead = kTightRegs ? 72 : kOverlap ? 32 : 8;
constexpr int kAccumulatorRegs = kBc / 2 + kHeadDim / 2 + kBc / 4 + kRegOverhead;
constexpr int kAccumulatorRegsTail = kBc / 2 + kHeadDim / 2 + kBc / 4 + (kTightRegsTail ? 72 : kRegOverhead);
constexpr int kConsumerRegBudget = kSetMaxNReg ? kConsumerRegs : kRegCap;

// ---- rules (names as in space/wgmma.py) ----------------------------------------------------------------------------
static_assert(kHeadDim % kSwizzleCols == 0, "head_dim_chunks: head_dim must be a multiple of 64 (128-byte TMA boxes)");
static_assert(kBc % 16 == 0 && kBc >= 16 && kBc <= 256,
              "bc_multiple_of_16: Bc must be a multiple of 16 in [16, 256] (k16 steps of P·V, wgmma N, TMA box)");
static_assert(kConsumerWGs >= 1 && kConsumerWGs <= 3, "consumer_wgs_range: 1 to 3 consumer warpgroups");
static_assert(kStages >= 2, "stages_at_least_two: the overlapped loop holds two K/V slots at once");
static_assert(!kPingPong || kConsumerWGs == 2, "pingpong_needs_two_consumers: ping-pong alternates two warpgroups");
static_assert(!kPingPong || kOverlap,
              "pingpong_needs_overlap: a ping-pong turn is the S(n) + P(n-1)·V(n-1) issue of the overlapped loop");
static_assert(kORescale >= 0 && kORescale <= 2, "o_rescale_known: AT_O_RESCALE is 0 after, 1 before or 2 fused");
static_assert(!kRescaleBefore || kOverlap,
              "rescale_before_needs_overlap: o_rescale=before reorders the overlapped loop's S(n) + P(n-1)·V(n-1) issue");
static_assert(!kRescaleFused || !kOverlap || kKVReleaseSplit,
              "fused_overlap_needs_split_release: o_rescale=fused orders the P·V wait behind the K slot's own release "
              "(overlapped loop with 2 stages)");
static_assert(!kSetMaxNReg || kConsumerWGs >= 2,
              "setmaxnreg_needs_two_consumers: with one consumer warpgroup every thread already gets 255 registers");
static_assert(!kSetMaxNReg || kMinBlocks == 1,
              "setmaxnreg_one_block: register reallocation needs __launch_bounds__(threads, 1)");
static_assert(kScheduler >= 0 && kScheduler <= 2, "scheduler_known: AT_SCHEDULER is 0 grid, 1 lpt or 2 persistent");
static_assert(kSplits >= 1 && kSplits <= 32,
              "kv_splits_range: 1 to 32 key splits (flash_fwd_combine gives each split one lane of a warp)");
static_assert(!(kSplit || kPackGqa) || kScheduler == 0,
              "split_pack_need_grid: kv_splits > 1 and pack_gqa index tiles by the grid (blockIdx.y, blockIdx.z)");
static_assert(!kSplit || !kOStoreSmem,
              "kv_splits_store_direct: split partials are fp32, written from the accumulators (o_store=direct)");
static_assert(!kTailSplit || (kPersistent && !kCausal && !kSeqUsedK),
              "tail_split_needs_equal_rounds: tail_split cuts the last of the persistent scheduler's fixed rounds of "
              "equal tiles (not causal, whose CTAs take tiles from a counter, nor seqused_k)");
static_assert(kThreads <= 1024, "threads_per_block: at most 1024 threads per block");
static_assert(kThreads * kMinBlocks <= 2048, "threads_per_sm: THREADS × MIN_BLOCKS must fit the SM's thread slots");
static_assert(kSmemStatic <= 48 * 1024, "static_smem_limit: static shared memory is limited to 48 KB");
static_assert(kSmemStatic + kSmemDynamic <= 232448,
              "smem_optin_limit: total shared memory must fit the per-block opt-in limit of sm_90");
static_assert(kMinBlocks == 1 || kMinBlocks * (kSmemStatic + kSmemDynamic + 1024) <= 233472,
              "min_blocks_smem: MIN_BLOCKS CTAs must fit the SM's shared memory together");
static_assert(kAccumulatorRegs <= kConsumerRegBudget,
              "accumulators_fit_registers: S + O + P per thread exceed the consumer register budget (certain spill)");
static_assert(!kTailSplit || kAccumulatorRegsTail <= kConsumerRegBudget,
              "tail_split_fits_registers: S + O + P per thread exceed the consumer register budget with the tail's "
              "second tile loop (certain spill)");

// ---- the launch contract ------------------------------------------------------------------------------------------
static_assert(AT_EXPECT_THREADS == kThreads, "layout_threads: space/ and the traits disagree on threads per block");
static_assert(AT_EXPECT_SMEM_STATIC == kSmemStatic, "layout_smem_static: space/ and the traits disagree on static smem");
static_assert(AT_EXPECT_SMEM_DYNAMIC == kSmemDynamic,
              "layout_smem_dynamic: space/ and the traits disagree on dynamic smem");

}  // namespace sm90
