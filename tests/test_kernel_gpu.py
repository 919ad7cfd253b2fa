"""Correctness matrix of the mma_sync kernel on a GPU, and checks that the checker itself can fail.

Design: a covering set, not a cross product.
  * Compile-time problems: every (head_dim in {64, 128}) × (dtype in {fp16, bf16}) × (causal in {no, yes}) — 8.
  * Configs per problem: the heuristic default, then greedy set cover over a seeded sample of the valid configs
    of that problem until every value of every axis appears in at least one chosen config (falling back to the
    full space for a value the sample lacks). The seed includes the problem, so different problems get
    different configs: over the 8 problems that is well over 20 distinct configs and about 50 builds.
  * head_dim 256: the default config of each (dtype, causal) problem (D256).
  * Runtime cases: every build runs every case in CASES, which together cover seqlen {1, 17, 128, 1000, 4096},
    seqlen_q < seqlen_k and seqlen_q > seqlen_k, GQA 4:1, the (B, N, H, D) layout (non-standard strides), and lse.
So every axis value meets every problem dimension (head_dim, dtype, causal, each seqlen, GQA, layout) at least
once; `test_covering_set_*` and `test_cases_*` (CPU) check exactly that. Each check runs in a child process
(autotune.measure.child_process), so a kernel that faults or hangs fails its own test and the matrix goes on. That the checker
can fail at all is tested on CPU in tests/test_check.py.

Pass criterion (autotune.measure.check): max error within 2× of PyTorch's own same-dtype error against the fp32
reference (floor: one ulp at 1.0), no NaN, every output element written, nothing written outside the tensor,
identical results on two runs, and lse within 1e-3 where checked.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import random
import zlib

import pytest

torch = pytest.importorskip("torch")

import space  # noqa: E402
from space import Config, Problem, Shape  # noqa: E402

HAS_CUDA = torch.cuda.is_available()

FAMILY = "mma_sync"
SAMPLE = 1500  # configs drawn per problem before the greedy cover (keeps collection fast on CPU)
CHECK_TIMEOUT_S = 15  # a check takes about a second; a hung kernel must not eat the GPU session


def _arch() -> space.Arch:
    if HAS_CUDA:
        return space.get_arch(torch.cuda.get_device_capability(0))
    return space.get_arch("sm_90")  # what the GPU tests run on (H200); the CPU tests check the same selection


ARCH = _arch()
PROBLEMS = tuple(Problem(d, dtype, causal) for d in (64, 128) for dtype in space.DTYPES for causal in (False, True))


from gpu_cases import CASES, Case  # noqa: E402  (shared by both families' matrices)


@functools.lru_cache(maxsize=None)
def _all_configs() -> tuple[Config, ...]:
    return tuple(space.enumerate_configs(FAMILY))


def covering_configs(problem: Problem, arch: space.Arch, seed: int = 0) -> list[Config]:
    """Default first, then greedily the valid config adding the most uncovered (axis, value) pairs."""
    family = space.get_family(FAMILY)
    everything = _all_configs()
    sample = random.Random(f"{seed}-{problem.key}").sample(everything, min(SAMPLE, len(everything)))
    candidates = [c for c in sample if space.is_valid(c, problem, arch)]
    wanted = {(a.name, v) for a in family.axes for v in a.values}
    chosen = [space.default_config(problem, arch, FAMILY)]
    covered = set(chosen[0].values)
    while wanted - covered:
        best = max(candidates, key=lambda c: len(set(c.values) - covered), default=None)
        if best is None or not set(best.values) - covered:
            name, value = min(wanted - covered, key=repr)
            best = next((c for c in everything if getattr(c, name) == value and space.is_valid(c, problem, arch)),
                        None)
            if best is None:  # no valid config has this value for this problem: nothing to cover
                wanted.discard((name, value))
                continue
        chosen.append(best)
        covered |= set(best.values)
    return chosen


# head_dim 256 is in the space but no tuned shape uses it: its default config (FlashAttention-2's pick) per
# dtype and causal flag, on every case.
D256 = tuple((p, space.default_config(p, ARCH, FAMILY))
             for p in (Problem(256, dt, c) for dt in space.DTYPES for c in (False, True)))
PLAN = tuple((p, c) for p in PROBLEMS for c in covering_configs(p, ARCH)) + D256


def _short(config: Config) -> str:
    return "-".join(str(v if not isinstance(v, bool) else int(v)) for _, v in config.values)


def _shape_for(case: Case, problem: Problem) -> Shape:
    return dataclasses.replace(case.shape, head_dim=problem.head_dim, dtype=problem.dtype, causal=problem.causal)


# ---- CPU: the design of the matrix ----------------------------------------------------------------------------

def test_covering_set_meets_every_axis_value_with_every_problem():
    family = space.get_family(FAMILY)
    for problem in PROBLEMS:
        configs = [c for p, c in PLAN if p == problem]
        assert all(space.is_valid(c, problem, ARCH) for c in configs), problem.key
        assert configs[0] == space.default_config(problem, ARCH, FAMILY)
        for axis in family.axes:
            seen = {getattr(c, axis.name) for c in configs}
            assert seen == set(axis.values), f"{problem.key}: axis {axis.name} covers {seen}, not {axis.values}"


def test_covering_set_size_and_spread():
    distinct = {c for _, c in PLAN}
    assert len(distinct) >= 20, len(distinct)
    assert len(PLAN) <= 200, len(PLAN)
    assert {p.head_dim for p in PROBLEMS} == {64, 128}
    assert {p.dtype for p in PROBLEMS} == set(space.DTYPES)
    assert {p.causal for p in PROBLEMS} == {False, True}


def test_cases_cover_every_runtime_dimension():
    assert {c.shape.seqlen_q for c in CASES} >= {1, 17, 128, 1000, 4096}
    assert any(c.shape.kv_heads * 4 == c.shape.heads for c in CASES), "GQA 4:1"
    assert {c.layout for c in CASES} == {"bhnd", "bnhd"}
    assert any(c.lse for c in CASES)
    assert any(c.shape.seqlen_q < c.shape.seqlen_k for c in CASES)
    assert any(c.shape.seqlen_q > c.shape.seqlen_k for c in CASES)
    # every (seqlen, layout) case is a real shape for every problem
    for case in CASES:
        for problem in PROBLEMS:
            _shape_for(case, problem)


# ---- GPU fixtures -------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    from autotune.build.builder import Builder

    cache = os.environ.get("AUTOTUNE_TEST_CACHE_DIR") or tmp_path_factory.mktemp("kernel-cache")
    results = Builder(ARCH, cache_dir=cache, jobs=os.cpu_count()).build([(c, p) for p, c in PLAN])
    return {(r.problem, r.config): r for r in results}


@pytest.fixture(scope="module")
def worker():
    """A child process for everything that launches our kernels: a fault or hang fails one test, not all."""
    from autotune.measure.child_process import Worker

    w = Worker(warmup=("torch.cuda:init", ()))
    yield w
    w.stop()


_died: dict = {}  # build -> how it killed its worker; its remaining cases fail at once instead of hanging again


def _call(worker, target: str, *args, build=None):
    if build is not None and build in _died:
        pytest.fail(f"not run: this build already {_died[build]}")
    result = worker.call(target, *args, timeout=CHECK_TIMEOUT_S)
    if not result.ok and build is not None:
        _died[build] = f"{result.status}: {result.reason.strip()[-300:]}"
    assert result.ok, f"{target} {result.status}: {result.reason}"
    return result.value


# ---- GPU: the matrix ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
@pytest.mark.parametrize("problem,config", PLAN, ids=[f"{p.key}-{_short(c)}" for p, c in PLAN])
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_kernel_matches_reference(builds, worker, problem, config, case):
    build = builds[(problem, config)]
    assert build.ok, f"{config.key} for {problem.key} did not build: {build.error}"
    shape = _shape_for(case, problem)
    seed = zlib.crc32(f"{problem.key}/{config.key}/{case.name}".encode())
    result = _call(worker, "autotune.measure.check:check", build, shape, seed, case.layout, case.lse, build=build.key)
    assert result.ok, f"{config.key} on {shape.key} ({case.layout}, seed {seed}): {result.message}"
    assert result.unwritten == 0 and result.nan_count == 0 and result.out_of_bounds == 0
    assert (result.lse_error is not None) == case.lse


# ---- GPU: the other entry points ------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_evaluate_and_baselines_in_a_worker(builds, worker):
    problem = Problem(128, "fp16", False)
    build = builds[(problem, space.default_config(problem, ARCH, FAMILY))]
    shape = Shape(batch=1, heads=8, seqlen_q=1024)
    ev = _call(worker, "autotune.measure.evaluate:evaluate", build, shape, 0, "bhnd", False, 5, 20)
    assert ev.status == "complete", ev.reason
    assert ev.tflops > 0 and ev.median_ms > 0 and ev.n_reps >= 1 and ev.registers > 0 and ev.blocks_per_sm >= 1
    timings, reasons = _call(worker, "autotune.measure.evaluate:sdpa_baselines_with_reasons", shape, ("flash",), "bhnd", 5, 20)
    assert timings["flash"] is not None, reasons


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_attention_with_allocates_outputs_and_rejects_bad_inputs(builds):
    # Last on purpose: this launches our kernel in the test process itself.
    from autotune.launch.params import make_params
    from autotune.launch.loader import attention_with
    from autotune.measure.reference import reference_attention

    problem = Problem(64, "bf16", True)
    build = builds[(problem, space.default_config(problem, ARCH, FAMILY))]
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 4, 333, 64, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o, lse = attention_with(build, q, k, v, return_lse=True)
    ref, ref_lse = reference_attention(q, k, v, causal=True)
    assert o.shape == q.shape and o.dtype == q.dtype and lse.shape == (2, 4, 333)
    assert float((o.float() - ref).abs().max()) < 0.05
    assert float((lse - ref_lse).abs().max()) < 1e-3
    misaligned = torch.empty(2 * 4 * 333 * 64 + 1, device="cuda", dtype=torch.bfloat16)[1:].view(2, 4, 333, 64)
    with pytest.raises(ValueError, match="q: expected a data pointer aligned"):
        make_params(misaligned, k, v, o)
    with pytest.raises(ValueError, match="compiled for"):
        attention_with(build, q.half(), k.half(), v.half())


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_check_and_bench_commands(builds, tmp_path, capsys):
    from autotune.cli import main

    cache = str(builds[PLAN[0]].cubin_path.parent.parent.parent)  # the module's kernel cache: no rebuild
    common = ["--seqlen", "300", "--batch", "2", "--heads", "8", "--kv-heads", "2", "--head-dim", "64",
              "--causal", "--cache-dir", cache]
    assert main(["check", *common, "--layout", "bnhd", "--lse", "--seed", "3"]) == 0
    assert "result   OK" in capsys.readouterr().out
    out = tmp_path / "bench.json"
    assert main(["bench", *common, "--warmup-ms", "5", "--rep-ms", "20", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    default_family = space.default_config(space.Problem(64, causal=True), ARCH).family  # wgmma on sm_90
    assert "sdpa_flash" in printed and f"{default_family}:" in printed
    import json

    rows = {r["name"]: r for r in json.loads(out.read_text())["rows"]}
    config_rows = [r for r in rows.values() if r["kind"] == "config"]
    assert len(config_rows) == 1 and config_rows[0]["status"].startswith("complete") and config_rows[0]["tflops"] > 0
