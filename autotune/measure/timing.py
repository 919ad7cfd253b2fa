"""One measurement discipline for every kernel we time, ours and torch's alike (after Triton's do_bench).

Per repetition: flush L2 by zeroing a buffer larger than it (outside the timed region), then record a CUDA event,
run, record another. Every rep is timed on its own and we report the median and spread, not a mean that one
hiccup can move. The number of reps follows from a short estimate so each call costs about rep_ms of GPU time.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable

FLUSH_BYTES = 256 << 20  # at least 2× the L2 of any current GPU (H200: 60 MB); raised when the device says more
ESTIMATE_REPS = 5
MAX_REPS = 1000          # tiny kernels: enough samples for a stable median, without minutes of flushing


@dataclass(frozen=True)
class Timing:
    median_ms: float
    p20_ms: float
    p80_ms: float
    min_ms: float
    n: int

    def as_dict(self) -> dict:
        return asdict(self)


def summarize(times_ms) -> Timing:
    """Median, 20th/80th percentiles (linear interpolation) and minimum of per-rep times."""
    import numpy as np

    t = np.asarray(list(times_ms), dtype=float)
    if t.size == 0:
        raise ValueError("times_ms: expected at least one time")
    p20, median, p80 = np.percentile(t, [20, 50, 80])
    return Timing(float(median), float(p20), float(p80), float(t.min()), int(t.size))


def plan_reps(estimate_ms: float, warmup_ms: float, rep_ms: float, n_rep: int | None = None,
              max_reps: int = MAX_REPS) -> tuple[int, int]:
    """(warm-up reps, timed reps) so that each phase lasts about warmup_ms / rep_ms; n_rep overrides the latter."""
    per_call = max(estimate_ms, 1e-3)
    n_warmup = max(1, min(max_reps, int(warmup_ms / per_call)))
    n_timed = n_rep if n_rep is not None else max(1, min(max_reps, int(rep_ms / per_call)))
    if n_timed < 1:
        raise ValueError(f"n_rep: expected a positive count, got {n_rep}")
    return n_warmup, n_timed


_flush_buffers: dict = {}


def _flush_buffer(device):
    import torch

    buf = _flush_buffers.get(device)
    if buf is None:
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)
        buf = _flush_buffers[device] = torch.empty(max(FLUSH_BYTES, 2 * l2), dtype=torch.int8, device=device)
    return buf


def bench(fn: Callable[[], object], warmup_ms: float = 25, rep_ms: float = 100, n_rep: int | None = None,
          flush_l2: bool = True, device=None) -> Timing:
    """Time fn() on torch's current CUDA stream; fn must only enqueue GPU work (no host sync inside)."""
    import torch

    if device is None:
        device = torch.cuda.current_device()
    flush = _flush_buffer(device) if flush_l2 else None

    def one_rep(pair=None):
        if flush is not None:
            flush.zero_()  # enqueued before the start event, so its time is not counted
        if pair:
            pair[0].record()
        fn()
        if pair:
            pair[1].record()

    def events(n):
        return [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]

    # Estimate (this also runs fn once cold: module load and first-launch costs stay out of the samples).
    fn()
    torch.cuda.synchronize(device)
    estimate = events(ESTIMATE_REPS)
    for pair in estimate:
        one_rep(pair)
    torch.cuda.synchronize(device)
    estimate_ms = sorted(s.elapsed_time(e) for s, e in estimate)[ESTIMATE_REPS // 2]

    n_warmup, n_timed = plan_reps(estimate_ms, warmup_ms, rep_ms, n_rep)
    for _ in range(n_warmup):
        one_rep()
    timed = events(n_timed)
    for pair in timed:
        one_rep(pair)
    torch.cuda.synchronize(device)
    return summarize(s.elapsed_time(e) for s, e in timed)


GRAPH_MAX_CALLS = 16      # calls captured per graph (at most): one replay's launch cost spread over many kernels
GRAPH_TARGET_MS = 1.0     # ... fewer when that many calls already last this long (a replay of a 4 ms kernel)
GRAPH_REPLAYS = 15        # timed replays (median taken), after two untimed ones


def bench_graph(fns: list[Callable[[], object]], calls: int | None = None, replays: int = GRAPH_REPLAYS,
                device=None) -> Timing:
    """Per-call time of fns captured in one CUDA graph, as a server replays a decode step: the graph holds `calls`
    calls cycling through fns (give several fns over distinct input copies whose bytes together exceed L2, so no
    call finds its inputs cached by the previous one), and each replay is timed with CUDA events; the Timing is
    per call (replay time / calls). Kernels of a few µs are the case: an eager loop would time the host's launch
    path instead (≈ tens of µs per call for every backend). fns must be capturable: only enqueue GPU work, with no
    host sync or allocation outside torch's caching allocator. `calls` defaults to whole rounds of fns, up to
    GRAPH_MAX_CALLS calls or GRAPH_TARGET_MS of GPU time per replay, whichever is fewer."""
    import torch

    if not fns:
        raise ValueError("fns: expected at least one callable")
    if device is None:
        device = torch.cuda.current_device()
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):  # warm up outside the capture (first launches, allocator pools)
        for fn in fns:
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for fn in fns:
            fn()
        end.record()
    torch.cuda.current_stream(device).wait_stream(side)
    torch.cuda.synchronize(device)
    if calls is None:  # enough calls for GRAPH_TARGET_MS per replay, whole rounds of fns, at least one round
        per_call = max(start.elapsed_time(end) / len(fns), 1e-3)
        rounds = max(1, min(GRAPH_MAX_CALLS, math.ceil(GRAPH_TARGET_MS / per_call)) // len(fns))
        calls = rounds * len(fns)
    n = calls
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(n):
            fns[i % len(fns)]()
    for _ in range(2):
        graph.replay()
    torch.cuda.synchronize(device)
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize(device)
        times.append(start.elapsed_time(end) / n)
    return summarize(times)
