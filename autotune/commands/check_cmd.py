"""`autotune check`: build one config and run it on random inputs against the fp32 reference.

Prints our max error beside torch SDPA's own error on the same inputs; exit code 1 when the kernel is wrong.
Also home of the shape arguments that `autotune bench` shares.
"""
from __future__ import annotations

import argparse
import importlib
import sys

import space

from . import causal_flag

USAGE_ERROR = 2
NO_GPU = ("no CUDA GPU visible: `autotune {command}` runs kernels. Without a GPU you can still compile-check "
          "configs: `autotune space --head-dim 128 --arch sm_90 --compile` (or `autotune build --config KEY`).")


def add_shape_arguments(p: argparse.ArgumentParser, seqlen: int, batch: int, heads: int) -> None:
    p.add_argument("--seqlen", type=int, default=seqlen, help=f"query (and key) length (default {seqlen})")
    p.add_argument("--seqlen-k", type=int, default=None, help="key length when it differs from --seqlen")
    p.add_argument("--batch", type=int, default=batch, help=f"batch size (default {batch})")
    p.add_argument("--heads", type=int, default=heads, help=f"query heads (default {heads})")
    p.add_argument("--kv-heads", type=int, default=None, help="key/value heads, dividing --heads (default: --heads)")
    p.add_argument("--head-dim", type=int, default=128, choices=space.HEAD_DIMS, help="head dimension (default 128)")
    p.add_argument("--dtype", default="fp16", choices=space.DTYPES, help="element type (default fp16)")
    causal_flag.add(p)
    p.add_argument("--layout", default="bhnd", choices=("bhnd", "bnhd"),
                   help="memory layout of q/k/v/o: (B,H,N,D) or (B,N,H,D) seen through a transpose")
    p.add_argument("--arch", default=None, help="must match the visible GPU (default: the visible GPU's arch)")
    p.add_argument("--cache-dir", default=None,
                   help="kernel cache (default: $AUTOTUNE_CACHE_DIR or ~/.cache/autotune/kernels)")


def shape_from_args(args: argparse.Namespace, command: str) -> space.Shape | None:
    causal, align = causal_flag.mask(args.causal)
    try:
        return space.Shape(batch=args.batch, heads=args.heads, seqlen_q=args.seqlen, seqlen_k=args.seqlen_k,
                           head_dim=args.head_dim, dtype=args.dtype, causal=causal, kv_heads=args.kv_heads,
                           causal_align=align)
    except ValueError as e:
        print(f"autotune {command}: {e}", file=sys.stderr)
        return None


def gpu_arch(args: argparse.Namespace, command: str) -> space.Arch | None:
    """The visible GPU's arch (kernels run here, so --arch can only confirm it); None after printing why not."""
    import torch

    from autotune.launch.gpu_arch import NoGpuError, detect_arch

    if not torch.cuda.is_available():
        print(f"autotune {command}: " + NO_GPU.format(command=command), file=sys.stderr)
        return None
    try:
        arch = detect_arch(torch.cuda.current_device())
    except NoGpuError as e:
        print(f"autotune {command}: {e}", file=sys.stderr)
        return None
    if args.arch:
        try:
            wanted = space.get_arch(args.arch)
        except ValueError as e:
            print(f"autotune {command}: --arch: {e}", file=sys.stderr)
            return None
        if wanted != arch:
            print(f"autotune {command}: --arch {wanted.name} does not match the visible GPU ({arch.name}); a cubin "
                  "for another arch cannot run here", file=sys.stderr)
            return None
    return arch


def config_key_error(key: str | None, command: str) -> str | None:
    """Why `--config KEY` cannot be used (a blank key, an unknown family, axis or value), or None. Needs no GPU
    and no arch, so commands say it before anything else. A blank key is a mistake (an unset shell variable),
    never a way to ask for the default: that is leaving --config out."""
    if key is None:
        return None
    if not key.strip():
        return (f"autotune {command}: --config {key!r}: expected a config key as printed by `autotune space` "
                "('FAMILY:axis=value,...'); leave --config out for the heuristic default")
    try:
        importlib.import_module(f"space.{key.partition(':')[0]}")  # registers the family (e.g. space.wgmma)
    except (ModuleNotFoundError, ValueError):
        pass  # from_key's error lists the known families
    try:
        space.Config.from_key(key)
    except (ValueError, KeyError) as e:
        reason = e.args[0] if e.args else str(e)
        return (f"autotune {command}: --config {key!r}: {reason}\n"
                "  expected a key as printed by `autotune space`: 'FAMILY:axis=value,...' with every axis")
    return None


def parse_config(key: str | None, problem: space.Problem, arch: space.Arch, command: str,
                 family: str | None = None) -> space.Config | None:
    """--config's key, or the heuristic default (of `family`) when None; None after printing why the key (or
    the family) is unusable."""
    if key is None:
        try:
            return space.default_config(problem, arch, family)
        except ValueError as e:
            print(f"autotune {command}: --family: {e}", file=sys.stderr)
            return None
    error = config_key_error(key, command)
    if error:
        print(error, file=sys.stderr)
        return None
    return space.Config.from_key(key)


def build_configs(configs: list[space.Config], problem: space.Problem, arch: space.Arch, cache_dir, command: str):
    """BuildResults in order, or None after printing why the builder could not run."""
    from autotune.build.builder import Builder, BuildError
    from autotune.build.nvcc import NvccNotFoundError

    try:
        return Builder(arch, cache_dir=cache_dir).build([(c, problem) for c in configs])
    except (NvccNotFoundError, BuildError) as e:
        print(f"autotune {command}: {e}", file=sys.stderr)
        return None


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("check", help="run one config against the fp32 reference (needs a GPU)",
                              description=__doc__)
    p.add_argument("--config", default=None, metavar="KEY",
                   help="config key as printed by `autotune space` (default: the heuristic default)")
    add_shape_arguments(p, seqlen=1000, batch=2, heads=16)
    p.add_argument("--seed", type=int, default=None, help="input seed (default: random, printed)")
    p.add_argument("--lse", action="store_true", help="also check the logsumexp output")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    shape = shape_from_args(args, "check")
    if shape is None:
        return USAGE_ERROR
    error = config_key_error(args.config, "check")  # before the GPU: a typo is a typo on any machine
    if error:
        print(error, file=sys.stderr)
        return USAGE_ERROR
    arch = gpu_arch(args, "check")
    if arch is None:
        return USAGE_ERROR
    config = parse_config(args.config, shape.problem, arch, "check")
    if config is None:
        return USAGE_ERROR
    reasons = space.violations(config, shape.problem, arch)
    if reasons:
        print(f"autotune check: {config.key} is invalid for {shape.problem.key} on {arch.name}:", file=sys.stderr)
        for v in reasons:
            print(f"  {v}", file=sys.stderr)
        return USAGE_ERROR
    builds = build_configs([config], shape.problem, arch, args.cache_dir, "check")
    if builds is None:
        return USAGE_ERROR
    build = builds[0]

    print(f"config   {config.key}")
    print(f"shape    {shape.key} (layout {args.layout})")
    if not build.ok:
        print(f"build    {build.status}: {build.error}")
        return 1
    r = build.report
    print(f"build    {build.status}{' (cached)' if build.cached else ''}: {r.registers} registers, "
          f"spills {r.spill_stores}/{r.spill_loads} B")

    from autotune.measure.check import check

    try:
        result = check(build, shape, seed=args.seed, layout=args.layout, check_lse=args.lse)
    except RuntimeError as e:  # CudaError, or torch reporting an asynchronous fault of our kernel
        print(f"result   CRASHED: {type(e).__name__}: {e}")
        return 1
    print(f"seed     {result.seed}")
    print(f"error    ours {result.max_error:.3g}, torch {result.torch_error:.3g}, tolerance {result.tolerance:.3g}"
          + (f"; lse {result.lse_error:.3g}" if result.lse_error is not None else ""))
    print(f"result   {'OK' if result.ok else 'MISMATCH'}: {result.message}")
    return 0 if result.ok else 1
