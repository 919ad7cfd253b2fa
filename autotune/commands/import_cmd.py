"""`autotune import PATH`: merge an exported best-per-shape table into the storage.

Per shape the faster row wins; a slower row already stored is kept in the replaced-rows table, never deleted.
Every row is checked the way the runtime checks it (known family, axes and values, the space's rules for its arch
and problem, config key and config agreeing, positive finite figures): a bad row is named with its index and
skipped, the good rows are imported, and the exit code is 1. A file that is not an export imports nothing (2)."""
from __future__ import annotations

import argparse
import sys

USAGE_ERROR = 2
ROWS_SKIPPED = 1


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("import", help="merge an exported best-per-shape JSON file", description=__doc__)
    p.add_argument("path", metavar="PATH", help="a file written by `autotune export`")
    p.add_argument("--storage", default=None, metavar="URL",
                   help="SQLAlchemy URL (default: $AUTOTUNE_STORAGE, else sqlite:///<repo or cwd>/studies/autotune.db)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from autotune.store import storage_url
    from autotune.store.best_table import BestStore, StoreError, read_export

    try:
        read_export(args.path)  # a file that is not an export: say so before the storage is opened (or created)
        with BestStore(args.storage) as store:
            counts = store.import_json(args.path)
            where = storage_url.describe(store.url)
    except (ValueError, StoreError) as err:
        print(f"autotune import: {err}", file=sys.stderr)
        return USAGE_ERROR
    except SQLAlchemyError as err:
        print(f"autotune import: the storage failed while writing: {storage_url.first_line(err)}; the rows "
              "imported so far are kept, and importing the file again is safe", file=sys.stderr)
        return USAGE_ERROR
    for why in counts.skipped:
        print(f"autotune import: skipped {why}", file=sys.stderr)
    print(f"imported {args.path} into {where}: {counts}")
    return ROWS_SKIPPED if counts.skipped else 0
