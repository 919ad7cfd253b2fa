"""A kernel cache that cannot be poisoned: a cached cubin is used only when its hash is one that something trusted
computed (the best-table row, this process's own build, or the meta.json of an entry only this user can have
written), never on the word of the meta.json beside it (build/builder.py). Real nvcc, no GPU.

    protection                                          test
    meta.json of an entry others may write not trusted  test_a_planted_cubin_with_a_matching_meta_json_is_not_a_cache_hit
    the row's hash checks the cached cubin              test_the_runtime_checks_a_cached_cubin_against_its_rows_hash
    the stored row records the cubin's hash             test_the_stored_winner_records_the_hash_of_the_cubin_it_was_timed_with
    a cache others can write is reported                test_best_explain_reports_a_kernel_cache_that_others_can_write
    this user's entries stay private (umask 002)        test_entries_built_under_a_loose_umask_stay_trusted
"""
from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import warnings
from pathlib import Path

import pytest

from autotune.build.builder import Builder, CacheIntegrityWarning
from test_build import ARCH, DEFAULT, PROBLEM, compile_calls, wrapper_nvcc
from test_distributed import double  # noqa: F401  (fixture: the search's test-double evaluator)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, str, bytes]:
    """One real build of DEFAULT: (its cache, key, cubin bytes); tests copy the cache and tamper with the copy."""
    cache = tmp_path_factory.mktemp("trusted-cache")
    result = Builder(ARCH, cache_dir=cache).build_one(DEFAULT, PROBLEM)
    assert result.ok, result.error
    return cache, result.key, result.cubin_bytes()


def _copy(built, tmp_path) -> tuple[Path, Path]:
    cache, key, _ = built
    mine = tmp_path / "cache"
    shutil.copytree(cache, mine)
    return mine, mine / key[:2] / key


def _plant(entry: Path, good: bytes) -> bytes:
    """Replace the entry's cubin with other bytes and make its meta.json agree, as someone writing the cache can."""
    planted = bytearray(good)
    planted[len(planted) // 2] ^= 0xFF
    (entry / "kernel.cubin").write_bytes(bytes(planted))
    meta = json.loads((entry / "meta.json").read_text())
    meta["cubin_hash"] = hashlib.sha256(bytes(planted)).hexdigest()
    (entry / "meta.json").write_text(json.dumps(meta))
    return bytes(planted)


def _writable_by_others(entry: Path) -> None:
    entry.chmod(0o777)
    for f in entry.iterdir():
        f.chmod(0o666)


def _owned_by_someone_else(entry: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving files to another user needs root")
    nobody = pwd.getpwnam("nobody")
    for path in (entry, *entry.iterdir()):
        os.chown(path, nobody.pw_uid, nobody.pw_gid)


@pytest.mark.parametrize("how", [_writable_by_others, _owned_by_someone_else])
def test_a_planted_cubin_with_a_matching_meta_json_is_not_a_cache_hit(built, tmp_path, how):
    _, _, good = built
    cache, entry = _copy(built, tmp_path)
    planted = _plant(entry, good)
    how(entry)
    nvcc, calls = wrapper_nvcc(tmp_path)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        result = Builder(ARCH, cache_dir=cache, nvcc=nvcc).build_one(DEFAULT, PROBLEM)
    assert result.cubin_bytes() == good != planted  # never the planted kernel: compiled here instead
    assert len(compile_calls(calls)) == 1 and not result.cached
    said = [str(w.message) for w in seen if issubclass(w.category, CacheIntegrityWarning)]
    assert any("not trusted without a recorded hash" in m for m in said), said
    assert any("is not what this build of the same key made" in m for m in said), said
    (aside,) = (cache / ".damaged").iterdir()
    assert (aside / "kernel.cubin").read_bytes() == planted  # kept to look at, out of the way


def test_the_runtime_checks_a_cached_cubin_against_its_rows_hash(built, tmp_path, monkeypatch):
    """The row's hash lets a shared entry be used without compiling it again when it is the measured cubin, and
    turns a planted one into a local rebuild that says so."""
    from autotune.runtime import lookup

    _, _, good = built
    row_hash = hashlib.sha256(good).hexdigest()
    cache, entry = _copy(built, tmp_path)
    _writable_by_others(entry)  # a colleague's entry in a group cache: the right bytes, but not ours
    nvcc, calls = wrapper_nvcc(tmp_path)
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(cache))
    monkeypatch.setattr(lookup, "Builder", lambda arch, jobs=1: Builder(arch, jobs=jobs, nvcc=nvcc))
    lookup.clear_caches()
    try:
        same = lookup.build(DEFAULT, PROBLEM, ARCH, trusted_hash=row_hash)
        assert same.cached and same.cubin_bytes() == good and compile_calls(calls) == []

        planted = _plant(entry, good)
        lookup.clear_caches()
        with pytest.warns(CacheIntegrityWarning, match="its best-table row recorded; moved to .* rebuilt locally"):
            rebuilt = lookup.build(DEFAULT, PROBLEM, ARCH, trusted_hash=row_hash)
        assert rebuilt.cubin_bytes() == good != planted and len(compile_calls(calls)) == 1
    finally:
        lookup.clear_caches()


def test_the_stored_winner_records_the_hash_of_the_cubin_it_was_timed_with(tmp_path, build_cache_dir, double):
    from autotune.search.loop import run_search
    from autotune.store.best_table import BestStore
    from test_distributed import options

    url = f"sqlite:///{tmp_path / 's.db'}"
    result = run_search(options(url, build_cache_dir, trials=1))  # (options: arch sm_80)
    timed = Builder("sm_80", cache_dir=build_cache_dir).build_one(result.best.config, result.shape.problem)
    with BestStore(url, read_only=True) as store:
        (row,) = store.all_rows()
    assert row.cubin_hash == timed.cubin_hash == hashlib.sha256(timed.cubin_bytes()).hexdigest()


def test_best_explain_reports_a_kernel_cache_that_others_can_write(tmp_path, capsys, monkeypatch):
    from autotune.cli import main

    (tmp_path / "empty.db").touch()
    cache = tmp_path / "kernels"
    cache.mkdir(mode=0o755)
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(cache))
    args = ["best", "--explain", "--seqlen", "1024", "--gpu", "NVIDIA H200", "--arch", "sm_90",
            "--storage", f"sqlite:///{tmp_path}/empty.db"]
    assert main(args) == 0
    assert "can be written by other users" not in capsys.readouterr().out  # private: nothing to say
    cache.chmod(0o777)
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"kernel cache {cache} can be written by other users" in out and "mode 0777" in out, out


def test_entries_built_under_a_loose_umask_stay_trusted(built, tmp_path):
    """A umask of 002 (user private groups) would leave entries group-writable, hence untrusted, hence compiled
    again by every process: this user's entries are written without group or other write permission."""
    from autotune.build.builder import written_by_others

    _, _, good = built
    old = os.umask(0o002)
    try:
        result = Builder(ARCH, cache_dir=tmp_path / "cache").build_one(DEFAULT, PROBLEM)
    finally:
        os.umask(old)
    entry = result.cubin_path.parent
    assert written_by_others([entry, *entry.iterdir()]) is None and result.cubin_bytes() == good
    nvcc, calls = wrapper_nvcc(tmp_path)
    assert Builder(ARCH, cache_dir=tmp_path / "cache", nvcc=nvcc).build_one(DEFAULT, PROBLEM).cached
    assert compile_calls(calls) == []
