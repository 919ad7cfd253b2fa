#!/usr/bin/env python3
"""Where a model's calls through autotune spend host time: cProfile over a ViT forward (timm, under
`autotune.patch_sdpa`) and a few Llama-shaped decode steps (transformers, attn_implementation="autotune"), after a
warm-up that builds and loads every kernel they use.

    python benchmarks/models_host_profile.py [--vit-batch 2] [--decode-batch 2] [--steps 8] [--top 25]

benchmarks/models_e2e.py measures the end-to-end effect; this says which Python functions the difference is made of
(sorted by own time, then the cumulative view of the autotune package's entry points).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def report(prof: cProfile.Profile, title: str, top: int) -> str:
    out = io.StringIO()
    out.write(f"== {title}\n")
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats("autotune", top)
    return out.getvalue()


def vit(batch: int, reps: int, top: int) -> str:
    import timm
    import torch

    import autotune

    model = timm.create_model("vit_large_patch14_clip_336", pretrained=False).cuda().to(torch.bfloat16).eval()
    images = torch.randn(batch, 3, 336, 336, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad(), autotune.patch_sdpa():
        for _ in range(3):
            model(images)
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(reps):
            model(images)
        torch.cuda.synchronize()
        prof.disable()
    return report(prof, f"ViT-L/14 336 px B{batch}, {reps} forwards (24 attention calls each)", top)


def decode(batch: int, steps: int, top: int) -> str:
    import torch
    from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig

    import autotune.integrations.transformers  # noqa: F401

    cfg = LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=1,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="autotune", dtype=torch.bfloat16).cuda().eval()
    prompt = torch.randint(0, cfg.vocab_size, (batch, 256), device="cuda")

    def run(n):
        cache = DynamicCache(config=cfg)
        token = model(prompt, past_key_values=cache, use_cache=True).logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(n):
            token = model(token, past_key_values=cache, use_cache=True).logits[:, -1].argmax(-1, keepdim=True)

    with torch.no_grad():
        run(steps)  # warm-up: the same sequence of shapes
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        run(steps)
        torch.cuda.synchronize()
        prof.disable()
    return report(prof, f"Llama-shaped 1 layer, B{batch}: prefill 256 + {steps} decode steps", top)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vit-batch", type=int, default=2)
    ap.add_argument("--vit-reps", type=int, default=10)
    ap.add_argument("--decode-batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    print(vit(args.vit_batch, args.vit_reps, args.top))
    print(decode(args.decode_batch, args.steps, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
