"""Where studies and the best-per-shape table live: one SQLAlchemy URL, resolved the same way everywhere.

Resolution order, first hit wins:
  1. the explicit value (`--storage URL` on the command line, `storage=` in Python);
  2. the environment variable `AUTOTUNE_STORAGE`;
  3. `sqlite:///<root>/studies/autotune.db`, where <root> is the autotune source checkout this package runs
     from (an editable install: the directory holding `studies/` next to `autotune/`), else the current
     working directory.

The search, `autotune best/export/import` and the runtime all call `resolve_storage_url`, so a tuned table
written by one is found by the others without extra flags.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

ENV_VAR = "AUTOTUNE_STORAGE"
DB_NAME = "autotune.db"


def default_root() -> Path:
    """The checkout's root when running from source (its studies/ is where tuned tables ship), else the cwd."""
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "studies").is_dir() and (checkout / "autotune").is_dir():
        return checkout
    return Path.cwd()


def default_storage_url() -> str:
    return f"sqlite:///{default_root() / 'studies' / DB_NAME}"


def resolve_storage_url(explicit: str | None = None) -> str:
    """The storage URL to use; see the module docstring for the order."""
    for candidate, origin in ((explicit, "--storage"), (os.environ.get(ENV_VAR), f"${ENV_VAR}")):
        if candidate is None:
            continue
        candidate = candidate.strip()
        if not candidate:
            raise ValueError(f"{origin}: expected an SQLAlchemy URL such as sqlite:///studies/autotune.db, got ''")
        return candidate
    return default_storage_url()


def sqlite_path(url: str) -> Path | None:
    """The database file of an SQLite URL (None for in-memory databases and other dialects)."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if not parsed.get_backend_name() == "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    return Path(parsed.database)


def prepare(url: str) -> str:
    """Create the directory an SQLite file will live in (SQLite creates the file, not its directory), and give a
    bare postgresql:// URL the driver that is installed (see postgres_driver)."""
    path = sqlite_path(url)
    if path is not None:
        path.expanduser().parent.mkdir(parents=True, exist_ok=True)
    return postgres_driver(url)


def postgres_driver(url: str) -> str:
    """`postgresql://...` means psycopg2 to SQLAlchemy; our `postgres` extra installs psycopg 3. People type the
    bare scheme, so when psycopg2 is missing and psycopg is there, use it: `postgresql+psycopg://...`. A URL
    that names its driver is left alone."""
    import importlib.util

    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.drivername != "postgresql":
        return url
    if importlib.util.find_spec("psycopg2") is None and importlib.util.find_spec("psycopg") is not None:
        return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    return url


def describe(url: str) -> str:
    """The URL as safe to print: passwords hidden; SQLite files as their absolute path."""
    from sqlalchemy.engine import make_url

    path = sqlite_path(url)
    if path is not None:
        return f"{make_url(url).render_as_string(hide_password=True)} ({path.expanduser().resolve()})"
    return make_url(url).render_as_string(hide_password=True)


def gpu_slug(gpu_name: str) -> str:
    """'NVIDIA H200' → 'h200'; 'NVIDIA GeForce RTX 4090' → 'geforce-rtx-4090'."""
    words = [w for w in re.split(r"[^a-z0-9]+", gpu_name.lower()) if w and w != "nvidia"]
    return "-".join(words) or "gpu"


__all__ = ["ENV_VAR", "default_root", "default_storage_url", "describe", "gpu_slug", "postgres_driver", "prepare",
           "resolve_storage_url", "sqlite_path"]
