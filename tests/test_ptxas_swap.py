"""Assembling with another ptxas (AUTOTUNE_PTXAS / Builder(ptxas=...)): the two-step build gives nvcc's own
ptxas byte-identical cubins, gives a swapped one exactly nvcc's arguments, keys the cache by the swapped ptxas's
version, and reports a failing or missing ptxas clearly."""
from __future__ import annotations

import json
import shlex
import stat
import subprocess
from pathlib import Path

import pytest

import space
from autotune.build import ptxas_swap
from autotune.build.builder import Builder
from autotune.build.nvcc import find_nvcc

PROBLEM = space.Problem(head_dim=64)
ARCH = space.get_arch("sm_90")
CONFIG = space.default_config(PROBLEM, ARCH, "mma_sync")


def nvccs_own_ptxas() -> Path:
    """The ptxas nvcc runs: the first one on the PATH its -dryrun prints (its nvcc.profile puts its bin/ first)."""
    out = subprocess.run([str(find_nvcc()), "-dryrun", "-cubin", "-arch=sm_90", "-x", "cu", "/dev/null", "-o",
                          "/dev/null"], capture_output=True, text=True).stderr
    path_line = next(ln for ln in out.splitlines() if ln.startswith("#$ PATH="))
    for folder in path_line.split("=", 1)[1].split(":"):
        if folder and (Path(folder) / "ptxas").is_file():
            return Path(folder) / "ptxas"
    raise AssertionError(f"no ptxas on nvcc's PATH: {path_line}")


def fake_ptxas(tmp_path: Path, body: str) -> tuple[Path, Path]:
    """A ptxas that answers --version as release 99.9 and otherwise records its arguments, then runs `body`."""
    calls = tmp_path / "ptxas-calls.txt"
    script = tmp_path / "bin" / "ptxas"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text('#!/bin/sh\nif [ "$1" = --version ]; then\n'
                      '  echo "Cuda compilation tools, release 99.9, V99.9.1"; exit 0\nfi\n'
                      f'echo "$@" >> "{calls}"\n{body}\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, calls


def test_ptx_flags_move_cubin_to_ptx_and_drop_the_assemblers_options():
    flags = ["-cubin", "-O3", "-std=c++17", "-Xptxas", "-v", "-gencode=arch=compute_90a,code=sm_90a", "-lineinfo",
             "-Xptxas=-warn-spills"]
    assert ptxas_swap.ptx_flags(flags, "arch=compute_90a,code=sm_90a") == [
        "-ptx", "-O3", "-std=c++17", "-gencode=arch=compute_90a,code=compute_90a", "-lineinfo"]


def test_the_ptxas_asked_for_must_be_an_executable(tmp_path, monkeypatch):
    monkeypatch.delenv(ptxas_swap.ENV, raising=False)
    assert ptxas_swap.requested_ptxas() is None
    text = tmp_path / "ptxas"
    text.write_text("not a program")
    monkeypatch.setenv(ptxas_swap.ENV, str(text))
    with pytest.raises(ptxas_swap.PtxasSwapError, match=r"\$AUTOTUNE_PTXAS: expected an executable ptxas"):
        ptxas_swap.requested_ptxas()
    with pytest.raises(ptxas_swap.PtxasSwapError, match=r"^ptxas: expected an executable ptxas, got '/nowhere'"):
        ptxas_swap.requested_ptxas("/nowhere")
    with pytest.raises(ptxas_swap.PtxasSwapError, match="AUTOTUNE_PTXAS"):
        Builder(ARCH, cache_dir=tmp_path / "cache")  # the Builder reads the variable


def test_nvccs_own_ptxas_swapped_in_builds_the_same_cubin_under_another_key(tmp_path, monkeypatch):
    monkeypatch.delenv(ptxas_swap.ENV, raising=False)
    own = Builder(ARCH, cache_dir=tmp_path / "cache").build_one(CONFIG, PROBLEM)
    assert own.ok, own.error
    monkeypatch.setenv(ptxas_swap.ENV, str(nvccs_own_ptxas()))
    swapped_builder = Builder(ARCH, cache_dir=tmp_path / "cache")
    swapped = swapped_builder.build_one(CONFIG, PROBLEM)
    assert swapped.ok and not swapped.cached, swapped.error
    # the two steps reproduce nvcc's one exactly: same PTX, same assembler arguments, same bytes
    assert swapped.cubin_hash == own.cubin_hash
    assert swapped.report.registers == own.report.registers
    # the toolchain's identity names the swap, so a cache entry of one ptxas is never served for another
    assert swapped.key != own.key
    assert swapped_builder.nvcc_version.endswith("; ptxas " + ptxas_swap.ptxas_version(str(nvccs_own_ptxas())))
    entry = swapped.cubin_path.parent
    meta = json.loads((entry / "meta.json").read_text())
    assert meta["ptxas"] == str(nvccs_own_ptxas().resolve()) and meta["nvcc_version"] == swapped_builder.nvcc_version
    assert not (entry / "kernel.ptx").exists()  # the intermediate is not kept in the cache


def test_a_swapped_ptxas_gets_nvccs_arguments_and_its_failure_is_the_builds(tmp_path, monkeypatch):
    monkeypatch.delenv(ptxas_swap.ENV, raising=False)
    ptxas, calls = fake_ptxas(tmp_path, 'echo "ptxas fatal error: unsupported test opcode" >&2; exit 3')
    builder = Builder(ARCH, cache_dir=tmp_path / "cache", ptxas=ptxas)
    assert builder.nvcc_version.endswith("; ptxas Cuda compilation tools, release 99.9, V99.9.1")
    result = builder.build_one(CONFIG, PROBLEM)
    assert not result.ok and "unsupported test opcode" in result.error
    (call,) = calls.read_text().splitlines()
    args = shlex.split(call)
    # what nvcc -dryrun says it would pass its own ptxas: the arch, the -Xptxas -v, the input PTX, the output
    assert "-arch=sm_90a" in args and "-v" in args
    assert args[-3].endswith("kernel.ptx") and args[-2:] == ["-o", args[-1]] and args[-1].endswith("kernel.cubin")


def test_autotune_build_names_the_swapped_ptxas_and_rejects_a_bad_one(tmp_path, monkeypatch, capsys):
    from autotune import cli

    ptxas, _ = fake_ptxas(tmp_path, 'exec "$(dirname "$0")/real-ptxas" "$@"')
    (tmp_path / "bin" / "real-ptxas").symlink_to(nvccs_own_ptxas())
    monkeypatch.setenv(ptxas_swap.ENV, str(ptxas))
    args = ["build", "--head-dim", "64", "--arch", "sm_90", "--family", "mma_sync", "--cache-dir", str(tmp_path / "c")]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert f"ptxas      {ptxas.resolve()} (AUTOTUNE_PTXAS; Cuda compilation tools, release 99.9, V99.9.1)" in out
    monkeypatch.setenv(ptxas_swap.ENV, str(tmp_path / "missing"))
    assert cli.main(args) == 2
    assert "$AUTOTUNE_PTXAS: expected an executable ptxas" in capsys.readouterr().err
