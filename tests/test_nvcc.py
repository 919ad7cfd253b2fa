"""Locating nvcc: the search order, and an error that says where it looked and how to fix it."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.build import nvcc as nvcc_mod
from autotune.build.nvcc import WHEELS_HINT, NvccNotFoundError, find_nvcc, nvcc_version

TORCH_CUDA_HOME = nvcc_mod._torch_cuda_home


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
    """No CUDA_HOME, an empty PATH, no torch, no /usr/local/cuda and no wheels: every place comes up empty."""
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    monkeypatch.setattr(nvcc_mod, "_torch_cuda_home", lambda: None)
    monkeypatch.setattr(nvcc_mod, "DEFAULT_CUDA_HOME", tmp_path / "no-cuda")
    monkeypatch.setattr(nvcc_mod, "wheel_cuda_homes", lambda: [])


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


def test_torchs_cuda_home_is_found_without_importing_torch(tmp_path):
    """Step 3 costs no torch import (seconds, in every build process of a machine whose nvcc is the wheels'): what
    torch's CUDA_HOME adds to the other steps is $CUDA_PATH, read from the environment."""
    home = fake_cuda_home(tmp_path / "cuda-path")
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "PYTHONPATH")}
    env.update(CUDA_PATH=str(home), PATH=str(tmp_path / "empty-path"), PYTHONPATH=str(Path(__file__).parent.parent))
    probe = ("import sys; from autotune.build.nvcc import locate_nvcc; path, where = locate_nvcc(); "
             "print(path, where, 'torch' in sys.modules, sep='|')")
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"{home / 'bin' / 'nvcc'}|torch's CUDA_HOME|False"


def test_an_imported_torchs_own_cuda_home_is_used(nowhere, monkeypatch, tmp_path):
    cpp_extension = pytest.importorskip("torch.utils.cpp_extension")
    home = fake_cuda_home(tmp_path / "torch-cuda")
    monkeypatch.setattr(nvcc_mod, "_torch_cuda_home", TORCH_CUDA_HOME)  # the real one (`nowhere` stubs it)
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", str(home))
    assert nvcc_mod.locate_nvcc() == (home / "bin" / "nvcc", "torch's CUDA_HOME")


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


# ---- NVIDIA's nvcc wheels: the fallback when the machine has no CUDA toolkit ------------------------------------

def fake_wheel_home(root: Path, companions: bool = True) -> Path:
    """nvidia/cu13/ as NVIDIA's CUDA 13 wheels lay it out: bin/nvcc, and (with companions) the runtime and crt
    headers and nvvm's cicc beside it."""
    home = fake_cuda_home(root / "nvidia" / "cu13")
    if companions:
        for rel, _ in nvcc_mod.WHEEL_COMPANIONS:
            (home / rel).parent.mkdir(parents=True, exist_ok=True)
            (home / rel).write_text("")
    return home


def test_the_wheels_come_after_every_system_toolkit(nowhere, monkeypatch, tmp_path):
    wheel = fake_wheel_home(tmp_path / "site")
    monkeypatch.setattr(nvcc_mod, "wheel_cuda_homes", lambda: [wheel])
    assert nvcc_mod.locate_nvcc() == (wheel / "bin" / "nvcc", "NVIDIA's nvcc wheels")
    default_home = fake_cuda_home(tmp_path / "default-cuda")
    monkeypatch.setattr(nvcc_mod, "DEFAULT_CUDA_HOME", default_home)
    assert nvcc_mod.locate_nvcc() == (default_home / "bin" / "nvcc", str(default_home))


def test_the_wheels_are_found_in_the_nvidia_namespace_package(monkeypatch, tmp_path):
    older = fake_wheel_home(tmp_path / "a").parent / "cu12"
    older.mkdir()
    newer = fake_wheel_home(tmp_path / "b")
    monkeypatch.delitem(__import__("sys").modules, "nvidia", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path / "a"))
    monkeypatch.syspath_prepend(str(tmp_path / "b"))
    homes = nvcc_mod.wheel_cuda_homes()
    assert homes.index(newer) < homes.index(older)


def test_a_wheel_nvcc_without_its_companions_names_the_wheels_to_add(nowhere, monkeypatch, tmp_path):
    wheel = fake_wheel_home(tmp_path / "site", companions=False)
    (wheel / "include" / "crt").mkdir(parents=True)
    (wheel / "include" / "crt" / "host_config.h").write_text("")
    monkeypatch.setattr(nvcc_mod, "wheel_cuda_homes", lambda: [wheel])
    with pytest.raises(NvccNotFoundError) as err:
        find_nvcc()
    assert "pip install nvidia-cuda-runtime nvidia-cuda-cccl nvidia-nvvm`" in str(err.value)


def test_not_found_suggests_the_wheels(nowhere):
    with pytest.raises(NvccNotFoundError) as err:
        find_nvcc()
    assert "NVIDIA's nvcc wheels (none installed)" in str(err.value)
    assert "pip install 'autotune[nvcc]'" in str(err.value)


def system_toolkit_hidden(monkeypatch, tmp_path) -> None:
    """As on a machine without a CUDA toolkit: no CUDA_HOME, no nvcc on PATH, nothing at torch's CUDA_HOME or
    /usr/local/cuda (torch's own search would find /usr/local/cuda, so it is hidden too)."""
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    path = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d and not (Path(d) / "nvcc").exists()]
    monkeypatch.setenv("PATH", os.pathsep.join(path))
    monkeypatch.setattr(nvcc_mod, "_torch_cuda_home", lambda: None)
    monkeypatch.setattr(nvcc_mod, "DEFAULT_CUDA_HOME", tmp_path / "no-cuda")


def test_the_pip_nvcc_builds_a_config_of_each_family_with_the_system_toolkit_hidden(monkeypatch, tmp_path):
    """The proof that `pip install 'autotune[nvcc]'` is enough to compile: CI installs the wheels and sets
    AUTOTUNE_REQUIRE_PIP_NVCC=1, so there this test fails rather than skips when they are missing."""
    import space
    from autotune.build.builder import Builder

    system_toolkit_hidden(monkeypatch, tmp_path)
    try:
        nvcc, found_at = nvcc_mod.locate_nvcc()
    except NvccNotFoundError as e:
        if os.environ.get("AUTOTUNE_REQUIRE_PIP_NVCC") == "1":
            raise
        pytest.skip(f"NVIDIA's nvcc wheels are not installed ({WHEELS_HINT}): {e}")
    assert found_at == "NVIDIA's nvcc wheels"
    arch = space.get_arch("sm_90")
    problem = space.Problem(head_dim=64, dtype="fp16", causal=True)
    configs = [space.default_config(problem, arch, family) for family in ("mma_sync", "wgmma")]
    results = Builder(arch, cache_dir=tmp_path / "cache", nvcc=nvcc).build([(c, problem) for c in configs])
    for config, result in zip(configs, results):
        assert result.ok and not result.spilled, (config.key, result.error)
        assert result.report.registers > 0 and Path(result.cubin_path).stat().st_size > 0


def test_ci_without_cuda_toolkit_leaves_the_wheels_or_nothing(tmp_path):
    """.ci/without-cuda-toolkit, README's way to run the tests as on a machine without a toolkit: under it
    find_nvcc comes to the wheels (or, with --no-nvcc-wheels, finds nothing), and the machine keeps its toolkit."""
    script = Path(__file__).resolve().parent.parent / ".ci" / "without-cuda-toolkit"
    if os.geteuid() != 0 or subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode:
        pytest.skip("needs root and unshare (a private mount namespace)")
    if not any(nvcc_mod._executable(home / "bin" / "nvcc") for home in nvcc_mod.wheel_cuda_homes()):
        pytest.skip(f"NVIDIA's nvcc wheels are not installed ({WHEELS_HINT})")
    before = nvcc_mod.locate_nvcc()
    probe = ("from autotune.build.nvcc import NvccNotFoundError, locate_nvcc\n"
             "try: print(*locate_nvcc(), sep='|')\nexcept NvccNotFoundError as e: print('none|' + str(e).splitlines()[0])")
    env = {**os.environ, "PYTHONPATH": str(script.parent.parent),
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    runs = {flag: subprocess.run([str(script), *flag, sys.executable, "-c", probe], env=env, capture_output=True,
                                 text=True, timeout=120) for flag in ((), ("--no-nvcc-wheels",))}
    for run in runs.values():
        assert run.returncode == 0, run.stderr
    assert runs[()].stdout.strip().endswith("|NVIDIA's nvcc wheels"), runs[()].stdout
    assert runs[("--no-nvcc-wheels",)].stdout.strip() == "none|nvcc not found; looked at:"
    assert nvcc_mod.locate_nvcc() == before  # nothing outside the command saw the mounts
