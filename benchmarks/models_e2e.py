#!/usr/bin/env python3
"""Whole models through their stock attention and through autotune, on one GPU, random weights, no download.

    python benchmarks/models_e2e.py [--layers 4] [--prompt 2048] [--decode 128] [--decode-batch 32] [--vit-batch 64]
    python benchmarks/models_e2e.py --capture studies/campaigns/models-e2e.toml   # record the shapes, then:
    autotune campaign studies/campaigns/models-e2e.toml                            # tune them, and run again

Models, built from their configs (transformers' from_config, timm's create_model(pretrained=False)):

  * llama: a Llama-3-8B-shaped decoder (hidden 4096, 32 query / 8 K/V heads of 128, MLP 14336, vocab 128256,
    rope theta 500000) with --layers layers, bf16. Stock: attn_implementation="sdpa"; autotune: the same model after
    set_attn_implementation("autotune") (autotune.integrations.transformers). Prefill: one forward of --prompt
    tokens (batch 1), latency in ms. Decode: --decode steps of one token for --decode-batch sequences after a
    prompt of --decode-prompt tokens, tokens/s, three ways:
      - eager: transformers' loop as it runs by default (DynamicCache), each step timed with CUDA events; the step
        is host-bound (Python of the model and of each attention call), so this row measures the host;
      - CUDA graph, StaticCache: as servers run it. One decode step (a static input-token buffer; the cache's own
        position tensor, which the step advances on the device) captured once in a torch.cuda.CUDAGraph after
        warm-up steps (the first autotune call of a shape builds and looks up its kernel there), replayed --decode
        times, tokens/s from CUDA events around the replays. transformers passes a static cache's decode an
        explicit mask (the valid prefix of max_cache_len slots), which the autotune path runs on the kernel with
        each row's used length read on the device (autotune.attention's seqused_k; AUTOTUNE_ROUTE_PREFIX_MASKS=0
        makes it fall back, as before seqused_k); its fallback column counts
        any call that still falls back;
      - CUDA graph, fixed context: one decode step at the prompt's length (DynamicCache, no mask, as eager decode
        runs it) captured and replayed --decode times; every replay recomputes that same step, the work of a real
        step at that length. transformers builds a dense mask whenever a CUDA stream is capturing, even where eager
        decode passes none (masking_utils: is_tracing), so the capture is made with that check answering as it does
        eagerly (masks_as_eager), for both paths alike. This is the row that measures the kernel inside a model.
  * vit: timm's vit_large_patch14_clip_336 (ViT-L/14 at 336 px: 577 tokens, 16 heads of 64), bf16, batch
    --vit-batch; images/s. Stock: timm's F.scaled_dot_product_attention; autotune: inside autotune.patch_sdpa().

Outputs compared on the same inputs: the first-token logits (llama prefill's last position; the ViT's class
logits), max |autotune − stock|, next to the stock path's own backend-to-backend difference (stock vs the same
model with SDPA forced to its math backend) as the yardstick. Times: CUDA events; the two paths are measured in
turns, --rounds rounds with the order reversed every other round (interleaved), so that a drift over the run lands
on both alike; a row's figure is the median over its rounds (prefill and ViT: of --reps calls per round, after
warm-up: the first autotune call of a shape compiles its kernel), and the table gives the range of one round's
ratio beside it: a row whose range straddles 1.000 is a tie. Fallbacks are printed: a model
whose calls fall back is running stock attention, not ours; the last column counts them per row (autotune path).

--capture FILE: run the autotune paths inside autotune.capture(FILE) (the campaign of what they ran).
--benchmark-mode: autotune.set_benchmark_mode(True) first (untuned shapes time a few built configs).
--markdown: print the table as markdown (docs/benchmarks.md).
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))


def cuda_ms(fn, reps: int, warmup: int) -> float:
    """Median wall time of fn() on the GPU, in ms (CUDA events around each call)."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end))
    return statistics.median(times)


def max_diff(a, b) -> float:
    return (a.float() - b.float()).abs().max().item()


@contextlib.contextmanager
def math_sdpa():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.MATH]):
        yield


GRAPH_WARMUP = 3  # eager decode steps on a side stream before a capture (torch's recipe; the first builds kernels)


def cache_kwarg(model) -> str:
    """The name under which this transformers' forward takes the cache: past_key_values (5.17) or cache (5.24)."""
    import inspect

    params = inspect.signature(model.forward).parameters
    return "past_key_values" if "past_key_values" in params else "cache"


def fallback_total() -> int:
    import autotune

    return sum(autotune.fallback_counts().values())


@contextlib.contextmanager
def masks_as_eager():
    """transformers' mask builders skip the mask (SDPA's is_causal / no mask) only when nothing is tracing, and count a
    capturing CUDA stream as tracing: inside the block they see the stream as not capturing, so a captured step
    passes the masks the eager step passes. Any data-dependent check this lets through would synchronize, which
    fails the capture loudly rather than changing what runs."""
    from transformers.utils import import_utils

    saved = import_utils.is_cuda_stream_capturing
    import_utils.is_cuda_stream_capturing = lambda: False
    try:
        yield
    finally:
        import_utils.is_cuda_stream_capturing = saved


def cuda_graph(step):
    """step() captured in a CUDA graph after GRAPH_WARMUP eager calls on a side stream; returns the graph's replay.
    The capture enqueues nothing; each replay runs the captured step once."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(GRAPH_WARMUP):
            step()
    torch.cuda.current_stream().wait_stream(side)
    step.before_capture()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    step.graph = graph  # the graph and the tensors it reads live as long as the step
    return graph.replay


class DecodeStep:
    """One greedy decode step of `model` on a static token buffer: reads `token`, writes the next token into it.

    static=True: a StaticCache of max_cache_len slots, filled by the prompt; each call (replay) writes one more slot
    and advances the cache's position on the device. static=False: a DynamicCache filled by the prompt, which each
    eager call grows (torch.cat); before_capture() keeps the cache's tensors of that moment alive, since the
    captured step reads them on every replay."""

    def __init__(self, model, cfg, prompt, static: bool, max_cache_len: int | None = None):
        import torch
        from transformers import DynamicCache, StaticCache

        self.model, self.kwarg = model, cache_kwarg(model)
        self.cache = (StaticCache(config=cfg, max_cache_len=max_cache_len) if static else DynamicCache(config=cfg))
        logits = model(prompt, **{self.kwarg: self.cache}, use_cache=True, logits_to_keep=1).logits[:, -1]
        self.token = torch.empty(prompt.shape[0], 1, dtype=torch.long, device=prompt.device)
        self.token.copy_(logits.argmax(-1, keepdim=True))
        self.held = None

    def before_capture(self) -> None:
        self.held = [t for layer in self.cache.layers for t in (layer.keys, layer.values)]

    def __call__(self) -> None:
        logits = self.model(self.token, **{self.kwarg: self.cache}, use_cache=True).logits[:, -1]
        self.token.copy_(logits.argmax(-1, keepdim=True))


def replay_tokens_per_s(replay, batch: int, replays: int) -> float:
    """tokens/s of `replays` back-to-back replays, CUDA events around them all."""
    import torch

    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(replays):
        replay()
    end.record()
    end.synchronize()
    return batch * replays / (begin.elapsed_time(end) / 1e3)


def captured_decode(model, cfg, prompt, replays: int, static: bool, repeats: int, graph=cuda_graph):
    """One DecodeStep captured (see the module docstring), with cache room for `repeats` runs of `replays`
    replays; returns the replay."""
    capacity = prompt.shape[1] + GRAPH_WARMUP + 1 + repeats * replays
    step = DecodeStep(model, cfg, prompt, static, capacity)
    with contextlib.nullcontext() if static else masks_as_eager():
        replay = graph(step)

    def replay_step():
        replay()
    replay_step.step = step  # every replay reads the step's cache and token buffer: they live as long as this
    return replay_step


def interleaved(measure: dict, rounds: int) -> dict:
    """{path: [one sample per round]}: each round measures every path once, the order reversed every other round
    (A B, B A, A B, ...), so a drift over the run (clocks, heat, the caching allocator) lands on both paths alike
    instead of on whichever path runs second. measure: {path: a callable returning one sample}."""
    names = list(measure)
    samples = {name: [] for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            samples[name].append(measure[name]())
    return samples


def paired(samples: dict, unit: str) -> tuple[float, float, tuple[float, float]]:
    """(stock, autotune, (lowest, highest) autotune/stock ratio of one round) from interleaved()'s samples; > 1 is
    autotune faster whatever the unit (ms: lower is faster)."""
    ratios = [(s / o if unit == "ms" else o / s) for s, o in zip(samples["stock"], samples["autotune"])]
    return statistics.median(samples["stock"]), statistics.median(samples["autotune"]), (min(ratios), max(ratios))


def llama(args):
    import torch
    from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig

    import autotune.integrations.transformers  # noqa: F401  (registers attn_implementation="autotune")

    cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=args.layers,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=131072,
                      rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.bfloat16).cuda().eval()
    g = torch.Generator(device="cuda").manual_seed(0)
    prompt = torch.randint(0, cfg.vocab_size, (1, args.prompt), device="cuda", generator=g)
    batch_prompt = torch.randint(0, cfg.vocab_size, (args.decode_batch, args.decode_prompt), device="cuda", generator=g)

    def prefill():
        return model(prompt, use_cache=False, logits_to_keep=1).logits[:, -1]

    kwarg = cache_kwarg(model)

    def decode_tokens_per_s():
        cache = DynamicCache(config=cfg)
        logits = model(batch_prompt, **{kwarg: cache}, use_cache=True, logits_to_keep=1).logits[:, -1]
        token = logits.argmax(-1, keepdim=True)
        steps = []
        for _ in range(args.decode):
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            token = model(token, **{kwarg: cache}, use_cache=True).logits[:, -1].argmax(-1, keepdim=True)
            end.record()
            steps.append((begin, end))
        torch.cuda.synchronize()
        seconds = sum(b.elapsed_time(e) for b, e in steps) / 1e3
        return args.decode_batch * args.decode / seconds

    graphed = [] if args.skip_graphs else [("CUDA graph, StaticCache", True), ("CUDA graph, fixed context", False)]

    def on(implementation, measure):  # measure() on one attention path
        def sample():
            model.set_attn_implementation(implementation)
            return measure()
        return sample

    stock, ours = functools.partial(on, "sdpa"), functools.partial(on, "autotune")
    with torch.no_grad():
        stock_logits = prefill()
        with math_sdpa():
            yardstick = max_diff(prefill(), stock_logits)
        fell_back = []
        with args.capture_context():  # only the autotune path's calls reach autotune.attention (and capture)
            before = fallback_total()
            model.set_attn_implementation("autotune")
            ours_logits = prefill()
            prefill_ms = interleaved({"stock": stock(lambda: cuda_ms(prefill, args.reps, args.warmup)),
                                      "autotune": ours(lambda: cuda_ms(prefill, args.reps, args.warmup))},
                                     args.rounds)
            fell_back.append(fallback_total() - before)
            before = fallback_total()
            stock(decode_tokens_per_s)()  # warm-up (the autotune path's builds the decode buckets' kernels)
            ours(decode_tokens_per_s)()
            eager_tps = interleaved({"stock": stock(decode_tokens_per_s), "autotune": ours(decode_tokens_per_s)},
                                    args.rounds)
            fell_back.append(fallback_total() - before)
            graphed_tps = []
            for _, static in graphed:
                # both paths captured first (the graph holds the kernels each path launched), then replayed in turns
                replays = {}
                for path, implementation in (("stock", "sdpa"), ("autotune", "autotune")):
                    model.set_attn_implementation(implementation)
                    before = fallback_total()
                    replays[path] = captured_decode(model, cfg, batch_prompt, args.decode, static, args.rounds)
                    if path == "autotune":
                        fell_back.append(fallback_total() - before)  # calls made eagerly (warm-up) and captured
                rate = lambda replay: lambda: replay_tokens_per_s(replay, args.decode_batch, args.decode)  # noqa: E731
                graphed_tps.append(interleaved({p: rate(r) for p, r in replays.items()}, args.rounds))
                del replays  # the two captured graphs and their caches
        model.set_attn_implementation("sdpa")
    diff = max_diff(ours_logits, stock_logits)
    name = f"Llama-3-8B-shaped, {args.layers} layers"
    decode = f"{name}: decode B{args.decode_batch} from N{args.decode_prompt}, {args.decode} steps"
    rows = [(f"{name}: prefill B1 N{args.prompt}", "ms", *paired(prefill_ms, "ms"), diff, yardstick, fell_back[0]),
            (f"{decode}, eager (DynamicCache)", "tokens/s", *paired(eager_tps, "tokens/s"), None, None,
             fell_back[1])]
    for (how, _), samples, n in zip(graphed, graphed_tps, fell_back[2:]):
        rows.append((f"{decode}, {how}", "tokens/s", *paired(samples, "tokens/s"), None, None, n))
    return rows


def vit(args):
    import timm
    import torch

    import autotune

    torch.manual_seed(0)
    model = timm.create_model("vit_large_patch14_clip_336", pretrained=False).cuda().to(torch.bfloat16).eval()
    images = torch.randn(args.vit_batch, 3, 336, 336, device="cuda", dtype=torch.bfloat16)
    run = lambda: model(images)  # noqa: E731
    with torch.no_grad():
        stock_logits = run()
        with math_sdpa():
            yardstick = max_diff(run(), stock_logits)
        before = fallback_total()
        with args.capture_context():
            with autotune.patch_sdpa():
                ours_logits = run()

            def ours():
                with autotune.patch_sdpa():  # routes timm's F.scaled_dot_product_attention while inside
                    return cuda_ms(run, args.reps, args.warmup)
            ms = interleaved({"stock": lambda: cuda_ms(run, args.reps, args.warmup), "autotune": ours}, args.rounds)
    images_per_s = {path: [args.vit_batch / t * 1e3 for t in times] for path, times in ms.items()}
    return [(f"ViT-L/14 336 px (timm), B{args.vit_batch}", "images/s", *paired(images_per_s, "images/s"),
             max_diff(ours_logits, stock_logits), yardstick, fallback_total() - before)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=["llama", "vit"], choices=["llama", "vit"])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--prompt", type=int, default=2048)
    p.add_argument("--decode", type=int, default=64)
    p.add_argument("--decode-batch", type=int, default=32)
    p.add_argument("--decode-prompt", type=int, default=4096)
    p.add_argument("--vit-batch", type=int, default=64)
    p.add_argument("--reps", type=int, default=20, help="timed calls per round and path (prefill, ViT)")
    p.add_argument("--rounds", type=int, default=5,
                   help="rounds of stock and autotune measured in turns, the order reversed every other round (5)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--capture", metavar="FILE", default=None)
    p.add_argument("--benchmark-mode", action="store_true")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--skip-graphs", action="store_true", help="leave out the two CUDA-graph decode rows")
    args = p.parse_args()

    import torch

    import autotune

    if not torch.cuda.is_available():
        print("models_e2e: needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.benchmark_mode:
        autotune.set_benchmark_mode(True)
    args.capture_context = (lambda: autotune.capture(args.capture)) if args.capture else contextlib.nullcontext
    rows = []
    for name in args.models:
        rows += {"llama": llama, "vit": vit}[name](args)

    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}"
          + (", capture on" if args.capture else "") + (", benchmark mode" if args.benchmark_mode else ""))
    head = ("model", "unit", "stock", "autotune", "autotune / stock", "one round's autotune / stock",
            "max |Δ logits|", "stock's own (math SDPA)", "autotune calls that fell back")
    lines = []
    for label, unit, stock, ours, (low, high), diff, yard, fell_back in rows:
        ratio = stock / ours if unit == "ms" else ours / stock  # > 1: autotune is faster
        lines.append((label, unit, f"{stock:.1f}", f"{ours:.1f}", f"{ratio:.3f}", f"{low:.3f}-{high:.3f}",
                      "" if diff is None else f"{diff:.3g}", "" if yard is None else f"{yard:.3g}", str(fell_back)))
    if args.markdown:
        print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        for line in lines:
            print("| " + " | ".join(line) + " |")
    else:
        widths = [max(len(str(r[i])) for r in [head, *lines]) for i in range(len(head))]
        for r in [head, *lines]:
            print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))
    counts = autotune.fallback_counts()
    print("fallbacks: " + ("none" if not counts else "; ".join(f"{where}: {why} ×{n}" for (where, why), n in counts.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
