// TMA streaming probe (benchmarks/tma_stream_probe.py): the wgmma family's K/V producer with the attention taken
// out, to find how fast one producer thread per CTA can stream a decode cache from DRAM as a function of the ring
// (key rows per tile, stages), CTAs per SM, splits of each (batch, K/V head), and how long the consumer holds a slot.
//
// Warpgroup 0, thread 0: for each key tile, waits for the slot to be empty, then loads K and V of the tile as
// 64-column boxes (two per 128-column row, as flash_fwd.cu does) onto the slot's full barrier. Warpgroup 1 (the
// consumer stand-in): waits for the slot to be full, spins SPIN_CYCLES (what S = Q·Kᵀ, the softmax and P·V take in
// the real kernel), and gives the slot back (lane 0 of each warp arrives, as the real consumers do).
// Tensor maps: rank 4, (head_dim, seqlen, kv_heads, batch), box (64, BC, 1, 1), 128B swizzle (autotune/launch/tma.py).
// Grid: batch × kv_heads × SPLITS CTAs; block 256; dynamic smem 1024 + 2 × STAGES × BC × 256 + 16 × STAGES bytes.
#include <cuda.h>
#include <stdint.h>

#include "../../kernels/sm90/ptx.cuh"

#if !defined(BC) || !defined(STAGES) || !defined(SPLITS) || !defined(SPIN_CYCLES) || !defined(MIN_BLOCKS)
#error "tma_stream: build through benchmarks/tma_stream_probe.py (BC, STAGES, SPLITS, SPIN_CYCLES, MIN_BLOCKS)"
#endif

using namespace sm90;

struct ProbeParams {
    int seqlen_k, kv_heads;
    unsigned long long* sink;  // the consumers' clock count: keeps the spin from being compiled away
};

constexpr int kHeadDim = 128;
constexpr int kChunkCols = 64;
constexpr int kChunkBytes = BC * kChunkCols * 2;
constexpr int kTileBytes = BC * kHeadDim * 2;

extern "C" __global__ void __launch_bounds__(256, MIN_BLOCKS)
    tma_stream(const __grid_constant__ ProbeParams p, const __grid_constant__ CUtensorMap tm_k,
               const __grid_constant__ CUtensorMap tm_v) {
    extern __shared__ uint8_t smem_raw[];
    const uint32_t k_smem = (smem_u32(smem_raw) + 1023) & ~1023u;
    const uint32_t v_smem = k_smem + STAGES * kTileBytes;
    const uint32_t bars = v_smem + STAGES * kTileBytes;  // full(s) = bars + 8 s, empty(s) = bars + 8 (STAGES + s)

    const int split = blockIdx.x % SPLITS;
    const int unit = blockIdx.x / SPLITS;
    const int kv_head = unit % p.kv_heads, batch = unit / p.kv_heads;
    const int n_tiles = (p.seqlen_k + BC - 1) / BC;
    const int per_split = (n_tiles + SPLITS - 1) / SPLITS;
    const int n_begin = split * per_split, n_end = min(n_tiles, n_begin + per_split);

    if (threadIdx.x == 0) {
        prefetch_tensormap(&tm_k);
        prefetch_tensormap(&tm_v);
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(bars + 8 * s, 1);
            mbar_init(bars + 8 * (STAGES + s), 4);
        }
        fence_barrier_init();
    }
    __syncthreads();

    int stage = 0;
    uint32_t phase = 0;
    if (threadIdx.x < 128) {
        if (threadIdx.x == 0) {
            for (int n = n_begin; n < n_end; ++n) {
                mbar_wait(bars + 8 * (STAGES + stage), phase ^ 1);
                mbar_arrive_expect_tx(bars + 8 * stage, 2 * kTileBytes);
#pragma unroll
                for (int c = 0; c < kHeadDim / kChunkCols; ++c)
                    tma_load_4d(k_smem + stage * kTileBytes + c * kChunkBytes, &tm_k, c * kChunkCols, n * BC, kv_head,
                                batch, bars + 8 * stage);
#pragma unroll
                for (int c = 0; c < kHeadDim / kChunkCols; ++c)
                    tma_load_4d(v_smem + stage * kTileBytes + c * kChunkBytes, &tm_v, c * kChunkCols, n * BC, kv_head,
                                batch, bars + 8 * stage);
                if (++stage == STAGES) {
                    stage = 0;
                    phase ^= 1;
                }
            }
        }
    } else {
        unsigned long long spun = 0;
        for (int n = n_begin; n < n_end; ++n) {
            mbar_wait(bars + 8 * stage, phase);
            if constexpr (SPIN_CYCLES > 0) {
                const long long t0 = clock64();
                long long t = t0;
                while (t - t0 < SPIN_CYCLES) t = clock64();
                spun += static_cast<unsigned long long>(t - t0);
            }
            __syncwarp();
            if (threadIdx.x % 32 == 0) mbar_arrive(bars + 8 * (STAGES + stage));
            if (++stage == STAGES) {
                stage = 0;
                phase ^= 1;
            }
        }
        if (threadIdx.x == 128 && spun == 1) *p.sink = spun;  // never true in practice; the compiler cannot know
    }
}
