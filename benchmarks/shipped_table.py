#!/usr/bin/env python3
"""docs/benchmarks.md's table of the shipped H200 configs, generated from studies/tuned/h200.json.

    PYTHONPATH=. python3 benchmarks/shipped_table.py            # rewrite the section between the markers
    PYTHONPATH=. python3 benchmarks/shipped_table.py --check    # exit 1 when the page and the file disagree

(autotune/search/shipped_table.py; tests/test_shipped_table.py runs --check's test.)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    from autotune.search import shipped_table

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--table", default=str(ROOT / "studies" / "tuned" / "h200.json"))
    p.add_argument("--page", default=str(ROOT / "docs" / "benchmarks.md"))
    p.add_argument("--check", action="store_true", help="compare only; write nothing")
    args = p.parse_args(argv)
    if args.check:
        if shipped_table.matches(args.table, args.page):
            print(f"{args.page}: the shipped table matches {args.table}")
            return 0
        print(f"{args.page}: the shipped table differs from {args.table}; regenerate it: "
              "python3 benchmarks/shipped_table.py")
        return 1
    print(f"wrote {shipped_table.write(args.table, args.page)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
