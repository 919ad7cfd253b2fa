"""autotune: search the design space of a parameterized CUDA FlashAttention forward kernel.

`autotune.attention(q, k, v, causal=False, scale=None, return_lse=False)` runs the tuned kernel and
`autotune.explain(q, k, v, causal=False)` says which config it would use and why (autotune/runtime/attention_op.py).
Both are loaded on first access, so `import autotune` (and with it the CLI and compile-only use) never imports torch.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.1.0"

# public name -> submodule that defines it
_LAZY = {"attention": "runtime.attention_op", "explain": "runtime.attention_op"}

if TYPE_CHECKING:
    from .runtime.attention_op import attention, explain


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'autotune' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = ["__version__", "attention", "explain"]
