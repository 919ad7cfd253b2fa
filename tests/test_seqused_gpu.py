"""seqused_k on the GPU: both kernel families (the prefill defaults, the decode defaults with split-KV and packed GQA
heads, a few other wgmma loops), fp16 and bf16, GQA, per-row lengths 0, 1, a non-multiple of the key tile and the
whole tensor, non-causal and bottom-right causal, against an fp32 reference on fresh random inputs with the output
poisoned (NaN) before each run and every key past a row's length poisoned too (K and V rows the kernel must neither
weigh nor multiply). Then autotune.attention under a CUDA graph with the lengths advanced on the device between
replays, and a tiny transformers Llama whose StaticCache decode runs on the kernel with no fallback, eagerly and
captured in a CUDA graph, against the same model on SDPA."""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import space  # noqa: E402
from space import Problem, Shape  # noqa: E402

@pytest.fixture(autouse=True)
def prefix_masks_routed(monkeypatch):
    """These tests check the routing of prefix masks through seqused_k (the default): not switched off here."""
    monkeypatch.delenv("AUTOTUNE_ROUTE_PREFIX_MASKS", raising=False)

pytestmark = pytest.mark.gpu

HAS_CUDA = torch.cuda.is_available()
IS_HOPPER = HAS_CUDA and torch.cuda.get_device_capability(0) == (9, 0)
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def reference(q, k, v, lengths, causal: bool, scale: float):
    """fp32 attention of row b over keys [0, lengths[b]), bottom-right causal aligned to that length when causal;
    a query row that sees no key gives O = 0 and lse = -inf (the kernel's convention)."""
    qf, kf, vf = q.float(), k.float(), v.float()
    group = q.shape[1] // k.shape[1]
    kf, vf = kf.repeat_interleave(group, 1), vf.repeat_interleave(group, 1)
    nq, nk = q.shape[2], k.shape[2]
    used = lengths.long().clamp(0, nk)[:, None, None, None]
    i = torch.arange(nq, device=q.device)[:, None]
    j = torch.arange(nk, device=q.device)[None, :]
    allowed = j < used
    if causal:
        allowed = allowed & (j <= i + used - nq)
    s = (qf @ kf.transpose(-1, -2)) * scale
    s = s.masked_fill(~allowed, -math.inf)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    return p @ vf, lse


def make_case(batch, heads, kv_heads, nq, nk, head_dim, dtype, lengths, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(batch, heads, nq, head_dim, device="cuda", generator=g).to(dtype)
    k = torch.randn(batch, kv_heads, nk, head_dim, device="cuda", generator=g).to(dtype)
    v = torch.randn(batch, kv_heads, nk, head_dim, device="cuda", generator=g).to(dtype)
    used = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    # Keys past a row's length hold garbage (NaN): the kernel must not let them into the softmax or into P·V.
    past = torch.arange(nk, device="cuda")[None, None, :, None] >= used.long()[:, None, None, None]
    k_poisoned = k.masked_fill(past, float("nan"))
    v_poisoned = v.masked_fill(past, float("nan"))
    return q, k, v, k_poisoned, v_poisoned, used


def assert_close_to_reference(o, lse, q, k, v, used, causal, scale, dtype):
    ref_o, ref_lse = reference(q, k, v, used, causal, scale)
    assert not torch.isnan(o).any(), "NaN in the output (a poisoned key or an unwritten element)"
    tol = 2e-2 if dtype is torch.bfloat16 else 5e-3
    torch.testing.assert_close(o.float(), ref_o, atol=tol, rtol=tol)
    if lse is not None:
        empty = torch.isinf(ref_lse)
        assert torch.equal(torch.isinf(lse) & (lse < 0), empty), "rows that see no key must have lse = -inf"
        torch.testing.assert_close(lse[~empty], ref_lse[~empty], atol=1e-3, rtol=1e-3)


def configs_for(family: str, problem: Problem, arch, decode_shape: Shape):
    out = [space.default_config(problem, arch, family),
           space.default_config_for_shape(decode_shape, arch, family)]
    if family == "wgmma" and problem.head_dim == 128:
        # the plain loop (no overlap), the overlapped loop with o_rescale=before, and the persistent scheduler
        base = out[0]
        for change in ({"overlap": 0, "pingpong": 0, "setmaxnreg": 0, "consumer_wgs": 1},
                       {"pingpong": 0, "o_rescale": "before"},
                       {"scheduler": "persistent", "pingpong": 0}):
            c = base.replace(**change)
            if space.is_valid(c, problem, arch):
                out.append(c)
    return list(dict.fromkeys(out))


FAMILIES, DTYPE_NAMES, CAUSALS, MATRIX_HEAD_DIMS = ("mma_sync", "wgmma"), ("fp16", "bf16"), (False, True), (64, 128)


def matrix_case(head_dim: int, dtype: str, causal: bool) -> tuple[Problem, Shape]:
    """The matrix's problem (built for seqused_k) and the decode shape whose default config it also builds."""
    problem = Problem(head_dim, dtype, causal, seqused_k=True)
    decode = Shape(batch=4, heads=8, kv_heads=2, seqlen_q=1, seqlen_k=4099, head_dim=head_dim, dtype=dtype,
                   causal=causal)
    return problem, decode


def build_items(arch) -> list:
    """Every (config, problem) the matrix builds, for one prebuild in one process (benchmarks/runtime_checklist.sh)."""
    items = []
    for family in FAMILIES:
        for dtype in DTYPE_NAMES:
            for causal in CAUSALS:
                for head_dim in MATRIX_HEAD_DIMS:
                    problem, decode = matrix_case(head_dim, dtype, causal)
                    items += [(c, problem) for c in configs_for(family, problem, arch, decode)]
    return list(dict.fromkeys(items))


@pytest.fixture(scope="module")
def builder(tmp_path_factory):
    import os

    from autotune.build.builder import Builder

    cache = os.environ.get("AUTOTUNE_TEST_CACHE_DIR") or tmp_path_factory.mktemp("kernel-cache")
    return Builder(space.get_arch("sm_90"), cache_dir=cache, jobs=os.cpu_count())


# (batch rows' lengths, seqlen_q, seqlen_k): 0, 1, a non-multiple of every key tile, the whole tensor
CASES = [
    ([0, 1, 77, 300], 1, 300),
    ([300, 0, 129, 1], 4, 300),
    ([4099, 2049, 0, 1], 1, 4099),  # long enough for every split of the decode defaults to have key tiles
    ([5, 130, 1000, 0], 16, 1000),
    ([0, 64, 200, 191], 128, 200),  # more queries than some rows' keys: causal rows that see none
]


@pytest.mark.skipif(not IS_HOPPER, reason="needs an sm_90 GPU (the wgmma family; the builds are for sm_90a)")
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", DTYPE_NAMES)
@pytest.mark.parametrize("causal", CAUSALS)
@pytest.mark.parametrize("head_dim", MATRIX_HEAD_DIMS)
def test_both_families_honour_the_used_length_of_every_row(builder, family, dtype, causal, head_dim):
    from autotune.launch.loader import KernelRunner

    problem, decode = matrix_case(head_dim, dtype, causal)
    configs = configs_for(family, problem, builder.arch, decode)
    builds = builder.build([(c, problem) for c in configs])
    tdtype = DTYPES[dtype]
    scale = 1 / math.sqrt(head_dim)
    for build in builds:
        assert build.ok, f"{build.config.key}: {build.error}"
        runner = KernelRunner(build)
        for seed, (lengths, nq, nk) in enumerate(CASES):
            q, k, v, kp, vp, used = make_case(4, 8, 2, nq, nk, head_dim, tdtype, lengths, seed)
            o = torch.full_like(q, float("nan"))
            lse = torch.full(q.shape[:3], float("nan"), dtype=torch.float32, device="cuda")
            runner.run(q, kp, vp, o, lse, None, "lower_right" if causal else "upper_left", used)
            torch.cuda.synchronize()
            try:
                assert_close_to_reference(o, lse, q, k, v, used, causal, scale, tdtype)
            except AssertionError as e:
                raise AssertionError(f"{build.config.key} lengths {lengths} nq {nq} nk {nk}: {e}") from None


@pytest.mark.skipif(not IS_HOPPER, reason="needs an sm_90 GPU")
def test_out_of_range_lengths_are_clamped_on_the_device(builder):
    from autotune.launch.loader import KernelRunner

    problem = Problem(128, "bf16", False, seqused_k=True)
    for family in ("mma_sync", "wgmma"):
        runner = KernelRunner(builder.build_one(space.default_config(problem, builder.arch, family), problem))
        q, k, v, _, _, used = make_case(2, 4, 4, 3, 200, 128, torch.bfloat16, [-5, 10_000], 7)
        o = torch.full_like(q, float("nan"))
        runner.run(q, k, v, o, None, None, "upper_left", used)
        torch.cuda.synchronize()
        assert_close_to_reference(o, None, q, k, v, torch.tensor([0, 200], device="cuda"), False,
                                  1 / math.sqrt(128), torch.bfloat16)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("causal", [False, "lower_right"])
def test_attention_in_a_cuda_graph_follows_lengths_advanced_on_the_device(causal):
    import autotune

    batch, heads, kv_heads, nq, nk = 3, 32, 8, 1 if causal is False else 4, 4096
    q, k, v, _, _, used = make_case(batch, heads, kv_heads, nq, nk, 128, torch.bfloat16, [1, 700, 4000], 3)
    autotune.attention(q, k, v, causal=causal, seqused_k=used)  # build, load and prepare outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = autotune.attention(q, k, v, causal=causal, seqused_k=used)
    for step in range(4):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_close_to_reference(out, None, q, k, v, used, causal is not False, 1 / math.sqrt(128), torch.bfloat16)
        used.add_(33)  # advanced on the device: the replay reads the new lengths
        if step == 1:
            used[0] = 0  # a row that uses nothing: zeros


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_attention_checks_the_tensor_on_the_gpu():
    import autotune

    q = torch.randn(2, 4, 1, 128, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match="seqused_k: expected a CUDA tensor"):
        autotune.attention(q, q, q, seqused_k=torch.tensor([1, 1], dtype=torch.int32))
    with pytest.raises(ValueError, match="seqused_k: expected dtype torch.int32"):
        autotune.attention(q, q, q, seqused_k=torch.tensor([1, 1], device="cuda"))


# ---- transformers: a StaticCache decode on the kernel ---------------------------------------------------------------

def tiny_llama(attn):
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(vocab_size=256, hidden_size=1024, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=2, head_dim=128, max_position_embeddings=512)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=torch.bfloat16).cuda().eval()
    return cfg, model


class LogitsStep:
    """One decode step on a StaticCache that keeps its logits in a static buffer (so a CUDA graph can replay it)."""

    def __init__(self, model, cfg, prompt, max_cache_len):
        from transformers import StaticCache

        self.model = model
        self.cache = StaticCache(config=cfg, max_cache_len=max_cache_len)
        logits = model(prompt, past_key_values=self.cache, use_cache=True).logits[:, -1]
        # a fixed token, not the prediction: both models then see the same inputs whatever they predict
        self.token = torch.full((prompt.shape[0], 1), 7, dtype=torch.long, device=prompt.device)
        self.logits = torch.empty_like(logits)

    def __call__(self):
        logits = self.model(self.token, past_key_values=self.cache, use_cache=True).logits[:, -1]
        self.logits.copy_(logits)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("graphed", [False, True])
def test_a_static_cache_decode_runs_on_the_kernel_and_matches_sdpa(graphed):
    pytest.importorskip("transformers")
    import autotune.integrations.transformers  # noqa: F401

    prompt = torch.randint(3, 256, (3, 37), device="cuda", generator=torch.Generator(device="cuda").manual_seed(0))
    from autotune.runtime import fallbacks

    results = {}
    for attn in ("sdpa", "autotune"):
        cfg, model = tiny_llama(attn)
        fallbacks.reset()
        with torch.no_grad():
            step = LogitsStep(model, cfg, prompt, 128)
            rows = []
            if graphed:
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(2):
                        step()
                        rows.append(step.logits.clone())
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    step()
                for _ in range(5):
                    step.logits.fill_(float("nan"))
                    graph.replay()
                    rows.append(step.logits.clone())
            else:
                for _ in range(7):
                    step()
                    rows.append(step.logits.clone())
            torch.cuda.synchronize()
        results[attn] = (torch.stack(rows), fallbacks.counts())
    ours, theirs = results["autotune"][0], results["sdpa"][0]
    assert results["autotune"][1] == {}, f"fallbacks: {results['autotune'][1]}"
    assert not torch.isnan(ours).any()
    torch.testing.assert_close(ours.float(), theirs.float(), atol=5e-2, rtol=5e-2)
