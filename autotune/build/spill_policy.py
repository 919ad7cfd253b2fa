"""What to do with a build that spills registers: the rule that decides whether a build is worth running.

The search tells such builds to its sampler as `spilled` trials (search/verdicts.py); the sweep records them as
`spilled` rows without timing them (landscapes/sweep.py).
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class SpillPolicy:
    """What to do with a build that spills registers: `prune` (default), `allow`, or `max-bytes=N` (prune
    when spill stores + spill loads exceed N bytes per thread)."""

    mode: str = "prune"
    max_bytes: int = 0

    @classmethod
    def parse(cls, text: str) -> "SpillPolicy":
        text = text.strip().lower()
        if text in ("prune", "allow"):
            return cls(text)
        m = re.fullmatch(r"max-bytes=(\d+)", text)
        if m:
            return cls("max-bytes", int(m.group(1)))
        raise ValueError(f"--spill-policy: expected prune, allow or max-bytes=N (N ≥ 0), got {text!r}")

    def prunes(self, report) -> str | None:
        """The reason a build with this ptxas report is pruned, or None to evaluate it."""
        if report is None or self.mode == "allow":
            return None
        spilled = report.spill_stores + report.spill_loads
        if self.mode == "prune" and report.spilled:
            return (f"spills registers ({report.spill_stores} B stores, {report.spill_loads} B loads, "
                    f"{report.registers} registers) under --spill-policy prune")
        if self.mode == "max-bytes" and spilled > self.max_bytes:
            return f"spills {spilled} B (stores + loads) > {self.max_bytes} B allowed by --spill-policy {self}"
        return None

    def __str__(self) -> str:
        return f"max-bytes={self.max_bytes}" if self.mode == "max-bytes" else self.mode


__all__ = ["SpillPolicy"]
