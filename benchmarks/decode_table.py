#!/usr/bin/env python3
"""Decode (a few new query tokens against a long K/V cache, grouped heads) on the GPU: our kernel beside the best
peers, timed as a server runs it, inside a captured CUDA graph.

    python benchmarks/decode_table.py [--shape KEY ...] [--sweep] [--out DIR]

Rows: the decode rows of docs/benchmarks.md (default: B1 / B32 / B128 × Nk 4096 / 32768, H32/8 d128 bf16;
B32 Nq4 Nk4096; B8 H64/8 Nk16384) or --shape keys (b32-h32-kv8-n1-k4096-d128-bf16-full, ...).
Columns: ours = `autotune.attention` exactly as a user calls it (storage, shipped tables, nearest decode row, or
the decode default: the config that ran is printed under the table); SDPA's cuDNN and flash backends with
`enable_gqa=True` (K/V heads not repeated); FlashAttention-4 (`flash_attn.cute`) where it imports. Every output is
checked against torch SDPA on the same inputs before anything is timed.

Timing: autotune.measure.timing.bench_graph, per call, the median of 15 replays of a graph of >= 16 calls that
cycle through enough copies of q/k/v (distinct buffers) that their K/V bytes exceed 2 × L2: no call reads K/V the
previous call left in L2. µs per call, K/V read rate (TB/s = 2·B·Hkv·Nk·D·2 bytes / time) and ratios; the eager
L2-flushed median (timing.bench) is printed beside it for ours and cuDNN (it includes the host's launch path).
With --copy, the device's own rates are measured (graph-timed: a 1 GiB copy, bytes read + written; a sum over
2 GiB, bytes read) and the "% of device rate" column is against the higher of the two.

--sweep: also time a set of decode configs (splits × tile shapes, packed heads) through the loader directly, and
write the fastest per shape to OUT/decode-rows.json in the `autotune export` format (ready to be shipped in
studies/tuned/), with each config's figure in OUT/decode.json.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import space  # noqa: E402
from peers_table import parse_shape, rel_error  # noqa: E402  (same shape keys, same check against SDPA)
from space import Config, Shape  # noqa: E402

SHAPES = (
    "b1-h32-kv8-n1-k4096-d128-bf16-full", "b1-h32-kv8-n1-k32768-d128-bf16-full",
    "b32-h32-kv8-n1-k4096-d128-bf16-full", "b32-h32-kv8-n1-k32768-d128-bf16-full",
    "b128-h32-kv8-n1-k4096-d128-bf16-full", "b128-h32-kv8-n1-k32768-d128-bf16-full",
    "b32-h32-kv8-n4-k4096-d128-bf16-full", "b8-h64-kv8-n1-k16384-d128-bf16-full",
)
PEERS = ("sdpa_cudnn", "sdpa_flash", "fa4")
TOLERANCE = 2e-2            # relative error vs torch SDPA in the same dtype (as benchmarks/peers_table.py)
L2_ROTATION_BYTES = 2 * 60 << 20  # K/V bytes the rotated copies cover at least (H200 L2: 60 MB)
MAX_COPIES = 32
# --sweep's tile shapes: (consumer warpgroups, Bc, stages, min_blocks, overlap), each with every split count
# that leaves two key tiles per split, packed heads; and the decode default unpacked, to show what packing gives.
SWEEP_TILES = ((1, 128, 3, 1, True), (1, 128, 2, 1, True), (1, 64, 4, 1, True), (1, 128, 2, 1, False),
               (1, 192, 2, 1, True), (1, 128, 3, 1, False), (1, 96, 4, 1, False), (1, 80, 5, 1, False),
               (1, 80, 5, 1, True), (1, 64, 6, 1, False), (1, 64, 6, 1, True),
               # two CTAs per SM (twice the independent K/V streams, each with its own ring)
               (1, 64, 2, 2, False), (1, 64, 3, 2, False))
SWEEP_SPLITS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)


def copies_for(shape: Shape) -> int:
    return max(1, min(MAX_COPIES, -(-L2_ROTATION_BYTES // shape.kv_bytes)))


def inputs(shape: Shape, n: int, seed: int = 1):
    from autotune.measure.check import make_inputs

    return [make_inputs(shape, "bhnd", seed=seed + i) for i in range(n)]


def sweep_configs(shape: Shape, tiles=SWEEP_TILES) -> list[Config]:
    n_tiles = lambda bc: -(-shape.seqlen_k // bc)  # noqa: E731
    out = [space.default_config_for_shape(shape, space.get_arch("sm_90"))]
    out.append(out[0].replace(pack_gqa=False))
    for wgs, bc, stages, mb, ov in tiles:
        for s in SWEEP_SPLITS:
            if s > 1 and n_tiles(bc) // s < 2:
                continue
            c = Config.make("wgmma", consumer_wgs=wgs, bc=bc, stages=stages, setmaxnreg=wgs > 1, overlap=ov,
                            pingpong=wgs == 2, o_store="direct", min_blocks=mb, kv_splits=s,
                            pack_gqa=shape.heads > shape.kv_heads)
            if space.is_valid(c, shape.problem, space.get_arch("sm_90")):
                out.append(c)
    return list(dict.fromkeys(out))


def graph_us(fns) -> float:
    from autotune.measure.timing import bench_graph

    return bench_graph(fns).median_ms * 1e3


def measure(shape: Shape, sweep: bool, builder, eager: bool, tiles=SWEEP_TILES) -> dict:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import autotune
    from autotune.launch.loader import KernelRunner

    sets = inputs(shape, copies_for(shape))
    gqa = shape.heads != shape.kv_heads
    row: dict = {"shape": shape.key, "kv_bytes": shape.kv_bytes, "copies": len(sets), "us": {}, "notes": {},
                 "eager_us": {}}
    with torch.no_grad():
        wants = [F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa) for q, k, v in sets]

        def timed(name, fn):
            err = max(rel_error(fn(*s), w) for s, w in zip(sets, wants))
            if not err <= TOLERANCE:
                row["notes"][name] = f"wrong: relative error {err:.3g} vs SDPA"
                return
            row["us"][name] = graph_us([lambda s=s: fn(*s) for s in sets])
            if eager and name in ("ours", "sdpa_cudnn"):
                from autotune.measure.timing import bench
                q, k, v = sets[0]
                row["eager_us"][name] = bench(lambda: fn(q, k, v), warmup_ms=10, rep_ms=50).median_ms * 1e3

        timed("ours", lambda q, k, v: autotune.attention(q, k, v))
        row["config"] = autotune.explain(*sets[0]).splitlines()[0]
        for name, backend in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
            def sdpa(q, k, v, backend=backend):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
            try:
                timed(name, sdpa)
            except RuntimeError as e:
                row["notes"][name] = f"refused: {str(e).splitlines()[0]}"
        try:
            from flash_attn.cute import flash_attn_func

            def fa4(q, k, v):
                out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
                return (out[0] if isinstance(out, tuple) else out).transpose(1, 2)
            timed("fa4", fa4)
        except Exception as e:  # not installed, or refuses the shape
            row["notes"]["fa4"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"

        if sweep:
            configs = sweep_configs(shape, tiles)
            results = builder.build([(c, shape.problem) for c in configs])
            row["sweep"] = []
            for c, r in zip(configs, results):
                entry = {"config": c.key}
                if not r.ok or r.spilled:
                    entry["note"] = "build failed" if not r.ok else f"spills {r.report.spill_stores} B"
                    row["sweep"].append(entry)
                    continue
                runner = KernelRunner(r)

                def run(q, k, v, runner=runner):
                    return runner(q, k, v)
                err = max(rel_error(run(*s), w) for s, w in zip(sets, wants))
                if not err <= TOLERANCE:
                    entry["note"] = f"wrong: relative error {err:.3g}"
                else:
                    entry["us"] = graph_us([lambda s=s: run(*s) for s in sets])
                row["sweep"].append(entry)
            timedc = [e for e in row["sweep"] if "us" in e]
            if timedc:
                row["sweep_best"] = min(timedc, key=lambda e: e["us"])
    peers = [row["us"][p] for p in PEERS if p in row["us"]]
    row["best_peer_us"] = min(peers) if peers else None
    return row


def device_rates_tbs() -> tuple[float, float]:
    """(copy, read) rates of the device in TB/s, graph-timed: a 1 GiB copy counted as bytes read + written, and a
    sum over 2 GiB (bytes read), the yardstick of a kernel that only reads."""
    import torch

    src = torch.ones(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_us = graph_us([lambda: dst.copy_(src)])
    big = torch.ones(1 << 29, dtype=torch.float32, device="cuda")
    acc = torch.empty((), dtype=torch.float32, device="cuda")
    read_us = graph_us([lambda: torch.sum(big, dim=0, out=acc)])
    return 2 * src.numel() / (copy_us * 1e-6) / 1e12, big.numel() * 4 / (read_us * 1e-6) / 1e12


def markdown(rows: list[dict], copy_tbs: float | None) -> str:
    def tbs(row, us):
        return row["kv_bytes"] / (us * 1e-6) / 1e12

    head = "| shape | ours µs (TB/s) | SDPA cuDNN µs | SDPA flash µs | FlashAttention-4 µs | ours / best |"
    lines = [head + (" ours % of device rate |" if copy_tbs else ""),
             "|---|---|---|---|---|---|" + ("---|" if copy_tbs else "")]
    for r in rows:
        us = r["us"]
        cells = []
        for name in ("ours",) + PEERS:
            t = us.get(name)
            if t is None:
                cells.append("—")
            elif name == "ours":
                cells.append(f"{t:.1f} ({tbs(r, t):.2f})")
            else:
                cells.append(f"**{t:.1f}**" if t == r["best_peer_us"] else f"{t:.1f}")
        ratio = f"{r['best_peer_us'] / us['ours']:.2f}×" if "ours" in us and r["best_peer_us"] else "—"
        line = f"| {r['shape']} | " + " | ".join(cells) + f" | {ratio} |"
        if copy_tbs:
            line += f" {100 * tbs(r, us['ours']) / copy_tbs:.0f} % |" if "ours" in us else " — |"
        lines.append(line)
    lines.append("")
    for r in rows:
        lines.append(f"- {r['shape']}: {r['config']}" + (f"; eager (L2 flushed) µs: " + ", ".join(
            f"{k} {v:.1f}" for k, v in r["eager_us"].items()) if r["eager_us"] else ""))
        for name, note in r["notes"].items():
            lines.append(f"  - {name}: {note}")
        if "sweep_best" in r:
            b = r["sweep_best"]
            lines.append(f"  - sweep best ({len(r['sweep'])} configs): {b['us']:.1f} µs {b['config']}")
    return "\n".join(lines)


def shipped_rows(rows: list[dict], shapes: list[Shape], builder) -> list[dict]:
    """The sweep's fastest config per shape as `autotune export` rows (studies/tuned/ format)."""
    import torch

    from autotune.build.builder import provenance
    from autotune.store.best_table import BestEntry

    gpu = torch.cuda.get_device_name()
    prov = provenance(builder, ("wgmma",))
    out = []
    for r, shape in zip(rows, shapes):
        best = r.get("sweep_best")
        if not best:
            continue
        config = Config.from_key(best["config"])
        seconds = best["us"] * 1e-6
        e = BestEntry.for_shape(shape, gpu, "sm_90", config, shape.tflops(seconds), time_ms=best["us"] / 1e3,
                                study=f"decode-sweep-{shape.key}", trial=0, **prov)
        d = {k: getattr(e, k) for k in e.__dataclass_fields__}
        d["created"] = e.created.isoformat().replace("+00:00", "Z")
        out.append(d)
    return out


def sm90_builder():
    """The runtime's kernel builder for sm_90, with one nvcc job per CPU (the rows' configs build up front)."""
    import os

    from autotune.runtime.lookup import builder as runtime_builder

    builder = runtime_builder(space.get_arch("sm_90"))
    builder.jobs = max(1, os.cpu_count() or 1)
    return builder


def measure_rows(shapes, builder, sweep: bool = False, eager: bool = False, tiles=SWEEP_TILES,
                 after_each=None) -> list[dict]:
    """measure() per shape with a progress line on stderr; `after_each(rows)` after every row (e.g. to save them)."""
    rows = []
    for shape in shapes:
        t0 = time.monotonic()
        rows.append(measure(shape, sweep, builder, eager, tiles))
        print(f"{shape.key}: {({k: round(v, 1) for k, v in rows[-1]['us'].items()})} µs "
              f"({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)
        if after_each is not None:
            after_each(rows)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", action="append", type=parse_shape, default=None, help="shape key (repeatable)")
    ap.add_argument("--sweep", action="store_true", help="also time a set of decode configs per shape")
    ap.add_argument("--sweep-tiles", default=None,
                    help="the tile shapes --sweep times: 'wgs,bc,stages,min_blocks,overlap;...' (overlap 0/1); "
                         "default: SWEEP_TILES")
    ap.add_argument("--combine-pdl", action=argparse.BooleanOptionalAction, default=None,
                    help="launch split-KV's combine with programmatic dependent launch, or not (--no-combine-pdl); "
                         "default: the product's choice, loader.COMBINE_PROGRAMMATIC (on; AUTOTUNE_COMBINE_PDL=0 off)")
    ap.add_argument("--copy", action="store_true", help="measure the device copy rate for the %% column")
    ap.add_argument("--eager", action="store_true", help="also the eager L2-flushed median for ours and cuDNN")
    ap.add_argument("--out", type=Path, default=Path("decode-out"))
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("decode_table: needs a CUDA GPU", file=sys.stderr)
        return 2
    from autotune.launch import loader

    if args.combine_pdl is not None:
        loader.COMBINE_PROGRAMMATIC = args.combine_pdl

    builder = sm90_builder()
    shapes = args.shape or [parse_shape(k) for k in SHAPES]
    tiles = SWEEP_TILES
    if args.sweep_tiles:
        try:
            tiles = tuple(tuple(int(x) for x in t.split(",")) for t in args.sweep_tiles.split(";") if t)
            tiles = tuple((w, bc, st, mb, bool(ov)) for w, bc, st, mb, ov in tiles)
        except ValueError:
            ap.error(f"--sweep-tiles: expected 'wgs,bc,stages,min_blocks,overlap;...', got {args.sweep_tiles!r}")
    args.out.mkdir(parents=True, exist_ok=True)
    copy_tbs, read_tbs = device_rates_tbs() if args.copy else (None, None)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
            "command": " ".join(sys.argv), "copy_tbs": copy_tbs, "read_tbs": read_tbs,
            "combine_programmatic": loader.COMBINE_PROGRAMMATIC}
    save = lambda rows: (args.out / "decode.json").write_text(  # noqa: E731  (a killed run keeps its rows)
        json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    rows = measure_rows(shapes, builder, args.sweep, args.eager, tiles, after_each=save)
    if args.sweep:
        table = {"format": "autotune-best", "schema_version": 1, "rows": shipped_rows(rows, shapes, builder)}
        (args.out / "decode-rows.json").write_text(json.dumps(table, indent=2, default=str) + "\n")
    print(f"\n{meta['gpu']}, torch {meta['torch']}, {meta['date']}"
          + (f"; device copy {copy_tbs:.2f} TB/s (read + write), read {read_tbs:.2f} TB/s (a sum)" if copy_tbs
             else "") + "\n")
    print(markdown(rows, max(copy_tbs, read_tbs) if copy_tbs else None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
