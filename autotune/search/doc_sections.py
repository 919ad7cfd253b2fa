"""Generated sections of a documentation page: the text between a BEGIN and an END marker line belongs to a
generator (compare-samplers' tables, the shipped tuned table), everything else on the page to its authors."""
from __future__ import annotations

from pathlib import Path

from ..store.best_table import write_atomically


def replace_section(text: str, begin: str, end: str, body: str) -> str:
    """`text` with the section between `begin` and `end` replaced by `body` (appended, markers and all, when
    there is none)."""
    section = f"{begin}\n\n{body}\n{end}"
    if begin in text and end in text:
        head, _, rest = text.partition(begin)
        _, _, tail = rest.partition(end)
        return head + section + tail
    return (text.rstrip("\n") + "\n\n" if text else "") + section + "\n"


def section(text: str, begin: str, end: str) -> str | None:
    """What the section between the markers holds now (None: no such section)."""
    if begin not in text or end not in text:
        return None
    return text.partition(begin)[2].partition(end)[0]


def write_section(path: str | Path, begin: str, end: str, body: str) -> Path:
    path = Path(path)
    text = path.read_text() if path.exists() else ""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, replace_section(text, begin, end, body))  # the rest of the page: a crash must not truncate it
    return path


__all__ = ["replace_section", "section", "write_section"]
