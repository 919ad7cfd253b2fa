"""`autotune bench`: check and time configs beside torch SDPA's flash, cuDNN and memory-efficient backends, and
FlashAttention-4 where it is installed (`pip install 'autotune[peers]'`; skipped with the reason otherwise).

Every config is checked against the fp32 reference before it is timed (FlashAttention-4 against torch SDPA); all
rows use one measurement discipline (autotune.measure.timing.bench). TFLOPS = 4·B·H·Nq·Nk·D / time, halved for causal.
"vs flash", "vs cuDNN", "vs FA4" and "vs best" are speed ratios (their time / ours; best: the fastest of those
three): above 1 means faster than that kernel.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from .check_cmd import (USAGE_ERROR, add_shape_arguments, build_configs, config_key_error, gpu_arch, parse_config,
                        shape_from_args)

BACKENDS = ("flash", "cudnn", "efficient", "fa4")
BAR = ("flash", "cudnn", "fa4")  # the peers a config has to beat: "vs best" is against the fastest of them


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("bench",
                              help="time configs beside torch SDPA backends and FlashAttention-4 (needs a GPU)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", action="append", default=None, metavar="KEY",
                   help="config key (repeatable; default: the heuristic default)")
    add_shape_arguments(p, seqlen=4096, batch=4, heads=16)
    p.add_argument("--warmup-ms", type=float, default=25.0, help="warm-up per measurement (default 25)")
    p.add_argument("--rep-ms", type=float, default=100.0, help="timed repetitions per measurement (default 100)")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the rows as JSON")
    p.set_defaults(run=run)


def _ratio(ours_ms, theirs_ms) -> float | None:
    return theirs_ms / ours_ms if ours_ms and theirs_ms else None


def _fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def table(rows: list[dict], kv_bytes: int | None = None) -> str:
    """Plain-text table of the rows (name, median ms, TFLOPS, vs flash, vs cuDNN, vs FA4, vs best, status); with
    kv_bytes (decode shapes, memory-bound) also µs and the K/V read rate in TB/s."""
    width = max(len(r["name"]) for r in rows)
    rate_head = f"  {'µs':>9}  {'K/V TB/s':>8}" if kv_bytes else ""
    lines = [f"{'name':<{width}}  {'median ms':>10}  {'TFLOPS':>8}{rate_head}  {'vs flash':>8}  {'vs cuDNN':>8}  "
             f"{'vs FA4':>8}  {'vs best':>8}  status"]
    for r in rows:
        ms = r["median_ms"]
        rate = ""
        if kv_bytes:
            rate = (f"  {_fmt(ms * 1e3 if ms else None, '9.1f')}  "
                    f"{_fmt(kv_bytes / (ms * 1e-3) / 1e12 if ms else None, '8.2f')}")
        lines.append(f"{r['name']:<{width}}  {_fmt(ms, '10.4f')}  {_fmt(r['tflops'], '8.1f')}{rate}  "
                     f"{_fmt(r['vs_flash'], '8.2f')}  {_fmt(r['vs_cudnn'], '8.2f')}  {_fmt(r.get('vs_fa4'), '8.2f')}  "
                     f"{_fmt(r.get('vs_best'), '8.2f')}  {r['status']}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    shape = shape_from_args(args, "bench")
    if shape is None:
        return USAGE_ERROR
    errors = [e for e in (config_key_error(k, "bench") for k in args.config or []) if e]
    if errors:  # before the GPU: a typo is a typo on any machine
        print("\n".join(errors), file=sys.stderr)
        return USAGE_ERROR
    arch = gpu_arch(args, "bench")
    if arch is None:
        return USAGE_ERROR
    configs = [parse_config(k, shape.problem, arch, "bench") for k in (args.config or [None])]
    if any(c is None for c in configs):
        return USAGE_ERROR
    builds = build_configs(configs, shape.problem, arch, args.cache_dir, "bench")
    if builds is None:
        return USAGE_ERROR

    import torch

    from autotune.measure.evaluate import PEERS, evaluate, sdpa_baselines_with_reasons

    timing_args = dict(layout=args.layout, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms)
    rows: list[dict] = []
    failed = False
    context_lost_by = None
    for build in builds:
        row = {"name": build.config.key, "kind": "config", "median_ms": None, "tflops": None}
        if not build.ok:
            row.update(status=f"{build.status}: {(build.error or '').splitlines()[0] if build.error else ''}")
            failed = True
        elif context_lost_by:
            row.update(status=f"not run: the CUDA context was lost after {context_lost_by}")
            failed = True
        else:
            print(f"checking and timing {build.config.key} ...", file=sys.stderr, flush=True)
            ev = evaluate(build, shape, **timing_args)
            row.update(ev.as_dict(), name=build.config.key, kind="config")
            row["status"] = ev.status if ev.ok else f"{ev.status}: {ev.reason}"
            if build.spilled:
                row["status"] += f" (spills {build.report.spill_stores}/{build.report.spill_loads} B)"
            failed |= not ev.ok
            if ev.context_lost:
                context_lost_by = build.config.key
        rows.append(row)

    if context_lost_by:
        baselines, reasons = {b: None for b in BACKENDS}, {b: "not run: CUDA context lost" for b in BACKENDS}
    else:
        print("timing torch SDPA backends and FlashAttention-4 ...", file=sys.stderr, flush=True)
        baselines, reasons = sdpa_baselines_with_reasons(shape, BACKENDS, **timing_args)
    sdpa_rows = []
    for name in BACKENDS:
        t = baselines.get(name)
        sdpa_rows.append({
            "name": name if name in PEERS else f"sdpa_{name}", "kind": "peer" if name in PEERS else "sdpa", "status": "complete" if t else f"refused: {reasons.get(name)}",
            "median_ms": t.median_ms if t else None, "tflops": shape.tflops(t.median_ms / 1e3) if t else None,
            **({"p20_ms": t.p20_ms, "p80_ms": t.p80_ms, "min_ms": t.min_ms, "n_reps": t.n} if t else {}),
        })
    rows = sdpa_rows + rows
    peer_ms = {name: baselines[name].median_ms for name in BAR if baselines.get(name)}
    best_ms = min(peer_ms.values(), default=None)
    for r in rows:
        for name in BAR:
            r[f"vs_{name}"] = _ratio(r["median_ms"], peer_ms.get(name))
        r["vs_best"] = _ratio(r["median_ms"], best_ms)

    print(f"{shape.key} (layout {args.layout}) on {torch.cuda.get_device_name()} ({arch.name})")
    print(table(rows, shape.kv_bytes if shape.is_decode else None))
    if args.json:
        Path(args.json).write_text(json.dumps({"shape": dataclasses.asdict(shape), "layout": args.layout,
                                               "gpu": torch.cuda.get_device_name(), "arch": arch.name,
                                               "rows": rows}, indent=2, default=str) + "\n")
    return 1 if failed else 0
