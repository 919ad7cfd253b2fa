"""The command line as a new user meets it: each misuse is one clear line naming the argument, output piped into
`head` ends quietly, and the help says what the tool does and what each command needs. None of these needs a
GPU or nvcc."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.cli import READER_GONE, main
from autotune.store import storage_url

ROOT = Path(__file__).resolve().parent.parent
LANDSCAPE = ROOT / "studies" / "landscapes" / "h200-b1-h64-n1024-d128-bf16-full-wgmma.json"


@pytest.fixture(autouse=True)
def no_env_storage(monkeypatch):
    monkeypatch.delenv(storage_url.ENV_VAR, raising=False)


def error_line(capsys, rc: int) -> str:
    """The one line a usage error prints (exit 2, no traceback)."""
    out = capsys.readouterr()
    lines = [line for line in out.err.splitlines() if line.strip()]
    assert rc == 2, out
    assert "Traceback" not in out.err and len(lines) == 1, out.err
    return lines[0]


# ---- --storage: the suggested URL names the file the user meant -----------------------------------------------

@pytest.mark.parametrize("given,meant", [
    ("sqlite:/tmp/autotune-x/y.db", Path("/tmp/autotune-x/y.db")),  # one slash: an absolute path
    ("sqlite:y.db", None),                                         # no slash: under the working directory
    ("studies/y.db", None),                                        # a plain path
])
def test_the_suggested_sqlite_url_names_the_same_file(tmp_path, monkeypatch, capsys, given, meant):
    monkeypatch.chdir(tmp_path)
    meant = meant or tmp_path / given.removeprefix("sqlite:")
    line = error_line(capsys, main(["best", "--storage", given]))
    hint = line.split("for an SQLite file write ")[1].split()[0]
    assert storage_url.sqlite_path(hint) == meant, hint  # sqlite:///tmp/x.db would be tmp/x.db, relative
    assert hint == f"sqlite:///{meant}"  # four slashes for an absolute path


# ---- output into a pipe whose reader is gone --------------------------------------------------------------------

@pytest.mark.parametrize("argv", [
    ["space", "--head-dim", "128", "--arch", "sm_90", "--family", "wgmma"],  # 150 kB: EPIPE mid-listing
    ["best"],                                          # a few kB, still buffered when the command returns
    ["best", "--json"],
])
def test_output_piped_into_a_reader_that_has_gone_ends_quietly(tmp_path, argv):
    """As `autotune ... | head -1` once head has exited: the pipe's read end is closed before the command writes
    anything, so the first write (or the last flush) meets EPIPE every time, not by a race with head."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(storage_url.ENV_VAR, None)
    try:
        proc = subprocess.run([sys.executable, "-m", "autotune.cli", *argv], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env, timeout=300)
    finally:
        os.close(write_end)
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr
    assert "Exception ignored" not in proc.stderr, proc.stderr
    assert proc.returncode == READER_GONE, proc.stderr


# ---- --trials, --config, --arch ----------------------------------------------------------------------------------

def test_zero_trials_is_a_usage_error_not_an_empty_search(capsys):
    line = error_line(capsys, main(["search", "--replay", str(LANDSCAPE), "--trials", "0"]))
    assert "--trials: expected a count ≥ 1, got 0" in line


@pytest.mark.parametrize("key,expect", [
    ("mma_sync:br=100", "axis 'br' has no value '100'; its values: ['64', '128', '256']"),
    ("wgmma:consumer_wgs", "axis 'consumer_wgs' is given no value ('consumer_wgs'); expected consumer_wgs=VALUE, "
                           "one of ['1', '2', '3']"),
    ("wgmma:consumer_wgs=", "axis 'consumer_wgs' is given no value ('consumer_wgs=')"),
    ("wgmma:o_store=regs", "axis 'o_store' has no value 'regs'; its values: ['direct', 'smem']"),
])
def test_a_config_value_error_names_the_axis(capsys, tmp_path, key, expect):
    rc = main(["build", "--head-dim", "128", "--arch", "sm_90", "--cache-dir", str(tmp_path), "--config", key])
    err = capsys.readouterr().err
    assert rc == 2 and f"--config {key!r}: config key: {expect}" in err, err
    assert "value ''" not in err


def test_an_arch_spelt_another_way_is_read_with_a_notice(capsys):
    assert main(["space", "--head-dim", "256", "--arch", "sm90", "--family", "wgmma", "--limit", "0"]) == 0
    out = capsys.readouterr()
    assert "autotune space: --arch sm90 read as sm_90" in out.err
    assert out.out.startswith("# d256-fp16-full on sm_90, families wgmma")


def test_an_unknown_arch_is_one_line_naming_the_known_ones(capsys):
    line = error_line(capsys, main(["space", "--head-dim", "128", "--arch", "sm91"]))
    assert line.startswith("autotune space: --arch: ") and "'sm91' is not supported" in line
    assert "sm_80, sm_86, sm_89, sm_90, sm_100, sm_103, sm_120" in line


# ---- campaign --dry-run -----------------------------------------------------------------------------------------

CAMPAIGN = """
defaults = { head_dim = 128, batch = 1, heads = 2, trials = 4, family = "wgmma", retime = 3, retime_rounds = 2 }
shapes = [ { seqlen = 256 }, { seqlen = 512, family = "mma_sync" } ]
"""


def test_campaign_dry_run_checks_the_storage_and_shows_the_files_search_keys(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "c.toml"
    path.write_text(CAMPAIGN)
    line = error_line(capsys, main(["campaign", str(path), "--dry-run", "--storage", "x.db"]))
    assert "--storage 'x.db': not an SQLAlchemy URL" in line

    url = f"sqlite:///{tmp_path / 'campaign.db'}"
    assert main(["campaign", str(path), "--dry-run", "--storage", url]) == 0
    out = capsys.readouterr().out
    assert f"storage: {url}" in out
    assert "1. b1-h2-n256-d128-fp16-full: 4 trials, sampler tpe, warm start 4, family wgmma, " \
           "retime top 3 in 2 rounds" in out
    assert "family mma_sync, retime top 3 in 2 rounds" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.toml"]  # a dry run creates nothing


# ---- autotune --help -----------------------------------------------------------------------------------------

def test_the_help_describes_the_tool_and_what_each_command_needs(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "fastest configuration of a CUDA FlashAttention" in out and "autotune.attention" in out
    assert "autotune/commands" not in out  # the code's layout is for readers of the code, not for users
    no_gpu = out[out.index("nothing but Python"):out.index("\n  nvcc, no GPU")]
    assert "search --replay FILE" in no_gpu
    assert "needs a GPU; --replay FILE needs none" in " ".join(out.split())
