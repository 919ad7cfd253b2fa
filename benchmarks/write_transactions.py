#!/usr/bin/env python3
"""Count the write transactions of a replayed search on a SQLite file (CPU, seconds): the figure docs/search.md
quotes ("Asking without waste").

    PYTHONPATH=. python3 benchmarks/write_transactions.py [--trials 20] [LANDSCAPE]

Every transaction that ran an INSERT, UPDATE or DELETE on any engine of the process is counted when it commits
(SQLAlchemy events on the Engine class), with the table its first write touched, so the total splits into the
study's creation, each trial's writes and the finale's.
"""
from __future__ import annotations

import argparse
import collections
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DEFAULT = ROOT / "studies" / "landscapes" / "h200-b4-h16-n4096-d128-fp16-full-wgmma.json"


def main(argv=None) -> int:
    import sqlalchemy
    from sqlalchemy.engine import Engine

    from autotune.landscapes import landscape_file
    from autotune.search.loop import SearchOptions, run_search

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("landscape", nargs="?", default=str(DEFAULT))
    p.add_argument("--trials", type=int, default=20)
    args = p.parse_args(argv)
    dirty: dict[int, str] = {}
    counts: collections.Counter = collections.Counter()

    def statement(conn, cursor, text, parameters, context, executemany):
        words = text.lstrip().split(None, 3)
        if words and words[0].upper() in ("INSERT", "UPDATE", "DELETE") and id(conn) not in dirty:
            match = re.search(r"(?:INTO|UPDATE|FROM)\s+(\w+)", text, re.IGNORECASE)
            dirty[id(conn)] = match.group(1) if match else "?"

    def commit(conn):
        table = dirty.pop(id(conn), None)
        if table is not None:
            counts[table] += 1

    sqlalchemy.event.listen(Engine, "before_cursor_execute", statement)
    sqlalchemy.event.listen(Engine, "commit", commit)
    ls = landscape_file.load(args.landscape)
    with tempfile.TemporaryDirectory() as tmp:
        result = run_search(SearchOptions(shape=ls.shape, trials=args.trials, replay=ls, seed=0,
                                          storage=f"sqlite:///{tmp}/writes.db"), log=lambda _: None)
    total = sum(counts.values())
    print(f"{total} write transactions for a {args.trials}-trial replay of {ls.name} ({result.evaluated} evaluated, "
          f"{len(result.retimed)} re-timed), by the table each one wrote first:")
    for table, n in counts.most_common():
        print(f"  {n:5d}  {table}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
