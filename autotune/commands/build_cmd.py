"""`autotune build`: build one config (default: the heuristic default for the problem) and print its report."""
from __future__ import annotations

import argparse
import sys

import space

from .check_cmd import parse_config
from .space_cmd import USAGE_ERROR, add_problem_arguments, arch_from_args, problem_from_args


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("build", help="build one config and print its ptxas report (nvcc, no GPU)",
                              description=__doc__)
    p.add_argument("--config", default=None, metavar="KEY",
                   help="config key as printed by `autotune space`, e.g. 'mma_sync:br=128,bc=64,...' "
                        "(default: the heuristic default for the problem and arch)")
    p.add_argument("--family", default=None,
                   help="family of the default config when --config is not given (default: the arch's newest)")
    add_problem_arguments(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from autotune.build.builder import Builder
    from autotune.build.nvcc import NvccNotFoundError, locate_nvcc

    problem = problem_from_args(args)
    arch = arch_from_args(args, "build")
    if arch is None:
        return USAGE_ERROR
    config = parse_config(args.config, problem, arch, "build", args.family)  # --config '' is an error
    if config is None:
        return USAGE_ERROR

    try:
        nvcc, found_at = locate_nvcc()
        builder = Builder(arch, cache_dir=args.cache_dir, nvcc=nvcc)
    except NvccNotFoundError as e:
        print(f"autotune build: {e}", file=sys.stderr)
        return USAGE_ERROR
    result = builder.build_one(config, problem)
    lay = space.layout(config, problem)

    rows = [("config", config.key), ("problem", problem.key), ("arch", f"{arch.name} ({arch.gencode})"),
            ("nvcc", f"{nvcc} (from {found_at}; {builder.nvcc_version.split(';')[0]})"),
            *([("ptxas", f"{builder.ptxas} (AUTOTUNE_PTXAS; {builder.ptxas_version.split(';')[0]})")]
              if builder.ptxas else []),
            ("status", result.status + (" (cached)" if result.cached else ""))]
    if result.report:
        r = result.report
        rows += [
            ("registers", r.registers),
            ("spill", f"{r.spill_stores} B stores, {r.spill_loads} B loads"),
            ("stack", f"{r.stack_bytes} B"),
            ("smem", f"static {r.smem_static} B (layout {lay.smem_static} B), dynamic {lay.smem_dynamic} B"),
            ("threads", lay.threads),
            ("compile", f"{r.compile_seconds:.1f} s"),
            ("cubin", f"{result.cubin_path} (sha256 {result.cubin_hash[:16] if result.cubin_hash else '?'})"),
        ]
    for name, value in rows:
        print(f"{name:<10} {value}")
    if not result.ok:
        print("error      " + (result.error or "").replace("\n", "\n           "))
        if result.log_path:
            print(f"log        {result.log_path}")
        return 1
    return 0
