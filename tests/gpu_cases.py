"""The runtime cases every kernel family's GPU correctness matrix runs (tests/test_kernel_gpu.py,
tests/test_wgmma_gpu.py): sequence lengths 1/17/128/1000/4096, seqlen_q shorter and longer than seqlen_k,
GQA 4:1, (B,N,H,D) strides, logsumexp, and a grid of more tiles than the GPU holds CTAs."""
from __future__ import annotations

import dataclasses

from space import Shape


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    shape: Shape  # head_dim, dtype and causal are replaced by the problem's
    layout: str
    lse: bool
    causal_align: str = "upper_left"  # causal problems only: "lower_right" aligns the mask to the end of the keys


CASES = (
    Case("n1", Shape(batch=2, heads=4, seqlen_q=1), "bhnd", lse=True),
    Case("n17-gqa-bnhd", Shape(batch=2, heads=8, kv_heads=2, seqlen_q=17), "bnhd", lse=False),
    Case("n128-bnhd", Shape(batch=2, heads=4, seqlen_q=128), "bnhd", lse=True),
    Case("n1000-gqa", Shape(batch=1, heads=8, kv_heads=2, seqlen_q=1000), "bhnd", lse=True),
    Case("n4096-gqa-bnhd", Shape(batch=1, heads=4, kv_heads=1, seqlen_q=4096), "bnhd", lse=False),
    Case("q100-k300", Shape(batch=1, heads=4, seqlen_q=100, seqlen_k=300), "bhnd", lse=True),
    Case("q300-k100-bnhd", Shape(batch=1, heads=4, seqlen_q=300, seqlen_k=100), "bnhd", lse=True),
    # More tiles than an H200 holds CTAs (512 of 128 rows, 132 SMs): persistent CTAs loop over several tiles, so
    # the mbarrier parities wrap across tiles and the Q slot is reused.
    Case("n1000-gqa-many-tiles-bnhd", Shape(batch=4, heads=16, kv_heads=4, seqlen_q=1000), "bnhd", lse=True),
)


def build_plan(arch, plan, tmp_path_factory) -> dict:
    """{(problem, config): BuildResult} for a matrix's (problem, config) plan, in the shared test kernel cache."""
    import os

    from autotune.build.builder import Builder

    cache = os.environ.get("AUTOTUNE_TEST_CACHE_DIR") or tmp_path_factory.mktemp("kernel-cache")
    results = Builder(arch, cache_dir=cache, jobs=os.cpu_count()).build([(c, p) for p, c in plan])
    return {(r.problem, r.config): r for r in results}


def check_worker():
    """A child process for everything that launches our kernels (a fault or hang fails one test, not all); a
    generator for a pytest fixture to yield from."""
    from autotune.measure.child_process import Worker

    w = Worker(warmup=("torch.cuda:init", ()))
    yield w
    w.stop()


def assert_matches_reference(worker, build, problem, config, case: Case, timeout: float) -> None:
    """The matrices' one assertion: the build compiled without spills and, run on the case's shape in the child,
    passes autotune.measure.check (fp32 reference, poisoned output, guard zones) with every element written."""
    import zlib

    assert build.ok, f"{config.key} for {problem.key} did not build: {build.error}"
    assert not build.spilled, f"{config.key} for {problem.key} spills: {build.report}"
    shape = dataclasses.replace(case.shape, head_dim=problem.head_dim, dtype=problem.dtype, causal=problem.causal)
    seed = zlib.crc32(f"{problem.key}/{config.key}/{case.name}".encode())
    result = worker.call("autotune.measure.check:check", build, shape, seed, case.layout, case.lse, None, None,
                         case.causal_align, timeout=timeout)
    assert result.ok, f"autotune.measure.check:check {result.status}: {result.reason}"
    check = result.value
    assert check.ok, f"{config.key} on {shape.key} ({case.layout}, {case.causal_align}, seed {seed}): {check.message}"
    assert check.unwritten == 0 and check.nan_count == 0 and check.out_of_bounds == 0
