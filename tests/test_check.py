"""autotune.measure.check judges outputs correctly: it passes a right one and catches each kind of wrong one.

Runs on CPU: the 'kernel' is a test double of KernelRunner whose run() writes o (and lse) with torch, and
check(..., device="cpu") takes the inputs, the reference and torch's own error from the CPU.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import space  # noqa: E402
from autotune.measure.check import LSE_TOLERANCE, SENTINEL, check, make_inputs  # noqa: E402
from autotune.launch.loader import KernelRunner  # noqa: E402
from autotune.measure.reference import reference_attention  # noqa: E402
from space import Problem, Shape  # noqa: E402

PROBLEM = Problem(64, "fp16", True)
SHAPE = Shape(batch=1, heads=2, seqlen_q=40, seqlen_k=70, head_dim=64, causal=True)


def fake_runner(write, problem: Problem = PROBLEM) -> KernelRunner:
    runner = KernelRunner.__new__(KernelRunner)  # no cubin: run() is the test's function
    runner.problem = problem
    runner.layout = space.Layout(threads=128, smem_static=0, smem_dynamic=0, rows_per_block=64)
    runner.run = lambda q, k, v, o, lse=None, scale=None, causal_align="upper_left": write(q, k, v, o, lse)
    return runner


def correct(q, k, v, o, lse):
    out, ref_lse = reference_attention(q, k, v, causal=True)
    o.copy_(out)
    if lse is not None:
        lse.copy_(ref_lse)


def run_check(write, layout="bhnd", check_lse=False, shape=SHAPE, problem=PROBLEM):
    return check(fake_runner(write, problem), shape, seed=1, layout=layout, check_lse=check_lse, device="cpu")


@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
def test_a_correct_output_passes(layout):
    result = run_check(correct, layout=layout, check_lse=True)
    assert result.ok, result.message
    assert result.max_error <= result.tolerance and result.lse_error <= LSE_TOLERANCE
    assert (result.nan_count, result.unwritten, result.out_of_bounds, result.nondeterministic) == (0, 0, 0, 0)
    assert result.layout == layout and result.seed == 1


def test_bf16_gqa_passes_and_tolerance_has_a_floor():
    shape = Shape(batch=1, heads=4, kv_heads=1, seqlen_q=1, head_dim=64, dtype="bf16")
    result = run_check(lambda q, k, v, o, lse: o.copy_(reference_attention(q, k, v)[0]), shape=shape,
                       problem=Problem(64, "bf16", False))
    assert result.ok, result.message
    assert result.tolerance >= 2 * 2.0**-7  # seqlen 1: torch is exact, the floor is what remains


def test_bottom_right_causal_alignment_is_wrong():
    def bottom_right(q, k, v, o, lse):  # FlashAttention-2's convention, not torch's
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril(k.shape[2] - q.shape[2])
        o.copy_(torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask))
        lse.zero_()

    result = run_check(bottom_right, check_lse=True)
    assert not result.ok and result.max_error > result.tolerance and result.lse_error > LSE_TOLERANCE
    assert "max error" in result.message and "lse error" in result.message


def test_a_small_bias_beyond_twice_torchs_error_is_wrong():
    def biased(q, k, v, o, lse):
        correct(q, k, v, o, lse)
        o[0, 0, 3, 5] += 0.05

    result = run_check(biased)
    assert not result.ok and result.max_error > 0.04


def test_kernel_made_nan_is_counted():
    def nan(q, k, v, o, lse):
        correct(q, k, v, o, lse)
        o[0, 1, 7, 0] = float("nan")

    result = run_check(nan)
    assert not result.ok and result.nan_count == 1 and result.unwritten == 0


def test_unwritten_elements_are_counted():
    def skip_last_row(q, k, v, o, lse):
        keep = o[:, :, -1].clone()  # the poison: NaN in the first run, SENTINEL in the second
        correct(q, k, v, o, lse)
        o[:, :, -1] = keep
        if lse is not None:
            lse[0, 0, 0] = SENTINEL if torch.isfinite(keep).all() else float("nan")

    result = run_check(skip_last_row, check_lse=True)
    assert not result.ok
    assert result.unwritten == 1 * 2 * 64 + 1 and result.nan_count == 0 and result.nondeterministic == 0
    assert "never written" in result.message


def test_stores_outside_the_tensor_are_caught():
    def past_the_end(q, k, v, o, lse):
        correct(q, k, v, o, lse)
        torch.as_strided(o, (8,), (1,), o.storage_offset() + o.numel()).fill_(0.5)

    def before_the_start(q, k, v, o, lse):
        correct(q, k, v, o, lse)
        torch.as_strided(o, (3,), (1,), o.storage_offset() - 3).fill_(0.5)

    assert run_check(past_the_end).out_of_bounds == 16  # 8 in each of the two runs
    result = run_check(before_the_start, layout="bnhd")
    assert not result.ok and result.out_of_bounds == 6 and "out of bounds" in result.message


def test_different_results_on_two_runs_are_caught():
    calls = []

    def racy(q, k, v, o, lse):
        correct(q, k, v, o, lse)
        if calls:
            o[0, 0, 0, 0] += 2.0**-6
        calls.append(1)

    result = run_check(racy)
    assert not result.ok and result.nondeterministic == 1 and "race" in result.message


def test_the_build_must_match_the_shapes_problem():
    with pytest.raises(ValueError, match="the build is for d64-fp16-causal"):
        check(fake_runner(correct), Shape(head_dim=128, seqlen_q=8), device="cpu")


def test_inputs_are_random_seeded_and_strided_as_asked():
    q, k, v = make_inputs(Shape(batch=2, heads=4, kv_heads=2, seqlen_q=5, seqlen_k=6, head_dim=64), "bnhd", 3, "cpu")
    assert q.shape == (2, 4, 5, 64) and k.shape == v.shape == (2, 2, 6, 64)
    assert q.stride() == (5 * 4 * 64, 64, 4 * 64, 1) and q.dtype == torch.float16
    assert 0.8 < float(q.float().std()) < 1.2 and not torch.equal(k, v)
    again, _, _ = make_inputs(Shape(batch=2, heads=4, kv_heads=2, seqlen_q=5, seqlen_k=6, head_dim=64), "bnhd", 3, "cpu")
    assert torch.equal(q, again)
