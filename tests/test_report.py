"""Study reports: each plot's info object checked against a fixture study (tests/data/report_fixture.py) and
against a study written by the real search pipeline with its GPU step (and nvcc) replaced by test doubles;
the files `write_report` and `autotune report` write; `autotune dashboard` with and without its extra.

Pixels are not checked here (the browser test checks that the HTML draws); PNGs are checked to be real,
non-empty images.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import math
import os
import struct
import sys
import tempfile
import types
from collections import Counter
from pathlib import Path

import optuna
import plotly.offline
import pytest

import space
from autotune.cli import main as cli_main
from autotune.report import data, load_view, write_report
from autotune.report.view import STATUSES, Retimed, StudyView
from space.mma_sync import register_cap

DATA = Path(__file__).parent / "data"
AXES = [a.name for a in space.get_family("mma_sync").axes]


def _load_fixture_module():
    spec = importlib.util.spec_from_file_location("report_fixture", DATA / "report_fixture.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


report_fixture = _load_fixture_module()


def db_dir(fallback: Path):
    """A directory for SQLite files on tmpfs where there is one: SQLite fsyncs every commit, Optuna commits
    several times per trial, and on a plain disk that alone can take most of a test's time."""
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        return tempfile.TemporaryDirectory(dir="/dev/shm", prefix="autotune-report-")
    return contextlib.nullcontext(str(fallback))


@pytest.fixture(scope="module")
def fixture_study(tmp_path_factory):
    """(storage URL, study, expected figures): the study is written once per module."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with db_dir(tmp_path_factory.mktemp("report")) as where:
        url = f"sqlite:///{Path(where) / 'studies.db'}"
        expected = report_fixture.build(url)
        yield url, optuna.load_study(study_name=expected["name"], storage=url), expected


@pytest.fixture(scope="module")
def view(fixture_study) -> StudyView:
    return load_view(fixture_study[1])


@pytest.fixture(scope="module")
def expected(fixture_study) -> dict:
    return fixture_study[2]


def _originals(expected: dict, status: str | None = None) -> list[int]:
    return sorted(n for n, s in expected["status"].items() if status is None or s == status)


# ------------------------------------------------------------------------------------------------- view
def test_fixture_is_a_realistic_mix(expected):
    found = Counter(expected["status"].values())
    for status in ("complete", "invalid", "spilled", "wrong", "crashed", "timeout"):
        assert found[status] >= 2, f"the fixture should hold several {status} trials: {found}"
    assert len(set(expected["complete"].values())) > 10  # varied TFLOPS
    assert expected["repeats"]


def test_view_reads_the_contract_attrs(view, expected):
    assert view.name == expected["name"]
    assert (view.arch, view.gpu_name) == ("sm_90", "NVIDIA H200")
    assert view.baselines == expected["baselines"]
    assert len(view.trials) == expected["n_trials"]
    by_number = {t.number: t for t in view.trials}
    for number, status in expected["status"].items():
        t = by_number[number]
        assert t.status == status
        assert t.tflops == expected["complete"].get(number)  # None unless complete
        assert t.registers == expected["registers"].get(number)
        assert t.config == expected["params"][number]
        assert t.rows_per_block == expected["params"][number]["br"]
    for number, original in expected["repeats"].items():
        assert by_number[number].duplicate_of == original
    assert {t.number for t in view.configs} == set(expected["status"])  # repeats left out
    assert view.domains["br"] == [64, 128, 256] and view.domains["q_in_regs"] == [True, False]


# ---------------------------------------------------------------------------------------------- history
def test_history_info(view, expected):
    info = data.history_info(view)
    complete = _originals(expected, "complete")
    assert info.placeholder is None
    assert info.numbers == complete
    assert info.tflops == [expected["complete"][n] for n in complete]
    assert info.best_so_far[-1] == max(expected["complete"].values())
    assert all(a <= b for a, b in zip(info.best_so_far, info.best_so_far[1:]))
    assert all(b >= v for b, v in zip(info.best_so_far, info.tflops))
    assert info.failed_numbers == [n for n in _originals(expected) if n not in expected["complete"]]
    # The two bars the issue names, not the memory-efficient one.
    assert info.baselines == {"SDPA flash (FA2)": 342.0, "SDPA cuDNN": 588.0}


def test_history_without_baselines_draws_no_lines(view):
    info = data.history_info(dataclasses.replace(view, baselines={}))
    assert info.baselines == {} and info.placeholder is None


# ------------------------------------------------------------------------------------------ importances
def test_importance_info(view, expected):
    info = data.importance_info(view)
    assert info.placeholder is None
    assert info.n_trials == len(expected["complete"])
    assert set(info.params) <= set(AXES) and "family" not in info.params  # a constant explains nothing
    assert len(info.params) >= 5
    assert math.isclose(sum(info.importances), 1.0, rel_tol=1e-6)
    assert info.importances == sorted(info.importances, reverse=True)
    assert data.importance_info(view) == info  # deterministic: the same study, the same plot


def test_importance_placeholder_with_too_few_trials(view):
    few = [t for t in view.trials if t.complete][: data.MIN_IMPORTANCE_TRIALS - 1]
    info = data.importance_info(dataclasses.replace(view, trials=tuple(few)))
    assert info.params == [] and info.n_trials == len(few)
    assert f"at least {data.MIN_IMPORTANCE_TRIALS} complete trials" in info.placeholder


def test_importance_placeholder_when_every_trial_ties(view):
    tied = tuple(dataclasses.replace(t, tflops=100.0) for t in view.trials if t.complete)
    info = data.importance_info(dataclasses.replace(view, trials=tied))
    assert info.params == [] and "same TFLOPS" in info.placeholder


# ---------------------------------------------------------------------------------- parallel coordinates
def test_parallel_info(view, expected):
    info = data.parallel_info(view)
    complete = _originals(expected, "complete")
    assert info.placeholder is None
    assert [a.name for a in info.axes] == AXES  # space's order; `family` has one value, so no axis
    assert info.numbers == complete
    assert info.tflops == [expected["complete"][n] for n in complete]
    family = space.get_family("mma_sync")
    for axis in info.axes:
        assert axis.ticktext == [str(v) for v in family.axis(axis.name).values]  # the searched domain, in order
        assert axis.tickvals == list(range(len(axis.ticktext)))
        for number, position in zip(info.numbers, axis.values):
            assert axis.ticktext[int(position)] == str(expected["params"][number][axis.name])


def test_parallel_info_with_two_families_marks_absent_axes():
    """A second family's trials lack the first one's axes: they get an `n/a` tick, and `family` an axis."""
    study = optuna.create_study(direction="maximize")
    cat = optuna.distributions.CategoricalDistribution
    study.add_trial(optuna.trial.create_trial(
        params={"family": "mma_sync", "bc": 64}, value=300.0, user_attrs={"status": "complete"},
        distributions={"family": cat(("mma_sync", "other")), "bc": cat((32, 64))}))
    study.add_trial(optuna.trial.create_trial(
        params={"family": "other", "other.bc": 80, "stages": 3}, value=400.0, user_attrs={"status": "complete"},
        distributions={"family": cat(("mma_sync", "other")), "other.bc": cat((80, 96)), "stages": cat((2, 3))}))
    v = load_view(study)
    info = data.parallel_info(v)
    axes = {a.name: a for a in info.axes}
    assert list(axes) == ["family", "bc", "stages"]
    assert axes["bc"].ticktext == ["32", "64", "80", "96"]  # the family prefix is not part of the axis
    assert axes["stages"].ticktext == ["2", "3", data.NOT_APPLICABLE]
    assert axes["stages"].values == [2.0, 1.0]  # mma_sync has no stages: it sits on n/a
    heat = data.heatmap_info(v)  # neither trial names a config space/ can place at a Br
    assert heat.rows == [] and "Br" in heat.placeholder


# ----------------------------------------------------------------------------------------- Br x Bc map
def test_heatmap_info(view, expected):
    info = data.heatmap_info(view)
    assert info.placeholder is None
    assert info.rows == [64, 128, 256] and info.cols == [32, 64, 128]
    best: dict[tuple, float] = {}
    count: Counter = Counter()
    for number, tflops in expected["complete"].items():
        cell = (expected["params"][number]["br"], expected["params"][number]["bc"])
        best[cell] = max(best.get(cell, 0.0), tflops)
        count[cell] += 1
    for i, br in enumerate(info.rows):
        for j, bc in enumerate(info.cols):
            assert info.best[i][j] == best.get((br, bc))  # None (blank) where nothing completed
            assert info.counts[i][j] == count[(br, bc)]
            if (br, bc) in best:
                assert expected["complete"][info.best_numbers[i][j]] == best[(br, bc)]
    assert any(v is None for row in info.best for v in row), "the fixture should leave some cells empty"


# ------------------------------------------------------------------------------ registers vs min_blocks
def test_registers_info(view, expected):
    info = data.registers_info(view)
    assert info.placeholder is None
    built = sorted(expected["registers"])
    assert [p.number for p in info.points] == built
    kinds = {"complete": "complete", "spilled": "spilled", "wrong": "failed", "crashed": "failed",
             "timeout": "failed"}
    for p in info.points:
        assert p.kind == kinds[expected["status"][p.number]]
        assert p.registers == expected["registers"][p.number]
        assert p.min_blocks == expected["params"][p.number]["min_blocks"]
        assert (p.spill_bytes > 0) == (p.kind == "spilled")
    assert info.count("spilled") == len(_originals(expected, "spilled"))
    assert info.min_blocks_values == [1, 2, 3, 4]
    assert info.caps, "with 4 min_blocks values some cap binds below 255"
    for cap in info.caps:
        assert cap.threads in {p.threads for p in info.points}
        assert cap.cap == [min(255, 65536 // (cap.threads * b) // 8 * 8) for b in cap.min_blocks]
        assert cap.cap == [register_cap(cap.threads, b) for b in cap.min_blocks]
        assert min(cap.cap) < 255


# ------------------------------------------------------------------------------------------ top configs
def test_top_table_info(view, expected):
    info = data.top_table_info(view)
    ranked = sorted(expected["complete"].items(), key=lambda kv: -kv[1])[: data.TOP_CONFIGS]
    assert [(r.number, r.tflops) for r in info.rows] == ranked
    assert [r.rank for r in info.rows] == list(range(1, len(ranked) + 1))
    by_number = {t.number: t for t in view.trials}
    for r in info.rows:
        t = by_number[r.number]
        assert r.config == t.config_key and r.config.startswith("mma_sync:")
        assert (r.registers, r.smem_bytes, r.threads, r.time_ms) == (t.registers, t.smem_bytes, t.threads, t.time_ms)
        assert r.spill_bytes == 0
        assert r.vs_baseline == {"SDPA flash (FA2)": r.tflops / 342.0, "SDPA cuDNN": r.tflops / 588.0}


# --------------------------------------------------------------------------------------------- outcomes
def test_outcome_info(view, expected):
    info = data.outcome_info(view)
    found = Counter(expected["status"].values())
    assert list(info.counts)[: len(STATUSES)] == list(STATUSES)
    for status in STATUSES:
        assert info.counts[status] == found[status]
    assert info.counts["compile_error"] == 0
    assert info.counts[data.REPEATED] == len(expected["repeats"])
    assert info.total == expected["n_trials"] == sum(info.counts.values())
    rules = {r.name for r in space.get_family("mma_sync").rules}
    assert info.reasons["invalid"] and {reason for reason, _ in info.reasons["invalid"]} <= rules
    # Spill reasons differ only in their numbers: they group into one line.
    assert info.reasons["spilled"] == [(
        "spills registers (N B stores, N B loads, N registers) under --spill-policy prune", found["spilled"])]


@pytest.mark.parametrize("reason, groups", [
    ("rows_per_warp, smem_optin_limit", ["rows_per_warp", "smem_optin_limit"]),
    ("timeout: no result within 120.5 s\ntraceback...", ["timeout: no result within N s"]),
    ("", [""]),
])
def test_reason_groups(reason, groups):
    assert data.reason_groups(reason) == groups


# ----------------------------------------------------------------------------------------------- header
def test_header_info(view, expected):
    info = data.header_info(view)
    best = max(expected["complete"], key=expected["complete"].get)
    assert info.shape == "batch 4 · heads 16 · seqlen 4096 · head_dim 128 · fp16 · non-causal"
    assert (info.gpu_name, info.arch, info.study) == ("NVIDIA H200", "sm_90", expected["name"])
    assert (info.first_trial, info.last_trial) == (expected["first"], expected["last"])
    assert info.n_trials == expected["n_trials"]
    assert info.n_configs == expected["n_trials"] - len(expected["repeats"])
    assert info.n_complete == len(expected["complete"])
    assert (info.best_number, info.best_tflops, info.retimed_tflops) == (best, expected["complete"][best], None)
    assert info.best_config == space.Config.from_dict(expected["params"][best]).key
    assert set(info.baselines) == {"SDPA flash (FA2)", "SDPA cuDNN", "SDPA memory-efficient"}
    assert info.vs_baseline["SDPA cuDNN"] == pytest.approx(expected["complete"][best] / 588.0)


def test_header_prefers_the_final_retiming(view):
    """The search re-times its top configs next to the baselines; that figure is the fair comparison."""
    runner_up = sorted(view.complete, key=lambda t: -t.tflops)[1]
    retimed = (Retimed(runner_up.number, runner_up.config_key, 500.0),)
    info = data.header_info(dataclasses.replace(view, retimed=retimed))
    assert (info.best_number, info.best_config) == (runner_up.number, runner_up.config_key)
    assert info.best_tflops == runner_up.tflops and info.retimed_tflops == 500.0
    assert info.vs_baseline["SDPA flash (FA2)"] == pytest.approx(500.0 / 342.0)


def test_header_names_the_retiming_the_search_chose(view):
    """A tie keeps the simplest finalist, which need not be the fastest re-timing: the header shows the stored one."""
    first, second = sorted(view.complete, key=lambda t: -t.tflops)[:2]
    retimed = (Retimed(first.number, first.config_key, 501.0), Retimed(second.number, second.config_key, 500.0, True))
    info = data.header_info(dataclasses.replace(view, retimed=retimed))
    assert (info.best_number, info.best_config, info.retimed_tflops) == (second.number, second.config_key, 500.0)


def test_shape_text_names_gqa_and_causal():
    text = data.shape_text({"batch": 2, "heads": 32, "kv_heads": 8, "seqlen_q": 1024, "seqlen_k": 2048,
                            "head_dim": 64, "dtype": "bf16", "causal": True})
    assert text == "batch 2 · heads 32 · kv_heads 8 · seqlen 1024 · seqlen_k 2048 · head_dim 64 · bf16 · causal"


# ------------------------------------------------------------------------------------ empty and failing
def _study_with(trials=()) -> optuna.Study:
    study = optuna.create_study(direction="maximize")
    study.add_trials(list(trials))
    return study


def test_every_info_has_a_placeholder_for_an_empty_study():
    infos = [data.history_info, data.importance_info, data.parallel_info, data.heatmap_info, data.registers_info,
             data.top_table_info, data.outcome_info]
    v = load_view(_study_with())
    for fn in infos:
        assert fn(v).placeholder, fn.__name__
    assert data.header_info(v).best_tflops is None


def test_a_study_with_only_invalid_trials(view):
    invalid = tuple(t for t in view.trials if t.status == "invalid")
    v = dataclasses.replace(view, trials=invalid)
    assert "None of the" in data.history_info(v).placeholder
    assert "compiler" in data.registers_info(v).placeholder
    assert data.outcome_info(v).placeholder is None and data.outcome_info(v).counts["invalid"] == len(invalid)


# ---------------------------------------------------------------------------------------------- files
def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


def test_write_report(fixture_study, tmp_path):
    files = write_report(fixture_study[1], tmp_path / "out")
    assert files.html == tmp_path / "out" / f"{report_fixture.STUDY_NAME}.html"
    html = files.html.read_text(encoding="utf-8")
    plotly_js = plotly.offline.get_plotlyjs()
    assert html.count(plotly_js) == 1  # inlined, once
    ours = html.replace(plotly_js, "")
    assert "src=" not in ours and "href=" not in ours and "http" not in ours  # nothing to fetch: opens offline
    for kind in ("history", "importance", "parallel", "heatmap", "registers", "outcomes"):
        assert html.count(f'id="plot-{kind}"') == 1
    assert html.count("Plotly.newPlot") == 6
    assert html.count("<tr>") >= data.TOP_CONFIGS + 1  # the top table (and the reasons table)
    assert "NVIDIA H200" in html and "seqlen 4096" in html
    kinds = ["history", "importance", "parallel", "heatmap", "registers", "outcomes", "top", "overview"]
    assert sorted(p.name for p in files.pngs) == sorted(f"{report_fixture.STUDY_NAME}-{k}.png" for k in kinds)
    for png in files.pngs:
        width, height = _png_size(png)
        assert width >= 300 and height >= 100 and png.stat().st_size > 5000, png


def test_write_report_of_an_empty_study_and_without_pngs(tmp_path):
    study = optuna.create_study(study_name="nothing/yet", direction="maximize")
    files = write_report(study, tmp_path, png=False)
    assert files.html.name == "nothing_yet.html" and files.pngs == []  # '/' cannot be in a file name
    html = files.html.read_text(encoding="utf-8")
    assert html.count("The study has no trials yet.") >= 6
    assert list(tmp_path.iterdir()) == [files.html]
    pngs = write_report(study, tmp_path / "png").pngs
    assert len(pngs) == 8 and all(_png_size(p)[0] > 0 for p in pngs)


# ------------------------------------------------------------------------------------------------- CLI
@pytest.fixture(scope="module")
def two_studies(fixture_study, tmp_path_factory):
    """The fixture study plus a small causal seqlen-1024 one, in a fresh storage."""
    with db_dir(tmp_path_factory.mktemp("two")) as where:
        url = f"sqlite:///{Path(where) / 'studies.db'}"
        optuna.copy_study(from_study_name=report_fixture.STUDY_NAME, from_storage=fixture_study[0], to_storage=url)
        report_fixture.build(url, name="causal-1024", n_valid=6, n_invalid=2, shape=dataclasses.replace(
            report_fixture.SHAPE, seqlen_q=1024, seqlen_k=1024, causal=True))
        yield url


def _report(capsys, *args) -> tuple[int, str, str]:
    rc = cli_main(["report", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_report_by_name(two_studies, tmp_path, capsys):
    rc, out, _ = _report(capsys, "--storage", two_studies, "--study", "causal-1024", "--out", str(tmp_path))
    assert rc == 0 and "causal-1024: wrote" in out
    assert (tmp_path / "causal-1024.html").is_file()
    assert len(list(tmp_path.glob("causal-1024-*.png"))) == 8


@pytest.mark.parametrize("filters, names", [
    (["--seqlen", "4096"], [report_fixture.STUDY_NAME]),
    (["--causal"], ["causal-1024"]),
    (["--no-causal", "--head-dim", "128", "--dtype", "fp16", "--batch", "4", "--heads", "16"],
     [report_fixture.STUDY_NAME]),
    ([], ["causal-1024", report_fixture.STUDY_NAME]),  # no selector: every study, one report each
])
def test_cli_report_by_shape(two_studies, tmp_path, capsys, filters, names):
    rc, out, _ = _report(capsys, "--storage", two_studies, "--out", str(tmp_path), "--no-png", *filters)
    assert rc == 0
    assert sorted(p.stem for p in tmp_path.iterdir()) == sorted(names)
    assert len(out.strip().splitlines()) == len(names)


def test_cli_report_without_a_match_lists_the_studies(two_studies, tmp_path, capsys):
    rc, out, err = _report(capsys, "--storage", two_studies, "--out", str(tmp_path), "--seqlen", "999")
    assert rc == 2 and out == ""
    assert "matches --seqlen 999" in err
    assert "causal-1024" in err and report_fixture.STUDY_NAME in err and "seqlen 4096" in err
    assert not tmp_path.exists() or not list(tmp_path.iterdir())


def test_cli_report_uses_autotune_storage(two_studies, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_STORAGE", two_studies)
    rc, _, _ = _report(capsys, "--study", "causal-1024", "--out", str(tmp_path), "--no-png")
    assert rc == 0 and (tmp_path / "causal-1024.html").is_file()


def test_cli_report_on_a_missing_database_does_not_create_it(tmp_path, capsys):
    db = tmp_path / "none.db"
    rc, _, err = _report(capsys, "--storage", f"sqlite:///{db}")
    assert rc == 2 and "no study storage" in err and "autotune search" in err
    assert not db.exists()


def test_cli_report_on_an_empty_storage(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    optuna.storages.RDBStorage(url)  # creates the schema, no study
    rc, _, err = _report(capsys, "--storage", url)
    assert rc == 2 and "holds no studies yet" in err


def test_cli_report_without_the_extra_says_how_to_install(monkeypatch, two_studies, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    rc, _, err = _report(capsys, "--storage", two_studies)
    assert rc == 2 and "matplotlib" in err and "pip install 'autotune[report]'" in err


# ------------------------------------------------------------------------------------------- dashboard
def test_dashboard_without_the_extra_says_how_to_install(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "optuna_dashboard", None)  # makes `import optuna_dashboard` fail
    rc = cli_main(["dashboard", "--storage", f"sqlite:///{tmp_path / 'x.db'}"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "pip install 'autotune[dashboard]'" in err and "optuna-dashboard" in err


def test_dashboard_serves_the_resolved_storage(monkeypatch, fixture_study, capsys):
    calls = []
    fake = types.ModuleType("optuna_dashboard")
    fake.run_server = lambda storage, host, port: calls.append((storage, host, port))
    monkeypatch.setitem(sys.modules, "optuna_dashboard", fake)
    monkeypatch.setenv("AUTOTUNE_STORAGE", fixture_study[0])
    assert cli_main(["dashboard", "--port", "8123"]) == 0
    assert calls == [(fixture_study[0], "127.0.0.1", 8123)]
    assert "http://127.0.0.1:8123/" in capsys.readouterr().out


def test_dashboard_refuses_a_missing_database(monkeypatch, tmp_path, capsys):
    fake = types.ModuleType("optuna_dashboard")
    fake.run_server = lambda *a, **k: pytest.fail("must not start on a database that does not exist")
    monkeypatch.setitem(sys.modules, "optuna_dashboard", fake)
    assert cli_main(["dashboard", "--storage", f"sqlite:///{tmp_path / 'none.db'}"]) == 2
    assert "no study storage" in capsys.readouterr().err


# ------------------------------------------------------------------------ the real search, doubled GPU
class FakeBuilder:
    """Stands in for autotune.build.builder.Builder without nvcc: plausible ptxas figures, a cubin file per config."""

    jobs = 2
    nvcc_version = "fake nvcc"

    def __init__(self, arch: space.Arch, out: Path):
        self.arch, self.out = arch, out

    def build(self, items, progress=None):
        from autotune.build.builder import BuildResult
        from autotune.build.ptxas import BuildReport

        results = []
        for config, problem in items:
            registers, spill = report_fixture.fake_ptxas(config, problem)
            cubin = self.out / (hashlib.sha256(config.key.encode()).hexdigest()[:16] + ".cubin")
            cubin.write_bytes(config.key.encode())
            report = BuildReport(registers, spill, spill, spill, 0, 0.1)
            results.append(BuildResult(config, problem, self.arch, True, cubin, report, None, False, config.key,
                                       cubin_hash=hashlib.sha256(cubin.read_bytes()).hexdigest()))
        return results


def test_report_of_a_search_with_test_doubles(tmp_path, monkeypatch):
    """The real search loop writes the study (statuses, repeats, re-timing, baselines); the report must read it
    as the search's own summary does. The evaluator double runs in the search's child process."""
    import json

    from autotune.search import study as studies
    from autotune.search.loop import SearchOptions, run_search

    shape = space.Shape(batch=1, heads=2, seqlen_q=256, head_dim=64)
    arch = space.get_arch("sm_80")
    wrong = space.Config.make("mma_sync", br=64, bc=64, warps_m=4, warps_n=1, p_path="regs", smem_mode="dynamic",
                              kv_buffering="separate", loader_warps=1, min_blocks=1, q_in_regs=True)
    assert space.is_valid(wrong, shape.problem, arch) and not report_fixture.fake_ptxas(wrong, shape.problem)[1]
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({wrong.key: "wrong"}))
    monkeypatch.setenv("AUTOTUNE_DOUBLE_PLAN", str(plan))
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # the child imports search_doubles from here
    (tmp_path / "cubins").mkdir()
    with db_dir(tmp_path) as where:
        url = f"sqlite:///{Path(where) / 'search.db'}"
        # seed 3: a study with every status the report draws, repeats included (a seed picks another path when the
        # space changes: seed 1 gave 2 complete trials once the o_rescale axis came)
        result = run_search(SearchOptions(shape=shape, trials=14, storage=url, arch="sm_80", seed=3,
                                          enqueue=(wrong,), evaluator="search_doubles:evaluate", eval_timeout=60),
                            builder=FakeBuilder(arch, tmp_path / "cubins"), log=lambda line: None)
        study = optuna.load_study(study_name=result.study_name, storage=url)
        v = load_view(study)
        counts = dict(studies.status_counts(study))

    outcomes = data.outcome_info(v)
    assert {k: n for k, n in outcomes.counts.items() if n} == counts  # what the search's summary says
    assert outcomes.counts["complete"] >= 5 and outcomes.counts["wrong"] == 1
    history = data.history_info(v)
    assert history.best_so_far[-1] == max(t.tflops for t in v.trials if t.complete) == result.top[0].value
    assert history.baselines == {"SDPA flash (FA2)": 150.0, "SDPA cuDNN": 200.0}  # search_doubles' figures
    top = data.top_table_info(v)
    assert [r.number for r in top.rows[: len(result.top)]] == [t.number for t in result.top]
    header = data.header_info(v)
    assert header.retimed_tflops == pytest.approx(result.best.outcome.tflops)
    assert header.best_config == result.best.config.key
    assert header.gpu_name == "Test Double GPU" and header.arch == "sm_80"
    heat = data.heatmap_info(v)
    assert sum(map(sum, heat.counts)) == outcomes.counts["complete"]
    regs = data.registers_info(v)
    assert len(regs.points) == sum(outcomes.counts[s] for s in ("complete", "spilled", "wrong"))
    files = write_report(v, tmp_path / "report")
    assert files.html.is_file() and len(files.pngs) == 8
