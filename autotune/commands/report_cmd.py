"""`autotune report`: one self-contained HTML report per study (plotly, opens offline), PNGs beside it.

Studies are chosen by name (--study) or by the shape the search recorded (--seqlen, --batch, ...); with several
matching, each gets its own report. With no selector at all, every study in the storage is reported.
"""
from __future__ import annotations

import argparse
import sys

import space

USAGE_ERROR = 2
DEFAULT_OUT = "reports"


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("report", help="HTML/PNG report of a study", description=__doc__)
    p.add_argument("--study", default=None, metavar="NAME", help="the study's name")
    p.add_argument("--seqlen", type=int, default=None, help="only studies of this (query) sequence length")
    p.add_argument("--batch", type=int, default=None, help="only studies of this batch size")
    p.add_argument("--heads", type=int, default=None, help="only studies with this many heads")
    p.add_argument("--head-dim", type=int, default=None, choices=space.HEAD_DIMS, help="only this head dimension")
    p.add_argument("--dtype", default=None, choices=space.DTYPES, help="only this element type")
    p.add_argument("--causal", default=None, action=argparse.BooleanOptionalAction,
                   help="only causal (--causal) or only non-causal (--no-causal) studies")
    p.add_argument("--storage", default=None, metavar="URL",
                   help="SQLAlchemy URL of the studies (default: $AUTOTUNE_STORAGE, else studies/autotune.db)")
    p.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                   help=f"directory for <study>.html and its PNGs (default: ./{DEFAULT_OUT})")
    p.add_argument("--png", default=True, action=argparse.BooleanOptionalAction,
                   help="also write static PNGs (matplotlib) beside the HTML (default: yes)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    missing = _missing_extra()
    if missing:
        print(f"autotune report: needs {missing}, from the optional `report` extra; install it with\n"
              "  pip install 'autotune[report]'   (or: pip install plotly matplotlib)", file=sys.stderr)
        return USAGE_ERROR

    import optuna

    from autotune.store import storage_url
    from autotune.report import select, write_report

    url = existing_storage_url(args.storage, "report")
    if url is None:
        return USAGE_ERROR

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.get_storage(url)
    entries = select.list_studies(storage)
    filters = {k: getattr(args, k) for k in select.SHAPE_FILTERS}
    chosen = select.match(entries, args.study, **filters)
    if not chosen:
        print(_no_match(args, filters, entries, storage_url.describe(url)), file=sys.stderr)
        return USAGE_ERROR

    for entry in chosen:
        files = write_report(optuna.load_study(study_name=entry.name, storage=storage), args.out, png=args.png)
        pngs = f" and {len(files.pngs)} PNGs beside it" if files.pngs else ""
        print(f"{entry.name}: wrote {files.html}{pngs}")
    return 0


def _missing_extra() -> str | None:
    """plotly and matplotlib are an optional extra of the package: say so instead of a traceback."""
    for module in ("plotly", "matplotlib"):
        try:
            __import__(module)
        except ImportError:
            return module
    return None


def existing_storage_url(explicit: str | None, command: str) -> str | None:
    """The resolved storage URL, or None (after saying why in one line) when it cannot be read as it is:
    malformed, a missing SQLite file (opening it would silently create an empty database and report "no
    studies"), a corrupt one, a server that does not answer (storage_url.prepare, read-only)."""
    from autotune.store import storage_url

    try:
        url = storage_url.resolve_storage_url(explicit)
        path = storage_url.sqlite_path(url)
        if path is not None and not path.expanduser().exists() and path.expanduser().parent.is_dir():
            print(f"autotune {command}: no study storage at {storage_url.describe(url)}; run `autotune search` "
                  "first or pass --storage URL", file=sys.stderr)
            return None
        return storage_url.prepare(url, create=False)  # a missing directory, a corrupt file, no server
    except ValueError as e:  # storage_url.StorageError: one line naming the URL and what to do
        print(f"autotune {command}: {e}", file=sys.stderr)
        return None


def _no_match(args, filters: dict, entries, where: str) -> str:
    asked = ([f"--study {args.study}"] if args.study else []) + [
        f"--{k.replace('_', '-')} {v}" if not isinstance(v, bool) else ("--causal" if v else "--no-causal")
        for k, v in filters.items() if v is not None]
    head = f"autotune report: no study in {where}" + (f" matches {' '.join(asked)}" if asked else "")
    if not entries:
        return head + "\n  the storage holds no studies yet; `autotune search` writes them"
    return head + "\n  available studies:\n" + "\n".join(f"    {e.describe()}" for e in entries)
