"""`autotune import PATH`: merge an exported best-per-shape table into the storage.

Per shape the faster row wins; a slower row already stored is kept in the replaced-rows table, never deleted.
The file is validated completely before anything is written."""
from __future__ import annotations

import argparse
import sys

USAGE_ERROR = 2


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("import", help="merge an exported best-per-shape JSON file", description=__doc__)
    p.add_argument("path", metavar="PATH", help="a file written by `autotune export`")
    p.add_argument("--storage", default=None, metavar="URL",
                   help="SQLAlchemy URL (default: $AUTOTUNE_STORAGE, else sqlite:///<repo or cwd>/studies/autotune.db)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from autotune.store import storage_url
    from autotune.store.best_table import BestStore, StoreError

    try:
        with BestStore(args.storage) as store:
            counts = store.import_json(args.path)
            where = storage_url.describe(store.url)
    except (ValueError, StoreError) as err:
        print(f"autotune import: {err}", file=sys.stderr)
        return USAGE_ERROR
    print(f"imported {args.path} into {where}: {counts}")
    return 0
