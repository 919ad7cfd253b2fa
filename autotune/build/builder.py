"""Config → cubin: many configs at once through a generated build.ninja, behind a content-addressed cache.

One build target is one nvcc call:

    nvcc -cubin -O3 -std=c++17 -gencode=<arch> -Xptxas -v [extra flags] -I<kernels dir> -D... <family source>

run under `timeout` by a small wrapper script that writes the compiler's output into a per-target log and the
exit code and wall time next to it. ninja runs the targets in parallel with `-k 0` (a failing config does not
stop the others) and reports each target as it finishes, which drives the progress callback.

Cache: key = sha256 of (every kernel source file under the kernels dir, the sorted -D flags, the nvcc flags,
the family's source file and entry, the nvcc version, the arch gencode). An entry is the directory
`<cache>/<key[:2]>/<key>/` with `kernel.cubin` (absent on failure), `ptxas.log` and `meta.json`. Entries are
built in a private work directory and renamed into place, so a reader never sees a half-written entry and
two processes building the same key at once cannot corrupt it. Compile failures are cached too (they are a
property of the sources, like successes); timeouts and a compiler that could not start are not.

The cache may be shared (several users, hosts or containers on one directory), so a cached cubin is not
trusted on its own word: meta.json sits next to the cubin, and whoever can write the one can write the other. On
every cache hit the cubin's sha256 must be one of the trusted hashes of its key:

  * the hash the caller expects (`trusted_hash`: the runtime passes the best-table row's `cubin_hash`, the hash
    of the cubin that row was measured with, recorded by the search that measured it);
  * the hash this process computed when it compiled the key itself;
  * the hash in meta.json, but only when the entry can only have been written by this user: the entry directory,
    meta.json and kernel.cubin belong to this user (or root), are no symlinks, and are writable by nobody else
    (`written_by_others` says why not).

A cubin that matches none of the trusted hashes there are is moved aside to `<cache>/.damaged/` (kept for
inspection, never deleted) and rebuilt locally, with a CacheIntegrityWarning saying so. An entry that someone
else may have written, with no trusted hash to check it against, is compiled again here before it is used (one
CacheIntegrityWarning per Builder says so): the same bytes, and the entry stays as it is; other bytes, and it is
moved aside and this build published in its place. `BuildResult.cubin_bytes()` checks the bytes it returns against
the result's hash, so what is loaded is exactly what was checked (CubinMismatchError otherwise).
`cache_exposure(cache_dir)` says whether a cache directory lets other users write entries (`autotune best
--explain` reports it).

Configs that `space.violations` rejects never reach nvcc: they come back as `ok=False` results whose
`rejected_by` names the rules (and whose `error` gives the rules' messages). `check_rules=False` turns that
off so tests can ask the compiler for its own verdict on invalid configs.
"""
from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

import space
from space import Arch, Config, Problem

from . import ptxas_swap
from .nvcc import find_nvcc, nvcc_version
from .ptxas import BuildReport, PtxasParseError, parse_report

BASE_FLAGS = ("-cubin", "-O3", "-std=c++17", "-Xptxas", "-v")
CUBIN, LOG, META = "kernel.cubin", "ptxas.log", "meta.json"
PTX = "kernel.ptx"  # a swapped-ptxas build's intermediate (ptxas_swap.py), deleted before the entry is published
# Exit codes that say nothing about the sources: timeout(1)'s "timed out" (124, 137 after -k) and the shell's
# "cannot execute" / "not found" (126, 127). Such failures are reported but never cached.
TIMEOUT_CODES = (124, 137)
# nvcc ended by SIGHUP/SIGINT/SIGQUIT/SIGTERM (128 + signal): a Ctrl-C'd or stopped search, not a verdict on
# the config; cached, it would come back as a compile error when the search resumes.
SIGNALLED_CODES = (129, 130, 131, 143)
UNCACHEABLE_CODES = TIMEOUT_CODES + (126, 127) + SIGNALLED_CODES

Progress = Callable[[int, int, "BuildResult"], None]


class BuildError(RuntimeError):
    """The build machinery itself failed (not a config's compile error): ninja missing or crashing, bad paths."""


class CacheIntegrityWarning(UserWarning):
    """A cached cubin did not match the hash recorded beside it: the entry was moved aside and rebuilt."""


class CubinMismatchError(BuildError):
    """A cubin's bytes changed after its cache entry was checked (someone rewrote the shared cache under us)."""


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _trusted_owner(uid: int) -> bool:
    return uid in (os.getuid(), 0)


def written_by_others(paths: Iterable[Path]) -> str | None:
    """Why someone other than this user (or root) may have written one of `paths`, or None: a path that belongs
    to another user, is a symbolic link, or is writable by group or others."""
    for path in paths:
        st = os.lstat(path)  # not followed: a link planted in place of a file is itself the finding
        if stat.S_ISLNK(st.st_mode):
            return f"{path} is a symbolic link"
        if not _trusted_owner(st.st_uid):
            return f"{path} belongs to uid {st.st_uid}, not this user"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return f"{path} is writable by {'others' if st.st_mode & stat.S_IWOTH else 'its group'} (mode {st.st_mode & 0o7777:04o})"
    return None


def _keep_private(entry: Path) -> None:
    """Take group and other write permission off an entry of ours (a umask of 002 would leave it), so that its
    meta.json stays trusted (written_by_others); an entry of another user's is left alone."""
    for path in (entry, *entry.iterdir()):
        st = os.lstat(path)
        if st.st_uid == os.getuid() and not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o022:
            try:
                os.chmod(path, st.st_mode & 0o7755)
            except OSError:
                pass


def cache_exposure(cache_dir: str | os.PathLike) -> str | None:
    """Whether other users can write entries into `cache_dir`, in words (None: only this user and root can).
    Looks at the directory and every directory above it (a writable parent lets others replace the whole cache;
    a sticky one such as /tmp does not) and at the two-character key directories inside it."""
    cache = Path(cache_dir).expanduser().resolve()  # a symlinked cache is judged where it lies
    if not cache.exists():
        return None
    findings = []
    for directory in [cache, *cache.parents]:
        st = directory.stat()
        writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if directory != cache and (st.st_mode & stat.S_ISVTX or not writable) and _trusted_owner(st.st_uid):
            continue
        if directory == cache or writable or not _trusted_owner(st.st_uid):
            why = written_by_others([directory]) if directory == cache or writable else \
                f"{directory} belongs to uid {st.st_uid}"
            if why:
                findings.append(why)
    buckets = sorted(d for d in cache.iterdir() if len(d.name) == 2 and d.is_dir()) if cache.is_dir() else []
    open_buckets = [d for d in buckets if written_by_others([d])]
    if open_buckets:
        findings.append(f"{len(open_buckets)} of its {len(buckets)} key directories are writable by others or "
                        f"belong to another user (e.g. {written_by_others([open_buckets[0]])})")
    if not findings:
        return None
    return (f"kernel cache {cache} can be written by other users: {'; '.join(findings)}. Entries they write are "
            "not trusted: each is checked against the hash its best-table row recorded, or compiled again here "
            "before use; keep the cache private (chmod go-w) or use your own (--cache-dir, $AUTOTUNE_CACHE_DIR)")


@dataclass(frozen=True)
class BuildResult:
    config: Config
    problem: Problem
    arch: Arch
    ok: bool
    cubin_path: Path | None
    report: BuildReport | None
    error: str | None
    cached: bool
    key: str | None              # cache key; None for configs rejected before compiling
    cubin_hash: str | None = None  # sha256 of the cubin: equal hashes need timing only once
    rejected_by: tuple[str, ...] = ()  # space rules that rejected the config (then nvcc never ran)
    log_path: Path | None = None   # the compiler's full output

    @property
    def spilled(self) -> bool:
        return bool(self.report and self.report.spilled)

    @property
    def status(self) -> str:
        """'invalid' (rejected by space rules), 'compile_error', 'spilled' or 'compiled'."""
        if self.rejected_by:
            return "invalid"
        if not self.ok:
            return "compile_error"
        return "spilled" if self.spilled else "compiled"

    @property
    def layout(self) -> space.Layout:
        return space.layout(self.config, self.problem)

    def cubin_bytes(self) -> bytes:
        """The cubin, checked against `cubin_hash`: the bytes a caller loads are the bytes that were checked."""
        if not self.ok or self.cubin_path is None:
            raise ValueError(f"{self.config.key}: no cubin, the build failed: {self.error}")
        data = self.cubin_path.read_bytes()
        if self.cubin_hash is not None and hashlib.sha256(data).hexdigest() != self.cubin_hash:
            raise CubinMismatchError(f"{self.cubin_path}: its sha256 is no longer the {self.cubin_hash[:12]} recorded "
                                     "when it was built (the kernel cache was changed under this process); build "
                                     "again to check and rebuild the entry")
        return data


def default_cache_dir() -> Path:
    env = os.environ.get("AUTOTUNE_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "autotune" / "kernels"


def default_kernels_dir() -> Path:
    """The kernel sources next to this package when it runs from a source checkout (so a checkout always builds
    its own kernels, whichever checkout an editable install points at), else the shipped package data
    `autotune/_kernels` of an installed wheel.

    `kernels/` has no `__init__.py` on purpose: a regular package named `kernels` at a checkout's root would
    shadow Hugging Face's `kernels` distribution (a dependency of transformers >= 5.25) for any program started
    there, and `import transformers` would fail. So the installed copy is a directory found by path, not a
    module found by importlib (whose `files()` of a namespace directory is not a filesystem path)."""
    repo_kernels = Path(__file__).resolve().parents[2] / "kernels"
    if (repo_kernels / "common").is_dir() and (repo_kernels.parent / "pyproject.toml").is_file():
        return repo_kernels
    installed = Path(__file__).resolve().parents[1] / "_kernels"
    if (installed / "common").is_dir():
        return installed
    raise BuildError(f"kernels_dir: the kernel sources are neither in a source checkout ({repo_kernels}) nor "
                     f"installed as package data ({installed}); reinstall autotune or pass "
                     "kernels_dir=<path to kernels/>")


_QUOTED_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def family_sources(kernels_dir: Path, source: str) -> list[Path]:
    """The files a family's kernel is compiled from: its source and every file it includes with quotes,
    transitively (kernels/ includes only its own headers that way; system headers use <...>)."""
    root = Path(kernels_dir).resolve()
    seen: set[Path] = set()
    todo = [root / source]
    while todo:
        path = todo.pop().resolve()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        for name in _QUOTED_INCLUDE.findall(path.read_text(errors="replace")):
            todo.append(path.parent / name)
    return sorted(seen)


def sources_digest(kernels_dir: Path, sources: Iterable[str]) -> str:
    """sha256 over the kernel files (relative path and contents) that `sources` (family source paths relative
    to kernels_dir) are compiled from.

    Per family, an edit to one family's files leaves the other families' cache entries and study provenance
    alone (a kernel writer iterating on sm80/ does not rebuild every sm90 variant)."""
    kernels_dir = Path(kernels_dir).resolve()
    files = sorted({f for src in sources for f in family_sources(kernels_dir, src)})
    h = hashlib.sha256()
    for path in files:
        rel = Path(os.path.relpath(path, kernels_dir)).as_posix()  # '../x.h' for an include from outside
        data = path.read_bytes()
        h.update(f"{rel}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def define_flags(config: Config, problem: Problem) -> list[str]:
    return [f"-D{name}={value}" for name, value in sorted(space.defines(config, problem).items())]


def _ninja_command() -> list[str]:
    try:
        import ninja

        binary = Path(ninja.BIN_DIR) / "ninja"
        if binary.is_file():
            return [str(binary)]
    except ImportError:
        pass
    found = shutil.which("ninja")
    if found:
        return [found]
    raise BuildError("ninja not found: `pip install ninja` (the PyPI package ships the binary)")


# Runs one compile: output into LOG, "exit_code milliseconds" into LOG.status. ninja's own .ninja_log only
# records commands that succeeded, and failures need their time and exit code too.
_WRAPPER = """\
log=$1; limit=$2; shift 2
start=$(date +%s%N)
if command -v timeout >/dev/null 2>&1; then
  timeout -k 10 "$limit" "$@" >"$log" 2>&1
else
  "$@" >"$log" 2>&1
fi
rc=$?
end=$(date +%s%N)
echo "$rc $(( (end - start) / 1000000 ))" >"$log.status"
exit $rc
"""
_FINISHED = re.compile(r"^\[\d+/\d+\] COMPILE t(\d+)\s*$")


@dataclass
class _Target:
    """One cache miss being compiled in the work directory."""

    index: int  # position in the work dir (t<index>/), not in the caller's list
    config: Config
    problem: Problem
    key: str
    defines: list[str]
    dir: Path


class Builder:
    """Compiles (config, problem) pairs for one arch into the kernel cache.

    arch: a space.Arch or its name; cache_dir: default $AUTOTUNE_CACHE_DIR, else ~/.cache/autotune/kernels;
    jobs: parallel nvcc calls (default: CPU count); nvcc: default find_nvcc(); kernels_dir: default the
    installed kernel sources; timeout_s: per-compile limit; extra_flags: appended to the nvcc flags (and to
    the cache key); check_rules=False sends configs that space/ rejects to the compiler anyway (for tests);
    ptxas: assemble with this ptxas instead of nvcc's own (default $AUTOTUNE_PTXAS; ptxas_swap.py says how and why).
    """

    def __init__(self, arch: Arch | str, cache_dir: str | os.PathLike | None = None, jobs: int | None = None,
                 nvcc: str | os.PathLike | None = None, kernels_dir: str | os.PathLike | None = None,
                 timeout_s: float = 600, extra_flags: Sequence[str] = (), check_rules: bool = True,
                 ptxas: str | os.PathLike | None = None):
        self.arch = arch if isinstance(arch, Arch) else space.get_arch(arch)
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
        if jobs is not None and jobs < 1:
            raise ValueError(f"jobs: expected a positive integer, got {jobs!r}")
        self.jobs = jobs or os.cpu_count() or 1
        self.nvcc = Path(nvcc) if nvcc else find_nvcc()
        self.kernels_dir = Path(kernels_dir).resolve() if kernels_dir else default_kernels_dir()
        if not self.kernels_dir.is_dir():
            raise BuildError(f"kernels_dir: {self.kernels_dir} is not a directory")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s: expected a positive number of seconds, got {timeout_s!r}")
        self.timeout_s = timeout_s
        self.flags = [*BASE_FLAGS, f"-gencode={self.arch.gencode}", *extra_flags]
        self.check_rules = check_rules
        self.ptxas = ptxas_swap.requested_ptxas(ptxas)  # None: nvcc's own
        self.ptxas_version = ptxas_swap.ptxas_version(str(self.ptxas)) if self.ptxas else None
        # the compiler's identity in every cache key and provenance: nvcc's version, plus a swapped ptxas's
        self.nvcc_version = ptxas_swap.toolchain_version(nvcc_version(self.nvcc), self.ptxas_version)
        self._compiled: dict[str, str] = {}  # key → the cubin hash this process computed compiling it (trusted)
        self._told_untrusted = False         # the one warning about entries compiled again to check them

    # -- public -------------------------------------------------------------------------------------------

    def build_one(self, config: Config, problem: Problem, trusted_hash: str | None = None) -> BuildResult:
        """build() of one item; `trusted_hash`: the sha256 its cubin is expected to have (the module docstring)."""
        return self.build([(config, problem)], trusted_hashes=[trusted_hash])[0]

    def build(self, items: Sequence[tuple[Config, Problem]], progress: Progress | None = None,
              trusted_hashes: Sequence[str | None] | None = None) -> list[BuildResult]:
        """Build every (config, problem); results come back in input order, one per item.

        progress(done, total, result) is called once per item as its result becomes known (cache hits and
        rejected configs first, then compiles in the order they finish). `trusted_hashes[i]`: the cubin hash
        item i is expected to have, e.g. its best-table row's (a cached cubin is checked against it).
        """
        items = list(items)
        total = len(items)
        results: list[BuildResult | None] = [None] * total
        done = 0

        def finish(positions: Iterable[int], result: BuildResult) -> None:
            nonlocal done
            for i in positions:
                results[i] = dataclasses.replace(result, config=items[i][0], problem=items[i][1])
                done += 1
                if progress:
                    progress(done, total, results[i])

        digests: dict[str, str] = {}  # family -> its sources' digest, read once per call
        misses: dict[str, list[int]] = {}  # key -> positions; identical requests compile once
        for i, (config, problem) in enumerate(items):
            rejected = space.violations(config, problem, self.arch) if self.check_rules else []
            if rejected:
                finish([i], self._rejected(config, problem, rejected))
                continue
            if config.family not in digests:
                digests[config.family] = self.sources_digest((config.family,))
            key = self.key(config, problem, digests[config.family])
            if key in misses:
                misses[key].append(i)
                continue
            hit = self._lookup(config, problem, key, trusted_hashes[i] if trusted_hashes else None)
            if hit:
                finish([i], hit)
            else:
                misses[key] = [i]

        if misses:
            self._compile(items, misses, finish)
        return results  # type: ignore[return-value]  (every slot is filled)

    def sources_digest(self, families: Iterable[str]) -> str:
        """Digest of the kernel files these families compile from (build.sources_digest)."""
        return sources_digest(self.kernels_dir, sorted({space.get_family(f).source for f in families}))

    def key(self, config: Config, problem: Problem, digest: str | None = None) -> str:
        """The cache key; `digest`: this config's family's sources digest, when the caller has it already."""
        family = space.get_family(config.family)
        material = {
            "sources": digest or self.sources_digest((config.family,)),
            "source": family.source,
            "entry": family.entry,
            "defines": define_flags(config, problem),
            "flags": self.flags,
            "nvcc": self.nvcc_version,
            "gencode": self.arch.gencode,
        }
        return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()

    def entry_dir(self, key: str) -> Path:
        return self.cache_dir / key[:2] / key

    # -- cache ----------------------------------------------------------------------------------------------

    def _lookup(self, config: Config, problem: Problem, key: str, trusted_hash: str | None = None
                ) -> BuildResult | None:
        entry = self.entry_dir(key)
        try:
            meta = json.loads((entry / META).read_text())
            suspect = written_by_others([entry, entry / META] + ([entry / CUBIN] if (entry / CUBIN).exists() else []))
        except (OSError, ValueError):
            return None
        if meta.get("ok") and not (entry / CUBIN).is_file():
            shutil.rmtree(entry, ignore_errors=True)  # damaged entry: drop it so the rebuild can take its place
            return None
        if not meta.get("ok"):
            # A cached compile failure is only a verdict of this user's: someone else's may be planted to hide a
            # config. Compiled again here (a failure again is cached again, as any).
            return None if suspect else self._result(config, problem, key, entry, meta, cached=True)
        try:
            actual = file_sha256(entry / CUBIN)
        except OSError:  # removed by another process between the check above and here: a miss
            return None
        trusted = {h: why for h, why in ((meta.get("cubin_hash") if not suspect else None, "recorded in meta.json"),
                                         (self._compiled.get(key), "this process computed building it"),
                                         (trusted_hash, "its best-table row recorded")) if h}
        if actual in trusted:
            return dataclasses.replace(self._result(config, problem, key, entry, meta, cached=True), cubin_hash=actual)
        if trusted:
            aside = self._set_aside(entry)
            against = ", nor the ".join(f"{h[:12]} {why}" for h, why in trusted.items())
            warnings.warn(f"autotune: kernel cache entry {entry} ({config.key}): kernel.cubin has sha256 "
                          f"{actual[:12]}, not the {against}; moved to {aside} and rebuilt locally"
                          + (f" ({suspect})" if suspect else ""), CacheIntegrityWarning, stacklevel=4)
            return None
        if not self._told_untrusted:  # someone else's entry, nothing to check it against: compile it here
            self._told_untrusted = True
            warnings.warn(f"autotune: kernel cache {self.cache_dir}: entries that another user may have written "
                          f"({suspect}) are not trusted without a recorded hash; compiling them here to check them",
                          CacheIntegrityWarning, stacklevel=4)
        return None

    def _set_aside(self, entry: Path) -> Path:
        """Move a damaged entry out of the cache's way (so a rebuild can take its place), keeping it to look at."""
        aside = self.cache_dir / ".damaged" / f"{entry.name}-{uuid.uuid4().hex[:8]}"
        aside.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(entry, aside)
        except FileNotFoundError:  # another process moved it first
            pass
        except OSError as e:  # e.g. a shared cache directory we may read but not change: never load it, say so
            raise BuildError(f"{entry}: its kernel.cubin does not match the hash recorded when it was built, and it "
                             f"cannot be moved aside ({e.strerror}); remove it, or use another --cache-dir") from None
        return aside

    def _result(self, config, problem, key, entry: Path | None, meta: dict, cached: bool) -> BuildResult:
        """entry is the cache entry holding the files, or None when the result was not cached."""
        ok = bool(meta["ok"]) and entry is not None
        return BuildResult(
            config=config, problem=problem, arch=self.arch, ok=ok,
            cubin_path=entry / CUBIN if ok else None,
            report=BuildReport.from_dict(meta["report"]) if meta.get("report") else None,
            error=meta.get("error"), cached=cached, key=key, cubin_hash=meta.get("cubin_hash"),
            log_path=entry / LOG if entry else None,
        )

    def _rejected(self, config: Config, problem: Problem, rejected: list[space.Violation]) -> BuildResult:
        return BuildResult(
            config=config, problem=problem, arch=self.arch, ok=False, cubin_path=None, report=None,
            error="rejected by space rules, not compiled: " + "; ".join(str(v) for v in rejected),
            cached=False, key=None, rejected_by=tuple(v.rule for v in rejected),
        )

    # -- compile --------------------------------------------------------------------------------------------

    def _compile(self, items, misses: dict[str, list[int]], finish) -> None:
        work = self.cache_dir / ".work" / uuid.uuid4().hex
        work.mkdir(parents=True)
        try:
            targets = []
            for n, (key, positions) in enumerate(misses.items()):
                config, problem = items[positions[0]]
                target = _Target(n, config, problem, key, define_flags(config, problem), work / f"t{n}")
                target.dir.mkdir()
                targets.append(target)
            (work / "compile.sh").write_text(_WRAPPER)
            (work / "build.ninja").write_text(self._ninja_file(targets))

            pending = {t.index: t for t in targets}
            ninja_output: list[str] = []
            env = {**os.environ, "NINJA_STATUS": "[%f/%t] "}
            cmd = [*_ninja_command(), "-C", str(work), "-k", "0", "-j", str(self.jobs)]
            with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as proc:
                for line in proc.stdout:  # type: ignore[union-attr]
                    ninja_output.append(line)
                    m = _FINISHED.match(line)
                    if m and int(m.group(1)) in pending:
                        target = pending.pop(int(m.group(1)))
                        finish(misses[target.key], self._collect(target))
            # ninja prints nothing for a target it never ran (e.g. it was killed): report those as failures.
            for target in pending.values():
                if (target.dir / f"{LOG}.status").is_file():
                    finish(misses[target.key], self._collect(target))
                    continue
                tail = "".join(ninja_output[-20:])
                raise BuildError(f"ninja exited with {proc.returncode} without running {target.config.key}:\n{tail}")
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _ninja_file(self, targets: list[_Target]) -> str:
        lines = [
            "# generated by autotune.build: one nvcc call per config",
            "rule nvcc",
            "  command = $cmd",
            "  description = COMPILE $id",
            "",
        ]
        for t in targets:
            source = self.kernels_dir / space.get_family(t.config.family).source
            wrapper = ["/bin/sh", "compile.sh", f"t{t.index}/{LOG}", str(self.timeout_s)]
            if self.ptxas is None:
                argv = [*wrapper, str(self.nvcc), *self.flags, f"-I{self.kernels_dir}", *t.defines, str(source),
                        "-o", f"t{t.index}/{CUBIN}"]
            else:
                argv = [*wrapper, *ptxas_swap.two_step_command(
                    self.nvcc, ptxas_swap.ptx_flags(self.flags, self.arch.gencode), self.ptxas,
                    ptxas_swap.ptxas_arguments(str(self.nvcc), tuple(self.flags), str(source)),
                    [f"-I{self.kernels_dir}", *t.defines], source, f"t{t.index}/{PTX}", f"t{t.index}/{CUBIN}")]
            command = " ".join(shlex.quote(a) for a in argv).replace("$", "$$")  # $ is ninja's escape
            lines += [f"build t{t.index}/{CUBIN}: nvcc", f"  cmd = {command}", f"  id = t{t.index}", ""]
        return "\n".join(lines)

    def _collect(self, target: _Target) -> BuildResult:
        """Turn a finished target into a cache entry (when cacheable) and its BuildResult."""
        log = (target.dir / LOG).read_text(errors="replace") if (target.dir / LOG).is_file() else ""
        try:
            rc_text, ms_text = (target.dir / f"{LOG}.status").read_text().split()
            rc, seconds = int(rc_text), int(ms_text) / 1000
        except (OSError, ValueError):
            rc, seconds = -1, 0.0
        cubin = target.dir / CUBIN
        (target.dir / PTX).unlink(missing_ok=True)
        family = space.get_family(target.config.family)
        report, error, cubin_hash = None, None, None
        if rc == 0 and cubin.is_file():
            try:
                report = parse_report(log, family.entry, seconds)
                cubin_hash = hashlib.sha256(cubin.read_bytes()).hexdigest()
            except PtxasParseError as e:
                error = str(e)
        elif rc in TIMEOUT_CODES:
            error = f"nvcc timed out after {self.timeout_s:g} s (timeout_s)"
        else:
            error = _error_text(log) or f"nvcc exited with {rc} and no output"
        ok = error is None
        if not ok:
            cubin.unlink(missing_ok=True)
        else:
            self._compiled[target.key] = cubin_hash
        meta = {
            "key": target.key, "config_key": target.config.key, "config": target.config.as_dict(),
            "problem": dataclasses.asdict(target.problem), "arch": self.arch.name, "gencode": self.arch.gencode,
            "nvcc": str(self.nvcc), "nvcc_version": self.nvcc_version, "flags": self.flags,
            "ptxas": str(self.ptxas) if self.ptxas else None,
            "defines": target.defines, "ok": ok, "error": error, "exit_code": rc,
            "report": report.as_dict() if report else None, "compile_seconds": seconds,
            "cubin_hash": cubin_hash, "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        }
        (target.dir / META).write_text(json.dumps(meta, indent=2) + "\n")
        (target.dir / f"{LOG}.status").unlink(missing_ok=True)
        _keep_private(target.dir)
        if rc in UNCACHEABLE_CODES or rc < 0:  # the work dir is deleted after the build: the log goes into the error text
            meta["error"] = f"{error}\n{log[-2000:]}" if log.strip() else error
            return self._result(target.config, target.problem, target.key, None, meta, cached=False)
        return self._result(target.config, target.problem, target.key, self._publish(target), meta, cached=False)

    def _publish(self, target: _Target) -> Path:
        """Move the finished target directory into the cache. If another process got there first, keep theirs
        when its cubin is the one just built (same bytes: the result's hash checks them again when they are
        loaded); else theirs is not what these sources compile to, and it is moved aside for ours."""
        final = self.entry_dir(target.key)
        final.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(2):
            try:
                os.rename(target.dir, final)
                return final
            except OSError:
                if not (final / META).is_file():
                    raise
            ours = self._compiled.get(target.key) if (target.dir / CUBIN).is_file() else None
            try:
                theirs = file_sha256(final / CUBIN)
            except OSError:
                theirs = None
            if ours is None or theirs == ours:
                _keep_private(final)  # ours from an earlier process under a looser umask: trusted from now on
                return final
            aside = self._set_aside(final)
            warnings.warn(f"autotune: kernel cache entry {final} ({target.config.key}): its kernel.cubin "
                          f"(sha256 {str(theirs)[:12]}) is not what this build of the same key made ({ours[:12]}); "
                          f"moved to {aside}, replaced by this build", CacheIntegrityWarning, stacklevel=5)
        return final


def _error_text(log: str, limit: int = 40) -> str:
    """The compiler's error lines (e.g. `flash_fwd.cu(12): error: static assertion failed with "rule: ..."`)."""
    lines = log.splitlines()
    errors = [ln.strip() for ln in lines if re.search(r"\berror\b", ln, re.IGNORECASE)]
    chosen = errors or [ln for ln in lines if ln.strip()][-20:]
    return "\n".join(chosen[:limit])


def provenance(builder, families) -> dict:
    """Study/store provenance of the kernels being built: the digest of the sources these families compile
    from (sources_digest), and the compiler."""
    out = {}
    if getattr(builder, "kernels_dir", None) is not None and hasattr(builder, "sources_digest"):
        out["kernel_source_hash"] = builder.sources_digest(families)
    version = getattr(builder, "nvcc_version", None)
    if version:
        out["nvcc_version"] = version
    return out


def cubin_key(cubin_hash: str | None, config: Config, problem) -> tuple | None:
    """Identical bytes launched with identical geometry measure the same: time them once."""
    if not cubin_hash:
        return None
    lay = space.layout(config, problem)
    return cubin_hash, lay.threads, lay.smem_static, lay.smem_dynamic, lay.rows_per_block, lay.scheduler


__all__ = ["BuildError", "BuildReport", "BuildResult", "Builder", "CacheIntegrityWarning", "CubinMismatchError",
           "cache_exposure", "cubin_key", "written_by_others",
           "default_cache_dir", "default_kernels_dir", "define_flags", "family_sources", "provenance", "sources_digest"]
