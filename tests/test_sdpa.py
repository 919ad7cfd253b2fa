"""autotune.scaled_dot_product_attention against PyTorch's: the same errors (type, and a message naming the
argument) for what PyTorch rejects, PyTorch's own results for what the kernel does not run (each reason counted
and said once), the kernel (a stand-in here) for what it runs, and patch_sdpa putting the original back."""
from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import autotune  # noqa: E402
from autotune.runtime import fallbacks, sdpa  # noqa: E402
from model_doubles import fallback_reasons, stand_in  # noqa: E402,F401

TORCH_SDPA = torch._C._nn.scaled_dot_product_attention


def t(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


def qkv(b=2, h=4, hkv=None, n=16, nk=None, d=64, dtype=torch.float16):
    return t(b, h, n, d, dtype=dtype), t(b, hkv or h, nk or n, d, dtype=dtype), t(b, hkv or h, nk or n, d, dtype=dtype)


# (name, args, kwargs, the argument the message must name); each is rejected by PyTorch itself.
BAD = [
    ("query not a tensor", (3, t(2, 4, 8, 16), t(2, 4, 8, 16)), {}, "query"),
    ("key not a tensor", (t(2, 4, 8, 16), [1], t(2, 4, 8, 16)), {}, "key"),
    ("mask not a tensor", (t(2, 4, 8, 16),) * 3, {"attn_mask": 1}, "attn_mask"),
    ("is_causal int", (t(2, 4, 8, 16),) * 3, {"is_causal": 1}, "is_causal"),
    ("enable_gqa None", (t(2, 4, 8, 16),) * 3, {"enable_gqa": None}, "enable_gqa"),
    ("dropout_p str", (t(2, 4, 8, 16),) * 3, {"dropout_p": "0.1"}, "dropout_p"),
    ("scale str", (t(2, 4, 8, 16),) * 3, {"scale": "x"}, "scale"),
    ("key dtype", (t(2, 4, 8, 16), t(2, 4, 8, 16, dtype=torch.float64), t(2, 4, 8, 16)), {}, "key"),
    ("value dtype", (t(2, 4, 8, 16), t(2, 4, 8, 16), t(2, 4, 8, 16, dtype=torch.float16)), {}, "value"),
    ("key device", (t(2, 4, 8, 16), t(2, 4, 8, 16).to("meta"), t(2, 4, 8, 16)), {}, "key"),
    ("1-d query", (t(16), t(8, 16), t(8, 16)), {}, "query"),
    ("key embedding size", (t(2, 4, 8, 16), t(2, 4, 8, 32), t(2, 4, 8, 32)), {}, "key"),
    ("key batch", (t(2, 4, 8, 16), t(3, 4, 8, 16), t(3, 4, 8, 16)), {}, "key"),
    ("key heads without enable_gqa", (t(2, 4, 8, 16), t(2, 2, 8, 16), t(2, 2, 8, 16)), {}, "key"),
    ("value batch", (t(2, 4, 8, 16), t(2, 4, 8, 16), t(3, 4, 8, 16)), {}, "value"),
    ("mask dtype int", (t(2, 4, 8, 16),) * 3, {"attn_mask": torch.ones(8, 8, dtype=torch.int32)}, "attn_mask"),
    ("mask dtype f16 for f32", (t(2, 4, 8, 16),) * 3, {"attn_mask": torch.ones(8, 8, dtype=torch.float16)}, "attn_mask"),
    ("mask shape", (t(2, 4, 8, 16),) * 3, {"attn_mask": torch.ones(3, 8, dtype=torch.bool)}, "attn_mask"),
    ("mask larger than the scores", (t(2, 4, 8, 16),) * 3, {"attn_mask": torch.ones(2, 2, 4, 8, 8)}, "attn_mask"),
]


@pytest.mark.parametrize("name,args,kwargs,argument", BAD, ids=[b[0] for b in BAD])
def test_what_pytorch_rejects_raises_the_same_exception_type_naming_the_argument(name, args, kwargs, argument):
    with pytest.raises(Exception) as theirs:
        TORCH_SDPA(*args, **kwargs)
    with pytest.raises(Exception) as ours:
        autotune.scaled_dot_product_attention(*args, **kwargs)
    assert type(ours.value) is type(theirs.value), (theirs.value, ours.value)
    assert argument in str(ours.value).split(":")[0] or f"'{argument}'" in str(ours.value), str(ours.value)


# Odd calls PyTorch accepts: never rejected here, and the results are PyTorch's.
ACCEPTED = [
    ("3-d", (t(4, 8, 16), t(4, 8, 16), t(4, 8, 16)), {}),
    ("2-d", (t(8, 16), t(8, 16), t(8, 16)), {}),
    ("5-d", (t(2, 3, 4, 8, 16),) * 3, {}),
    ("broadcast key batch", (t(2, 4, 8, 16), t(1, 4, 8, 16), t(1, 4, 8, 16)), {}),
    ("key batch dims broadcast (3-d key)", (t(2, 4, 8, 16), t(4, 8, 16), t(4, 8, 16)), {}),
    ("one key head broadcast", (t(2, 4, 8, 16), t(2, 1, 8, 16), t(2, 1, 8, 16)), {}),
    ("gqa on CPU float32", (t(2, 8, 8, 16), t(2, 2, 8, 16), t(2, 2, 8, 16)), {"enable_gqa": True}),
    ("value embedding size differs", (t(2, 4, 8, 16), t(2, 4, 8, 16), t(2, 4, 8, 32)), {}),
    ("bool mask broadcast", (t(2, 4, 8, 16),) * 3, {"attn_mask": torch.rand(1, 8) > 0.3}),
    ("float32 mask for a bf16 query", (t(2, 4, 8, 16, dtype=torch.bfloat16),) * 3, {"attn_mask": torch.zeros(8, 8)}),
    ("scale as an int", (t(2, 4, 8, 16),) * 3, {"scale": 1}),
    ("scale as a tensor", (t(2, 4, 8, 16),) * 3, {"scale": torch.tensor(0.5)}),
    ("causal, more keys", (t(2, 4, 8, 16), t(2, 4, 12, 16), t(2, 4, 12, 16)), {"is_causal": True}),
    ("empty query", (t(2, 4, 0, 16), t(2, 4, 8, 16), t(2, 4, 8, 16)), {}),
]


@pytest.mark.parametrize("name,args,kwargs", ACCEPTED, ids=[a[0] for a in ACCEPTED])
def test_what_pytorch_accepts_gives_pytorchs_result(name, args, kwargs):
    fallbacks.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fallbacks.FallbackWarning)
        ours = autotune.scaled_dot_product_attention(*args, **kwargs)
    assert torch.equal(ours, TORCH_SDPA(*args, **kwargs))
    assert sum(fallbacks.counts().values()) == 1  # CPU tensors: every one of them is a (counted) fallback


def test_supported_calls_run_the_kernel_with_gqa_unrepeated(stand_in):
    q, k, v = qkv(h=8, hkv=2, n=32)
    out = autotune.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, scale=0.1)
    assert stand_in.calls == [{"q": (2, 8, 32, 64), "k": (2, 2, 32, 64), "causal": True, "scale": 0.1}]
    assert torch.equal(out, TORCH_SDPA(q, k, v, is_causal=True, enable_gqa=True, scale=0.1))
    autotune.scaled_dot_product_attention(*qkv(n=1, nk=40, d=128, dtype=torch.bfloat16))  # a decode step
    assert stand_in.calls[-1]["causal"] is False and stand_in.calls[-1]["k"] == (2, 4, 40, 128)
    assert fallbacks.counts() == {}


def test_a_causal_call_with_different_lengths_runs_the_kernel_top_left_like_pytorch(stand_in):
    q, k, v = qkv(nk=24)
    out = autotune.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert stand_in.calls[-1]["causal"] is True and stand_in.calls[-1]["k"][2] == 24  # SDPA's is_causal: top-left
    assert torch.equal(out, TORCH_SDPA(q, k, v, is_causal=True))
    assert fallbacks.counts() == {}


def misaligned(b=2, h=4, n=16, d=64):
    flat = torch.randn(b * h * n * d + 1, dtype=torch.float16)
    return flat[1:].view(b, h, n, d)  # 2 bytes past a 16-byte boundary


FALLBACKS = [
    ("mask", lambda: (qkv(), {"attn_mask": torch.ones(16, 16, dtype=torch.bool)}), "explicit attn_mask"),
    ("dropout", lambda: (qkv(), {"dropout_p": 0.5}), "dropout_p > 0"),
    ("head dim", lambda: (qkv(d=96), {}), "head_dim 96"),
    ("dtype", lambda: (qkv(dtype=torch.float32), {}), "dtype torch.float32"),
    ("value head dim", lambda: ((*qkv()[:2], t(2, 4, 16, 128, dtype=torch.float16)), {}), "value"),
    ("broadcast batch", lambda: ((t(2, 4, 16, 64, dtype=torch.float16),) + qkv(b=1)[1:], {}), "broadcast"),
    ("gqa without enable_gqa", lambda: ((t(2, 4, 16, 64, dtype=torch.float16),) + qkv(h=1)[1:], {}), "enable_gqa"),
    ("strided last dim", lambda: ((qkv(d=128)[0][..., ::2],) + qkv()[1:], {}), "non-contiguous last dim"),
    ("misaligned", lambda: ((misaligned(),) + qkv()[1:], {}), "not 16-byte aligned"),
    ("non-finite scale", lambda: (qkv(), {"scale": float("inf")}), "scale inf"),
    ("scale as a tensor", lambda: (qkv(), {"scale": torch.tensor(0.5)}), "scale tensor"),
    ("3-d", lambda: (tuple(x[0] for x in qkv()), {}), "3-d query"),
    ("empty", lambda: (qkv(n=0, nk=4), {}), "empty sequence"),
]


@pytest.mark.parametrize("name,make,reason", FALLBACKS, ids=[f[0] for f in FALLBACKS])
def test_each_unsupported_call_falls_back_to_pytorch_with_its_reason(stand_in, name, make, reason):
    (q, k, v), kwargs = make()
    with pytest.warns(fallbacks.FallbackWarning, match="ran torch.nn.functional.scaled_dot_product_attention"):
        ours = autotune.scaled_dot_product_attention(q, k, v, **kwargs)
    assert stand_in.calls == []
    torch.manual_seed(0)
    if "dropout_p" not in kwargs:
        assert torch.equal(ours, TORCH_SDPA(q, k, v, **kwargs))
    [(said, n)] = fallback_reasons().items()
    assert reason in said and n == 1


def test_inputs_that_require_grad_fall_back_and_keep_their_graph(stand_in):
    q, k, v = (x.requires_grad_() for x in qkv())
    out = autotune.scaled_dot_product_attention(q, k, v)
    out.sum().backward()
    assert q.grad is not None and stand_in.calls == []
    assert "require grad" in next(iter(fallback_reasons()))
    with torch.no_grad():
        autotune.scaled_dot_product_attention(q, k, v)
    assert len(stand_in.calls) == 1


def test_cpu_tensors_fall_back_when_the_kernel_device_is_cuda_only():
    fallbacks.reset()
    with pytest.warns(fallbacks.FallbackWarning, match="tensors on cpu"):
        autotune.scaled_dot_product_attention(*qkv())


def test_a_reason_is_said_once_and_counted_every_time(stand_in):
    q, k, v = qkv(d=96)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        for _ in range(5):
            autotune.scaled_dot_product_attention(q, k, v)
        autotune.scaled_dot_product_attention(*qkv(d=32))
    assert [str(w.message).split(": ")[-1].split(" (")[0] for w in said] == ["head_dim 96", "head_dim 32"]
    assert sorted(fallback_reasons().values()) == [1, 5]
    fallbacks.reset()  # re-arms the warning
    with pytest.warns(fallbacks.FallbackWarning):
        autotune.scaled_dot_product_attention(q, k, v)


# ---- patch_sdpa -------------------------------------------------------------------------------------------------

class TimmStyleAttention(torch.nn.Module):
    """The attention block of timm's vision_transformer.Attention (fused_attn path): qkv projection, then
    F.scaled_dot_product_attention looked up on the module F at call time."""

    def __init__(self, dim=256, heads=4):
        super().__init__()
        self.heads, self.qkv, self.proj = heads, torch.nn.Linear(dim, dim * 3), torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        x = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0)
        return self.proj(x.transpose(1, 2).reshape(b, n, c))


def test_patch_sdpa_routes_a_models_own_calls_and_restores_the_original(stand_in):
    block = TimmStyleAttention().to(torch.bfloat16).eval()
    x = torch.randn(2, 17, 256, dtype=torch.bfloat16)
    original = F.scaled_dot_product_attention
    with torch.no_grad():
        stock = block(x)
        with autotune.patch_sdpa():
            assert F.scaled_dot_product_attention is autotune.scaled_dot_product_attention
            patched = block(x)
    assert F.scaled_dot_product_attention is original
    assert stand_in.calls == [{"q": (2, 4, 17, 64), "k": (2, 4, 17, 64), "causal": False, "scale": None}]
    assert torch.equal(patched, stock)


def test_patch_sdpa_restores_the_original_when_the_block_raises():
    original = F.scaled_dot_product_attention
    with pytest.raises(KeyError):
        with autotune.patch_sdpa():
            raise KeyError("boom")
    assert F.scaled_dot_product_attention is original


def test_nested_patches_restore_in_order(monkeypatch):
    def someone_elses(*a, **kw):
        return TORCH_SDPA(*a, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", someone_elses)
    with autotune.patch_sdpa():
        with autotune.patch_sdpa():
            pass
        assert F.scaled_dot_product_attention is autotune.scaled_dot_product_attention
    assert F.scaled_dot_product_attention is someone_elses


def test_fallbacks_inside_the_patch_call_pytorchs_function_not_the_patch():
    fallbacks.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fallbacks.FallbackWarning)
        with autotune.patch_sdpa():
            out = F.scaled_dot_product_attention(*qkv(dtype=torch.float32))  # CPU: falls back, no recursion
    assert out.shape == (2, 4, 16, 64)


def test_a_timm_vit_runs_through_the_patch(stand_in):
    timm = pytest.importorskip("timm")
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10, img_size=64).eval()
    model = model.to(torch.bfloat16)
    x = torch.randn(2, 3, 64, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        stock = model(x)
        with autotune.patch_sdpa():
            patched = model(x)
    assert len(stand_in.calls) == len(model.blocks) and stand_in.calls[0]["q"] == (2, 3, 17, 64)
    assert torch.equal(patched, stock)


def test_the_plain_python_broadcast_agrees_with_torch():
    """sdpa._broadcast_shapes stands in for torch.broadcast_shapes on the per-call path: same result, same error."""
    import random

    from autotune.runtime.sdpa import _broadcast_shapes

    rng = random.Random(0)
    for _ in range(3000):
        shapes = [tuple(rng.choice((0, 1, 2, 3)) for _ in range(rng.randint(0, 4))) for _ in range(rng.randint(1, 3))]
        try:
            want = torch.broadcast_shapes(*shapes)
        except RuntimeError:
            with pytest.raises(RuntimeError):
                _broadcast_shapes(*shapes)
        else:
            assert _broadcast_shapes(*shapes) == want, shapes
