"""Benchmark mode's bookkeeping on CPU, with a stand-in for the GPU timing: which configs are measured (the lookup's
choice, the nearest rows' configs, the default; bounded), the time budget, the choice kept for the process, the
row recorded as benchmarked, found by the next process and said by `autotune best --explain`, and a searched row
of the shape's bucket winning over it."""
from __future__ import annotations

import dataclasses
import warnings

import pytest

import space
from autotune.cli import main
from autotune.launch.params import validate_inputs
from autotune.runtime import benchmark_mode as bench
from autotune.runtime import buckets, row_order
from autotune.runtime import lookup as runtime
from autotune.store import storage_url
from autotune.store.best_table import BestEntry, BestStore

torch = pytest.importorskip("torch")

import autotune  # noqa: E402
from autotune.runtime import attention_op as op  # noqa: E402

GPU = "FAKE GPU (tests only)"
ARCH = space.get_arch("sm_90")
PROBLEM = space.Problem(head_dim=128, dtype="bf16", causal=False)
DEFAULT = space.default_config(PROBLEM, ARCH)
MMA = space.default_config(PROBLEM, ARCH, "mma_sync")
CFG_A = MMA.replace(br=64, bc=64, warps_m=4)
CFG_B = MMA.replace(br=128, bc=32, warps_m=8)
CFG_C = MMA.replace(kv_buffering="shared")
SHAPE = space.Shape(batch=32, heads=32, kv_heads=8, seqlen_q=1, seqlen_k=4096, head_dim=128, dtype="bf16")


def row(shape, config, tflops=100.0, study="search", trial=1):
    return BestEntry.for_shape(shape, GPU, ARCH.name, config, tflops, study=study, trial=trial)


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.delenv(storage_url.ENV_VAR, raising=False)
    op.clear_caches()
    yield
    op.clear_caches()


@pytest.fixture
def db(tmp_path):
    url = f"sqlite:///{tmp_path / 'user.db'}"
    with BestStore(url) as s:  # two tuned neighbours of SHAPE (decode with 2048 and 8192 keys)
        s.record_best(row(space.Shape(batch=32, heads=32, kv_heads=8, seqlen_q=1, seqlen_k=2048, head_dim=128,
                                      dtype="bf16"), CFG_A))
        s.record_best(row(space.Shape(batch=32, heads=32, kv_heads=8, seqlen_q=1, seqlen_k=16384, head_dim=128,
                                      dtype="bf16"), CFG_B))
    return url


def test_the_environment_and_the_setter_switch_it(monkeypatch):
    assert [bench.env_enabled(v) for v in (None, "", "0", "off", "no", "1", "yes", "true")] == [
        False, False, False, False, False, True, True, True]
    monkeypatch.setattr(bench, "settings", bench.Settings(enabled=False))
    autotune.set_benchmark_mode(True, candidates=2, budget_ms=10)
    assert bench.settings == bench.Settings(enabled=True, candidates=2, budget_ms=10.0)
    autotune.set_benchmark_mode(False)
    assert bench.settings.enabled is False
    with pytest.raises(TypeError, match="enabled: expected True or False"):
        autotune.set_benchmark_mode("yes")
    with pytest.raises(ValueError, match="candidates: expected a non-negative integer"):
        autotune.set_benchmark_mode(True, candidates=-1)
    with pytest.raises(ValueError, match="budget_ms: expected a positive number"):
        autotune.set_benchmark_mode(True, budget_ms=0)


def test_the_candidates_are_the_guess_the_nearest_rows_configs_and_the_default(db):
    guess = runtime.select_config(SHAPE, GPU, ARCH, db, tables_dir=None)
    assert guess.source == "nearest" and guess.config == CFG_A  # 2048 keys is nearer than 16384
    rows = runtime.storage_candidates(db, GPU, ARCH, PROBLEM)
    assert bench.candidate_configs(SHAPE, guess, rows, ARCH, 4) == [CFG_A, CFG_B, DEFAULT]
    assert bench.candidate_configs(SHAPE, guess, rows, ARCH, 0) == [CFG_A, DEFAULT]  # bounded


def test_a_config_that_cannot_run_on_this_arch_is_not_a_candidate(db):
    guess = runtime.select_config(SHAPE, GPU, ARCH, db, tables_dir=None)
    rows = runtime.storage_candidates(db, GPU, ARCH, PROBLEM)
    sm86 = space.get_arch("sm_86")
    configs = bench.candidate_configs(SHAPE, guess, rows, sm86, 4)
    assert all(not space.violations(c, PROBLEM, sm86) for c in configs[1:])


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_measuring_stops_when_the_budget_is_spent_but_always_times_the_guess():
    clock = Clock()
    timed = []

    def time_config(config, share):
        timed.append((config, share))
        clock.now += 0.004  # each candidate takes 4 ms
        return {CFG_A: (3e-4, 1e-5), CFG_B: (2e-4, 1e-5)}.get(config)  # CFG_C: not built

    measured = bench.measure([CFG_A, CFG_C, CFG_B, DEFAULT], time_config, budget_s=0.010, clock=clock)
    assert [m.config for m in measured] == [CFG_A, CFG_C, CFG_B, DEFAULT]
    assert [m.why for m in measured] == ["", "not built", "", "budget of 10 ms spent"]
    assert timed[0][1] == pytest.approx(0.010 / 4)  # an equal share of what is left
    assert bench.fastest(measured).config == CFG_B
    zero = bench.measure([CFG_A, CFG_B], time_config, budget_s=0.0, clock=clock)
    assert [m.seconds is not None for m in zero] == [True, False]


class FakeRunner:
    def __init__(self, build):
        self.build, self.config = build, build.config

    def kernel(self, device):
        return ("kernel", device)


class FakeBuild:
    def __init__(self, config):
        self.config, self.ok, self.error = config, True, None


class FakeBuilder:
    nvcc_version = "nvcc (tests)"


@pytest.fixture
def stand_ins(monkeypatch):
    """Device, builds, loader and GPU timer replaced; returns the timer's log of timed configs."""
    import autotune.launch.loader

    times = {CFG_A: 3e-4, CFG_B: 2e-4, DEFAULT: 5e-4}
    timed = []

    def timer(plan, q, k, v, scale, arch, causal_align="upper_left"):
        def time_config(config, share):
            timed.append(config)
            return (times[config], 1e-6) if config in times else None
        return time_config

    monkeypatch.setattr(runtime, "device_info", lambda device: (GPU, ARCH))
    monkeypatch.setattr(runtime, "build", lambda config, problem, arch: FakeBuild(config))
    monkeypatch.setattr(runtime, "builder", lambda arch: FakeBuilder())
    monkeypatch.setattr(autotune.launch.loader, "KernelRunner", FakeRunner)
    monkeypatch.setattr(bench, "_timer", timer)
    return timed


def resolved(url, shape=SHAPE):
    selection = runtime.select_config(shape, GPU, ARCH, url, tables_dir=None)
    runner = FakeRunner(FakeBuild(selection.config))
    return runtime.Plan(selection, runner, runner.kernel(0))


def tensors(shape=SHAPE):
    return (torch.empty(shape.batch, shape.heads, shape.seqlen_q, 128, dtype=torch.bfloat16),
            torch.empty(shape.batch, shape.kv_heads, shape.seqlen_k, 128, dtype=torch.bfloat16))


def test_an_untuned_shape_keeps_the_fastest_and_records_it_as_benchmarked(db, stand_ins):
    q, k = tensors()
    chosen = bench.plan(resolved(db), q, k, k, None, db)
    assert stand_ins == [CFG_A, CFG_B, DEFAULT]
    assert chosen.runner.config == CFG_B and chosen.selection.config == CFG_B
    assert bench.plan(resolved(db), q, k, k, None, db) is chosen and len(stand_ins) == 3  # kept for the process
    with BestStore(db, read_only=True) as s:
        stored = s.lookup(GPU, ARCH.name, SHAPE)
    assert stored.study == row_order.BENCHMARKED_STUDY and stored.trial is None
    assert stored.config_key == CFG_B.key and stored.time_ms == pytest.approx(0.2)
    assert stored.tflops == pytest.approx(SHAPE.tflops(2e-4)) and stored.nvcc_version == "nvcc (tests)"

    op.clear_caches()  # the next process: an exact row, nothing measured
    again = runtime.select_config(SHAPE, GPU, ARCH, db, tables_dir=None)
    assert (again.source, again.config) == ("storage", CFG_B)
    assert any(row_order.BENCHMARKED_STUDY in n for n in again.notes)
    before = len(stand_ins)
    assert bench.plan(resolved(db), q, k, k, None, db).selection is not None and len(stand_ins) == before


def test_autotune_best_explain_says_the_row_was_benchmarked(db, stand_ins, capsys):
    prefill = space.Shape(batch=32, heads=32, kv_heads=8, seqlen_q=3000, head_dim=128, dtype="bf16")
    q, k = tensors(prefill)  # (`best --explain` has no --seqlen-k: a shape with seqlen_k == seqlen_q)
    bench.plan(resolved(db, prefill), q, k, k, None, db)
    op.clear_caches()
    assert main(["best", "--explain", "--seqlen", "3000", "--batch", "32", "--heads", "32", "--kv-heads", "8",
                 "--head-dim", "128", "--dtype", "bf16", "--gpu", GPU, "--arch", "sm_90", "--storage", db]) == 0
    out = capsys.readouterr().out
    assert "source: storage" in out and CFG_B.key in out
    assert "study 'benchmarked at first use (not searched)'" in out


def test_a_shape_with_an_exact_row_measures_nothing(db, stand_ins):
    tuned = space.Shape(batch=32, heads=32, kv_heads=8, seqlen_q=1, seqlen_k=2048, head_dim=128, dtype="bf16")
    plan = resolved(db, tuned)
    q, k = tensors(tuned)
    assert bench.plan(plan, q, k, k, None, db) is plan and stand_ins == []


def test_a_searched_row_of_the_bucket_wins_over_a_benchmarked_row(db, stand_ins):
    odd = space.Shape(batch=32, heads=32, kv_heads=8, seqlen_q=1, seqlen_k=4000, head_dim=128, dtype="bf16")
    q, k = tensors(odd)
    bench.plan(resolved(db, odd), q, k, k, None, db)  # benchmarked: CFG_B, under the shape's own key
    with BestStore(db) as s:  # then a campaign tunes the bucket (4096 keys)
        s.record_best(row(buckets.bucket(odd), CFG_C, tflops=1.0, study="campaign"))
    op.clear_caches()
    chosen = runtime.select_config(odd, GPU, ARCH, db, tables_dir=None)
    assert (chosen.source, chosen.config, chosen.row.study) == ("storage", CFG_C, "campaign")


def test_a_storage_that_cannot_be_written_is_said_once_and_the_choice_holds(tmp_path, stand_ins):
    url = f"sqlite:///{tmp_path / 'missing-dir' / 'user.db'}"
    q, k = tensors()
    with pytest.warns(runtime.StorageWarning, match="cannot record its choices"):
        chosen = bench.plan(resolved(url), q, k, k, None, url)
    assert chosen.runner.config == DEFAULT  # the only candidate with a time: no tuned rows here
    other = space.Shape(batch=16, heads=32, kv_heads=8, seqlen_q=1, seqlen_k=4096, head_dim=128, dtype="bf16")
    q, k = tensors(other)
    with warnings.catch_warnings():
        warnings.simplefilter("error", runtime.StorageWarning)  # said once: not again for the next shape
        bench.plan(resolved(url, other), q, k, k, None, url)


def test_attention_asks_benchmark_mode_only_when_it_is_on(monkeypatch):
    asked = []

    class Launch:
        extra_args = ()

    class Runner:
        config = DEFAULT

        def prepare(self, q, k, v, o, lse, scale, causal_align="upper_left"):
            return Launch()

    plan = runtime.Plan(runtime.heuristic(SHAPE, GPU, ARCH), Runner(), None)
    monkeypatch.setattr(op, "check_inputs", lambda q, k, v, require_cuda=True: validate_inputs(
        q, k, v, q, require_cuda=False))
    monkeypatch.setattr(runtime, "resolve", lambda device, shape, url: plan)
    monkeypatch.setattr(bench, "plan", lambda p, q, k, v, scale, url, causal_align="upper_left": asked.append(p) or p)
    monkeypatch.setattr(op, "Relaunch", lambda launch: launch)  # what runs is not asked here
    q, k = tensors()
    for enabled in (False, True):
        monkeypatch.setattr(bench, "settings", bench.Settings(enabled=enabled))
        op._new_launcher(q, k, k, False, None, False, "sqlite:///x.db")
    assert asked == [plan]


def test_one_measurement_serves_the_bucket_in_this_process_and_the_next(db, stand_ins):
    first = space.Shape(batch=32, heads=32, kv_heads=8, seqlen_q=1, seqlen_k=4200, head_dim=128, dtype="bf16")
    later = space.Shape(batch=32, heads=32, kv_heads=8, seqlen_q=1, seqlen_k=4300, head_dim=128, dtype="bf16")
    assert buckets.bucket(first) == buckets.bucket(later)  # a decode loop, two steps apart
    q, k = tensors(first)
    chosen = bench.plan(resolved(db, first), q, k, k, None, db)
    q, k = tensors(later)
    assert bench.plan(resolved(db, later), q, k, k, None, db) is chosen and len(stand_ins) == 3
    op.clear_caches()  # the next process: the bucket's benchmarked row is an exact row for every shape in it
    again = runtime.select_config(later, GPU, ARCH, db, tables_dir=None)
    assert (again.source, again.config, again.row.seqlen_k) == ("storage", CFG_B, 4200)
    with BestStore(db, read_only=True) as s:  # recorded under the measured shape's own key
        assert s.lookup(GPU, ARCH.name, later) is None and s.lookup(GPU, ARCH.name, first) is not None


# ---- the call's causal alignment reaches every timed candidate ------------------------------------------------

CAUSAL = space.Problem(head_dim=128, dtype="bf16", causal=True)
LR = space.Shape(batch=32, heads=32, kv_heads=8, seqlen_q=4, seqlen_k=4096, head_dim=128, dtype="bf16", causal=True,
                 causal_align="lower_right")
LR_A = space.default_config(CAUSAL, ARCH, "mma_sync").replace(br=64, bc=64, warps_m=4)
LR_B = space.default_config(CAUSAL, ARCH, "mma_sync").replace(br=128, bc=32, warps_m=8)
UL_C = space.default_config(CAUSAL, ARCH, "mma_sync").replace(kv_buffering="shared")


def test_candidates_are_timed_with_the_calls_causal_alignment(tmp_path, monkeypatch):
    # A lower-right decode step (4 new tokens) with two lower-right neighbours and one upper-left row of its own
    # sizes. Timing a candidate upper-left would time a kernel that skips almost the whole cache.
    import autotune.launch.loader

    url = f"sqlite:///{tmp_path / 'user.db'}"
    with BestStore(url) as s:
        for nk, config in ((2048, LR_A), (16384, LR_B)):
            s.record_best(row(dataclasses.replace(LR, seqlen_k=nk), config))
        s.record_best(row(dataclasses.replace(LR, causal_align="upper_left"), UL_C))  # another mask: no candidate
    prepared, seconds = [], {LR_A: 3e-4, LR_B: 2e-4}

    class Launch:
        extra_args, combine = (), None

        def __init__(self, config, causal_align):
            self.config, self.causal_align = config, causal_align

    class Runner(FakeRunner):
        def prepare(self, q, k, v, o, lse=None, scale=None, causal_align="upper_left"):
            prepared.append((self.config, causal_align))
            return Launch(self.config, causal_align)

    monkeypatch.setattr(runtime, "device_info", lambda device: (GPU, ARCH))
    monkeypatch.setattr(runtime, "build", lambda config, problem, arch, trusted=None: FakeBuild(config))
    monkeypatch.setattr(runtime, "builder", lambda arch: FakeBuilder())
    monkeypatch.setattr(autotune.launch.loader, "KernelRunner", Runner)
    monkeypatch.setattr(bench, "is_built", lambda config, problem, arch: True)
    monkeypatch.setattr(bench, "_time_launch", lambda launch, device, share: (seconds.get(launch.config, 5e-4), 1e-6))
    monkeypatch.setattr(bench, "settings", bench.Settings(enabled=True))
    selection = runtime.select_config(LR, GPU, ARCH, url, tables_dir=None)
    assert selection.source == "nearest" and selection.row.causal_align == "lower_right"
    guessed = Runner(FakeBuild(selection.config))
    monkeypatch.setattr(runtime, "resolve", lambda device, shape, u: runtime.Plan(selection, guessed, None))
    monkeypatch.setattr(op, "check_inputs", lambda q, k, v, require_cuda=True: validate_inputs(
        q, k, v, q, require_cuda=False))
    monkeypatch.setattr(op, "Relaunch", lambda launch: launch)  # the prepared launch is what is asked about
    q, k = tensors(LR)
    launcher = op._new_launcher(q, k, k, "lower_right", None, False, url)
    timed = [config for config, _ in prepared[:-1]]
    assert UL_C not in timed and {LR_A, LR_B} <= set(timed)
    assert {align for _, align in prepared} == {"lower_right"}  # every candidate, and the launch that runs
    assert launcher.plan.runner.config == LR_B
    with BestStore(url, read_only=True) as s:  # recorded under the lower-right key, not over the upper-left row
        assert s.lookup(GPU, ARCH.name, LR).config_key == LR_B.key
        assert s.lookup(GPU, ARCH.name, dataclasses.replace(LR, causal_align="upper_left")).config_key == UL_C.key
