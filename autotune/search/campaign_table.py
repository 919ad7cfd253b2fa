"""A campaign's closing table, read from the storage: per shape the shipped config (the best across both passes,
campaign_passes.py; else the first pass's winner) with its figure and both passes' medians, how it compares with
the fastest peer measured beside it, the evaluated trials and the seconds spent (summed over every run). A shipped
config that the table did not store (it kept another study's row, at least as fast) says so beside the config.

Read from each shape's study (its `retimed`, `baselines` and `campaign` attrs), not from this run's results, so
the table after the second of two runs covers the shapes the first one finished too. Plain text for the log, or
markdown for docs/benchmarks.md.
"""
from __future__ import annotations

from dataclasses import dataclass

from space import Config

from . import campaign_passes, campaign_run
from . import study as studies


@dataclass(frozen=True)
class ShapeRow:
    shape: object                  # space.Shape
    state: str                     # "finished", "unfinished" (a later run continues it), "not started"
    config_key: str | None = None  # the re-timed winner
    tflops: float | None = None
    peer: str | None = None        # the fastest peer measured beside it (sdpa_cudnn, fa4, ...), or the one asked for
    peer_tflops: float | None = None
    trials: int = 0                # evaluated (built) configs
    seconds: float | None = None   # wall seconds on this shape, every run of the campaign together
    passes: tuple = ()             # the shipped config's median in the first and second pass (campaign_passes)
    kept_from: str | None = None   # "study #trial" of another study's row the table kept instead (not stored)

    @property
    def versus_peer(self) -> float | None:
        return self.tflops / self.peer_tflops if self.tflops and self.peer_tflops else None


def shape_row(options, gpu_name: str, versus: str | None = None) -> ShapeRow:
    """versus: compare with this peer (e.g. sdpa_flash, the yardstick of the mma_sync family) instead of the
    fastest one measured; a study that did not measure it gets no ratio."""
    study = campaign_run.load_study(options, gpu_name)
    if study is None:
        return ShapeRow(options.shape, "not started")
    attrs = study.user_attrs
    record = campaign_run.record_of(study)
    key, tflops, figures = shipped(attrs)
    peers = {k: v for k, v in (attrs.get("baselines") or {}).items() if v}
    peer = versus if versus is not None else (max(peers, key=peers.get) if peers else None)
    kept = (attrs.get(campaign_passes.ATTR) or {}).get("kept_row")
    return ShapeRow(options.shape, "finished" if record.get("finished") else "unfinished", key, tflops,
                    peer, peers.get(peer), studies.StudyMemory.load(study, options.shape.problem).evaluated,
                    record.get("seconds"), figures, f"{kept['study']} #{kept['trial']}" if kept else None)


def shipped(attrs: dict) -> tuple[str | None, float | None, tuple]:
    """(config key, TFLOPS, (first, second) pass medians) of what the shape's study shipped: the second pass's
    choice across both passes when it ran (campaign_passes.ATTR; stored unless the table kept another study's
    faster row, ShapeRow.kept_from), else the first pass's (the `chosen` finalist; the fastest one in studies
    older than that attr)."""
    second = attrs.get(campaign_passes.ATTR) or {}
    across = next((f for f in second.get("finalists") or () if f.get("trial") == second.get("shipped")), None)
    if across is not None:
        return across["config_key"], across["across_tflops"], (across["first_tflops"], across["second_tflops"])
    done = [r for r in attrs.get("retimed") or [] if r.get("status") == "complete" and r.get("tflops")]
    best = next((r for r in done if r.get("chosen")), None) or (max(done, key=lambda r: r["tflops"]) if done else None)
    return (best["config_key"], best["tflops"], ()) if best else (None, None, ())


def shape_rows(plans: list, gpu_name: str, versus: str | None = None) -> list[ShapeRow]:
    return [shape_row(p, gpu_name, versus) for p in plans]


def short_config(key: str | None) -> str:
    """A config key short enough for a table column: `wgmma cw2 bc128 st3 ...`; each axis named by the
    initials of its words (consumer_wgs → cw) or its first two letters (stages → st), booleans as 0/1, other
    strings after '='. The full key is in the study and the exported table."""
    if not key:
        return "-"
    try:
        config = Config.from_key(key)
    except (KeyError, ValueError):
        return key
    parts = [config.family]
    for name, value in config.as_dict().items():
        if name == "family":
            continue
        words = name.split("_")
        short = "".join(w[0] for w in words) if len(words) > 1 else name[:2]
        parts.append(f"{short}{int(value)}" if isinstance(value, (bool, int)) else f"{short}={value}")
    return " ".join(parts)


COLUMNS = ("shape", "best config", "TFLOPS", "passes", "vs best peer", "trials", "seconds")


def versus_heading(versus: str | None) -> str:
    return f"vs {versus}" if versus else "vs best peer"


def _cells(row: ShapeRow) -> list[str]:
    versus = (f"{row.versus_peer:.2f}× {row.peer}" if row.versus_peer else
              f"{row.peer} not measured" if row.peer and row.tflops and not row.peer_tflops else "-")
    seconds = f"{row.seconds:.1f}" if row.seconds is not None else "-"
    config = short_config(row.config_key) if row.config_key else row.state
    if row.config_key and row.state != "finished":
        config += f" ({row.state})"
    if row.kept_from:
        config += f" (not stored: the table keeps {row.kept_from})"
    passes = " / ".join(f"{x:.1f}" for x in row.passes) if row.passes else "-"
    return [row.shape.key, config, f"{row.tflops:.1f}" if row.tflops else "-", passes, versus, str(row.trials),
            seconds]


def summary_line(rows: list[ShapeRow], versus: str | None = None) -> str:
    """Shapes finished, the mean seconds per finished shape (the campaign's cost figure), and the ratios' range
    against the best peer (or the peer `versus` names)."""
    done = [r for r in rows if r.state == "finished"]
    timed = [r.seconds for r in done if r.seconds is not None]
    mean = f"; {sum(timed) / len(timed):.1f} s per finished shape on average ({sum(timed):.0f} s)" if timed else ""
    ratios = sorted(r.versus_peer for r in rows if r.versus_peer)
    spread = f"; {versus_heading(versus)} {ratios[0]:.2f}-{ratios[-1]:.2f}×" if ratios else ""
    return f"{len(done)} of {len(rows)} shape(s) finished{mean}{spread}"


def format_table(rows: list[ShapeRow], markdown: bool = False, versus: str | None = None) -> str:
    """versus: the peer the rows were compared with (shape_rows' argument), for the heading and summary."""
    columns = tuple(versus_heading(versus) if c == "vs best peer" else c for c in COLUMNS)
    cells = [_cells(r) for r in rows]
    if markdown:
        lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in cells]
        return "\n".join(lines + ["", summary_line(rows, versus)])
    widths = [max(len(h), *(len(row[i]) for row in cells)) for i, h in enumerate(columns)]
    numeric = {2, 3, 4, 5, 6}

    def line(values):
        return "  " + "  ".join(v.rjust(w) if i in numeric else v.ljust(w)
                                for i, (v, w) in enumerate(zip(values, widths))).rstrip()

    out = [line(columns), line(["-" * w for w in widths])] + [line(row) for row in cells]
    return "\n".join(out + ["  " + summary_line(rows, versus)])


__all__ = ["COLUMNS", "ShapeRow", "format_table", "shape_row", "shape_rows", "short_config", "summary_line"]
