// Split-KV's second step, shared by every kernel family (each one's flash_fwd.cu wraps it as the extern "C"
// kernel flash_fwd_combine, so the host loader launches the same merge for any family's split build).
//
// One warp per (batch, head, query row) merges the kSplits partial results that the attention kernel wrote to
// p.o_partial / p.lse_partial (flash_params.h): O = Σ_s w_s O_s / Σ_s w_s with w_s = exp(lse_s - max lse),
// lse = max + log Σ w_s. Lane s holds split s's weight, hence at most 32 splits; a split with lse = -inf (no key,
// or every key masked) weighs 0 and its O is never read (it may be unwritten). A row no split saw gets O = 0 and
// lse = -inf, as the unsplit kernels write. Launch: grid ceil(rows / kCombineRowsPerBlock), block kCombineThreads.
#pragma once

#include <math_constants.h>
#include <stdint.h>

#include "flash_params.h"
#include "pack.cuh"

namespace split_kv {

// Programmatic dependent launch (sm_90+). The loader may launch the combine before the split kernel has finished
// (autotune/launch/loader.py: COMBINE_PROGRAMMATIC), so that its launch overlaps the split kernel's tail instead of
// following it; the combine then waits here for the split kernel's completion and its memory. A plain launch
// returns from the wait at once, and before sm_90 neither instruction exists (nor is emitted).
__device__ __forceinline__ void wait_for_splits() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// In a split kernel, early: once every CTA has passed it (or exited), the combine's launch may begin.
__device__ __forceinline__ void allow_combine_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// acc += w × the lane's kCols columns of a partial O row (fp32, float2 loads).
template <int kCols>
__device__ __forceinline__ void add_weighted(float (&acc)[kCols], const float* src, float w) {
#pragma unroll
    for (int c = 0; c < kCols; c += 2) {
        const float2 x = *reinterpret_cast<const float2*>(src + c);
        acc[c] += w * x.x;
        acc[c + 1] += w * x.y;
    }
}

// The lane's kCols columns of O's row (batch, head, qrow), acc × inv in the 16-bit dtype.
template <int kCols, bool kBf16>
__device__ __forceinline__ void store_o_row(const FlashFwdParams& p, int batch, int head, int qrow, int lane,
                                            const float (&acc)[kCols], float inv) {
    uint16_t* dst = reinterpret_cast<uint16_t*>(p.o) + batch * p.o_batch_stride + head * p.o_head_stride +
                    static_cast<long long>(qrow) * p.o_row_stride + lane * kCols;
#pragma unroll
    for (int c = 0; c < kCols; c += 2)
        *reinterpret_cast<uint32_t*>(dst + c) = flash_common::pack2<kBf16>(acc[c] * inv, acc[c + 1] * inv);
}

constexpr int kCombineRowsPerBlock = 4;  // autotune/launch/loader.py: COMBINE_ROWS_PER_BLOCK
constexpr int kCombineThreads = 32 * kCombineRowsPerBlock;
constexpr int kMaxSplits = 32;           // one lane of a warp per split

template <int kSplits, int kHeadDim, bool kBf16>
__device__ __forceinline__ void combine(const FlashFwdParams& p) {
    static_assert(kSplits >= 2 && kSplits <= kMaxSplits, "kv_splits_range: the combine merges 2 to 32 splits");
    static_assert(kHeadDim % 64 == 0, "head_dim: the combine gives each lane kHeadDim / 32 (even) columns");
    constexpr int kColsPerLane = kHeadDim / 32;
    wait_for_splits();
    const long long rows = static_cast<long long>(p.batch) * p.heads * p.seqlen_q;
    const long long row = static_cast<long long>(blockIdx.x) * kCombineRowsPerBlock + threadIdx.x / 32;
    if (row >= rows) return;
    const int lane = threadIdx.x % 32;
    const float lse_s = lane < kSplits ? p.lse_partial[lane * rows + row] : -CUDART_INF_F;
    float mx = lse_s;
#pragma unroll
    for (int off = 16; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, off));
    const float w = lse_s == -CUDART_INF_F ? 0.f : __expf(lse_s - mx);
    float sum = w;
#pragma unroll
    for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffff, sum, off);
    float acc[kColsPerLane];
#pragma unroll
    for (int c = 0; c < kColsPerLane; ++c) acc[c] = 0.f;
#pragma unroll
    for (int s = 0; s < kSplits; ++s) {
        const float ws = __shfl_sync(0xffffffff, w, s);
        if (ws == 0.f) continue;
        add_weighted(acc, p.o_partial + (s * rows + row) * kHeadDim + lane * kColsPerLane, ws);
    }
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    const int qrow = static_cast<int>(row % p.seqlen_q);
    const long long bh = row / p.seqlen_q;
    store_o_row<kColsPerLane, kBf16>(p, static_cast<int>(bh / p.heads), static_cast<int>(bh % p.heads), qrow, lane,
                                     acc, inv);
    if (p.lse != nullptr && lane == 0) p.lse[row] = sum > 0.f ? mx + __logf(sum) : -CUDART_INF_F;
}

}  // namespace split_kv
