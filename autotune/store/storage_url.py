"""Where studies and the best-per-shape table live: one SQLAlchemy URL, resolved the same way everywhere.

Resolution order, first hit wins:
  1. the explicit value (`--storage URL` on the command line, `storage=` in Python);
  2. the environment variable `AUTOTUNE_STORAGE`;
  3. `sqlite:///<root>/studies/autotune.db`, where <root> is the autotune source checkout this package runs
     from (an editable install: the directory holding `studies/` next to `autotune/`), else the current
     working directory.

The search, `autotune best/export/import` and the runtime all call `resolve_storage_url`, so a tuned table
written by one is found by the others without extra flags.

One error path for storage mistakes: `resolve_storage_url` refuses what is not an SQLAlchemy URL (a plain path, a
malformed URL, an unknown database kind) and `prepare` what cannot be opened (a missing directory; for read-only
use a missing file; a file that is not an SQLite database or is corrupt; a server that does not answer), each
with a StorageError: one line naming the URL or file and what to do. `prepare` reads a file it checks and never
writes it; only the default storage's directory is ever created (a mistyped --storage must not leave directories
and empty databases behind).
"""
from __future__ import annotations

import os
import re
import sqlite3
from pathlib import Path
from urllib.parse import quote

ENV_VAR = "AUTOTUNE_STORAGE"
DB_NAME = "autotune.db"
SQLITE_MAGIC = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite 3 database file
CONNECT_TIMEOUT_S = 10  # a server that does not answer in this long is reported, not waited for
EXAMPLES = "sqlite:///studies/autotune.db or postgresql://user@host/dbname"


class StorageError(ValueError):
    """A storage that cannot be used as asked. The message is one line that names the URL or file and says what
    to do; commands print it and exit 2. A ValueError, so callers that report bad arguments report it too."""


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
            raise StorageError(f"{origin}: expected an SQLAlchemy URL such as {EXAMPLES}, got ''")
        return check_syntax(candidate, origin)
    return default_storage_url()


def check_syntax(url: str, origin: str = "--storage") -> str:
    """`url` if SQLAlchemy can parse it and knows its database kind, else StorageError naming `origin`."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    if "://" not in url:  # a plain path ("studies/x.db") or a typo such as "sqlite:/x.db"
        # The file it names, made absolute: sqlite:/// + an absolute path is four slashes (sqlite:///x.db would
        # be x.db under the working directory).
        path = url[len("sqlite:"):] if url.startswith("sqlite:") else url
        hint = f"sqlite:///{Path(path).expanduser().absolute().as_posix()}"
        raise StorageError(f"{origin} {url!r}: not an SQLAlchemy URL; for an SQLite file write {hint} "
                           f"(URLs look like {EXAMPLES})")
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise StorageError(f"{origin} {url!r}: not an SQLAlchemy URL; expected one like {EXAMPLES}") from None
    try:
        parsed.get_dialect()
    except NoSuchModuleError:
        raise StorageError(f"{origin} {_hide_password(url)!r}: unknown database kind {parsed.drivername!r}; "
                           f"expected sqlite or postgresql, e.g. {EXAMPLES}") from None
    return url


def _hide_password(url: str) -> str:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # unparseable: nothing in it is known to be a password, show it as given
        return url


def sqlite_path(url: str) -> Path | None:
    """The database file of an SQLite URL (None for in-memory databases and other dialects)."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if not parsed.get_backend_name() == "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    return Path(parsed.database)


def prepare(url: str, *, create: bool = True, thorough: bool = True) -> str:
    """Check that the storage at `url` can be opened, and return the URL to open it with (a bare postgresql://
    given the driver that is installed, see postgres_driver). StorageError (one line) when it cannot.

    SQLite: an existing file must be an SQLite database that passes `PRAGMA quick_check` (read, never written);
    a missing file is created later by whoever opens it when `create`, else refused (read-only commands never
    create databases); its directory must exist, except the default storage's studies/ which is created.
    Servers: one connection is made and closed, with a timeout, so that a wrong host or a stopped server is said
    in one line before anything else is attempted. `thorough=False` (the runtime, which reads a storage on the
    first call of each problem and must stay fast on a large one) checks an SQLite file's header only.
    """
    path = sqlite_path(url)
    if path is not None:
        _check_sqlite(url, path.expanduser(), create, thorough)
        return url
    url = postgres_driver(url)
    if not url.startswith("sqlite"):
        ping(url)
    return url


def _check_sqlite(url: str, path: Path, create: bool, thorough: bool) -> None:
    if path.is_dir():
        raise StorageError(f"{describe(url)}: {path} is a directory; name a database file inside it, e.g. "
                           f"sqlite:///{path / DB_NAME}")
    if not path.exists():
        if not create:
            missing = f"directory {path.parent} does not exist" if not path.parent.is_dir() else "no such database file"
            raise StorageError(f"{describe(url)}: {missing}; check the URL (--storage or ${ENV_VAR}), or run "
                               "`autotune search` to create it")
        if not path.parent.is_dir():
            if not is_default(url):
                raise StorageError(f"{describe(url)}: directory {path.parent} does not exist; create it "
                                   f"(mkdir -p {path.parent}) or fix the URL")
            path.parent.mkdir(parents=True, exist_ok=True)  # the default studies/ of a fresh install
        return
    check_sqlite_file(path, describe(url), thorough=thorough)


def check_sqlite_file(path: Path, name: str | None = None, *, thorough: bool = True) -> None:
    """StorageError unless `path` is an SQLite database that passes `PRAGMA quick_check` (`thorough=False`: that
    starts like one). Opened read-only, so the check itself can never modify the file. An empty file is an empty
    database to SQLite: accepted."""
    name = name or str(path)
    try:
        with open(path, "rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except OSError as e:
        raise StorageError(f"{name}: cannot read the database file: {e.strerror}") from None
    if not head:
        return
    what_to_do = "it was left untouched; move it aside or pass another --storage"
    if head != SQLITE_MAGIC:
        raise StorageError(f"{name}: not an SQLite database (it starts with {head[:8]!r}); {what_to_do}")
    if not thorough:
        return
    if any(Path(f"{path}{suffix}").exists() for suffix in ("-journal", "-wal")):
        return  # an interrupted transaction that the next writer rolls back: a read-only check cannot judge it
    try:
        conn = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True, timeout=5)
    except sqlite3.Error as e:
        raise StorageError(f"{name}: cannot open the database file: {e}") from None
    try:
        problems = [row[0] for row in conn.execute("PRAGMA quick_check(3)")]
    except sqlite3.OperationalError:
        return  # locked by a writer, say: not a judgement on the file; whoever opens it next waits for the lock
    except sqlite3.DatabaseError as e:
        raise StorageError(f"{name}: corrupt SQLite database ({e}); {what_to_do}") from None
    finally:
        conn.close()
    if problems != ["ok"]:
        # quick_check's report spans lines ("*** in database main ***", then one line per problem): the first
        # problem is enough to say what is wrong, on the one line an error gets.
        lines = [line.strip() for p in problems for line in str(p).splitlines()
                 if line.strip() and not line.startswith("***")]
        raise StorageError(f"{name}: corrupt SQLite database ({(lines or ['quick_check failed'])[0][:200]}); "
                           f"{what_to_do}")


def ping(url: str) -> None:
    """Connect to a database server once (CONNECT_TIMEOUT_S at most) and disconnect; StorageError if that fails."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import SQLAlchemyError
    from sqlalchemy.pool import NullPool

    connect_args = {"connect_timeout": CONNECT_TIMEOUT_S} if url.startswith("postgresql") else {}
    try:
        engine = create_engine(url, poolclass=NullPool, connect_args=connect_args)
    except ImportError as e:
        raise StorageError(f"{describe(url)}: the database driver {e.name!r} is not installed; for PostgreSQL: "
                           "pip install 'autotune[postgres]'") from None
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except SQLAlchemyError as e:
        raise StorageError(f"{describe(url)}: cannot connect: {first_line(e)}; is the server running, and are the "
                           "host, port, user and database name right?") from None
    finally:
        engine.dispose()


def first_line(err: BaseException) -> str:
    """The driver's own message of a database error, on one line (SQLAlchemy appends SQL and a link)."""
    orig = getattr(err, "orig", None) or err
    lines = [line.strip() for line in str(orig).splitlines() if line.strip()]
    return lines[0] if lines else type(orig).__name__


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


def gpu_matches(pattern: str, gpu_name: str) -> bool:
    """The one rule for naming a GPU on the command line (`best --gpu`, `best --explain --gpu`, `export --gpu`):
    `pattern` occurs in the GPU's name, case-insensitively ('h200' matches 'NVIDIA H200')."""
    return pattern.strip().lower() in gpu_name.lower()


def is_default(url: str) -> bool:
    """Whether `url` is the default storage (no --storage, no $AUTOTUNE_STORAGE): a fresh install has none yet."""
    return url == default_storage_url()


def gpu_slug(gpu_name: str) -> str:
    """'NVIDIA H200' → 'h200'; 'NVIDIA GeForce RTX 4090' → 'geforce-rtx-4090'."""
    words = [w for w in re.split(r"[^a-z0-9]+", gpu_name.lower()) if w and w != "nvidia"]
    return "-".join(words) or "gpu"


__all__ = ["ENV_VAR", "StorageError", "check_sqlite_file", "check_syntax", "default_root", "default_storage_url",
           "describe", "first_line", "gpu_matches", "gpu_slug", "is_default", "ping", "postgres_driver", "prepare", "resolve_storage_url",
           "sqlite_path"]
