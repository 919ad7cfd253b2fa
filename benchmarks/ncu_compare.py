#!/usr/bin/env python3
"""Our kernel and FlashAttention-4's side by side under Nsight Compute, one shape, one ncu run.

    benchmarks/ncu_compare.sh [SHAPE_KEY] OUT_DIR          # the wrapper: runs ncu over `profile`, then `table`
    python benchmarks/ncu_compare.py profile [--shape KEY]  # the workload ncu profiles (see below)
    python benchmarks/ncu_compare.py table RAW.csv          # ncu's raw CSV → the markdown table

`profile` warms up `autotune.attention` (the config a user gets: storage, shipped table, nearest, default) and
FlashAttention-4 outside the profiled range (first calls build, load and JIT-compile), then runs each once
between cudaProfilerStart/Stop, so ncu (`--profile-from-start off`) sees exactly the two attention kernels.
`table` keeps the metrics that say where the time goes: tensor-pipe (wgmma) activity, issue-slot use, the
stall reasons per issued instruction, L2 hit rate, DRAM throughput, registers, occupancy and the launch shape.
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

# (label, ncu metric) in the table's order; the stall rows are added from whatever ncu reported.
METRICS = (
    ("duration (us)", "gpu__time_duration.sum"),
    # Hopper's wgmma runs on the "tensor" pipe (sm__pipe_tensor_op_gmma_* is not a metric ncu 2025.3 knows)
    ("tensor pipe active, % of peak", "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"),
    ("SM throughput, % of peak", "sm__throughput.avg.pct_of_peak_sustained_elapsed"),
    ("issue slots busy, %", "sm__inst_issued.avg.pct_of_peak_sustained_active"),
    ("warp cycles per issued instruction", "smsp__average_warp_latency_per_inst_issued.ratio"),
    ("instructions issued (M)", "smsp__inst_executed.sum"),
    ("L2 hit rate, %", "lts__t_sector_hit_rate.pct"),
    # every request the SMs make of L2 (hit or miss): K/V tiles re-read by each CTA of a head, Q, O
    ("L2 throughput, % of peak", "lts__throughput.avg.pct_of_peak_sustained_elapsed"),
    ("L2 bytes (MB)", "lts__t_bytes.sum"),
    ("DRAM throughput, % of peak", "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
    ("DRAM bytes read (MB)", "dram__bytes_read.sum"),
    ("DRAM read rate (GB/s)", "dram__bytes_read.sum.per_second"),
    ("registers per thread", "launch__registers_per_thread"),
    ("threads per block", "launch__block_size"),
    ("grid size (CTAs)", "launch__grid_size"),
    ("dynamic smem per block (KB)", "launch__shared_mem_per_block_dynamic"),
    ("achieved occupancy, %", "sm__warps_active.avg.pct_of_peak_sustained_active"),
)
STALL_PREFIX = "smsp__average_warps_issue_stalled_"
STALL_SUFFIX = "_per_issue_active.ratio"
METRIC_ARG = ",".join(m for _, m in METRICS) + f",regex:{STALL_PREFIX}.*{STALL_SUFFIX}"
# The same without a regex, for an ncu that refuses one inside a list: the stall reasons ncu documents.
STALL_REASONS = ("barrier", "branch_resolving", "dispatch_stall", "drain", "imc_miss", "lg_throttle",
                 "long_scoreboard", "math_pipe_throttle", "membar", "mio_throttle", "misc", "no_instruction",
                 "not_selected", "selected", "short_scoreboard", "sleeping", "tex_throttle", "wait")
METRIC_ARG_EXPLICIT = ",".join([m for _, m in METRICS] + [f"{STALL_PREFIX}{r}{STALL_SUFFIX}" for r in STALL_REASONS])


def profile(shape_key: str, ours_only: bool = False, peers: tuple[str, ...] = ("fa4",),
            configs: tuple[str, ...] = (), configs_only: bool = False) -> None:
    """Profiled, in order: autotune.attention (left out with `configs_only`), each of `configs` (config keys, run
    through the loader), then the peers (fa4: FlashAttention-4; cudnn / flash: SDPA's backend, enable_gqa where
    K/V heads are grouped)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import autotune
    import space
    from autotune.launch.loader import KernelRunner
    from autotune.measure.check import make_inputs
    from autotune.runtime.lookup import builder as runtime_builder
    from peers_table import parse_shape

    shape = parse_shape(shape_key)
    q, k, v = make_inputs(shape, "bhnd", seed=1)
    qn, kn, vn = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    gqa = shape.heads != shape.kv_heads
    if configs_only and not configs:
        raise SystemExit("--configs-only: expected at least one --config")
    calls = [] if configs_only else [lambda: autotune.attention(q, k, v, causal=shape.causal)]
    if configs:
        builder = runtime_builder(space.get_arch("sm_90"))
        for result in builder.build([(space.Config.from_key(key), shape.problem) for key in configs]):
            if not result.ok:
                raise SystemExit(f"--config {result.config.key}: the build failed")
            calls.append(lambda runner=KernelRunner(result): runner(q, k, v))
    for peer in () if ours_only else peers:
        if peer == "fa4":
            from flash_attn.cute import flash_attn_func
            calls.append(lambda: flash_attn_func(qn, kn, vn, causal=shape.causal))
        elif peer in ("cudnn", "flash"):
            backend = SDPBackend.CUDNN_ATTENTION if peer == "cudnn" else SDPBackend.FLASH_ATTENTION

            def sdpa(backend=backend):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=shape.causal, enable_gqa=gqa)
            calls.append(sdpa)
        else:
            raise SystemExit(f"--peers: expected fa4, cudnn or flash, got {peer!r}")
    print(autotune.explain(q, k, v, causal=shape.causal), file=sys.stderr)
    with torch.no_grad():
        for _ in range(3):  # build/load ours, JIT-compile theirs, settle clocks
            for call in calls:
                call()
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        for call in calls:
            call()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def table(raw_csv: Path) -> str:
    """ncu --page raw --csv: a header row of metric names, a row of units, then one row per kernel."""
    lines = [line for line in raw_csv.read_text().splitlines() if line.startswith('"')]
    rows = list(csv.reader(lines))
    if len(rows) < 3:
        raise SystemExit(f"{raw_csv}: no kernel rows (ncu output, not a raw CSV?)")
    header, units, kernels = rows[0], rows[1], rows[2:]
    col = {name: i for i, name in enumerate(header)}
    names = [k[col["Kernel Name"]] for k in kernels]
    # ours: flash_fwd_wgmma / flash_fwd_mma_sync; FlashAttention-4's CuTe DSL name also contains "flash_fwd"
    labels = ["ours" if n.startswith("flash_fwd_") else "FlashAttention-4" if "flash_attn" in n else n[:30]
              for n in names]
    if labels.count("ours") > 1:  # autotune.attention, then each --config, each maybe with its combine kernel
        runs = iter(range(1, len(labels) + 1))
        labels = [("ours combine" if "combine" in n else f"ours #{next(runs)}") if lab == "ours" else lab
                  for lab, n in zip(labels, names)]
    scale = {"gpu__time_duration.sum": 1e-3, "smsp__inst_executed.sum": 1e-6,
             "launch__shared_mem_per_block_dynamic": 1 / 1024}
    byte_units = {"byte": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12}  # ncu picks the prefix
    out = ["| metric | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]

    def add(label, metric):
        if metric not in col:
            return
        unit = units[col[metric]]
        factor = scale.get(metric, 1.0)
        if metric == "gpu__time_duration.sum" and unit in ("usecond", "us"):
            factor = 1.0
        if metric.endswith(("bytes_read.sum", "bytes.sum")):  # shown in MB
            factor = byte_units.get(unit.lower(), 1) / 1e6
        vals = [_number(k[col[metric]]) for k in kernels]
        if metric.endswith(".per_second"):  # ncu picks the prefix (Gbyte/s, Tbyte/s): say which
            label = f"{label.split(' (')[0]} ({unit})"
        out.append(f"| {label} | " + " | ".join("—" if x is None else f"{x * factor:.3g}" for x in vals) + " |")

    for label, metric in METRICS:
        add(label, metric)
    stalls = [m for m in header if m.startswith(STALL_PREFIX) and m.endswith(STALL_SUFFIX)]
    # Largest stall reasons first (by the larger of the two kernels), the negligible ones left out.
    stalls.sort(key=lambda m: -max(_number(k[col[m]]) or 0 for k in kernels))
    for m in stalls:
        if max(_number(k[col[m]]) or 0 for k in kernels) >= 0.05:
            add(f"stall: {m[len(STALL_PREFIX):-len(STALL_SUFFIX)]} (warps per issue)", m)
    out.append("")
    out += [f"- {label}: `{name[:160]}`" for label, name in zip(labels, names)]
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("profile")
    p.add_argument("--shape", default="b4-h16-n4096-d128-fp16-full")
    p.add_argument("--ours-only", action="store_true", help="profile only our kernel (FlashAttention-4 not needed)")
    p.add_argument("--peers", default="fa4", help="comma-separated peers to profile: fa4, cudnn, flash")
    p.add_argument("--config", action="append", default=[], help="also this config key, through the loader")
    p.add_argument("--configs-only", action="store_true",
                   help="profile the --config kernels without autotune.attention's own choice")
    t = sub.add_parser("table")
    t.add_argument("raw_csv", type=Path)
    m = sub.add_parser("metrics", help="print the --metrics argument for ncu")
    m.add_argument("--explicit", action="store_true", help="list the stall reasons instead of a regex")
    args = ap.parse_args(argv)
    if args.cmd == "profile":
        profile(args.shape, args.ours_only, tuple(x for x in args.peers.split(",") if x), tuple(args.config),
                args.configs_only)
    elif args.cmd == "table":
        print(table(args.raw_csv))
    else:
        print(METRIC_ARG_EXPLICIT if args.explicit else METRIC_ARG)
    return 0


if __name__ == "__main__":
    sys.exit(main())
