"""Shared fixtures: one kernel cache per test session (so compile-driven tests share builds), and the `gpu`
marker's skip when no CUDA device is visible (CI has nvcc but no GPU)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def build_cache_dir(tmp_path_factory) -> Path:
    """A kernel cache shared by every test of the session.

    Set AUTOTUNE_TEST_CACHE_DIR to keep it between runs: the cache key hashes the kernel sources, flags and
    nvcc version, so a stale entry can never be returned.
    """
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
