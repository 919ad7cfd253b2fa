"""The real kernel inside models (GPU only): a tiny transformers Llama through attn_implementation="autotune"
against the same model through SDPA (prefill logits, greedy decode), nothing falling back, GQA caches going in
un-repeated; the SDPA-compatible call against PyTorch's on CUDA; patch_sdpa on a timm-style block; capture of a
generate loop into a campaign file; benchmark mode recording a benchmarked row."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

import autotune  # noqa: E402
from autotune.runtime import fallbacks, routing  # noqa: E402
from autotune.runtime import attention_op as op  # noqa: E402
from autotune.store import storage_url  # noqa: E402

TORCH_SDPA = torch._C._nn.scaled_dot_product_attention


@pytest.fixture(autouse=True)
def fresh(monkeypatch, tmp_path):
    monkeypatch.setenv(storage_url.ENV_VAR, f"sqlite:///{tmp_path / 'user.db'}")  # no user rows: shipped tables
    fallbacks.reset()
    op.clear_caches()
    yield
    op.clear_caches()


def tolerance(stock, other_backend) -> float:
    """Ours may differ from the stock path by a few times the stock path's own backend-to-backend difference."""
    return max(4 * (stock.float() - other_backend.float()).abs().max().item(), 2e-2)


def math_backend():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.MATH])


@pytest.fixture
def spy(monkeypatch):
    calls = []
    real = routing.kernel

    def kernel(q, k, v, causal, scale):
        calls.append((tuple(q.shape), tuple(k.shape), causal))
        return real(q, k, v, causal, scale)

    monkeypatch.setattr(routing, "kernel", kernel)
    return calls


@pytest.mark.parametrize("head_dim", [64, 128])
def test_a_tiny_llama_matches_sdpa_through_the_real_kernel(head_dim, spy):
    transformers = pytest.importorskip("transformers")
    import autotune.integrations.transformers  # noqa: F401

    cfg = transformers.LlamaConfig(vocab_size=1000, hidden_size=8 * head_dim, intermediate_size=1024,
                                   num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                                   head_dim=head_dim, max_position_embeddings=1024)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa",
                                                          dtype=torch.bfloat16).cuda().eval()
    ids = torch.randint(0, 1000, (2, 300), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        stock = model(ids).logits[:, -1]
        with math_backend():
            other = model(ids).logits[:, -1]
        stock_tokens = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False)
        model.set_attn_implementation("autotune")
        ours = model(ids).logits[:, -1]
        ours_tokens = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False)
    assert fallbacks.counts() == {}
    assert (ours.float() - stock.float()).abs().max().item() <= tolerance(stock, other)
    assert torch.equal(ours_tokens[:, 300], stock_tokens[:, 300])  # the first generated token
    assert all(k[1] == 2 for _, k, _ in spy)  # GQA: 2 K/V heads for 8, never repeated
    assert any(q[2] == 1 and not causal for q, _, causal in spy)  # decode steps ran on the kernel
    assert any(q[2] == 300 and causal for q, _, causal in spy)  # and the prefill


@pytest.mark.parametrize("kwargs,hkv,nk", [({}, 8, 512), ({"is_causal": True}, 8, 512),
                                           ({"enable_gqa": True}, 2, 512), ({"enable_gqa": True}, 2, 4096)])
def test_the_sdpa_compatible_call_matches_pytorch_on_cuda(kwargs, hkv, nk, spy):
    q = torch.randn(2, 8, 512 if nk == 512 else 1, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, hkv, nk, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    ours = autotune.scaled_dot_product_attention(q, k, v, **kwargs)
    stock = TORCH_SDPA(q, k, v, **kwargs)
    with math_backend():
        other = TORCH_SDPA(q, k, v, **kwargs)
    assert len(spy) == 1 and fallbacks.counts() == {}
    assert (ours.float() - stock.float()).abs().max().item() <= tolerance(stock, other)


def test_patch_sdpa_runs_a_timm_style_block_on_the_kernel(spy):
    import torch.nn.functional as F

    q = torch.randn(4, 16, 577, 64, device="cuda", dtype=torch.bfloat16)
    with autotune.patch_sdpa():
        ours = F.scaled_dot_product_attention(q, q, q)
    assert F.scaled_dot_product_attention is not autotune.scaled_dot_product_attention
    assert len(spy) == 1
    assert (ours.float() - TORCH_SDPA(q, q, q).float()).abs().max().item() < 2e-2


def test_capture_of_a_generate_loop_is_a_short_campaign(tmp_path):
    transformers = pytest.importorskip("transformers")
    import autotune.integrations.transformers  # noqa: F401
    from autotune.runtime import capture
    from autotune.search import campaign

    cfg = transformers.LlamaConfig(vocab_size=1000, hidden_size=1024, intermediate_size=1024, num_hidden_layers=2,
                                   num_attention_heads=8, num_key_value_heads=2, head_dim=128)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="autotune",
                                                          dtype=torch.bfloat16).cuda().eval()
    ids = torch.randint(0, 1000, (1, 1000), device="cuda")
    with autotune.capture(tmp_path / "shapes.toml"), torch.no_grad():
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=40, do_sample=False)
    shapes = [e.shape for e in campaign.load(tmp_path / "shapes.toml")]
    # the prompt's size is its bucket's first, written exactly; decode steps go to their buckets from the first one
    assert [(s.seqlen_q, s.seqlen_k) for s in shapes] == [(1000, 1000), (1, 1024), (1, 1280)]
    assert sum(n for _, n in capture.read(tmp_path / "shapes.toml")) == 2 * 40  # 2 layers × (prefill + 39 steps)


def test_benchmark_mode_records_a_benchmarked_row(tmp_path, monkeypatch):
    from autotune.runtime import benchmark_mode, row_order
    from autotune.runtime import lookup as runtime
    from autotune.store.best_table import BestStore

    import space

    monkeypatch.setattr(benchmark_mode, "settings", benchmark_mode.Settings(enabled=True))
    q = torch.randn(3, 12, 777, 128, device="cuda", dtype=torch.float16)  # no tuned row has this shape
    out = autotune.attention(q, q, q)
    assert (out.float() - TORCH_SDPA(q, q, q).float()).abs().max().item() < 2e-2
    gpu_name, arch = runtime.device_info(q.device.index)
    shape = space.Shape(batch=3, heads=12, seqlen_q=777, head_dim=128, dtype="fp16")
    with BestStore(runtime.storage_key(), read_only=True) as s:
        row = s.lookup(gpu_name, arch.name, shape)
    assert row is not None and row.study == row_order.BENCHMARKED_STUDY
