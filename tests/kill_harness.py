"""A replayed search that SIGKILLs itself at an exact moment of one config's trial (tests/test_faults.py).

    python3 kill_harness.py WHEN VICTIM LOG -- SEARCH_ARGS...

WHEN:   "evaluating": when VICTIM's evaluation has started (the search's own start_eval is done);
        "telling":    in VICTIM's tell, its verdict known and its measurement stored (deaths.store_measurement),
                      before the tell's writes (attrs, value and state: one transaction, storage_writes.py, so
                      a kill inside it leaves the same as a kill before it);
        "never":      no kill.
VICTIM: a config key, or "first" (the first config evaluated).
LOG:    each evaluation's config key is appended here, one per line, before any kill.

The kill is a real SIGKILL of this process: no clean-up runs, as when a host's OOM killer or an operator strikes.
"""
from __future__ import annotations

import os
import signal
import sys

from autotune.cli import main
from autotune.search import verdicts
from autotune.search.loop import TrialLoop


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def run(when: str, victim: str, log: str, search_args: list[str]) -> int:
    start_eval = TrialLoop.start_eval
    tell_writes = verdicts._tell

    def is_victim(key: str) -> bool:
        return victim in ("first", key)

    def evaluating(self, pending, build):
        start_eval(self, pending, build)
        with open(log, "a") as f:
            f.write(pending.config.key + "\n")
        if when == "evaluating" and is_victim(pending.config.key):
            _die()

    def telling(study, trial, outcome):
        if when == "telling" and is_victim(outcome.attrs.get("config_key", "")):
            _die()
        return tell_writes(study, trial, outcome)

    TrialLoop.start_eval = evaluating
    verdicts._tell = telling
    return main(["search", *search_args])


if __name__ == "__main__":
    when, victim, log, sep, *rest = sys.argv[1:]
    assert sep == "--" and when in ("evaluating", "telling", "never"), sys.argv
    sys.exit(run(when, victim, log, rest))
