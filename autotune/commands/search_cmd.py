"""`autotune search`: find the fastest valid configuration of the kernel for one shape on this GPU.

An Optuna study over the design space: invalid configs are rejected before nvcc, builds run ahead of the GPU,
each survivor is checked against a reference and timed in a child process, and the winner (re-timed next to
the SDPA baselines) is stored as the best config for the shape. Running the same command again resumes the
study. Needs a CUDA GPU; for compile-only work without one, use `autotune space --compile`.
"""
from __future__ import annotations

import argparse
import sys

import space

from . import causal_flag

USAGE_ERROR = 2
NO_RESULT = 1
INTERRUPTED = 130  # Ctrl-C, after the summary (the shell's convention: 128 + SIGINT)


# Shape flags default to None so that a --replay landscape can supply the shape; these fill the rest.
SHAPE_DEFAULTS = {"seqlen": 4096, "seqlen_k": None, "batch": 4, "heads": 16, "kv_heads": None, "head_dim": 128,
                  "dtype": "fp16", "causal": False}


def add_shape_arguments(p, several_seqlens: bool = False) -> None:
    """The shape flags (shared with `autotune sweep`). several_seqlens: --seqlen takes a list (a campaign)."""
    shape = p.add_argument_group("shape")
    if several_seqlens:
        shape.add_argument("--seqlen", type=int, nargs="+", default=None, metavar="N",
                           help="query sequence length (default 4096); several values tune each shape in turn, "
                                "warm-starting each from the ones tuned before (as `autotune campaign`)")
    else:
        shape.add_argument("--seqlen", type=int, default=None, help="query sequence length (default 4096)")
    shape.add_argument("--seqlen-k", type=int, default=None, help="key/value sequence length (default: --seqlen)")
    shape.add_argument("--batch", type=int, default=None, help="batch size (default 4)")
    shape.add_argument("--heads", type=int, default=None, help="query heads (default 16)")
    shape.add_argument("--kv-heads", type=int, default=None, help="key/value heads, dividing --heads (default: --heads)")
    shape.add_argument("--head-dim", type=int, default=None, choices=space.HEAD_DIMS, help="head dimension (default 128)")
    shape.add_argument("--dtype", default=None, choices=space.DTYPES, help="element type (default fp16)")
    causal_flag.add(shape)


def shape_from_args(args: argparse.Namespace) -> space.Shape:
    """The Shape the flags describe; flags left out come from SHAPE_DEFAULTS (a replay takes its recorded shape:
    replay_shape). ValueError names the flag at fault."""
    values = {}
    for name, default in SHAPE_DEFAULTS.items():
        given = getattr(args, name)
        values[name] = given if given is not None else default
    for name in ("seqlen", "batch", "heads"):
        if values[name] < 1:
            raise ValueError(f"--{name}: expected a positive integer, got {values[name]}")
    causal, align = causal_flag.mask(values["causal"])
    try:
        return space.Shape(batch=values["batch"], heads=values["heads"], seqlen_q=values["seqlen"],
                           seqlen_k=values["seqlen_k"], head_dim=values["head_dim"], dtype=values["dtype"],
                           causal=causal, kv_heads=values["kv_heads"], causal_align=align)
    except ValueError as err:  # space says "kv_heads: must divide heads ..."; name the flag instead
        field, _, message = str(err).partition(":")
        flag = {"seqlen_q": "seqlen"}.get(field, field).replace("_", "-")
        raise ValueError(f"--{flag}:{message}") from None


def add_parser(subparsers) -> None:
    from autotune.search.coordination import DEFAULT_GRACE, DEFAULT_HEARTBEAT
    from autotune.search.sampling import SAMPLERS
    from autotune.search.loop import DEFAULT_EVAL_TIMEOUT, DEFAULT_TRIALS

    p = subparsers.add_parser("search",
                              help="search the fastest kernel config for one shape (needs a GPU; --replay FILE "
                                   "needs none)",
                              description=__doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n")[1],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shape_arguments(p, several_seqlens=True)

    s = p.add_argument_group("search")
    s.add_argument("--trials", type=int, default=DEFAULT_TRIALS,
                   help=f"evaluated trials the study should reach, counting earlier runs; invalid configs "
                        f"(rejected before nvcc) and repeats do not count (default {DEFAULT_TRIALS})")
    s.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="stop starting new trials after this many seconds of the trial loop; the running "
                        "evaluation finishes, then the top configs are re-timed and stored (default: no limit)")
    s.add_argument("--sampler", default="tpe", choices=SAMPLERS,
                   help="tpe (default; multivariate, learns from failures), gp (Gaussian process), random, "
                        "brute (exhaustive)")
    s.add_argument("--seed", type=int, default=0, help="sampler seed (default 0)")
    s.add_argument("--study", default=None, metavar="NAME",
                   help="study name (default: GPU + shape, e.g. h200-b4-h16-n4096-d128-fp16-full)")
    s.add_argument("--storage", default=None, metavar="URL",
                   help="SQLAlchemy URL of the studies and the best-per-shape table (default: $AUTOTUNE_STORAGE, "
                        "else sqlite:///<repo or cwd>/studies/autotune.db)")
    s.add_argument("--arch", default=None, help="build for this arch (default: the GPU's)")
    s.add_argument("--family", action="append", default=None, metavar="NAME",
                   help="search only this kernel family (repeatable; default: every family of the arch)")
    s.add_argument("--spill-policy", default="prune", metavar="prune|allow|max-bytes=N",
                   help="builds that spill registers: prune them (default), allow them, or allow up to N bytes "
                        "of spill stores + loads")
    s.add_argument("--enqueue", action="append", default=[], metavar="CONFIG_KEY",
                   help="try this config first (repeatable), e.g. a known good one from `autotune best`")
    s.add_argument("--retime", type=int, default=5, metavar="N",
                   help="re-time at least the top N configs in one session before storing the best (default 5)")
    s.add_argument("--retime-within", type=float, default=0.03, metavar="FRACTION",
                   help="... and every other trial within FRACTION of the best trial's figure (default 0.03)")
    s.add_argument("--retime-cap", type=int, default=10, metavar="N",
                   help="... up to N finalists in all (default 10)")
    s.add_argument("--no-sweep", dest="sweep", action="store_false",
                   help="always use the sampler; by default, when the searched families have no more valid configs "
                        "than --trials, the search tries them all (docs/search.md)")
    s.add_argument("--retime-rounds", type=int, default=3, metavar="R",
                   help="rounds of that re-timing, interleaved (A B C, A B C, ...), for every finalist (default 3)")
    s.add_argument("--retime-max-rounds", type=int, default=None, metavar="R",
                   help="then more rounds for the finalists not measurably slower than the leader, until it is "
                        "separated or R rounds are spent; the fastest median is kept (default 8, docs/search.md)")
    s.add_argument("--warm-start", type=int, default=None, metavar="K",
                   help="a fresh study first tries the best K configs of the nearest tuned shapes (default 0; "
                        "4 with several --seqlen values)")

    w = p.add_argument_group("several processes and hosts (docs/distributed.md)")
    w.add_argument("--workers", type=int, default=1, metavar="N",
                   help="N worker processes on the study, spread over the visible GPUs (more workers than GPUs "
                        "share them; evaluations take turns); needs a PostgreSQL --storage. On several hosts, run "
                        "the same command with the same --storage (default 1)")
    w.add_argument("--gpus", default=None, metavar="LIST",
                   help="CUDA devices for the workers, e.g. 0,1 (default: every visible GPU)")
    w.add_argument("--heartbeat", type=int, default=DEFAULT_HEARTBEAT, metavar="SECONDS",
                   help=f"shared storages: seconds between heartbeats of the trials in flight (default "
                        f"{DEFAULT_HEARTBEAT})")
    w.add_argument("--grace", type=int, default=DEFAULT_GRACE, metavar="SECONDS",
                   help=f"shared storages: a trial without a heartbeat for this long belonged to a dead process; "
                        f"it is failed, then re-told from its measurement or re-queued (docs/distributed.md; "
                        f"default {DEFAULT_GRACE})")

    e = p.add_argument_group("build and evaluation")
    e.add_argument("--jobs", type=int, default=None, help="parallel nvcc processes (default: CPU count)")
    e.add_argument("--ahead", type=int, default=None, metavar="K",
                   help="configs asked and built per batch, ahead of the GPU (default: --jobs, at least 2; "
                        "docs/search.md measures the choice)")
    e.add_argument("--eval-timeout", type=float, default=DEFAULT_EVAL_TIMEOUT, metavar="SECONDS",
                   help=f"a trial whose evaluation takes longer is killed and recorded as timeout "
                        f"(default {DEFAULT_EVAL_TIMEOUT:g})")
    e.add_argument("--cache-dir", default=None,
                   help="kernel cache (default: $AUTOTUNE_CACHE_DIR or ~/.cache/autotune/kernels)")
    e.add_argument("--max-asks", type=int, default=None, metavar="N",
                   help="stop after N asks even if --trials is not reached (default: 30 per wanted trial + 200)")
    e.add_argument("--evaluator", default=None, metavar="MODULE:FUNCTION",
                   help="for tests and replays: evaluate with this function instead of autotune.measure:evaluate "
                        "(it runs in the child process; no GPU needed if it needs none)")
    e.add_argument("--replay", default=None, metavar="FILE",
                   help="answer every build and evaluation from a landscape recorded by `autotune sweep` (no nvcc, "
                        "no GPU; docs/search.md): the shape and arch are the recorded ones (a shape flag or --arch "
                        f"asking for others is an error), and it can vary {REPLAY_VARIES}; a config the file lacks "
                        "is an error, studies go to an in-memory database unless --storage is given, and no best "
                        "config is stored")
    e.add_argument("--replay-noise", type=int, default=None, metavar="SEED",
                   help="with --replay: each evaluation draws its figure from the landscape's recorded "
                        "re-measurement sessions (or their spread), seeded, instead of the one recorded figure, so "
                        "the finale can tie as on a GPU (docs/search.md)")
    p.set_defaults(run=run)


REPLAY_VARIES = ("--sampler, --seed, --trials, --timeout, --max-asks, --enqueue, --retime, --retime-within, "
                 "--retime-cap, --retime-rounds, --retime-max-rounds, --replay-noise, --no-sweep and --family "
                 "(among the recorded families)")


def replay_shape(args: argparse.Namespace, replay) -> space.Shape:
    """The recorded shape of a replayed landscape. A replay answers from configs timed on that shape and arch
    only, so a shape flag or --arch that asks for another one is refused, saying what a replay can vary."""
    recorded = replay.shape
    as_flags = {"seqlen": recorded.seqlen_q, "seqlen_k": recorded.seqlen_k, "batch": recorded.batch,
                "heads": recorded.heads, "kv_heads": recorded.kv_heads, "head_dim": recorded.head_dim,
                "dtype": recorded.dtype, "causal": recorded.causal_align if recorded.causal else None}
    asked_mask = causal_flag.mask(args.causal)
    nq = args.seqlen if args.seqlen is not None else recorded.seqlen_q
    nk = args.seqlen_k if args.seqlen_k is not None else (nq if args.seqlen is not None else recorded.seqlen_k)
    asked_align = space.canonical_align(*asked_mask, nq, nk) if asked_mask[0] else None
    asked = [f"--{name.replace('_', '-')} {value}"
             for name, value in ((n, getattr(args, n)) for n in SHAPE_DEFAULTS if n != "causal")
             if value is not None and value != as_flags[name]]
    if args.causal is not None and asked_align != as_flags["causal"]:
        asked.append("--causal lower_right" if asked_align == "lower_right" else "--causal")
    if args.arch is not None and space.get_arch(args.arch).name != replay.arch.name:
        asked.append(f"--arch {args.arch}")
    if asked:
        raise ValueError(
            f"--replay {args.replay}: a replay answers only from what was recorded, shape {recorded.key} on "
            f"{replay.arch.name}, so {' '.join(asked)} cannot be replayed; leave it out, or record that shape with "
            f"`autotune sweep` on a GPU. A replay can vary {REPLAY_VARIES}")
    return recorded


def _fail(message: str) -> int:
    print(f"autotune search: {message}", file=sys.stderr)
    return USAGE_ERROR


def options_from_args(args: argparse.Namespace):
    """SearchOptions from the parsed arguments; ValueError names the argument at fault."""
    from autotune.search.loop import SearchOptions
    from autotune.build.spill_policy import SpillPolicy

    replay = None
    if args.replay is not None:
        from autotune.landscapes.landscape_file import load

        replay = load(args.replay)  # LandscapeError (a ValueError) names the file
    shape = replay_shape(args, replay) if replay else shape_from_args(args)
    enqueue = []
    for key in args.enqueue:
        try:
            enqueue.append(space.Config.from_key(key))
        except (ValueError, KeyError) as err:
            raise ValueError(f"--enqueue {key}: {err}") from None
    if args.arch is not None:
        space.get_arch(args.arch)  # validates early: "arch: ..." names it
    return SearchOptions(
        shape=shape, trials=args.trials, timeout=args.timeout, sampler=args.sampler, seed=args.seed,
        storage=args.storage, study_name=args.study, arch=args.arch,
        families=tuple(args.family) if args.family else None, spill_policy=SpillPolicy.parse(args.spill_policy),
        jobs=args.jobs, ahead=args.ahead, eval_timeout=args.eval_timeout, cache_dir=args.cache_dir,
        retime_top=args.retime, retime_within=args.retime_within, retime_cap=args.retime_cap,
        retime_rounds=args.retime_rounds, retime_max_rounds=args.retime_max_rounds, sweep=args.sweep, enqueue=tuple(enqueue),
        max_asks=args.max_asks, replay=replay, replay_noise=args.replay_noise,
        workers=args.workers, gpus=tuple(d for d in args.gpus.split(",") if d.strip()) if args.gpus else None,
        heartbeat=args.heartbeat, grace=args.grace, warm_start=args.warm_start or 0,
        **({"evaluator": args.evaluator} if args.evaluator else {}),
    )


def run(args: argparse.Namespace) -> int:
    from autotune.build.builder import BuildError
    from autotune.build.nvcc import NvccNotFoundError
    from autotune.landscapes.replay import ReplayError
    from autotune.measure.interrupts import exit_code
    from autotune.search.loop import SearchInterrupted, run_search
    from autotune.search.study import StudyMismatchError
    from autotune.search.progress import format_result
    from autotune.measure.child_process import EvaluatorError, WorkerStartError

    seqlens = args.seqlen or [None]
    if len(seqlens) > 1:
        return _several_shapes(args, seqlens)
    args.seqlen = seqlens[0]
    try:
        options = options_from_args(args)
        options.check()
    except ValueError as err:
        return _fail(str(err))
    if args.evaluator is None and args.replay is None:
        from autotune.launch.gpu_arch import NoGpuError, detect_arch

        try:
            detect_arch()
        except NoGpuError:
            return _fail("needs a CUDA GPU to time kernels, and none is visible.\n"
                         "For compile-only work without a GPU, use `autotune space --compile --head-dim D "
                         "--arch sm_XX` (it builds the valid configs and shows registers and spills).")
    try:
        result = run_search(options)
    except SearchInterrupted as interrupted:  # Ctrl-C: the trials in flight are failed; say where we stand
        print()
        print(format_result(interrupted.result))
        return exit_code()  # INTERRUPTED after Ctrl-C; 128 + 15 after a scheduler's SIGTERM
    except (StudyMismatchError, NvccNotFoundError) as err:  # fixable by the command line or the environment
        return _fail(str(err))
    except (WorkerStartError, EvaluatorError, BuildError, ReplayError) as err:  # the machinery (or the replay) failed
        print(f"autotune search: {err}", file=sys.stderr)
        return NO_RESULT
    except ValueError as err:
        if "dynamic value space" in str(err):  # Optuna: the study's parameters had other choices
            return _fail(f"the study was created with a different design space (axes or domains changed); "
                         f"use another --study name ({err})")
        return _fail(str(err))
    print()
    print(format_result(result))
    return 0 if result.best is not None else NO_RESULT


def _several_shapes(args: argparse.Namespace, seqlens: list[int]) -> int:
    """`--seqlen A B ...`: one study per shape, in order, each warm-started from those tuned before it (the
    campaign machinery, autotune/search/campaign.py)."""
    import copy
    import dataclasses

    from autotune.search.campaign import DEFAULT_WARM_START
    from autotune.commands.campaign_cmd import execute

    if args.study:
        return _fail("--study names one study; with several --seqlen values leave it out (each shape gets its own)")
    if args.replay is not None:
        return _fail("--replay replays the one recorded shape; give a single --seqlen (or none)")
    if len(set(seqlens)) != len(seqlens):
        return _fail(f"--seqlen: a value is repeated in {seqlens}")
    plans = []
    try:
        for seqlen in seqlens:
            one = copy.copy(args)
            one.seqlen = seqlen
            options = options_from_args(one)
            if args.warm_start is None:
                options = dataclasses.replace(options, warm_start=DEFAULT_WARM_START)
            options.check()
            plans.append(options)
    except ValueError as err:
        return _fail(str(err))
    return execute(plans, needs_gpu=args.evaluator is None)
