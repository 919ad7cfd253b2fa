"""`autotune best`: print the best-per-shape table (what `autotune search` stored and the runtime uses)."""
from __future__ import annotations

import argparse
import json
import sys

import space

USAGE_ERROR = 2


def add_filter_arguments(p: argparse.ArgumentParser) -> None:
    """Filters shared with `autotune export`."""
    p.add_argument("--seqlen", type=int, default=None, help="only this query sequence length")
    p.add_argument("--head-dim", type=int, default=None, choices=space.HEAD_DIMS, help="only this head dimension")
    p.add_argument("--dtype", default=None, choices=space.DTYPES, help="only this element type")
    causal = p.add_mutually_exclusive_group()
    causal.add_argument("--causal", dest="causal", action="store_const", const=True, default=None,
                        help="only causal rows")
    causal.add_argument("--no-causal", dest="causal", action="store_const", const=False, help="only non-causal rows")
    p.add_argument("--gpu", default=None, metavar="NAME",
                   help="only GPUs whose name contains NAME, case-insensitively (e.g. h200)")
    p.add_argument("--arch", default=None, help="only this arch (e.g. sm_90)")
    p.add_argument("--storage", default=None, metavar="URL",
                   help="SQLAlchemy URL (default: $AUTOTUNE_STORAGE, else sqlite:///<repo or cwd>/studies/autotune.db)")


def filters_from_args(args: argparse.Namespace) -> dict:
    arch = space.get_arch(args.arch).name if args.arch else None
    return {"gpu": args.gpu, "arch": arch, "seqlen": args.seqlen, "head_dim": args.head_dim, "dtype": args.dtype,
            "causal": args.causal}


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("best", help="print the best stored config per shape", description=__doc__)
    add_filter_arguments(p)
    p.add_argument("--json", action="store_true", help="print the rows as JSON (the export format's rows)")
    e = p.add_argument_group("explain", "which config autotune.attention would run for one shape, and why")
    e.add_argument("--explain", action="store_true",
                   help="explain the choice for the shape given by --seqlen (required), --batch, --heads, --kv-heads, "
                        "--head-dim (128), --dtype (fp16) and --causal; --gpu is then the exact GPU name and "
                        "--gpu/--arch default to the visible GPU")
    e.add_argument("--batch", type=int, default=4, help="with --explain: batch size (default 4)")
    e.add_argument("--heads", type=int, default=16, help="with --explain: query heads (default 16)")
    e.add_argument("--kv-heads", type=int, default=None, help="with --explain: key/value heads (default: --heads)")
    p.set_defaults(run=run)


def format_rows(rows) -> str:
    if not rows:
        return "no stored rows match"
    head = (f"{'gpu':<16} {'arch':<6} {'dtype':<5} {'d':>4} {'causal':<6} {'seqlen':>7} {'seqlen_k':>8} {'batch':>5} "
            f"{'heads':>5} {'kv':>4} {'TFLOPS':>8} {'ms':>8}  {'study #trial':<40} config")
    lines = [head]
    for r in rows:
        ms = f"{r.time_ms:8.3f}" if r.time_ms is not None else f"{'-':>8}"
        origin = f"{r.study or '-'} #{r.trial if r.trial is not None else '-'}"
        lines.append(f"{r.gpu_name[:16]:<16} {r.arch:<6} {r.dtype:<5} {r.head_dim:>4} {str(r.causal).lower():<6} "
                     f"{r.seqlen:>7} {r.seqlen_k:>8} {r.batch:>5} {r.heads:>5} {r.kv_heads:>4} {r.tflops:8.1f} {ms}  "
                     f"{origin:<40} {r.config_key}")
    return "\n".join(lines)


def explain(args: argparse.Namespace) -> int:
    from autotune.runtime import lookup as runtime

    if args.seqlen is None:
        print("autotune best: --explain needs --seqlen", file=sys.stderr)
        return USAGE_ERROR
    try:
        shape = space.Shape(batch=args.batch, heads=args.heads, kv_heads=args.kv_heads, seqlen_q=args.seqlen,
                            head_dim=args.head_dim or 128, dtype=args.dtype or "fp16", causal=bool(args.causal))
        arch = space.get_arch(args.arch) if args.arch else None
    except ValueError as err:
        print(f"autotune best: {err}", file=sys.stderr)
        return USAGE_ERROR
    gpu_name = args.gpu
    if gpu_name is None or arch is None:
        try:
            import torch

            if not torch.cuda.is_available():
                raise RuntimeError
            gpu_name = gpu_name or torch.cuda.get_device_name()
            arch = arch or space.get_arch(torch.cuda.get_device_capability())
        except Exception:
            print("autotune best: no CUDA GPU visible; pass --gpu 'NVIDIA H200' --arch sm_90 with --explain",
                  file=sys.stderr)
            return USAGE_ERROR
    print(runtime.select_config(shape, gpu_name, arch, args.storage).explain())
    return 0


def run(args: argparse.Namespace) -> int:
    from autotune.store import storage_url

    if args.explain:
        return explain(args)
    from autotune.store.best_table import BestStore, StoreError

    try:
        filters = filters_from_args(args)
        with BestStore(args.storage) as store:
            rows = store.all_rows(**filters)
            where = storage_url.describe(store.url)
    except (ValueError, StoreError) as err:
        print(f"autotune best: {err}", file=sys.stderr)
        return USAGE_ERROR
    if args.json:
        print(json.dumps([r.to_json() for r in rows], indent=2, sort_keys=True))
    else:
        print(format_rows(rows))
        print(f"({len(rows)} row(s) from {where})")
    return 0
