"""The transformers backend (autotune.integrations.transformers) on CPU, with a stand-in for the kernel: it is
registered through the public AttentionInterface (from_config and set_attn_implementation take it), prefill and
generate reach the kernel with GQA caches un-repeated, and every unsupported call runs transformers' own SDPA
function, exactly, with its reason counted and said once."""
from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import autotune  # noqa: E402
from autotune.integrations import transformers as backend  # noqa: E402
from autotune.runtime import fallbacks  # noqa: E402
from model_doubles import fallback_reasons, stand_in  # noqa: E402,F401
from transformers import AutoModelForCausalLM, LlamaConfig  # noqa: E402
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS  # noqa: E402
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS  # noqa: E402

SDPA = ALL_ATTENTION_FUNCTIONS["sdpa"]


def tiny_llama(head_dim=64, heads=4, kv_heads=2, layers=2, dtype=torch.bfloat16, attn="autotune", **kw):
    cfg = LlamaConfig(vocab_size=128, hidden_size=heads * head_dim, intermediate_size=256, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                      max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2, **kw)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=dtype).eval()


def ids(batch=2, n=12):
    return torch.randint(3, 128, (batch, n), generator=torch.Generator().manual_seed(1))


def test_importing_the_module_registers_the_backend_and_sdpas_masks():
    assert ALL_ATTENTION_FUNCTIONS["autotune"] is backend.attention_forward
    assert ALL_MASK_ATTENTION_FUNCTIONS["autotune"] is backend.sdpa_mask  # SDPA's masks, prefix ones noted
    backend.register()  # idempotent
    assert ALL_ATTENTION_FUNCTIONS["autotune"] is backend.attention_forward


def test_prefill_and_generate_run_on_the_kernel_with_gqa_unrepeated(stand_in):
    model = tiny_llama()
    assert model.config._attn_implementation == "autotune"
    x = ids()
    with torch.no_grad():
        logits = model(x).logits
        tokens = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=3, do_sample=False)
    prefill = [c for c in stand_in.calls if c["q"][2] > 1]
    decode = [c for c in stand_in.calls if c["q"][2] == 1]
    assert prefill and all(c["causal"] is True and c["k"] == (2, 2, 12, 64) for c in prefill)
    assert [c["k"][2] for c in decode] == [13, 13, 14, 14]  # 2 layers × 2 decode steps, the cache as it grows
    assert all(c["causal"] is False and c["k"][1] == 2 for c in decode)  # GQA cache: 2 K/V heads for 4
    assert fallbacks.counts() == {}
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        assert torch.equal(model(x).logits, logits)
        assert torch.equal(model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=3, do_sample=False),
                           tokens)


def test_set_attn_implementation_switches_an_sdpa_model_to_autotune(stand_in):
    model = tiny_llama(attn="sdpa")
    model.set_attn_implementation("autotune")
    assert model.config._attn_implementation == "autotune"
    with torch.no_grad():
        model(ids())
    assert len(stand_in.calls) == 2


def run_both(model, **inputs):
    """The model's logits through autotune and through sdpa, and the fallback reasons said meanwhile."""
    fallbacks.reset()
    model.set_attn_implementation("autotune")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with torch.no_grad():
            ours = model(**inputs).logits
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        theirs = model(**inputs).logits
    reasons = [str(w.message) for w in said if issubclass(w.category, fallbacks.FallbackWarning)]
    return ours, theirs, reasons


@pytest.mark.parametrize("case,make,reason", [
    ("padding", lambda: (tiny_llama(), {"attention_mask": torch.tensor([[0, 0] + [1] * 10, [1] * 12])}),
     "explicit attention mask"),
    ("head dim", lambda: (tiny_llama(head_dim=32), {}), "head_dim 32"),
    ("dtype", lambda: (tiny_llama(dtype=torch.float32), {}), "dtype torch.float32"),
], ids=["padding", "head dim", "dtype"])
def test_unsupported_models_run_transformers_sdpa_exactly(stand_in, case, make, reason):
    model, extra = make()
    ours, theirs, said = run_both(model, input_ids=ids(), **extra)
    assert torch.equal(ours, theirs)
    assert stand_in.calls == []
    assert len(said) == 1 and reason in said[0] and "transformers' sdpa_attention_forward" in said[0]
    assert list(fallback_reasons().values()) == [2]  # both layers counted, said once


def test_cpu_tensors_fall_back_when_the_kernel_is_cuda_only():
    fallbacks.reset()
    model = tiny_llama()
    with pytest.warns(fallbacks.FallbackWarning, match="tensors on cpu"):
        with torch.no_grad():
            model(ids())


def test_training_with_dropout_or_grad_falls_back(stand_in):
    model = tiny_llama(attention_dropout=0.1).train()
    model(ids()).logits.sum().backward()  # dropout > 0 in training
    assert "dropout 0.1" in next(iter(fallback_reasons()))
    fallbacks.reset()
    model = tiny_llama().train()
    model(ids()).logits.sum().backward()  # no dropout, but the kernel has no backward
    assert "require grad" in next(iter(fallback_reasons()))
    assert stand_in.calls == []


class Module(torch.nn.Module):
    """What transformers passes as `module`: the attention layer (is_causal, num_key_value_groups)."""

    is_causal = True
    num_key_value_groups = 2


def bhnd(b=2, h=4, n=8, d=64):
    return torch.randn(b, h, n, d, dtype=torch.bfloat16)


@pytest.mark.parametrize("kwargs,reason", [
    ({"softcap": 30.0}, "softcap"),
    ({"position_bias": torch.zeros(1, 4, 8, 8, dtype=torch.bfloat16)}, "position bias"),
    ({"s_aux": torch.zeros(4)}, "attention sinks"),
    ({"output_attentions": True}, "output_attentions"),
    ({"scaling": float("nan")}, "scaling nan"),
], ids=["softcap", "position_bias", "s_aux", "output_attentions", "scaling"])
def test_arguments_the_kernel_lacks_fall_back_to_transformers_sdpa(stand_in, kwargs, reason):
    q, k, v = bhnd(), bhnd(h=2), bhnd(h=2)
    def call(fn):
        torch.manual_seed(0)
        try:
            return fn(Module(), q, k, v, None, **kwargs)
        except ValueError as e:  # transformers' SDPA refuses softcap; so must we, the same way
            return type(e), str(e)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fallbacks.FallbackWarning)
        ours, theirs = call(backend.attention_forward), call(SDPA)
    if isinstance(theirs, tuple) and isinstance(theirs[0], type):
        assert ours == theirs
    else:  # bit for bit; a NaN scaling gives NaN on both paths
        torch.testing.assert_close(ours[0], theirs[0], rtol=0, atol=0, equal_nan=True)
    assert stand_in.calls == [] and reason in next(iter(fallback_reasons()))


def test_a_static_cache_prefill_crops_the_empty_slots_like_transformers_sdpa(stand_in):
    q, k, v = bhnd(n=8), bhnd(h=2, n=32), bhnd(h=2, n=32)
    out, _ = backend.attention_forward(Module(), q, k, v, None, scaling=0.125)
    assert stand_in.calls == [{"q": (2, 4, 8, 64), "k": (2, 2, 8, 64), "causal": True, "scale": 0.125}]
    assert torch.equal(out, SDPA(Module(), q, k, v, None, scaling=0.125)[0])
    assert out.shape == (2, 8, 4, 64) and out.is_contiguous()


def test_a_causal_call_with_more_queries_than_keys_runs_the_kernel_top_left_like_transformers_sdpa(stand_in):
    q, k, v = bhnd(n=8), bhnd(h=2, n=4), bhnd(h=2, n=4)
    out, _ = backend.attention_forward(Module(), q, k, v, None)
    assert stand_in.calls == [{"q": (2, 4, 8, 64), "k": (2, 2, 4, 64), "causal": True, "scale": None}]
    assert torch.equal(out, SDPA(Module(), q, k, v, None)[0])


def test_a_non_causal_module_runs_without_the_causal_mask(stand_in):
    class Encoder(Module):
        is_causal = False
    q, k, v = bhnd(), bhnd(h=2), bhnd(h=2)
    out, _ = backend.attention_forward(Encoder(), q, k, v, None)
    assert stand_in.calls[0]["causal"] is False
    assert torch.equal(out, SDPA(Encoder(), q, k, v, None)[0])


def test_the_fallback_counts_are_public():
    assert autotune.fallback_counts is fallbacks.counts
