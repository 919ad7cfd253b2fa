"""The runtime cases every kernel family's GPU correctness matrix runs (tests/test_kernel_gpu.py,
tests/test_wgmma_gpu.py): sequence lengths 1/17/128/1000/4096, seqlen_q shorter and longer than seqlen_k,
GQA 4:1, (B,N,H,D) strides, logsumexp, and a grid of more tiles than the GPU holds CTAs."""
from __future__ import annotations

import dataclasses

from space import Shape


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    shape: Shape  # head_dim, dtype and causal are replaced by the problem's
    layout: str
    lse: bool


CASES = (
    Case("n1", Shape(batch=2, heads=4, seqlen_q=1), "bhnd", lse=True),
    Case("n17-gqa-bnhd", Shape(batch=2, heads=8, kv_heads=2, seqlen_q=17), "bnhd", lse=False),
    Case("n128-bnhd", Shape(batch=2, heads=4, seqlen_q=128), "bnhd", lse=True),
    Case("n1000-gqa", Shape(batch=1, heads=8, kv_heads=2, seqlen_q=1000), "bhnd", lse=True),
    Case("n4096-gqa-bnhd", Shape(batch=1, heads=4, kv_heads=1, seqlen_q=4096), "bnhd", lse=False),
    Case("q100-k300", Shape(batch=1, heads=4, seqlen_q=100, seqlen_k=300), "bhnd", lse=True),
    Case("q300-k100-bnhd", Shape(batch=1, heads=4, seqlen_q=300, seqlen_k=100), "bnhd", lse=True),
    # More tiles than an H200 holds CTAs (512 of 128 rows, 132 SMs): persistent CTAs loop over several tiles, so
    # the mbarrier parities wrap across tiles and the Q slot is reused.
    Case("n1000-gqa-many-tiles-bnhd", Shape(batch=4, heads=16, kv_heads=4, seqlen_q=1000), "bnhd", lse=True),
)
