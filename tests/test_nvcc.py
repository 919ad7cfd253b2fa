"""Locating nvcc: the search order, and an error that says where it looked and how to fix it."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from autotune.build import nvcc as nvcc_mod
from autotune.build.nvcc import NvccNotFoundError, find_nvcc, nvcc_version


def fake_cuda_home(root: Path, version_line: str = "Cuda compilation tools, release 99.1, V99.1.1") -> Path:
    """A directory that looks like a CUDA install: bin/nvcc answers --version."""
    nvcc = root / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text(f"#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\necho '{version_line}'\n"
                    "echo 'Build cuda_99.1.r99/compiler.1_0'\n")
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IXUSR)
    return root


@pytest.fixture
def nowhere(monkeypatch, tmp_path):
    """No CUDA_HOME, an empty PATH, no torch and no /usr/local/cuda: every place comes up empty."""
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    monkeypatch.setattr(nvcc_mod, "_torch_cuda_home", lambda: None)
    monkeypatch.setattr(nvcc_mod, "DEFAULT_CUDA_HOME", tmp_path / "no-cuda")


def test_cuda_home_comes_first(monkeypatch, tmp_path):
    home = fake_cuda_home(tmp_path / "cuda")
    monkeypatch.setenv("CUDA_HOME", str(home))
    assert find_nvcc() == home / "bin" / "nvcc"


def test_path_then_torch_then_default(nowhere, monkeypatch, tmp_path):
    torch_home = fake_cuda_home(tmp_path / "torch-cuda")
    default_home = fake_cuda_home(tmp_path / "default-cuda")
    path_home = fake_cuda_home(tmp_path / "path-cuda")

    monkeypatch.setattr(nvcc_mod, "DEFAULT_CUDA_HOME", default_home)
    assert find_nvcc() == default_home / "bin" / "nvcc"
    monkeypatch.setattr(nvcc_mod, "_torch_cuda_home", lambda: str(torch_home))
    assert find_nvcc() == torch_home / "bin" / "nvcc"
    monkeypatch.setenv("PATH", str(path_home / "bin"))
    assert find_nvcc() == path_home / "bin" / "nvcc"


def test_cuda_home_without_nvcc_falls_through(nowhere, monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "not-cuda"))
    default_home = fake_cuda_home(tmp_path / "default-cuda")
    monkeypatch.setattr(nvcc_mod, "DEFAULT_CUDA_HOME", default_home)
    assert find_nvcc() == default_home / "bin" / "nvcc"


def test_not_found_says_where_it_looked_and_how_to_fix(nowhere, monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "wrong"))
    with pytest.raises(NvccNotFoundError) as err:
        find_nvcc()
    message = str(err.value)
    assert str(tmp_path / "wrong" / "bin" / "nvcc") in message
    assert "PATH" in message
    assert "torch" in message
    assert str(tmp_path / "no-cuda" / "bin" / "nvcc") in message
    assert "set CUDA_HOME" in message


def test_a_non_executable_file_is_not_nvcc(nowhere, monkeypatch, tmp_path):
    home = fake_cuda_home(tmp_path / "cuda")
    (home / "bin" / "nvcc").chmod(0o644)
    monkeypatch.setenv("CUDA_HOME", str(home))
    with pytest.raises(NvccNotFoundError, match="not an executable"):
        find_nvcc()


def test_version_is_the_release_and_build_lines(tmp_path):
    home = fake_cuda_home(tmp_path / "cuda")
    version = nvcc_version(home / "bin" / "nvcc")
    assert version == "Cuda compilation tools, release 99.1, V99.1.1; Build cuda_99.1.r99/compiler.1_0"


def test_version_of_a_broken_nvcc_is_a_clear_error(tmp_path):
    with pytest.raises(NvccNotFoundError, match="--version"):
        nvcc_version(tmp_path / "missing-nvcc")


def test_the_real_nvcc_reports_a_release():
    version = nvcc_version()
    assert version.startswith("Cuda compilation tools, release ")
    assert os.access(find_nvcc(), os.X_OK)
