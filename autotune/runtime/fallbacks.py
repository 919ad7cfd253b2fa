"""Calls that a drop-in entry point (the SDPA-compatible call, the transformers backend) hands to the stock
implementation instead of the kernel: counted per (entry point, reason) and reported once per reason, never silently.

The first fallback of each (entry point, reason) emits one `FallbackWarning` (and the same line at INFO on the
"autotune" logger, for servers that log rather than show warnings); later ones only count. `counts()` returns the totals, `reset()` forgets them (and re-arms the warnings).
Reasons are short fixed phrases with the value that decided them (e.g. "head_dim 96 (the kernel has 64, 128,
256)"), so a model that falls back for one reason on every layer and step reports one line, not thousands.
"""
from __future__ import annotations

import logging
import threading
import warnings

logger = logging.getLogger("autotune")


class FallbackWarning(UserWarning):
    """A call went to the stock implementation because the kernel does not support it (said once per reason)."""


_lock = threading.Lock()
_counts: dict[tuple[str, str], int] = {}


def record(where: str, reason: str, stock: str) -> None:
    """Count one fallback of entry point `where` for `reason`; the first one of its kind is reported, naming the
    `stock` implementation that ran instead."""
    key = (where, reason)
    with _lock:
        n = _counts.get(key, 0) + 1
        _counts[key] = n
    if n == 1:
        message = (f"autotune: {where} ran {stock} instead of the tuned kernel: {reason} (said once per reason; "
                   "autotune.fallback_counts() counts every fallback)")
        logger.info(message)
        warnings.warn(message, FallbackWarning, stacklevel=3)


def counts() -> dict[tuple[str, str], int]:
    """{(entry point, reason): number of calls that fell back}, a copy."""
    with _lock:
        return dict(_counts)


def reset() -> None:
    """Forget every count; the next fallback of each reason is reported again."""
    with _lock:
        _counts.clear()


__all__ = ["FallbackWarning", "counts", "record", "reset"]
