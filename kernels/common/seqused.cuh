// The key length a batch row uses: FlashFwdParams.seqused_k in builds that read it (AT_SEQUSED_K, each family's
// traits.cuh: kSeqUsedK), the tensors' seqlen_k otherwise. Shared by every family so both read it alike.
#pragma once

#include "flash_params.h"

namespace flash_common {

// seqused_k[batch] clamped to [0, seqlen_k]: the host cannot check the values without a sync (they may be written
// by a CUDA graph between replays), so a value out of range reads no key past the tensors (and none below 0).
// Without kSeqUsedK this is p.seqlen_k and the pointer is never read, so those builds compile as they always did.
template <bool kSeqUsedK>
__device__ __forceinline__ int used_seqlen_k(const FlashFwdParams& p, int batch) {
    if constexpr (kSeqUsedK) {
        if (p.seqused_k != nullptr) return min(max(__ldg(p.seqused_k + batch), 0), p.seqlen_k);
    }
    return p.seqlen_k;
}

// The causal offset for that length: a seqused_k call is bottom-right aligned (the host passes seqlen_k - seqlen_q),
// so the last query row sees the last used key: shift by what the row does not use.
//
// The kernels call both at every place they read p.seqlen_k or p.causal_offset before, rather than keeping one
// value in a register: forced inline, a build without seqused_k then compiles to its old code exactly (a value held
// across the loop, or a lambda inlined late, moved loads and changed the SASS of causal and persistent builds).
template <bool kSeqUsedK>
__device__ __forceinline__ int used_causal_offset(const FlashFwdParams& p, int batch) {
    if constexpr (kSeqUsedK) return p.causal_offset - (p.seqlen_k - used_seqlen_k<true>(p, batch));
    return p.causal_offset;
}

}  // namespace flash_common
