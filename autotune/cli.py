"""`autotune` command line: a table of subcommands, one module each under autotune/commands/.

A command's module is its name with dashes as underscores (`compare-samplers` → compare_samplers_cmd.py).
Each module defines `add_parser(subparsers)` that registers its subparser with `set_defaults(run=fn)`, where
`fn(args) -> int` is the exit code.
"""
from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = ("space", "build", "check", "bench", "search", "campaign", "best", "export", "import", "report", "dashboard",
            "sweep", "compare-samplers", "sass")


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="autotune", description=__doc__.splitlines()[0])
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


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
