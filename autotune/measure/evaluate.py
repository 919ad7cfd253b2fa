"""Evaluate one build on one shape: correctness first, then time. Also time torch's SDPA backends the same way.

`evaluate` runs in the calling process and never raises for a bad kernel: it returns an Evaluation whose status
is 'complete', 'wrong' or 'crashed'. A kernel that faults leaves this process's CUDA context unusable
(`Evaluation.context_lost`), so anything that tries many configs calls it in a child process through
autotune.measure.child_process (which adds the status 'timeout' for a kernel that hangs).
"""
from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass, fields

from space import Shape

from . import peer_fa4
from .check import check, empty_output, make_inputs, sdpa_mask_kwargs
from ..launch.loader import as_runner
from .timing import Timing, bench

STATUSES = ("complete", "wrong", "crashed", "timeout")  # 'timeout' is given by the caller that isolates us
SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
                 "math": "MATH"}
# Peers outside torch, timed beside the SDPA backends when installed (autotune.measure.peer_fa4): their names are kept
# as they are in the baselines ("fa4"), where SDPA's get an "sdpa_" prefix.
PEERS = ("fa4",)
DEFAULT_BASELINES = ("flash", "cudnn", "efficient", "fa4")
# ... and the names they are stored under (a study's `baselines` attr)
BASELINE_NAMES = tuple(b if b in PEERS else f"sdpa_{b}" for b in DEFAULT_BASELINES)


@dataclass
class Evaluation:
    status: str                      # one of STATUSES
    config_key: str
    shape_key: str
    reason: str = ""
    # correctness (autotune.measure.check.CheckResult)
    max_error: float | None = None
    torch_error: float | None = None
    tolerance: float | None = None
    nan_count: int | None = None
    unwritten: int | None = None
    out_of_bounds: int | None = None
    nondeterministic: int | None = None
    lse_error: float | None = None
    check_message: str = ""
    check_seed: int | None = None
    # timing (autotune.measure.timing.Timing) and throughput
    median_ms: float | None = None
    p20_ms: float | None = None
    p80_ms: float | None = None
    min_ms: float | None = None
    n_reps: int | None = None
    tflops: float | None = None
    # what the driver says about the loaded kernel
    registers: int | None = None
    threads: int | None = None
    smem_bytes: int | None = None
    blocks_per_sm: int | None = None
    context_lost: bool = False       # the CUDA context no longer works: this process must not be reused

    @property
    def ok(self) -> bool:
        return self.status == "complete"

    @property
    def spread_ms(self) -> float | None:
        """p80 - p20 of the timed reps: the contract's `time_spread_ms`."""
        return None if self.p20_ms is None else self.p80_ms - self.p20_ms

    def as_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}

    @classmethod
    def from_dict(cls, d: dict) -> "Evaluation":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def context_alive() -> bool:
    """Whether this process's CUDA context still works (a faulting kernel poisons it for good)."""
    import torch

    try:
        torch.cuda.synchronize()
        return True
    except Exception:
        return False


def evaluate(build, shape: Shape, check_seed: int | None = None, layout: str = "bhnd", check_lse: bool = False,
             warmup_ms: float = 25, rep_ms: float = 100, n_rep: int | None = None) -> Evaluation:
    """Check `build` on `shape` against the fp32 reference; if right, time it (median of CUDA-event reps)."""
    ev = Evaluation("crashed", build.config.key, shape.key)
    try:
        runner = as_runner(build)
        lay = runner.layout
        kernel = runner.kernel()
        ev.threads, ev.smem_bytes = lay.threads, lay.smem_total
        ev.registers = kernel.attribute("NUM_REGS")
        ev.blocks_per_sm = kernel.blocks_per_sm(lay.threads, lay.smem_dynamic)

        # Causal shapes are checked and timed with their own alignment (a lower-right decode step sees nearly
        # every key; upper-left would time a mostly masked kernel).
        result = check(runner, shape, seed=check_seed, layout=layout, check_lse=check_lse,
                       causal_align=shape.causal_align)
        ev.max_error, ev.torch_error, ev.tolerance = result.max_error, result.torch_error, result.tolerance
        ev.nan_count, ev.unwritten, ev.out_of_bounds = result.nan_count, result.unwritten, result.out_of_bounds
        ev.nondeterministic, ev.lse_error = result.nondeterministic, result.lse_error
        ev.check_message, ev.check_seed = result.message, result.seed
        if not result.ok:
            ev.status, ev.reason = "wrong", result.message
            return ev

        q, k, v = make_inputs(shape, layout, seed=result.seed + 1)
        o = empty_output(shape, layout)
        timing = bench(runner.prepare(q, k, v, o, causal_align=shape.causal_align), warmup_ms=warmup_ms, rep_ms=rep_ms, n_rep=n_rep)
        _set_timing(ev, timing, shape)
        ev.status = "complete"
    except Exception as e:  # a bad kernel is a result, not an exception
        ev.status, ev.reason = "crashed", f"{type(e).__name__}: {e}"
        ev.context_lost = not context_alive()
    return ev


def _set_timing(ev: Evaluation, t: Timing, shape: Shape) -> None:
    ev.median_ms, ev.p20_ms, ev.p80_ms, ev.min_ms, ev.n_reps = t.median_ms, t.p20_ms, t.p80_ms, t.min_ms, t.n
    ev.tflops = shape.tflops(t.median_ms / 1e3)


class BackendUnavailable(RuntimeError):
    """torch refused the shape on that SDPA backend; the message says why (torch's own warnings)."""


def sdpa_baseline(shape: Shape, backend: str, layout: str = "bhnd", warmup_ms: float = 25, rep_ms: float = 100,
                  n_rep: int | None = None) -> Timing:
    """Time torch SDPA restricted to one backend ('flash', 'cudnn', 'efficient', 'math') on shape's tensors."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if backend not in SDPA_BACKENDS:
        raise ValueError(f"backend: expected one of {sorted(SDPA_BACKENDS)}, got {backend!r}")
    if shape.lower_right and backend != "flash":
        # torch's CausalBias picks its own kernel for a lower-right mask (flash where it can, whatever sdpa_kernel
        # asks for): another backend's row would time flash under that backend's name
        raise BackendUnavailable(f"sdpa {backend}: a lower-right causal mask runs through torch's CausalBias, which "
                                 "picks the flash kernel itself; only the flash row is timed for it")
    q, k, v = make_inputs(shape, layout, seed=0)
    kwargs = sdpa_mask_kwargs(shape)
    if shape.kv_heads != shape.heads:
        kwargs["enable_gqa"] = True

    def fn():
        return F.scaled_dot_product_attention(q, k, v, **kwargs)

    with sdpa_kernel(getattr(SDPBackend, SDPA_BACKENDS[backend])), torch.no_grad():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                fn()
                torch.cuda.synchronize()
            except RuntimeError as e:
                why = [str(w.message).strip() for w in caught] + [str(e).strip().splitlines()[0]]
                raise BackendUnavailable(f"sdpa {backend}: " + " | ".join(why)) from None
        return bench(fn, warmup_ms=warmup_ms, rep_ms=rep_ms, n_rep=n_rep)


def sdpa_baselines(shape: Shape, backends=DEFAULT_BASELINES, layout: str = "bhnd",
                   warmup_ms: float = 25, rep_ms: float = 100, n_rep: int | None = None,
                   reasons: dict | None = None) -> dict[str, Timing | None]:
    """{backend: Timing, or None when torch refuses the shape or the peer is not installed}; pass a dict as
    `reasons` to learn why. Backends are SDPA's ('flash', ...) and the PEERS ('fa4', on its own layout)."""
    out: dict[str, Timing | None] = {}
    for name in backends:
        try:
            if name == "fa4":
                out[name] = peer_fa4.fa4_timing(shape, warmup_ms, rep_ms, n_rep)
            else:
                out[name] = sdpa_baseline(shape, name, layout, warmup_ms, rep_ms, n_rep)
        except (BackendUnavailable, peer_fa4.PeerUnavailable) as e:
            out[name] = None
            if reasons is not None:
                reasons[name] = str(e)
    return out


def sdpa_baselines_with_reasons(shape: Shape, backends=DEFAULT_BASELINES, layout: str = "bhnd",
                                warmup_ms: float = 25, rep_ms: float = 100,
                                n_rep: int | None = None) -> tuple[dict[str, Timing | None], dict[str, str]]:
    """(timings, reasons): the same as sdpa_baselines, in a form that crosses a process boundary."""
    reasons: dict[str, str] = {}
    timings = sdpa_baselines(shape, backends, layout, warmup_ms, rep_ms, n_rep, reasons=reasons)
    return timings, reasons
