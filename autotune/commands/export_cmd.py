"""`autotune export PATH`: write the best-per-shape table (or the rows the filters select) as reviewable JSON,
e.g. to ship a tuned table in studies/."""
from __future__ import annotations

import argparse
import sys

from .best_cmd import add_filter_arguments, filters_from_args

USAGE_ERROR = 2


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("export", help="write the best-per-shape table as JSON", description=__doc__)
    p.add_argument("path", metavar="PATH", help="JSON file to write (replaced if it exists)")
    add_filter_arguments(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from autotune.store import storage_url
    from autotune.store.best_table import BestStore, StoreError

    try:
        filters = filters_from_args(args)
        with BestStore(args.storage) as store:
            n = store.export_json(args.path, **filters)
            where = storage_url.describe(store.url)
    except (ValueError, StoreError) as err:
        print(f"autotune export: {err}", file=sys.stderr)
        return USAGE_ERROR
    except OSError as err:
        print(f"autotune export: PATH: cannot write {args.path}: {err.strerror}", file=sys.stderr)
        return USAGE_ERROR
    print(f"wrote {n} row(s) from {where} to {args.path}")
    return 0
