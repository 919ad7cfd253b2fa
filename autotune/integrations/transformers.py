"""autotune as a transformers attention backend.

    import autotune.integrations.transformers          # registers attn_implementation="autotune"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="autotune", dtype=torch.bfloat16).cuda()
    model.generate(input_ids, max_new_tokens=32)         # or model.set_attn_implementation("autotune")

Importing this module registers `attention_forward` under "autotune" in transformers' AttentionInterface, and
transformers' SDPA mask builder (masking_utils.sdpa_mask) under the same name in its AttentionMaskInterface: the
model builds exactly the masks it builds for attn_implementation="sdpa" (None where SDPA would rely on is_causal,
a 4-d mask for padding and other patterns), so the two backends see the same inputs.

A call runs on the tuned kernel (autotune.attention) when SDPA would run it without a mask: prefill (causal,
seqlen_q == seqlen_k), decode steps (one query, no mask: full attention over the cache), the prefill of a static
cache (causal, keys cropped to the queries as transformers' SDPA path crops them). GQA caches go in as they are,
with no repeat of the K/V heads. Everything else runs transformers' own SDPA function with the same arguments,
exactly what attn_implementation="sdpa" would have run, and is counted and reported once per reason
(autotune.fallback_counts()): an explicit mask (padding, sliding windows, chunked prefill), dropout, softcap, a
position bias, attention sinks, output_attentions, a head dim or dtype the kernel lacks, CPU tensors, inputs that
need a backward. Causal calls with seqlen_q != seqlen_k run the kernel top-left aligned, as transformers' SDPA
path does (runtime/routing.causal_argument decides the alignment).
"""
from __future__ import annotations

import math

try:
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(f"autotune.integrations.transformers needs transformers 5 (pip install 'autotune[models]'): "
                      f"{e}") from None

import torch

from ..runtime import fallbacks, routing

NAME = "autotune"
WHERE = f'transformers attn_implementation="{NAME}"'
STOCK = "transformers' sdpa_attention_forward"
# Arguments transformers' SDPA path gives a meaning the kernel does not have; any other keyword (position_ids,
# cache details, sliding_window: the mask carries the window) SDPA ignores, and so do we.
_NOT_FOR_THE_KERNEL = {"softcap": "softcap", "position_bias": "a position bias", "s_aux": "attention sinks (s_aux)",
                       "sinks": "attention sinks"}


def _stock():
    """transformers' SDPA attention function, looked up per call like the model itself looks up "sdpa"."""
    return ALL_ATTENTION_FUNCTIONS["sdpa"]


def _route(module, query, key, value, attention_mask, dropout, scaling, is_causal, kwargs):
    """(key, value, the kernel's causal argument, None) for a call the kernel runs, else (.., .., None, reason).
    Mirrors sdpa_attention_forward's own decisions (is_causal, the static-cache crop) so both compute the same."""
    if attention_mask is not None:
        return key, value, None, "an explicit attention mask (padding, a window or another pattern)"
    if dropout:
        return key, value, None, f"dropout {dropout} (the kernel has no dropout)"
    for name, what in _NOT_FOR_THE_KERNEL.items():
        if kwargs.get(name) is not None:
            return key, value, None, what
    if kwargs.get("output_attentions"):
        return key, value, None, "output_attentions=True (the kernel returns no weights)"
    if scaling is not None and (isinstance(scaling, bool) or not isinstance(scaling, (int, float))
                                or not math.isfinite(scaling)):
        return key, value, None, f"scaling {scaling!r} (the kernel takes a finite float)"
    if torch.jit.is_tracing():
        return key, value, None, "torch.jit tracing"
    q_len = query.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(q_len > 1 and causal)  # sdpa_attention_forward: a single query sees every key
    if causal and key.shape[2] > q_len:
        # A static cache's prefill: the keys past the queries are empty slots that SDPA's top-left is_causal mask
        # hides; transformers' SDPA path crops them, and so do we.
        key, value = key[:, :, :q_len], value[:, :, :q_len]
    reason = routing.unsupported(query, key, value)
    if reason:
        return key, value, None, reason
    if not causal:
        return key, value, False, None
    argument = routing.causal_argument(q_len, key.shape[2], routing.UPPER_LEFT)
    if argument is None:
        return key, value, None, routing.causal_reason(q_len, key.shape[2], routing.UPPER_LEFT)
    return key, value, argument, None


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask, dropout: float = 0.0, scaling: float | None = None,
                      is_causal: bool | None = None, **kwargs):
    """transformers' attention-function interface: query (B, H, Nq, D), key/value (B, Hkv, Nk, D) with the K/V
    heads not repeated; returns (attn_output (B, Nq, H, D) contiguous, None), like sdpa_attention_forward."""
    k, v, causal, reason = _route(module, query, key, value, attention_mask, dropout, scaling, is_causal, kwargs)
    if reason is not None:
        fallbacks.record(WHERE, reason, STOCK)
        return _stock()(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                        is_causal=is_causal, **kwargs)
    out = routing.kernel(query, k, v, causal, None if scaling is None else float(scaling))
    return out.transpose(1, 2).contiguous(), None


def register(name: str = NAME) -> None:
    """Register attention_forward (and SDPA's mask builder) under `name`; done on import for NAME. Idempotent."""
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])


register()

__all__ = ["NAME", "STOCK", "WHERE", "attention_forward", "register"]
