// FlashAttention forward, SM80-era instructions (mma.sync m16n8k16, ldmatrix, cp.async).
// O = softmax(scale · Q Kᵀ) V with an online softmax over K/V tiles; optional fp32 logsumexp.
// Every design choice is a macro interpreted in traits.cuh; this file only reads the derived constants.
#include "../common/flash_params.h"
#include "../common/seqused.cuh"
#include "../common/split_combine.cuh"
#include "ptx.cuh"
#include "traits.cuh"

namespace sm80 {

// Copy kRows rows of kHeadDim elements from global (row stride in elements) into a padded smem tile with
// 16-byte cp.async, kN threads striding over the chunks. Rows >= row_limit are zero-filled, so garbage never
// meets a zero probability (garbage × 0 can be NaN).
//
// This runs once per K and V tile, so its address math is on the hot path (before this layout it was ~160 SASS
// instructions per tile, a sixth of the loop). When the threads cover whole rows (kN a multiple of the chunks
// per row), each thread keeps one column and steps down the rows by a fixed stride: one 64-bit multiply-add per
// tile, one add per chunk; and a tile that lies wholly inside the sequence skips the per-row range checks.
template <int kRows, int kSmemStride, int kN>
__device__ __forceinline__ void load_tile(uint32_t smem_base, const uint16_t* gbase, long long row_stride, int row0,
                                          int row_limit, int tid) {
    constexpr int kChunksPerRow = kHeadDim / 8;
    constexpr int kChunks = kRows * kChunksPerRow;
    constexpr int kIters = (kChunks + kN - 1) / kN;
    if constexpr (kN % kChunksPerRow == 0) {
        constexpr int kRowStep = kN / kChunksPerRow;  // rows between a thread's consecutive chunks
        const int r0 = tid / kChunksPerRow;
        const int col = (tid % kChunksPerRow) * 8;
        const uint16_t* src = gbase + static_cast<long long>(row0 + r0) * row_stride + col;
        const long long src_step = kRowStep * row_stride;
        const uint32_t dst = smem_base + (r0 * kSmemStride + col) * kElemBytes;
        if (row0 + kRows <= row_limit) {
#pragma unroll
            for (int i = 0; i < kIters; ++i)
                if (kChunks % kN == 0 || r0 + i * kRowStep < kRows)
                    cp_async_16(dst + i * kRowStep * kSmemStride * kElemBytes, src + i * src_step);
        } else {
#pragma unroll
            for (int i = 0; i < kIters; ++i)
                if (kChunks % kN == 0 || r0 + i * kRowStep < kRows) {
                    const bool valid = row0 + r0 + i * kRowStep < row_limit;
                    cp_async_16(dst + i * kRowStep * kSmemStride * kElemBytes, valid ? src + i * src_step : gbase,
                                valid);
                }
        }
    } else {
#pragma unroll
        for (int i = 0; i < kIters; ++i) {
            const int c = tid + i * kN;
            if (kChunks % kN == 0 || c < kChunks) {
                const int r = c / kChunksPerRow;
                const int col = (c % kChunksPerRow) * 8;
                const int gr = row0 + r;
                const bool valid = gr < row_limit;
                const uint16_t* src = valid ? gbase + gr * row_stride + col : gbase;
                cp_async_16(smem_base + (r * kSmemStride + col) * kElemBytes, src, valid);
            }
        }
    }
}

// This batch row's key count and causal offset (kernels/common/seqused.cuh says why they are read at each use).
__device__ __forceinline__ int keys_of(const FlashFwdParams& p, int batch) {
    return flash_common::used_seqlen_k<kSeqUsedK>(p, batch);
}
__device__ __forceinline__ int causal_offset_of(const FlashFwdParams& p, int batch) {
    return flash_common::used_causal_offset<kSeqUsedK>(p, batch);
}

// Where K or V is copied from: this CTA's (batch, kv_head) slice of it and its row stride in elements.
struct KvSource {
    const uint16_t* base;
    long long row_stride;
};

// K/V items alternate K0, V0, K1, V1, ... of this CTA's key tiles, which start at tile `tile0` (0 unless the key
// range is split); item i lives in ring slot i % kKvSlots, so one slot means K and V share a buffer, two mean
// separate K and V buffers, four mean both double-buffered. source(is_v): V's KvSource, or K's (asked once per
// item, for the one it copies).
template <int kN, typename Source>
__device__ __forceinline__ void load_kv_item(uint32_t kv_base, Source source, const FlashFwdParams& p, int batch,
                                             int tile0, int item, int tid) {
    const bool is_v = item & 1;
    const KvSource src = source(is_v);
    // Unsplit builds keep the expression they always had, to the letter: the d128 defaults sit at ptxas' 255-register
    // cap, and the same sum written with tile0 = 0 made sm_100's and sm_103's spill.
    const int row0 = kSplit ? (tile0 + (item >> 1)) * kBc : (item >> 1) * kBc;
    load_tile<kBc, kKVStride, kN>(kv_base + (item % kKvSlots) * kKVSlotBytes, src.base, src.row_stride, row0,
                                  keys_of(p, batch), tid);
}

// Registers across the K/V loop. The d128 128×64 tile (4 warps, P in registers) needs O (128 registers) and S (64)
// at once, and ptxas schedules its Q·Kᵀ and P·V up to the 255-register cap, so every other value held across the
// loop is one it spills: the K and V slice pointers, the loop bound, the thread's mask column, the epilogue's
// indices (6 values reloaded per tile before this). The loop therefore keeps only what it uses on every tile (O,
// the row statistics, three shared-memory addresses and the tile counter) and gets the rest afresh where it needs
// it, which costs a few instructions there:
//  - the KvSources are parked in shared memory (below) and loaded where a copy is issued;
//  - the thread and block indices are read again from the special registers (fresh_tid, fresh_block_idx): the
//    compiler cannot merge a volatile read with the one before the loop, nor hoist what is computed from it;
//  - the loop bound is a compare against the kernel parameters (has_tile in the kernel), which ptxas reads from
//    the constant bank.
//
// Parking: the padding of the Q tile's first two rows (K's source in row 0, V's in row 1), 16 bytes each that no
// copy, ldmatrix or O staging touches, since they all stay below column kHeadDim. (Recomputed from the parameters
// at each tile instead, ptxas kept the 64-bit strides and the head index in registers across the loop.) The
// compute warps' copies read them; loader warps keep theirs in registers (their loop holds nothing else).
constexpr int kKvSourceOffset = kHeadDim * kElemBytes;  // bytes into the Q tile: row 0's padding
constexpr int kKvSourceRowBytes = kQStride * kElemBytes;  // from row 0's padding to row 1's
static_assert(kPad * kElemBytes >= static_cast<int>(sizeof(KvSource)), "kv_source: a Q row's padding holds one");
static_assert(kKvSourceOffset % 16 == 0 && kKvSourceRowBytes % 16 == 0, "kv_source: 16-byte aligned");
__device__ __forceinline__ void park_kv_source(uint32_t addr, KvSource s) {
    asm volatile("st.shared.v2.u64 [%0], {%1, %2};\n" ::"r"(addr), "l"(s.base), "l"(s.row_stride) : "memory");
}
// Volatile, so that the compiler neither hoists the load out of the loop nor forwards the parked values to it:
// either would put them back in registers across the loop.
__device__ __forceinline__ KvSource parked_kv_source(uint32_t addr) {
    KvSource s;
    asm volatile("ld.shared.v2.u64 {%0, %1}, [%2];\n" : "=l"(s.base), "=l"(s.row_stride) : "r"(addr));
    return s;
}

// v, opaque to the compiler from here on: what the loop computes from it stays in the loop instead of being hoisted
// and held. The asm is empty: no instruction.
__device__ __forceinline__ int fresh(int v) {
    asm volatile("" : "+r"(v));
    return v;
}
// threadIdx.x read afresh. The bound keeps the divisions by powers of two shifts.
__device__ __forceinline__ int fresh_tid() {
    unsigned v;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(v));
    __builtin_assume(v < 1024);
    return static_cast<int>(v);
}
// blockIdx.x, .y or .z read afresh (grid dimensions keep them below 2^31).
template <int kDim>
__device__ __forceinline__ int fresh_block_idx() {
    unsigned v;
    if constexpr (kDim == 0) {
        asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(v));
    } else if constexpr (kDim == 1) {
        asm volatile("mov.u32 %0, %%ctaid.y;" : "=r"(v));
    } else {
        asm volatile("mov.u32 %0, %%ctaid.z;" : "=r"(v));
    }
    __builtin_assume(v < 0x80000000u);
    return static_cast<int>(v);
}

// The row max and row sum of a tile: one dependent chain (fewest live registers), or a pairwise tree
// (log2(kN) dependent steps, more values live at once) when kSoftmaxTree. kN is a power of two.
template <int kN, typename Op>
__device__ __forceinline__ float reduce_row(float (&v)[kN], Op op) {
    static_assert((kN & (kN - 1)) == 0, "reduce_row: kN must be a power of two");
    if constexpr (kSoftmaxTree) {
#pragma unroll
        for (int stride = kN / 2; stride > 0; stride /= 2)
#pragma unroll
            for (int i = 0; i < stride; ++i) v[i] = op(v[i], v[i + stride]);
        return v[0];
    } else {
        float r = v[0];
#pragma unroll
        for (int i = 1; i < kN; ++i) r = op(r, v[i]);
        return r;
    }
}

__device__ __forceinline__ void compute_sync() {
    if constexpr (kLoaderWarps > 0) {
        named_barrier_sync(kBarCompute, kComputeThreads);
    } else {
        __syncthreads();
    }
}

}  // namespace sm80

extern "C" __global__ void __launch_bounds__(sm80::kThreads, sm80::kMinBlocks)
    flash_fwd_mma_sync(const FlashFwdParams p) {
    using namespace sm80;
    if constexpr (kSplit) split_kv::allow_combine_launch();  // the combine's launch may overlap this kernel

#if AT_SMEM_MODE == 0
    __shared__ __align__(128) unsigned char smem_static[kSmemStatic];
    unsigned char* q_region = smem_static;
    unsigned char* rest = smem_static + kQBytes;
#elif AT_SMEM_MODE == 1
    extern __shared__ __align__(128) unsigned char smem_dynamic[];
    unsigned char* q_region = smem_dynamic;
    unsigned char* rest = smem_dynamic + kQBytes;
#else
    __shared__ __align__(128) unsigned char smem_static[kSmemStatic];
    extern __shared__ __align__(128) unsigned char smem_dynamic[];
    unsigned char* q_region = smem_static;
    unsigned char* rest = smem_dynamic;
#endif
    uint16_t* q_s = reinterpret_cast<uint16_t*>(q_region);  // Q tile, later the O staging tile
    uint16_t* kv_s = reinterpret_cast<uint16_t*>(rest);
    uint16_t* p_s = reinterpret_cast<uint16_t*>(rest + kKVBytes);
    float* stats_max = reinterpret_cast<float*>(rest + kKVBytes + kPBytes);
    float* stats_sum = stats_max + kWarpsN * kBr;
    const uint32_t kv_base = smem_addr(kv_s);
    const uint32_t kv_sources = smem_addr(q_region) + kKvSourceOffset;  // where park_kv_source puts them

    const int tid = threadIdx.x;
    const int warp = tid / 32;
    const int lane = tid % 32;
    // Not const: the epilogue reads them again (see "Registers across the K/V loop").
    int batch = kSplit ? static_cast<int>(blockIdx.z) / kSplits : static_cast<int>(blockIdx.z);
    int split = kSplit ? static_cast<int>(blockIdx.z) % kSplits : 0;
    int head = blockIdx.y;
    int q_start = blockIdx.x * kBr;
    const int kv_head = head / (p.heads / p.kv_heads);

    const uint16_t* q_g = static_cast<const uint16_t*>(p.q) + batch * p.q_batch_stride + head * p.q_head_stride;
    const uint16_t* k_g = static_cast<const uint16_t*>(p.k) + batch * p.k_batch_stride + kv_head * p.k_head_stride;
    const uint16_t* v_g = static_cast<const uint16_t*>(p.v) + batch * p.v_batch_stride + kv_head * p.v_head_stride;
    const auto held_source = [&](bool is_v) {
        return is_v ? KvSource{v_g, p.v_row_stride} : KvSource{k_g, p.k_row_stride};
    };

    // This batch row's key length (seqused_k builds: its used length; the rows past it are zero-filled by load_tile
    // and masked like the tail past seqlen_k, and a row using none walks no tile: O = 0, lse = -inf).
    // This batch row's keys and causal offset (kernels/common/seqused.cuh), read at each use.
    int n_tiles = (keys_of(p, batch) + kBc - 1) / kBc;
    if constexpr (kCausal) {
        // Query row i sees keys j <= i + causal_offset (0: top-left, seqlen_k - seqlen_q: bottom-right), so tiles
        // past the block's last row are skipped. A block that sees no key at all (bottom-right with more queries
        // than keys) runs one fully masked tile: O = 0 and lse = -inf, as for any row with every score masked.
        const int last_key = min(q_start + kBr, p.seqlen_q) - 1 + causal_offset_of(p, batch);
        n_tiles = last_key < 0 ? 1 : min(n_tiles, last_key / kBc + 1);
    }
    // This CTA's share of the key tiles: split s of kSplits takes ceil(n_tiles / kSplits) of them, from tile0. A
    // split left with none (fewer tiles than splits, or a short causal block) writes lse = -inf for its rows, which
    // flash_fwd_combine weighs 0 without reading its O, and exits before any barrier.
    int tile0 = 0;
    if constexpr (kSplit) {
        const int per_split = (n_tiles + kSplits - 1) / kSplits;
        tile0 = split * per_split;
        n_tiles = min(n_tiles - tile0, per_split);
        if (n_tiles <= 0) {
            for (int r = tid; r < kBr; r += kThreads)
                if (q_start + r < p.seqlen_q)
                    p.lse_partial[((static_cast<long long>(split) * p.batch + batch) * p.heads + head) * p.seqlen_q +
                                  q_start + r] = -INFINITY;
            return;
        }
    }
    const int n_items = 2 * n_tiles;

    load_tile<kBr, kQStride, kThreads>(smem_addr(q_s), q_g, p.q_row_stride, q_start, p.seqlen_q, tid);
    cp_async_commit();

    if constexpr (kLoaderWarps > 0) {
        cp_async_wait<0>();
        __syncthreads();
        if (warp >= kComputeWarps) {
            // Producer: fill the ring; a slot is refilled only after the compute warps released it.
            const int ltid = tid - kComputeThreads;
            for (int item = 0; item < n_items; ++item) {
                const int slot = item % kKvSlots;
                if (item >= kKvSlots) named_barrier_sync(kBarEmpty + slot, kThreads);
                load_kv_item<kLoaderThreads>(kv_base, held_source, p, batch, tile0, item, ltid);
                cp_async_commit();
                cp_async_wait<0>();
                named_barrier_arrive(kBarFull + slot, kThreads);
            }
            return;
        }
    } else {
        // Prologue: one commit group per ring slot (empty groups keep the wait counts uniform).
#pragma unroll
        for (int i = 0; i < kKvSlots; ++i) {
            if (i < n_items) load_kv_item<kThreads>(kv_base, held_source, p, batch, tile0, i, tid);
            cp_async_commit();
        }
        if (tid == 0) {  // every thread sees them after the barrier below
            park_kv_source(kv_sources, held_source(false));
            park_kv_source(kv_sources + kKvSourceRowBytes, held_source(true));
        }
        cp_async_wait<kKvSlots>();  // the Q group is done
        __syncthreads();
    }

    // tile < n_tiles. Unsplit builds without seqused_k ask the parameters instead of holding n_tiles: the same
    // verdict, since n_tiles tiles of kBc keys reach the first key past the range, min(seqlen_k, last_key + 1)
    // (causal; one tile when the block sees no key, as above), and no tile before them does.
    auto has_tile = [&](int tile) -> bool {
        if constexpr (kSplit || kSeqUsedK) {
            return tile < n_tiles;
        } else if constexpr (kCausal) {
            const int last_key = min(fresh(q_start) + kBr, p.seqlen_q) - 1 + p.causal_offset;
            return tile * kBc < (last_key < 0 ? 1 : min(p.seqlen_k, last_key + 1));
        } else {
            return tile * kBc < p.seqlen_k;
        }
    };
    // Wait until K/V item `item` is in shared memory.
    auto acquire = [&](int item) {
        if constexpr (kLoaderWarps > 0) {
            named_barrier_sync(kBarFull + item % kKvSlots, kThreads);
        } else if constexpr (kKvSlots == 1) {
            cp_async_wait<0>();
            __syncthreads();
        } else if (item == 0) {
            cp_async_wait<kKvSlots - 1>();
            __syncthreads();
        }  // else: the release of item - 1 already waited for this one
    };
    // The loop's copies: sources from where they are parked (the item's parity is known where a copy is issued, so
    // each loads one), and a fresh tid.
    const auto parked_source = [&](bool is_v) {
        return parked_kv_source(kv_sources + (is_v ? kKvSourceRowBytes : 0));
    };
    // Item i exists iff i < n_items = 2 n_tiles, i.e. iff tile i / 2 does.
    // Done reading item `item`: hand its slot to the next item that maps to it.
    auto release = [&](int item) {
        if constexpr (kLoaderWarps > 0) {
            if (has_tile((item + kKvSlots) / 2)) named_barrier_arrive(kBarEmpty + item % kKvSlots, kThreads);
        } else if constexpr (kKvSlots == 1) {
            __syncthreads();
            if (has_tile((item + 1) / 2))
                load_kv_item<kThreads>(kv_base, parked_source, p, batch, tile0, item + 1, fresh_tid());
            cp_async_commit();
        } else if (has_tile((item + 1) / 2)) {
            // One barrier does two jobs: every thread is done with `item` (its slot may be refilled) and
            // item + 1, already in flight, is visible to all. Groups committed after item + 1: kKvSlots - 2.
            cp_async_wait<kKvSlots - 2>();
            __syncthreads();
            if (has_tile((item + kKvSlots) / 2))
                load_kv_item<kThreads>(kv_base, parked_source, p, batch, tile0, item + kKvSlots, fresh_tid());
            cp_async_commit();
        }
    };

    const int warp_m = warp / kWarpsN;
    // Not const: the epilogue derives them again (see "Registers across the K/V loop").
    int warp_n = warp % kWarpsN;
    int row_w = warp_m * kRowsPerWarp;  // first block row of this warp
    int g = lane / 4;                   // fragment row within an m16 tile (and +8)
    int t = lane % 4;                   // fragment column pair
    // ldmatrix.x4 lane → row/col of the 16×16 tile it addresses: A fragments (Q, P) and V (transposed) use the
    // same order (rows 0-7, 8-15, then columns +8); K's order gives two n8 tiles per call.
    const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8;
    const int a_col = (lane >> 4) * 8;
    const int b_row = (lane & 7) + (lane >> 4) * 8;
    const int b_col = ((lane >> 3) & 1) * 8;
    const float scale_log2 = p.scale_log2;

    uint32_t q_frag[kQInRegs ? kMTiles : 1][kQInRegs ? kDSteps : 1][4];
    if constexpr (kQInRegs) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
            for (int ks = 0; ks < kDSteps; ++ks)
                ldmatrix_x4(q_frag[mt][ks], smem_addr(q_s + (row_w + mt * 16 + a_row) * kQStride + ks * 16 + a_col));
    }

    float o_acc[kMTiles][kONTiles][4];
    float row_max[kMTiles][2];
    float row_sum[kMTiles][2];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int dn = 0; dn < kONTiles; ++dn)
#pragma unroll
            for (int e = 0; e < 4; ++e) o_acc[mt][dn][e] = 0.f;
        row_max[mt][0] = row_max[mt][1] = -INFINITY;
        row_sum[mt][0] = row_sum[mt][1] = 0.f;
    }

    for (int tile = 0; has_tile(tile); ++tile) {
        const int k_item = 2 * tile;
        const int v_item = 2 * tile + 1;

        // ---- S = Q Kᵀ for this warp's rows × columns --------------------------------------------------
        acquire(k_item);
        const uint16_t* k_s = kv_s + (k_item % kKvSlots) * (kKVSlotBytes / kElemBytes);
        float s[kMTiles][kSNTiles][4];
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
            for (int nt = 0; nt < kSNTiles; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.f;
#pragma unroll
        for (int ks = 0; ks < kDSteps; ++ks) {
            uint32_t a[kMTiles][4];
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt) {
                if constexpr (kQInRegs) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) a[mt][e] = q_frag[mt][ks][e];
                } else {
                    ldmatrix_x4(a[mt], smem_addr(q_s + (row_w + mt * 16 + a_row) * kQStride + ks * 16 + a_col));
                }
            }
#pragma unroll
            for (int np = 0; np < kSNTiles / 2; ++np) {
                uint32_t b[4];
                ldmatrix_x4(b, smem_addr(k_s + (warp_n * kColsPerWarp + np * 16 + b_row) * kKVStride + ks * 16 + b_col));
#pragma unroll
                for (int mt = 0; mt < kMTiles; ++mt) {
                    mma_16816<kBf16>(s[mt][2 * np], a[mt], b[0], b[1]);
                    mma_16816<kBf16>(s[mt][2 * np + 1], a[mt], b[2], b[3]);
                }
            }
        }
        release(k_item);

        // ---- mask columns past seqlen_k and, for causal, above the diagonal ------------------------------
        const int key_tile = tile0 + tile;  // the tile's place in the whole key range
        // Spelled as the fields where seqused_k is off, at each use: the front end then emits exactly the old mask
        // (through the inlined helpers, or with the values held in locals, the causal builds' code changed).
#define AT_KEY_END (kSeqUsedK ? keys_of(p, batch) : p.seqlen_k)
#define AT_DIAG_OFFSET (kSeqUsedK ? causal_offset_of(p, batch) : p.causal_offset)
        const bool need_mask = (key_tile + 1) * kBc > AT_KEY_END ||
                               (kCausal && (key_tile + 1) * kBc - 1 > q_start + AT_DIAG_OFFSET);
        if (need_mask) {
            // The thread's first row and column of S, from a fresh tid (q_start + row_w + g, and the tile's first
            // key + warp_n's columns + 2t): this block runs on a tile or two, and what it derives from the tid
            // before the loop would be held across it.
            const int mtid = fresh_tid();
            const int row0 = q_start + mtid / 32 / kWarpsN * kRowsPerWarp + mtid % 32 / 4;
            const int col0 = key_tile * kBc + mtid / 32 % kWarpsN * kColsPerWarp + 2 * (mtid % 4);
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
                for (int nt = 0; nt < kSNTiles; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int row = row0 + mt * 16 + (e >> 1) * 8;
                        const int col = col0 + nt * 8 + (e & 1);
                        if (col >= AT_KEY_END || (kCausal && col > row + AT_DIAG_OFFSET)) s[mt][nt][e] = -INFINITY;
#undef AT_KEY_END
#undef AT_DIAG_OFFSET
                    }
        }

        // ---- online softmax ------------------------------------------------------------------------------
        float tile_max[kMTiles][2];
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float part[kSNTiles];
#pragma unroll
                for (int nt = 0; nt < kSNTiles; ++nt) part[nt] = fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]);
                float m = reduce_row<kSNTiles>(part, [](float a, float b) { return fmaxf(a, b); });
                m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, 1));
                m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, 2));
                tile_max[mt][h] = m;
            }
        if constexpr (kWarpsN > 1) {
            // A row spans kWarpsN warps: exchange partial maxima through shared memory.
            if (t == 0) {
#pragma unroll
                for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
                    for (int h = 0; h < 2; ++h) stats_max[warp_n * kBr + row_w + mt * 16 + g + h * 8] = tile_max[mt][h];
            }
            compute_sync();
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    float m = -INFINITY;
#pragma unroll
                    for (int w = 0; w < kWarpsN; ++w) m = fmaxf(m, stats_max[w * kBr + row_w + mt * 16 + g + h * 8]);
                    tile_max[mt][h] = m;
                }
        }
        // Conditional rescaling (FlashAttention-4): keep the max a row's probabilities are taken against until some
        // row of the warp outgrows it by more than 2^kRescaleLog2, so most tiles skip rescaling O and the row sums.
        // Exact: O, the row sum and the logsumexp all use the kept max, and P stays ≤ 2^kRescaleLog2.
        bool rescale = true;
        if constexpr (kRescaleOnGrowth) {
            bool grows = false;
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
                for (int h = 0; h < 2; ++h)  // −inf − −inf (nothing unmasked yet) is NaN, so no growth: as it should be
                    grows |= (tile_max[mt][h] - row_max[mt][h]) * scale_log2 > kRescaleLog2;
            rescale = __any_sync(0xffffffff, grows);  // warp-uniform: the branches below never diverge
        }
        // Set on every path though only a rescaling tile reads it: left unset on a tile that keeps its max
        // (on_growth), it was the compiler's to choose, which chose the previous tile's factors and so carried them
        // across the loop in four registers.
        float alpha[kMTiles][2];
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) alpha[mt][0] = alpha[mt][1] = 1.f;
        float m_scaled[kMTiles][2];
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float m_new = rescale ? fmaxf(row_max[mt][h], tile_max[mt][h]) : row_max[mt][h];
                // A row with nothing unmasked yet keeps max −inf: use 0 as its baseline so −inf − −inf never
                // appears; its probabilities are exp2(−inf) = 0 either way.
                m_scaled[mt][h] = m_new == -INFINITY ? 0.f : m_new * scale_log2;
                if (rescale) {
                    alpha[mt][h] = m_new == -INFINITY ? 1.f : fast_exp2((row_max[mt][h] - m_new) * scale_log2);
                    row_max[mt][h] = m_new;
                    row_sum[mt][h] *= alpha[mt][h];
                }
            }
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
            for (int nt = 0; nt < kSNTiles; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float pr = fast_exp2(fmaf(s[mt][nt][e], scale_log2, -m_scaled[mt][e >> 1]));
                    s[mt][nt][e] = pr;
                    if constexpr (!kSoftmaxTree) row_sum[mt][e >> 1] += pr;  // the chain, as the values come
                }
        if constexpr (kSoftmaxTree) {
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    float part[kSNTiles];
#pragma unroll
                    for (int nt = 0; nt < kSNTiles; ++nt) part[nt] = s[mt][nt][2 * h] + s[mt][nt][2 * h + 1];
                    row_sum[mt][h] += reduce_row<kSNTiles>(part, [](float a, float b) { return a + b; });
                }
        }
        if (rescale) {
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
                for (int dn = 0; dn < kONTiles; ++dn)
#pragma unroll
                    for (int e = 0; e < 4; ++e) o_acc[mt][dn][e] *= alpha[mt][e >> 1];
        }

        // P in registers: two adjacent n8 accumulator tiles of S are exactly one m16k16 A fragment of P·V.
        // Packing right away lets the fp32 scores die before V is read (half the registers).
        uint32_t p_frag[kPInRegs ? kMTiles : 1][kPInRegs ? kBcSteps : 1][4];
        if constexpr (kPInRegs) {
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
                for (int kk = 0; kk < kBcSteps; ++kk) {
                    p_frag[mt][kk][0] = pack2<kBf16>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                    p_frag[mt][kk][1] = pack2<kBf16>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                    p_frag[mt][kk][2] = pack2<kBf16>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                    p_frag[mt][kk][3] = pack2<kBf16>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
                }
        }

        if constexpr (!kPInRegs) {
            // P through shared memory: any warp layout of P·V can then read whole rows of P.
            if constexpr (kWarpsN == 1) __syncwarp();  // this warp's previous ldmatrix reads of its rows are done
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
                for (int nt = 0; nt < kSNTiles; ++nt) {
                    const int row = row_w + mt * 16 + g;
                    const int col = warp_n * kColsPerWarp + nt * 8 + 2 * t;
                    *reinterpret_cast<uint32_t*>(p_s + row * kPStride + col) = pack2<kBf16>(s[mt][nt][0], s[mt][nt][1]);
                    *reinterpret_cast<uint32_t*>(p_s + (row + 8) * kPStride + col) =
                        pack2<kBf16>(s[mt][nt][2], s[mt][nt][3]);
                }
            if constexpr (kWarpsN == 1) {
                __syncwarp();  // rows are private to the warp
            } else {
                compute_sync();
            }
        }

        // ---- O += P V --------------------------------------------------------------------------------------
        acquire(v_item);
        const uint16_t* v_s = kv_s + (v_item % kKvSlots) * (kKVSlotBytes / kElemBytes);
#pragma unroll
        for (int kk = 0; kk < kBcSteps; ++kk) {
            uint32_t a[kMTiles][4];
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt) {
                if constexpr (kPInRegs) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) a[mt][e] = p_frag[mt][kk][e];
                } else {
                    ldmatrix_x4(a[mt], smem_addr(p_s + (row_w + mt * 16 + a_row) * kPStride + kk * 16 + a_col));
                }
            }
#pragma unroll
            for (int dp = 0; dp < kONTiles / 2; ++dp) {
                uint32_t b[4];
                ldmatrix_x4_trans(b, smem_addr(v_s + (kk * 16 + a_row) * kKVStride + warp_n * kOutColsPerWarp +
                                               dp * 16 + a_col));
#pragma unroll
                for (int mt = 0; mt < kMTiles; ++mt) {
                    mma_16816<kBf16>(o_acc[mt][2 * dp], a[mt], b[0], b[1]);
                    mma_16816<kBf16>(o_acc[mt][2 * dp + 1], a[mt], b[2], b[3]);
                }
            }
        }
        release(v_item);
    }

    // ---- epilogue: row sums, logsumexp, normalized O staged through the Q tile, 16-byte stores ---------------
    // The thread's and the block's indices again, read afresh (see "Registers across the K/V loop").
    const int etid = fresh_tid();
    warp_n = etid / 32 % kWarpsN;
    row_w = etid / 32 / kWarpsN * kRowsPerWarp;
    g = etid % 32 / 4;
    t = etid % 4;
    {
        const int z = fresh_block_idx<2>();
        batch = kSplit ? z / kSplits : z;
        split = kSplit ? z % kSplits : 0;
        head = fresh_block_idx<1>();
        q_start = fresh_block_idx<0>() * kBr;
    }
    float inv_sum[kMTiles][2];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float l = row_sum[mt][h];
            l += __shfl_xor_sync(0xffffffff, l, 1);
            l += __shfl_xor_sync(0xffffffff, l, 2);
            row_sum[mt][h] = l;
        }
    if constexpr (kWarpsN > 1) {
        if (t == 0) {
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
                for (int h = 0; h < 2; ++h) stats_sum[warp_n * kBr + row_w + mt * 16 + g + h * 8] = row_sum[mt][h];
        }
        compute_sync();
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float l = 0.f;
#pragma unroll
                for (int w = 0; w < kWarpsN; ++w) l += stats_sum[w * kBr + row_w + mt * 16 + g + h * 8];
                row_sum[mt][h] = l;
            }
    }
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float l = row_sum[mt][h];
            inv_sum[mt][h] = l > 0.f ? 1.f / l : 0.f;
            const int row = q_start + row_w + mt * 16 + g + h * 8;
            // A split's logsumexp is what flash_fwd_combine weighs it by; it writes p.lse itself when asked.
            float* lse_out = kSplit ? p.lse_partial + static_cast<long long>(split) * p.batch * p.heads * p.seqlen_q
                                    : p.lse;
            if (lse_out != nullptr && warp_n == 0 && t == 0 && row < p.seqlen_q) {
                const float lse2 = l > 0.f ? row_max[mt][h] * scale_log2 + __log2f(l) : -INFINITY;
                lse_out[(static_cast<long long>(batch) * p.heads + head) * p.seqlen_q + row] = lse2 * 0.69314718055994531f;
            }
        }

    if constexpr (kSplit) {
        // This split's share: O normalised by its own row sum, fp32, straight from the accumulators (8-byte stores;
        // the partial rows are contiguous, (split, batch, head, row) major).
        float* o_part = p.o_partial +
                        ((static_cast<long long>(split) * p.batch + batch) * p.heads + head) * p.seqlen_q * kHeadDim;
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = q_start + row_w + mt * 16 + g + h * 8;
                if (row >= p.seqlen_q) continue;
                float* dst = o_part + static_cast<long long>(row) * kHeadDim + warp_n * kOutColsPerWarp + 2 * t;
#pragma unroll
                for (int dn = 0; dn < kONTiles; ++dn)
                    *reinterpret_cast<float2*>(dst + dn * 8) =
                        make_float2(o_acc[mt][dn][2 * h] * inv_sum[mt][h], o_acc[mt][dn][2 * h + 1] * inv_sum[mt][h]);
            }
        return;
    }

    compute_sync();  // every warp is done reading the Q tile (and P), so it can hold O
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int dn = 0; dn < kONTiles; ++dn) {
            const int row = row_w + mt * 16 + g;
            const int col = warp_n * kOutColsPerWarp + dn * 8 + 2 * t;
            *reinterpret_cast<uint32_t*>(q_s + row * kQStride + col) =
                pack2<kBf16>(o_acc[mt][dn][0] * inv_sum[mt][0], o_acc[mt][dn][1] * inv_sum[mt][0]);
            *reinterpret_cast<uint32_t*>(q_s + (row + 8) * kQStride + col) =
                pack2<kBf16>(o_acc[mt][dn][2] * inv_sum[mt][1], o_acc[mt][dn][3] * inv_sum[mt][1]);
        }
    compute_sync();
    uint16_t* o_g = static_cast<uint16_t*>(p.o) + batch * p.o_batch_stride + head * p.o_head_stride;
    constexpr int kChunksPerRow = kHeadDim / 8;
    constexpr int kOutChunks = kBr * kChunksPerRow;
#pragma unroll
    for (int i = 0; i < (kOutChunks + kComputeThreads - 1) / kComputeThreads; ++i) {
        const int c = etid + i * kComputeThreads;
        if (kOutChunks % kComputeThreads == 0 || c < kOutChunks) {
            const int r = c / kChunksPerRow;
            const int col = (c % kChunksPerRow) * 8;
            if (q_start + r < p.seqlen_q) {
                *reinterpret_cast<uint4*>(o_g + (q_start + r) * p.o_row_stride + col) =
                    *reinterpret_cast<const uint4*>(q_s + r * kQStride + col);
            }
        }
    }
}

// Split-KV's second step (kernels/common/split_combine.cuh, shared with the wgmma family): the loader launches it
// after a split build; a no-op in builds without splits (the loader never launches it there).
extern "C" __global__ void __launch_bounds__(split_kv::kCombineThreads)
    flash_fwd_combine(const __grid_constant__ FlashFwdParams p) {
    using namespace sm80;
    if constexpr (kSplit) split_kv::combine<kSplits, kHeadDim, kBf16>(p);
}
