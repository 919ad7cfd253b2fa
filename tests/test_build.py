"""The build layer on the real kernel: cache hits run no nvcc, source edits miss, compiler failures come back
with the compiler's message (and are cached), configs the space rejects never reach nvcc, parallel builds."""
from __future__ import annotations

import json
import re
import shutil
import stat
from pathlib import Path

import pytest

import space
from autotune.build.builder import (Builder, BuildError, CacheIntegrityWarning, CubinMismatchError, default_cache_dir,
                                     default_kernels_dir)
from autotune.build.nvcc import find_nvcc, locate_nvcc

PROBLEM = space.Problem(head_dim=64)
ARCH = space.get_arch("sm_90")
DEFAULT = space.default_config(PROBLEM, ARCH, "mma_sync")
# rows_per_warp: 64 query rows cannot be split into 8 warps of 16
BAD_ROWS = DEFAULT.replace(br=64, warps_m=8)


def wrapper_nvcc(tmp_path: Path, body: str | None = None) -> tuple[Path, Path]:
    """An nvcc that records each call's arguments in calls.txt, then runs the real one (or `body`)."""
    calls = tmp_path / "calls.txt"
    script = tmp_path / "bin" / "nvcc"
    script.parent.mkdir(parents=True, exist_ok=True)
    run = body or f'exec "{find_nvcc()}" "$@"'
    script.write_text(f'#!/bin/sh\necho "$@" >> "{calls}"\n{run}\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, calls


def compile_calls(calls: Path) -> list[str]:
    return [ln for ln in calls.read_text().splitlines() if "-cubin" in ln] if calls.exists() else []


def test_rebuild_of_a_cached_key_runs_no_nvcc(tmp_path):
    cache = tmp_path / "cache"
    first = Builder(ARCH, cache_dir=cache).build_one(DEFAULT, PROBLEM)
    assert first.ok and not first.cached, first.error
    assert first.cubin_path.is_file() and first.cubin_path.parent == cache / first.key[:2] / first.key
    assert first.report.registers > 0 and first.report.compile_seconds > 0

    nvcc, calls = wrapper_nvcc(tmp_path)
    again = Builder(ARCH, cache_dir=cache, nvcc=nvcc).build_one(DEFAULT, PROBLEM)
    assert compile_calls(calls) == []
    assert again.cached and again.ok
    assert (again.key, again.cubin_path, again.cubin_hash, again.report) == \
        (first.key, first.cubin_path, first.cubin_hash, first.report)
    assert again.cubin_bytes() == first.cubin_bytes()

    meta = json.loads((first.cubin_path.parent / "meta.json").read_text())
    assert meta["config_key"] == DEFAULT.key and meta["arch"] == "sm_90" and meta["ok"] is True
    assert meta["problem"] == {"head_dim": 64, "dtype": "fp16", "causal": False, "seqused_k": False}
    assert meta["report"]["registers"] == first.report.registers
    assert "Used" in (first.cubin_path.parent / "ptxas.log").read_text()


def test_kernel_source_change_misses_the_cache(tmp_path):
    kernels = tmp_path / "kernels"
    shutil.copytree(default_kernels_dir(), kernels)
    builder = Builder(ARCH, cache_dir=tmp_path / "cache", kernels_dir=kernels)
    before = builder.build_one(DEFAULT, PROBLEM)
    assert builder.build_one(DEFAULT, PROBLEM).cached

    traits = kernels / "sm80" / "traits.cuh"
    text = traits.read_text()
    letter = re.search(r"// ([A-Za-z])", text)  # flip a comment letter's case: same length, new contents
    edited = text[: letter.start(1)] + letter.group(1).swapcase() + text[letter.end(1):]
    assert edited != text and len(edited) == len(text)
    traits.write_text(edited)
    after = builder.build_one(DEFAULT, PROBLEM)
    assert after.ok and not after.cached
    assert after.key != before.key
    # a comment does not change the binary: the cubin hash is how callers skip timing duplicates
    assert after.cubin_hash == before.cubin_hash


def test_each_family_hashes_only_the_files_it_compiles_from(tmp_path):
    from autotune.build.builder import family_sources

    kernels = tmp_path / "kernels"
    shutil.copytree(default_kernels_dir(), kernels)
    rel = {p.relative_to(kernels).as_posix() for p in family_sources(kernels, "sm80/flash_fwd.cu")}
    assert rel == {"sm80/flash_fwd.cu", "sm80/ptx.cuh", "sm80/traits.cuh", "common/flash_params.h", "common/pack.cuh",
                   "common/seqused.cuh", "common/split_combine.cuh"}
    assert "sm90/wgmma_ops.cuh" in {p.relative_to(kernels).as_posix()
                                    for p in family_sources(kernels, "sm90/flash_fwd.cu")}

    builder = Builder(ARCH, cache_dir=tmp_path / "cache", kernels_dir=kernels)
    wgmma = space.default_config(PROBLEM, ARCH, "wgmma")
    keys = {c.family: builder.key(c, PROBLEM) for c in (DEFAULT, wgmma)}

    def touch(name: str) -> None:  # append a comment line: new contents, same code
        path = kernels / name
        path.write_text(path.read_text() + "\n// edited\n")

    touch("sm90/traits.cuh")  # the other family's file: mma_sync builds stay cached
    assert builder.key(DEFAULT, PROBLEM) == keys["mma_sync"] and builder.key(wgmma, PROBLEM) != keys["wgmma"]
    keys["wgmma"] = builder.key(wgmma, PROBLEM)
    touch("common/flash_params.h")  # shared by both
    assert builder.key(DEFAULT, PROBLEM) != keys["mma_sync"] and builder.key(wgmma, PROBLEM) != keys["wgmma"]
    assert builder.sources_digest(["mma_sync", "wgmma"]) != builder.sources_digest(["mma_sync"])


def test_compiler_failure_carries_the_static_assert_and_is_cached(tmp_path, build_cache_dir):
    assert [v.rule for v in space.violations(BAD_ROWS, PROBLEM, ARCH)] == ["rows_per_warp"]
    builder = Builder(ARCH, cache_dir=build_cache_dir, check_rules=False)
    result = builder.build_one(BAD_ROWS, PROBLEM)
    assert not result.ok and result.status == "compile_error"
    assert "static assertion failed" in result.error and "rows_per_warp" in result.error
    assert result.cubin_path is None and result.report is None and result.key
    with pytest.raises(ValueError, match="no cubin"):
        result.cubin_bytes()

    nvcc, calls = wrapper_nvcc(tmp_path)
    again = Builder(ARCH, cache_dir=build_cache_dir, nvcc=nvcc, check_rules=False).build_one(BAD_ROWS, PROBLEM)
    assert compile_calls(calls) == []
    assert again.cached and not again.ok and again.error == result.error


def test_a_config_the_space_rejects_never_reaches_nvcc(tmp_path):
    nvcc, calls = wrapper_nvcc(tmp_path)
    result = Builder(ARCH, cache_dir=tmp_path / "cache", nvcc=nvcc).build_one(BAD_ROWS, PROBLEM)
    assert compile_calls(calls) == []
    assert not result.ok and result.status == "invalid" and not result.cached
    assert result.rejected_by == ("rows_per_warp",)
    assert "rows_per_warp" in result.error and result.key is None


def test_parallel_build_keeps_input_order_and_compiles_duplicates_once(tmp_path, build_cache_dir):
    valid = [DEFAULT, DEFAULT.replace(kv_buffering="double"), DEFAULT.replace(q_in_regs=not DEFAULT.q_in_regs),
             DEFAULT.replace(kv_buffering="shared")]
    assert len(set(valid)) == 4  # whatever the default is, four distinct configs
    items = [(c, PROBLEM) for c in valid] + [(BAD_ROWS, PROBLEM), (valid[0], PROBLEM)]
    nvcc, calls = wrapper_nvcc(tmp_path)
    seen = []
    results = Builder(ARCH, cache_dir=tmp_path / "cache", nvcc=nvcc, jobs=2).build(
        items, progress=lambda done, total, r: seen.append((done, total, r.config.key)))

    assert [r.config for r in results] == [c for c, _ in items]
    assert all(r.ok and r.status in ("compiled", "spilled") for r in results[:4]), [r.error for r in results]
    assert results[4].status == "invalid"
    assert results[5].cubin_path == results[0].cubin_path
    assert len(compile_calls(calls)) == 4  # the duplicate of valid[0] compiled once, the rejected one never
    assert [(d, t) for d, t, _ in seen] == [(i, 6) for i in range(1, 7)]
    assert sorted(k for _, _, k in seen) == sorted(c.key for c, _ in items)
    assert len({r.cubin_hash for r in results[:4]}) == 4  # four different kernels
    assert not list((tmp_path / "cache" / ".work").iterdir())  # work directories are cleaned up


def test_a_hung_compile_is_killed_and_not_cached(tmp_path):
    hang = 'case "$1" in --version) echo "Cuda compilation tools, release 0.0, V0.0.0";; *) sleep 60;; esac'
    nvcc, calls = wrapper_nvcc(tmp_path, body=hang)
    builder = Builder(ARCH, cache_dir=tmp_path / "cache", nvcc=nvcc, timeout_s=1)
    result = builder.build_one(DEFAULT, PROBLEM)
    assert not result.ok and "timed out after 1 s" in result.error
    assert not builder.entry_dir(result.key).exists()  # a timeout says nothing about the sources
    builder.build_one(DEFAULT, PROBLEM)
    assert len(compile_calls(calls)) == 2


def test_a_compile_ended_by_a_signal_is_not_cached(tmp_path):
    """Ctrl-C reaches nvcc as well as the search: what an interrupted nvcc leaves behind (exit 128 + SIGINT) says
    nothing about the config, and must not come back as its compile error when the search resumes."""
    interrupted = 'case "$1" in --version) echo "Cuda compilation tools, release 0.0, V0.0.0";; *) exit 130;; esac'
    nvcc, calls = wrapper_nvcc(tmp_path, body=interrupted)
    builder = Builder(ARCH, cache_dir=tmp_path / "cache", nvcc=nvcc)
    assert not builder.build_one(DEFAULT, PROBLEM).ok
    assert not builder.entry_dir(builder.key(DEFAULT, PROBLEM)).exists()
    builder.build_one(DEFAULT, PROBLEM)
    assert len(compile_calls(calls)) == 2


def test_a_damaged_cache_entry_is_rebuilt(tmp_path):
    cache = tmp_path / "cache"
    first = Builder(ARCH, cache_dir=cache).build_one(DEFAULT, PROBLEM)
    first.cubin_path.unlink()
    again = Builder(ARCH, cache_dir=cache).build_one(DEFAULT, PROBLEM)
    assert again.ok and not again.cached and again.cubin_path.is_file()


def test_the_key_covers_flags_arch_and_defines(tmp_path):
    plain = Builder(ARCH, cache_dir=tmp_path)
    key = plain.key(DEFAULT, PROBLEM)
    assert key == Builder("sm_90", cache_dir=tmp_path / "elsewhere").key(DEFAULT, PROBLEM)
    assert key != Builder(ARCH, cache_dir=tmp_path, extra_flags=["-lineinfo"]).key(DEFAULT, PROBLEM)
    assert key != Builder("sm_100", cache_dir=tmp_path).key(DEFAULT, PROBLEM)
    assert key != plain.key(DEFAULT.replace(min_blocks=2), PROBLEM)
    assert key != plain.key(DEFAULT, space.Problem(head_dim=64, causal=True))


def test_cache_dir_and_kernels_dir_defaults(monkeypatch, tmp_path):
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path / "env-cache"))
    assert default_cache_dir() == tmp_path / "env-cache"
    assert Builder(ARCH).cache_dir == tmp_path / "env-cache"
    monkeypatch.delenv("AUTOTUNE_CACHE_DIR")
    assert default_cache_dir() == Path.home() / ".cache" / "autotune" / "kernels"
    family = space.get_family("mma_sync")
    assert (default_kernels_dir() / family.source).is_file()
    # run from a checkout, the checkout's own kernels/ (not wherever an editable install of another checkout points)
    import autotune

    assert default_kernels_dir() == Path(autotune.__file__).resolve().parent.parent / "kernels"


def test_bad_arguments_name_the_argument(tmp_path):
    with pytest.raises(ValueError, match="jobs"):
        Builder(ARCH, cache_dir=tmp_path, jobs=0)
    with pytest.raises(ValueError, match="timeout_s"):
        Builder(ARCH, cache_dir=tmp_path, timeout_s=0)
    with pytest.raises(BuildError, match="kernels_dir"):
        Builder(ARCH, cache_dir=tmp_path, kernels_dir=tmp_path / "missing")
    with pytest.raises(ValueError, match="arch"):
        Builder("sm_91", cache_dir=tmp_path)


# -- the `autotune build` and `autotune space` commands -------------------------------------------------------

def test_build_command_prints_the_report_then_hits_the_cache(capsys, build_cache_dir):
    from autotune.cli import main

    argv = ["build", "--head-dim", "64", "--arch", "sm_90", "--family", "mma_sync", "--cache-dir", str(build_cache_dir)]
    assert main(argv) == 0
    assert main(argv) == 0
    first, second = capsys.readouterr().out.split("config ")[1:]
    assert DEFAULT.key in first
    for field in ("registers", "spill", "stack", "smem", "threads", "cubin"):
        assert f"\n{field} " in first
    nvcc, found_at = locate_nvcc()  # it says which nvcc it used, and where that one was found
    assert re.search(rf"\nnvcc +{re.escape(str(nvcc))} \(from {re.escape(found_at)}; Cuda compilation tools, release ",
                     first)
    assert re.search(r"\nstatus +\w+ \(cached\)\n", second)  # the second run only reads the cache


def test_build_command_names_a_bad_config_argument(capsys, tmp_path):
    from autotune.cli import main

    assert main(["build", "--head-dim", "64", "--arch", "sm_90", "--cache-dir", str(tmp_path),
                 "--config", "mma_sync:br=65"]) == 2
    err = capsys.readouterr().err
    assert "--config 'mma_sync:br=65'" in err and "65" in err


def test_space_command_compiles_and_summarises(capsys, build_cache_dir):
    from autotune.cli import main

    assert main(["space", "--head-dim", "64", "--arch", "sm_90", "--limit", "2", "--compile",
                 "--cache-dir", str(build_cache_dir)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    valid = space.valid_configs(PROBLEM, ARCH)
    assert sum(c.key in line for line in lines for c in valid[:2]) == 2
    summary = lines[-1]
    assert summary.startswith(f"{len(valid)} valid, ") and "; listed 2; 2 compiled" in summary
    assert "min_blocks_smem" in summary


def test_commands_without_arch_or_gpu_ask_for_arch(capsys, monkeypatch):
    from autotune.launch import gpu_arch
    from autotune.cli import main

    monkeypatch.setattr(gpu_arch, "_torch_capability", lambda device: None)
    monkeypatch.setattr(gpu_arch, "_driver_capability", lambda device: None)
    assert main(["space", "--head-dim", "128"]) == 2
    assert ("no CUDA GPU visible; pass --arch, one of sm_80, sm_86, sm_89, sm_90, sm_100, sm_103, sm_120"
            in capsys.readouterr().err)  # every supported arch, not a few
    monkeypatch.setattr(gpu_arch, "_torch_capability", lambda device: (10, 3))
    assert gpu_arch.detect_arch().name == "sm_103"


def test_a_cubin_that_does_not_match_its_recorded_hash_is_set_aside_rebuilt_and_warned(tmp_path):
    """A shared kernel cache is not trusted: a cubin whose bytes are not the ones hashed when it was built (a
    real rewrite of the file, same size) is never returned; its entry is kept aside and the config rebuilt."""
    cache = tmp_path / "cache"
    first = Builder(ARCH, cache_dir=cache).build_one(DEFAULT, PROBLEM)
    good = first.cubin_bytes()
    tampered = bytearray(good)
    tampered[len(tampered) // 2] ^= 0xFF
    first.cubin_path.write_bytes(bytes(tampered))

    nvcc, calls = wrapper_nvcc(tmp_path)
    with pytest.warns(CacheIntegrityWarning, match="sha256 .* not the .* recorded in meta.json"):
        again = Builder(ARCH, cache_dir=cache, nvcc=nvcc).build_one(DEFAULT, PROBLEM)
    assert len(compile_calls(calls)) == 1 and again.ok and not again.cached
    assert again.cubin_hash == first.cubin_hash and again.cubin_bytes() == good  # nvcc's output is deterministic
    aside = list((cache / ".damaged").iterdir())
    assert len(aside) == 1 and (aside[0] / "kernel.cubin").read_bytes() == bytes(tampered)  # kept to look at

    # changed after the check (between lookup and load): the bytes handed to the loader are checked again
    again.cubin_path.write_bytes(bytes(tampered))
    with pytest.raises(CubinMismatchError, match="no longer the"):
        again.cubin_bytes()
    from autotune.launch.loader import KernelRunner

    with pytest.raises(CubinMismatchError):
        KernelRunner(again)


def test_space_why_summarises_by_rule_and_lists_only_the_first_invalid_configs(capsys):
    from autotune.cli import main
    from autotune.commands.space_cmd import WHY_LIMIT

    args = ["space", "--head-dim", "128", "--arch", "sm_90", "--family", "wgmma", "--why"]
    problem = space.Problem(head_dim=128)
    # one pass over the space (400k configs): each invalid key with the rules it breaks
    invalid = {c.key: {v.rule for v in broken} for c in space.enumerate_configs("wgmma")
               if (broken := space.violations(c, problem, ARCH))}
    assert len(invalid) > WHY_LIMIT  # else there is nothing to summarise
    assert main(args) == 0
    out = capsys.readouterr().out
    # every key printed, looked up (not each of 400k invalid keys searched for in a 600 kB output)
    printed_invalid = {key for key in re.findall(r"\bwgmma:\S+", out) if key in invalid}
    assert WHY_LIMIT <= len(printed_invalid) <= WHY_LIMIT + len(set().union(*invalid.values()))  # the first N, an example a rule
    assert f"# the first {WHY_LIMIT} of {len(invalid)} invalid configs" in out and "--limit N lists more" in out
    assert "pingpong_needs_two_consumers: " in out and " configs, e.g. wgmma:" in out
    assert main([*args, "--limit", "3"]) == 0
    assert f"# the first 3 of {len(invalid)} invalid configs" in capsys.readouterr().out


def test_an_empty_config_key_is_an_error_not_the_default(capsys, tmp_path):
    from autotune.cli import main

    for command in (["build", "--head-dim", "64", "--arch", "sm_90"], ["sass", "--head-dim", "64", "--arch", "sm_90"],
                    ["check", "--seqlen", "128"], ["bench", "--seqlen", "128"]):
        assert main([*command, "--config", "", "--cache-dir", str(tmp_path)]) == 2, command
        err = capsys.readouterr().err
        assert "--config '': expected a config key" in err and "leave --config out" in err, command
    assert not any(tmp_path.iterdir())  # nothing was built
