#!/usr/bin/env python3
"""Re-measure the top configs of recorded landscapes in this GPU session, and record the session in the files.

    PYTHONPATH=. python3 benchmarks/landscape_noise.py                        # the shipped landscapes, GPU
    PYTHONPATH=. python3 benchmarks/landscape_noise.py --band                 # CPU: the noise band, no GPU
    PYTHONPATH=.:tests AUTOTUNE_DOUBLE_ARCH=sm_90 python3 benchmarks/landscape_noise.py \\
        --evaluator search_doubles:evaluate --top 2 FILE.json                  # fake GPU

For each landscape (default: studies/landscapes/*.json): its top --top complete rows (one per cubin) are built
again (cache hits after the first run on a host) and timed interleaved, --rounds rounds, in one evaluator session
with the landscapes' own lean evaluation (autotune.landscapes.sweep_eval, as recorded); the next landscape builds
while this one is measured. The session (date, GPU, kernel source hash, nvcc) goes into the file's header and
each re-measured row gets this session's median, rounds and spread (autotune/landscapes/noise.py). A table per
landscape: config, recorded TFLOPS, this session's median, spread of the rounds, rank change.

Run it in two or three separate GPU sessions (copy the files it writes back into studies/landscapes/ between
them); `--band` then prints each landscape's noise band across the sessions that measured the same kernel
sources: the figure docs/search.md reads search quality against.

Files: with $OUT set (the GPU machine, where only $OUT comes back) the updated landscapes go to $OUT/landscapes/
and the tables to $OUT/landscape_noise.txt; without it the files are updated in place. --budget-s stops before
a landscape whose measuring would start after that many seconds (what was measured is saved).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

DEFAULT_DIR = ROOT / "studies" / "landscapes"


def log(text: str) -> None:
    print(text, flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    from autotune.landscapes.noise import DEFAULT_ROUNDS, DEFAULT_TOP

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="*", help="landscape files (default: studies/landscapes/*.json)")
    p.add_argument("--top", type=int, default=DEFAULT_TOP, help=f"configs per landscape (default {DEFAULT_TOP})")
    p.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS,
                   help=f"interleaved rounds per config (default {DEFAULT_ROUNDS})")
    p.add_argument("--band", action="store_true", help="print the noise band of the files and exit (no GPU)")
    p.add_argument("--evaluator", default=None, metavar="MODULE:FUNCTION",
                   help="default: the landscapes' lean evaluation (tests: a fake one)")
    p.add_argument("--jobs", type=int, default=None, help="parallel nvcc (default: CPU count - 2)")
    p.add_argument("--arch", default=None, help="build for this arch (default: each landscape's)")
    p.add_argument("--cache-dir", default=None, help="kernel cache (default: the Builder's)")
    p.add_argument("--out-dir", default=None, help="where to write (default: $OUT/landscapes, else in place)")
    p.add_argument("--budget-s", type=float, default=200.0,
                   help="start no landscape's measuring after this many seconds (default 200)")
    args = p.parse_args(argv)
    for name in ("top", "rounds"):
        if getattr(args, name) < 1:
            p.error(f"--{name}: expected a count ≥ 1, got {getattr(args, name)}")
    return args


def band(paths: list[Path]) -> int:
    from autotune.landscapes import landscape_file
    from autotune.landscapes.noise import noise_band

    status = 0
    for path in paths:
        try:
            log(noise_band(landscape_file.load(path)).describe())
        except ValueError as e:  # LandscapeError is one too
            log(str(e))
            status = 1
    return status


def measure(paths: list[Path], args, out_dir: Path | None) -> tuple[int, list[str]]:
    from autotune.build.builder import Builder, provenance
    from autotune.landscapes import landscape_file
    import space
    from autotune.landscapes.noise import format_table, noise_band, remeasure, top_rows
    from autotune.landscapes.sweep import SWEEP_EVALUATOR
    from autotune.measure.child_process import Evaluator

    started = time.monotonic()
    landscapes = [landscape_file.load(p) for p in paths]
    spec = args.evaluator or SWEEP_EVALUATOR
    jobs = args.jobs or max(1, (os.cpu_count() or 1) - 2)
    builders = {}
    for ls in landscapes:
        arch = args.arch or ls.header["arch"]
        if arch not in builders:
            builders[arch] = Builder(space.get_arch(arch), cache_dir=args.cache_dir, jobs=jobs)
    lines: list[str] = []
    status = 0
    # Builds run one landscape ahead in a background thread (nvcc processes): the GPU measures one landscape
    # while the next compiles.
    with Evaluator(spec, timeout=60.0) as evaluator, concurrent.futures.ThreadPoolExecutor(1) as pool:
        evaluator.prestart()  # its torch import and CUDA context overlap the first builds
        pending = [pool.submit(builders[args.arch or ls.header["arch"]].build,
                               [(r.config, ls.shape.problem) for r in top_rows(ls, args.top)]) for ls in landscapes]
        info = evaluator.device_info()
        gpu_name = str(info.get("gpu_name") or "unknown-gpu")
        for ls, future in zip(landscapes, pending):
            builder = builders[args.arch or ls.header["arch"]]
            builds = future.result()
            if time.monotonic() - started > args.budget_s:
                lines.append(f"{ls.name}: skipped, --budget-s {args.budget_s:g} s reached")
                status = 1
                continue
            prov = provenance(builder, ls.families)
            if prov.get("kernel_source_hash") != ls.header.get("kernel_source_hash"):
                lines.append(f"{ls.name}: note: recorded with other kernel sources than this session's; the "
                             "recorded figures and ranks are not directly comparable")
            t0 = time.monotonic()
            session = remeasure(ls, builder, evaluator, gpu_name=gpu_name,
                                kernel_source_hash=prov.get("kernel_source_hash", "unknown"),
                                nvcc_version=prov.get("nvcc_version", "unknown"), evaluator_name=spec,
                                top=args.top, rounds=args.rounds, builds=builds, log=log)
            path = ls.save(out_dir / ls.path.name if out_dir else ls.path)
            table = format_table(ls, session["id"]) + [f"  {time.monotonic() - t0:.1f} s measuring; written to {path}"]
            try:
                table.append("  " + noise_band(ls).describe())
            except ValueError as e:  # fewer than two sessions of these sources so far
                table.append(f"  no noise band yet: {e}")
            log("\n".join(table))
            lines += table
    lines.append(f"total {time.monotonic() - started:.0f} s on {gpu_name}")
    return status, lines


def main(argv=None) -> int:
    args = parse_args(argv)
    paths = [Path(f) for f in args.files] or sorted(DEFAULT_DIR.glob("*.json"))
    if not paths:
        log(f"no landscape files given and none in {DEFAULT_DIR}")
        return 2
    if args.band:
        return band(paths)
    out_env = os.environ.get("OUT")
    out_dir = Path(args.out_dir) if args.out_dir else (Path(out_env) / "landscapes" if out_env else None)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    status, lines = measure(paths, args, out_dir)
    log("")
    log("\n".join(lines))
    if out_env:
        (Path(out_env) / "landscape_noise.txt").write_text("\n".join(lines) + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
