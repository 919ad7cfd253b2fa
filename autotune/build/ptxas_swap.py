"""Assembling with a ptxas other than nvcc's own: `AUTOTUNE_PTXAS=/path/to/ptxas` (or Builder(ptxas=...)).

Why: the machine code of one PTX differs between ptxas releases. ptxas 13.0 (a CUDA 13.0 toolkit, the GPU host's)
issues the consecutive HGMMAs of the d128 S = Q·Kᵀ product 12 cycles apart; ptxas 13.5 (NVIDIA's
`nvidia-cuda-nvcc` wheel, which also brings the newer assembler FlashAttention-4's wheels run) 4 cycles apart,
from the same PTX (docs/benchmarks.md, "ptxas 13.5"). A newer ptxas assembles older PTX, so the front end
(nvcc, cicc, headers) can stay the toolkit's and only the last step changes.

nvcc has no option naming its ptxas (its nvcc.profile puts its own bin/ first on PATH), so a swapped build is
two steps: `nvcc -ptx` with the build's flags, then the chosen ptxas with exactly the arguments nvcc would have
given its own (read once from `nvcc -dryrun` of the real -cubin command, so flags such as -lineinfo or -Xptxas
options map as nvcc maps them). The swap is part of the compiler's identity: `toolchain_version` appends the
ptxas's version to nvcc's, which goes into every cache key and every table row's provenance.
"""
from __future__ import annotations

import functools
import os
import shlex
import subprocess
from pathlib import Path
from typing import Sequence

from .nvcc import NvccNotFoundError, tool_release

ENV = "AUTOTUNE_PTXAS"


class PtxasSwapError(NvccNotFoundError):
    """The ptxas asked for cannot be used; the message names where it was asked for and what is wrong. A kind of
    NvccNotFoundError (no usable toolchain), so every command that reports a missing nvcc in one line reports this
    the same way."""


def requested_ptxas(explicit: str | os.PathLike | None = None) -> Path | None:
    """The ptxas to assemble with instead of nvcc's own: `explicit`, else $AUTOTUNE_PTXAS, else None (nvcc's).
    Raises PtxasSwapError when the one named is not an executable file."""
    source, value = ("ptxas", explicit) if explicit else (f"${ENV}", os.environ.get(ENV) or None)
    if not value:
        return None
    path = Path(value).expanduser()
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise PtxasSwapError(f"{source}: expected an executable ptxas, got {str(value)!r} (not an executable file); "
                             f"unset {ENV} to assemble with nvcc's own ptxas")
    return path.resolve()


def ptxas_version(ptxas: str) -> str:
    """ptxas's release and build lines, e.g. 'Cuda compilation tools, release 13.5, V13.5.37; Build ...'."""
    return tool_release(ptxas, "ptxas", PtxasSwapError)


def toolchain_version(nvcc_version: str, ptxas_version: str | None) -> str:
    """nvcc's version, with a swapped ptxas's appended when there is one (the cache key's compiler identity)."""
    return nvcc_version if ptxas_version is None else f"{nvcc_version}; ptxas {ptxas_version}"


def ptx_flags(flags: Sequence[str], gencode: str) -> list[str]:
    """The build's nvcc flags for the PTX step: -cubin becomes -ptx, the -Xptxas options go (they belong to the
    ptxas step, which gets them from nvcc -dryrun), and the gencode emits the virtual arch's PTX."""
    arch = gencode.split(",")[0]  # 'arch=compute_90a'
    virtual = arch.split("=", 1)[1]
    out, skip = [], False
    for flag in flags:
        if skip:
            skip = False
            continue
        if flag == "-Xptxas":
            skip = True
            continue
        if flag.startswith(("-Xptxas=", "--ptxas-options")):
            continue
        if flag == "-cubin":
            out.append("-ptx")
        elif flag.startswith("-gencode="):
            out.append(f"-gencode={arch},code={virtual}")
        else:
            out.append(flag)
    return out


@functools.lru_cache(maxsize=None)
def ptxas_arguments(nvcc: str, flags: tuple[str, ...], source: str) -> tuple[str, ...]:
    """The arguments nvcc gives its ptxas for this build, without the input and -o output: from the `#$ ptxas`
    line of `nvcc -dryrun` (nothing is compiled; asked once per nvcc, flags and source in a process)."""
    cmd = [nvcc, "-dryrun", *flags, source, "-o", "kernel.cubin"]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        raise PtxasSwapError(f"could not run `{shlex.join(cmd)}`: {e}") from e
    for line in (run.stdout + run.stderr).splitlines():
        words = shlex.split(line[2:]) if line.startswith("#$") else []
        if words and Path(words[0]).name == "ptxas":
            args, skip = [], False
            for word in words[1:]:
                if skip:
                    skip = False
                elif word == "-o":
                    skip = True
                elif not word.endswith(".ptx"):
                    args.append(word)
            return tuple(args)
    raise PtxasSwapError(f"`{shlex.join(cmd)}` printed no ptxas step (exit {run.returncode}):\n"
                         f"{(run.stdout + run.stderr)[-2000:]}")


def two_step_command(nvcc: str | os.PathLike, ptx_step_flags: Sequence[str], ptxas: Path,
                     ptxas_args: Sequence[str], includes_defines: Sequence[str], source: str | os.PathLike,
                     ptx: str, cubin: str) -> list[str]:
    """argv (through /bin/sh -c) that writes `ptx` with nvcc and assembles it into `cubin` with `ptxas`."""
    front = [str(nvcc), *ptx_step_flags, *includes_defines, str(source), "-o", ptx]
    back = [str(ptxas), *ptxas_args, ptx, "-o", cubin]
    return ["/bin/sh", "-c", f"{shlex.join(front)} && {shlex.join(back)}"]
