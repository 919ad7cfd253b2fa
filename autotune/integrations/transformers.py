"""autotune as a transformers attention backend.

    import autotune.integrations.transformers          # registers attn_implementation="autotune"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="autotune", dtype=torch.bfloat16).cuda()
    model.generate(input_ids, max_new_tokens=32)         # or model.set_attn_implementation("autotune")

Importing this module registers `attention_forward` under "autotune" in transformers' AttentionInterface, and
`sdpa_mask` under the same name in its AttentionMaskInterface: it calls transformers' SDPA mask builder
(masking_utils.sdpa_mask) with the same arguments and returns its mask unchanged, so the model builds exactly the
masks it builds for attn_implementation="sdpa" (None where SDPA would rely on is_causal, a 4-d mask for padding and
other patterns) and the two backends see the same inputs. It also notes the masks that its arguments prove to be a
causal prefix of the keys per batch row (prefix_mask_call): the plain causal mask of a cache with no padding mask,
which is what a static cache's decode step gets, (B, 1, Nq, max_cache_len), true on keys j <= cache position + i.

A call runs on the tuned kernel (autotune.attention) when SDPA would run it without a mask: prefill (causal,
seqlen_q == seqlen_k), decode steps (one query, no mask: full attention over the cache), the prefill of a static
cache (causal, keys cropped to the queries as transformers' SDPA path crops them), and a noted prefix mask (a static
cache's decode, also inside a CUDA graph; $AUTOTUNE_ROUTE_PREFIX_MASKS=0 switches this off, and such a mask then falls
back as any explicit mask does): the kernel reads each row's used key length on the device
(autotune.attention's seqused_k, the mask's true count in its last query row, a device reduction), non-causal for
one query and bottom-right causal for several, which is that mask. GQA caches go in as they are, with no repeat of
the K/V heads. Everything else runs transformers' own SDPA function with the same arguments,
exactly what attn_implementation="sdpa" would have run, and is counted and reported once per reason
(autotune.fallback_counts()): any other explicit mask (padding, sliding windows, chunked prefill, a mask the model
made or sliced itself), dropout, softcap, a position bias, attention sinks, output_attentions, a head dim or dtype the kernel lacks, CPU tensors, inputs that
need a backward. Causal calls with seqlen_q != seqlen_k run the kernel top-left aligned, as transformers' SDPA
path does (runtime/routing.causal_argument decides the alignment).
"""
from __future__ import annotations

import math
import os

try:
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(f"autotune.integrations.transformers needs transformers 5 (pip install 'autotune[models]'): "
                      f"{e}") from None

import torch
from torch.utils.weak import WeakIdKeyDictionary
from transformers import masking_utils

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


# transformers' own SDPA mask builder, as it was when this module was imported (what "sdpa" models get).
_stock_mask = ALL_MASK_ATTENTION_FUNCTIONS["sdpa"]
# Masks that sdpa_mask built from arguments proving them a causal prefix per batch row -> the int32 (B,) used key
# lengths, computed on the device at the first attention call that reads them (None until then). Weak: a mask lives
# for one forward (or as long as a CUDA graph holds it), and so does its entry.
_prefix_masks = WeakIdKeyDictionary()


# transformers 5.24 passes these keywords from create_causal_mask (checked); the 5.17 source passes the same ones
# but disables the is_causal skip for every compileable cache, so a static cache's prefill gets a prefix mask there
# too (q_offset 0: row i sees keys j <= i), which then runs through seqused_k as well instead of the crop.
def prefix_mask_call(kwargs) -> bool:
    """Whether sdpa_mask's arguments make its mask a causal prefix of the keys in every batch row and query row
    (row i of the queries sees keys j <= q_offset + i, and nothing else): the plain causal mask function, no 2-d
    padding mask, keys counted from 0, no local window, no vmap (a custom pattern). Read from the arguments only,
    never from tensor values, so it holds under a CUDA graph capture without a sync."""
    return (kwargs.get("mask_function", masking_utils.causal_mask_function) is masking_utils.causal_mask_function
            and kwargs.get("attention_mask") is None and isinstance(kwargs.get("kv_offset", 0), int)
            and kwargs.get("kv_offset", 0) == 0 and kwargs.get("local_size") is None and not kwargs.get("use_vmap")
            and isinstance(kwargs.get("q_length"), int) and isinstance(kwargs.get("kv_length"), int))


ROUTE_PREFIX_MASKS_ENV = "AUTOTUNE_ROUTE_PREFIX_MASKS"


def prefix_masks_routed() -> bool:
    """Whether noted prefix masks run on the kernel (through seqused_k): yes unless $AUTOTUNE_ROUTE_PREFIX_MASKS is
    0 / false / no / off (a switch back to transformers' SDPA for such masks, as before seqused_k existed, should a
    model's masks ever need it; tests/test_seqused_gpu.py is what the routed path passed on the H200)."""
    return os.environ.get(ROUTE_PREFIX_MASKS_ENV, "").strip().lower() not in ("0", "false", "no", "off")


def sdpa_mask(*args, **kwargs):
    """transformers' SDPA mask builder, called with these arguments and its result returned as it is; a mask that
    prefix_mask_call proves a causal prefix is noted for attention_forward (keyword calls only, as
    create_causal_mask makes them)."""
    mask = _stock_mask(*args, **kwargs)
    if not prefix_masks_routed():
        return mask
    # Not while torch.compile traces: a mask noted in a Python dict there would cost a graph break (such calls
    # fall back as any explicit mask does).
    if (isinstance(mask, torch.Tensor) and not args and mask.dim() == 4 and not torch.compiler.is_compiling()
            and prefix_mask_call(kwargs)):
        _prefix_masks[mask] = None
    return mask


def used_lengths(mask: torch.Tensor) -> torch.Tensor:
    """A noted prefix mask's used key length per batch row, int32 (B,), contiguous: the true count of its last
    query row (q_offset + Nq, at most the mask's key length), on the mask's device, without a sync. Computed once per
    mask (every layer of a forward shares it)."""
    lengths = _prefix_masks.get(mask)
    if lengths is None:
        lengths = _prefix_masks[mask] = mask[:, 0, -1, :].sum(-1, dtype=torch.int32).contiguous()
    return lengths


def _mask_route(query, key, attention_mask):
    """(the kernel's causal argument, seqused_k) for a noted prefix mask that fits this call, else None."""
    if attention_mask not in _prefix_masks:
        return None
    batch, q_len = query.shape[0], query.shape[2]
    if tuple(attention_mask.shape) != (batch, 1, q_len, key.shape[2]) or attention_mask.device != query.device:
        return None
    # sdpa_attention_forward passes is_causal=False with a mask, so the mask is the whole pattern: row i sees keys
    # j <= q_offset + i = i + used - Nq, i.e. bottom-right aligned to the used length (one query: every used key).
    return (False if q_len == 1 else routing.LOWER_RIGHT), used_lengths(attention_mask)


def _route(module, query, key, value, attention_mask, dropout, scaling, is_causal, kwargs):
    """(key, value, the kernel's causal argument, seqused_k or None, None) for a call the kernel runs, else
    (.., .., None, None, reason). Mirrors sdpa_attention_forward's own decisions (is_causal, the static-cache crop)
    so both compute the same."""
    masked = "an explicit attention mask (padding, a window or another pattern)"
    if attention_mask is not None and (torch.compiler.is_compiling() or attention_mask not in _prefix_masks):
        return key, value, None, None, masked
    key, value, causal, reason = _route_unmasked(module, query, key, value, attention_mask, dropout, scaling,
                                                 is_causal, kwargs)
    if attention_mask is None or reason is not None:
        return key, value, causal, None, reason
    found = _mask_route(query, key, attention_mask)
    if found is None:
        return key, value, None, None, masked
    return key, value, found[0], found[1], None


def _route_unmasked(module, query, key, value, attention_mask, dropout, scaling, is_causal, kwargs):
    """_route's checks of everything but the mask's pattern: (key, value, causal, None) or (.., .., None, reason).
    With a mask, only the tensor checks run here (the mask route decides causal and keeps the keys whole)."""
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
    if attention_mask is not None:
        reason = routing.unsupported(query, key, value)
        return key, value, None, reason
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
    k, v, causal, seqused_k, reason = _route(module, query, key, value, attention_mask, dropout, scaling, is_causal,
                                             kwargs)
    if reason is not None:
        fallbacks.record(WHERE, reason, STOCK)
        return _stock()(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                        is_causal=is_causal, **kwargs)
    scale = None if scaling is None else float(scaling)
    if seqused_k is None:
        out = routing.kernel(query, k, v, causal, scale)
    else:
        out = routing.kernel(query, k, v, causal, scale, seqused_k=seqused_k)
    # no copy when query came as a transposed (B, Nq, H, D) tensor (transformers' own): out is laid out like it
    return out.transpose(1, 2).contiguous(), None


def register(name: str = NAME) -> None:
    """Register attention_forward (and sdpa_mask, SDPA's mask builder noting prefix masks) under `name`; done on
    import for NAME. Idempotent."""
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)


register()

__all__ = ["NAME", "ROUTE_PREFIX_MASKS_ENV", "STOCK", "WHERE", "attention_forward", "prefix_mask_call",
           "prefix_masks_routed", "register", "sdpa_mask", "used_lengths"]
