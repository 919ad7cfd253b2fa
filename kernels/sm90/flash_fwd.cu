// FlashAttention forward, Hopper-native family "wgmma" (sm_90a).
//
// A tile is (kBr query rows, head, batch); a CTA works on one tile, or under the persistent scheduler on a strided
// sequence of them (for_each_tile). Warpgroup 0 is the producer: one thread issues TMA copies of the Q tile (once
// per tile) and of K/V tiles into a kStages-deep shared-memory ring, completing on mbarriers (K full, V full,
// K empty, V empty per stage: in the two-stage overlapped loop a slot's K goes back as soon as S = Q·Kᵀ has read
// it and its V after P·V, elsewhere both after P·V; traits.cuh kKVReleaseSplit). Consumer warpgroups
// 1..kConsumerWGs each own 64 query rows and run
//   S = Q·Kᵀ       wgmma m64n{Bc}k16, A and B from 128B-swizzled shared memory (K-major)
//   online softmax in registers (exp2 with the scale folded in)
//   O += P·V       wgmma m64n{D}k16, A = P from registers, B = V from shared memory read N-major (trans-b)
// then normalise and store O (and the fp32 logsumexp if requested).
//
// Entry (extra by-value arguments after the parameter block, see docs/CONTRACTS.md):
//   flash_fwd_wgmma(FlashFwdParams p, CUtensorMap tm_q, CUtensorMap tm_k, CUtensorMap tm_v)
// Tensor maps (autotune/tma.py): rank 4, dims (head_dim, seqlen, heads, batch) with the tensors' real strides,
// box (64, rows, 1, 1) with rows = 64 for Q and Bc for K/V, 128-byte swizzle, zero fill out of bounds.
// Launch (space.Layout.grid): scheduler grid: (ceil(seqlen_q / kBr), heads, batch); lpt: (tiles, 1, 1); persistent:
// (min(tiles, SMs × resident CTAs per SM), 1, 1). Block kThreads, dynamic smem kSmemDynamic.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math_constants.h>
#include <stdint.h>

#include "../common/flash_params.h"
#include "../common/pack.cuh"
#include "../common/seqused.cuh"
#include "../common/split_combine.cuh"
#include "ptx.cuh"
#include "tail_plan.h"
#include "traits.cuh"
#include "wgmma_ops.cuh"

namespace sm90 {

using Mma = Wgmma<kBc, kBf16>;       // S = Q·Kᵀ
using MmaPV = Wgmma<kHeadDim, kBf16>;  // O += P·V

constexpr int kSRegs = kBc / 2;        // S accumulator floats per thread
constexpr int kORegs = kHeadDim / 2;   // O accumulator floats per thread
constexpr int kPRegs = kBc / 4;        // P as f16x2/bf16x2 A fragments
constexpr uint32_t kPingPongThreads = 256;
constexpr uint32_t kPingPongBarrier0 = 1;  // named barrier ids 1, 2 (0 is __syncthreads)
constexpr uint32_t kOStoreBarrier0 = 3;    // ids 3 .. 3 + kConsumerWGs - 1: one per consumer warpgroup
constexpr int kORowBytes = kHeadDim * kElemBytes;

__device__ __forceinline__ uint32_t pack2(float lo, float hi) { return flash_common::pack2<kBf16>(lo, hi); }

struct Smem {
    uint32_t q, k, v;  // shared-window addresses, 1024-byte aligned
    uint32_t bars;     // kNumBarriers × 8 bytes
    __device__ uint32_t q_slot(uint32_t b) const { return q + b * kQBytes; }
    __device__ uint32_t q_full(uint32_t b) const { return bars + 8 * b; }
    __device__ uint32_t k_full(int s) const { return bars + 8 * (kQBuffers + s); }
    __device__ uint32_t v_full(int s) const { return bars + 8 * (kQBuffers + kStages + s); }
    __device__ uint32_t k_empty(int s) const { return bars + 8 * (kQBuffers + 2 * kStages + s); }
    __device__ uint32_t v_empty(int s) const { return bars + 8 * (kQBuffers + 3 * kStages + s); }
    __device__ uint32_t q_empty(uint32_t b) const { return bars + 8 * (kQBuffers + 4 * kStages + b); }  // persistent
    // kTileCounter: the index of the tile whose Q slot b holds (written by the producer before Q's load, read by the
    // consumers after Q's full barrier), or a value past the last tile when the CTA is done
    __device__ uint32_t tile_word(uint32_t b) const { return bars + 8 * (kNumBarriers + b); }
    __device__ uint32_t k_tile(int s) const { return k + s * kKVTileBytes; }
    __device__ uint32_t v_tile(int s) const { return v + s * kKVTileBytes; }
};

// Packed GQA: G query heads per K/V head share a tile, so a warpgroup's 64 rows hold 64 / G query rows of G heads.
__device__ __forceinline__ int group_size(const FlashFwdParams& p) { return kPackGqa ? p.heads / p.kv_heads : 1; }
__device__ __forceinline__ int query_rows_per_wg(const FlashFwdParams& p) {
    return kPackGqa ? kRowsPerWG / group_size(p) : kRowsPerWG;
}

// This batch row's key count and causal offset (kernels/common/seqused.cuh says why they are read at each use).
__device__ __forceinline__ int keys_of(const FlashFwdParams& p, int batch) {
    return flash_common::used_seqlen_k<kSeqUsedK>(p, batch);
}
__device__ __forceinline__ int causal_offset_of(const FlashFwdParams& p, int batch) {
    return flash_common::used_causal_offset<kSeqUsedK>(p, batch);
}

// Query rows [m0, m0 + rows) need key tiles [0, n_tiles): all of them, or under causal masking (row i sees keys
// j <= i + causal_offset) only those up to the last row that exists. At least one: a block whose rows see no key at
// all (lower-right alignment with more queries than keys) runs one fully masked tile, which yields O = 0 and
// lse = -inf exactly as a row with every score masked does. seqused_k builds count the keys batch row `batch` uses
// (so does a row that uses none: its one tile is all masked, and consume clears its V).
__device__ __forceinline__ int num_kv_tiles(const FlashFwdParams& p, int m0, int batch) {
    const int seqlen_k = keys_of(p, batch);
    int kv_end = seqlen_k;
    if constexpr (kCausal)
        kv_end = min(kv_end, min(m0 + kConsumerWGs * query_rows_per_wg(p), p.seqlen_q) +
                                 causal_offset_of(p, batch));
    return kv_end > 0 ? (kv_end + kBc - 1) / kBc : 1;
}

// ---- tile order ----------------------------------------------------------------------------------------------------
// lpt and persistent number the tiles t = 0 .. tiles-1 in sections of `group` consecutive (batch, head) pairs whose
// K and V fit together in kL2SectionBytes of L2 (a whole number of GQA groups, so a K/V head is never split between
// sections). Causal: a section runs query block by query block, all its heads side by side, the last query block
// (the one with the most key tiles) first. Non-causal: head by head, all query blocks of one head consecutive, as
// the grid order runs them: the ~132 tiles in flight then share the K/V of ~132 / num_m heads (d128 N4096: 4 heads,
// 8 MB) instead of one query block of every head of a 32 MB section (16 heads, each K/V line read by a quarter as
// many CTAs at a time), which cost lpt and persistent 4-10 % against grid. space/wgmma.py: tile_order mirrors this.

struct Tile {
    int m_block, head, batch;
};

struct TileOrder {
    int num_m, group, tiles;
};

__device__ __forceinline__ TileOrder tile_order(const FlashFwdParams& p) {
    TileOrder o;
    o.num_m = (p.seqlen_q + kBr - 1) / kBr;
    const long long kv_head_bytes = 2ll * p.seqlen_k * kHeadDim * kElemBytes;
    const long long kv_heads_fit = kL2SectionBytes / kv_head_bytes;
    const int pairs = p.batch * p.heads;
    const long long group = (kv_heads_fit < 1 ? 1 : kv_heads_fit) * (p.heads / p.kv_heads);
    o.group = group < pairs ? static_cast<int>(group) : pairs;
    o.tiles = o.num_m * pairs;
    return o;
}

__device__ __forceinline__ Tile tile_at(const FlashFwdParams& p, const TileOrder& o, int t) {
    const int per_section = o.group * o.num_m;
    const int section = t / per_section;
    const int r = t - section * per_section;
    const int first = section * o.group;
    int mb, pair;
    if constexpr (kCausal) {
        const int heads_here = min(o.group, p.batch * p.heads - first);  // the last section may be short
        mb = r / heads_here;
        pair = first + (r - mb * heads_here);
    } else {
        const int k = r / o.num_m;
        mb = r - k * o.num_m;
        pair = first + k;
    }
    Tile tile;
    tile.batch = pair / p.heads;
    tile.head = pair - tile.batch * p.heads;
    tile.m_block = kCausal ? o.num_m - 1 - mb : mb;
    return tile;
}

// Persistent CTAs walk the tiles in rounds of gridDim.x: in round k CTA i takes tile k·gridDim.x + (i + k) mod
// gridDim.x, so every round is one contiguous stretch of the order (the K/V reuse the order was made for) and a CTA's
// place in the round turns by one each round. A plain stride (tile i + k·gridDim.x) gave CTA i the same query block
// of every head whenever gridDim.x is a multiple of num_m (132 SMs, num_m 3, 4, 22, ...): the CTAs holding a short
// last block (the ViT's N577 with Br 192: 1 row) finished early, ran ahead through the heads and read their K/V a
// second time from DRAM (ncu: 1.5× the bytes), while the rest did all the long blocks. space/wgmma.py:
// persistent_tiles is the twin. Causal builds take their tiles from the counter instead (kTileCounter; below).

// Which Q slot a tile uses and the parity of its Q barriers, from the count of tiles the CTA has done (mod 2 with one
// slot, mod 4 with two: slots alternate, and each slot's barriers flip every second tile).
constexpr uint32_t kQSeqMask = kQBuffers == 2 ? 3u : 1u;
__device__ __forceinline__ uint32_t q_slot_of(uint32_t q_seq) { return kQBuffers == 2 ? (q_seq & 1) : 0u; }
__device__ __forceinline__ uint32_t q_parity_of(uint32_t q_seq) { return kQBuffers == 2 ? (q_seq >> 1) & 1 : q_seq & 1; }

// A persistent CTA's place in its sequence, in one register: tile << kLow | Q sequence (tiles done mod 2, or mod 4
// with two Q slots). The host keeps tiles + 2 CTAs below 2^30 (autotune.loader: tiles up to 2^29); with two Q slots
// the tile has one bit less, so for_each_tile traps above 2^29.
struct Cursor {
    static constexpr int kLow = kQBuffers == 2 ? 2 : 1;
    uint32_t bits;
    __device__ int tile() const { return static_cast<int>(bits >> kLow); }
    __device__ uint32_t q_seq() const { return bits & kQSeqMask; }
    // The next tile, this CTA's of the next round: tile u = k·ctas + r with r = (cta + k) mod ctas is followed by
    // (k + 1)·ctas + (r + 1) mod ctas; and one more tile done.
    __device__ void next(uint32_t ctas) {
        const uint32_t u = bits >> kLow;
        const uint32_t r = u % ctas;
        bits = (u - r + ctas + (r + 1 == ctas ? 0u : r + 1)) << kLow | ((bits + 1) & kQSeqMask);
    }
};

// Persistent: run(tile, its first query row, its Q sequence, its index in the order, key tiles [begin, end), partial
// slot or -1) for each tile of this CTA's share (and kTailSplit: each piece of a cut tile, tail_pieces). Only the
// cursor (and the caller's ring) is carried from tile to tile: the order is recomputed from the parameters (constant
// bank) each time, which keeps the consumers' loop-carried registers at what one tile needs
// (d256 is at its budget: one more live register across consume() spills there).
//
// kTileCounter (causal): the producer takes blockIdx.x first, then gridDim.x + atomicAdd(tile_counter, 1) once it
// has issued each tile's last loads, so a CTA that finishes early takes the next tile of the order (the longest
// left first) and the CTAs run out of work within about one short tile of each other. It writes each tile's index
// into the word of the tile's Q slot before Q's load arrives on the slot's full barrier (an mbarrier arrive
// releases, the consumers' wait acquires), and past the last tile it writes an index >= tiles with a plain arrive
// (no Q): the consumers, which read their tiles from those words, stop there. (consume() waits on the same full
// barrier again: the phase is complete, so that wait returns at once.)
// kTailSplit: the last round's cut, as the loader chose it for this grid (p.tail_full_end, p.tail_ctas; tail_plan.h:
// the shares, the pieces and their slots). Non-causal tiles all have ceil(seqlen_k / Bc) key tiles. The kernel does
// not decide the cut itself: asked at every tile of the full rounds' loop, the decision's 64-bit arithmetic made
// ptxas spill 4-40 B there.
__device__ __forceinline__ tail_split::Plan tail_plan(const FlashFwdParams& p, int tiles) {
    return tail_split::make_plan(tiles, p.tail_full_end, p.tail_ctas, (p.seqlen_k + kBc - 1) / kBc);
}

// kTailSplit, after the full rounds: this CTA's pieces of the cut tiles (none where the plan does not cut: the full
// rounds' loop then ran the last round too). run(tile, its first query row, its Q sequence, its index in the order,
// first key tile, key tile end, partial slot): the slot is -1 for a whole tile, whose O is final; a piece of a cut
// tile writes fp32 partials to its slot.
template <class Run>
__device__ __forceinline__ void tail_pieces(const FlashFwdParams& p, uint32_t q_seq, Run&& run) {
    // One register carried from piece to piece (which piece, and the Q sequence), the rest recomputed from the
    // parameters, as for_each_tile does: the share's bounds carried across consume() spilled 12 B at 128 registers.
    // (Running an uncut last round here too, rather than in the full rounds' loop, spilled 40 B there: this copy of
    // consume() then needs both epilogues, the partials' and O's.)
    if (p.tail_ctas == 0) return;
    const int i = static_cast<int>(blockIdx.x);
#pragma unroll 1
    for (uint32_t bits = q_seq; bits < 8u; bits = ((bits & 4u) + 4u) | ((bits + 1) & kQSeqMask)) {
        const int k = static_cast<int>(bits >> 2);
        const TileOrder order = tile_order(p);
        const tail_split::Plan t = tail_plan(p, order.tiles);
        tail_split::Piece piece;
        if (!tail_split::piece(t, i, k, piece)) return;
        const Tile work = tile_at(p, order, t.full_end + piece.tile);
        run(work, work.m_block * kBr, bits & kQSeqMask, t.full_end + piece.tile, piece.n_begin, piece.n_end,
            2 * i + k);
    }
}

template <class Run>
__device__ __forceinline__ void for_each_tile(const FlashFwdParams& p, Run&& run) {
    if constexpr (kQBuffers == 2) {
        // the Cursor's tile field (above): the last tile it computes is below tiles + 2 CTAs (Cursor::next)
        if (tile_order(p).tiles + 2 * gridDim.x >= (1u << 29)) __trap();
    }
    Cursor c{blockIdx.x << Cursor::kLow};
    for (;;) {
        const TileOrder order = tile_order(p);
        // kTailSplit: the full rounds, and the last one too unless the plan cuts it (tail_pieces runs its pieces)
        const int end = kTailSplit && p.tail_ctas > 0 ? p.tail_full_end : order.tiles;
        if (c.tile() >= end) break;
        const Tile work = tile_at(p, order, c.tile());
        const int work_m0 = work.m_block * kBr;
        run(work, work_m0, c.q_seq(), c.tile(), 0, num_kv_tiles(p, work_m0, work.batch), -1);
        c.next(gridDim.x);
    }
    if constexpr (kTailSplit) tail_pieces(p, c.q_seq(), run);
}

template <class Run>
__device__ __forceinline__ void producer_tiles(const FlashFwdParams& p, const Smem& sm, Run&& run) {
    if constexpr (kTileCounter) {
        uint32_t q_seq = 0;
        for (int t = static_cast<int>(blockIdx.x);; q_seq = (q_seq + 1) & kQSeqMask) {
            const TileOrder order = tile_order(p);
            if (t >= order.tiles) {
                const uint32_t slot = q_slot_of(q_seq);
                mbar_wait(sm.q_empty(slot), q_parity_of(q_seq) ^ 1);
                st_shared_u32(sm.tile_word(slot), static_cast<uint32_t>(t));
                mbar_arrive(sm.q_full(slot));
                return;
            }
            const Tile work = tile_at(p, order, t);
            const int work_m0 = work.m_block * kBr;
            run(work, work_m0, q_seq, t, 0, num_kv_tiles(p, work_m0, work.batch), -1);
            // claimed only now, with this tile's loads all issued (about `stages` key tiles before the CTA frees
            // up): claimed as the tile started, every CTA held the next tile for a whole tile ahead, long ones too,
            // and the tail grew instead of shrinking (H100, B4 H16 N4096 causal: 450 us against the pairs' 438)
            t = static_cast<int>(gridDim.x) + atomicAdd(p.tile_counter, 1);
        }
    } else {
        for_each_tile(p, run);
    }
}

template <class Run>
__device__ __forceinline__ void consumer_tiles(const FlashFwdParams& p, const Smem& sm, Run&& run) {
    if constexpr (kTileCounter) {
        for (uint32_t q_seq = 0;; q_seq = (q_seq + 1) & kQSeqMask) {
            const uint32_t slot = q_slot_of(q_seq);
            mbar_wait(sm.q_full(slot), q_parity_of(q_seq));
            const int t = static_cast<int>(ld_shared_u32(sm.tile_word(slot)));
            const TileOrder order = tile_order(p);
            if (t >= order.tiles) return;
            const Tile work = tile_at(p, order, t);
            const int work_m0 = work.m_block * kBr;
            run(work, work_m0, q_seq, t, 0, num_kv_tiles(p, work_m0, work.batch), -1);
        }
    } else {
        for_each_tile(p, run);
    }
}

// ---- producer ------------------------------------------------------------------------------------------------------

__device__ __forceinline__ void load_q(const Smem& sm, uint32_t slot, const CUtensorMap* tm_q, int m0, int head,
                                       int batch, int index = 0) {
    if constexpr (kTileCounter) st_shared_u32(sm.tile_word(slot), static_cast<uint32_t>(index));  // before the arrive
    mbar_arrive_expect_tx(sm.q_full(slot), kQBytes);
#pragma unroll
    for (int wg = 0; wg < kConsumerWGs; ++wg)
#pragma unroll
        for (int c = 0; c < kDChunks; ++c)
            tma_load_4d(sm.q_slot(slot) + wg * kQWGBytes + c * (kRowsPerWG * kChunkRowBytes), tm_q, c * kSwizzleCols,
                        m0 + wg * kRowsPerWG, head, batch, sm.q_full(slot));
}

// The K/V ring's position (slot and mbarrier parity); persistent CTAs carry it from one tile to the next.
struct Ring {
    int stage = 0;
    uint32_t phase = 0;
    __device__ void advance() {
        if (++stage == kStages) {
            stage = 0;
            phase ^= 1;
        }
    }
};

// One tile's loads (q_seq: this tile's place in the CTA's Q sequence, persistent only: q_slot_of/q_parity_of).
// Persistent with one Q slot: K/V(0) go first, into slots the previous tile's last P·V frees, then Q waits for the
// consumers to release the Q slot (after the previous tile's epilogue, which may stage O in it). With two Q slots Q
// goes first: its slot was released by the tile before the previous one, normally long ago.
__device__ __forceinline__ void produce(const FlashFwdParams& p, const Smem& sm, const CUtensorMap* tm_q,
                                        const CUtensorMap* tm_k, const CUtensorMap* tm_v, int m0, int head,
                                        int kv_head, int batch, int n_begin, int n_end, Ring& ring, uint32_t q_seq,
                                        int index = 0) {
    const uint32_t q_slot = q_slot_of(q_seq);
    if constexpr (!kPersistent && !kPackGqa) load_q(sm, q_slot, tm_q, m0, head, batch);
    if constexpr (kPersistent && kQBuffers == 2) {
        mbar_wait(sm.q_empty(q_slot), q_parity_of(q_seq) ^ 1);
        load_q(sm, q_slot, tm_q, m0, head, batch, index);
    }

    int& stage = ring.stage;
    uint32_t& phase = ring.phase;
    for (int n = n_begin; n < n_end; ++n) {
        mbar_wait(kKVReleaseSplit ? sm.k_empty(stage) : sm.v_empty(stage), phase ^ 1);
        mbar_arrive_expect_tx(sm.k_full(stage), kKVTileBytes);
#pragma unroll
        for (int c = 0; c < kDChunks; ++c)
            tma_load_4d(sm.k_tile(stage) + c * kKVChunkBytes, tm_k, c * kSwizzleCols, n * kBc, kv_head, batch,
                        sm.k_full(stage));
        if constexpr (kKVReleaseSplit) mbar_wait(sm.v_empty(stage), phase ^ 1);
        mbar_arrive_expect_tx(sm.v_full(stage), kKVTileBytes);
#pragma unroll
        for (int c = 0; c < kDChunks; ++c)
            tma_load_4d(sm.v_tile(stage) + c * kKVChunkBytes, tm_v, c * kSwizzleCols, n * kBc, kv_head, batch,
                        sm.v_full(stage));
        if constexpr (kPersistent && kQBuffers == 1) {
            if (n == n_begin) {
                mbar_wait(sm.q_empty(q_slot), q_parity_of(q_seq) ^ 1);
                load_q(sm, q_slot, tm_q, m0, head, batch, index);
            }
        }
        ring.advance();
    }
}

// ---- consumer pieces -------------------------------------------------------------------------------------------------

// S = Q·Kᵀ over head_dim in k16 steps. Within a 128-byte swizzle atom a k-step advances the start address by
// 32 bytes (the hardware applies the swizzle to the final address); every 64 columns moves to the next chunk.
// The descriptors' low words are formed once per call and stepped by constants (ptx.cuh: desc_lo).
__device__ __forceinline__ void issue_qk(float (&s)[kSRegs], uint32_t q_addr, uint32_t k_addr) {
    const uint32_t a0 = desc_lo(q_addr, 16), b0 = desc_lo(k_addr, 16);
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        const uint32_t off = (kk % 4) * 32;
        const uint64_t a = desc_make(a0 + (((kk / 4) * (kRowsPerWG * kChunkRowBytes) + off) >> 4), desc_hi(1024));
        const uint64_t b = desc_make(b0 + (((kk / 4) * kKVChunkBytes + off) >> 4), desc_hi(1024));
        Mma::ss(s, a, b, kk > 0 ? 1u : 0u);
    }
}

// O += P·V over the Bc keys in k16 steps. V sits in shared memory as [chunk of 64 head_dim columns][key][64],
// i.e. N-major for this product: LBO steps between the 64-column chunks, SBO between groups of 8 keys, and a
// k-step moves 16 keys = 2048 bytes.
__device__ __forceinline__ void issue_pv(float (&o)[kORegs], const uint32_t (&pf)[kPRegs], uint32_t v_addr) {
    const uint32_t b0 = desc_lo(v_addr, kKVChunkBytes);
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) {
        const uint64_t b = desc_make(b0 + ((kk * 16 * kChunkRowBytes) >> 4), desc_hi(1024));
        MmaPV::rs<1>(o, &pf[4 * kk], b, 1u);
    }
}

// Exponential v of a thread's row in a tile (0 <= v < Bc/4): on the FMA pipe for every kExp2FmaEvery-th of an
// unmasked tile (a masked one has -inf scores, which exp2_fma does not take), else MUFU.EX2. v is a compile-time
// index in the unrolled loops, so the choice costs nothing.
template <bool kMask>
__device__ __forceinline__ float exp2_of_p(int v, float x) {
    if (!kMask && kExp2FmaEvery > 0 && v % kExp2FmaEvery == kExp2FmaEvery - 1) return exp2_fma(x);
    return fast_exp2(x);
}

// The accumulator of m64nNk16 gives each thread rows r and r + 8 of its warp's 16 (r = lane / 4) and, for each
// 8-column block j, columns 8j + 2·(lane % 4) + {0, 1}: s[4j + 2h + e] is row r + 8h, that column + e.
// Updates the running max m (log2 units, scale folded) and the thread's partial row sums l, turns s into
// probabilities in place, and returns the factor by which O accumulated so far must shrink.
// diag0, diag1: the last key each of the thread's two rows may see (causal: query row + causal_offset).
template <bool kMask>
__device__ __forceinline__ void softmax_tile(float (&s)[kSRegs], float (&m)[2], float (&l)[2], float (&corr)[2],
                                             float scale_log2, int diag0, int diag1, int col0, int seqlen_k) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        int col_limit = seqlen_k;
        if constexpr (kCausal) col_limit = min(col_limit, (h == 0 ? diag0 : diag1) + 1);
        float mx = -CUDART_INF_F;
#pragma unroll
        for (int j = 0; j < kBc / 8; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float& x = s[4 * j + 2 * h + e];
                if constexpr (kMask) {
                    if (col0 + 8 * j + 2 * (lane % 4) + e >= col_limit) x = -CUDART_INF_F;
                }
                mx = fmaxf(mx, x);
            }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
        const float m_new = fmaxf(m[h], mx * scale_log2);
        // A row with every score masked so far keeps m = -inf; subtract 0 then so -inf - -inf never makes NaN.
        const float base = m_new == -CUDART_INF_F ? 0.f : m_new;
        corr[h] = fast_exp2(m[h] - base);
        m[h] = m_new;
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < kBc / 8; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float& x = s[4 * j + 2 * h + e];
                x = exp2_of_p<kMask>(2 * j + e, fmaf(x, scale_log2, -base));
                sum += x;
            }
        l[h] = l[h] * corr[h] + sum;
    }
}

__device__ __forceinline__ void scale_o(float (&o)[kORegs], const float (&corr)[2]) {
#pragma unroll
    for (int j = 0; j < kHeadDim / 8; ++j) {
        o[4 * j + 0] *= corr[0];
        o[4 * j + 1] *= corr[0];
        o[4 * j + 2] *= corr[1];
        o[4 * j + 3] *= corr[1];
    }
}

// Skipped, exactly, when no row of the warp got a new maximum (every factor is then 1): after the first few key
// tiles that is most tiles, and it saves D/2 FMULs per thread (a quarter of a d256 tile's instructions).
__device__ __forceinline__ void rescale_o(float (&o)[kORegs], const float (&corr)[2]) {
    if (__all_sync(0xffffffff, corr[0] == 1.f && corr[1] == 1.f)) return;
    scale_o(o, corr);
}

// P's accumulator layout equals the m64nNk16 A-fragment layout once packed pairwise: k-step kk takes the two
// 8-column blocks 2kk, 2kk + 1, i.e. s[8kk .. 8kk + 7] in order.
__device__ __forceinline__ void convert_p(const float (&s)[kSRegs], uint32_t (&pf)[kPRegs]) {
#pragma unroll
    for (int i = 0; i < kPRegs; ++i) pf[i] = pack2(s[2 * i], s[2 * i + 1]);
}

// Tiles that can hold a masked score for this warpgroup's rows: past seqlen_k, or crossing the causal diagonal
// (wg_diag: the diagonal of the warpgroup's first query row, query row + causal_offset).
__device__ __forceinline__ bool tile_needs_mask(int n, int wg_diag, int seqlen_k) {
    const int col_end = (n + 1) * kBc;
    return col_end > seqlen_k || (kCausal && col_end - 1 > wg_diag);
}

// The first key tile that tile_needs_mask calls masked (every later one is too: both of its tests grow with n).
__device__ __forceinline__ int first_masked_tile(int wg_diag, int seqlen_k) {
    const int past_keys = seqlen_k / kBc;  // tiles n < this end at or before seqlen_k
    if constexpr (kCausal) return min(past_keys, max(wg_diag + 1, 0) / kBc);  // and n < this end at or before the diagonal
    return past_keys;
}

template <bool kValue>
struct MaskTag {
    static constexpr bool value = kValue;
};

// Key tiles [n_from, n_end) as two loops split at the first masked tile: iterate(n, MaskTag<false>{}) before it,
// iterate(n, MaskTag<true>{}) from it on, so the unmasked loop has no per-tile mask test (FlashAttention-4's layout).
template <class Iterate>
__device__ __forceinline__ void peeled_key_tiles(int n_from, int n_end, int first_masked, Iterate&& iterate) {
    const int n_mid = min(n_end, first_masked);
    int n = n_from;
    for (; n < n_mid; ++n) iterate(n, MaskTag<false>{});
    for (; n < n_end; ++n) iterate(n, MaskTag<true>{});
}

// softmax_reduce=tree: the same online softmax with the row reductions cut into kReduceParts independent partial
// maxima and sums per row, both rows side by side. The chain above is one dependent FMNMX per score and one
// dependent FADD per probability, row after row: ptxas cannot reorder a chain of float adds (and does not reassociate
// max), so the first row's Bc/4 maxima issue one per FMNMX latency with nothing beside them, the `wait` stall that
// ncu shows ours at twice cuDNN's on the short rows (docs/benchmarks.md). Here each row's chains are Bc/16 long and
// the two rows' shuffles overlap. The maxima are exactly the chain's; the row sums are the same terms added in
// another order (a rounding difference of a few ulp of fp32).
constexpr int kReduceParts = 4;  // the combines below take exactly four
static_assert((kBc / 4) % kReduceParts == 0, "a row's Bc/4 scores per thread split into kReduceParts partials");

template <bool kMask>
__device__ __forceinline__ void softmax_tile_tree(float (&s)[kSRegs], float (&m)[2], float (&l)[2], float (&corr)[2],
                                                  float scale_log2, int diag0, int diag1, int col0, int seqlen_k) {
    const int lane = threadIdx.x % 32;
    // value v = 2j + e of row h is s[4j + 2h + e] (the accumulator layout above); partial v % kReduceParts
    if constexpr (kMask) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            int col_limit = seqlen_k;
            if constexpr (kCausal) col_limit = min(col_limit, (h == 0 ? diag0 : diag1) + 1);
#pragma unroll
            for (int j = 0; j < kBc / 8; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    if (col0 + 8 * j + 2 * (lane % 4) + e >= col_limit) s[4 * j + 2 * h + e] = -CUDART_INF_F;
        }
    }
    float part[2][kReduceParts];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int v = 0; v < kReduceParts; ++v) part[h][v] = s[4 * (v / 2) + 2 * h + v % 2];
#pragma unroll
    for (int v = kReduceParts; v < kBc / 4; ++v)
#pragma unroll
        for (int h = 0; h < 2; ++h)
            part[h][v % kReduceParts] = fmaxf(part[h][v % kReduceParts], s[4 * (v / 2) + 2 * h + v % 2]);
    float mx[2], base[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) mx[h] = fmaxf(fmaxf(part[h][0], part[h][1]), fmaxf(part[h][2], part[h][3]));
#pragma unroll
    for (int h = 0; h < 2; ++h) mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffff, mx[h], 1));
#pragma unroll
    for (int h = 0; h < 2; ++h) mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffff, mx[h], 2));
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const float m_new = fmaxf(m[h], mx[h] * scale_log2);
        base[h] = m_new == -CUDART_INF_F ? 0.f : m_new;  // as in softmax_tile: no -inf - -inf
        corr[h] = fast_exp2(m[h] - base[h]);
        m[h] = m_new;
    }
#pragma unroll
    for (int v = 0; v < kBc / 4; ++v)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float& x = s[4 * (v / 2) + 2 * h + v % 2];
            x = exp2_of_p<kMask>(v, fmaf(x, scale_log2, -base[h]));
            if (v < kReduceParts)
                part[h][v] = x;
            else
                part[h][v % kReduceParts] += x;
        }
#pragma unroll
    for (int h = 0; h < 2; ++h)
        l[h] = l[h] * corr[h] + ((part[h][0] + part[h][1]) + (part[h][2] + part[h][3]));
}

__device__ __forceinline__ void softmax_any(bool mask, float (&s)[kSRegs], float (&m)[2], float (&l)[2],
                                            float (&corr)[2], float scale_log2, int diag0, int diag1, int col0,
                                            int seqlen_k) {
    if constexpr (kSoftmaxTree) {
        if (mask)
            softmax_tile_tree<true>(s, m, l, corr, scale_log2, diag0, diag1, col0, seqlen_k);
        else
            softmax_tile_tree<false>(s, m, l, corr, scale_log2, diag0, diag1, col0, seqlen_k);
    } else {
        if (mask)
            softmax_tile<true>(s, m, l, corr, scale_log2, diag0, diag1, col0, seqlen_k);
        else
            softmax_tile<false>(s, m, l, corr, scale_log2, diag0, diag1, col0, seqlen_k);
    }
}

__device__ __forceinline__ void release(uint32_t empty_bar);

// o_rescale=fused: a tile's softmax, then (overlapped loop) the wait for P(n-1)·V(n-1) and its V slot's release, O
// scaled by the corrections unconditionally and P converted, as one straight stretch of code per masking variant.
// ptxas schedules within a basic block: here the FMULs and F2FPs share one with the MUFU.EX2s, which issue one per
// 8 cycles, and fill the slots between them (FlashAttention-4's loop, read in its SASS: docs/benchmarks.md). The
// other orders run them after the exponentials, behind the skipped rescale's vote and branch or the join of the
// masked and unmasked softmax, which adds their issue cycles to every K/V tile.
// kWaitPV: P(n-1)·V(n-1) may still be running (overlapped loop), so O and P wait for it and its V slot is freed;
// kScaleO: false on a tile's first K/V tile (O is still zero).
template <bool kMask, bool kWaitPV, bool kScaleO>
__device__ __forceinline__ void softmax_fused_tile(float (&s)[kSRegs], float (&m)[2], float (&l)[2], float (&corr)[2],
                                                   float (&o)[kORegs], uint32_t (&pf)[kPRegs], float scale_log2,
                                                   int diag0, int diag1, int col0, int seqlen_k, uint32_t v_empty,
                                                   uint32_t k_empty = 0) {
    if constexpr (kSoftmaxTree)
        softmax_tile_tree<kMask>(s, m, l, corr, scale_log2, diag0, diag1, col0, seqlen_k);
    else
        softmax_tile<kMask>(s, m, l, corr, scale_log2, diag0, diag1, col0, seqlen_k);
    if constexpr (kWaitPV) {
        // The K slot's release, here rather than before the softmax: its lane is also predicated on the first row's
        // new sum, true on every thread (a sum of exponentials; a NaN compares false) but not known to ptxas, so the
        // arrive follows that row's exponentials and the wait, which ptxas keeps behind the arrive, follows it too.
        // Without it ptxas hoists the wait (it reads nothing computed here) to the top of the block, and the
        // softmax then waits for P(n-1)·V(n-1) instead of running under it. Hence the rule
        // fused_overlap_needs_split_release (traits.cuh): the joint release has no K arrive to order the wait.
        if (threadIdx.x % 32 == 0 && !(l[0] < 0.f)) mbar_arrive(k_empty);
        wgmma_wait<0>();
        fence_regs(o);
        fence_regs(pf);
        release(v_empty);
    }
    if constexpr (kScaleO) scale_o(o, corr);
    convert_p(s, pf);
}

template <bool kWaitPV, bool kScaleO>
__device__ __forceinline__ void softmax_fused(bool mask, float (&s)[kSRegs], float (&m)[2], float (&l)[2],
                                              float (&corr)[2], float (&o)[kORegs], uint32_t (&pf)[kPRegs],
                                              float scale_log2, int diag0, int diag1, int col0, int seqlen_k,
                                              uint32_t v_empty, uint32_t k_empty = 0) {
    if (mask)
        softmax_fused_tile<true, kWaitPV, kScaleO>(s, m, l, corr, o, pf, scale_log2, diag0, diag1, col0, seqlen_k,
                                                   v_empty, k_empty);
    else
        softmax_fused_tile<false, kWaitPV, kScaleO>(s, m, l, corr, o, pf, scale_log2, diag0, diag1, col0, seqlen_k,
                                                    v_empty, k_empty);
}

// Which query row and head a local row of a warpgroup's tile is (packed GQA: row r is query row r / G of head
// head0 + r % G; else query row r of head0), and whether it exists (packed: only 64 / G · G rows are used).
struct RowOf {
    int qrow, head;
    bool valid;
};
__device__ __forceinline__ RowOf row_of(const FlashFwdParams& p, int wg_q0, int head0, int r) {
    RowOf out;
    if constexpr (kPackGqa) {
        const int g = group_size(p);
        const int qr = kRowsPerWG / g;
        const int i = r / g;
        out.qrow = wg_q0 + i;
        out.head = head0 + (r - i * g);
        out.valid = i < qr && out.qrow < p.seqlen_q;
    } else {
        out.qrow = wg_q0 + r;
        out.head = head0;
        out.valid = out.qrow < p.seqlen_q;
    }
    return out;
}

// Packed GQA: the consumers load their own Q rows (from as many heads as the group has) into the warpgroup's slot in
// the layout a 128B-swizzled TMA box would give (16-byte unit u of row r of a 64-column chunk at u ^ (r % 8)), zeros
// for rows that do not exist; then a proxy fence, since wgmma reads shared memory through the async proxy.
__device__ __forceinline__ void load_q_packed(const FlashFwdParams& p, uint32_t q_addr, int wg_q0, int head0,
                                              int batch, int wg) {
    constexpr int kUnitsPerRow = kHeadDim / 8;
    const uint16_t* q = static_cast<const uint16_t*>(p.q) + batch * p.q_batch_stride;
#pragma unroll 4
    for (int i = threadIdx.x % 128; i < kRowsPerWG * kUnitsPerRow; i += 128) {
        const int r = i / kUnitsPerRow, cu = i - r * kUnitsPerRow;
        const int c = cu / 8, u = cu % 8;
        const RowOf row = row_of(p, wg_q0, head0, r);
        uint4 val = make_uint4(0u, 0u, 0u, 0u);
        if (row.valid)
            val = *reinterpret_cast<const uint4*>(q + row.head * p.q_head_stride +
                                                  static_cast<long long>(row.qrow) * p.q_row_stride + cu * 8);
        st_shared_v4(q_addr + c * (kRowsPerWG * kChunkRowBytes) + r * kChunkRowBytes + ((u ^ (r % 8)) * 16), val);
    }
    fence_proxy_async_shared();
    named_bar_sync(kOStoreBarrier0 + wg, 128);
}

// Ping-pong turns: warpgroup w waits on barrier (1 + w) before issuing its GEMMs and, once issued, lets the other
// one go. A tile's turns are its loop's S(n) + P(n-1)·V(n-1) issues: S(0) and the last P·V are issued outside any
// turn (FlashAttention-4's boundaries), so neither warpgroup waits for the other at the start or the end of a tile;
// a one-key-tile tile, whose loop is empty, takes one turn for its P·V. Both take the same turns, and every turn ends
// with an arrive: warpgroup 1's opening arrive (open(), once per CTA, so warpgroup 0 takes the first turn) and
// warpgroup 0's closing sync (close(), after the CTA's last tile) balance barrier 1, whose last arrive then waits for
// no tile, and no barrier is left half-arrived at exit. (Skipping that last arrive instead, at each tile's end, costs
// the loop a live register and a branch: bc=176 causal spills.)
struct Turns {
    int wg;
    __device__ void open() const {
        if constexpr (kPingPong) {
            if (wg == 1) named_bar_arrive(kPingPongBarrier0, kPingPongThreads);
        }
    }
    __device__ void begin() const {
        if constexpr (kPingPong) named_bar_sync(kPingPongBarrier0 + wg, kPingPongThreads);
    }
    __device__ void end() const {
        if constexpr (kPingPong) named_bar_arrive(kPingPongBarrier0 + (1 - wg), kPingPongThreads);
    }
    __device__ void close() const {
        if constexpr (kPingPong) {
            if (wg == 0) named_bar_sync(kPingPongBarrier0, kPingPongThreads);
        }
    }
};

// seqused_k builds: TMA fills a V tile with whatever the cache holds up to the tensors' seqlen_k, and a row past this
// batch row's used length meets P = 0 in P·V, where garbage (Inf, NaN: a cache's unwritten slots may hold anything)
// would still make NaN. So the warpgroup zeroes those rows of V tile n after its V-full wait and before its P·V:
// generic-proxy stores, a proxy fence (wgmma reads shared memory through the async proxy), the warpgroup's barrier,
// then the wgmma. Rows at or past seqlen_k are TMA's zero fill already. Each consumer warpgroup clears the rows
// itself (the same zeros: any order between them is harmless), and its release of the slot comes after, so the next
// TMA write into it cannot race the stores. A no-op for every other build and tile.
__device__ __forceinline__ void clear_unused_v(const FlashFwdParams& p, uint32_t v_addr, int n, int seqlen_k, int wg) {
    if constexpr (kSeqUsedK) {
        const int r0 = max(seqlen_k - n * kBc, 0);  // first row of the tile past the used length
        if (r0 >= kBc || n * kBc + r0 >= p.seqlen_k) return;
        // Row r of each 64-column chunk is 128 contiguous bytes at chunk + r * 128 (the 128-byte swizzle only
        // permutes the 16-byte units inside a row), so whole rows clear without unswizzling.
        const int units = (kBc - r0) * (kChunkRowBytes / 16);
        const uint32_t first = v_addr + r0 * kChunkRowBytes;
        for (int i = threadIdx.x % 128; i < units * kDChunks; i += 128) {
            const int c = i / units;
            st_shared_v4(first + c * kKVChunkBytes + (i - c * units) * 16, make_uint4(0u, 0u, 0u, 0u));
        }
        fence_proxy_async_shared();
        named_bar_sync(kOStoreBarrier0 + wg, 128);
    }
}

// Lane 0 of every consumer warp, after the warp's wait for the wgmma that read the slot (K: S = Q·Kᵀ, V: P·V).
// K goes back as soon as S has completed, not with V after P·V: with two stages and the overlapped loop, a shared
// release would free slot n-1 only after P(n-1)·V(n-1), i.e. just before S(n+1) needs K(n+1) in that very slot,
// putting the whole TMA latency of K(n+1) on every iteration's critical path.
__device__ __forceinline__ void release(uint32_t empty_bar) {
    if (threadIdx.x % 32 == 0) mbar_arrive(empty_bar);
}
// Joint release (traits: kKVReleaseSplit false): the slot goes back with its V, after P·V; K-empty is unused.
__device__ __forceinline__ void release_k(const Smem& sm, int stage) {
    if constexpr (kKVReleaseSplit) release(sm.k_empty(stage));
}

// Persistent: lane 0 of every consumer warp, once all its lanes are done with the Q slot of this tile.
__device__ __forceinline__ void release_q(const Smem& sm, uint32_t slot) {
    __syncwarp();
    if (threadIdx.x % 32 == 0) mbar_arrive(sm.q_empty(slot));
}

// head: the tile's head (packed GQA: the first head of its group); n_begin, n_end: the key tiles of this CTA's
// split (all of them without split-KV); split: which one (kTailSplit: the piece's partial slot, -1 for a whole tile).
__device__ __forceinline__ void consume(const FlashFwdParams& p, const Smem& sm, int wg, int m0, int head,
                                        int batch, int n_begin, int n_end, int split, Ring& ring, uint32_t q_seq) {
    const int tid = threadIdx.x % 128;
    const int warp = tid / 32, lane = tid % 32;
    const int wg_q0 = m0 + wg * query_rows_per_wg(p);   // first query row of this warpgroup
    const int local_row0 = warp * 16 + lane / 4;        // this thread's rows of the tile: local_row0 and + 8
    // This batch row's keys and causal offset (kernels/common/seqused.cuh), read at each use.
    // The last key each of the thread's rows may see under causal masking, and that of the warpgroup's first row.
    const int diag0 = row_of(p, wg_q0, head, local_row0).qrow + causal_offset_of(p, batch);
    const int diag1 = row_of(p, wg_q0, head, local_row0 + 8).qrow + causal_offset_of(p, batch);
    const int wg_diag = wg_q0 + causal_offset_of(p, batch);
    const uint32_t q_slot = q_slot_of(q_seq);
    const uint32_t q_addr = sm.q_slot(q_slot) + wg * kQWGBytes;
    const float scale_log2 = p.scale_log2;
    const Turns turns{wg};

    float o[kORegs];
#pragma unroll
    for (int i = 0; i < kORegs; ++i) o[i] = 0.f;
    float s[kSRegs];  // written by the first wgmma (scale-d 0); zeroed so the asm's "+f" never reads garbage
#pragma unroll
    for (int i = 0; i < kSRegs; ++i) s[i] = 0.f;
    uint32_t pf[kPRegs];
    float m[2] = {-CUDART_INF_F, -CUDART_INF_F};
    float l[2] = {0.f, 0.f};
    float corr[2];

    if constexpr (!kPackGqa) mbar_wait(sm.q_full(q_slot), q_parity_of(q_seq));

    int& stage = ring.stage;
    uint32_t& phase = ring.phase;
    // A warpgroup whose 64 rows all lie past seqlen_q (in the last query block when seqlen_q is not a multiple of Br,
    // e.g. N 512 with Br 192: a ninth of that shape's GEMMs) has nothing to compute. It only walks the ring, arriving
    // on each slot's K and V empty barriers once the slot has been filled (so its arrivals count towards the same use
    // as the other warpgroups'), and, persistent, gives the Q slot back (after the Q-full wait above: Q of this tile
    // is loaded only once every warpgroup has released the previous one). Not under ping-pong, whose turns pair the
    // two warpgroups' GEMM issues one to one.
    if constexpr (!kPingPong) {
        if (wg_q0 >= p.seqlen_q) {
            for (int n = n_begin; n < n_end; ++n) {
                mbar_wait(sm.k_full(stage), phase);
                release_k(sm, stage);
                mbar_wait(sm.v_full(stage), phase);
                release(sm.v_empty(stage));
                ring.advance();
            }
            if constexpr (kPersistent) release_q(sm, q_slot);
            return;
        }
    }
    if constexpr (kPackGqa) load_q_packed(p, q_addr, wg_q0, head, batch, wg);
    if constexpr (!kOverlap) {
        // One tile (peeled_key_tiles: no per-tile mask test between S's wait and the softmax).
        auto iterate = [&](const int n, auto masked) {
            constexpr bool kMaskedTile = decltype(masked)::value;
            mbar_wait(sm.k_full(stage), phase);
            fence_regs(s);
            wgmma_fence();
            issue_qk(s, q_addr, sm.k_tile(stage));
            wgmma_commit();
            wgmma_wait<0>();
            fence_regs(s);
            release_k(sm, stage);
            if constexpr (kRescaleFused) {
                softmax_fused<false, true>(kMaskedTile, s, m, l, corr, o, pf, scale_log2, diag0, diag1, n * kBc,
                                           keys_of(p, batch), 0);
            } else {
                softmax_any(kMaskedTile, s, m, l, corr, scale_log2, diag0, diag1, n * kBc, keys_of(p, batch));
                rescale_o(o, corr);
                convert_p(s, pf);
            }
            mbar_wait(sm.v_full(stage), phase);
            clear_unused_v(p, sm.v_tile(stage), n, keys_of(p, batch), wg);
            fence_regs(o);
            fence_regs(pf);
            wgmma_fence();
            issue_pv(o, pf, sm.v_tile(stage));
            wgmma_commit();
            wgmma_wait<0>();
            fence_regs(o);
            release(sm.v_empty(stage));
            ring.advance();
        };
        peeled_key_tiles(n_begin, n_end, first_masked_tile(wg_diag, keys_of(p, batch)), iterate);
    } else {
        // Prologue: S(0) and its softmax; O is still zero, so its correction factor is irrelevant.
        mbar_wait(sm.k_full(stage), phase);
        fence_regs(s);
        wgmma_fence();
        issue_qk(s, q_addr, sm.k_tile(stage));
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(s);
        release_k(sm, stage);
        if constexpr (kRescaleFused) {
            softmax_fused<false, false>(tile_needs_mask(n_begin, wg_diag, keys_of(p, batch)), s, m, l, corr, o, pf,
                                        scale_log2, diag0, diag1, n_begin * kBc, keys_of(p, batch), 0);
        } else {
            softmax_any(tile_needs_mask(n_begin, wg_diag, keys_of(p, batch)), s, m, l, corr, scale_log2, diag0,
                        diag1, n_begin * kBc, keys_of(p, batch));
            convert_p(s, pf);
        }

        int prev_stage = stage;
        uint32_t prev_phase = phase;
        ring.advance();
        // o_rescale=after: O(n-1) = (O(n-2) + P(n-1)·V(n-1)) · corr(n), once P·V has completed (O is then on the
        // path from the P·V wait to the next issue). o_rescale=before (FA3's order for head_dim > 128): O(n-2) is
        // multiplied by corr(n-1) right after S(n) is issued, under that GEMM, and P(n-1)·V(n-1) accumulates onto it.
        // o_rescale=fused: after's order, every tile, in one stretch with the softmax (softmax_fused_tile).
        // All apply every factor once; with P(0)·V(0) onto the zero O, the first factor never matters.
        // One iteration, S(n) + P(n-1)·V(n-1); `masked` (a MaskTag) says whether tile n may hold a masked score.
        // peeled_key_tiles runs the unmasked tiles without the per-tile mask test, whose predicate and branch sat
        // between S(n)'s wait and the softmax, on the warp's critical path.
        auto iterate = [&](const int n, auto masked) {
            constexpr bool kMaskedTile = decltype(masked)::value;
            mbar_wait(sm.k_full(stage), phase);
            if constexpr (!kRescaleBefore) {
                mbar_wait(sm.v_full(prev_stage), prev_phase);
                clear_unused_v(p, sm.v_tile(prev_stage), n - 1, keys_of(p, batch), wg);
            }
            turns.begin();
            fence_regs(s);
            fence_regs(o);
            fence_regs(pf);
            wgmma_fence();
            issue_qk(s, q_addr, sm.k_tile(stage));
            wgmma_commit();
            if constexpr (kRescaleBefore) {
                rescale_o(o, corr);
                mbar_wait(sm.v_full(prev_stage), prev_phase);
                clear_unused_v(p, sm.v_tile(prev_stage), n - 1, keys_of(p, batch), wg);
                fence_regs(o);
                wgmma_fence();
            }
            issue_pv(o, pf, sm.v_tile(prev_stage));
            wgmma_commit();
            turns.end();
            wgmma_wait<1>();  // S(n) is ready; P(n-1)·V(n-1) may still run under the softmax
            fence_regs(s);
            if constexpr (kRescaleFused) {
                softmax_fused<true, true>(kMaskedTile, s, m, l, corr, o, pf, scale_log2, diag0, diag1, n * kBc,
                                          keys_of(p, batch), sm.v_empty(prev_stage), sm.k_empty(stage));
            } else {
                release_k(sm, stage);
                softmax_any(kMaskedTile, s, m, l, corr, scale_log2, diag0, diag1, n * kBc, keys_of(p, batch));
                wgmma_wait<0>();
                fence_regs(o);
                fence_regs(pf);
                release(sm.v_empty(prev_stage));
                if constexpr (!kRescaleBefore) rescale_o(o, corr);
                convert_p(s, pf);
            }
            prev_stage = stage;
            prev_phase = phase;
            ring.advance();
        };
        peeled_key_tiles(n_begin + 1, n_end, first_masked_tile(wg_diag, keys_of(p, batch)), iterate);
        // Epilogue: the last P·V.
        if constexpr (kRescaleBefore) rescale_o(o, corr);
        mbar_wait(sm.v_full(prev_stage), prev_phase);
        clear_unused_v(p, sm.v_tile(prev_stage), n_end - 1, keys_of(p, batch), wg);
        const bool loop_was_empty = n_begin + 1 == n_end;  // then this P·V is the tile's one turn
        if (loop_was_empty) turns.begin();
        fence_regs(o);
        fence_regs(pf);
        wgmma_fence();
        issue_pv(o, pf, sm.v_tile(prev_stage));
        wgmma_commit();
        if (loop_was_empty) turns.end();
        wgmma_wait<0>();
        fence_regs(o);
        release(sm.v_empty(prev_stage));
    }

    // Persistent, O written from registers: every wgmma that read this tile's Q has completed, so the producer may
    // load the next tile's Q while this one normalises and stores.
    if constexpr (kPersistent && !kOStoreSmem) release_q(sm, q_slot);

    // Normalise: the row sum is spread over the 4 threads of a quad.
    float inv[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        l[h] += __shfl_xor_sync(0xffffffff, l[h], 1);
        l[h] += __shfl_xor_sync(0xffffffff, l[h], 2);
        inv[h] = l[h] > 0.f ? 1.f / l[h] : 0.f;
    }

    using Elem = uint16_t;
    if (kSplit || (kTailSplit && split >= 0)) {
        // This split's share (or this piece's of a cut tile): O normalised by its own row sum, and its logsumexp,
        // both fp32, for flash_fwd_combine (flash_fwd_tail_combine). Written from registers: a persistent build that
        // stages O in the Q slot (and so releases it only after the staged O is read back, below) releases it now.
        if constexpr (kPersistent && kOStoreSmem) release_q(sm, q_slot);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const RowOf row = row_of(p, wg_q0, head, local_row0 + 8 * h);
            if (!row.valid) continue;
            const long long r =
                kSplit ? ((static_cast<long long>(split) * p.batch + batch) * p.heads + row.head) * p.seqlen_q +
                             row.qrow
                       : static_cast<long long>(split) * kBr + wg * kRowsPerWG + local_row0 + 8 * h;
            float* dst = p.o_partial + r * kHeadDim + 2 * (lane % 4);
#pragma unroll
            for (int j = 0; j < kHeadDim / 8; ++j)
                *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(o[4 * j + 2 * h] * inv[h], o[4 * j + 2 * h + 1] * inv[h]);
            if (lane % 4 == 0)
                p.lse_partial[r] = l[h] > 0.f ? (m[h] + __log2f(l[h])) * 0.69314718055994531f : -CUDART_INF_F;
        }
        return;
    }
    Elem* o_base = reinterpret_cast<Elem*>(p.o) + batch * p.o_batch_stride;
    if constexpr (kOStoreSmem) {
        // Stage the 64 × D tile in this warpgroup's own Q slot (its last wgmma has completed, and no other
        // warpgroup reads it), then write whole 16-byte chunks per thread: rows become contiguous runs.
        // 16-byte chunk c of local row r lives at chunk c ^ (r % 8): conflict-free for both the 4-byte
        // fragment writes (8 rows × 4 threads per instruction) and the 16-byte row reads. The first barrier makes
        // sure every warp of the warpgroup is past its last wgmma (which read Q from this slot).
        named_bar_sync(kOStoreBarrier0 + wg, 128);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = warp * 16 + lane / 4 + 8 * h;
#pragma unroll
            for (int j = 0; j < kHeadDim / 8; ++j)
                st_shared_u32(q_addr + r * kORowBytes + ((j ^ (r % 8)) * 16) + (lane % 4) * 4,
                              pack2(o[4 * j + 2 * h] * inv[h], o[4 * j + 2 * h + 1] * inv[h]));
        }
        named_bar_sync(kOStoreBarrier0 + wg, 128);
        constexpr int kChunksPerRow = kHeadDim / 8;
#pragma unroll
        for (int it = 0; it < kRowsPerWG * kChunksPerRow / 128; ++it) {
            const int idx = tid + it * 128;
            const int r = idx / kChunksPerRow, c = idx % kChunksPerRow;
            const RowOf row = row_of(p, wg_q0, head, r);
            if (row.valid) {
                const uint4 v = ld_shared_v4(q_addr + r * kORowBytes + ((c ^ (r % 8)) * 16));
                st_global_v4(o_base + row.head * p.o_head_stride + static_cast<long long>(row.qrow) * p.o_row_stride +
                                 c * 8,
                             v);
            }
        }
        // Persistent: the staged O has been read back; the next tile's Q (a TMA write) may land in the slot. The
        // proxy fence orders this thread's generic shared-memory accesses before that asynchronous write.
        if constexpr (kPersistent) {
            fence_proxy_async_shared();
            release_q(sm, q_slot);
        }
    } else {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const RowOf row = row_of(p, wg_q0, head, local_row0 + 8 * h);
            if (row.valid) {
                Elem* o_row = o_base + row.head * p.o_head_stride + static_cast<long long>(row.qrow) * p.o_row_stride +
                              2 * (lane % 4);
#pragma unroll
                for (int j = 0; j < kHeadDim / 8; ++j)
                    *reinterpret_cast<uint32_t*>(o_row + 8 * j) =
                        pack2(o[4 * j + 2 * h] * inv[h], o[4 * j + 2 * h + 1] * inv[h]);
            }
        }
    }
    if (p.lse != nullptr && lane % 4 == 0) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const RowOf row = row_of(p, wg_q0, head, local_row0 + 8 * h);
            if (row.valid) {
                // m is in log2 units with the scale folded in; the API wants the natural-log logsumexp.
                const float lse = l[h] > 0.f ? (m[h] + __log2f(l[h])) * 0.69314718055994531f : -CUDART_INF_F;
                p.lse[(static_cast<long long>(batch) * p.heads + row.head) * p.seqlen_q + row.qrow] = lse;
            }
        }
    }
}

}  // namespace sm90

using namespace sm90;

extern "C" __global__ void __launch_bounds__(kThreads, kMinBlocks)
    flash_fwd_wgmma(const __grid_constant__ FlashFwdParams p, const __grid_constant__ CUtensorMap tm_q,
                    const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_v) {
    extern __shared__ uint8_t smem_raw[];

    Smem sm;
    sm.q = (smem_u32(smem_raw) + kSmemAlign - 1) & ~static_cast<uint32_t>(kSmemAlign - 1);
    sm.k = sm.q + kQBuffers * kQBytes;
    sm.v = sm.k + kStages * kKVTileBytes;
    sm.bars = sm.v + kStages * kKVTileBytes;
    // the combine's launch may overlap this kernel
    if constexpr (kSplit || kTailSplit) split_kv::allow_combine_launch();

    // One tile per CTA (grid, lpt): which one, worked out before the barrier set-up as it always was (unused, and
    // compiled away, when persistent: each role walks its own sequence below).
    Tile tile;
    if constexpr (kSchedLpt) {
        tile = tile_at(p, tile_order(p), static_cast<int>(blockIdx.x));
    } else {
        // Under causal masking the last query blocks have the most key tiles: launch them first so the long CTAs
        // do not end up as the tail of the grid.
        tile.m_block = kCausal ? static_cast<int>(gridDim.x - 1 - blockIdx.x) : static_cast<int>(blockIdx.x);
        // Packed GQA: blockIdx.y is the K/V head; the tile's rows start at the first query head of its group.
        tile.head = kPackGqa ? static_cast<int>(blockIdx.y) * group_size(p) : static_cast<int>(blockIdx.y);
        tile.batch = kSplit ? static_cast<int>(blockIdx.z) / kSplits : static_cast<int>(blockIdx.z);
    }
    const int split = kSplit ? static_cast<int>(blockIdx.z) % kSplits : 0;
    const int m0 = tile.m_block * kConsumerWGs * query_rows_per_wg(p);
    const int kv_head = tile.head / (p.heads / p.kv_heads);
    const int n_tiles = num_kv_tiles(p, m0, tile.batch);
    // This CTA's share of the key tiles: split s of kSplits takes ceil(n_tiles / kSplits) of them. A split left with
    // none (fewer tiles than splits, or a short causal block) writes lse = -inf for its rows, which flash_fwd_combine
    // weighs 0 without reading its O, and exits before any barrier exists.
    int n_begin = 0, n_end = n_tiles;
    if constexpr (kSplit) {
        const int per_split = (n_tiles + kSplits - 1) / kSplits;
        n_begin = split * per_split;
        n_end = min(n_tiles, n_begin + per_split);
        if (n_begin >= n_end) {
            const int tile_rows = kConsumerWGs * kRowsPerWG;
            for (int r = threadIdx.x; r < tile_rows; r += kThreads) {
                const int wg = r / kRowsPerWG;
                const RowOf row = row_of(p, m0 + wg * query_rows_per_wg(p), tile.head, r - wg * kRowsPerWG);
                if (row.valid)
                    p.lse_partial[((static_cast<long long>(split) * p.batch + tile.batch) * p.heads + row.head) *
                                      p.seqlen_q + row.qrow] = -CUDART_INF_F;
            }
            return;
        }
    }
    // Warp-uniform by construction, so the role branch below does not diverge inside a warp.
    const int warpgroup = __shfl_sync(0xffffffff, static_cast<int>(threadIdx.x) / 128, 0);

    if (threadIdx.x == 0) {
        prefetch_tensormap(&tm_q);
        prefetch_tensormap(&tm_k);
        prefetch_tensormap(&tm_v);
        for (uint32_t b = 0; b < kQBuffers; ++b) mbar_init(sm.q_full(b), 1);
        for (int s = 0; s < kStages; ++s) {
            mbar_init(sm.k_full(s), 1);
            mbar_init(sm.v_full(s), 1);
            mbar_init(sm.k_empty(s), 4 * kConsumerWGs);  // lane 0 of every consumer warp releases a slot's K
            mbar_init(sm.v_empty(s), 4 * kConsumerWGs);  // ... and its V
        }
        if constexpr (kPersistent)
            for (uint32_t b = 0; b < kQBuffers; ++b) mbar_init(sm.q_empty(b), 4 * kConsumerWGs);
        fence_barrier_init();
    }
    __syncthreads();

    Ring ring;
    if constexpr (!kPersistent) {
        if (warpgroup == 0) {
            if constexpr (kSetMaxNReg) setmaxnreg_dec<kProducerRegs>();
            if (threadIdx.x == 0)
                produce(p, sm, &tm_q, &tm_k, &tm_v, m0, tile.head, kv_head, tile.batch, n_begin, n_end, ring, 0);
        } else {
            if constexpr (kSetMaxNReg) setmaxnreg_inc<kConsumerRegs>();
            const Turns turns{warpgroup - 1};
            turns.open();
            consume(p, sm, warpgroup - 1, m0, tile.head, tile.batch, n_begin, n_end, split, ring, 0);
            turns.close();
        }
    } else {
        // Every role walks the same tile sequence; the mbarrier parities (ring, Q full/empty) carry across tiles.
        if (warpgroup == 0) {
            if constexpr (kSetMaxNReg) setmaxnreg_dec<kProducerRegs>();
            if (threadIdx.x == 0)
                producer_tiles(p, sm, [&](const Tile& work, int work_m0, uint32_t q_seq, int index, int n_from,
                                          int n_to, int) {
                    produce(p, sm, &tm_q, &tm_k, &tm_v, work_m0, work.head, work.head / (p.heads / p.kv_heads),
                            work.batch, n_from, n_to, ring, q_seq, index);
                });
        } else {
            if constexpr (kSetMaxNReg) setmaxnreg_inc<kConsumerRegs>();
            const Turns turns{warpgroup - 1};
            turns.open();
            consumer_tiles(p, sm, [&](const Tile& work, int work_m0, uint32_t q_seq, int, int n_from, int n_to,
                                      int slot) {
                consume(p, sm, warpgroup - 1, work_m0, work.head, work.batch, n_from, n_to, slot, ring, q_seq);
            });
            turns.close();
        }
    }
}

namespace sm90 {

// kTailSplit's second step: one warp per row of a cut tile merges the pieces that CTAs cta_of(first unit) ..
// cta_of(last unit) wrote (tail_plan.h: slot), as split_kv::combine merges splits: O = Σ w_k O_k / Σ w_k with
// w_k = exp(lse_k - max lse). Rows past seqlen_q, which no piece wrote, are skipped. Launch: grid ceil(cut tiles ×
// kBr / kCombineRowsPerBlock), block kCombineThreads, the attention kernel's parameter block (its cut).
__device__ __forceinline__ void tail_combine(const FlashFwdParams& p) {
    split_kv::wait_for_splits();
    const TileOrder order = tile_order(p);
    const tail_split::Plan t = tail_plan(p, order.tiles);
    const long long row = static_cast<long long>(blockIdx.x) * split_kv::kCombineRowsPerBlock + threadIdx.x / 32;
    if (t.ctas == 0 || row >= static_cast<long long>(order.tiles - t.full_end) * kBr) return;
    const int j = static_cast<int>(row / kBr), local = static_cast<int>(row - static_cast<long long>(j) * kBr);
    const Tile work = tile_at(p, order, t.full_end + j);
    const int qrow = work.m_block * kBr + local;
    if (qrow >= p.seqlen_q) return;
    const int lane = threadIdx.x % 32;
    const long long first = static_cast<long long>(j) * t.n;
    const int i0 = tail_split::cta_of(t, first), i1 = tail_split::cta_of(t, first + t.n - 1);
    const int slot0 = tail_split::slot(t, i0, j);
    auto slot_row = [&](int i) { return static_cast<long long>(tail_split::slot_after(i, i0, slot0)) * kBr + local; };
    // Lanes read the pieces' lse side by side and weigh them; the O rows are then read with no branch on a loaded
    // value between them, so a warp has every piece's loads in flight at once (a chain of dependent reads per piece
    // made this kernel 12 us under ncu on the d128 N4096 row, 1.5 % of the main kernel).
    float mx = -CUDART_INF_F;
    for (int i = i0 + lane; i <= i1; i += 32) mx = fmaxf(mx, p.lse_partial[slot_row(i)]);
#pragma unroll
    for (int off = 16; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, off));
    constexpr int kColsPerLane = kHeadDim / 32;
    float acc[kColsPerLane];
#pragma unroll
    for (int c = 0; c < kColsPerLane; ++c) acc[c] = 0.f;
    float sum = 0.f;
    for (int base = i0; base <= i1; base += 32) {  // more than 32 pieces only where a tile has very many key tiles
        const int count = min(32, i1 - base + 1);
        const float lse_i = lane < count ? p.lse_partial[slot_row(base + lane)] : -CUDART_INF_F;
        // a piece that saw no key (lse -inf, not reached without masking) weighs 0; so does every piece of an
        // all-masked row (mx -inf)
        const float w = lse_i == -CUDART_INF_F ? 0.f : __expf(lse_i - mx);
        float s = w;
#pragma unroll
        for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffff, s, off);
        sum += s;
#pragma unroll 4
        for (int k = 0; k < count; ++k)
            split_kv::add_weighted(acc, p.o_partial + slot_row(base + k) * kHeadDim + lane * kColsPerLane,
                                   __shfl_sync(0xffffffff, w, k));
    }
    split_kv::store_o_row<kColsPerLane, kBf16>(p, work.batch, work.head, qrow, lane, acc, sum > 0.f ? 1.f / sum : 0.f);
    if (p.lse != nullptr && lane == 0)
        p.lse[(static_cast<long long>(work.batch) * p.heads + work.head) * p.seqlen_q + qrow] =
            sum > 0.f ? mx + __logf(sum) : -CUDART_INF_F;
}

}  // namespace sm90

extern "C" __global__ void __launch_bounds__(split_kv::kCombineThreads)
    flash_fwd_tail_combine(const __grid_constant__ FlashFwdParams p) {
    if constexpr (kTailSplit) tail_combine(p);
}

// Split-KV's second step (kernels/common/split_combine.cuh, shared with the mma_sync family): the loader launches
// it after a split build; a no-op in builds without splits (the loader never launches it there).
extern "C" __global__ void __launch_bounds__(split_kv::kCombineThreads)
    flash_fwd_combine(const __grid_constant__ FlashFwdParams p) {
    if constexpr (kSplit) split_kv::combine<kSplits, kHeadDim, kBf16>(p);
}
