#!/usr/bin/env python3
"""What tail_split's cut buys and what its combine costs, as a user's call runs them (one stream, L2 warm for the
partials the kernel has just written), on the GPU.

    python benchmarks/tail_combine_cost.py [--shape KEY ...] [--config KEY ...] [--rounds 4] [--out DIR]

For each shape and config (--shape with --config; by default the d128 fp16 and bf16 rows, the DiT, d64 N4096, and
the ViT with a cut forced so its cost shows, each with the config autotune.attention picks for it on this GPU: the
shipped table's), three variants of one prepared launch are timed with
autotune.measure.timing.bench (L2 flushed before each repetition, CUDA events around the call), interleaved over
rounds, each round starting one variant further on:

    whole        the config without the axis (tail_split=0): the last round runs whole
    cut          the tail_split=1 build, the main kernel alone (its cut tiles' O left unmerged: timing only)
    cut+combine  the same build as a user calls it: the kernel, then flash_fwd_tail_combine

Both builds are checked against the fp32 reference first (autotune.measure.check). The combine's cost in the
stream is `cut+combine - cut`, the cut's gain `whole - cut`: the figures space.wgmma.TAIL_COMBINE_COST models (in
key tiles: the table gives each shape's time per key tile of one CTA). Under ncu the combine is its cold case
(caches flushed between kernels); this is the warm one.

Output: a markdown table (printed, and OUT/tail-cost.md) and OUT/tail-cost.json.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import space  # noqa: E402
from peers_table import interleaved_best  # noqa: E402
from space import Config  # noqa: E402

# the shapes timed by default, each with its shipped config; the ViT's last: the plan no longer cuts it, so the cut it
# used to make is forced (--no-force-cut: not)
DEFAULT_SHAPES = ("b4-h16-n4096-d128-fp16-full", "b4-h16-n4096-d128-bf16-full", "b1-h24-n4608-d128-bf16-full",
                  "b4-h32-n4096-d64-fp16-full", "b64-h16-n577-d64-bf16-full")
VARIANTS = ("whole", "cut", "cut+combine")


def log(*parts) -> None:
    print(*parts, flush=True)


def combine_cost_left_out():
    """tail_plan as it was before TAIL_COMBINE_COST (a cut decided on the pieces' cost alone), for shapes the plan
    now runs whole: their cut's cost, measured, is what keeps them whole. Patches sys.modules' space.wgmma, the
    module the loader's `from space.wgmma import tail_plan` reads (the `space` package's attribute can be another
    module object where a test has re-imported it)."""
    import space.wgmma  # noqa: F401  (registers it in sys.modules)

    return mock.patch.object(sys.modules["space.wgmma"], "TAIL_COMBINE_COST", 0)


def measure_row(shape_key: str, config_key: str | None, rounds: int, warmup_ms: float, rep_ms: float,
                force_cut: bool) -> dict:
    """config_key None: the config autotune.attention picks for the shape on this GPU."""
    import torch

    from autotune.build.builder import Builder
    from autotune.launch import loader
    from autotune.measure.check import check, empty_output, make_inputs
    from autotune.measure.timing import bench
    from autotune.runtime import lookup
    from h200_sweep import parse_shape

    shape = parse_shape(shape_key)
    gpu_name, arch = lookup.device_info(torch.cuda.current_device())
    config = Config.from_key(config_key) if config_key else lookup.select_config(shape, gpu_name, arch).config
    whole_cfg = config.replace(tail_split=False)
    cut_cfg = whole_cfg.replace(tail_split=True)
    for c in (whole_cfg, cut_cfg):
        if not space.is_valid(c, shape.problem, arch):
            raise ValueError(f"--config {c.key}: not valid for {shape.problem.key} on {arch.name}: "
                             f"{space.violations(c, shape.problem, arch)}")
    builds = Builder(arch).build([(whole_cfg, shape.problem), (cut_cfg, shape.problem)])
    for b in builds:
        if not b.ok or b.spilled:
            raise RuntimeError(f"{b.config.key}: {b.error or 'spilled'}")
    whole_run, cut_run = (loader.KernelRunner(b) for b in builds)
    q, k, v = make_inputs(shape, "bhnd", seed=7)
    o = empty_output(shape, "bhnd")
    whole = whole_run.prepare(q, k, v, o)
    cut = cut_run.prepare(q, k, v, o)
    note = ""
    if cut.combine is None and force_cut:
        with combine_cost_left_out():
            cut = cut_run.prepare(q, k, v, o)
            result = check(cut_run, shape, seed=3)
        note = "(cut forced: the plan runs it whole)" if cut.combine is not None else ""
    else:
        result = check(cut_run, shape, seed=3)
    checked = check(whole_run, shape, seed=3)
    if not checked.ok or not result.ok:
        raise RuntimeError(f"{shape_key}: wrong: whole {checked.message}; cut {result.message}")
    if cut.combine is None:
        return {"shape": shape_key, "config": cut_cfg.key, "note": "not cut: nothing to time", "us": {}}

    def cut_only():
        cut.kernel.launch(cut.params, cut.grid, cut.block, cut.smem_dynamic, None, cut.extra_args)

    calls = {"whole": whole, "cut": cut_only, "cut+combine": cut}
    # peers_table's rounds (each starting one variant further on, each variant its best round) over calls per us
    best_rate, _, rates = interleaved_best(list(VARIANTS), rounds, lambda name: 1e-3 / bench(
        calls[name], warmup_ms=warmup_ms, rep_ms=rep_ms).median_ms)
    best = {name: 1 / rate for name, rate in best_rate.items()}
    samples = {name: [1 / rate for rate in got] for name, got in rates.items()}
    # one CTA's time per key tile: the whole kernel over its rounds of tiles, each of key_tiles
    tiles = -(-shape.seqlen_q // cut_run.layout.rows_per_block) * shape.heads * shape.batch
    per_key_tile = best["whole"] / (tiles / whole.grid[0] * -(-shape.seqlen_k // cut_cfg.bc))
    return {"shape": shape_key, "config": cut_cfg.key, "note": note, "us": best, "samples": samples,
            "tail_full_end": cut.params.tail_full_end, "tail_ctas": cut.params.tail_ctas,
            "us_per_key_tile": per_key_tile}


def markdown(rows: list[dict]) -> str:
    lines = ["| shape | whole (us) | cut, kernel alone | cut + combine | the kernel's gain | combine in the stream | "
             "combine, key tiles |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        us = r["us"]
        if not us:
            lines.append(f"| {r['shape']} | {r['note']} | | | | | |")
            continue
        gain, combine = us["whole"] - us["cut"], us["cut+combine"] - us["cut"]
        in_tiles = combine / r["us_per_key_tile"] if r.get("us_per_key_tile") else float("nan")
        lines.append(f"| {r['shape']} | {us['whole']:.1f} | {us['cut']:.1f} | {us['cut+combine']:.1f} | "
                     f"{gain:+.1f} ({gain / us['whole']:+.1%}) | {combine:.1f} | {in_tiles:.1f} |")
    lines.append("")
    for r in rows:
        lines.append(f"- {r['shape']}: {r['config']} {r['note']}")
        for name, got in r.get("samples", {}).items():
            lines.append(f"  - {name}: " + " / ".join(f"{t:.1f}" for t in got) + " us")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", action="append", default=None, help="shape key (repeatable; with --config each)")
    ap.add_argument("--config", action="append", default=None, help="config key for the --shape at the same place")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--warmup-ms", type=float, default=25)
    ap.add_argument("--rep-ms", type=float, default=100)
    ap.add_argument("--no-force-cut", action="store_true", help="time only cuts the plan makes")
    ap.add_argument("--out", type=Path, default=Path("tail-cost-out"))
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds: expected a positive count, got {args.rounds}")
    if (args.shape is None) != (args.config is None) or (args.shape and len(args.shape) != len(args.config)):
        ap.error("--shape and --config: give both, one --config per --shape")
    rows_in = list(zip(args.shape, args.config)) if args.shape else [(key, None) for key in DEFAULT_SHAPES]
    rows = []
    for shape_key, config_key in rows_in:
        log(f"== {shape_key}")
        rows.append(measure_row(shape_key, config_key, args.rounds, args.warmup_ms, args.rep_ms,
                                not args.no_force_cut))
    table = markdown(rows)
    log(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tail-cost.md").write_text(table + "\n")
    (args.out / "tail-cost.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
