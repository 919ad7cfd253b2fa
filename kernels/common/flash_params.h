// The one parameter block every kernel family takes by value. Plain C layout so any loader can fill it
// (autotune/launch_params.py mirrors it with ctypes; a test checks the size and offsets).
#pragma once

struct FlashFwdParams {
    const void* q;    // (batch, heads,    seqlen_q, head_dim), last dim contiguous
    const void* k;    // (batch, kv_heads, seqlen_k, head_dim), last dim contiguous
    const void* v;    // (batch, kv_heads, seqlen_k, head_dim), last dim contiguous
    void* o;          // (batch, heads,    seqlen_q, head_dim), last dim contiguous
    float* lse;       // (batch, heads, seqlen_q) contiguous fp32 natural-log logsumexp, or null
    // Strides in elements (not bytes), so (B,H,N,D) and (B,N,H,D) layouts both work without copies.
    long long q_batch_stride, q_head_stride, q_row_stride;
    long long k_batch_stride, k_head_stride, k_row_stride;
    long long v_batch_stride, v_head_stride, v_row_stride;
    long long o_batch_stride, o_head_stride, o_row_stride;
    int batch, heads, kv_heads, seqlen_q, seqlen_k;
    float scale_log2;  // softmax scale × log2(e): scores go straight into exp2
    // Causal masks: query row i sees keys j <= i + causal_offset. 0 is the top-left alignment of SDPA's is_causal;
    // seqlen_k - seqlen_q aligns the last query with the last key (decode, chunked prefill: PyTorch's
    // causal_lower_right). Ignored by non-causal builds.
    int causal_offset;
    // Split-KV builds (AT_KV_SPLITS > 1, either family): each split of the key range writes its O normalised by its own row
    // sum, fp32 (splits, batch, heads, seqlen_q, head_dim) contiguous, and its natural-log logsumexp, fp32 (splits,
    // batch, heads, seqlen_q); flash_fwd_combine merges them into o (and lse). Null otherwise.
    float* o_partial;
    float* lse_partial;
    // Builds with AT_SEQUSED_K (space.Problem(seqused_k=True)): int32 (batch,), the number of keys batch row b uses,
    // read on the device so that a CUDA graph can advance it between replays (FlashAttention's seqused_k). Keys at
    // or past it are neither loaded into the softmax nor seen; a value outside [0, seqlen_k] is clamped to it. A
    // causal mask is then bottom-right aligned to the used length (causal_offset is seqlen_k - seqlen_q, and the
    // kernel shifts it by seqused_k[b] - seqlen_k). Null, and never read, otherwise. Last, so the offsets above
    // are those of the block without it.
    const int* seqused_k;
    // Causal builds of the wgmma family's persistent scheduler: int32, zero at launch (the loader zeroes it before
    // every launch); each CTA past its first tile takes the next one of the order from it (atomicAdd). Null, and
    // never read, otherwise. After seqused_k, so the offsets above are those of the block without it.
    int* tile_counter;
    // Tail-split builds of the wgmma family's persistent scheduler (space.Layout.tail_split): the cut of the last round
    // the loader chose for this launch's grid (space.wgmma.tail_plan): tiles [0, tail_full_end) run whole, the rest
    // are shared out in pieces among CTAs 0 .. tail_ctas-1 (kernels/sm90/tail_plan.h). tail_ctas 0: no cut (and
    // tail_full_end unread). Both 0 otherwise. Last, so the offsets above are those of the block without them.
    int tail_full_end;
    int tail_ctas;
};
