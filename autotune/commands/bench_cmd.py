"""`autotune bench`: check and time configs beside torch SDPA's flash, cuDNN and memory-efficient backends.

Every config is checked against the fp32 reference before it is timed; all rows use one measurement discipline
(autotune.measure.timing.bench). TFLOPS = 4·B·H·Nq·Nk·D / time, halved for causal. "vs flash" and "vs cuDNN" are
speed ratios (their time / ours): above 1 means faster than that backend.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from .check_cmd import (USAGE_ERROR, add_shape_arguments, build_configs, gpu_arch, parse_config,
                        shape_from_args)

BACKENDS = ("flash", "cudnn", "efficient")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("bench", help="time configs beside torch SDPA backends", description=__doc__)
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


def table(rows: list[dict]) -> str:
    """Plain-text table of the rows (name, median ms, TFLOPS, vs flash, vs cuDNN, status)."""
    width = max(len(r["name"]) for r in rows)
    lines = [f"{'name':<{width}}  {'median ms':>10}  {'TFLOPS':>8}  {'vs flash':>8}  {'vs cuDNN':>8}  status"]
    for r in rows:
        lines.append(f"{r['name']:<{width}}  {_fmt(r['median_ms'], '10.4f')}  {_fmt(r['tflops'], '8.1f')}  "
                     f"{_fmt(r['vs_flash'], '8.2f')}  {_fmt(r['vs_cudnn'], '8.2f')}  {r['status']}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    shape = shape_from_args(args, "bench")
    if shape is None:
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

    from autotune.measure.evaluate import evaluate, sdpa_baselines_with_reasons

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
        print("timing torch SDPA backends ...", file=sys.stderr, flush=True)
        baselines, reasons = sdpa_baselines_with_reasons(shape, BACKENDS, **timing_args)
    sdpa_rows = []
    for name in BACKENDS:
        t = baselines.get(name)
        sdpa_rows.append({
            "name": f"sdpa_{name}", "kind": "sdpa", "status": "complete" if t else f"refused: {reasons.get(name)}",
            "median_ms": t.median_ms if t else None, "tflops": shape.tflops(t.median_ms / 1e3) if t else None,
            **({"p20_ms": t.p20_ms, "p80_ms": t.p80_ms, "min_ms": t.min_ms, "n_reps": t.n} if t else {}),
        })
    rows = sdpa_rows + rows
    flash_ms = baselines["flash"].median_ms if baselines.get("flash") else None
    cudnn_ms = baselines["cudnn"].median_ms if baselines.get("cudnn") else None
    for r in rows:
        r["vs_flash"], r["vs_cudnn"] = _ratio(r["median_ms"], flash_ms), _ratio(r["median_ms"], cudnn_ms)

    print(f"{shape.key} (layout {args.layout}) on {torch.cuda.get_device_name()} ({arch.name})")
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"shape": dataclasses.asdict(shape), "layout": args.layout,
                                               "gpu": torch.cuda.get_device_name(), "arch": arch.name,
                                               "rows": rows}, indent=2, default=str) + "\n")
    return 1 if failed else 0
