"""Parse the resource report that `nvcc -Xptxas -v` prints into a BuildReport.

ptxas prints, per function (entry kernels and non-inlined device functions alike):

    ptxas info    : Compiling entry function 'flash_fwd_mma_sync' for 'sm_90'
    ptxas info    : Function properties for flash_fwd_mma_sync
        0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
    ptxas info    : Used 168 registers, used 1 barriers, 49152 bytes smem, 400 bytes cmem[0]

Fields whose value is zero are often left out (no 'bytes smem' for a kernel without static shared memory),
so a missing field reads as 0. Only the register count is required: without it there is no report at all.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass

_COMPILING = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
_PROPERTIES = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame")
_SPILL_STORES = re.compile(r"(\d+) bytes spill stores")
_SPILL_LOADS = re.compile(r"(\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


class PtxasParseError(ValueError):
    """The log holds no usable report for the requested function."""


@dataclass(frozen=True)
class BuildReport:
    registers: int
    spill_stores: int       # bytes
    spill_loads: int        # bytes
    stack_bytes: int        # stack frame per thread
    smem_static: int        # bytes of static __shared__ (dynamic shared memory is not known to ptxas)
    compile_seconds: float  # wall time of the whole nvcc call

    @property
    def spilled(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "BuildReport":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})


def parse_functions(log: str) -> dict[str, dict[str, int]]:
    """Every function the log reports on: name -> the fields found for it (absent fields are absent)."""
    functions: dict[str, dict[str, int]] = {}
    entry = None       # the function the next 'Used N registers' line belongs to
    properties = None  # the function the next 'bytes stack frame' line belongs to
    for line in log.splitlines():
        if m := _COMPILING.search(line):
            entry = m.group(1)
            functions.setdefault(entry, {})
            continue
        if m := _PROPERTIES.search(line):
            properties = m.group(1)
            functions.setdefault(properties, {})
            continue
        if properties and (m := _FRAME.search(line)):
            fields = functions[properties]
            fields["stack_bytes"] = int(m.group(1))
            for key, pattern in (("spill_stores", _SPILL_STORES), ("spill_loads", _SPILL_LOADS)):
                if m := pattern.search(line):
                    fields[key] = int(m.group(1))
            properties = None
            continue
        if entry and (m := _USED.search(line)):
            fields = functions[entry]
            fields["registers"] = int(m.group(1))
            if m := _SMEM.search(line):
                fields["smem_static"] = int(m.group(1))
            entry = None
    return functions


def parse_report(log: str, entry: str, compile_seconds: float = 0.0) -> BuildReport:
    """The BuildReport of the entry function `entry`; raises PtxasParseError if the log has none."""
    functions = parse_functions(log)
    fields = functions.get(entry)
    if fields is None or "registers" not in fields:
        seen = ", ".join(sorted(functions)) or "none"
        raise PtxasParseError(
            f"ptxas log: no register report for entry function {entry!r} (functions seen: {seen}); "
            "was the build run with -Xptxas -v?"
        )
    return BuildReport(
        registers=fields["registers"],
        spill_stores=fields.get("spill_stores", 0),
        spill_loads=fields.get("spill_loads", 0),
        stack_bytes=fields.get("stack_bytes", 0),
        smem_static=fields.get("smem_static", 0),
        compile_seconds=float(compile_seconds),
    )
