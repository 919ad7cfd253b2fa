"""Locate the CUDA compiler driver (nvcc) and report its version.

Search order, first hit wins:
  1. `$CUDA_HOME/bin/nvcc`                      (an explicit choice beats everything)
  2. `nvcc` on `PATH`
  3. torch's `torch.utils.cpp_extension.CUDA_HOME`, without importing torch: torch computes it from $CUDA_HOME,
     $CUDA_PATH, nvcc on PATH and /usr/local/cuda, so what it adds to steps 1, 2 and 4 is `$CUDA_PATH/bin/nvcc`.
     Read from torch itself only when the process has imported torch already (importing it costs 2-8 s, which
     every `autotune build` and every build process would pay on a machine whose nvcc is the wheels')
  4. `/usr/local/cuda/bin/nvcc`                 (the installer's default)
  5. NVIDIA's CUDA 13 wheels (`pip install 'autotune[nvcc]'`): `nvidia/cu13/bin/nvcc` in the `nvidia` namespace
     package, with the headers (nvidia-cuda-runtime, nvidia-cuda-crt, nvidia-cuda-cccl) and cicc (nvidia-nvvm)
     it needs beside it

A system toolkit, wherever it is found, wins over the wheels: they are the fallback for machines without one.
`locate_nvcc` also says which of these places it came from (`autotune build` prints it).
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

DEFAULT_CUDA_HOME = Path("/usr/local/cuda")
WHEELS_HINT = ("`pip install 'autotune[nvcc]'` (NVIDIA's nvcc wheels: nvidia-cuda-nvcc, nvidia-cuda-crt, "
               "nvidia-cuda-cccl, nvidia-nvvm, nvidia-cuda-runtime)")
WHEELS = "NVIDIA's nvcc wheels"
# What nvcc needs beside it in a wheel-made CUDA root (nvcc.profile points at ../include and ../nvvm), and the
# wheel that brings each. nvidia-cuda-nvcc 13.5 depends on the runtime, crt and nvvm wheels but not on CCCL,
# whose nv/target cuda_fp16.h includes: without it every kernel fails to compile.
WHEEL_COMPANIONS = (("include/cuda_runtime.h", "nvidia-cuda-runtime"),
                    ("include/crt/host_config.h", "nvidia-cuda-crt"),
                    ("include/cccl/nv/target", "nvidia-cuda-cccl"),
                    ("nvvm/bin/cicc", "nvidia-nvvm"))


class NvccNotFoundError(FileNotFoundError):
    """No usable nvcc; the message lists every place that was searched."""


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _torch_cuda_home() -> str | None:
    """torch's idea of CUDA_HOME, or None when it has none. Taken from torch only when torch is imported already;
    else the one place torch.utils.cpp_extension looks that the other steps do not, $CUDA_PATH, so that finding
    nvcc never imports torch (an optional dependency, and seconds to import)."""
    if "torch" not in sys.modules:
        return os.environ.get("CUDA_PATH") or None
    try:
        from torch.utils import cpp_extension
    except Exception:  # a torch build that fails at import time
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


def wheel_cuda_homes() -> list[Path]:
    """CUDA roots made by NVIDIA's CUDA 13+ wheels: nvidia/cu<major>/ in each directory of the `nvidia` namespace
    package, newest major first. Empty when no such wheel is installed."""
    try:
        import nvidia  # namespace package of NVIDIA's wheels (no __init__.py)
    except ImportError:
        return []
    homes = [p for root in getattr(nvidia, "__path__", []) for p in Path(root).glob("cu[0-9]*") if p.is_dir()]
    return sorted(homes, key=lambda p: int(p.name[2:]) if p.name[2:].isdigit() else 0, reverse=True)


def _from_wheels(tried: list[str]) -> Path | None:
    """nvcc of the first wheel-made CUDA root that has it and its companions; else None, noting why in `tried`."""
    homes = wheel_cuda_homes()
    for home in homes:
        candidate = home / "bin" / "nvcc"
        if not _executable(candidate):
            tried.append(f"{WHEELS}: {candidate} (not an executable file)")
            continue
        missing = [wheel for rel, wheel in WHEEL_COMPANIONS if not (home / rel).is_file()]
        if missing:
            tried.append(f"{WHEELS}: {candidate} is there, but not what it compiles with: "
                         f"`pip install {' '.join(missing)}`")
            continue
        return candidate
    if not homes:
        tried.append(f"{WHEELS} (none installed)")
    return None


def locate_nvcc() -> tuple[Path, str]:
    """The nvcc to use and where it was found ("$CUDA_HOME", "PATH", ..., "NVIDIA's nvcc wheels"); raises
    NvccNotFoundError saying where it looked and how to fix it."""
    tried: list[str] = []

    found = _under(os.environ.get("CUDA_HOME"), "$CUDA_HOME", "$CUDA_HOME/bin/nvcc (CUDA_HOME is not set)", tried)
    if found:
        return found, "$CUDA_HOME"

    on_path = shutil.which("nvcc")
    if on_path:
        return Path(on_path), "PATH"
    tried.append("nvcc on PATH (not found)")

    found = _under(_torch_cuda_home(), "torch.utils.cpp_extension.CUDA_HOME",
                   "torch.utils.cpp_extension.CUDA_HOME (unknown: no $CUDA_PATH, and no torch imported that has one)",
                   tried)
    if found:
        return found, "torch's CUDA_HOME"

    candidate = DEFAULT_CUDA_HOME / "bin" / "nvcc"
    if _executable(candidate):
        return candidate, str(DEFAULT_CUDA_HOME)
    tried.append(f"{candidate} (not an executable file)")

    found = _from_wheels(tried)
    if found:
        return found, WHEELS

    raise NvccNotFoundError(
        "nvcc not found; looked at:\n  - " + "\n  - ".join(tried)
        + f"\nFix: {WHEELS_HINT}, or install the CUDA toolkit and set CUDA_HOME to its root (the directory "
        "holding bin/nvcc), e.g. `export CUDA_HOME=/usr/local/cuda-13.0`."
    )


def find_nvcc() -> Path:
    """The nvcc to use (locate_nvcc's path); raises NvccNotFoundError saying where it looked and how to fix it."""
    return locate_nvcc()[0]


def nvcc_version(nvcc: str | os.PathLike | None = None) -> str:
    """Full version of nvcc, e.g. 'Cuda compilation tools, release 13.0, V13.0.88; Build cuda_13.0.r13.0/...'.

    Part of every build cache key, so it must change whenever the compiler does (the build line does).
    """
    return tool_release(str(Path(nvcc) if nvcc else find_nvcc()), "nvcc", NvccNotFoundError)


@functools.lru_cache(maxsize=None)
def tool_release(tool: str, name: str, error: type[Exception]) -> str:
    """A CUDA tool's release and build lines (release_lines of its `--version`), once per tool and process;
    raises `error`, its message starting with `name`, when it cannot run."""
    try:
        out = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise error(f"{name}: could not run `{tool} --version`: {e}") from e
    return release_lines(out)


def release_lines(version_output: str) -> str:
    """A CUDA tool's `--version` output without the banner and copyright lines: the release and build lines that
    identify it, joined by '; ' (nvcc and ptxas print the same layout)."""
    lines = [ln.strip() for ln in version_output.splitlines() if ln.strip()]
    wanted = [ln for ln in lines if ln.startswith(("Cuda compilation tools", "Build "))]
    return "; ".join(wanted or lines)
