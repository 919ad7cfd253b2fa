"""benchmarks/models_e2e.py's decode steps on CPU, with the kernel stood in (model_doubles) and the CUDA graph
replaced by eager replays: what a graphed decode row runs on which path, and what transformers hands the backend
in each (its static cache's explicit mask: a fallback on every decode call; a capturing stream: a mask even where
eager decode passes none, unless masks_as_eager)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import autotune.integrations.transformers  # noqa: E402,F401
from model_doubles import fallback_reasons, stand_in  # noqa: E402,F401
from transformers import AutoModelForCausalLM, LlamaConfig  # noqa: E402

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "models_e2e.py"
spec = importlib.util.spec_from_file_location("models_e2e", SCRIPT)
e2e = importlib.util.module_from_spec(spec)
sys.modules.setdefault("models_e2e", e2e)
spec.loader.exec_module(e2e)

PROMPT = 6


def tiny(attn="autotune"):
    cfg = LlamaConfig(vocab_size=128, hidden_size=256, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=128)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=torch.bfloat16).eval(), cfg


def prompt(batch=2):
    return torch.randint(3, 128, (batch, PROMPT), generator=torch.Generator().manual_seed(1))


def eager_graph(step):
    """cuda_graph's order of events without a GPU: the warm-up calls, before_capture, then replay = the step."""
    for _ in range(e2e.GRAPH_WARMUP):
        step()
    step.before_capture()
    return step


def replays(replay, batch, n):
    for _ in range(n):
        replay()
    return float(n)


def static_decode_replayed_twice():
    """A tiny model's StaticCache decode step (8 free slots), captured by the stand-in graph and replayed twice."""
    model, cfg = tiny()
    with torch.no_grad():
        step = e2e.DecodeStep(model, cfg, prompt(), static=True, max_cache_len=PROMPT + 8)
        replay = eager_graph(step)
        for _ in range(2):
            replay()
    return step


def test_a_static_cache_decode_falls_back_on_every_call_with_prefix_mask_routing_switched_off(stand_in,
                                                                                               monkeypatch):
    monkeypatch.setenv("AUTOTUNE_ROUTE_PREFIX_MASKS", "0")
    static_decode_replayed_twice()
    # the prompt runs on the kernel (the crop of the empty slots); no decode call does with the routing off
    assert [c["q"][2] for c in stand_in.calls] == [PROMPT, PROMPT]
    reasons = fallback_reasons()
    assert list(reasons) == ["an explicit attention mask (padding, a window or another pattern)"]
    assert sum(reasons.values()) == 2 * (e2e.GRAPH_WARMUP + 2)  # 2 layers × every decode step


def test_a_static_cache_decode_passes_a_prefix_mask_that_runs_on_the_kernel_through_seqused_k(stand_in,
                                                                                               monkeypatch):
    monkeypatch.delenv("AUTOTUNE_ROUTE_PREFIX_MASKS", raising=False)  # the default: routed
    step = static_decode_replayed_twice()
    layer = step.cache.layers[0]
    assert int(layer.cumulative_length) == PROMPT + e2e.GRAPH_WARMUP + 2  # the position advances in the step
    # the prompt runs on the kernel (the crop of the empty slots), and so does every decode step: the whole cache
    # with each row's used length read on the device
    assert [c["q"][2] for c in stand_in.calls if "seqused_k" not in c] == [PROMPT, PROMPT]
    decode = [c for c in stand_in.calls if "seqused_k" in c]
    assert len(decode) == 2 * (e2e.GRAPH_WARMUP + 2)  # 2 layers × every decode step
    assert all(c["k"][2] == PROMPT + 8 and c["causal"] is False for c in decode)
    assert [c["seqused_k"] for c in decode[::2]] == [[PROMPT + 1 + s] * 2 for s in range(e2e.GRAPH_WARMUP + 2)]
    assert fallback_reasons() == {}


def test_a_fixed_context_decode_runs_on_the_kernel_and_holds_what_the_capture_reads(stand_in):
    model, cfg = tiny()
    with torch.no_grad():
        replay = e2e.captured_decode(model, cfg, prompt(), 3, static=False, repeats=1, graph=eager_graph)
        rate = replays(replay, 2, 3)
    assert rate == 3.0 and fallback_reasons() == {}
    decode = [c for c in stand_in.calls if c["q"][2] == 1]
    assert len(decode) == 2 * (e2e.GRAPH_WARMUP + 3) and all(c["k"][1] == 2 and c["causal"] is False for c in decode)


def test_a_capturing_stream_makes_transformers_pass_a_mask_unless_masks_as_eager(stand_in, monkeypatch):
    model, cfg = tiny()
    with torch.no_grad():
        step = e2e.DecodeStep(model, cfg, prompt(), static=False)
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)  # as inside torch.cuda.graph
        step()
        masked = sum(fallback_reasons().values())
        # 5.17 (the GPU host's) counts a capturing stream as tracing and never skips the mask then: both layers fall
        # back; later versions (5.24) skip it as eagerly where there is no padding mask
        assert masked == 2 if transformers.__version__.startswith("5.17") else masked in (0, 2)
        with e2e.masks_as_eager():
            step()
        assert sum(fallback_reasons().values()) == masked  # no mask, as eagerly: both layers ran the kernel
    decode = [c["k"][2] for c in stand_in.calls if c["q"][2] == 1]
    assert decode[-2:] == [PROMPT + 2] * 2 and len(decode) == 4 - masked


def test_the_cache_argument_is_found_by_name():
    model, _ = tiny("sdpa")
    assert e2e.cache_kwarg(model) in ("past_key_values", "cache")


def test_the_two_paths_are_measured_in_turns_with_the_order_reversed_every_other_round():
    order = []
    clock = iter(range(100))

    def sample(path):
        def measure():
            order.append(path)
            return next(clock)  # a drift: every sample reads later than the one before
        return measure

    samples = e2e.interleaved({"stock": sample("stock"), "autotune": sample("autotune")}, rounds=4)
    assert order == ["stock", "autotune", "autotune", "stock"] * 2
    assert samples == {"stock": [0, 3, 4, 7], "autotune": [1, 2, 5, 6]}
    # with the drift the two medians come out alike, where measuring one path after the other would not
    stock, ours, _ = e2e.paired(samples, "ms")
    assert stock == ours == 3.5


def test_paired_ratios_read_faster_as_above_one_for_times_and_for_rates():
    times = {"stock": [10.0, 10.0, 12.0], "autotune": [8.0, 10.0, 12.5]}
    assert e2e.paired(times, "ms") == (10.0, 10.0, (12.0 / 12.5, 10.0 / 8.0))
    rates = {"stock": [100.0, 100.0], "autotune": [99.0, 102.0]}
    assert e2e.paired(rates, "tokens/s") == (100.0, 100.5, (0.99, 1.02))


def test_a_captured_decode_keeps_its_step_alive_for_the_replays(stand_in):
    """A CUDA graph's replay holds the graph, not the tensors it reads: captured_decode's replay must hold the step
    (its cache and token buffer), else the replays read freed memory (an illegal address on the GPU)."""
    import gc
    import weakref

    steps = []

    def graph_holding_nothing(step):  # like torch.cuda.CUDAGraph().replay: no reference to the step
        eager_graph(step)
        steps.append(weakref.ref(step))
        return lambda: None

    model, cfg = tiny()
    with torch.no_grad():
        replay = e2e.captured_decode(model, cfg, prompt(), 2, static=True, repeats=1, graph=graph_holding_nothing)
    gc.collect()
    assert steps[0]() is not None
    del replay
    gc.collect()
    assert steps[0]() is None
