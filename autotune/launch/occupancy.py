"""Resident CTAs per SM from a build's resources: the static estimate recorded for every built trial.

The CUDA occupancy calculator's arithmetic (registers are allocated per warp in units of 256; each block also
reserves `smem_reserved_per_block` bytes of shared memory). The evaluator may report the driver's own figure
(cuOccupancyMaxActiveBlocksPerMultiprocessor), which then wins; this one also covers trials never run
(spilled ones, for instance), so the report can compare occupancy across every built config.
"""
from __future__ import annotations

from space import Arch

# Resident blocks per SM, from the programming guide's per-compute-capability table.
MAX_BLOCKS_PER_SM = {"sm_80": 32, "sm_86": 16, "sm_89": 24, "sm_90": 32, "sm_100": 32, "sm_103": 32, "sm_120": 32}
REGISTER_ALLOCATION_UNIT = 256  # registers, per warp


def blocks_per_sm(arch: Arch, threads: int, registers: int, smem_bytes: int) -> int:
    """How many CTAs of this kernel fit on one SM at once (0: not even one)."""
    if threads <= 0:
        raise ValueError(f"threads: expected a positive count, got {threads}")
    warps = -(-threads // 32)
    limits = [MAX_BLOCKS_PER_SM.get(arch.name, 32), arch.max_threads_per_sm // (warps * 32)]
    if registers > 0:
        per_warp = -(-registers * 32 // REGISTER_ALLOCATION_UNIT) * REGISTER_ALLOCATION_UNIT
        limits.append((arch.registers_per_sm // per_warp) // warps)
    if smem_bytes > 0:
        limits.append(arch.smem_per_sm // (smem_bytes + arch.smem_reserved_per_block))
    return max(0, min(limits))


__all__ = ["MAX_BLOCKS_PER_SM", "blocks_per_sm"]
