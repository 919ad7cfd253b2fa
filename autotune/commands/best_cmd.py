"""`autotune best`: print the configs autotune.attention draws on: the best-per-shape table of the storage (what
`autotune search` stored) and the tables shipped in studies/tuned/, each row marked with where it comes from.
The storage is only read: a mistyped --storage is an error, never a new empty database."""
from __future__ import annotations

import argparse
import json
import sys

import space

from . import causal_flag

USAGE_ERROR = 2


def add_filter_arguments(p: argparse.ArgumentParser) -> None:
    """Filters shared with `autotune export`."""
    p.add_argument("--seqlen", type=int, default=None, help="only this query sequence length")
    p.add_argument("--head-dim", type=int, default=None, choices=space.HEAD_DIMS, help="only this head dimension")
    p.add_argument("--dtype", default=None, choices=space.DTYPES, help="only this element type")
    causal = p.add_mutually_exclusive_group()
    causal.add_argument("--causal", dest="causal", nargs="?", const=True, default=None,
                        choices=(True,) + space.CAUSAL_ALIGNS, metavar="upper_left|lower_right",
                        help="only causal rows (alone: both alignments; upper_left or lower_right: that one, where "
                             "Nq == Nk rows are upper_left); with --explain: the shape's mask, as search's --causal")
    causal.add_argument("--no-causal", dest="causal", action="store_const", const=False, help="only non-causal rows")
    p.add_argument("--gpu", default=None, metavar="NAME",
                   help="only GPUs whose name contains NAME, case-insensitively (e.g. h200); a warning says when "
                        "no GPU with tuned rows matches")
    p.add_argument("--arch", default=None, help="only this arch (e.g. sm_90)")
    p.add_argument("--storage", default=None, metavar="URL",
                   help="SQLAlchemy URL (default: $AUTOTUNE_STORAGE, else sqlite:///<repo or cwd>/studies/autotune.db)")


def filters_from_args(args: argparse.Namespace) -> dict:
    arch = space.get_arch(args.arch).name if args.arch else None
    causal = None if args.causal is None else bool(args.causal)
    align = args.causal if isinstance(args.causal, str) else None
    return {"gpu": args.gpu, "arch": arch, "seqlen": args.seqlen, "head_dim": args.head_dim, "dtype": args.dtype,
            "causal": causal, "causal_align": align}


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("best", help="print the tuned configs per shape (stored and shipped)",
                              description=__doc__)
    add_filter_arguments(p)
    p.add_argument("--json", action="store_true",
                   help="print the storage's rows as JSON (the export format's rows; shipped tables are already JSON)")
    e = p.add_argument_group("explain", "which config autotune.attention would run for one shape, and why")
    e.add_argument("--explain", action="store_true",
                   help="explain the choice for the shape given by --seqlen (required), --seqlen-k, --batch, --heads, "
                        "--kv-heads, --head-dim (128), --dtype (fp16) and --causal [lower_right]; --gpu (matched as above, against the GPUs "
                        "with tuned rows) and --arch default to the visible GPU")
    e.add_argument("--batch", type=int, default=4, help="with --explain: batch size (default 4)")
    e.add_argument("--heads", type=int, default=16, help="with --explain: query heads (default 16)")
    e.add_argument("--kv-heads", type=int, default=None, help="with --explain: key/value heads (default: --heads)")
    e.add_argument("--seqlen-k", type=int, default=None, help="with --explain: key length (default: --seqlen)")
    p.set_defaults(run=run)


def format_rows(rows, sources=None) -> str:
    """The table; `sources[i]` says where row i comes from (default: the storage)."""
    if not rows:
        return "no stored or shipped rows match"
    sources = sources or ["storage"] * len(rows)
    head = (f"{'gpu':<16} {'arch':<6} {'dtype':<5} {'d':>4} {'causal':<11} {'seqlen':>7} {'seqlen_k':>8} {'batch':>5} "
            f"{'heads':>5} {'kv':>4} {'TFLOPS':>8} {'passes':>13} {'ms':>8}  {'from':<18} {'study #trial':<40} config")
    lines = [head]
    for r, source in zip(rows, sources):
        ms = f"{r.time_ms:8.3f}" if r.time_ms is not None else f"{'-':>8}"
        origin = f"{r.study or '-'} #{r.trial if r.trial is not None else '-'}"
        lines.append(f"{r.gpu_name[:16]:<16} {r.arch:<6} {r.dtype:<5} {r.head_dim:>4} {causal_words(r):<11} "
                     f"{r.seqlen:>7} {r.seqlen_k:>8} {r.batch:>5} {r.heads:>5} {r.kv_heads:>4} {r.tflops:8.1f} "
                     f"{passes_cell(r):>13} {ms}  "
                     f"{source:<18} {origin:<40} {r.config_key}")
    return "\n".join(lines)


def passes_cell(row) -> str:
    """A campaign row's first / second pass figures (`--explain` adds the runner-up's); "-" without a second pass."""
    if row.first_pass_tflops is None or row.second_pass_tflops is None:
        return "-"
    return f"{row.first_pass_tflops:.1f}/{row.second_pass_tflops:.1f}"


def causal_words(row) -> str:
    """The causal column: false, true (top-left) or lower_right."""
    return "lower_right" if row.causal and row.causal_align == "lower_right" else str(row.causal).lower()


class Tables:
    """What the runtime's lookup reads, as `autotune best` shows it: the user's storage (read-only) and the
    shipped tables, each row checked by best_table.row_problem (bad rows named in `skipped`)."""

    def __init__(self, storage: str | None, filters: dict, *, shipped: bool = True):
        from autotune.runtime.lookup import shipped_tables_dir
        from autotune.store import storage_url
        from autotune.store.best_table import BestStore, StoreError, read_export, row_matches

        self.url = storage_url.resolve_storage_url(storage)
        self.where = storage_url.describe(self.url)
        self.stored, self.skipped, self.notes, self.gpu_names = [], [], [], set()
        path = storage_url.sqlite_path(self.url)
        if storage_url.is_default(self.url) and path is not None and not path.expanduser().exists():
            # A fresh install has no storage yet: that is not a mistake, and reading must not create one.
            self.notes.append(f"storage {self.where} does not exist yet (`autotune search` creates it)")
        else:
            with BestStore(self.url, read_only=True) as store:  # a mistyped --storage: StorageError, nothing made
                self.stored = store.all_rows(**filters)
                self.skipped += store.skipped
                self.gpu_names.update(store.gpu_names())
        self.tables_dir = shipped_tables_dir() if shipped else None
        self.files = sorted(self.tables_dir.glob("*.json")) if self.tables_dir else []
        self.shipped: list[tuple] = []  # (entry, file name)
        for f in self.files:
            try:
                rows = read_export(f)
            except StoreError as err:
                self.skipped.append(str(err))
                continue
            self.skipped += rows.skipped
            self.gpu_names.update(e.gpu_name for e in rows.entries)
            self.shipped += [(e, f.name) for e in rows.entries if row_matches(e, **filters)]


def gpu_warning(pattern: str | None, names) -> str | None:
    """A warning when --gpu matches no GPU that has tuned rows (a typo, or a GPU nothing was tuned on)."""
    from autotune.store import storage_url

    if not pattern or any(storage_url.gpu_matches(pattern, n) for n in names):
        return None
    known = ", ".join(repr(n) for n in sorted(names)) or "none"
    return f"warning: --gpu {pattern!r} matches no GPU with tuned rows (GPU names that have rows: {known})"


def resolve_gpu(pattern: str, names) -> tuple[str | None, str | None]:
    """(the GPU name `--gpu pattern` stands for, a message), by the rule of `best --gpu`. One GPU with tuned rows
    matches: its name. Several: None, and the message lists them. None: the pattern as given (the runtime then
    has no tuned row for it), with a warning."""
    from autotune.store import storage_url

    matching = sorted(n for n in set(names) if storage_url.gpu_matches(pattern, n))
    exact = [n for n in matching if n.lower() == pattern.strip().lower()]
    if exact:
        return exact[0], None
    if len(matching) == 1:
        return matching[0], None
    if matching:
        return None, (f"--gpu {pattern!r} matches several GPUs with tuned rows: "
                      f"{', '.join(repr(n) for n in matching)}; give more of the name")
    return pattern, gpu_warning(pattern, names) + "; explaining for that name as given"


def _read_tables(storage: str | None, filters: dict, *, shipped: bool = True) -> Tables | int:
    """Tables, or USAGE_ERROR after one line on stderr for a storage mistake."""
    from sqlalchemy.exc import SQLAlchemyError

    from autotune.store import storage_url
    from autotune.store.best_table import StoreError

    try:
        return Tables(storage, filters, shipped=shipped)
    except (ValueError, StoreError) as err:
        print(f"autotune best: {err}", file=sys.stderr)
    except SQLAlchemyError as err:  # it passed the checks, then failed while reading (a server going away)
        print(f"autotune best: the storage failed while reading: {storage_url.first_line(err)}", file=sys.stderr)
    return USAGE_ERROR


def explain(args: argparse.Namespace) -> int:
    from autotune.runtime import lookup as runtime

    if args.seqlen is None:
        print("autotune best: --explain needs --seqlen", file=sys.stderr)
        return USAGE_ERROR
    try:
        causal, align = causal_flag.mask("upper_left" if args.causal is True else args.causal)
        shape = space.Shape(batch=args.batch, heads=args.heads, kv_heads=args.kv_heads, seqlen_q=args.seqlen,
                            seqlen_k=args.seqlen_k, head_dim=args.head_dim or 128, dtype=args.dtype or "fp16",
                            causal=causal, causal_align=align)
        arch = space.get_arch(args.arch) if args.arch else None
    except ValueError as err:
        print(f"autotune best: {err}", file=sys.stderr)
        return USAGE_ERROR
    tables = _read_tables(args.storage, {})  # checks the storage: a mistake is one line, and nothing is created
    if not isinstance(tables, Tables):
        return tables
    gpu_name = None
    if args.gpu is not None:
        gpu_name, message = resolve_gpu(args.gpu, tables.gpu_names)
        if message:
            print(f"autotune best: {message}", file=sys.stderr)
        if gpu_name is None:
            return USAGE_ERROR
    if gpu_name is None or arch is None:
        try:
            import torch

            if not torch.cuda.is_available():
                raise RuntimeError
            gpu_name = gpu_name or torch.cuda.get_device_name()
            arch = arch or space.get_arch(torch.cuda.get_device_capability())
        except Exception:
            print("autotune best: no CUDA GPU visible; pass --gpu h200 --arch sm_90 with --explain",
                  file=sys.stderr)
            return USAGE_ERROR
    print(runtime.select_config(shape, gpu_name, arch, args.storage).explain())
    from autotune.build.builder import cache_exposure, default_cache_dir

    exposure = cache_exposure(default_cache_dir())  # the runtime's kernel cache: can others plant kernels in it?
    if exposure:
        print(f"  note: {exposure}")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.explain:
        return explain(args)
    try:
        filters = filters_from_args(args)
    except ValueError as err:
        print(f"autotune best: {err}", file=sys.stderr)
        return USAGE_ERROR
    tables = _read_tables(args.storage, filters, shipped=not args.json)
    if not isinstance(tables, Tables):
        return tables
    for why in tables.skipped:
        print(f"autotune best: skipped {why}", file=sys.stderr)
    warning = gpu_warning(args.gpu, tables.gpu_names)
    if warning:
        print(f"autotune best: {warning}", file=sys.stderr)
    if args.json:
        print(json.dumps([r.to_json() for r in tables.stored], indent=2, sort_keys=True))
        return 0
    stored_keys = {r.key for r in tables.stored}
    rows = list(tables.stored) + [e for e, _ in tables.shipped]
    sources = ["storage"] * len(tables.stored) + [
        f"{name} (hidden)" if e.key in stored_keys else name for e, name in tables.shipped]
    print(format_rows(rows, sources))
    if any(r.second_pass_tflops is not None for r in rows):
        print("(passes: a campaign row's TFLOPS in its first pass and in the second, another process later; its "
              "TFLOPS is their geometric mean; `--explain` adds the runner-up's)")
    for note in tables.notes:
        print(f"({note})")
    print(f"({len(tables.stored)} row(s) from storage {tables.where})")
    names = ", ".join(f.name for f in tables.files) or "none"
    print(f"({len(tables.shipped)} row(s) from the tables shipped in {tables.tables_dir or '(none found)'}: {names})")
    print("autotune.attention runs, for a shape: the storage's row, else a shipped row (one marked 'hidden' has a "
          "stored row of the same shape, which wins), else the nearest tuned shape, else the heuristic default; "
          "`autotune best --explain --seqlen N ...` shows the choice for one shape")
    return 0
