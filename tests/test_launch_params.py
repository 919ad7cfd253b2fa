"""The ctypes mirror of FlashFwdParams matches the C header byte for byte, and bad inputs fail with clear errors.

Validation runs on CPU tensors through `require_cuda=False`; everything else it checks is device-independent.
"""
from __future__ import annotations

import ctypes
import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from autotune.launch.params import (  # noqa: E402
    LOG2_E, FlashFwdParams, make_params, validate_inputs,
)
from space import Problem  # noqa: E402

HEADER = Path(__file__).resolve().parent.parent / "kernels" / "common" / "flash_params.h"


# ---- layout against the C compiler ------------------------------------------------------------------------

def _header_fields() -> list[str]:
    """Field names declared in the struct, in order (comments stripped)."""
    text = re.sub(r"//[^\n]*", "", HEADER.read_text())
    body = re.search(r"struct\s+FlashFwdParams\s*\{(.*?)\};", text, re.S).group(1)
    names = []
    for decl in filter(None, (d.strip() for d in body.split(";"))):
        type_and_first, *rest = [part.strip() for part in decl.split(",")]
        names.append(re.findall(r"\w+", type_and_first)[-1])
        names += rest
    return names


def test_field_names_and_order_match_the_header():
    assert [name for name, _ in FlashFwdParams._fields_] == _header_fields()


def test_size_and_offsets_match_the_compiler(tmp_path):
    cxx = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler on PATH")
    fields = [name for name, _ in FlashFwdParams._fields_]
    prints = "\n".join(
        f'    std::printf("{n} %zu %zu\\n", offsetof(FlashFwdParams, {n}), sizeof(((FlashFwdParams*)0)->{n}));'
        for n in fields)
    source = tmp_path / "layout.cpp"
    source.write_text(f'#include <cstddef>\n#include <cstdio>\n#include "{HEADER}"\nint main() {{\n'
                      f'    std::printf("sizeof %zu %zu\\n", sizeof(FlashFwdParams), alignof(FlashFwdParams));\n'
                      f"{prints}\n    return 0;\n}}\n")
    exe = tmp_path / "layout"
    subprocess.run([cxx, "-std=c++17", str(source), "-o", str(exe)], check=True, capture_output=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split("\n")
    c_layout = {line.split()[0]: tuple(map(int, line.split()[1:])) for line in out if line}

    assert c_layout["sizeof"] == (ctypes.sizeof(FlashFwdParams), ctypes.alignment(FlashFwdParams))
    assert c_layout["sizeof"][0] == 208  # docs/CONTRACTS.md
    for name, ctype in FlashFwdParams._fields_:
        assert c_layout[name] == (getattr(FlashFwdParams, name).offset, ctypes.sizeof(ctype)), name


# ---- valid inputs fill the struct -------------------------------------------------------------------------

def qkvo(b=2, h=4, hk=4, nq=33, nk=40, d=64, dtype=torch.float16, layout="bhnd"):
    def make(heads, n):
        if layout == "bhnd":
            return torch.randn(b, heads, n, d).to(dtype)
        return torch.randn(b, n, heads, d).to(dtype).transpose(1, 2)  # (B,N,H,D) storage
    return make(h, nq), make(hk, nk), make(hk, nk), make(h, nq)


def test_make_params_fills_pointers_strides_and_scale():
    q, k, v, o = qkvo(layout="bnhd", hk=2)
    lse = torch.empty(2, 4, 33, dtype=torch.float32)
    p = make_params(q, k, v, o, lse, require_cuda=False)
    assert (p.q, p.k, p.v, p.o, p.lse) == (q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr())
    assert (p.q_batch_stride, p.q_head_stride, p.q_row_stride) == q.stride()[:3] == (33 * 4 * 64, 64, 4 * 64)
    assert (p.k_batch_stride, p.k_head_stride, p.k_row_stride) == k.stride()[:3]
    assert (p.v_batch_stride, p.v_head_stride, p.v_row_stride) == v.stride()[:3]
    assert (p.o_batch_stride, p.o_head_stride, p.o_row_stride) == o.stride()[:3]
    assert (p.batch, p.heads, p.kv_heads, p.seqlen_q, p.seqlen_k) == (2, 4, 2, 33, 40)
    assert p.scale_log2 == pytest.approx(LOG2_E / math.sqrt(64), rel=1e-6)
    assert make_params(q, k, v, o, scale=0.5, require_cuda=False).scale_log2 == pytest.approx(0.5 * LOG2_E, rel=1e-6)
    assert make_params(q, k, v, o, require_cuda=False).lse is None


def test_size_one_dims_accept_any_stride_and_get_stride_zero():
    base = torch.zeros(4096, dtype=torch.bfloat16)
    q = base.as_strided((1, 1, 1, 64), (3, 5, 7, 1))  # strides of size-1 dims are never used
    p = make_params(q, q, q, q, require_cuda=False)
    assert (p.q_batch_stride, p.q_head_stride, p.q_row_stride) == (0, 0, 0)


# ---- every bad input names its argument -------------------------------------------------------------------

def _bad(q, k, v, o, lse=None, **kw):
    kw.setdefault("require_cuda", False)
    return lambda: validate_inputs(q, k, v, o, lse, **kw)


def _strided(shape, stride, dtype=torch.float16):
    return torch.zeros(8 * math.prod(shape) + 64, dtype=dtype).as_strided(shape, stride)


BAD = {
    "q not a tensor": (lambda q, k, v, o: _bad(q.numpy(), k, v, o), r"^q: expected a torch\.Tensor"),
    "cpu tensor": (lambda q, k, v, o: _bad(q, k, v, o, require_cuda=True), r"^q: expected a CUDA tensor"),
    "rank 3": (lambda q, k, v, o: _bad(q[0], k, v, o), r"^q: expected a 4-d tensor"),
    "fp32": (lambda q, k, v, o: _bad(q.float(), k.float(), v.float(), o.float()), r"^q: expected dtype torch\.float16 or"),
    "mixed dtypes": (lambda q, k, v, o: _bad(q, k.bfloat16(), v, o), r"^k: expected the same dtype as q"),
    "o dtype": (lambda q, k, v, o: _bad(q, k, v, o.bfloat16()), r"^o: expected the same dtype as q"),
    "head_dim 48": (lambda q, k, v, o: _bad(*(t[..., :48].contiguous() for t in (q, k, v, o))),
                    r"^q: expected head_dim in \(64, 128, 256\)"),
    "k head_dim": (lambda q, k, v, o: _bad(q, torch.zeros(2, 4, 40, 128, dtype=q.dtype), v, o), r"^k: expected shape"),
    "k batch": (lambda q, k, v, o: _bad(q, k[:1], v[:1], o), r"^k: expected shape \(batch=2"),
    "v shape": (lambda q, k, v, o: _bad(q, k, v[:, :, :39], o), r"^v: expected the shape of k"),
    "o shape": (lambda q, k, v, o: _bad(q, k, v, o[:, :, :32]), r"^o: expected the shape of q"),
    "kv heads": (lambda q, k, v, o: _bad(q, k[:, :3], v[:, :3], o), r"^k: expected a head count that divides q's 4"),
    "empty q": (lambda q, k, v, o: _bad(q[:, :, :0], k, v, o[:, :, :0]), r"^q: expected a non-empty tensor \(seqlen"),
    "empty k": (lambda q, k, v, o: _bad(q, k[:, :, :0], v[:, :, :0], o), r"^k: expected a non-empty tensor \(seqlen"),
    "empty batch": (lambda q, k, v, o: _bad(q[:0], k[:0], v[:0], o[:0]), r"^q: expected a non-empty tensor \(batch"),
    "last dim strided": (lambda q, k, v, o: _bad(q, k, v, torch.zeros(2, 4, 64, 33, dtype=o.dtype).transpose(2, 3)),
                         r"^o: expected a contiguous last dim"),
    "misaligned": (lambda q, k, v, o: _bad(q, k, torch.zeros(v.numel() + 1, dtype=v.dtype)[1:].view(v.shape), o),
                   r"^v: expected a data pointer aligned to 16 bytes"),
    "row stride": (lambda q, k, v, o: _bad(q, _strided(k.shape, (4 * 40 * 68, 40 * 68, 68, 1)), v, o),
                   r"^k: expected a row stride that is a multiple of 8"),
    "head stride": (lambda q, k, v, o: _bad(_strided(q.shape, (4 * 2116, 2116, 64, 1)), k, v, o),
                    r"^q: expected a head stride that is a multiple of 8"),
    "batch stride": (lambda q, k, v, o: _bad(q, k, v, _strided(o.shape, (4 * 33 * 64 + 4, 33 * 64, 64, 1))),
                     r"^o: expected a batch stride that is a multiple of 8"),
    "lse dtype": (lambda q, k, v, o: _bad(q, k, v, o, torch.zeros(2, 4, 33, dtype=torch.float16)),
                  r"^lse: expected dtype torch\.float32"),
    "lse shape": (lambda q, k, v, o: _bad(q, k, v, o, torch.zeros(2, 4, 40)), r"^lse: expected shape \(batch, heads, seqlen_q\)"),
    "lse strided": (lambda q, k, v, o: _bad(q, k, v, o, torch.zeros(2, 33, 4).transpose(1, 2)),
                    r"^lse: expected a contiguous tensor"),
    "lse device": (lambda q, k, v, o: _bad(q, k, v, o, torch.zeros(2, 4, 33, device="meta")),
                   r"^lse: expected a tensor on q's device"),
    "lse type": (lambda q, k, v, o: _bad(q, k, v, o, [0.0]), r"^lse: expected a torch\.Tensor or None"),
    "problem head_dim": (lambda q, k, v, o: _bad(q, k, v, o, problem=Problem(128, "fp16")),
                         r"^q: expected head_dim 128 \(the kernel was compiled for d128-fp16-full\)"),
    "problem dtype": (lambda q, k, v, o: _bad(q, k, v, o, problem=Problem(64, "bf16")),
                      r"^q: expected dtype bf16 \(the kernel was compiled for d64-bf16-full\)"),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_input_raises_naming_the_argument(case):
    make, pattern = BAD[case]
    call = make(*qkvo())
    with pytest.raises(ValueError, match=pattern):
        call()


def test_bad_inputs_are_rejected_by_make_params_too():
    q, k, v, o = qkvo()
    with pytest.raises(ValueError, match=r"^q: expected a CUDA tensor"):
        make_params(q, k, v, o)  # require_cuda defaults to True
    for bad in (float("nan"), float("inf"), "x"):
        with pytest.raises(ValueError, match=r"^scale: expected a finite float"):
            make_params(q, k, v, o, scale=bad, require_cuda=False)


def test_the_valid_baseline_of_BAD_passes():
    # each BAD case breaks exactly one thing about this input set, which must itself be valid
    shape = validate_inputs(*qkvo(), torch.zeros(2, 4, 33), problem=Problem(64, "fp16"), require_cuda=False)
    assert (shape.batch, shape.heads, shape.kv_heads, shape.seqlen_q, shape.seqlen_k, shape.head_dim, shape.dtype) \
        == (2, 4, 4, 33, 40, 64, "fp16")


def test_the_launch_config_structs_match_cuda_h(tmp_path):
    """libcuda.LaunchConfig / LaunchAttribute (cuLaunchKernelEx, programmatic dependent launch) against cuda.h."""
    from autotune.build.nvcc import NvccNotFoundError, find_nvcc
    from autotune.launch.libcuda import LaunchAttribute, LaunchConfig

    try:
        nvcc = find_nvcc()  # compiles host C++ with the toolkit's cuda.h on its include path
    except NvccNotFoundError as e:
        pytest.skip(f"no nvcc, so no cuda.h to compare against ({e})")
    checks = [("CUlaunchConfig", name) for name, _ in LaunchConfig._fields_] + \
             [("CUlaunchAttribute", name) for name, _ in LaunchAttribute._fields_]
    prints = "\n".join(f'    std::printf("{s}.{n} %zu\\n", offsetof({s}, {n}));' for s, n in checks)
    source = tmp_path / "launch.cpp"
    source.write_text(f'#include <cstddef>\n#include <cstdio>\n#include <cuda.h>\nint main() {{\n'
                      f'    std::printf("CUlaunchConfig %zu\\nCUlaunchAttribute %zu\\n", sizeof(CUlaunchConfig), '
                      f'sizeof(CUlaunchAttribute));\n{prints}\n    return 0;\n}}\n')
    exe = tmp_path / "launch"
    subprocess.run([str(nvcc), "-std=c++17", str(source), "-o", str(exe)], check=True, capture_output=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split("\n")
    c = {line.split()[0]: int(line.split()[1]) for line in out if line}
    assert c["CUlaunchConfig"] == ctypes.sizeof(LaunchConfig)
    assert c["CUlaunchAttribute"] == ctypes.sizeof(LaunchAttribute)
    for s, struct in (("CUlaunchConfig", LaunchConfig), ("CUlaunchAttribute", LaunchAttribute)):
        for name, _ in struct._fields_:
            assert c[f"{s}.{name}"] == getattr(struct, name).offset, (s, name)
