"""A throwaway PostgreSQL server for tests: `initdb` + `pg_ctl` in a temporary directory, listening on
127.0.0.1 on a free port (and a Unix socket in that directory), stopped and deleted at the end of the session.

Use it by importing the fixtures into a test module (no conftest: only the modules that need a server pay for it):

    from pg_server import pg_server, postgres_url  # noqa: F401  (pytest fixtures)

`postgres_url` is a fresh, empty database per test (`postgresql+psycopg://autotune@127.0.0.1:PORT/test_N`).

When the binaries (or the psycopg driver) are missing the tests are skipped, except under `CI=true`, where a
missing server is a broken CI machine and the tests fail instead of silently passing.

PostgreSQL refuses to run as root, and CI runs as root: the cluster then belongs to the `postgres` user (or
`nobody`), and its directory is made under the system temp dir (pytest's own tmp dirs are 0700 root).
"""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

USER = "autotune"  # the database superuser initdb creates (trust auth: localhost only, throwaway data)


def find_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    # Debian/Ubuntu keep the server binaries off PATH, one directory per major version: take the newest.
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: int(p.split("/")[4]))
    return candidates[-1] if candidates else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_as() -> pwd.struct_passwd | None:
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise RuntimeError("running as root, and neither a 'postgres' nor a 'nobody' user exists to own the cluster")


class PgServer:
    """One cluster: start() → url(db) → create_database(name) → stop()."""

    def __init__(self, initdb: str, pg_ctl: str):
        self.initdb, self.pg_ctl = initdb, pg_ctl
        self.owner = _run_as()
        self.root = Path(tempfile.mkdtemp(prefix="autotune-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port: int | None = None
        self._databases = 0

    def _run(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
        kw = {}
        if self.owner is not None:
            kw = dict(user=self.owner.pw_uid, group=self.owner.pw_gid, extra_groups=[])
        env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
        return subprocess.run(argv, cwd=self.root, env=env, capture_output=True, text=True, timeout=timeout,
                              check=False, **kw)

    def start(self) -> None:
        if self.owner is not None:
            os.chown(self.root, self.owner.pw_uid, self.owner.pw_gid)
        r = self._run(self.initdb, "-D", str(self.data), "-U", USER, "-A", "trust", "-E", "UTF8", "--no-locale",
                      "--no-sync")
        if r.returncode:
            raise RuntimeError(f"initdb failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
        for attempt in range(3):  # the free port can be taken between our probe and the server's bind
            self.port = _free_port()
            settings = {
                "listen_addresses": "'127.0.0.1'", "port": str(self.port),
                "unix_socket_directories": f"'{self.root}'", "max_connections": "200", "shared_buffers": "32MB",
                # throwaway data: durability costs time and buys nothing here
                "fsync": "off", "synchronous_commit": "off", "full_page_writes": "off",
            }
            conf = self.data / "postgresql.auto.conf"
            self._write_as_owner(conf, "".join(f"{k} = {v}\n" for k, v in settings.items()))
            r = self._run(self.pg_ctl, "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start")
            if r.returncode == 0:
                return
            time.sleep(0.2 * (attempt + 1))
        log = self.log.read_text(errors="replace")[-3000:] if self.log.is_file() else ""
        raise RuntimeError(f"pg_ctl start failed ({r.returncode}):\n{r.stdout}\n{r.stderr}\n{log}")

    def _write_as_owner(self, path: Path, text: str) -> None:
        path.write_text(text)
        if self.owner is not None:
            os.chown(path, self.owner.pw_uid, self.owner.pw_gid)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{USER}@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        """A new empty database; returns its SQLAlchemy URL."""
        import psycopg

        self._databases += 1
        name = f"test_{self._databases}"
        with psycopg.connect(host="127.0.0.1", port=self.port, user=USER, dbname="postgres", autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def pause(self) -> None:
        """Stop the server as `pg_ctl -m fast restart` does first: every connection is terminated (AdminShutdown)."""
        r = self._run(self.pg_ctl, "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop")
        if r.returncode:
            raise RuntimeError(f"pg_ctl stop failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")

    def resume(self) -> None:
        """Start the server again after pause(), on the same port and data."""
        r = self._run(self.pg_ctl, "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start")
        if r.returncode:
            raise RuntimeError(f"pg_ctl start failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")

    def stop(self) -> None:
        try:
            if self.port is not None:
                self._run(self.pg_ctl, "-D", str(self.data), "-m", "immediate", "-w", "stop", timeout=60)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def _unavailable(why: str):
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"PostgreSQL tests cannot run under CI: {why}", pytrace=False)
    pytest.skip(f"PostgreSQL tests need a local server: {why}")


@pytest.fixture(scope="session")
def pg_server():
    initdb, pg_ctl = find_bin("initdb"), find_bin("pg_ctl")
    if not initdb or not pg_ctl:
        _unavailable("initdb/pg_ctl not found (apt-get install postgresql)")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        _unavailable("the psycopg driver is missing (pip install -e '.[test]')")
    server = PgServer(initdb, pg_ctl)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_url(pg_server) -> str:
    """A fresh database on the session's server."""
    return pg_server.create_database()


__all__ = ["PgServer", "find_bin", "pg_server", "postgres_url"]
