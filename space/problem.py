"""What a kernel is compiled for (Problem) and what it is run on (Shape)."""
from __future__ import annotations

from dataclasses import dataclass

DTYPES = ("fp16", "bf16")
# Decode: at most this many new query tokens per sequence (one, or a few with speculative decoding) against a cache.
# Such shapes are memory-bound and get their own defaults; tuned rows of one kind never stand in for the other.
DECODE_MAX_QUERIES = 16
HEAD_DIMS = (64, 128, 256)
# Where a causal mask is aligned (a run-time choice: one causal cubin serves both): "upper_left", query i sees keys
# j <= i (SDPA's is_causal), or "lower_right", j <= i + Nk - Nq (FlashAttention's and PyTorch's causal_lower_right,
# what decode with several new tokens and chunked prefill need). They agree when Nq == Nk.
CAUSAL_ALIGNS = ("upper_left", "lower_right")


def canonical_align(causal: bool, causal_align: str, seqlen_q: int, seqlen_k: int) -> str:
    """The alignment a shape is keyed by: "upper_left" when it makes no difference (not causal, or Nq == Nk), so the
    two spellings of one function are one key."""
    if causal_align not in CAUSAL_ALIGNS:
        raise ValueError(f"causal_align: expected one of {CAUSAL_ALIGNS}, got {causal_align!r}")
    return causal_align if causal and seqlen_q != seqlen_k else "upper_left"


def causal_mask(value) -> tuple[bool, str]:
    """(causal, causal_align) of a file's or a caller's `causal` value, spelled as autotune.attention takes it:
    false, true (= "upper_left") or an alignment of CAUSAL_ALIGNS. ValueError names `causal`."""
    if isinstance(value, bool):
        return value, "upper_left"
    if isinstance(value, str) and value in CAUSAL_ALIGNS:
        return True, value
    raise ValueError(f"causal: expected true, false or one of {', '.join(map(repr, CAUSAL_ALIGNS))}, got {value!r}")


def causal_value(shape: "Shape"):
    """The `causal` value that spells shape's mask: False, True (upper-left) or "lower_right" (causal_mask's inverse)."""
    return "lower_right" if shape.lower_right else shape.causal


@dataclass(frozen=True)
class Problem:
    """The compile-time part of a shape: one cubin serves every batch, head count and seqlen."""

    head_dim: int = 128
    dtype: str = "fp16"
    causal: bool = False
    # Read a per-batch-row used key length from the parameter block (FlashFwdParams.seqused_k) on the device: a
    # build of its own (-DAT_SEQUSED_K=1), since every other build must stay the code it is without it.
    seqused_k: bool = False

    def __post_init__(self):
        if self.head_dim not in HEAD_DIMS:
            raise ValueError(f"head_dim: expected one of {HEAD_DIMS}, got {self.head_dim!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {DTYPES}, got {self.dtype!r}")
        if not isinstance(self.causal, bool):
            raise ValueError(f"causal: expected a bool, got {self.causal!r}")
        if not isinstance(self.seqused_k, bool):
            raise ValueError(f"seqused_k: expected a bool, got {self.seqused_k!r}")

    @property
    def key(self) -> str:
        return f"d{self.head_dim}-{self.dtype}-{'causal' if self.causal else 'full'}{'-seqused' if self.seqused_k else ''}"

    def defines(self) -> dict[str, int]:
        out = {
            "AT_HEAD_DIM": self.head_dim,
            "AT_DTYPE_BF16": int(self.dtype == "bf16"),
            "AT_CAUSAL": int(self.causal),
        }
        if self.seqused_k:  # absent otherwise: those builds keep their flags, cache keys and code
            out["AT_SEQUSED_K"] = 1
        return out


@dataclass(frozen=True)
class Shape:
    """One attention call: (batch, heads, seqlen, head_dim) queries against kv_heads key/value heads."""

    batch: int = 4
    heads: int = 16
    seqlen_q: int = 4096
    seqlen_k: int | None = None
    head_dim: int = 128
    dtype: str = "fp16"
    causal: bool = False
    kv_heads: int | None = None
    causal_align: str = "upper_left"  # CAUSAL_ALIGNS; kept as "upper_left" where it makes no difference

    def __post_init__(self):
        if self.seqlen_k is None:
            object.__setattr__(self, "seqlen_k", self.seqlen_q)
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        for name in ("batch", "heads", "kv_heads", "seqlen_q", "seqlen_k"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected a positive integer, got {value!r}")
        if self.heads % self.kv_heads:
            raise ValueError(f"kv_heads: must divide heads ({self.heads}), got {self.kv_heads}")
        Problem(self.head_dim, self.dtype, self.causal)  # validates the rest
        object.__setattr__(self, "causal_align",
                           canonical_align(self.causal, self.causal_align, self.seqlen_q, self.seqlen_k))

    @property
    def problem(self) -> Problem:
        return Problem(self.head_dim, self.dtype, self.causal)

    @property
    def lower_right(self) -> bool:
        """A causal mask aligned to the end of the keys, for Nq != Nk (where the alignment matters)."""
        return self.causal_align == "lower_right"

    @property
    def is_decode(self) -> bool:
        return self.seqlen_q <= DECODE_MAX_QUERIES

    @property
    def kv_bytes(self) -> int:
        """Bytes of K and V one call reads at least once (the memory-bound figure: TB/s = kv_bytes / time)."""
        return 2 * self.batch * self.kv_heads * self.seqlen_k * self.head_dim * 2

    @property
    def flops(self) -> float:
        """Matmul FLOPs of the forward pass (4·B·H·Nq·Nk·D), halved for causal as is customary (either alignment:
        one figure per shape, as peers report it)."""
        f = 4.0 * self.batch * self.heads * self.seqlen_q * self.seqlen_k * self.head_dim
        return f / 2 if self.causal else f

    def tflops(self, seconds: float) -> float:
        return self.flops / seconds / 1e12

    @property
    def key(self) -> str:
        kv = f"-kv{self.kv_heads}" if self.kv_heads != self.heads else ""
        sk = f"-k{self.seqlen_k}" if self.seqlen_k != self.seqlen_q else ""
        lr = "-lower-right" if self.lower_right else ""  # upper-left keys are what they were before alignments
        return f"b{self.batch}-h{self.heads}{kv}-n{self.seqlen_q}{sk}-{self.problem.key}{lr}"
