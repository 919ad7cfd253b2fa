"""autotune: search the design space of a parameterized CUDA FlashAttention forward kernel.

`autotune.attention(q, k, v, causal=False, scale=None, return_lse=False, seqused_k=None)` runs the tuned kernel and
`autotune.explain(q, k, v, causal=False)` says which config it would use and why (autotune/runtime/attention_op.py).
In models: `autotune.scaled_dot_product_attention` and `autotune.patch_sdpa()` (runtime/sdpa.py),
`autotune.capture(path)` (runtime/capture.py), `autotune.set_benchmark_mode()` (runtime/benchmark_mode.py),
`autotune.fallback_counts()` (runtime/fallbacks.py); the transformers backend is autotune.integrations.transformers.
All are loaded on first access, so `import autotune` (and with it the CLI and compile-only use) never imports torch.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.1.0"

# public name -> submodule that defines it
_LAZY = {"attention": "runtime.attention_op", "explain": "runtime.attention_op",
         "scaled_dot_product_attention": "runtime.sdpa", "patch_sdpa": "runtime.sdpa", "capture": "runtime.capture",
         "set_benchmark_mode": "runtime.benchmark_mode", "fallback_counts": "runtime.fallbacks:counts"}

if TYPE_CHECKING:
    from .runtime.attention_op import attention, explain
    from .runtime.benchmark_mode import set_benchmark_mode
    from .runtime.capture import capture
    from .runtime.fallbacks import counts as fallback_counts
    from .runtime.sdpa import patch_sdpa, scaled_dot_product_attention


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'autotune' has no attribute {name!r}")
    import importlib

    module, _, attribute = module.partition(":")  # "module:attribute" where the public name differs
    value = getattr(importlib.import_module(f".{module}", __name__), attribute or name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = ["__version__", "attention", "capture", "explain", "fallback_counts", "patch_sdpa", "scaled_dot_product_attention",
           "set_benchmark_mode"]
