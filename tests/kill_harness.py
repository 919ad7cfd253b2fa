"""A replayed search that SIGKILLs itself at an exact moment of one config's trial (tests/test_faults.py).

    python3 kill_harness.py WHEN VICTIM LOG -- SEARCH_ARGS...

WHEN:   "evaluating": when VICTIM's evaluation has started (the search's own start_eval is done);
        "telling":    in the middle of VICTIM's tell, its verdict known (after its `status` attr was written,
                      before `tflops` and the state);
        "never":      no kill.
VICTIM: a config key, or "first" (the first config evaluated).
LOG:    each evaluation's config key is appended here, one per line, before any kill.

The kill is a real SIGKILL of this process: no clean-up runs, as when a host's OOM killer or an operator strikes.
"""
from __future__ import annotations

import os
import signal
import sys

import optuna

from autotune.cli import main
from autotune.search.loop import TrialLoop


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def run(when: str, victim: str, log: str, search_args: list[str]) -> int:
    start_eval = TrialLoop.start_eval
    set_user_attr = optuna.trial.Trial.set_user_attr
    telling = set()  # trial ids whose tell is under way for the victim

    def is_victim(key: str) -> bool:
        return victim in ("first", key)

    def evaluating(self, pending, build):
        start_eval(self, pending, build)
        with open(log, "a") as f:
            f.write(pending.config.key + "\n")
        if when == "evaluating" and is_victim(pending.config.key):
            _die()

    def told(self, key, value):
        set_user_attr(self, key, value)
        if when != "telling":
            return
        if key == "config_key" and is_victim(value):
            telling.add(self._trial_id)
        elif key == "status" and self._trial_id in telling:
            _die()

    TrialLoop.start_eval = evaluating
    optuna.trial.Trial.set_user_attr = told
    return main(["search", *search_args])


if __name__ == "__main__":
    when, victim, log, sep, *rest = sys.argv[1:]
    assert sep == "--" and when in ("evaluating", "telling", "never"), sys.argv
    sys.exit(run(when, victim, log, rest))
