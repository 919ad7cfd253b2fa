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

// K/V items alternate K0, V0, K1, V1, ... of this CTA's key tiles, which start at tile `tile0` (0 unless the key
// range is split); item i lives in ring slot i % kKvSlots, so one slot means K and V share a buffer, two mean
// separate K and V buffers, four mean both double-buffered.
template <int kN>
__device__ __forceinline__ void load_kv_item(uint32_t kv_base, const uint16_t* k_g, const uint16_t* v_g,
                                             const FlashFwdParams& p, int batch, int tile0, int item, int tid) {
    const bool is_v = item & 1;
    // Unsplit builds keep the expression they always had, to the letter: the d128 defaults sit at ptxas' 255-register
    // cap, and the same sum written with tile0 = 0 made sm_100's and sm_103's spill.
    const int row0 = kSplit ? (tile0 + (item >> 1)) * kBc : (item >> 1) * kBc;
    load_tile<kBc, kKVStride, kN>(kv_base + (item % kKvSlots) * kKVSlotBytes, is_v ? v_g : k_g,
                                  is_v ? p.v_row_stride : p.k_row_stride, row0, keys_of(p, batch), tid);
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

    const int tid = threadIdx.x;
    const int warp = tid / 32;
    const int lane = tid % 32;
    const int batch = kSplit ? static_cast<int>(blockIdx.z) / kSplits : static_cast<int>(blockIdx.z);
    const int split = kSplit ? static_cast<int>(blockIdx.z) % kSplits : 0;
    const int head = blockIdx.y;
    const int q_start = blockIdx.x * kBr;
    const int kv_head = head / (p.heads / p.kv_heads);

    const uint16_t* q_g = static_cast<const uint16_t*>(p.q) + batch * p.q_batch_stride + head * p.q_head_stride;
    const uint16_t* k_g = static_cast<const uint16_t*>(p.k) + batch * p.k_batch_stride + kv_head * p.k_head_stride;
    const uint16_t* v_g = static_cast<const uint16_t*>(p.v) + batch * p.v_batch_stride + kv_head * p.v_head_stride;
    uint16_t* o_g = static_cast<uint16_t*>(p.o) + batch * p.o_batch_stride + head * p.o_head_stride;

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
                load_kv_item<kLoaderThreads>(kv_base, k_g, v_g, p, batch, tile0, item, ltid);
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
            if (i < n_items) load_kv_item<kThreads>(kv_base, k_g, v_g, p, batch, tile0, i, tid);
            cp_async_commit();
        }
        cp_async_wait<kKvSlots>();  // the Q group is done
        __syncthreads();
    }

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
    // Done reading item `item`: hand its slot to the next item that maps to it.
    auto release = [&](int item) {
        if constexpr (kLoaderWarps > 0) {
            if (item + kKvSlots < n_items) named_barrier_arrive(kBarEmpty + item % kKvSlots, kThreads);
        } else if constexpr (kKvSlots == 1) {
            __syncthreads();
            if (item + 1 < n_items) load_kv_item<kThreads>(kv_base, k_g, v_g, p, batch, tile0, item + 1, tid);
            cp_async_commit();
        } else if (item + 1 < n_items) {
            // One barrier does two jobs: every thread is done with `item` (its slot may be refilled) and
            // item + 1, already in flight, is visible to all. Groups committed after item + 1: kKvSlots - 2.
            cp_async_wait<kKvSlots - 2>();
            __syncthreads();
            if (item + kKvSlots < n_items)
                load_kv_item<kThreads>(kv_base, k_g, v_g, p, batch, tile0, item + kKvSlots, tid);
            cp_async_commit();
        }
    };

    const int warp_m = warp / kWarpsN;
    const int warp_n = warp % kWarpsN;
    const int row_w = warp_m * kRowsPerWarp;  // first block row of this warp
    const int g = lane / 4;                   // fragment row within an m16 tile (and +8)
    const int t = lane % 4;                   // fragment column pair
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

    for (int tile = 0; tile < n_tiles; ++tile) {
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
        const int col0 = key_tile * kBc + warp_n * kColsPerWarp;
        // Spelled as the fields where seqused_k is off, at each use: the front end then emits exactly the old mask
        // (through the inlined helpers, or with the values held in locals, the causal builds' code changed).
#define AT_KEY_END (kSeqUsedK ? keys_of(p, batch) : p.seqlen_k)
#define AT_DIAG_OFFSET (kSeqUsedK ? causal_offset_of(p, batch) : p.causal_offset)
        const bool need_mask = (key_tile + 1) * kBc > AT_KEY_END ||
                               (kCausal && (key_tile + 1) * kBc - 1 > q_start + AT_DIAG_OFFSET);
        if (need_mask) {
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
                for (int nt = 0; nt < kSNTiles; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int row = q_start + row_w + mt * 16 + g + (e >> 1) * 8;
                        const int col = col0 + nt * 8 + 2 * t + (e & 1);
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
        float alpha[kMTiles][2];
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
    constexpr int kChunksPerRow = kHeadDim / 8;
    constexpr int kOutChunks = kBr * kChunksPerRow;
#pragma unroll
    for (int i = 0; i < (kOutChunks + kComputeThreads - 1) / kComputeThreads; ++i) {
        const int c = tid + i * kComputeThreads;
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
