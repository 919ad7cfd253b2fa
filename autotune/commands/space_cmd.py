"""`autotune space`: list the valid configs of a problem on an arch; with --compile, build them and show ptxas'
figures. The last line is a summary: valid/invalid counts, invalid by rule, and compile outcomes.

Also home of the problem/arch arguments that the build command shares.
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter

import space

USAGE_ERROR = 2


def add_problem_arguments(parser: argparse.ArgumentParser, head_dim_required: bool = True) -> None:
    parser.add_argument("--head-dim", type=int, required=head_dim_required, choices=space.HEAD_DIMS,
                        help="head dimension")
    parser.add_argument("--dtype", default="fp16", choices=space.DTYPES, help="element type (default fp16)")
    parser.add_argument("--causal", action="store_true", help="causal (top-left aligned) masking")
    parser.add_argument("--arch", default=None,
                        help="target arch, e.g. sm_90, sm_100, sm_103 (default: the visible GPU's)")
    parser.add_argument("--cache-dir", default=None,
                        help="kernel cache (default: $AUTOTUNE_CACHE_DIR or ~/.cache/autotune/kernels)")


def problem_from_args(args: argparse.Namespace) -> space.Problem:
    return space.Problem(head_dim=args.head_dim, dtype=args.dtype, causal=args.causal)


def arch_from_args(args: argparse.Namespace, command: str) -> space.Arch | None:
    """The --arch value or the visible GPU's arch; prints why not and returns None when neither works."""
    from autotune.launch.gpu_arch import NoGpuError, resolve_arch

    try:
        return resolve_arch(args.arch)
    except NoGpuError as e:
        print(f"autotune {command}: {e}", file=sys.stderr)
    except ValueError as e:
        print(f"autotune {command}: --arch: {e}", file=sys.stderr)
    return None


WHY_LIMIT = 20  # invalid configs that --why lists unless --limit says otherwise


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("space", help="list (and compile-check) the valid configs of a problem",
                              description=__doc__.split("\n\n")[0])
    add_problem_arguments(p)
    p.add_argument("--family", default=None, help="only this kernel family (default: every family of the arch)")
    p.add_argument("--compile", action="store_true", help="build the listed configs and show ptxas' figures")
    p.add_argument("--jobs", type=int, default=None, help="parallel compiles (default: CPU count)")
    p.add_argument("--limit", type=int, default=None,
                   help=f"list (and compile) at most N valid configs and, with --why, N invalid ones (default: every "
                        f"valid config, and {WHY_LIMIT} invalid ones)")
    p.add_argument("--why", action="store_true",
                   help="also say why configs are invalid: each rule with how many configs it rejects and one "
                        f"example, then the first invalid configs with the rules they break ({WHY_LIMIT}, or --limit)")
    p.set_defaults(run=run)


def _families(args, arch: space.Arch) -> list[str] | None:
    if args.family is None:
        return [f for f in arch.families if f in space.FAMILIES]
    try:
        space.get_family(args.family)
    except ValueError as e:
        print(f"autotune space: --family: {e}", file=sys.stderr)
        return None
    if args.family not in arch.families:
        print(f"autotune space: --family: {args.family!r} does not exist on {arch.name} "
              f"(its families: {', '.join(arch.families)})", file=sys.stderr)
        return None
    return [args.family]


def run(args: argparse.Namespace) -> int:
    if args.limit is not None and args.limit < 0:
        print("autotune space: --limit: expected a non-negative integer", file=sys.stderr)
        return USAGE_ERROR
    if args.jobs is not None and args.jobs < 1:
        print("autotune space: --jobs: expected a positive integer", file=sys.stderr)
        return USAGE_ERROR
    problem = problem_from_args(args)
    arch = arch_from_args(args, "space")
    if arch is None:
        return USAGE_ERROR
    families = _families(args, arch)
    if families is None:
        return USAGE_ERROR

    valid: list[space.Config] = []
    invalid: list[tuple[space.Config, list[space.Violation]]] = []
    for family in families:
        # every config with its verdict; the decode axes' expansion judges the rest of a config once, not per split
        for config, broken in space.judged_configs(family, problem, arch):
            if broken:
                invalid.append((config, broken))
            else:
                valid.append(config)
    listed = valid if args.limit is None else valid[: args.limit]

    results = None
    if args.compile:
        results = _compile(listed, problem, arch, args) if listed else []
        if results is None:
            return USAGE_ERROR

    print(f"# {problem.key} on {arch.name}, families {', '.join(families)}")
    if results is None:
        print(f"{'threads':>7} {'smem':>7}  config")
        for config in listed:
            lay = space.layout(config, problem)
            print(f"{lay.threads:>7} {lay.smem_total:>7}  {config.key}")
    else:
        print(f"{'threads':>7} {'smem':>7} {'regs':>4} {'spill_st':>8} {'spill_ld':>8} {'ptxas_smem':>10} "
              f"{'compile_s':>9}  {'status':<13}  config")
        for r in results:
            lay = r.layout
            print(f"{lay.threads:>7} {lay.smem_total:>7} " + _report_columns(r) + f"  {r.status:<13}  {r.config.key}")
            if not r.ok:
                print("    " + (r.error or "").replace("\n", "\n    "))

    if args.why:
        print(_why(invalid, WHY_LIMIT if args.limit is None else args.limit))

    print(_summary(valid, invalid, listed, results))
    return 1 if results and any(not r.ok for r in results) else 0


def _compile(configs, problem, arch, args):
    from autotune.build.builder import Builder
    from autotune.build.nvcc import NvccNotFoundError

    try:
        builder = Builder(arch, cache_dir=args.cache_dir, jobs=args.jobs)
    except NvccNotFoundError as e:
        print(f"autotune space: --compile: {e}", file=sys.stderr)
        return None

    def progress(done, total, result):
        cached = " (cached)" if result.cached else ""
        print(f"[{done}/{total}] {result.status}{cached}: {result.config.key}", file=sys.stderr, flush=True)

    return builder.build([(c, problem) for c in configs], progress=progress)


def _report_columns(result) -> str:
    r = result.report
    if r is None:
        return f"{'-':>4} {'-':>8} {'-':>8} {'-':>10} {'-':>9}"
    return (f"{r.registers:>4} {r.spill_stores:>8} {r.spill_loads:>8} {r.smem_static:>10} "
            f"{r.compile_seconds:>9.1f}")


def _why(invalid, limit: int) -> str:
    """Why configs are invalid, summarised: a space has millions of invalid configs (all of them, listed, were
    29.5 MB for d128 on sm_90), so each rule with its count and one example, then the first `limit` configs."""
    examples: dict[str, tuple[space.Config, space.Violation]] = {}
    counts: Counter = Counter()
    for config, broken in invalid:
        for v in broken:
            counts[v.rule] += 1
            examples.setdefault(v.rule, (config, v))
    lines = ["# rules and how many invalid configs break each (a config counts once per rule it breaks)"]
    for rule, n in counts.most_common():
        config, v = examples[rule]
        lines.append(f"{rule}: {n} configs, e.g. {config.key}\n    {v}")
    shown = invalid[:limit]
    lines.append(f"# the first {len(shown)} of {len(invalid)} invalid configs and the rules they break"
                 + (f" (--limit N lists more)" if len(shown) < len(invalid) else ""))
    lines += [f"{config.key}\n    " + "\n    ".join(str(v) for v in broken) for config, broken in shown]
    return "\n".join(lines)


def _summary(valid, invalid, listed, results) -> str:
    by_rule = Counter(v.rule for _, broken in invalid for v in broken)
    rules = ", ".join(f"{rule} {n}" for rule, n in by_rule.most_common())
    text = f"{len(valid)} valid, {len(invalid)} invalid"
    if rules:
        text += f" (by rule, a config counted once per rule it breaks: {rules})"
    if len(listed) < len(valid):
        text += f"; listed {len(listed)}"
    if results is not None:
        compiled = sum(r.ok for r in results)
        spilled = sum(r.spilled for r in results)
        failed = len(results) - compiled
        cached = sum(r.cached for r in results)
        text += f"; {compiled} compiled, {spilled} spilled, {failed} failed ({cached} from cache)"
    return text
