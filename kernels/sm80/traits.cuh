// The only place that interprets the mma_sync family's macros. Every constant the kernel uses is derived here
// from a handful of design choices; every invalid combination fails with a static_assert whose message starts
// with the rule name that space/mma_sync.py uses, so Python's verdict and the compiler's can be compared.
#pragma once

// ---- problem (compile-time part of the shape) -------------------------------------------------------------
#ifndef AT_HEAD_DIM
#define AT_HEAD_DIM 128
#endif
#ifndef AT_DTYPE_BF16
#define AT_DTYPE_BF16 0
#endif
#ifndef AT_CAUSAL
#define AT_CAUSAL 0
#endif

// ---- design axes (defaults: FlashAttention-2's d128 pick) -------------------------------------------------
#ifndef AT_BR
#define AT_BR 128            // query rows per CTA
#endif
#ifndef AT_BC
#define AT_BC 64             // key columns per K/V tile
#endif
#ifndef AT_WARPS_M
#define AT_WARPS_M 4         // compute warps along query rows
#endif
#ifndef AT_WARPS_N
#define AT_WARPS_N 1         // compute warps along key columns of S (and head_dim columns of O)
#endif
#ifndef AT_P_IN_REGS
#define AT_P_IN_REGS 1       // 1: S accumulators become P·V's A operand in registers; 0: P goes through smem
#endif
#ifndef AT_SMEM_MODE
#define AT_SMEM_MODE 1       // 0 static, 1 dynamic, 2 hybrid (Q/O staging static, K/V/P/stats dynamic)
#endif
#ifndef AT_KV_SLOTS
#define AT_KV_SLOTS 2        // 1: K then V share one buffer; 2: separate K and V; 4: separate, double-buffered
#endif
#ifndef AT_LOADER_WARPS
#define AT_LOADER_WARPS 0    // warps that only issue cp.async for K/V (warp specialization)
#endif
#ifndef AT_MIN_BLOCKS
#define AT_MIN_BLOCKS 1      // __launch_bounds__ minimum resident CTAs per SM
#endif
#ifndef AT_Q_IN_REGS
#define AT_Q_IN_REGS 0       // Q fragments kept in registers across the K/V loop
#endif
#ifndef AT_SOFTMAX_TREE
#define AT_SOFTMAX_TREE 0    // a tile's row max / row sum: 0 one dependent chain, 1 a pairwise tree
#endif
#ifndef AT_RESCALE_ON_GROWTH
#define AT_RESCALE_ON_GROWTH 0  // 1: rescale O and the row sums only when a row max of the warp grows past 2^8
#endif
#ifndef AT_KV_SPLITS
#define AT_KV_SPLITS 1       // CTAs one block's key range is cut into (grid.z = batch × splits)
#endif

// Optional (absent from every build but space.Problem(seqused_k=True)'s): a per-batch-row used key length read from
// FlashFwdParams.seqused_k on the device (kernels/common/seqused.cuh).
#ifndef AT_SEQUSED_K
#define AT_SEQUSED_K 0
#endif

namespace sm80 {

constexpr int kHeadDim = AT_HEAD_DIM;
constexpr bool kBf16 = AT_DTYPE_BF16 != 0;
constexpr bool kCausal = AT_CAUSAL != 0;
constexpr bool kSeqUsedK = AT_SEQUSED_K != 0;
constexpr int kBr = AT_BR;
constexpr int kBc = AT_BC;
constexpr int kWarpsM = AT_WARPS_M;
constexpr int kWarpsN = AT_WARPS_N;
constexpr bool kPInRegs = AT_P_IN_REGS != 0;
constexpr int kSmemMode = AT_SMEM_MODE;
constexpr int kKvSlots = AT_KV_SLOTS;
constexpr int kLoaderWarps = AT_LOADER_WARPS;
constexpr int kMinBlocks = AT_MIN_BLOCKS;
constexpr bool kQInRegs = AT_Q_IN_REGS != 0;
constexpr bool kSoftmaxTree = AT_SOFTMAX_TREE != 0;
constexpr bool kRescaleOnGrowth = AT_RESCALE_ON_GROWTH != 0;
constexpr float kRescaleLog2 = 8.f;  // how far (log2) a row max may outgrow the kept one; P then stays ≤ 2^8
// Split-KV: the key tiles of one (query block, head, batch) are cut into kSplits contiguous shares, one CTA each
// (grid.z = batch × kSplits); each writes its O normalised by its own row sum and its logsumexp, fp32, to
// p.o_partial / p.lse_partial, and flash_fwd_combine (common/split_combine.cuh) merges them. Puts enough CTAs on
// the SMs when batch × heads × query blocks is small (decode against a long cache).
constexpr int kSplits = AT_KV_SPLITS;
constexpr bool kSplit = kSplits > 1;

constexpr int kComputeWarps = kWarpsM * kWarpsN;
constexpr int kComputeThreads = kComputeWarps * 32;
constexpr int kLoaderThreads = kLoaderWarps * 32;
constexpr int kThreads = kComputeThreads + kLoaderThreads;

// Warp tiles. S tile of a warp: kRowsPerWarp × kColsPerWarp; O tile: kRowsPerWarp × kOutColsPerWarp.
constexpr int kRowsPerWarp = kBr / kWarpsM;
constexpr int kColsPerWarp = kBc / kWarpsN;
constexpr int kOutColsPerWarp = kHeadDim / kWarpsN;
constexpr int kMTiles = kRowsPerWarp / 16;      // m16 tiles per warp
constexpr int kSNTiles = kColsPerWarp / 8;      // n8 tiles of S per warp
constexpr int kONTiles = kOutColsPerWarp / 8;   // n8 tiles of O per warp
constexpr int kDSteps = kHeadDim / 16;          // k16 steps of Q·Kᵀ
constexpr int kBcSteps = kBc / 16;              // k16 steps of P·V

// Shared memory: rows padded by 8 elements (16 B) so the 8 rows one ldmatrix reads start in distinct banks.
constexpr int kElemBytes = 2;
constexpr int kPad = 8;
constexpr int kQStride = kHeadDim + kPad;   // elements per smem row of Q (and of the O staging tile)
constexpr int kKVStride = kHeadDim + kPad;
constexpr int kPStride = kBc + kPad;
constexpr int kQBytes = kBr * kQStride * kElemBytes;
constexpr int kKVSlotBytes = kBc * kKVStride * kElemBytes;
constexpr int kKVBytes = kKvSlots * kKVSlotBytes;
constexpr int kPBytes = kPInRegs ? 0 : kBr * kPStride * kElemBytes;
constexpr int kStatsBytes = kWarpsN > 1 ? 2 * kWarpsN * kBr * 4 : 0;  // partial row max and row sum per warp column
constexpr int kSmemTotal = kQBytes + kKVBytes + kPBytes + kStatsBytes;
constexpr int kSmemStatic = kSmemMode == 0 ? kSmemTotal : (kSmemMode == 2 ? kQBytes : 0);
constexpr int kSmemDynamic = kSmemTotal - kSmemStatic;

// Registers that must stay live across the K/V loop (per thread), and ptxas' cap under the launch bounds.
constexpr bool kTileShapeOk = kBr % (kWarpsM * 16) == 0 && kBc % (kWarpsN * 16) == 0 &&
                              kHeadDim % (kWarpsN * 16) == 0;
constexpr int kAccumulatorRegs =
    kMTiles * kONTiles * 4 + kMTiles * kSNTiles * 4 + (kQInRegs ? kMTiles * kDSteps * 4 : 0);
constexpr int kRegCapRaw = 65536 / (kThreads * kMinBlocks) / 8 * 8;
constexpr int kRegCap = kRegCapRaw < 255 ? kRegCapRaw : 255;

// Per-arch limits (bytes / threads); same table as space/arch.py.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 860 || __CUDA_ARCH__ == 870 || __CUDA_ARCH__ == 890 || __CUDA_ARCH__ >= 1200)
constexpr int kSmemOptin = 101376;
constexpr int kMaxThreadsPerSm = 1536;
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 800
constexpr int kSmemOptin = 166912;
constexpr int kMaxThreadsPerSm = 2048;
#else  // sm_90, sm_100, sm_103 (and the host pass)
constexpr int kSmemOptin = 232448;
constexpr int kMaxThreadsPerSm = 2048;
#endif
constexpr int kSmemReservedPerBlock = 1024;
constexpr int kSmemPerSm = kSmemOptin + kSmemReservedPerBlock;

static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "head_dim: AT_HEAD_DIM must be 64, 128 or 256");
static_assert(kKvSlots == 1 || kKvSlots == 2 || kKvSlots == 4, "kv_buffering: AT_KV_SLOTS must be 1, 2 or 4");
static_assert(kSmemMode >= 0 && kSmemMode <= 2, "smem_mode: AT_SMEM_MODE must be 0, 1 or 2");
static_assert(kBr % (kWarpsM * 16) == 0, "rows_per_warp: BR / WARPS_M must be a multiple of 16 (mma M)");
static_assert(kBc % (kWarpsN * 16) == 0, "cols_per_warp: BC / WARPS_N must be a multiple of 16");
static_assert(!kPInRegs || kWarpsN == 1,
              "p_regs_one_warp_per_row: P in registers needs one warp per row strip (WARPS_N == 1)");
static_assert(kHeadDim % (kWarpsN * 16) == 0, "out_cols_per_warp: HEAD_DIM / WARPS_N must be a multiple of 16");
static_assert(kSplits >= 1 && kSplits <= 32,
              "kv_splits_range: 1 to 32 key splits (flash_fwd_combine gives each split one lane of a warp)");
static_assert(kThreads <= 1024, "threads_per_block: at most 1024 threads per block");
static_assert(kThreads * kMinBlocks <= kMaxThreadsPerSm,
              "threads_per_sm: THREADS x MIN_BLOCKS exceeds the SM's thread slots");
static_assert(kSmemStatic <= 48 * 1024, "static_smem_limit: static shared memory is limited to 48 KB");
static_assert(kSmemTotal <= kSmemOptin, "smem_optin_limit: shared memory exceeds the arch's per-block opt-in limit");
static_assert(kMinBlocks == 1 || kMinBlocks * (kSmemTotal + kSmemReservedPerBlock) <= kSmemPerSm,
              "min_blocks_smem: MIN_BLOCKS CTAs do not fit the SM's shared memory together");
static_assert(!kTileShapeOk || kAccumulatorRegs <= kRegCap,
              "accumulators_fit_registers: O + S (+ Q) accumulators exceed the launch-bounds register cap");

// The loader computes its launch geometry from space/; these catch any drift between the two.
#ifdef AT_EXPECT_THREADS
static_assert(AT_EXPECT_THREADS == kThreads, "layout_threads: space/ and traits disagree on the thread count");
#endif
#ifdef AT_EXPECT_SMEM_STATIC
static_assert(AT_EXPECT_SMEM_STATIC == kSmemStatic, "layout_smem_static: space/ and traits disagree on static smem");
#endif
#ifdef AT_EXPECT_SMEM_DYNAMIC
static_assert(AT_EXPECT_SMEM_DYNAMIC == kSmemDynamic,
              "layout_smem_dynamic: space/ and traits disagree on dynamic smem");
#endif

// Named barriers (id 0 is __syncthreads): K/V ring "full" and "empty" per slot, and one for compute warps only.
constexpr int kBarFull = 1;                  // 1..4
constexpr int kBarEmpty = kBarFull + 4;      // 5..8
constexpr int kBarCompute = kBarEmpty + 4;   // 9

}  // namespace sm80
