"""Per-architecture limits that decide whether a configuration can run at all.

Figures are the CUDA programming guide's per-compute-capability tables; the kernel's traits header
(kernels/sm80/traits.cuh) carries the same numbers for its static_asserts.
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Arch:
    name: str                  # "sm_90"
    major: int
    minor: int
    smem_optin_per_block: int  # bytes a block may use after cudaFuncSetAttribute(MaxDynamicSharedMemorySize)
    smem_per_sm: int           # bytes of shared memory per SM usable by blocks
    smem_reserved_per_block: int
    max_threads_per_sm: int
    registers_per_sm: int = 65536
    static_smem_limit: int = 48 * 1024
    max_threads_per_block: int = 1024
    families: tuple[str, ...] = ("mma_sync",)
    # SMs of the arch's usual data-centre part (A100, A40, L40, H100/H200, B200/B300, RTX 5090): what the untuned
    # defaults size split-KV grids for when no device is at hand (default_config_for_shape).
    sms: int = 132

    @property
    def cc(self) -> int:
        return self.major * 10 + self.minor

    @property
    def gencode(self) -> str:
        """nvcc -gencode value; Hopper's wgmma needs the arch-specific 'a' target."""
        suffix = "a" if "wgmma" in self.families else ""
        return f"arch=compute_{self.cc}{suffix},code=sm_{self.cc}{suffix}"


ARCHES: dict[str, Arch] = {
    a.name: a
    for a in (
        Arch("sm_80", 8, 0, 166912, 167936, 1024, 2048, sms=108),
        Arch("sm_86", 8, 6, 101376, 102400, 1024, 1536, sms=84),
        Arch("sm_89", 8, 9, 101376, 102400, 1024, 1536, sms=142),
        Arch("sm_90", 9, 0, 232448, 233472, 1024, 2048, families=("mma_sync", "wgmma"), sms=132),
        Arch("sm_100", 10, 0, 232448, 233472, 1024, 2048, sms=148),
        Arch("sm_103", 10, 3, 232448, 233472, 1024, 2048, sms=148),
        Arch("sm_120", 12, 0, 101376, 102400, 1024, 1536, sms=170),
    )
}


def get_arch(name: str | int | tuple[int, int]) -> Arch:
    """Accepts 'sm_90', 'sm90', '90', 90, (9, 0), 'sm_90a'."""
    if isinstance(name, tuple):
        key = f"sm_{name[0] * 10 + name[1]}"
    else:
        m = re.fullmatch(r"(?:sm_?|compute_?)?(\d{2,3})a?", str(name).strip().lower())
        if not m:
            raise ValueError(f"arch: expected a name like 'sm_90', got {name!r}")
        key = f"sm_{m.group(1)}"
    try:
        return ARCHES[key]
    except KeyError:
        raise ValueError(f"arch: {name!r} is not supported; known: {', '.join(ARCHES)}") from None
