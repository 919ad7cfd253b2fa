"""autotune/build/sass.py and `autotune sass`: basic blocks, natural loops and the hot loop, on hand-made instruction
lists and on real builds of both kernel families (nvdisasm from the nvidia-cuda-nvdisasm wheel of the test extra)."""
from __future__ import annotations

import json

import pytest

import space
from autotune.build import sass
from autotune.build.sass import Instruction

ARCH = space.get_arch("sm_90")


def _program(lines: list[str]) -> list[Instruction]:
    """'[@P0] OPCODE operands' per line, 16 bytes apart from address 0."""
    out = []
    for n, text in enumerate(lines):
        parts = text.split()
        pred = parts.pop(0) if parts[0].startswith("@") else ""
        out.append(Instruction(16 * n, parts[0], " ".join(parts[1:]), pred, "k.cu", 100 + n))
    return out


def test_nested_loops_and_an_out_of_line_stub():
    prog = _program([
        "MOV R0, RZ",               # 0x00 entry
        "HMMA R4, R8, R10, R4",     # 0x10 outer loop head
        "HMMA R4, R8, R10, R4",     # 0x20 inner loop head
        "HMMA R4, R8, R10, R4",     # 0x30
        "@!P1 BRA 0x80",            # 0x40 to the out-of-line wait stub
        "@P0 BRA 0x20",             # 0x50 inner back edge
        "@P2 BRA 0x10",             # 0x60 outer back edge
        "EXIT",                     # 0x70
        "SYNCS R1",                 # 0x80 stub: waits, then jumps back into the inner loop
        "@!P1 BRA 0x80",            # 0x90
        "BRA 0x50",                 # 0xa0
    ])
    loops = {lp.start: lp for lp in sass.find_loops(prog)}
    # the stub jumping back to 0x50 is not a loop of its own (0x50 does not dominate it), only the spin at 0x80
    assert set(loops) == {0x10, 0x20, 0x80}
    inner, outer = loops[0x20], loops[0x10]
    assert inner.mma_count == 2 and outer.mma_count == 3
    assert {i.address for i in inner.instructions} >= {0x80, 0x90, 0xa0}  # the stub belongs to the inner loop
    assert 0x10 not in {i.address for i in inner.instructions}
    assert outer.contains(inner) and not inner.contains(outer) and not inner.contains(inner)
    # the innermost loop holding MMAs, though the outer one holds more (a persistent kernel's tile loop around its
    # K/V loop: the prologue's and epilogue's GEMMs run once per tile, the inner ones once per K/V tile)
    assert sass.Kernel("k", prog, list(loops.values())).hot_loop is inner


def test_hot_loop_prefers_the_innermost_of_equal_mma_counts():
    prog = _program([
        "MOV R0, RZ",               # 0x00
        "IADD3 R1, R1, 0x1, RZ",    # 0x10 outer head (no MMA of its own)
        "HMMA R4, R8, R10, R4",     # 0x20 inner head
        "@P0 BRA 0x20",             # 0x30
        "@P1 BRA 0x10",             # 0x40
        "EXIT",                     # 0x50
    ])
    k = sass.Kernel("k", prog, sass.find_loops(prog))
    assert len(k.loops) == 2 and k.hot_loop.start == 0x20


def test_blocks_know_how_they_are_entered():
    prog = _program(["@P0 BRA 0x30", "MOV R1, RZ", "BRA 0x40", "MOV R2, RZ", "EXIT"])
    blocks = sass.basic_blocks(prog)
    assert [(b.start, b.end) for b in blocks] == [(0x0, 0x0), (0x10, 0x20), (0x30, 0x30), (0x40, 0x40)]
    assert [b.falls_through for b in blocks] == [False, True, False, True]
    assert blocks[2].entered_from == [0x0] and blocks[3].entered_from == [0x20]
    assert sass.successors(blocks) == {0x0: [0x10, 0x30], 0x10: [0x40], 0x30: [0x40], 0x40: []}


def test_parse_json_maps_source_files_and_lines():
    doc = [{"SM": {"version": {"major": 9, "minor": 0}}},
           [{"function-name": "f", "start": 0, "length": 32, "sass-instructions": [
               {"opcode": "HMMA.16816.F32", "operands": "R4,R8,R10,R4", "source-file-id": 1, "source-line": 7},
               {"predicate": "@!P0", "opcode": "BRA", "operands": "0x0"}]}],
           {"directories": ["/src/a", "/inc"],
            "files": [{"dir-idx": 1, "file": "x.h"}, {"dir-idx": 0, "file": "k.cu"}]}]
    (k,) = sass.parse_json(json.dumps(doc))
    first, second = k.instructions
    assert (first.base, first.file, first.line) == ("HMMA", "/src/a/k.cu", 7)
    assert (second.predicate, second.target, second.file) == ("@!P0", 0x0, None)
    assert k.hot_loop.mma_count == 1
    with pytest.raises(ValueError, match="nvdisasm JSON"):
        sass.parse_json("{}")


def test_control_codes_decode_from_the_high_word():
    # FMNMX R3, R89, R12 from a wgmma build: 4 cycles before the next instruction (the next FMNMX of the chain)
    ctl = sass.Control.from_high_word(0x000fc80007800000)
    assert ctl == sass.Control(stall=4, write_scoreboard=None, read_scoreboard=None, wait_mask=0)
    assert ctl.text() == "s4"
    # every field at a distinct value, placed where the encoding keeps it (bits 105-127 of the instruction)
    word = (13 | 2 << 5 | 5 << 8 | 0b100101 << 11) << sass.CONTROL_SHIFT | 0x7800000
    ctl = sass.Control.from_high_word(word)
    assert (ctl.stall, ctl.write_scoreboard, ctl.read_scoreboard, ctl.wait_mask) == (13, 2, 5, 0b100101)
    assert ctl.text() == "s13 sb2 w0,2,5"


_HEX_LISTING = """
//--------------------- .text.f --------------------------
        .section        .text.f,"ax",@progbits
.text.f:
        /*0000*/                   MOV R1, c[0x0][0x28] ;                      /* 0x00000a0000017a02 */
                                                                               /* 0x000fc40000000f00 */
.L_x_0:
        /*0010*/                   MUFU.EX2 R2, R2 ;                           /* 0x0000000200027308 */
                                                                               /* 0x000e240000000800 */
//--------------------- .text.g --------------------------
.text.g:
        /*0000*/                   EXIT ;                                      /* 0x000000000000794d */
                                                                               /* 0x000fea0003800000 */
"""


def test_hex_listing_gives_each_function_its_control_codes_in_order():
    controls = sass.parse_hex_listing(_HEX_LISTING)
    assert [c.stall for c in controls["f"]] == [2, 2] and [c.stall for c in controls["g"]] == [5]
    assert controls["f"][1].write_scoreboard == 0 and controls["f"][0].write_scoreboard is None
    prog = _program(["MOV R1, c[0x0][0x28]", "MUFU.EX2 R2, R2"])
    (k,) = sass.attach_controls([sass.Kernel("f", prog, [])], controls)
    assert [i.control.stall for i in k.instructions] == [2, 2]
    assert sass.basic_blocks(k.instructions)[0].issue_cycles == 4
    assert sass.basic_blocks(prog)[0].issue_cycles is None  # unknown without the codes, never a made-up 0
    # a listing that does not pair up with the instructions is an error, not a shifted reading
    with pytest.raises(ValueError, match="1 encodings"):
        sass.attach_controls([sass.Kernel("g", prog, [])], controls)
    with pytest.raises(ValueError, match="no listing of function h"):
        sass.attach_controls([sass.Kernel("h", prog, [])], controls)
    with pytest.raises(ValueError, match="odd number"):
        sass.parse_hex_listing(".text.f:\n /*0000*/ MOV R1, R2 ; /* 0x00000a0000017a02 */\n")


def test_line_ranges_groups_runs_per_file():
    lines = [("/k/flash_fwd.cu", n) for n in (280, 281, 283, 300)] + [("/k/ptx.cuh", 16)]
    assert sass.line_ranges(lines) == "flash_fwd.cu:280-283,300 ptx.cuh:16"


def test_missing_nvdisasm_says_where_it_looked(monkeypatch, tmp_path):
    monkeypatch.setenv("AUTOTUNE_NVDISASM", str(tmp_path / "nope"))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.setattr(sass, "_wheel_candidates", lambda: [])
    monkeypatch.setattr("autotune.build.nvcc.find_nvcc", lambda: tmp_path / "bin" / "nvcc")
    with pytest.raises(sass.NvdisasmNotFoundError, match="pip install nvidia-cuda-nvdisasm"):
        sass.find_nvdisasm()


# ---- real builds ------------------------------------------------------------------------------------------------

def _nvdisasm():
    try:
        return sass.find_nvdisasm()
    except sass.NvdisasmNotFoundError as e:
        pytest.skip(str(e))


def _build(config, problem, cache):
    from autotune.build.builder import Builder

    result = Builder(ARCH, cache_dir=cache, extra_flags=["-lineinfo"]).build_one(config, problem)
    assert result.ok, result.error
    return result


def test_mma_sync_hot_loop_is_the_tile_loop_with_its_masking_block(build_cache_dir):
    tool = _nvdisasm()
    problem = space.Problem(128, "fp16", False)
    # FlashAttention-2's d128 tile (128×64, 4 warps × 1), the one docs/benchmarks.md reads (the default has Bc 32)
    config = space.default_config(problem, ARCH, "mma_sync").replace(br=128, bc=64, warps_m=4)
    kernels = sass.disassemble(_build(config, problem, build_cache_dir).cubin_path, tool)
    # the cubin also holds split-KV's flash_fwd_combine (a no-op without splits): the attention kernel by its name
    assert {k.name for k in kernels} == {space.get_family("mma_sync").entry, "flash_fwd_combine"}
    (kernel,) = [k for k in kernels if k.name == space.get_family("mma_sync").entry]
    loop = kernel.hot_loop
    # per warp and tile: S = Q Kᵀ is 2 m-tiles × 8 n-tiles × 8 k-steps, O += P V is 2 × 16 × 4 → 256 mma.sync
    assert loop.opcodes["HMMA"] == 256 == sum(1 for i in kernel.instructions if i.base == "HMMA")
    assert loop.opcodes["LDGSTS"] > 0  # the next K/V tiles are loaded inside the loop
    # the block that masks scores is a block of its own, and its source line is the masking line
    masking = max(loop.blocks, key=lambda b: b.opcodes["FSEL"])
    assert masking.opcodes["FSEL"] >= 64
    texts = {sass.source_line(f, n) for f, n in masking.lines()}
    assert any("-INFINITY" in t for t in texts), texts


def test_wgmma_hot_loop_is_not_the_whole_kernel(build_cache_dir):
    tool = _nvdisasm()
    problem = space.Problem(128, "fp16", False)
    config = space.default_config(problem, ARCH, "wgmma")
    kernels = sass.disassemble(_build(config, problem, build_cache_dir).cubin_path, tool)
    # the cubin also holds split-KV's flash_fwd_combine (no loop): the attention kernel is the one with HGMMA
    (kernel,) = [k for k in kernels if k.name == space.get_family("wgmma").entry]
    loop = kernel.hot_loop
    assert loop.opcodes["HGMMA"] > 0
    # mbarrier waits branch to retry stubs placed after the function body and jump back: those ranges are not
    # loops, so the hot loop is the consumer's tile loop, not most of the kernel
    assert len(loop.instructions) < len(kernel.instructions) / 2
    assert all(i.file is None or i.file.endswith((".cu", ".cuh", ".h", ".hpp")) for i in loop.instructions)


def test_persistent_wgmma_hot_loop_is_the_kv_loop_with_issue_cycles(build_cache_dir):
    tool = _nvdisasm()
    problem = space.Problem(128, "fp16", False)
    # the d128 rows' shipped ping-pong config: its tile loop holds the prologue's S and the epilogue's P·V too
    config = space.default_config(problem, ARCH, "wgmma").replace(
        consumer_wgs=2, bc=128, stages=2, overlap=True, pingpong=True, scheduler="persistent", o_rescale="before")
    kernels = sass.disassemble(_build(config, problem, build_cache_dir).cubin_path, tool)
    (kernel,) = [k for k in kernels if k.name == space.get_family("wgmma").entry]
    loop = kernel.hot_loop
    # one K/V tile: S = Q·Kᵀ and P·V, 8 k-steps of 16 each at d128 / Bc 128
    assert loop.opcodes["HGMMA"] == 16
    assert any(lp.contains(loop) for lp in kernel.loops)  # inside the persistent tile loop
    assert all(i.control is not None for i in kernel.instructions)
    # the softmax block: one MUFU.EX2 per probability (64 per thread per tile) and two for the row corrections;
    # ptxas spaces them by the MUFU pipe's rate, so the block cannot issue in fewer cycles than its exponentials
    softmax = max(loop.blocks, key=lambda b: b.opcodes["MUFU"])
    assert softmax.opcodes["MUFU"] == 66
    assert softmax.issue_cycles >= 66 * 4
    assert sum(loop.stall_cycles_by_opcode().values()) == sum(b.issue_cycles for b in loop.blocks)


def test_sass_command(build_cache_dir, capsys):
    _nvdisasm()
    from autotune.cli import main

    common = ["--head-dim", "64", "--arch", "sm_90", "--cache-dir", str(build_cache_dir)]
    assert main(["sass", "--family", "mma_sync", *common, "--by-line", "--top", "5", "--dump"]) == 0
    out = capsys.readouterr().out
    assert "hot loop  0x" in out and " HMMA" in out and "instructions per source line" in out
    assert "flash_fwd.cu:" in out
    assert main(["sass", *common, "--top", "0"]) == 2
    assert "--top" in capsys.readouterr().err
    assert main(["sass", *common, "--config", "mma_sync:br=7"]) == 2
    assert "--config" in capsys.readouterr().err
    assert main(["sass", "--arch", "sm_90"]) == 2
    assert "--head-dim is required" in capsys.readouterr().err


def test_sass_command_reads_a_cubin_of_its_own(build_cache_dir, capsys, tmp_path):
    tool = _nvdisasm()
    from autotune.cli import main

    problem = space.Problem(64, "fp16", False)
    cubin = _build(space.default_config(problem, ARCH, "wgmma"), problem, build_cache_dir).cubin_path
    assert main(["sass", "--cubin", str(cubin), "--kernel", "wgmma", "--dump"]) == 0
    out = capsys.readouterr().out
    assert "kernel    flash_fwd_wgmma" in out and "flash_fwd_combine" not in out
    assert "stalls    " in out and " cycles " in out
    assert any(line.strip().startswith("/*") and " s" in line for line in out.splitlines())  # control codes
    assert main(["sass", "--cubin", str(cubin), "--kernel", "nope"]) == 2
    assert "flash_fwd_wgmma" in capsys.readouterr().err  # names the functions there are
    assert main(["sass", "--cubin", str(tmp_path / "missing.cubin")]) == 2
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "junk.cubin").write_bytes(b"not an ELF file")
    assert main(["sass", "--cubin", str(tmp_path / "junk.cubin")]) == 1
    assert "--cubin" in capsys.readouterr().err
    assert tool
