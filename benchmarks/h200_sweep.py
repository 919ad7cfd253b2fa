#!/usr/bin/env python3
"""One GPU sweep: build a diverse set of configs per shape, check them, time the correct ones, compare to SDPA.

    python benchmarks/h200_sweep.py [--shape KEY ...] [--per-shape 12] [--config KEY ...] [--out DIR]

For each shape (default: the five below) and each kernel family (--families, default both), the candidates are
the family's heuristic default and valid configs in order of diversity (farthest-point sampling in Hamming
distance over the axes, seeded; --per-shape × --oversample of them, since many spill), plus any --config. All
builds go through autotune.build.builder.Builder at once (jobs = CPU count). Measured, in this order: each family's
default and the --config ones (even when they spill, flagged: untuned shapes get the default), then the first
--per-shape builds of each family that do not spill, round-robin across families. Each is checked against the
fp32 reference and, if right, timed; torch SDPA's flash, cuDNN and memory-efficient backends are timed the same
way in the same process. Kernels run in a child process (autotune.measure.child_process.Worker: spawn, reused until a call
crashes or times out), so one faulting or hanging config costs one row, not the sweep.

Output: progress lines, then per shape a markdown table (top configs, the default, the baselines; TFLOPS and
speed ratio to SDPA flash and cuDNN) and the failures; the same tables in OUT/sweep.md and everything in
OUT/sweep.json (rewritten after each shape, so a run cut short keeps what it measured). --budget-s stops
starting new measurements once spent (shared fairly among the shapes still to do).

--build-only works without a GPU (pass --arch): it builds everything and prints the build outcomes.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import random
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

import space  # noqa: E402
from space import Config, Problem, Shape  # noqa: E402

DEFAULT_SHAPES = (
    "b4-h16-n4096-d128-fp16-full",
    "b4-h16-n4096-d128-fp16-causal",
    "b4-h32-n4096-d64-fp16-full",
    "b4-h16-n4096-d128-bf16-full",
    "b1-h64-n1024-d128-fp16-full",
)
BACKENDS = ("flash", "cudnn", "efficient")
_SHAPE_KEY = re.compile(r"b(\d+)-h(\d+)(?:-kv(\d+))?-n(\d+)(?:-k(\d+))?-d(\d+)-(fp16|bf16)-(full|causal)")


def log(*parts) -> None:
    print(*parts, flush=True)


def parse_shape(key: str) -> Shape:
    """Inverse of space.Shape.key, e.g. 'b4-h16-n4096-d128-fp16-causal' or 'b2-h32-kv8-n1000-d64-bf16-full'."""
    m = _SHAPE_KEY.fullmatch(key.strip())
    if not m:
        raise ValueError(f"shape: expected a key like 'b4-h16-n4096-d128-fp16-full' (optional -kvK, -kN), got {key!r}")
    b, h, kv, n, nk, d, dtype, mask = m.groups()
    return Shape(batch=int(b), heads=int(h), kv_heads=int(kv) if kv else None, seqlen_q=int(n),
                 seqlen_k=int(nk) if nk else None, head_dim=int(d), dtype=dtype, causal=mask == "causal")


def diverse_configs(problem: Problem, arch: space.Arch, n: int, seed: int, family: str) -> list[Config]:
    """The family's heuristic default, then n valid configs each as far (Hamming, over the axes) as possible from
    those already chosen; ties go to a seeded shuffle, so the order is deterministic but not axis-ordered."""
    chosen = [space.default_config(problem, arch, family)]
    pool = [c for c in space.valid_configs(problem, arch, (family,)) if c != chosen[0]]
    random.Random(f"{seed}-{problem.key}-{family}").shuffle(pool)

    def distance(a: Config, b: Config) -> int:
        return sum(x != y for x, y in zip(a.values, b.values))

    far = [distance(c, chosen[0]) for c in pool]
    for _ in range(min(n, len(pool))):
        i = max(range(len(pool)), key=far.__getitem__)
        chosen.append(pool[i])
        far = [min(f, distance(c, pool[i])) for f, c in zip(far, pool)]
        far[i] = -1
    return chosen


def measurement_order(per_family: dict[str, list], forced, per_shape: int) -> tuple[list, dict[str, int]]:
    """(builds to measure, {reason: count} of the others): the forced builds first (each family's default and
    --config; measured even when they spill), then the first per_shape non-spilling sampled builds of each family,
    taken round-robin across families so a budget cut leaves every family represented."""
    dropped: dict[str, int] = {}
    todo = [b for b in forced if b.ok]
    for b in forced:
        if not b.ok:
            dropped[b.status] = dropped.get(b.status, 0) + 1
    queues = []
    for builds in per_family.values():
        queue = []
        for b in builds:
            if b in forced:
                continue
            if b.ok and not b.spilled and len(queue) < per_shape:
                queue.append(b)
            else:
                why = b.status if not b.ok or b.spilled else "unused_sample"
                dropped[why] = dropped.get(why, 0) + 1
        queues.append(queue)
    for i in range(max((len(q) for q in queues), default=0)):
        todo += [q[i] for q in queues if i < len(q)]
    return todo, dropped


# ---- measuring -------------------------------------------------------------------------------------------------

class Runner:
    """The child process that runs kernels, and what to do when a call kills it."""

    def __init__(self, timeout_s: float):
        from autotune.measure.child_process import Worker

        self.timeout_s = timeout_s
        self.worker = Worker(warmup=("torch.cuda:init", ()))

    def evaluate(self, build, shape: Shape, seed: int, layout: str, warmup_ms: float, rep_ms: float):
        from autotune.measure.evaluate import Evaluation

        result = self.worker.call("autotune.measure.evaluate:evaluate", build, shape, seed, layout, False, warmup_ms, rep_ms,
                                  timeout=self.timeout_s)
        if result.ok:
            ev = result.value
            if ev.context_lost:
                self.worker.stop()  # a fault poisoned that process's CUDA context: start a fresh one
            return ev
        status = "timeout" if result.status == "timeout" else "crashed"
        return Evaluation(status, build.config.key, shape.key, reason=result.reason.strip().splitlines()[-1]
                          if result.reason else result.status, context_lost=True)

    def baselines(self, shape: Shape, layout: str, warmup_ms: float, rep_ms: float):
        result = self.worker.call("autotune.measure.evaluate:sdpa_baselines_with_reasons", shape, BACKENDS, layout,
                                  warmup_ms, rep_ms, timeout=4 * self.timeout_s)
        if result.ok:
            return result.value
        why = f"{result.status}: {result.reason.strip().splitlines()[-1] if result.reason else ''}"
        return {b: None for b in BACKENDS}, {b: why for b in BACKENDS}

    def device(self) -> dict:
        result = self.worker.call("torch.cuda:get_device_name", timeout=self.timeout_s)
        return {"gpu_name": result.value if result.ok else f"unknown ({result.status})"}

    def close(self) -> None:
        self.worker.stop()


def _row(ev, build, default_keys: set) -> dict:
    row = ev.as_dict()
    row["is_default"] = ev.config_key in default_keys
    if build is not None and build.report is not None:
        row["build"] = {**build.report.as_dict(), "cached": build.cached, "cubin_hash": build.cubin_hash}
    return row


def _ratio(ours_ms, theirs_ms):
    return theirs_ms / ours_ms if ours_ms and theirs_ms else None


def _f(x, spec):
    return "-" if x is None else format(x, spec)


def shape_table(shape_result: dict, top: int) -> str:
    """Markdown: baselines, the top `top` configs by TFLOPS, and the default if it is not among them."""
    flash = shape_result["baselines"].get("flash")
    cudnn = shape_result["baselines"].get("cudnn")
    flash_ms = flash["median_ms"] if flash else None
    cudnn_ms = cudnn["median_ms"] if cudnn else None
    done = sorted((r for r in shape_result["configs"] if r["status"] == "complete"), key=lambda r: -r["tflops"])
    shown = done[:top] + [r for r in done[top:] if r["is_default"]]
    lines = [f"### {shape_result['shape_key']}", "",
             "| # | config | median ms | p20-p80 ms | TFLOPS | vs flash | vs cuDNN | regs | CTAs/SM | max err (torch) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name in BACKENDS:
        t = shape_result["baselines"].get(name)
        if t:
            lines.append(f"| | **sdpa_{name}** | {t['median_ms']:.4f} | {t['p20_ms']:.4f}-{t['p80_ms']:.4f} | "
                         f"{t['tflops']:.1f} | {_f(_ratio(t['median_ms'], flash_ms), '.2f')} | "
                         f"{_f(_ratio(t['median_ms'], cudnn_ms), '.2f')} | | | |")
        else:
            why = shape_result["baseline_reasons"].get(name, "")[:80]
            lines.append(f"| | **sdpa_{name}** | refused: {why} | | | | | | | |")
    for r in shown:
        rank = done.index(r) + 1
        label = f"`{r['config_key']}`" + (" (default)" if r["is_default"] else "")
        lines.append(f"| {rank} | {label} | {r['median_ms']:.4f} | {r['p20_ms']:.4f}-{r['p80_ms']:.4f} | "
                     f"{r['tflops']:.1f} | {_f(_ratio(r['median_ms'], flash_ms), '.2f')} | "
                     f"{_f(_ratio(r['median_ms'], cudnn_ms), '.2f')} | {_f(r['registers'], 'd')} | "
                     f"{_f(r['blocks_per_sm'], 'd')} | {r['max_error']:.2g} ({r['torch_error']:.2g}) |")
    counts: dict[str, int] = {}
    for r in shape_result["configs"]:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    for status, n in sorted(shape_result["dropped"].items()):
        counts[status] = counts.get(status, 0) + n
    lines += ["", "outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))]
    bad = [r for r in shape_result["configs"] if r["status"] in ("wrong", "crashed", "timeout")]
    for r in bad:
        lines.append(f"- {r['status']}: `{r['config_key']}`: {r['reason'][:300]}")
    return "\n".join(lines) + "\n"


# ---- main ------------------------------------------------------------------------------------------------------

def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", action="append", default=None, metavar="KEY",
                   help=f"shape key (repeatable; default: {', '.join(DEFAULT_SHAPES)})")
    p.add_argument("--per-shape", type=int, default=12,
                   help="non-spilling sampled configs measured per shape and family, besides the defaults (12)")
    p.add_argument("--oversample", type=int, default=3,
                   help="build this many times --per-shape candidates, since many spill (3)")
    p.add_argument("--config", action="append", default=[], metavar="KEY", help="also try this config (repeatable)")
    p.add_argument("--families", default="mma_sync,wgmma",
                   help="comma-separated kernel families to sample, those the arch lacks are skipped (mma_sync,wgmma)")
    p.add_argument("--arch", default=None, help="default: the visible GPU's (required with --build-only on CPU)")
    p.add_argument("--out", default=os.environ.get("OUT", "sweep_out"), help="output directory (default $OUT)")
    p.add_argument("--cache-dir", default=None, help="kernel cache (default: the Builder's)")
    p.add_argument("--jobs", type=int, default=None, help="parallel compiles (default: CPU count)")
    p.add_argument("--layout", default="bhnd", choices=("bhnd", "bnhd"))
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per config before its worker is killed")
    p.add_argument("--budget-s", type=float, default=420.0, help="stop starting measurements after this long")
    p.add_argument("--warmup-ms", type=float, default=25.0)
    p.add_argument("--rep-ms", type=float, default=100.0)
    p.add_argument("--top", type=int, default=10, help="configs per table")
    p.add_argument("--seed", type=int, default=0, help="sampling and input seed")
    p.add_argument("--build-only", action="store_true", help="build and report, measure nothing (no GPU needed)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    t_start = time.monotonic()
    shapes = [parse_shape(k) for k in (args.shape or DEFAULT_SHAPES)]
    families = tuple(f.strip() for f in args.families.split(",") if f.strip())
    if args.arch:
        arch = space.get_arch(args.arch)
    else:
        from autotune.launch.gpu_arch import detect_arch

        arch = detect_arch()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    for family in set(families) | {k.partition(":")[0] for k in args.config}:
        importlib.import_module(f"space.{family}")  # registers the family
    families = tuple(f for f in families if f in arch.families)
    extra = [Config.from_key(k) for k in args.config]
    # Candidates per problem and family (shapes of one problem share builds), then one parallel build of all.
    candidates: dict[Problem, dict[str, list[Config]]] = {}
    for shape in shapes:
        if shape.problem not in candidates:
            candidates[shape.problem] = {
                f: diverse_configs(shape.problem, arch, args.per_shape * args.oversample, args.seed, f)
                for f in families}
    items = list(dict.fromkeys([(c, p) for p, per in candidates.items() for cs in per.values() for c in cs]
                               + [(c, p) for p in candidates for c in extra]))
    log(f"building {len(items)} (config, problem) pairs for {arch.name} "
        f"({', '.join(p.key for p in candidates)}) ...")

    from autotune.build.builder import Builder

    builder = Builder(arch, cache_dir=args.cache_dir, jobs=args.jobs)
    step = max(1, len(items) // 10)

    def progress(done, total, result):
        if done % step == 0 or done == total:
            log(f"  built {done}/{total} ({time.monotonic() - t_start:.0f} s)")

    builds = {(r.config, r.problem): r for r in builder.build(items, progress=progress)}
    by_status: dict[str, int] = {}
    for r in builds.values():
        by_status[r.status] = by_status.get(r.status, 0) + 1
    log(f"builds: {by_status} in {time.monotonic() - t_start:.0f} s")
    for r in builds.values():
        if r.status in ("compile_error", "invalid"):
            log(f"  {r.status}: {r.config.key} {r.problem.key}: {(r.error or '').splitlines()[0][:200]}")
    if args.build_only:
        for r in builds.values():
            rep = r.report
            log(f"  {r.status:<13} {r.problem.key:<18} {r.config.key}"
                + (f"  regs {rep.registers} spill {rep.spill_stores}/{rep.spill_loads}" if rep else ""))
        return 0 if all(r.ok for r in builds.values()) else 1

    runner = Runner(args.timeout)
    results: dict = {"arch": arch.name, "layout": args.layout, "seed": args.seed, "shapes": []}
    results.update(runner.device())
    try:
        import torch

        results["torch"] = torch.__version__
    except ImportError:
        pass
    markdown: list[str] = [f"# {results.get('gpu_name')} ({arch.name}), layout {args.layout}\n"]
    try:
        for si, shape in enumerate(shapes):
            shape_t0 = time.monotonic()
            remaining = args.budget_s - (shape_t0 - t_start)
            deadline = shape_t0 + max(0.0, remaining) / (len(shapes) - si)
            defaults = [space.default_config(shape.problem, arch, f) for f in families]
            default_keys = {c.key for c in defaults}
            log(f"[{si + 1}/{len(shapes)}] {shape.key}: timing SDPA backends ...")
            timings, reasons = runner.baselines(shape, args.layout, args.warmup_ms, args.rep_ms)
            baselines = {}
            for name, t in timings.items():
                baselines[name] = ({**dataclasses.asdict(t), "tflops": shape.tflops(t.median_ms / 1e3)}
                                   if t is not None else None)
                log(f"  sdpa_{name}: " + (f"{t.median_ms:.4f} ms, {shape.tflops(t.median_ms / 1e3):.1f} TFLOPS"
                                          if t else f"refused: {reasons.get(name)}"))
            shape_result = {"shape_key": shape.key, "shape": dataclasses.asdict(shape), "baselines": baselines,
                            "baseline_reasons": reasons, "configs": [], "dropped": {}}
            per_family = {f: [builds[(c, shape.problem)] for c in cs] for f, cs in candidates[shape.problem].items()}
            forced = list(dict.fromkeys(builds[(c, shape.problem)] for c in defaults + extra))
            todo, shape_result["dropped"] = measurement_order(per_family, forced, args.per_shape)
            by_hash: dict[str, dict] = {}  # identical cubins are measured once
            for ci, b in enumerate(todo):
                if time.monotonic() > deadline:
                    left = len(todo) - ci
                    shape_result["dropped"]["skipped_budget"] = left
                    log(f"  budget for this shape spent: {left} configs not measured")
                    break
                if b.cubin_hash and b.cubin_hash in by_hash:
                    row = {**by_hash[b.cubin_hash], "config_key": b.config.key,
                           "is_default": b.config.key in default_keys,
                           "same_cubin_as": by_hash[b.cubin_hash]["config_key"]}
                else:
                    ev = runner.evaluate(b, shape, args.seed, args.layout, args.warmup_ms, args.rep_ms)
                    row = _row(ev, b, default_keys)
                    if b.cubin_hash:
                        by_hash[b.cubin_hash] = row
                shape_result["configs"].append(row)
                detail = (f"{row['median_ms']:.4f} ms {row['tflops']:.1f} TFLOPS" if row["status"] == "complete"
                          else row["reason"][:160])
                log(f"  [{ci + 1}/{len(todo)}] {row['status']:<8} {detail}  {b.config.key}"
                    + ("  (spills)" if b.spilled else ""))
            results["shapes"].append(shape_result)
            table = shape_table(shape_result, args.top)
            markdown.append(table)
            log("")
            log(table)
            (out / "sweep.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
            (out / "sweep.md").write_text("\n".join(markdown))
    finally:
        runner.close()

    log("summary (best config vs SDPA flash / cuDNN):")
    for s in results["shapes"]:
        done = [r for r in s["configs"] if r["status"] == "complete"]
        best = max(done, key=lambda r: r["tflops"]) if done else None
        flash, cudnn = s["baselines"].get("flash"), s["baselines"].get("cudnn")
        log(f"  {s['shape_key']:<32} " + (
            f"{best['tflops']:.1f} TFLOPS, x{_f(_ratio(best['median_ms'], flash and flash['median_ms']), '.2f')} "
            f"flash, x{_f(_ratio(best['median_ms'], cudnn and cudnn['median_ms']), '.2f')} cuDNN  {best['config_key']}"
            if best else "no correct config"))
    log(f"wrote {out / 'sweep.json'} and {out / 'sweep.md'} in {time.monotonic() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
