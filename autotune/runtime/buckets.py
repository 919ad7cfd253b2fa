"""Shape buckets: the sizes that capture.py records once a shape varies, and that a tuned row stands for at run time.

A serving loop calls attention with a new sequence length every step (decode: Nk, Nk + 1, ...) and changing
batches. Recording each would give a campaign of thousands of shapes; instead batch, seqlen_q and seqlen_k are
rounded up to a bucket, four per octave above 16 (17-20 → 20, 21-24 → 24, ..., 513-640 → 640, ..., 4097-5120 →
5120) and kept exact up to 16 (one query of a decode step stays 1; speculative decoding's few stay what they are).
A bucket is at most 25 % above the sizes it holds, and a size and its bucket need the same number of tiles for
every tile size that the bucket's step divides (64- and 128-row tiles up to 512, 128-row tiles up to 1024): the
tuned config of a bucket is a close fit for the shapes in it. Heads, kv_heads, head_dim, dtype and causal are kept as they are (they
decide the kernel, or are fixed by the model).

The runtime looks a shape up by its own key first, then by its bucket's (lookup.py), so tuning the captured
buckets (`autotune campaign`) serves every shape that falls in them.
"""
from __future__ import annotations

import dataclasses

from space import Shape

EXACT_UP_TO = 16


def bucket_size(n: int) -> int:
    """n rounded up to its bucket: n itself up to 16, else the next multiple of 2^(floor(log2(n - 1)) - 2)."""
    if n <= EXACT_UP_TO:
        return n
    step = 1 << ((n - 1).bit_length() - 3)
    return -(-n // step) * step


def bucket(shape: Shape) -> Shape:
    """The shape's bucket: batch, seqlen_q and seqlen_k rounded up by bucket_size, the rest unchanged."""
    return dataclasses.replace(shape, batch=bucket_size(shape.batch), seqlen_q=bucket_size(shape.seqlen_q),
                               seqlen_k=bucket_size(shape.seqlen_k))


__all__ = ["EXACT_UP_TO", "bucket", "bucket_size"]
