"""`autotune` command line: a table of subcommands, one module each under autotune/commands/.

A command's module is its name with dashes as underscores (`compare-samplers` → compare_samplers_cmd.py).
Each module defines `add_parser(subparsers)` that registers its subparser with `set_defaults(run=fn)`, where
`fn(args) -> int` is the exit code.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

COMMANDS = ("space", "build", "check", "bench", "search", "campaign", "best", "export", "import", "report", "dashboard",
            "sweep", "compare-samplers", "sass")


DESCRIPTION = """\
Find the fastest configuration of a CUDA FlashAttention forward kernel for each attention shape (batch, heads,
sequence length, head dim, dtype, causal) by searching its design space, store the winners, and run them from
Python with `autotune.attention(q, k, v)`."""

EPILOG = """\
what each command needs:
  nothing but Python     space, best, export, import, report, dashboard, compare-samplers, and
                         search --replay FILE (a search replayed on a recorded landscape)
  nvcc, no GPU           build, space --compile, sass (a CUDA toolkit, or `pip install 'autotune[nvcc]'`)
  a CUDA GPU             check, bench, search, campaign, sweep

first steps:
  autotune space --head-dim 128 --arch sm_90 | tail -1    how many configs are valid, and why the rest are not
  autotune search --seqlen 4096                           search one shape on this machine's GPU
  autotune best                                           the tuned configs `autotune.attention` draws on

`autotune COMMAND --help` for each command; docs/ in the repository for the search, storage and benchmarks."""

# Exit status when the reader of our output went away (`autotune best | head -1`): what a program killed by
# SIGPIPE reports in a shell (128 + 13), without the traceback.
READER_GONE = 141


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="autotune", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        module_name = f"autotune.commands.{name.replace('-', '_')}_cmd"
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name == module_name:
                continue  # not built yet
            raise
        module.add_parser(sub)
    return parser


def normalise_arch(args: argparse.Namespace) -> bool:
    """--arch as the arch's own name: another spelling ('sm90', '90', 'sm_90a') is read as it, with a notice on
    stderr; a name that is no supported arch is one line naming the known ones. False after printing an error."""
    if not getattr(args, "arch", None):
        return True
    import space

    try:
        arch = space.get_arch(args.arch)
    except ValueError as e:
        print(f"autotune {args.command}: --arch: {e}", file=sys.stderr)
        return False
    if args.arch != arch.name:
        print(f"autotune {args.command}: --arch {args.arch} read as {arch.name}", file=sys.stderr)
        args.arch = arch.name
    return True


def _reader_gone() -> int:
    """Our stdout's reader closed it (`| head`): stop quietly. What is still buffered goes to /dev/null, so the
    interpreter's last flush cannot raise again on the way out."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is no file descriptor (captured by a test harness)
        pass
    finally:
        os.close(devnull)
    return READER_GONE


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    if not normalise_arch(args):
        return 2
    try:
        code = int(args.run(args) or 0)
        sys.stdout.flush()  # a reader gone before the last buffered lines is told here, not at interpreter exit
        return code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return _reader_gone()


if __name__ == "__main__":
    sys.exit(main())
