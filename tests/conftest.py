"""Shared fixtures: one kernel cache per test session (so compile-driven tests share builds), the `gpu`
marker's skip when no CUDA device is visible (CI has nvcc but no GPU), and the skip of compile-driven tests
when no nvcc is found, with the hint to install one (NVIDIA's wheels: `pip install -e '.[nvcc]'`).

Where tests learn that nvcc is missing: the `build_cache_dir` fixture (every compile-driven test that shares
builds, in-process or through a subprocess, asks for it) and any test whose own code raises NvccNotFoundError
(a Builder made without that fixture). Both skip only when nvcc is really absent from this machine (checked
once, before any test could monkeypatch the search), so a test that wrongly loses nvcc still fails.
"""
from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

from autotune.build.nvcc import WHEELS_HINT, NvccNotFoundError, find_nvcc, nvcc_version


@functools.lru_cache(maxsize=None)
def nvcc_missing() -> str | None:
    """Why no nvcc can be used on this machine (the skip reason), or None when one is found."""
    try:
        nvcc_version(find_nvcc())  # found and runs (a wrapper script left pointing at a removed toolkit does not)
    except NvccNotFoundError:
        return f"needs nvcc, and none is found: {WHEELS_HINT}, or install the CUDA toolkit"
    return None


def pytest_sessionstart(session):
    nvcc_missing()  # decided before any test's monkeypatch can hide nvcc


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test that fails on NvccNotFoundError on a machine with no nvcc is skipped with the install hint."""
    outcome = yield
    report = outcome.get_result()
    if (report.failed and call.excinfo is not None and call.excinfo.errisinstance(NvccNotFoundError)
            and nvcc_missing()):
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {nvcc_missing()}")


@pytest.fixture(scope="session")
def build_cache_dir(tmp_path_factory) -> Path:
    """A kernel cache shared by every test of the session; skips the test when no nvcc is found.

    Set AUTOTUNE_TEST_CACHE_DIR to keep it between runs: the cache key hashes the kernel sources, flags and
    nvcc version, so a stale entry can never be returned.
    """
    if nvcc_missing():
        pytest.skip(nvcc_missing())
    keep = os.environ.get("AUTOTUNE_TEST_CACHE_DIR")
    if keep:
        path = Path(keep).expanduser()
        path.mkdir(parents=True, exist_ok=True)
        return path
    return tmp_path_factory.mktemp("kernel-cache")


def cuda_available() -> bool:
    try:
        import torch
    except Exception:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items or cuda_available():  # import torch only when some test needs the answer
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in gpu_items:
        item.add_marker(skip)
