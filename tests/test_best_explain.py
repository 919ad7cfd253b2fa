"""`autotune best --explain`: the runtime's choice for one shape, from the CLI (no GPU needed with --gpu/--arch)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from autotune.cli import main

SHIPPED = Path(__file__).resolve().parent.parent / "studies" / "tuned" / "h200.json"


def test_explain_names_the_shipped_row_for_a_shipped_shape(tmp_path, capsys):
    (tmp_path / "empty.db").touch()  # an empty file is an empty SQLite database
    row = json.loads(SHIPPED.read_text())["rows"][0]
    args = ["best", "--explain", "--seqlen", str(row["seqlen"]), "--batch", str(row["batch"]),
            "--heads", str(row["heads"]), "--head-dim", str(row["head_dim"]), "--dtype", row["dtype"],
            "--gpu", row["gpu_name"], "--arch", row["arch"], "--storage", f"sqlite:///{tmp_path}/empty.db"]
    if row["causal"]:
        args.append("--causal")
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "source: shipped" in out and row["config_key"].split(":")[1].split(",")[0] in out
    assert (tmp_path / "empty.db").stat().st_size == 0  # explaining never writes into a user's database
    # a storage that does not exist is a mistake (a typo), said in one line; explaining never creates it
    typo = [a.replace("empty.db", "typo.db") if a.startswith("sqlite:") else a for a in args]
    assert main(typo) == 2
    assert "typo.db" in capsys.readouterr().err and not (tmp_path / "typo.db").exists()


def test_explain_falls_back_to_the_heuristic_on_an_unknown_gpu(tmp_path, capsys):
    (tmp_path / "empty.db").touch()
    assert main(["best", "--explain", "--seqlen", "1000", "--gpu", "Some Other GPU", "--arch", "sm_80",
                 "--storage", f"sqlite:///{tmp_path}/empty.db"]) == 0
    assert "source: heuristic" in capsys.readouterr().out


def test_explain_needs_a_seqlen(capsys):
    assert main(["best", "--explain", "--gpu", "NVIDIA H200", "--arch", "sm_90"]) == 2
    assert "--explain needs --seqlen" in capsys.readouterr().err


def test_best_shows_and_filters_the_alignment_and_explains_a_lower_right_shape(tmp_path, capsys):
    import space
    from autotune.cli import main
    from autotune.store.best_table import BestEntry, BestStore

    url = f"sqlite:///{tmp_path / 'user.db'}"
    arch = space.get_arch("sm_90")
    decode = space.Shape(batch=32, heads=32, kv_heads=8, seqlen_q=4, seqlen_k=4096, head_dim=128, dtype="bf16",
                         causal=True, causal_align="lower_right")
    upper = space.Shape(batch=32, heads=32, kv_heads=8, seqlen_q=4, seqlen_k=4096, head_dim=128, dtype="bf16",
                        causal=True)
    config = space.default_config_for_shape(decode, arch)
    other = config.replace(stages=2)
    with BestStore(url) as s:
        s.record_best(BestEntry.for_shape(decode, "NVIDIA H200", "sm_90", config, 50.0, study="lr", trial=1))
        s.record_best(BestEntry.for_shape(upper, "NVIDIA H200", "sm_90", other, 90.0, study="ul", trial=2))
    assert main(["best", "--storage", url, "--causal", "lower_right"]) == 0
    out = capsys.readouterr().out
    assert "lower_right" in out and "lr #1" in out and "ul #2" not in out
    assert main(["best", "--storage", url, "--causal"]) == 0  # alone: both alignments
    out = capsys.readouterr().out
    assert "lr #1" in out and "ul #2" in out
    common = ["best", "--explain", "--storage", url, "--gpu", "NVIDIA H200", "--arch", "sm_90", "--seqlen", "4",
              "--seqlen-k", "4096", "--batch", "32", "--heads", "32", "--kv-heads", "8", "--dtype", "bf16"]
    assert main(common + ["--causal", "lower_right"]) == 0
    out = capsys.readouterr().out
    assert "-causal-lower-right" in out and config.key in out and "study 'lr'" in out
    assert main(common + ["--causal"]) == 0
    out = capsys.readouterr().out
    assert "-lower-right" not in out.splitlines()[0] and other.key in out and "study 'ul'" in out


def test_best_and_explain_show_a_campaign_rows_two_passes_and_its_runner_up(tmp_path, capsys):
    import space
    from autotune.cli import main
    from autotune.store.best_table import BestEntry, BestStore

    url = f"sqlite:///{tmp_path / 'user.db'}"
    shape = space.Shape(batch=4, heads=16, seqlen_q=2048, head_dim=128)
    # the row without passes at a seqlen no shipped table has, so no shipped campaign row lists passes beside it
    config = space.default_config(shape.problem, space.get_arch("sm_90"))
    runner_up = config.replace(bc=64)
    with BestStore(url) as s:
        s.record_best(BestEntry.for_shape(shape, "NVIDIA H200", "sm_90", config, 600.0, study="c", trial=3,
                                          first_pass_tflops=604.1, second_pass_tflops=595.9,
                                          runner_up_config_key=runner_up.key, runner_up_first_tflops=606.0,
                                          runner_up_second_tflops=588.2))
        s.record_best(BestEntry.for_shape(dataclasses.replace(shape, seqlen_q=768, seqlen_k=768), "NVIDIA H200",
                                          "sm_90", config, 500.0, study="single", trial=1))
    assert main(["best", "--storage", url, "--seqlen", "2048"]) == 0
    out = capsys.readouterr().out
    assert "604.1/595.9" in out and "passes: a campaign row's TFLOPS in its first pass" in out
    assert main(["best", "--storage", url, "--seqlen", "768"]) == 0
    out = capsys.readouterr().out
    assert "passes:" not in out and " - " in out.splitlines()[1]
    assert main(["best", "--explain", "--storage", url, "--gpu", "h200", "--arch", "sm_90", "--seqlen", "2048"]) == 0
    out = capsys.readouterr().out
    assert "passes: first 604.1, second 595.9 TFLOPS" in out
    assert f"runner-up {runner_up.key}: first 606.0, second 588.2" in out
    assert main(["best", "--explain", "--storage", url, "--gpu", "h200", "--arch", "sm_90", "--seqlen", "768"]) == 0
    assert "passes:" not in capsys.readouterr().out
