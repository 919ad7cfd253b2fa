"""commands: one module per `autotune` subcommand (the CLI's table, autotune/cli.py), each with `add_arguments`
and `execute(args) -> exit code`.

Owns: argument parsing, what each command prints, and exit codes. No logic of its own beyond that.

May import: build, launch, measure, store, landscapes, search, runtime, report (and space/). Each command imports
the layers it uses inside its functions, so `autotune --help` and the light commands do not pay for optuna,
sqlalchemy or torch.

Public names: `<name>_cmd.add_arguments`, `<name>_cmd.execute`.
"""
