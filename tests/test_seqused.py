"""seqused_k on CPU: the parameter block's new last field and its packing, the build flag (and that builds
without it keep their flags and cache keys), the argument checks of autotune.attention and the loader, and the
transformers backend's routing of a static cache's decode mask through seqused_k (a stand-in for the kernel:
tests/model_doubles.py), with every other mask falling back exactly as before."""
from __future__ import annotations

import ctypes

import pytest

torch = pytest.importorskip("torch")

import space  # noqa: E402
from autotune.build.builder import Builder, define_flags  # noqa: E402
from autotune.launch.params import FlashFwdParams, make_params, validate_seqused_k  # noqa: E402
from autotune.runtime import attention_op  # noqa: E402
from space import Problem  # noqa: E402


def bhnd(b=2, h=4, n=16, d=64, dtype=torch.float16):
    return torch.randn(b, h, n, d, generator=torch.Generator().manual_seed(n + h), dtype=torch.float32).to(dtype)


# ---- the parameter block -------------------------------------------------------------------------------------------

def test_seqused_k_follows_lse_partial_and_grew_the_block_by_one_pointer():
    names = [name for name, _ in FlashFwdParams._fields_]
    at = names.index("seqused_k")
    assert names[at - 1] == "lse_partial"
    assert FlashFwdParams.seqused_k.offset == 184  # every earlier offset is what it was before seqused_k
    assert FlashFwdParams.lse_partial.offset == 176
    # fields added after seqused_k (the tile counter) go at the end, so seqused_k's offset never moves
    assert all(getattr(FlashFwdParams, name).offset > 184 for name in names[at + 1:])


def test_make_params_packs_the_pointer_and_leaves_it_null_without_one():
    q, k = bhnd(), bhnd(n=40)
    lengths = torch.tensor([3, 40], dtype=torch.int32)
    problem = Problem(64, "fp16", False, seqused_k=True)
    p = make_params(q, k, k, torch.empty_like(q), problem=problem, require_cuda=False, seqused_k=lengths)
    assert p.seqused_k == lengths.data_ptr()
    assert make_params(q, k, k, torch.empty_like(q), problem=problem, require_cuda=False).seqused_k is None
    assert make_params(q, k, k, torch.empty_like(q), require_cuda=False).seqused_k is None


def test_a_causal_seqused_build_packs_the_lower_right_offset():
    q, k = bhnd(n=4), bhnd(n=40)
    lengths = torch.tensor([3, 40], dtype=torch.int32)
    p = make_params(q, k, k, torch.empty_like(q), problem=Problem(64, "fp16", True, seqused_k=True),
                    require_cuda=False, causal_align="lower_right", seqused_k=lengths)
    assert p.causal_offset == 40 - 4  # the kernel shifts it by seqused_k[b] - seqlen_k


# ---- the build flag ------------------------------------------------------------------------------------------------

def test_the_build_flag_is_added_only_for_seqused_problems():
    assert "AT_SEQUSED_K" not in Problem(128, "fp16", True).defines()
    assert Problem(128, "fp16", True, seqused_k=True).defines()["AT_SEQUSED_K"] == 1
    arch = space.get_arch("sm_90")
    for family in ("mma_sync", "wgmma"):
        config = space.default_config(Problem(), arch, family)
        plain = define_flags(config, Problem())
        assert not any("SEQUSED" in f for f in plain)
        assert define_flags(config, Problem(seqused_k=True)) == sorted(plain + ["-DAT_SEQUSED_K=1"])


def test_the_flag_is_part_of_the_cache_key_and_the_problem_key(tmp_path):
    try:
        b = Builder("sm_90", cache_dir=tmp_path)
    except Exception as e:  # no nvcc on this machine: the key needs its version
        pytest.skip(f"no nvcc: {e}")
    config = space.default_config(Problem(), b.arch)
    assert b.key(config, Problem()) != b.key(config, Problem(seqused_k=True))
    assert Problem().key == "d128-fp16-full" and Problem(seqused_k=True).key == "d128-fp16-full-seqused"
    with pytest.raises(ValueError, match="seqused_k: expected a bool"):
        Problem(seqused_k=1)


@pytest.mark.parametrize("family", ["mma_sync", "wgmma"])
def test_the_default_configs_build_with_seqused_k_without_spills(family, build_cache_dir):
    arch = space.get_arch("sm_90")
    problem = Problem(128, "bf16", True, seqused_k=True)
    shape = space.Shape(batch=1, heads=32, kv_heads=8, seqlen_q=1, seqlen_k=4096, dtype="bf16", causal=True)
    config = space.default_config_for_shape(shape, arch, family)  # the decode default: split-KV (and packed GQA)
    result = Builder(arch, cache_dir=build_cache_dir, jobs=1).build_one(config, problem)
    assert result.ok, result.error
    assert result.report.spill_stores == 0 and result.report.spill_loads == 0


# ---- argument checks -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad, match", [
    (torch.tensor([1, 2], dtype=torch.int64), "seqused_k: expected dtype torch.int32, got torch.int64"),
    (torch.tensor([1, 2, 3], dtype=torch.int32), r"seqused_k: expected shape \(batch,\) = \(2,\), got shape \(3,\)"),
    (torch.tensor([[1, 2]], dtype=torch.int32), r"seqused_k: expected shape \(batch,\) = \(2,\), got shape \(1, 2\)"),
    (torch.tensor([1, 0, 2, 0], dtype=torch.int32)[::2], "seqused_k: expected a contiguous tensor"),
    ([1, 2], "seqused_k: expected a torch.Tensor or None, got list"),
    (torch.tensor([1, 2], dtype=torch.int32, device="meta"), "seqused_k: expected a tensor on q's device cpu"),
])
def test_seqused_k_errors_name_the_argument(bad, match):
    with pytest.raises(ValueError, match=match):
        validate_seqused_k(bad, 2, torch.device("cpu"), require_cuda=False)


def test_seqused_k_must_be_a_cuda_tensor_when_the_kernel_runs():
    with pytest.raises(ValueError, match="seqused_k: expected a CUDA tensor, got a tensor on cpu"):
        validate_seqused_k(torch.tensor([1, 2], dtype=torch.int32), 2, torch.device("cpu"))


@pytest.mark.parametrize("causal", [True, "upper_left"])
def test_attention_with_seqused_k_takes_no_top_left_mask(causal):
    q = bhnd()
    lengths = torch.tensor([3, 16], dtype=torch.int32)
    with pytest.raises(ValueError, match="causal: expected False or 'lower_right' with seqused_k"):
        attention_op.attention(q, q, q, causal=causal, seqused_k=lengths)


def test_attention_rejects_a_seqused_k_that_is_not_a_tensor():
    q = bhnd()
    with pytest.raises(ValueError, match="seqused_k: expected a torch.Tensor or None, got list"):
        attention_op.attention(q, q, q, seqused_k=[3, 16])


def test_check_seqused_runs_every_check_on_cpu_tensors():
    q = bhnd()
    attention_op.check_seqused(q, "lower_right", torch.tensor([0, 16], dtype=torch.int32), require_cuda=False)
    attention_op.check_seqused(q, False, None)
    with pytest.raises(ValueError, match="seqused_k: expected dtype torch.int32"):
        attention_op.check_seqused(q, False, torch.tensor([0, 16]), require_cuda=False)


def test_a_build_without_seqused_k_refuses_the_tensor():
    q = bhnd()
    with pytest.raises(ValueError, match="seqused_k: expected None .*does not read it"):
        make_params(q, q, q, torch.empty_like(q), problem=Problem(64, "fp16", False), require_cuda=False,
                    seqused_k=torch.tensor([3, 16], dtype=torch.int32))


def test_the_memo_key_holds_the_tensors_metadata_not_its_values():
    q = bhnd()
    a, b = torch.tensor([3, 16], dtype=torch.int32), torch.tensor([5, 1], dtype=torch.int32)
    key = attention_op._memo_key
    assert key(q, q, q, False, None, False, "u", a) == key(q, q, q, False, None, False, "u", b)
    assert key(q, q, q, False, None, False, "u", a) != key(q, q, q, False, None, False, "u")


# ---- transformers: a static cache's decode mask routes through seqused_k --------------------------------------------

transformers = pytest.importorskip("transformers")

from autotune.integrations import transformers as backend  # noqa: E402
from model_doubles import fallback_reasons, stand_in  # noqa: E402,F401
from transformers import AutoModelForCausalLM, LlamaConfig, StaticCache  # noqa: E402
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, causal_mask_function  # noqa: E402

@pytest.fixture(autouse=True)
def prefix_masks_routed(monkeypatch):
    """These tests check the routing of prefix masks through seqused_k (the default): not switched off here."""
    monkeypatch.delenv("AUTOTUNE_ROUTE_PREFIX_MASKS", raising=False)


def tiny_llama(attn="autotune"):
    cfg = LlamaConfig(vocab_size=128, hidden_size=256, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=128,
                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    return cfg, AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=torch.bfloat16).eval()


def decode_logits(model, cfg, prompt, steps, tokens_per_step=1):
    """Logits of a prefill and `steps` decode steps on a StaticCache, greedy; no 2-d attention mask (as a graphed
    server step runs it)."""
    cache = StaticCache(config=cfg, max_cache_len=48)
    out = []
    with torch.no_grad():
        logits = model(prompt, past_key_values=cache, use_cache=True).logits
        out.append(logits)
        for _ in range(steps):
            token = logits[:, -1:].argmax(-1).repeat(1, tokens_per_step)
            logits = model(token, past_key_values=cache, use_cache=True).logits
            out.append(logits)
    return out


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("tokens_per_step", [1, 3])
def test_a_static_cache_decode_runs_the_kernel_with_used_lengths_and_no_fallback(stand_in, tokens_per_step):
    cfg, ours = tiny_llama()
    _, stock = tiny_llama("sdpa")
    prompt = torch.randint(3, 128, (2, 5), generator=torch.Generator().manual_seed(1))
    got = decode_logits(ours, cfg, prompt, 3, tokens_per_step)
    want = decode_logits(stock, cfg, prompt, 3, tokens_per_step)
    assert fallback_reasons() == {}
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2)
    decode = [c for c in stand_in.calls if "seqused_k" in c]
    assert len(decode) == 3 * cfg.num_hidden_layers
    lengths = [5 + tokens_per_step * (s + 1) for s in range(3)]
    assert [c["seqused_k"] for c in decode[::cfg.num_hidden_layers]] == [[n, n] for n in lengths]
    assert all(c["k"] == (2, 2, 48, 64) for c in decode)  # the whole cache: the kernel reads only the used keys
    assert {c["causal"] for c in decode} == {False if tokens_per_step == 1 else "lower_right"}


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_a_padding_mask_still_falls_back_as_before(stand_in):
    cfg, ours = tiny_llama()
    cache = StaticCache(config=cfg, max_cache_len=48)
    prompt = torch.randint(3, 128, (2, 5), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[0, :2] = 0  # left padding: not a prefix of the keys
    with torch.no_grad():
        ours(prompt, attention_mask=mask, past_key_values=cache, use_cache=True)
        ours(prompt[:, -1:], attention_mask=torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], 1),
             past_key_values=cache, use_cache=True)
    assert not any("seqused_k" in c for c in stand_in.calls)
    assert fallback_reasons() == {"an explicit attention mask (padding, a window or another pattern)":
                                  2 * cfg.num_hidden_layers}


def test_the_mask_sdpa_gets_is_unchanged_and_only_plain_causal_masks_are_noted():
    stock = ALL_MASK_ATTENTION_FUNCTIONS["sdpa"]
    common = dict(batch_size=2, q_length=1, kv_length=32, q_offset=torch.tensor(6), kv_offset=0,
                  allow_is_causal_skip=False, use_vmap=False, device="cpu")
    ours = backend.sdpa_mask(mask_function=causal_mask_function, attention_mask=None, **common)
    assert torch.equal(ours, stock(mask_function=causal_mask_function, attention_mask=None, **common))
    assert backend.used_lengths(ours).tolist() == [7, 7] and backend.used_lengths(ours).dtype == torch.int32
    padded = backend.sdpa_mask(mask_function=causal_mask_function, attention_mask=torch.ones(2, 7, dtype=torch.bool),
                               **common)
    assert torch.equal(padded, stock(mask_function=causal_mask_function,
                                     attention_mask=torch.ones(2, 7, dtype=torch.bool), **common))
    assert padded not in backend._prefix_masks
    def other(b, h, q, kv):
        return kv <= q
    assert backend.sdpa_mask(mask_function=other, attention_mask=None, **common) not in backend._prefix_masks


def test_a_noted_mask_that_does_not_fit_the_call_falls_back(stand_in):
    mask = backend.sdpa_mask(batch_size=2, q_length=1, kv_length=32, q_offset=torch.tensor(6), kv_offset=0,
                             mask_function=causal_mask_function, attention_mask=None, allow_is_causal_skip=False,
                             device="cpu")
    q, k = bhnd(n=2, dtype=torch.bfloat16), bhnd(h=4, n=32, dtype=torch.bfloat16)  # 2 queries: SDPA broadcasts the mask
    backend.attention_forward(torch.nn.Module(), q, k, k, mask)
    assert stand_in.calls == []
    assert fallback_reasons() == {"an explicit attention mask (padding, a window or another pattern)": 1}
