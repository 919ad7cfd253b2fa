"""Nothing a user stored is ever lost, tried as a careless user would: storage mistakes give one line
naming the URL or file and what to do, exit 2 and leave every file as it was; read-only commands create
nothing; `export` never empties a table by mistake and replaces its file atomically; `best` shows where the
runtime's configs come from and matches --gpu one way everywhere.

Every mistake is the real one: a real file of random bytes, a real SQLite file with damaged pages, a real port
nothing listens on, a real directory that does not exist.
"""
from __future__ import annotations

import hashlib
import json
import re
import os
import socket
import sqlite3
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.store import storage_url
from autotune.store.best_table import BestEntry, BestStore

import space

LANDSCAPE = Path(__file__).resolve().parent.parent / "studies" / "landscapes" / "h200-b1-h64-n1024-d128-bf16-full-wgmma.json"
SHIPPED = Path(__file__).resolve().parent.parent / "studies" / "tuned" / "h200.json"
SHAPE = space.Shape(batch=4, heads=16, seqlen_q=4096, head_dim=128)
CONFIG = space.default_config(SHAPE.problem, space.get_arch("sm_90"))
N_SHIPPED = len(json.loads(SHIPPED.read_text())["rows"])
# every shipped table (h100.json, h200.json and h200-decode.json), in the order best lists them
SHIPPED_FILES = sorted(SHIPPED.parent.glob("*.json"))
N_ALL_SHIPPED = sum(len(json.loads(f.read_text())["rows"]) for f in SHIPPED_FILES)


@pytest.fixture(autouse=True)
def no_env_storage(monkeypatch):
    monkeypatch.delenv(storage_url.ENV_VAR, raising=False)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree(root: Path) -> dict[str, str]:
    """Every file under root with its content's hash: what a command must leave exactly as it was."""
    return {str(p.relative_to(root)): digest(p) if p.is_file() else "dir" for p in sorted(root.rglob("*"))}


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def random_bytes_file(tmp_path: Path) -> Path:
    bad = tmp_path / "random.db"
    bad.write_bytes(os.urandom(8192))
    return bad


def damaged_sqlite_file(tmp_path: Path) -> Path:
    """A real SQLite database (with Optuna-like content) whose pages after the first were overwritten."""
    good = tmp_path / "good.db"
    with sqlite3.connect(good) as con:
        con.execute("create table t(x)")
        con.executemany("insert into t values (?)", [(i,) for i in range(5000)])
    data = bytearray(good.read_bytes())
    for i in range(4096, len(data), 7):
        data[i] = 0xAB
    bad = tmp_path / "damaged.db"
    bad.write_bytes(bytes(data))
    good.unlink()
    return bad


def one_line_error(capsys, rc: int) -> str:
    out = capsys.readouterr()
    lines = [line for line in out.err.splitlines() if line.strip()]
    assert rc == 2, out
    assert "Traceback" not in out.err and len(lines) == 1, out.err
    assert "invalid data in the commit" not in out.err + out.out
    return lines[0]


def commands(tmp_path: Path) -> dict[str, list[str]]:
    """Every command that opens the storage, with what it needs besides --storage."""
    export_to = tmp_path / "out" / "table.json"
    export_to.parent.mkdir(exist_ok=True)
    return {
        "best": ["best"],
        "best --json": ["best", "--json"],
        "best --explain": ["best", "--explain", "--seqlen", "4096", "--gpu", "h200", "--arch", "sm_90"],
        "export": ["export", str(export_to)],
        "import": ["import", str(SHIPPED)],
        "report": ["report", "--out", str(tmp_path / "reports")],
        "search": ["search", "--replay", str(LANDSCAPE), "--trials", "2"],
    }


COMMANDS = ["best", "best --json", "best --explain", "export", "import", "report", "search"]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("url,expect", [
    ("studies/x.db", "not an SQLAlchemy URL; for an SQLite file write sqlite:///"),
    ("sqlite:/studies/x.db", "not an SQLAlchemy URL"),
    ("postgres://user@localhost/db", "unknown database kind 'postgres'"),
])
def test_a_malformed_url_is_one_line_naming_it(tmp_path, capsys, monkeypatch, command, url, expect):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "studies").mkdir()
    args = commands(tmp_path)[command]
    before = tree(tmp_path)
    line = one_line_error(capsys, main([*args, "--storage", url]))
    assert expect in line and repr(url) in line and "--storage" in line
    if command != "search":  # (a replay ignores $AUTOTUNE_STORAGE by design: it never mixes with real studies)
        monkeypatch.setenv(storage_url.ENV_VAR, url)  # the same mistake in the environment names the variable
        line = one_line_error(capsys, main(args))
        assert expect in line and "$AUTOTUNE_STORAGE" in line
    assert tree(tmp_path) == before  # nothing created


@pytest.mark.parametrize("command", COMMANDS)
def test_a_missing_directory_is_one_line_and_is_not_created(tmp_path, capsys, command):
    url = f"sqlite:///{tmp_path / 'typo' / 'autotune.db'}"
    line = one_line_error(capsys, main([*commands(tmp_path)[command], "--storage", url]))
    assert str(tmp_path / "typo") in line and "does not exist" in line
    assert not (tmp_path / "typo").exists()


@pytest.mark.parametrize("command", ["best", "best --explain", "export", "report"])
def test_read_only_commands_never_create_a_database(tmp_path, capsys, command):
    db = tmp_path / "autotune.db"
    line = one_line_error(capsys, main([*commands(tmp_path)[command], "--storage", f"sqlite:///{db}"]))
    assert str(db) in line
    assert not db.exists()


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("make_bad,expect", [
    (random_bytes_file, "not an SQLite database"),
    (damaged_sqlite_file, "corrupt SQLite database"),
])
def test_a_corrupt_or_non_database_file_is_one_line_and_left_untouched(tmp_path, capsys, command, make_bad, expect):
    bad = make_bad(tmp_path)
    before = digest(bad)
    line = one_line_error(capsys, main([*commands(tmp_path)[command], "--storage", f"sqlite:///{bad}"]))
    assert expect in line and str(bad) in line and "move it aside" in line
    assert digest(bad) == before


@pytest.mark.parametrize("command", COMMANDS)
def test_an_unreachable_server_is_one_line(tmp_path, capsys, command):
    url = f"postgresql://autotune@127.0.0.1:{closed_port()}/nothing"
    line = one_line_error(capsys, main([*commands(tmp_path)[command], "--storage", url]))
    assert f"127.0.0.1:{url.rsplit(':', 1)[1].split('/')[0]}" in line
    assert "cannot connect" in line or "driver" in line


def test_the_checks_pass_a_good_storage_and_an_empty_file(tmp_path):
    empty = tmp_path / "empty.db"
    empty.touch()  # SQLite's own view: an empty file is an empty database
    assert storage_url.prepare(f"sqlite:///{empty}", create=False) == f"sqlite:///{empty}"
    with BestStore(f"sqlite:///{tmp_path / 'good.db'}") as s:
        s.record_best(BestEntry.for_shape(SHAPE, "NVIDIA H200", "sm_90", CONFIG, 300.0))
    storage_url.prepare(f"sqlite:///{tmp_path / 'good.db'}", create=False)


# ---- export: never an empty table over rows, atomically ------------------------------------------------------

def _store_with_a_row(tmp_path) -> str:
    url = f"sqlite:///{tmp_path / 'user.db'}"
    with BestStore(url) as s:
        s.record_best(BestEntry.for_shape(SHAPE, "NVIDIA H200", "sm_90", CONFIG, 300.0, study="s", trial=1))
    return url


def test_export_refuses_to_write_an_empty_table_over_rows(tmp_path, capsys):
    table = tmp_path / "h200.json"
    table.write_bytes(SHIPPED.read_bytes())
    url = _store_with_a_row(tmp_path)
    for mistake in (["--gpu", "h100"], ["--seqlen", "123"]):  # a mistyped filter selects nothing
        line = one_line_error(capsys, main(["export", str(table), "--storage", url, *mistake]))
        assert f"holds {N_SHIPPED} row(s)" in line and "nothing was written" in line and "--force" in line
        assert table.read_bytes() == SHIPPED.read_bytes()
    empty = tmp_path / "empty.db"
    empty.touch()  # an empty storage: the other way the issue lost the shipped table
    one_line_error(capsys, main(["export", str(table), "--storage", f"sqlite:///{empty}"]))
    assert table.read_bytes() == SHIPPED.read_bytes() and empty.stat().st_size == 0

    assert main(["export", str(table), "--storage", url, "--gpu", "h100", "--force"]) == 0  # said twice: do it
    assert json.loads(table.read_text())["rows"] == []
    assert main(["export", str(table), "--storage", url, "--gpu", "h100"]) == 0  # empty over empty loses nothing


def test_export_replaces_the_file_atomically_and_leaves_it_on_error(tmp_path, capsys, monkeypatch):
    table = tmp_path / "h200.json"
    table.write_bytes(SHIPPED.read_bytes())
    table.chmod(0o640)
    url = _store_with_a_row(tmp_path)

    def disk_full(fd):  # the write reached the temporary file; the disk then filled up
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    rc = main(["export", str(table), "--storage", url])
    line = one_line_error(capsys, rc)
    assert "No space left on device" in line and "left as it was" in line
    assert table.read_bytes() == SHIPPED.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h200.json", "user.db"]  # no temporary file left behind
    monkeypatch.undo()
    assert main(["export", str(table), "--storage", url]) == 0
    assert len(json.loads(table.read_text())["rows"]) == 1
    assert table.stat().st_mode & 0o777 == 0o640  # the replaced file keeps its permissions
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h200.json", "user.db"]


def test_export_refuses_a_missing_directory(tmp_path, capsys):
    url = _store_with_a_row(tmp_path)
    line = one_line_error(capsys, main(["export", str(tmp_path / "tunde" / "h200.json"), "--storage", url]))
    assert "tunde" in line and "does not exist" in line
    assert not (tmp_path / "tunde").exists()


# ---- import: a bad row is named by its index and skipped --------------------------------------------------------

def test_import_names_a_bad_row_skips_it_and_imports_the_rest(tmp_path, capsys):
    doc = json.loads(SHIPPED.read_text())
    doc["rows"][3]["config_key"] = doc["rows"][3]["config_key"].replace("wgmma:", "wgmma:nope=1,")
    doc["rows"][5]["config"] = dict(doc["rows"][5]["config"], stages=2 if doc["rows"][5]["config"]["stages"] != 2 else 3)
    doc["rows"][7]["tflops"] = "fast"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    url = f"sqlite:///{tmp_path / 'user.db'}"
    assert main(["import", str(bad), "--storage", url]) == 1  # partly imported: not a clean success
    out = capsys.readouterr()
    skipped = [line for line in out.err.splitlines() if "skipped" in line]
    assert len(skipped) == 3 and all(f"rows[{i}]" in line for i, line in zip((3, 5, 7), skipped))
    assert f"{N_SHIPPED - 3} inserted" in out.out and "3 skipped" in out.out
    with BestStore(url, read_only=True) as s:
        assert len(s.all_rows()) == N_SHIPPED - 3


# ---- best: where the runtime's configs come from; one --gpu rule ----------------------------------------------

def test_best_shows_the_shipped_rows_the_runtime_uses(tmp_path, capsys):
    url = _store_with_a_row(tmp_path)
    assert main(["best", "--storage", url]) == 0
    out = capsys.readouterr().out
    shipped = json.loads(SHIPPED.read_text())["rows"]
    names = ", ".join(f.name for f in SHIPPED_FILES)
    assert f"({N_ALL_SHIPPED} row(s) from the tables shipped in {SHIPPED.parent}: {names})" in out
    assert "(1 row(s) from storage" in out
    assert out.count(" h200.json ") == len(shipped)  # every shipped row, marked with its file
    assert all(r["config_key"] in out for r in shipped)
    # the shipped row of the stored row's shape is marked: the stored one wins at run time
    hidden = [r for r in shipped if (r["seqlen"], r["batch"], r["heads"], r["dtype"], r["head_dim"], r["causal"]) ==
              (4096, 4, 16, "fp16", 128, False)]
    assert out.count("(hidden)") == len(hidden)


def test_best_gpu_is_one_rule_with_a_warning_when_nothing_matches(tmp_path, capsys):
    empty = tmp_path / "empty.db"
    empty.touch()
    storage = ["--storage", f"sqlite:///{empty}"]
    explain = ["best", "--explain", "--seqlen", "4096", "--arch", "sm_90", *storage]
    assert main([*explain, "--gpu", "h200"]) == 0  # a part of the name, as `best --gpu h200` takes it
    out = capsys.readouterr()
    assert "on NVIDIA H200 (sm_90)" in out.out and "source: shipped" in out.out and out.err == ""
    assert main([*explain, "--gpu", "NVIDIA H200"]) == 0
    assert "source: shipped" in capsys.readouterr().out
    assert main([*explain, "--gpu", "h20O"]) == 0
    out = capsys.readouterr()
    assert "--gpu 'h20O' matches no GPU with tuned rows" in out.err and "'NVIDIA H200'" in out.err
    # explained for that name as a GPU of sm_90 with no rows of its own: another sm_90 GPU's row stands in (the
    # H200's or the H100's: the faster of the two exact rows), said so
    assert "source: same_arch" in out.out and re.search(r"tuned on NVIDIA H[12]00[^,]*, another GPU of sm_90", out.out)
    assert main(["best", "--gpu", "h20O", *storage]) == 0
    out = capsys.readouterr()
    assert "--gpu 'h20O' matches no GPU with tuned rows" in out.err and "no stored or shipped rows match" in out.out
    assert main(["best", "--gpu", "H200", *storage]) == 0  # the H200's shipped rows, not the H100's
    n_h200 = sum(r["gpu_name"] == "NVIDIA H200" for f in SHIPPED_FILES for r in json.loads(f.read_text())["rows"])
    assert f"({n_h200} row(s) from the tables shipped" in capsys.readouterr().out
    assert empty.stat().st_size == 0  # nothing was written into the storage
