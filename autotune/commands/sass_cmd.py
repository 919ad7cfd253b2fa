"""`autotune sass`: the hot loop of one config's SASS: instruction mix, basic blocks and source lines (no GPU).

The config is built with -lineinfo (the same machine code, plus a line table; its own cache entry) and
disassembled with nvdisasm; see autotune/build/sass.py for what "hot loop" means and how to read the blocks.
Each block's issue cycles are the sum of its instructions' stall counts (ptxas's control codes): the fewest cycles
one warp spends issuing it. --cubin reads any other cubin the same way (another library's kernel, say).
"""
from __future__ import annotations

import argparse
import sys

import space

from .check_cmd import parse_config
from .space_cmd import USAGE_ERROR, add_problem_arguments, arch_from_args, problem_from_args


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("sass", help="the hot loop of a config's SASS: instruction mix, blocks, source lines",
                              description=__doc__)
    p.add_argument("--config", default=None, metavar="KEY",
                   help="config key as printed by `autotune space` (default: the heuristic default)")
    p.add_argument("--family", default=None,
                   help="family of the default config when --config is not given (default: the arch's newest)")
    add_problem_arguments(p, head_dim_required=False)  # required unless --cubin (checked in run)
    p.add_argument("--cubin", default=None, metavar="PATH",
                   help="read this cubin instead of building a config (--config and the problem are then not used)")
    p.add_argument("--kernel", default=None, metavar="NAME",
                   help="only the kernel functions whose name contains NAME")
    p.add_argument("--by-line", action="store_true",
                   help="also list the hot loop's instructions per source line, most first, with the line's text")
    p.add_argument("--top", type=int, default=20, metavar="N",
                   help="opcodes (and with --by-line, source lines) to list (default 20)")
    p.add_argument("--dump", action="store_true", help="also print the hot loop's instructions")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from autotune.build import sass
    from autotune.build.builder import Builder
    from autotune.build.nvcc import NvccNotFoundError

    if args.top < 1:
        print(f"autotune sass: --top: expected a count ≥ 1, got {args.top}", file=sys.stderr)
        return USAGE_ERROR
    if args.cubin is not None:
        return _read_cubin(args)
    if args.head_dim is None:
        print("autotune sass: --head-dim is required (unless --cubin names a cubin to read)", file=sys.stderr)
        return USAGE_ERROR
    problem = problem_from_args(args)
    arch = arch_from_args(args, "sass")
    if arch is None:
        return USAGE_ERROR
    config = parse_config(args.config, problem, arch, "sass", args.family)  # --config '' is an error
    if config is None:
        return USAGE_ERROR
    try:
        tool = sass.find_nvdisasm()
        builder = Builder(arch, cache_dir=args.cache_dir, extra_flags=["-lineinfo"])
    except (sass.NvdisasmNotFoundError, NvccNotFoundError) as e:
        print(f"autotune sass: {e}", file=sys.stderr)
        return USAGE_ERROR
    result = builder.build_one(config, problem)
    print(f"config    {config.key}")
    print(f"problem   {problem.key} on {arch.name}")
    if not result.ok:
        print(f"status    {result.status}: {(result.error or '').strip()[:500]}")
        return 1
    r = result.report
    print(f"build     {r.registers} registers, spills {r.spill_stores} B stores / {r.spill_loads} B loads; "
          f"{result.cubin_path}")
    return _print_kernels(sass.disassemble(result.cubin_path, tool), args)


def _read_cubin(args: argparse.Namespace) -> int:
    from pathlib import Path

    from autotune.build import sass

    if not Path(args.cubin).is_file():
        print(f"autotune sass: --cubin: no such file: {args.cubin}", file=sys.stderr)
        return USAGE_ERROR
    try:
        tool = sass.find_nvdisasm()
    except sass.NvdisasmNotFoundError as e:
        print(f"autotune sass: {e}", file=sys.stderr)
        return USAGE_ERROR
    print(f"cubin     {args.cubin}")
    try:
        kernels = sass.disassemble(args.cubin, tool)
    except (RuntimeError, ValueError) as e:  # not a cubin nvdisasm reads, or listings that do not pair up
        print(f"autotune sass: --cubin: {e}", file=sys.stderr)
        return 1
    return _print_kernels(kernels, args)


def _print_kernels(kernels, args: argparse.Namespace) -> int:
    if args.kernel is not None:
        names = [k.name for k in kernels]
        kernels = [k for k in kernels if args.kernel in k.name]
        if not kernels:
            print(f"autotune sass: --kernel: no kernel function's name contains {args.kernel!r} "
                  f"(functions: {', '.join(names) or 'none'})", file=sys.stderr)
            return USAGE_ERROR
    if not kernels:
        print("no kernel function in the cubin")
        return 1
    for kernel in kernels:
        _print_kernel(kernel, args)
    return 0


def _print_kernel(kernel, args) -> None:
    from autotune.build import sass

    print(f"kernel    {kernel.name}: {len(kernel.instructions)} instructions, {len(kernel.loops)} loop(s)")
    loop = kernel.hot_loop
    if loop is None:
        print("hot loop  none (no backward branch)")
        return
    ops = loop.opcodes
    mma = ", ".join(f"{n} {op}" for op, n in ops.items() if op in sass.MMA_OPCODES) or "no matrix multiply"
    print(f"hot loop  0x{loop.start:04x}-0x{loop.end:04x}: {len(loop.instructions)} instructions, {mma} "
          f"(static count over all its blocks; see the blocks for what runs every iteration)")
    print("opcodes   " + " · ".join(f"{op} {n}" for op, n in ops.most_common(args.top)))
    stalls = loop.stall_cycles_by_opcode()
    if stalls:
        print("stalls    " + " · ".join(f"{op} {n}" for op, n in stalls.most_common(args.top))
              + " (cycles of stall counts per opcode, all blocks)")
    local = {op: n for op, n in ops.items() if op in sass.LOCAL_MEMORY}
    if local:
        print("local     " + ", ".join(f"{n} {op}" for op, n in sorted(local.items()))
              + " in the loop (spilled values or stack arrays, moved every iteration that runs them)")
    print()
    print(f"  {'block':<15} {'n':>5} {'cycles':>6}  {'entered':<30} {'opcodes':<44} source lines")
    for blk in loop.blocks:
        how = ("loop head" if blk.start == loop.start else
               ", ".join([*(["fall-through"] if blk.falls_through else []),
                          *(f"from 0x{a:04x}" for a in blk.entered_from[:2])]) or "unreached")
        if len(blk.entered_from) > 2:
            how += f" +{len(blk.entered_from) - 2}"
        mix = " ".join(f"{op} {n}" for op, n in blk.opcodes.most_common(4))
        last = blk.instructions[-1]
        if last.base in sass.BRANCHES:
            mix = f"{mix}; {last.predicate + ' ' if last.predicate else ''}→0x{last.target or 0:04x}"
        cycles = "?" if blk.issue_cycles is None else str(blk.issue_cycles)
        print(f"  0x{blk.start:04x}-0x{blk.end:04x} {len(blk.instructions):>5} {cycles:>6}  {how:<30} {mix:<44} "
              f"{sass.line_ranges(blk.lines())}")
    if args.by_line:
        from collections import Counter

        counts = Counter((i.file, i.line) for i in loop.instructions if i.file and i.line)
        print()
        print("  instructions per source line (hot loop, all blocks)")
        for (path, line), n in counts.most_common(args.top):
            print(f"  {n:>5}  {path.rsplit('/', 1)[-1]}:{line:<5} {sass.source_line(path, line)[:90]}")
    if args.dump:
        print()
        for ins in loop.instructions:
            where = f"  // {ins.file.rsplit('/', 1)[-1]}:{ins.line}" if ins.file and ins.line else ""
            ctl = f"{ins.control.text():<10} " if ins.control else ""
            print(f"  /*{ins.address:04x}*/ {ctl}{ins.text()}{where}")
