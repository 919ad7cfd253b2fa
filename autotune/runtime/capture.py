"""Capture: the shapes autotune.attention is called with, bucketed, counted, in a campaign file.

    AUTOTUNE_CAPTURE=shapes.toml python serve.py        # or: with autotune.capture("shapes.toml"): ...
    autotune campaign shapes.toml                       # tune what the program ran
    python serve.py                                     # runs on the tuned rows (lookup.py finds the buckets)

Each distinct shape becomes a `[[shapes]]` table of a TOML campaign file, written the first time it is seen;
`autotune campaign FILE` takes the file as it is. A bucket (buckets.py) is written as the first size it sees, exact
(a ViT, a fixed-size prefill: its own shape is what gets tuned, and the lookup serves an exact row first), and as
the bucket from its second size on (a serving loop's prompt lengths): the calls of that first size stay counted
under it, every later size counts under the bucket. Decode shapes (seqlen_q up to 16, their keys growing every step)
are written as their bucket straight away, so a loop's first step is not tuned for one call. How often each shape
was called is kept in comment lines, `# calls: N of <shape key> (run <id>)`, appended when its count reaches a power
of two and once more, exact, when the capture ends (the context manager's exit, stop(), or the interpreter's exit):
`read(path)` sums the last count of each run.

Nothing is lost when the process is killed: the file is only ever appended to (O_APPEND), each shape's table and
each count line in a single write() straight to the operating system (no buffer in this process), before the call
that saw the shape returns. Several processes may capture into one file (ranks of one job, a program run twice):
a writer takes an exclusive lock on the file (flock) and re-reads it before appending a shape, so every shape is
in the file once and the campaign never sees a repeated entry.

Cost per call while capturing: one dict lookup on (q.shape, k.shape, dtype, causal), a lock and an increment
(benchmarks/capture_overhead.py measures it). When no capture is active, attention pays one module attribute read.
"""
from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import re
import threading
import uuid
import warnings
from pathlib import Path

from space import Shape, causal_mask, causal_value

from ..launch.params import dtype_name
from .buckets import EXACT_UP_TO, bucket

ENV_VAR = "AUTOTUNE_CAPTURE"
HEADER = ("# autotune capture: the shapes autotune.attention was called with, bucketed (autotune/runtime/buckets.py).\n"
          "# Tune them with `autotune campaign THIS_FILE`. `# calls` lines count the calls of a shape per run.\n")
_COUNT_LINE = re.compile(r"^# calls: (\d+) of (\S+) \(run (\S+)\)$")
# campaign file key -> space.Shape field (the campaign's SHAPE_KEYS, search/campaign.py)
_FIELDS = (("seqlen", "seqlen_q"), ("seqlen_k", "seqlen_k"), ("batch", "batch"), ("heads", "heads"),
           ("kv_heads", "kv_heads"), ("head_dim", "head_dim"), ("dtype", "dtype"), ("causal", "causal"))


class CaptureError(ValueError):
    """The capture file cannot be used (wrong suffix, missing directory, not a campaign file); names the file."""


def shape_table(shape: Shape) -> str:
    """One `[[shapes]]` table of the campaign format for `shape`."""
    lines = ["[[shapes]]"]
    for key, field in _FIELDS:
        # bool, int, a plain dtype name or "lower_right" (causal, space.causal_value): TOML writes them as JSON does
        value = causal_value(shape) if field == "causal" else getattr(shape, field)
        lines.append(f"{key} = {json.dumps(value)}")
    return "\n".join(lines) + "\n"


def _parse(path: Path, text: str) -> list[Shape]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise CaptureError(f"{path}: not a TOML campaign file ({e}); capture into a new file") from None
    defaults = doc.get("defaults") or {}
    out = []
    for i, item in enumerate(doc.get("shapes") or []):
        values = {**defaults, **item}
        try:
            fields = {field: values[key] for key, field in _FIELDS if key in values}
            if "causal" in fields:
                fields["causal"], fields["causal_align"] = causal_mask(fields["causal"])
            out.append(Shape(**fields))
        except (TypeError, ValueError) as e:
            raise CaptureError(f"{path}: shapes[{i}]: {e}") from None
    return out


def read(path: str | Path) -> list[tuple[Shape, int]]:
    """The captured shapes in file order with their call counts (the last count line of each run, summed)."""
    path = Path(path)
    text = path.read_text()
    last: dict[tuple[str, str], int] = {}
    for line in text.splitlines():
        m = _COUNT_LINE.match(line)
        if m:
            last[(m.group(2), m.group(3))] = int(m.group(1))
    calls: dict[str, int] = {}
    for (key, _), n in last.items():
        calls[key] = calls.get(key, 0) + n
    return [(s, calls.get(s.key, 0)) for s in _parse(path, text)]


class _Counter:
    """The calls of one campaign shape (an exact shape or a bucket) in this capture."""

    __slots__ = ("shape", "calls", "written")

    def __init__(self, shape: Shape):
        self.shape, self.calls, self.written = shape, 0, 0


class CaptureFile:
    """One capture into one file (see the module docstring). `record` is the per-call entry point."""

    def __init__(self, path: str | Path):
        path = Path(path).expanduser()
        if path.suffix.lower() != ".toml":
            raise CaptureError(f"{path}: a capture file is TOML (it is appended to); name it *.toml")
        if not path.parent.is_dir():
            raise CaptureError(f"{path}: directory {path.parent} does not exist; create it or fix the path")
        self.path = path
        self.run = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"  # one per capture: its counts are its own
        self.lock = threading.Lock()
        self._keys: dict[tuple, _Counter] = {}     # (q.shape, k.shape, dtype, causal) -> its campaign shape's
        self._counters: dict[Shape, _Counter] = {}  # campaign shape (exact or bucket) -> its counter
        self._in_file: set[Shape] = set()
        self._seen_size = -1
        try:
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        except OSError as e:
            raise CaptureError(f"{path}: cannot open it for appending: {e.strerror}") from None
        try:
            with self._file_lock():
                if os.fstat(self._fd).st_size == 0:
                    os.write(self._fd, HEADER.encode())
                self._refresh()
        except BaseException:
            os.close(self._fd)
            raise

    @contextlib.contextmanager
    def _file_lock(self):
        """The exclusive lock that makes re-read + append one step across processes (module docstring)."""
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _refresh(self) -> None:
        """Learn the shapes other writers appended since we last looked (call with the file lock held)."""
        size = os.fstat(self._fd).st_size
        if size != self._seen_size:
            self._in_file = set(_parse(self.path, self.path.read_text()))
            self._seen_size = size

    def _append(self, text: str) -> None:
        os.write(self._fd, text.encode())  # one write(), O_APPEND: whole or not at all, at the end

    def record(self, q, k, causal) -> None:
        """Count one call of attention(q, k, causal=...) (already validated by the caller; causal: False, True or
        an alignment, as attention takes it)."""
        key = (q.shape, k.shape, q.dtype, causal)
        with self.lock:
            b = self._keys.get(key)
            if b is None:
                b = self._new_key(key, q, k, causal)
            b.calls += 1
            if b.calls & (b.calls - 1) == 0:  # 1, 2, 4, ...: a killed run's counts are within a factor of 2
                self._write_count(b)

    def _new_key(self, key, q, k, causal) -> _Counter:
        batch, heads, seqlen_q, head_dim = q.shape
        masked, align = causal_mask(causal)
        exact = Shape(batch=batch, heads=heads, seqlen_q=seqlen_q, seqlen_k=k.shape[2], head_dim=head_dim,
                      dtype=dtype_name(q.dtype), causal=masked, kv_heads=k.shape[1], causal_align=align)
        whole = bucket(exact)
        # decided without the file: a shape that is its own bucket, a decode shape, a bucket already counting
        target = whole if whole == exact or seqlen_q <= EXACT_UP_TO or whole in self._counters else None
        counter = self._counters.get(target) if target is not None else None
        if counter is None:
            with self._file_lock():
                self._refresh()
                if target is None:
                    target = exact if self._first_size(exact, whole) else whole
                counter = self._counters.get(target)
                if counter is None:
                    counter = self._counters[target] = _Counter(target)
                    if target not in self._in_file:
                        self._append(shape_table(target))
                        self._in_file.add(target)
                        self._seen_size = os.fstat(self._fd).st_size
        self._keys[key] = counter
        return counter

    def _first_size(self, exact: Shape, whole: Shape) -> bool:
        """Whether `exact` is the only size its bucket `whole` has had, in this capture and in the file (call with
        the file lock held, the file re-read): then it is written as itself, else as the bucket."""
        seen = self._in_file | set(self._counters)
        return whole not in seen and not any(s != exact and bucket(s) == whole for s in seen)

    def _write_count(self, b: _Counter) -> None:
        self._append(f"# calls: {b.calls} of {b.shape.key} (run {self.run})\n")
        b.written = b.calls

    def close(self) -> None:
        """Write the exact counts not yet written, and close the file."""
        with self.lock:
            if self._fd < 0:
                return
            for b in self._counters.values():
                if b.calls != b.written:
                    self._write_count(b)
            os.close(self._fd)
            self._fd = -1

    @property
    def shapes(self) -> dict[Shape, int]:
        """{campaign shape (a bucket's first size or the bucket): calls} recorded by this process."""
        with self.lock:
            return {s: b.calls for s, b in self._counters.items()}


# ---- the active capture ---------------------------------------------------------------------------------------

recording = bool(os.environ.get(ENV_VAR))  # read by attention_op.forward on every call: keep it a plain bool
_active: CaptureFile | None = None
_from_env: list[str] = []  # the env path, once opened (or once failed: said once, then not retried)
_switch = threading.Lock()


def record(q, k, causal) -> None:
    """attention_op's hook: count this call into the active capture (opening $AUTOTUNE_CAPTURE on first use)."""
    cap = _active
    if cap is None:
        cap = _open_from_env()
        if cap is None:
            return
    cap.record(q, k, causal)


def _open_from_env() -> CaptureFile | None:
    global _active, recording
    with _switch:
        if _active is not None:
            return _active
        path = os.environ.get(ENV_VAR)
        if not path or path in _from_env:
            recording = False
            return None
        _from_env.append(path)
        try:
            _active = CaptureFile(path)
        except CaptureError as e:
            warnings.warn(f"autotune: ${ENV_VAR}: {e}; not capturing", RuntimeWarning, stacklevel=4)
            recording = False
            return None
        atexit.register(_active.close)
        return _active


def start(path: str | Path) -> CaptureFile:
    """Capture into `path` from now on (until stop()); returns the capture. Replaces an active one (closed)."""
    global _active, recording
    cap = CaptureFile(path)
    with _switch:
        previous, _active = _active, cap
        recording = True
    if previous is not None:
        previous.close()
    atexit.register(cap.close)
    return cap


def stop() -> None:
    """End the active capture (its exact counts are written)."""
    global _active, recording
    with _switch:
        previous, _active = _active, None
        recording = False
    if previous is not None:
        previous.close()


@contextlib.contextmanager
def capture(path: str | Path):
    """Capture the shapes attention is called with inside the block into `path` (module docstring); yields the
    CaptureFile. A capture active before the block is suspended inside it and resumes after."""
    global _active, recording
    cap = CaptureFile(path)
    with _switch:
        outer, was_recording = _active, recording
        _active, recording = cap, True
    try:
        yield cap
    finally:
        with _switch:
            _active, recording = outer, was_recording
        cap.close()


__all__ = ["CaptureError", "CaptureFile", "ENV_VAR", "capture", "read", "record", "recording", "shape_table",
           "start", "stop"]
