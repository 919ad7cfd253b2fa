"""The whole H200 matrix campaign on a CPU, with nothing compiled or timed: what it costs besides the GPU and nvcc.

Runs the real campaign (autotune/search/campaign_run.py: one evaluator process, the shared builder, every shape's
search with its Optuna study on a SQLite file, warm starts, re-timing, storing, the table) with two stand-ins:
a builder that writes a placeholder cubin per (config, problem) instead of calling nvcc, and the tests' evaluator
double (tests/search_doubles.py, in its child process) that answers at once with a made-up figure. So the
seconds it prints are the campaign's own overhead per shape on this machine (asks, tells, study loads), and the
counts are what the GPU host will do: evaluations (trials + re-timings) and distinct binaries per group. Then

    estimate per shape = overhead + evaluations × EVAL_S + binaries / JOBS × COMPILE_S

with EVAL_S, JOBS and COMPILE_S from the H200 measurements named below (override with the flags).

    python3 benchmarks/campaign_dry_run.py [--file studies/campaigns/h200-matrix.toml] [--limit N]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]
# the evaluation child is a fresh interpreter: it finds the double through PYTHONPATH
os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])
os.environ["AUTOTUNE_DOUBLE_ARCH"] = "sm_90"

import space  # noqa: E402
from autotune.build.builder import BuildResult  # noqa: E402
from autotune.build.ptxas import BuildReport  # noqa: E402
from autotune.search import campaign, campaign_run, campaign_table  # noqa: E402
from autotune.search.loop import SearchOptions  # noqa: E402

# The 60-trial d128 fp16 search on the H200 (docs/benchmarks.md): a 42.6 s trial loop of which 19.2 s idle waiting
# for builds, for 60 evaluations and 5 spill-pruned builds: (42.6 - 19.2) / 60 ≈ 0.39 s per evaluation.
EVAL_S = 0.39
# The recorded wgmma landscapes (studies/landscapes/*.json, `compile_seconds` of each row): median 1.1-1.3 s per
# nvcc call on the H200 host, which runs 16 of them at once.
COMPILE_S = 1.3
JOBS = 16


class PlaceholderBuilder:
    """Builds nothing: a small file per (config, problem) stands for its cubin; every config compiles, no spills."""

    def __init__(self, arch, directory: Path):
        self.arch, self.directory, self.jobs = arch, directory, JOBS
        self.kernels_dir = None
        self.built: set[tuple] = set()

    def build(self, items, progress=None):
        out = []
        for config, problem in items:
            key = hashlib.sha256(f"{config.key}|{problem.key}".encode()).hexdigest()
            path = self.directory / f"{key}.cubin"
            path.write_bytes(key.encode())
            self.built.add((config.key, problem))
            report = BuildReport(registers=128, spill_stores=0, spill_loads=0, stack_bytes=0, smem_static=0,
                                 compile_seconds=COMPILE_S)
            out.append(BuildResult(config, problem, self.arch, True, path, report, None, False, key, key))
        return out

    def build_one(self, config, problem):
        return self.build([(config, problem)])[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--file", default=str(REPO / "studies" / "campaigns" / "h200-matrix.toml"))
    ap.add_argument("--limit", type=int, default=None, help="only the first N shapes (in run order)")
    ap.add_argument("--eval-s", type=float, default=EVAL_S)
    ap.add_argument("--compile-s", type=float, default=COMPILE_S)
    ap.add_argument("--jobs", type=int, default=JOBS)
    ap.add_argument("--db-dir", default=None, help="where the SQLite storage goes (default: a temporary directory)")
    args = ap.parse_args()

    import search_doubles
    from autotune.measure.child_process import Evaluator

    work = Path(tempfile.mkdtemp(prefix="campaign-dry-run-"))
    os.environ["AUTOTUNE_DOUBLE_LOG"] = str(work / "calls.jsonl")
    entries = campaign.load(args.file)
    base = SearchOptions(shape=entries[0].shape, storage=f"sqlite:///{Path(args.db_dir or work) / 'dry.db'}", arch="sm_90",
                         evaluator="search_doubles:evaluate", jobs=args.jobs)
    plans = campaign.neighbour_order(campaign.plan(entries, base))[:args.limit]
    builder = PlaceholderBuilder(space.get_arch("sm_90"), work)
    evaluator = Evaluator("search_doubles:evaluate", timeout=60)
    plugs = campaign_run.Plugs(evaluator, campaign_run.SharedBuilder(builder), search_doubles.GPU_NAME)
    started = time.monotonic()
    done = campaign_run.run(plans, log=lambda line: print(line) if line.startswith(("campaign", "time:", "warm", "  GPU idle", "  stopped")) else None,
                            plugs=plugs)
    wall = time.monotonic() - started
    calls = [json.loads(x) for x in (work / "calls.jsonl").read_text().splitlines()]
    evaluations = sum(c["call"] == "evaluate" for c in calls)
    rows = campaign_table.shape_rows(plans, done.gpu_name)
    groups = {p.shape.problem for p in plans}
    n = len(plans)
    overhead = wall / n
    gpu = evaluations / n * args.eval_s
    nvcc = len(builder.built) / n / args.jobs * args.compile_s
    print(f"\n{n} shapes in {len(groups)} compile groups: {wall:.0f} s of campaign overhead on this CPU "
          f"({overhead:.1f} s per shape), {evaluations} evaluations ({evaluations / n:.1f} per shape: trials and "
          f"re-timings), {len(builder.built)} distinct binaries ({len(builder.built) / len(groups):.0f} per group)")
    print(f"estimate per shape on the H200: {overhead:.1f} s overhead + {gpu:.1f} s evaluating "
          f"({args.eval_s} s each) + {nvcc:.1f} s compiling ({args.compile_s} s per nvcc call, {args.jobs} at once) "
          f"= {overhead + gpu + nvcc:.1f} s, {n * (overhead + gpu + nvcc) / 60:.1f} min for the matrix; not counted: "
          "the peers' timing in each re-timing (3 SDPA backends and FlashAttention-4, its first call per problem "
          "compiling it)")
    print(campaign_table.summary_line(rows))


if __name__ == "__main__":
    main()
