"""autotune.attention on a GPU: matches the fp32 reference over awkward shapes (seqlen 1, 17, 1000; GQA 4:1;
causal with Nq != Nk; fp16/bf16; d64/d128/d256; (B,N,H,D) memory through transpose), eager and under
torch.compile(fullgraph=True); lse matches; warm calls with new tensors stay right; misaligned input raises.

Tolerance as in autotune/measure/check.py: torch's own same-dtype error (SDPA on the same inputs, k/v heads repeated for
GQA) against the same fp32 reference sets the bar: max_error <= 2 × max(torch_error, one ulp at 1.0)."""
from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

import autotune  # noqa: E402
from autotune.runtime import attention_op as op  # noqa: E402
from autotune.measure.reference import reference_attention  # noqa: E402

pytestmark = pytest.mark.gpu

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
ULP = {"fp16": 2.0**-10, "bf16": 2.0**-7}
LSE_TOLERANCE = 1e-3

# (batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim, dtype, causal, layout)
CASES = [
    (1, 1, 1, 1, 1, 64, "fp16", False, "bhnd"),
    (1, 1, 1, 1, 1, 128, "bf16", True, "bhnd"),
    (2, 8, 2, 17, 17, 128, "bf16", True, "bnhd"),
    (1, 4, 1, 1000, 1000, 64, "fp16", True, "bhnd"),       # GQA 4:1
    (2, 8, 2, 1000, 1000, 128, "fp16", False, "bnhd"),
    (2, 4, 4, 1000, 333, 128, "fp16", False, "bnhd"),      # cross attention
    (1, 8, 2, 77, 1000, 64, "bf16", True, "bhnd"),         # causal, Nq < Nk
    (1, 2, 2, 1000, 77, 128, "bf16", True, "bnhd"),        # causal, Nq > Nk: late rows see every key
    (1, 4, 4, 257, 257, 256, "fp16", True, "bhnd"),
]


def _random_cases(n: int, seed: int = 1234):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        kv_heads = rng.choice([1, 2, 4])
        group = rng.choice([1, 2, 4])
        seqlen_q = rng.choice([1, 17, 63, 129, 500, 1000, 1500])
        seqlen_k = rng.choice([seqlen_q, seqlen_q, rng.randint(1, 1500)])
        out.append((rng.randint(1, 3), kv_heads * group, kv_heads, seqlen_q, seqlen_k, rng.choice([64, 128]),
                    rng.choice(["fp16", "bf16"]), rng.choice([False, True]), rng.choice(["bhnd", "bnhd"])))
    return out


ALL_CASES = CASES + _random_cases(8)


def case_id(c) -> str:
    b, h, hkv, nq, nk, d, dt, causal, layout = c
    return f"b{b}-h{h}kv{hkv}-n{nq}k{nk}-d{d}-{dt}-{'causal' if causal else 'full'}-{layout}"


def make(b, h, hkv, nq, nk, d, dt, layout, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)

    def randn(heads, n):
        if layout == "bnhd":  # (B, N, H, D) memory, viewed as (B, H, N, D): strided, last dim contiguous
            return torch.randn(b, n, heads, d, generator=g, device="cuda", dtype=DTYPES[dt]).transpose(1, 2)
        return torch.randn(b, heads, n, d, generator=g, device="cuda", dtype=DTYPES[dt])

    return randn(h, nq), randn(hkv, nk), randn(hkv, nk)


def torch_error(q, k, v, causal, ref, scale=None) -> float:
    group = q.shape[1] // k.shape[1]
    k2, v2 = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(q, k2, v2, is_causal=causal, scale=scale)
    return (out.float() - ref).abs().max().item()


def assert_close(out, lse, q, k, v, causal, dt, scale=None):
    ref, ref_lse = reference_attention(q, k, v, causal=causal, scale=scale)
    assert out.shape == q.shape and out.dtype == q.dtype and out.stride() == op.output_strides(q)  # laid out like q
    err = (out.float() - ref).abs().max().item()
    bar = 2 * max(torch_error(q, k, v, causal, ref, scale), ULP[dt])
    assert err <= bar, f"max error {err:.3g} > {bar:.3g} (2 × torch's own error or one ulp)"
    if lse is not None:
        assert lse.shape == q.shape[:3] and lse.dtype == torch.float32
        lse_err = (lse - ref_lse).abs().max().item()
        assert lse_err <= LSE_TOLERANCE, f"lse error {lse_err:.3g}"


@pytest.mark.parametrize("case", ALL_CASES, ids=case_id)
def test_eager_matches_the_fp32_reference(case):
    b, h, hkv, nq, nk, d, dt, causal, layout = case
    q, k, v = make(b, h, hkv, nq, nk, d, dt, layout)
    out, lse = autotune.attention(q, k, v, causal=causal, return_lse=True)
    assert_close(out, lse, q, k, v, causal, dt)
    # the warm path (new tensors, same layout: only the pointers change) is right too
    prepared = len(op._launchers)
    q, k, v = make(b, h, hkv, nq, nk, d, dt, layout, seed=1)
    out, lse = autotune.attention(q, k, v, causal=causal, return_lse=True)
    assert len(op._launchers) == prepared
    assert_close(out, lse, q, k, v, causal, dt)
    assert_close(autotune.attention(q, k, v, causal=causal), None, q, k, v, causal, dt)  # no lse requested


@pytest.mark.parametrize("case", [CASES[2], CASES[3], CASES[7]], ids=case_id)
def test_fullgraph_compile_matches_eager_and_the_reference(case):
    b, h, hkv, nq, nk, d, dt, causal, layout = case
    q, k, v = make(b, h, hkv, nq, nk, d, dt, layout)

    def f(q, k, v):
        out, lse = autotune.attention(q, k, v, causal=causal, return_lse=True)
        return out * 1.0, lse

    torch._dynamo.reset()
    out, lse = torch.compile(f, fullgraph=True)(q, k, v)
    assert_close(out, lse, q, k, v, causal, dt)
    eager, eager_lse = autotune.attention(q, k, v, causal=causal, return_lse=True)
    assert torch.equal(out, eager) and torch.equal(lse, eager_lse)


def test_scale_matches_sdpa_semantics():
    q, k, v = make(1, 4, 4, 129, 129, 64, "fp16", "bhnd")
    for causal in (False, True):
        out, lse = autotune.attention(q, k, v, causal=causal, scale=0.3, return_lse=True)
        assert_close(out, lse, q, k, v, causal, "fp16", scale=0.3)


def test_runs_on_the_current_stream():
    q, k, v = make(2, 8, 8, 1000, 1000, 128, "fp16", "bhnd")
    expected = autotune.attention(q, k, v)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = autotune.attention(q, k, v)
    side.synchronize()
    assert torch.equal(got, expected)


def test_opcheck():
    q, k, v = make(1, 4, 2, 100, 100, 64, "bf16", "bnhd")
    for args in ((q, k, v, True, None, True), (q, k, v, False, 0.2, False)):
        torch.library.opcheck(torch.ops.autotune.flash_attention_fwd.default, args)


def test_misaligned_input_raises_even_when_the_layout_is_warm():
    q, k, v = make(1, 2, 2, 64, 64, 64, "fp16", "bhnd")
    autotune.attention(q, k, v)
    base = torch.randn(q.numel() + 1, device="cuda", dtype=torch.float16)
    shifted = base[1:].view(q.shape)  # same shape and strides as q, address off by 2 bytes
    with pytest.raises(ValueError, match=r"^q: expected a data pointer aligned to 16 bytes"):
        autotune.attention(shifted, k, v)


def test_errors_on_cuda_tensors_name_the_argument():
    q, k, v = make(1, 4, 4, 64, 64, 64, "fp16", "bhnd")
    with pytest.raises(ValueError, match=r"^k: expected a head count that divides q's 4 heads"):
        autotune.attention(q, k[:, :3], v[:, :3])
    with pytest.raises(ValueError, match=r"^q: expected a contiguous last dim"):
        autotune.attention(q.transpose(2, 3), k, v)
    with pytest.raises(ValueError, match=r"^v: expected the same dtype as q"):
        autotune.attention(q, k, v.bfloat16())


def test_explain_on_the_gpu():
    q, k, v = make(1, 4, 4, 64, 64, 64, "fp16", "bhnd")
    text = autotune.explain(q, k, v)
    name = torch.cuda.get_device_name()
    assert name in text and "source:" in text
    plan = op.runtime.resolve(q.device.index, op.shape_of(op.check_inputs(q, k, v), False))
    assert plan.selection.config.key in text


# ---- the warm path's prepared launch (loader.Relaunch): pointers patched per call ---------------------------------

# Decode rows of the shipped H200 table: B1 runs 16 key splits and a combine (programmatic on sm_90), B32 none.
DECODE_CASES = [(1, 32, 8, 1, 4096, 128, "bf16", False, "bhnd"), (32, 32, 8, 1, 4096, 128, "bf16", False, "bhnd")]


@pytest.mark.parametrize("case", DECODE_CASES, ids=case_id)
def test_decode_steps_with_moving_tensors_stay_right(case):
    """New q every step, the K/V cache now and then another tensor (its tensor maps re-pointed), one prepared
    launch throughout."""
    b, h, hkv, nq, nk, d, dt, causal, layout = case
    q, k, v = make(b, h, hkv, nq, nk, d, dt, layout)
    autotune.attention(q, k, v)
    prepared = len(op._launchers)
    caches = [(k, v), make(b, h, hkv, nq, nk, d, dt, layout, seed=7)[1:]]
    for step in range(4):
        q = make(b, h, hkv, nq, nk, d, dt, layout, seed=10 + step)[0]
        k, v = caches[step % 2 if step < 3 else 0]
        out, lse = autotune.attention(q, k, v, return_lse=True)
        assert_close(out, lse, q, k, v, False, dt)
    assert len(op._launchers) == prepared + 1  # the lse variant is its own memo entry; no other was made


@pytest.mark.parametrize("case", [DECODE_CASES[0], CASES[4]], ids=case_id)
def test_a_graph_replays_its_own_tensors_after_eager_calls_on_others(case):
    """A captured call records the pointers written for it: eager calls on other tensors in between (which
    rewrite the prepared launch's parameter block) leave the replay reading the captured tensors."""
    b, h, hkv, nq, nk, d, dt, causal, layout = case
    q, k, v = make(b, h, hkv, nq, nk, d, dt, layout)
    autotune.attention(q, k, v, causal=causal)  # prepared outside the capture
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        autotune.attention(q, k, v, causal=causal)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = autotune.attention(q, k, v, causal=causal)
    other = make(b, h, hkv, nq, nk, d, dt, layout, seed=3)
    eager = autotune.attention(*other, causal=causal)
    fresh = make(b, h, hkv, nq, nk, d, dt, layout, seed=4)
    for t, src in zip((q, k, v), fresh):
        t.copy_(src)  # new values in the captured tensors
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert_close(out, None, q, k, v, causal, dt)
    assert_close(eager, None, *other, causal, dt)


def test_a_warm_call_from_another_thread_runs_in_torchs_context():
    import threading

    q, k, v = make(1, 32, 8, 1, 4096, 128, "bf16", "bhnd")
    expected = autotune.attention(q, k, v)
    got = []
    thread = threading.Thread(target=lambda: got.append(autotune.attention(q, k, v)))
    thread.start()
    thread.join()
    torch.cuda.synchronize()
    assert torch.equal(got[0], expected)
