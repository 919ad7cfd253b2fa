"""`autotune dashboard`: optuna-dashboard (the optional `dashboard` extra) on the studies' storage."""
from __future__ import annotations

import argparse
import sys

from .report_cmd import existing_storage_url

USAGE_ERROR = 2
INSTALL_HINT = "pip install 'autotune[dashboard]'   (or: pip install optuna-dashboard)"


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("dashboard", help="browse the studies in optuna-dashboard", description=__doc__)
    p.add_argument("--storage", default=None, metavar="URL",
                   help="SQLAlchemy URL of the studies (default: $AUTOTUNE_STORAGE, else studies/autotune.db)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=8080, help="port to listen on (default: 8080)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from autotune.store import storage_url

    dashboard = _optuna_dashboard()
    if dashboard is None:
        print(f"autotune dashboard: optuna-dashboard is not installed; install it with\n  {INSTALL_HINT}",
              file=sys.stderr)
        return USAGE_ERROR
    url = existing_storage_url(args.storage, "dashboard")
    if url is None:
        return USAGE_ERROR

    print(f"optuna-dashboard on {storage_url.describe(url)}: http://{args.host}:{args.port}/ (Ctrl-C stops it)",
          flush=True)
    dashboard.run_server(url, host=args.host, port=args.port)  # blocks until Ctrl-C
    return 0


def _optuna_dashboard():
    """The optional package, or None when it is not installed."""
    try:
        import optuna_dashboard
    except ImportError:
        return None
    return optuna_dashboard
