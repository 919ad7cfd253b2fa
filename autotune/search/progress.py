"""What the search prints: one line per built trial while it runs, and the final table.

Line-based on purpose (no tqdm, no carriage returns): it reads the same in a terminal, a CI log and a file.
Invalid and repeated configs are not given a line each (a mostly invalid space would drown the log); they
are counted and shown on the next line that is printed, whether they were stored (queued configs) or only
told to the sampler (proposals.py).
"""
from __future__ import annotations

import statistics
from typing import Callable

from .verdicts import DUPLICATE_OF, SAME_CUBIN_AS

STATUS_ORDER = ("complete", "spilled", "compile_error", "wrong", "crashed", "timeout", "invalid")


def _short(text: str, width: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


class ProgressPrinter:
    def __init__(self, target: int, log: Callable[[str], None] = print, best: list | None = None):
        self.target = target
        self.log = log
        self.best_value: float | None = None
        self.best_text = "none yet"
        self.skipped_invalid = 0
        self.skipped_repeat = 0
        if best:  # resuming: the study's best so far
            t = best[0]
            self._new_best(t.number, t.user_attrs.get("config_key", "?"), t.value)

    def _new_best(self, number: int, key: str, value: float) -> None:
        self.best_value = value
        self.best_text = f"{value:.1f} TFLOPS #{number} {key}"

    def skipped(self, invalid: int, repeated: int) -> None:
        """Proposals settled without a stored trial (proposals.py): shown on the next line like stored ones."""
        self.skipped_invalid += invalid
        self.skipped_repeat += repeated

    def told(self, number: int, config, outcome, evaluated: int) -> None:

        if outcome.status == "invalid":
            self.skipped_invalid += 1
            return
        if DUPLICATE_OF in outcome.attrs:
            self.skipped_repeat += 1
            return
        value = outcome.value
        if value is not None and (self.best_value is None or value > self.best_value):
            self._new_best(number, config.key, value)
        if outcome.status == "complete":
            ms = outcome.attrs.get("time_ms")
            what = f"{value:7.1f} TFLOPS" + (f" {ms:.4f} ms" if ms else "")
        else:
            what = _short(outcome.reason, 70)
        if SAME_CUBIN_AS in outcome.attrs:
            what += f" (same cubin as #{outcome.attrs[SAME_CUBIN_AS]})"
        skipped = []
        if self.skipped_invalid:
            skipped.append(f"{self.skipped_invalid} invalid")
        if self.skipped_repeat:
            skipped.append(f"{self.skipped_repeat} repeated")
        tail = f"  (+{', '.join(skipped)} skipped)" if skipped else ""
        self.skipped_invalid = self.skipped_repeat = 0
        width = len(str(self.target))
        self.log(f"[{evaluated:>{width}}/{self.target}] #{number:<4} {outcome.status:<13} {what} | "
                 f"best {self.best_text}{tail}")


def _fmt(x, spec: str, missing: str = "-") -> str:
    return format(x, spec) if isinstance(x, (int, float)) else missing


def time_lines(r) -> list[str]:
    """Where the trial loop's time went: evaluating, the GPU waiting for builds, asking, telling, building (in
    the background). A replay has no GPU: it says so instead of reporting idle time, unless its builds and
    evaluations were paced (a simulated GPU host, landscapes/replay.py)."""
    summed = " (summed over the workers)" if r.workers else ""
    loop = f"{r.loop_seconds:.1f} s" if r.loop_seconds else f"{r.wall_seconds:.1f} s (whole search)"
    asking = f"asking {r.ask_seconds:.1f} s, telling {r.tell_seconds:.1f} s"
    if r.replay and not r.simulated:
        return [f"  trial loop {loop}: {asking}; replayed, so no GPU was idle or busy: builds and evaluations "
                f"were answered from the landscape at once"]
    gpu = "simulated GPU" if r.simulated else "GPU"
    share = f" ({r.idle_seconds / r.loop_seconds:.0%})" if r.loop_seconds and not r.workers else ""
    first = f", first evaluation after {r.first_eval_after:.1f} s" if r.first_eval_after is not None else ""
    lines = [f"  trial loop {loop}{summed}: evaluating {r.eval_seconds:.1f} s; {gpu} idle waiting for builds: "
             f"{r.idle_seconds:.1f} s{share}, idle otherwise {r.idle_other_seconds:.1f} s{first}; {asking}; "
             f"building {r.build_seconds:.1f} s (in the background)"]
    if r.batch_sizes and r.in_flight_at_ask:
        lines.append("  " + ahead_line(r.batch_sizes, r.in_flight_at_ask))
    if r.simulated:
        lines.append(f"  simulated GPU host: {r.simulated}")
    return lines


def ahead_line(batch_sizes: list[int], in_flight_at_ask: list[int]) -> str:
    """How far ahead of the GPU the search ran: the batches' sizes and what the sampler did not know yet."""
    sizes = sorted(batch_sizes)
    lag = sorted(in_flight_at_ask)
    return (f"ahead of the GPU: {len(sizes)} batches of {sizes[0]}-{sizes[-1]} configs (median "
            f"{statistics.median(sizes):g}); configs in flight at an ask: median {statistics.median(lag):g}, "
            f"max {lag[-1]}")


def format_result(r) -> str:
    """The final report of a options.SearchResult."""
    lines = [f"study {r.study_name} on {r.gpu_name} ({r.arch.name}), shape {r.shape.key}",
             f"  stopped: {r.stop_reason}; {r.evaluated} evaluated trials in the study"]
    if r.proposals:
        lines.append(f"  this run: {r.asks} trials stored from {r.proposals} proposals ({r.proposals_invalid} invalid "
                     f"and {r.proposals_repeated} repeated ones told to the sampler only, never stored)")
    else:
        lines.append(f"  this run: {r.asks} trials stored")
    counts = ", ".join(f"{s} {r.counts.get(s, 0)}" for s in STATUS_ORDER)
    others = {k: v for k, v in r.counts.items() if k not in STATUS_ORDER}
    if others:
        counts += ", " + ", ".join(f"{k} {v}" for k, v in sorted(others.items()))
    lines.append(f"  trials by status: {counts}")
    lines.append(f"  pruned for register spills: {r.counts.get('spilled', 0)} (this run: {r.this_run.get('spilled', 0)})")
    lines.extend(time_lines(r))
    for line in r.workers:
        lines.append(f"  {line}")

    lines.append("")
    header = f"  {'':<16} {'TFLOPS':>8} {'ms':>8} {'spread':>7} {'regs':>5} {'spill':>6} {'blk/SM':>6}  config"
    lines.append(header)
    for t in r.top:
        a = t.user_attrs
        spill = (a.get("spill_stores") or 0) + (a.get("spill_loads") or 0)
        lines.append(f"  {'trial #' + str(t.number):<16} {_fmt(t.value, '8.1f'):>8} {_fmt(a.get('time_ms'), '8.4f'):>8} "
                     f"{_fmt(a.get('time_spread_ms'), '7.4f'):>7} {_fmt(a.get('registers'), 'd'):>5} {spill:>6} "
                     f"{_fmt(a.get('blocks_per_sm'), 'd'):>6}  {a.get('config_key')}")
    if not r.top:
        lines.append("  (no trial completed)")
    for name in ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient", *sorted(set(r.baselines) - {"sdpa_flash", "sdpa_cudnn", "sdpa_efficient"})):
        if name in r.baselines:
            lines.append(f"  {name:<16} {_fmt(r.baselines[name], '8.1f', 'n/a'):>8}")
    if not r.baselines:
        lines.append("  (no SDPA baselines: the evaluator measures none)")

    if r.retimed:
        lines.append("")
        lines.append("  re-timed in one session:")
        for x in r.retimed:
            o = x.outcome
            if o.status == "complete":
                lines.append(f"    #{x.number:<5} {o.tflops:8.1f} TFLOPS  {_fmt(o.time_ms, '.4f')} ms "
                             f"± {_fmt(o.spread_ms, '.4f')}  (trial said {x.trial_tflops:.1f})")
            else:
                lines.append(f"    #{x.number:<5} {o.status}: {_short(o.reason, 80)}")
    for note in r.notes:
        lines.append(f"  note: {note}")

    lines.append("")
    best = r.best
    if r.interrupted:
        lines.append("  interrupted: nothing was re-timed or stored; the same command resumes the study")
    elif best is None:
        lines.append("  no valid configuration completed: nothing stored")
    else:
        flash = r.baselines.get("sdpa_flash")
        versus = f" = {best.outcome.tflops / flash:.2f}× sdpa_flash" if flash else ""
        peers = {k: v for k, v in r.baselines.items() if v and k != "sdpa_flash"}
        if peers:  # the fastest other kernel measured beside it (cuDNN, FlashAttention-4): the bar to clear
            name = max(peers, key=peers.get)
            versus += f"{',' if versus else ' ='} {best.outcome.tflops / peers[name]:.2f}× {name}"
        rate = ""
        if r.shape.is_decode and best.outcome.time_ms:  # memory-bound: time and the K/V read rate say more
            rate = (f" ({1e3 * best.outcome.time_ms:.1f} µs, K/V read at "
                    f"{r.shape.kv_bytes / (best.outcome.time_ms * 1e-3) / 1e12:.2f} TB/s)")
        lines.append(f"  best: trial #{best.number} {best.config.key}: {best.outcome.tflops:.1f} TFLOPS{rate}{versus}")
        rec = r.record
        if rec is not None:
            if rec.action == "held":
                lines.append("  stored: held for the campaign's second pass (the best across both passes is stored)")
            elif rec.action == "kept":
                lines.append(f"  stored: kept the existing row, as fast or faster ({rec.entry.tflops:.1f} TFLOPS from "
                             f"{rec.entry.study} #{rec.entry.trial}) in autotune_best at {r.storage}")
            else:
                was = f", replacing {rec.previous.tflops:.1f} TFLOPS" if rec.previous else ""
                lines.append(f"  stored: {rec.action} in autotune_best{was} at {r.storage}")
    if r.replay:
        if ":memory:" in r.storage or "%3Amemory%3A" in r.storage:  # storage_url.describe quotes it
            kept = "the study lived in memory, nothing was stored"
        else:
            kept = (f"its trials (replayed values) were stored as study {r.study_name} at {r.storage}; no best config "
                    "was stored")
        lines.append(f"  replayed from {r.replay}: nothing was compiled or run; {kept}")
    return "\n".join(lines)


__all__ = ["ProgressPrinter", "format_result", "time_lines"]
