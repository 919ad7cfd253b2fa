"""Locate the CUDA compiler driver (nvcc) and report its version.

Search order, first hit wins:
  1. `$CUDA_HOME/bin/nvcc`                      (an explicit choice beats everything)
  2. `nvcc` on `PATH`
  3. torch's `torch.utils.cpp_extension.CUDA_HOME`  (only if torch imports; it knows where its CUDA lives)
  4. `/usr/local/cuda/bin/nvcc`                 (the installer's default)
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

DEFAULT_CUDA_HOME = Path("/usr/local/cuda")


class NvccNotFoundError(FileNotFoundError):
    """No usable nvcc; the message lists every place that was searched."""


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _torch_cuda_home() -> str | None:
    """torch's idea of CUDA_HOME, or None when torch is absent or broken (it is an optional dependency)."""
    try:
        from torch.utils import cpp_extension
    except Exception:  # ImportError, or a torch build that fails at import time
        return None
    return cpp_extension.CUDA_HOME


def _under(home: str | None, name: str, unset: str, tried: list[str]) -> Path | None:
    """`home`/bin/nvcc when it is an executable file; else None, with why noted in `tried` (`name`: how the
    message calls that home; `unset`: what to say when it is not known at all)."""
    if not home:
        tried.append(unset)
        return None
    candidate = Path(home) / "bin" / "nvcc"
    if _executable(candidate):
        return candidate
    tried.append(f"{name}/bin/nvcc = {candidate} (not an executable file)")
    return None


def find_nvcc() -> Path:
    """The nvcc to use; raises NvccNotFoundError saying where it looked and how to fix it."""
    tried: list[str] = []

    found = _under(os.environ.get("CUDA_HOME"), "$CUDA_HOME", "$CUDA_HOME/bin/nvcc (CUDA_HOME is not set)", tried)
    if found:
        return found

    on_path = shutil.which("nvcc")
    if on_path:
        return Path(on_path)
    tried.append("nvcc on PATH (not found)")

    found = _under(_torch_cuda_home(), "torch.utils.cpp_extension.CUDA_HOME",
                   "torch.utils.cpp_extension.CUDA_HOME (torch not importable or CUDA_HOME unknown to it)", tried)
    if found:
        return found

    candidate = DEFAULT_CUDA_HOME / "bin" / "nvcc"
    if _executable(candidate):
        return candidate
    tried.append(f"{candidate} (not an executable file)")

    raise NvccNotFoundError(
        "nvcc not found; looked at:\n  - " + "\n  - ".join(tried)
        + "\nFix: install the CUDA toolkit and set CUDA_HOME to its root (the directory holding bin/nvcc), "
        "e.g. `export CUDA_HOME=/usr/local/cuda-13.0`."
    )


def nvcc_version(nvcc: str | os.PathLike | None = None) -> str:
    """Full version of nvcc, e.g. 'Cuda compilation tools, release 13.0, V13.0.88; Build cuda_13.0.r13.0/...'.

    Part of every build cache key, so it must change whenever the compiler does (the build line does).
    """
    return _version_of(str(Path(nvcc) if nvcc else find_nvcc()))


@functools.lru_cache(maxsize=None)
def _version_of(nvcc: str) -> str:
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise NvccNotFoundError(f"nvcc: could not run `{nvcc} --version`: {e}") from e
    # Drop the banner and copyright lines; keep the release and build lines that identify the compiler.
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    wanted = [ln for ln in lines if ln.startswith(("Cuda compilation tools", "Build "))]
    return "; ".join(wanted or lines)
