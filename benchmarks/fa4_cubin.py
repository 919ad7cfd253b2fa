#!/usr/bin/env python3
"""FlashAttention-4's SM90 forward kernel compiled on a machine without a GPU, for `autotune sass --cubin`.

FlashAttention-4 (CuTe DSL) compiles at its first call; its interface takes the target arch from the environment
and the DSL keeps the PTX and cubin it builds when asked to. The call runs on fake CUDA tensors (PyTorch's
FakeTensorMode), so nothing touches a device: the cubin is the one the GPU host would run for that shape's head
dim, dtype and causal flag.

Setup (once; Python 3.11 with the CPU torch the tests use, and the FA4 packages ../shared/fa4-wheels.sh names):
    python3 -m venv /tmp/fa4env && . /tmp/fa4env/bin/activate
    pip install torch==2.13.0 triton cuda-bindings flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 \\
        nvidia-cutlass-dsl-libs-base==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 \\
        apache-tvm-ffi quack-kernels torch-c-dlpack-ext --pre
Then:
    python benchmarks/fa4_cubin.py --head-dim 128 --dtype fp16 --out /tmp/fa4-d128      # prints the cubin's path
    autotune sass --cubin /tmp/fa4-d128/<that cubin> --dump                              # in the project's venv
docs/benchmarks.md ("FlashAttention-4's loop, read in its SASS") is what this found on 2026-12-05.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--head-dim", type=int, required=True, choices=(64, 96, 128, 192, 256))
    ap.add_argument("--dtype", default="fp16", choices=("fp16", "bf16"))
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--arch", default="sm_90a", help="compile target (default sm_90a: FlashAttention-4's SM90 path)")
    ap.add_argument("--out", type=Path, required=True, help="directory for the DSL's PTX and cubin")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    # read when flash_attn.cute is imported and when it compiles: set before the import
    os.environ["FLASH_ATTENTION_ARCH"] = args.arch
    os.environ["CUTE_DSL_ARCH"] = args.arch
    os.environ.setdefault("FLASH_ATTENTION_NUM_SMS", "132")  # the H200's SMs (the persistent paths' grid)
    os.environ.update(CUTE_DSL_KEEP_PTX="1", CUTE_DSL_KEEP_CUBIN="1", CUTE_DSL_LINEINFO="1",
                      CUTE_DSL_DUMP_DIR=str(args.out), CUTE_DSL_CACHE_ENABLED="0")
    try:
        import torch
        from torch._subclasses.fake_tensor import FakeTensorMode
        from flash_attn.cute import flash_attn_func
    except ImportError as e:
        print(f"fa4_cubin: {e}; set up the environment as this script's docstring says", file=sys.stderr)
        return 2
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    with FakeTensorMode():  # (batch, seqlen, heads, head_dim): any long shape compiles the same kernel
        q, k, v = (torch.empty(2, 8192, 16, args.head_dim, dtype=dtype, device="cuda") for _ in range(3))
        flash_attn_func(q, k, v, causal=args.causal)
    cubins = sorted(args.out.rglob("*.cubin"), key=lambda p: p.stat().st_mtime)
    if not cubins:
        print(f"fa4_cubin: the DSL wrote no cubin under {args.out}", file=sys.stderr)
        return 1
    print(cubins[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
