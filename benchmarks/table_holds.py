#!/usr/bin/env python3
"""Does the shipped H200 table hold on another day? Each row re-timed beside its shape's campaign finalists.

    # on the workstation, after a campaign (CPU): the finalists the check needs, from the campaign's storage
    PYTHONPATH=. python3 benchmarks/table_holds.py --write-finalists sqlite:///studies/campaign-h200.db
    # on the GPU host, another day or host than the campaign's: every row, one evaluator session
    PYTHONPATH=. python3 benchmarks/table_holds.py [--rounds 6] [--band 0.015] [--shapes d128-fp16 ...]
    # the fake GPU (tests/search_doubles.py), no nvcc: a placeholder file for each cubin
    PYTHONPATH=.:tests AUTOTUNE_DOUBLE_ARCH=sm_90 python3 benchmarks/table_holds.py \\
        --evaluator search_doubles:evaluate --fake-builder

For each shape of the finalists file (default studies/finalists/h200.json): the config the table
(default studies/tuned/h200.json) serves for it and the shape's finalists are built (one parallel build of every
shape's configs first) and timed interleaved, --rounds rounds each, in one evaluator session; the best finalist
is chosen on the even rounds, and a row holds when its config's median over the odd rounds is within --band of
that finalist's (autotune/search/table_check.py says why). Prints a markdown
table and writes it, with the figures as JSON, to $OUT (the GPU host) or --out-dir. --budget-s stops before a
shape whose timing would start after that many seconds; the shapes left are listed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT, ROOT / "benchmarks"):  # run from a checkout without installing
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

DEFAULT_TABLE = ROOT / "studies" / "tuned" / "h200.json"
DEFAULT_FINALISTS = ROOT / "studies" / "finalists" / "h200.json"


def log(text: str) -> None:
    print(text, flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    from autotune.search import table_check

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--write-finalists", metavar="STORAGE_URL", default=None,
                   help="write the finalists file from a campaign's storage and exit (no GPU)")
    p.add_argument("--merge", action="store_true",
                   help="with --write-finalists: keep the file's shapes whose study the storage has not (a storage "
                        "that tuned some shapes, as `autotune export --merge`)")
    p.add_argument("--finalists", default=str(DEFAULT_FINALISTS), help="the finalists file (default: %(default)s)")
    p.add_argument("--table", default=str(DEFAULT_TABLE), help="the shipped table (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=table_check.DEFAULT_ROUNDS,
                   help="interleaved rounds per config (default %(default)s)")
    p.add_argument("--band", type=float, default=table_check.DEFAULT_BAND,
                   help="how far behind its best finalist a row may be and hold, as a fraction (default %(default)s)")
    p.add_argument("--shapes", nargs="*", default=None, metavar="SUBSTRING",
                   help="only the shapes whose key contains one of these (e.g. d128-fp16)")
    p.add_argument("--budget-s", type=float, default=480.0,
                   help="start no shape's timing after this many seconds (default %(default)s)")
    p.add_argument("--evaluator", default=None, metavar="MODULE:FUNCTION", help="default: the search's evaluator")
    p.add_argument("--fake-builder", action="store_true", help="a placeholder file for each cubin, no nvcc (with the fake evaluator; tests)")
    p.add_argument("--jobs", type=int, default=None, help="parallel nvcc (default: the Builder's)")
    p.add_argument("--cache-dir", default=None, help="kernel cache (default: the Builder's)")
    p.add_argument("--out-dir", default=None, help="where to write (default: $OUT, else the current directory)")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds: expected a count ≥ 1, got {args.rounds}")
    if not 0 <= args.band < 1:
        p.error(f"--band: expected a fraction in [0, 1), got {args.band}")
    return args


def open_builder(args, arch):
    if args.fake_builder:  # a small file stands for each cubin (the campaign's dry run's builder)
        import tempfile

        from campaign_dry_run import PlaceholderBuilder

        return PlaceholderBuilder(arch, Path(tempfile.mkdtemp(prefix="table-holds-")))
    from autotune.build.builder import Builder

    return Builder(arch, cache_dir=args.cache_dir, jobs=args.jobs)


def main(argv=None) -> int:
    import space
    from autotune.measure.child_process import DEFAULT_EVALUATOR, Evaluator
    from autotune.search import table_check
    from autotune.search.loop import choose_arch

    args = parse_args(argv)
    if args.write_finalists:
        items = table_check.from_storage(args.write_finalists)
        if not items:
            log(f"table_holds: {args.write_finalists} holds no study with a second pass; nothing written")
            return 1
        source, kept = args.write_finalists, 0
        if args.merge and Path(args.finalists).exists():
            before = table_check.read(args.finalists)
            fresh, items = len(items), table_check.merged(before, items)
            kept = len(items) - fresh
            source = f"{args.write_finalists}, merged into {json.loads(Path(args.finalists).read_text())['source']}"
        path = table_check.write(args.finalists, items, source)
        log(f"wrote {len(items)} shape(s)' finalists to {path}" + (f" ({kept} kept from the file)" if args.merge else ""))
        return 0

    items = table_check.read(args.finalists)
    if args.shapes:
        items = [i for i in items if any(s in i.shape.key for s in args.shapes)]
    if not items:
        log("table_holds: no shape to check")
        return 1
    rows = json.loads(Path(args.table).read_text())["rows"]
    out_dir = Path(args.out_dir or os.environ.get("OUT") or ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    evaluator = Evaluator(args.evaluator or DEFAULT_EVALUATOR)
    verdicts, left, info = [], [], {}
    try:
        info = evaluator.device_info()
        log(f"table_holds: {len(items)} shape(s) on {info.get('gpu_name')} ({info.get('arch')}), {args.rounds} "
            f"round(s), band {100 * args.band:.1f} %; table {args.table}")
        arch = choose_arch(None, info.get("arch"))
        builder = open_builder(args, arch)
        served = {i.study: table_check.served_config(rows, i) for i in items}
        wanted = []  # every shape's configs in one build, so nvcc runs in parallel once
        for i in items:
            for key in {k for _, k, _, _ in i.finalists} | ({served[i.study]} - {None}):
                wanted.append((space.Config.from_key(key), i.shape.problem))
        results = builder.build(wanted)
        failed = [r for r in results if not r.ok]
        log(f"built {len(results)} config(s) in {time.monotonic() - started:.0f} s" +
            (f"; {len(failed)} failed" if failed else ""))
        for n, item in enumerate(items, 1):
            if time.monotonic() - started > args.budget_s:
                left = items[n - 1:]
                break
            v = table_check.check_shape(item, served[item.study], builder, evaluator, rounds=args.rounds,
                                        band=args.band, log=log)
            verdicts.append(v)
            write_results(out_dir, verdicts, items[n:], args, info, partial=n < len(items))
            ratio = f"{v.ratio:.3f}" if v.ratio is not None else "-"
            log(f"[{n}/{len(items)}] {v.shape_key}: served {v.served_tflops or 0:.1f}, best {v.best_tflops or 0:.1f} "
                f"TFLOPS, {ratio}: {'holds' if v.holds else 'does not hold'}")
    finally:
        evaluator.close()
    log("\n" + write_results(out_dir, verdicts, left, args, info))
    return 0 if verdicts and all(v.holds for v in verdicts) and not left else 2


def write_results(out_dir: Path, verdicts: list, left: list, args, info: dict, partial: bool = False) -> str:
    """table-holds.md and table-holds.json in out_dir, rewritten after every shape, so a run killed at its time
    limit still returns the shapes it checked; returns the markdown."""
    from autotune.search import table_check

    table = table_check.markdown(verdicts)
    if left:
        why = "not reached yet" if partial else f"--budget-s {args.budget_s:.0f} reached"
        table += f"\n\nnot checked ({why}): " + ", ".join(i.shape.key for i in left)
    for name, text in (("table-holds.md", table + "\n"), ("table-holds.json", json.dumps(
            {"gpu": info.get("gpu_name"), "rounds": args.rounds, "band": args.band, "table": str(args.table),
             "complete": not partial, "verdicts": [v.as_json() for v in verdicts],
             "not_checked": [i.shape.key for i in left]}, indent=1))):
        tmp = out_dir / (name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, out_dir / name)
    return table


if __name__ == "__main__":
    sys.exit(main())
