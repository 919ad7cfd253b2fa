"""`--causal [ALIGN]`, one spelling for every command that takes a shape (search, sweep, check, bench, best).

`--causal` alone means what it always meant: a causal mask aligned top-left (query i sees keys j <= i), like
SDPA's is_causal and `autotune.attention(causal=True)`. `--causal lower_right` aligns it to the end of the keys
(query i sees keys j <= i + Nk - Nq), as `autotune.attention(causal="lower_right")` does for decode with several
new tokens and chunked prefill; `--causal upper_left` spells the default out. The two agree when Nq == Nk, where
they are one shape (space.canonical_align).
"""
from __future__ import annotations

import space

HELP = ("causal masking: alone (or upper_left) aligned top-left like SDPA's is_causal; lower_right aligned to the "
        "end of the keys (query i sees keys up to Nk - Nq + i), as attention(causal=\"lower_right\") for decode "
        "with several new tokens; the two are one shape when --seqlen-k equals --seqlen")


def add(group, help: str = HELP) -> None:
    """Add `--causal [upper_left|lower_right]` to an argparse parser or group (dest "causal"; None when absent)."""
    group.add_argument("--causal", nargs="?", const="upper_left", default=None, choices=space.CAUSAL_ALIGNS,
                       metavar="upper_left|lower_right", help=help)


def mask(value) -> tuple[bool, str]:
    """(causal, causal_align) of the flag's value: None or False → not causal; True or an alignment → causal."""
    if value is None or value is False:
        return False, "upper_left"
    if value is True:
        return True, "upper_left"
    if value not in space.CAUSAL_ALIGNS:
        raise ValueError(f"--causal: expected one of {', '.join(space.CAUSAL_ALIGNS)}, got {value!r}")
    return True, value


def flag(shape: space.Shape) -> str | None:
    """The `--causal` words that ask for shape's mask ("--causal", "--causal lower_right"), None for no mask."""
    if not shape.causal:
        return None
    return "--causal lower_right" if shape.lower_right else "--causal"


__all__ = ["HELP", "add", "flag", "mask"]
