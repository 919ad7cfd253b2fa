"""What a build's hot loop executes, read from its SASS: no GPU needed.

nvdisasm (the CUDA toolkit's, or the `nvidia-cuda-nvdisasm` wheel: `pip install 'autotune[sass]'`) turns the
cubin into JSON: one record per instruction with its opcode, operands, predicate and, for a build compiled with
`-lineinfo` (same machine code, plus a line table), the source file and line it came from.

The *hot loop* is the loop (a backward branch and the range it jumps back over) holding the most matrix-multiply
instructions: the K/V tile loop in both kernel families. Its basic blocks are listed with their size, opcode mix,
source lines and how control enters them, because a loop's static instruction count is not what one iteration
executes: blocks such as the masking of a partial tile or the range-checked load of the last tile run on a few
iterations only, and telling them from the every-iteration path is the reader's call (the source lines make it
easy). That reading is what found the cp.async address arithmetic that cost the mma_sync family 8-12 % (see
docs/benchmarks.md).

Each instruction also carries its *control code*, which ptxas writes into the top bits of the encoding (read from
`nvdisasm -hex`): how many cycles the warp stalls before it may issue its next instruction (the fixed-latency
dependencies and pipe throughputs ptxas scheduled for, what ncu reports as the `wait` stall), which scoreboard a
variable-latency result sets and which scoreboards the instruction waits on. A block's *issue cycles* are the sum
of its stall counts: the fewest cycles one warp needs to get through the block, before any wait on memory, a
barrier or another variable-latency result. Set against the tensor-core time of the GEMMs it runs beside, they
say which stretch of a loop can be on the critical path, and two builds (or two kernels) can be compared with no GPU.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from . import nvcc

# Matrix-multiply opcodes (the first dot-separated part): mma.sync (HMMA/IMMA), wgmma (HGMMA/IGMMA/QGMMA),
# tcgen05 on sm_100 (UTC*MMA).
MMA_OPCODES = frozenset({"HMMA", "IMMA", "DMMA", "HGMMA", "IGMMA", "QGMMA", "BGMMA", "UTCHMMA", "UTCQMMA", "UTCIMMA",
                         "UTCOMMA"})
BRANCHES = frozenset({"BRA", "JMP", "BRX", "JMX"})
ENDS_BLOCK = BRANCHES | {"EXIT", "RET", "CALL"}
LOCAL_MEMORY = frozenset({"LDL", "STL"})  # in a hot loop, register spills (or stack arrays) reloaded each iteration
# The control field is the top 23 bits (105-127) of the 128-bit instruction (Volta through Blackwell): the high
# 64-bit word shifted right by 41. Its low 4 bits are the stall count, bits 5-7 the scoreboard a variable-latency
# result sets, 8-10 the one a source read releases (7: none), 11-16 the scoreboards waited on.
CONTROL_SHIFT = 41
NO_SCOREBOARD = 7


@dataclass(frozen=True)
class Control:
    """An instruction's control code (see the module docstring)."""
    stall: int                    # cycles before this warp's next instruction may issue (0-15)
    write_scoreboard: int | None  # set when the (variable-latency) result is written; None: none
    read_scoreboard: int | None   # released once the sources are read; None: none
    wait_mask: int                # bit i: waits for scoreboard i before issuing

    @classmethod
    def from_high_word(cls, word: int) -> Control:
        c = word >> CONTROL_SHIFT
        wb, rb = (c >> 5) & 7, (c >> 8) & 7
        return cls(stall=c & 15, write_scoreboard=None if wb == NO_SCOREBOARD else wb,
                   read_scoreboard=None if rb == NO_SCOREBOARD else rb, wait_mask=(c >> 11) & 63)

    def text(self) -> str:
        """e.g. 's4', 's1 sb0', 's7 w0,2' (stall, the scoreboard set, the ones waited on)."""
        parts = [f"s{self.stall}"]
        if self.write_scoreboard is not None:
            parts.append(f"sb{self.write_scoreboard}")
        if self.wait_mask:
            parts.append("w" + ",".join(str(i) for i in range(6) if self.wait_mask >> i & 1))
        return " ".join(parts)


class NvdisasmNotFoundError(RuntimeError):
    pass


@dataclass(frozen=True)
class Instruction:
    address: int
    opcode: str        # the whole mnemonic, e.g. "HMMA.16816.F32"
    operands: str
    predicate: str     # "" or e.g. "@P0", "@!P0"
    file: str | None   # source file (a -lineinfo build), else None
    line: int | None
    control: Control | None = None  # from the encoding (disassemble() reads it; None where not read)

    @property
    def base(self) -> str:
        return self.opcode.split(".")[0]

    @property
    def target(self) -> int | None:
        """The branch target address, for a direct branch."""
        if self.base not in BRANCHES:
            return None
        m = re.search(r"0x([0-9a-fA-F]+)", self.operands)
        return int(m.group(1), 16) if m else None

    def text(self) -> str:
        return " ".join(x for x in (self.predicate, self.opcode, self.operands) if x)


@dataclass
class Block:
    start: int
    end: int                      # address of the last instruction
    instructions: list[Instruction]
    entered_from: list[int] = field(default_factory=list)  # branches jumping here (besides falling through)
    falls_through: bool = True    # the previous block can run into this one

    @property
    def opcodes(self) -> Counter:
        return Counter(i.base for i in self.instructions)

    def lines(self) -> list[tuple[str, int]]:
        return sorted({(i.file, i.line) for i in self.instructions if i.file and i.line})

    @property
    def issue_cycles(self) -> int | None:
        """The sum of the block's stall counts (see the module docstring); None where a control code is unknown."""
        if any(i.control is None for i in self.instructions):
            return None
        return sum(i.control.stall for i in self.instructions)


@dataclass
class Loop:
    start: int                    # the header block
    end: int                      # the (last) branch back to the header
    instructions: list[Instruction]  # the body's blocks in address order (out-of-line stubs included)
    blocks: list[Block]

    @property
    def opcodes(self) -> Counter:
        return Counter(i.base for i in self.instructions)

    @property
    def mma_count(self) -> int:
        return sum(n for op, n in self.opcodes.items() if op in MMA_OPCODES)

    def contains(self, other: Loop) -> bool:
        """other is a loop nested inside this one."""
        mine = {i.address for i in self.instructions}
        return other is not self and {i.address for i in other.instructions} < mine

    def stall_cycles_by_opcode(self) -> Counter:
        """Opcode → the sum of its stall counts over the loop's blocks (empty where control codes are unknown)."""
        out: Counter = Counter()
        for i in self.instructions:
            if i.control is not None:
                out[i.base] += i.control.stall
        return out


@dataclass
class Kernel:
    name: str
    instructions: list[Instruction]
    loops: list[Loop]

    @property
    def hot_loop(self) -> Loop | None:
        """The innermost loop holding matrix-multiply instructions (no loop inside it holds any): a persistent
        kernel's K/V loop, not the tile loop around it with its prologue's and epilogue's GEMMs. Of several such
        loops the one with the most; of equal counts the smallest. Without any, the smallest loop; None without
        loops."""
        with_mma = [lp for lp in self.loops if lp.mma_count]
        innermost = [lp for lp in with_mma if not any(lp.contains(other) for other in with_mma)]
        return max(innermost or self.loops, key=lambda lp: (lp.mma_count, -len(lp.instructions)), default=None)


# -- finding and running nvdisasm ---------------------------------------------------------------------------------

def find_nvdisasm() -> Path:
    """$AUTOTUNE_NVDISASM, $CUDA_HOME/bin, PATH, next to nvcc, then the nvidia-cuda-nvdisasm wheel; raises
    NvdisasmNotFoundError saying where it looked and how to get one."""
    candidates: list[tuple[str, Path]] = []  # (where, path)
    if os.environ.get("AUTOTUNE_NVDISASM"):
        candidates.append(("$AUTOTUNE_NVDISASM", Path(os.environ["AUTOTUNE_NVDISASM"])))
    if os.environ.get("CUDA_HOME"):
        candidates.append(("$CUDA_HOME/bin", Path(os.environ["CUDA_HOME"]) / "bin" / "nvdisasm"))
    if shutil.which("nvdisasm"):
        candidates.append(("PATH", Path(shutil.which("nvdisasm"))))
    try:
        candidates.append(("next to nvcc", nvcc.find_nvcc().parent / "nvdisasm"))
    except Exception:  # noqa: BLE001  (no nvcc: the wheel may still be there)
        pass
    candidates += [("the nvidia-cuda-nvdisasm wheel", c) for c in _wheel_candidates()]
    for _, c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    tried = [f"{where}: {c} (not an executable file)" for where, c in candidates]
    raise NvdisasmNotFoundError(
        "nvdisasm not found; looked at:\n  - "
        + "\n  - ".join(tried or ["$AUTOTUNE_NVDISASM, $CUDA_HOME, PATH, nvcc's directory, the wheel: none set"])
        + "\nFix: `pip install nvidia-cuda-nvdisasm` (or `pip install 'autotune[sass]'`), install the full CUDA "
        "toolkit, or point $AUTOTUNE_NVDISASM at an nvdisasm executable.")


def _wheel_candidates() -> list[Path]:
    """nvdisasm inside the nvidia-cuda-nvdisasm wheel (nvidia/cu<major>/bin/nvdisasm in the `nvidia` namespace)."""
    try:
        import nvidia  # namespace package of NVIDIA's wheels
    except ImportError:
        return []
    found = []
    for root in getattr(nvidia, "__path__", []):
        found += sorted(Path(root).glob("*/bin/nvdisasm"), reverse=True)  # cu13 before cu12
    return found


def disassemble(cubin: str | os.PathLike, nvdisasm: str | os.PathLike | None = None) -> list[Kernel]:
    """Every kernel function of the cubin, its instructions (with their control codes) and loops."""
    tool = Path(nvdisasm) if nvdisasm else find_nvdisasm()
    kernels = parse_json(_run_nvdisasm(tool, cubin, "-g", "-json"))
    # the JSON form leaves the encodings out: the control codes come from the text listing with -hex
    return attach_controls(kernels, parse_hex_listing(_run_nvdisasm(tool, cubin, "-c", "-hex")))


def _run_nvdisasm(tool: Path, cubin: str | os.PathLike, *flags: str) -> str:
    proc = subprocess.run([str(tool), *flags, str(cubin)], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"nvdisasm failed on {cubin} (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    return proc.stdout


_SECTION = re.compile(r"^\s*\.text\.(\S+):\s*$")
_WORD = re.compile(r"/\*\s*0x([0-9a-fA-F]{16})\s*\*/")


def parse_hex_listing(text: str) -> dict[str, list[Control]]:
    """`nvdisasm -c -hex` output → function name → its instructions' control codes in order. Each instruction's
    encoding is printed as two 64-bit words, the low one after the instruction and the high one on the next line."""
    out: dict[str, list[int]] = {}
    words: list[int] | None = None
    for line in text.splitlines():
        m = _SECTION.match(line)
        if m:
            words = out.setdefault(m.group(1), [])
            continue
        if words is not None:
            words.extend(int(w, 16) for w in _WORD.findall(line))
    controls = {}
    for name, ws in out.items():
        if len(ws) % 2:
            raise ValueError(f"nvdisasm -hex: function {name} has an odd number of encoding words ({len(ws)})")
        controls[name] = [Control.from_high_word(hi) for hi in ws[1::2]]
    return controls


def attach_controls(kernels: list[Kernel], controls: dict[str, list[Control]]) -> list[Kernel]:
    """The kernels with each instruction's control code; raises ValueError where a function's instruction count
    differs between the two listings (they would be paired wrongly)."""
    out = []
    for k in kernels:
        ctl = controls.get(k.name)
        if ctl is None:
            raise ValueError(f"nvdisasm -hex: no listing of function {k.name} (functions: {sorted(controls)})")
        if len(ctl) != len(k.instructions):
            raise ValueError(f"nvdisasm: function {k.name} has {len(k.instructions)} instructions in the JSON "
                             f"listing and {len(ctl)} encodings in the -hex one")
        instrs = [dataclasses.replace(i, control=c) for i, c in zip(k.instructions, ctl)]
        out.append(Kernel(k.name, instrs, find_loops(instrs)))
    return out


def parse_json(text: str) -> list[Kernel]:
    """nvdisasm -json output → kernels. The document is [header, [function, ...], line table?]."""
    doc = json.loads(text)
    if not isinstance(doc, list) or len(doc) < 2:
        raise ValueError("nvdisasm JSON: expected [header, functions, ...]")
    files: list[str | None] = []
    if len(doc) > 2 and isinstance(doc[2], dict) and "files" in doc[2]:
        dirs = doc[2].get("directories", [])
        for f in doc[2]["files"]:
            d = dirs[f["dir-idx"]] if 0 <= f.get("dir-idx", -1) < len(dirs) else ""
            files.append(str(Path(d) / f["file"]) if d else f["file"])
    kernels = []
    for fn in doc[1]:
        base = int(fn.get("start", 0))
        instrs = []
        for n, rec in enumerate(fn.get("sass-instructions", [])):
            fid = rec.get("source-file-id")
            instrs.append(Instruction(
                address=base + 16 * n, opcode=rec.get("opcode", ""), operands=rec.get("operands", ""),
                predicate=rec.get("predicate", ""),
                file=files[fid] if isinstance(fid, int) and 0 <= fid < len(files) else None,
                line=rec.get("source-line")))
        kernels.append(Kernel(fn.get("function-name", "?"), instrs, find_loops(instrs)))
    return kernels


# -- control flow -------------------------------------------------------------------------------------------------

def basic_blocks(instrs: list[Instruction]) -> list[Block]:
    """The function's basic blocks in address order, with their predecessors (`entered_from`: branch addresses;
    `falls_through`: the previous block can run into this one)."""
    if not instrs:
        return []
    addresses = {i.address for i in instrs}
    entered: dict[int, list[int]] = {}
    for ins in instrs:
        t = ins.target
        if t is not None and t in addresses:
            entered.setdefault(t, []).append(ins.address)
    leaders = {instrs[0].address} | set(entered)
    for a, b in zip(instrs, instrs[1:]):
        if a.base in ENDS_BLOCK:
            leaders.add(b.address)
    blocks: list[Block] = []
    current: list[Instruction] = []
    for ins in instrs:
        if ins.address in leaders and current:
            blocks.append(Block(current[0].address, current[-1].address, current,
                                sorted(entered.get(current[0].address, []))))
            current = []
        current.append(ins)
    blocks.append(Block(current[0].address, current[-1].address, current, sorted(entered.get(current[0].address, []))))
    blocks[0].falls_through = False
    for prev, blk in zip(blocks, blocks[1:]):
        blk.falls_through = not _unconditional_exit(prev.instructions[-1])
    return blocks


def _unconditional_exit(ins: Instruction) -> bool:
    """An unpredicated jump, return or exit: control never runs into the next instruction."""
    return ins.base in (BRANCHES | {"EXIT", "RET"}) and ins.predicate in ("", "@PT")


def successors(blocks: list[Block]) -> dict[int, list[int]]:
    """Block start → the starts of the blocks control can go to next (indirect branches: unknown, none listed)."""
    start_of = {b.start: b for b in blocks}
    out: dict[int, list[int]] = {}
    for n, b in enumerate(blocks):
        last = b.instructions[-1]
        nxt = [blocks[n + 1].start] if n + 1 < len(blocks) and not _unconditional_exit(last) else []
        t = last.target
        out[b.start] = nxt + ([t] if t is not None and t in start_of and t not in nxt else [])
    return out


def dominators(blocks: list[Block], succ: dict[int, list[int]]) -> dict[int, set[int]]:
    """Block start → the starts of the blocks that dominate it (every path from the entry passes them)."""
    if not blocks:
        return {}
    entry = blocks[0].start
    order: list[int] = []  # reverse post-order from the entry
    seen, stack = {entry}, [(entry, iter(succ[entry]))]
    while stack:
        node, it = stack[-1]
        child = next(it, None)
        if child is None:
            order.append(node)
            stack.pop()
        elif child not in seen:
            seen.add(child)
            stack.append((child, iter(succ[child])))
    order.reverse()
    preds: dict[int, list[int]] = {b: [] for b in order}
    for a in order:
        for b in succ[a]:
            if b in preds:
                preds[b].append(a)
    dom = {b: set(order) for b in order}
    dom[entry] = {entry}
    changed = True
    while changed:
        changed = False
        for b in order[1:]:
            new = set.intersection(*(dom[p] for p in preds[b])) | {b} if preds[b] else {b}
            if new != dom[b]:
                dom[b], changed = new, True
    return dom


def find_loops(instrs: list[Instruction]) -> list[Loop]:
    """The natural loops: one per header, a block that dominates a block branching back to it. Out-of-line code
    (e.g. an mbarrier wait's retry stub placed after the function's end) that jumps back into the middle of the
    function is not a loop unless it is part of one; stubs entered from a loop's body are part of that loop."""
    blocks = basic_blocks(instrs)
    succ = successors(blocks)
    dom = dominators(blocks, succ)
    preds: dict[int, list[int]] = {b.start: [] for b in blocks}
    for a, outs in succ.items():
        for b in outs:
            preds[b].append(a)
    bodies: dict[int, set[int]] = {}
    for tail, outs in succ.items():
        for head in outs:
            if head in dom.get(tail, ()):  # a back edge
                body, work = bodies.setdefault(head, {head}), [tail]
                while work:
                    n = work.pop()
                    if n not in body:
                        body.add(n)
                        work.extend(preds[n])
    start_of = {b.start: b for b in blocks}
    loops = []
    for head, body in sorted(bodies.items()):
        members = [start_of[s] for s in sorted(body)]
        back = max(b.end for b in members if head in succ[b.start])
        loops.append(Loop(head, back, [i for b in members for i in b.instructions], members))
    return loops


# -- reading the source lines ---------------------------------------------------------------------------------------

def line_ranges(lines: list[tuple[str, int]]) -> str:
    """Source lines as compact runs per file: [('…/flash_fwd.cu', 280), ('…/flash_fwd.cu', 281),
    ('…/ptx.cuh', 16)] → 'flash_fwd.cu:280-281 ptx.cuh:16'."""
    by_file: dict[str, list[int]] = {}
    for f, n in lines:
        by_file.setdefault(Path(f).name, []).append(n)
    parts = []
    for name, nums in by_file.items():
        nums = sorted(set(nums))
        runs, start = [], nums[0]
        for a, b in zip(nums, nums[1:] + [None]):
            if b is None or b > a + 3:  # gaps of a few lines (comments, braces) do not split a run
                runs.append(f"{start}" if start == a else f"{start}-{a}")
                if b is not None:
                    start = b
        parts.append(f"{name}:{','.join(runs)}")
    return " ".join(parts)


def source_line(path: str | None, line: int | None) -> str:
    if not path or not line:
        return ""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for n, text in enumerate(f, 1):
                if n == line:
                    return text.strip()
    except OSError:
        pass
    return ""


__all__ = ["Block", "Control", "Instruction", "Kernel", "Loop", "MMA_OPCODES", "NvdisasmNotFoundError",
           "attach_controls", "basic_blocks", "disassemble", "dominators", "find_loops", "find_nvdisasm", "line_ranges",
           "parse_hex_listing", "parse_json", "source_line", "successors"]
