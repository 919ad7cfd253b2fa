"""`autotune export PATH`: write the best-per-shape table (or the rows the filters select) as reviewable JSON,
e.g. to ship a tuned table in studies/tuned/.

The storage is only read (a mistyped --storage is an error, never a new empty database). PATH is replaced all at
once (a temporary file beside it, then a rename), so an error leaves it as it was; an export that selects no rows
is refused over a file that holds rows (--force writes it anyway). --merge keeps the file's rows of shapes the
storage has no row for."""
from __future__ import annotations

import argparse
import sys

from .best_cmd import add_filter_arguments, filters_from_args, gpu_warning

USAGE_ERROR = 2


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("export", help="write the best-per-shape table as JSON", description=__doc__)
    p.add_argument("path", metavar="PATH", help="JSON file to write (replaced if it exists; its directory must exist)")
    add_filter_arguments(p)
    p.add_argument("--merge", action="store_true",
                   help="keep the rows PATH already holds for shapes the storage has no row for (a storage that "
                        "retuned some shapes updates a shipped table); the storage's row wins for the same shape")
    p.add_argument("--force", action="store_true",
                   help="write the file even when no row matches and PATH holds rows (which are then lost)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from autotune.store import storage_url
    from autotune.store.best_table import BestStore, StoreError

    try:
        filters = filters_from_args(args)
        with BestStore(args.storage, read_only=True) as store:
            n = store.export_json(args.path, force=args.force, merge=args.merge, **filters)
            kept = store.kept
            where = storage_url.describe(store.url)
            skipped = store.skipped
            warning = gpu_warning(args.gpu, store.gpu_names())
    except (ValueError, StoreError) as err:
        print(f"autotune export: {err}", file=sys.stderr)
        return USAGE_ERROR
    except SQLAlchemyError as err:
        print(f"autotune export: the storage failed while reading: {storage_url.first_line(err)}; {args.path} was "
              "left as it was", file=sys.stderr)
        return USAGE_ERROR
    except OSError as err:
        print(f"autotune export: PATH: cannot write {args.path}: {err.strerror}; it was left as it was",
              file=sys.stderr)
        return USAGE_ERROR
    for why in skipped:
        print(f"autotune export: skipped {why}", file=sys.stderr)
    if warning:
        print(f"autotune export: {warning}", file=sys.stderr)
    merged = f" ({kept} kept from the file, for shapes the storage has no row for)" if args.merge else ""
    print(f"wrote {n} row(s) from {where} to {args.path}{merged}")
    return 0
