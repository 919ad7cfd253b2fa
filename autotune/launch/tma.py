"""Host-side TMA tensor maps for the wgmma family (kernels/sm90/flash_fwd.cu), through cuda-python's driver API.

The kernel reads Q, K and V with `cp.async.bulk.tensor.4d` from maps passed by value (`__grid_constant__`
CUtensorMap arguments after the parameter block, in the order tm_q, tm_k, tm_v). Each map describes one
(batch, heads, seqlen, head_dim) tensor with its real strides as a rank-4 tensor, innermost first:

    dims    (head_dim, seqlen, heads, batch)
    strides (row, head, batch) in bytes (the innermost dimension is contiguous by definition)
    box     (64, rows, 1, 1): one 128-byte swizzle span of head_dim × `rows` sequence positions

Because heads and batch are dimensions of their own, a box that runs past seqlen is zero-filled by the copy
engine instead of reading the next head's rows, so any seqlen works without padding. Rows are 64 for Q (one
consumer warpgroup's tile) and Bc for K/V.

Requirements (checked here, with the argument named): CUDA tensor, fp16/bf16, last dim contiguous, head_dim a
multiple of 64, data pointer 16-byte aligned, every stride in bytes a multiple of 16 and below 2**40.
"""
from __future__ import annotations

import ctypes
import functools
from collections import OrderedDict

from space.problem import DECODE_MAX_QUERIES

from .libcuda import driver, encode_tiled_fn, error_name

SWIZZLE_COLS = 64   # elements per box row: 128 bytes, the 128B swizzle span the kernel's descriptors assume
Q_BOX_ROWS = 64     # one consumer warpgroup's query rows
TENSOR_MAP_BYTES = 128
_MAX_STRIDE = 1 << 40


def _data_type(dtype):
    drv = driver()
    name = str(dtype)
    if name == "torch.float16":
        return drv.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16
    if name == "torch.bfloat16":
        return drv.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
    raise ValueError(f"dtype: expected torch.float16 or torch.bfloat16, got {name}")


def _legal_stride(nbytes: int) -> bool:
    return 0 < nbytes < _MAX_STRIDE and nbytes % 16 == 0


def tensor_map_geometry(shape, strides, elem_bytes: int, data_ptr: int, box_rows: int, name: str = "tensor"):
    """(global_dims, global_strides_bytes, box_dims) for a (batch, heads, seqlen, head_dim) view.

    Pure function (no CUDA), so the validation is testable anywhere. Raises ValueError naming `name`.
    """
    if len(shape) != 4:
        raise ValueError(f"{name}: expected a 4-d (batch, heads, seqlen, head_dim) tensor, got shape {tuple(shape)}")
    b, h, n, d = (int(x) for x in shape)
    sb, sh, sn, sd = (int(x) for x in strides)
    if d % SWIZZLE_COLS:
        raise ValueError(f"{name}: head_dim must be a multiple of {SWIZZLE_COLS} for 128-byte TMA boxes, got {d}")
    if sd != 1:
        raise ValueError(f"{name}: the last dim must be contiguous (stride 1), got stride {sd}")
    if data_ptr % 16:
        raise ValueError(f"{name}: data pointer must be 16-byte aligned, got 0x{data_ptr:x}")
    if not 1 <= box_rows <= 256:
        raise ValueError(f"box_rows: expected 1..256 (TMA box limit), got {box_rows}")
    out_strides = []
    # A dimension of extent 1 is never stepped over, so its stride is free: give it a legal value.
    for dim_name, extent, stride in (("row", n, sn), ("head", h, sh), ("batch", b, sb)):
        nbytes = stride * elem_bytes
        if extent == 1 and not _legal_stride(nbytes):
            nbytes = 16
        if not _legal_stride(nbytes):
            raise ValueError(f"{name}: {dim_name} stride must be a positive multiple of 16 bytes below 2**40 for TMA, "
                             f"got {stride} elements = {nbytes} bytes")
        out_strides.append(nbytes)
    return (d, n, h, b), tuple(out_strides), (SWIZZLE_COLS, box_rows, 1, 1)


class TensorMapBuffer:
    """128 bytes for one CUtensorMap, 64-byte aligned as the driver requires; getPtr() is what the loader passes."""

    __slots__ = ("_raw", "address")

    def __init__(self):
        self._raw = ctypes.create_string_buffer(TENSOR_MAP_BYTES + 64)
        self.address = (ctypes.addressof(self._raw) + 63) & ~63

    def getPtr(self) -> int:  # noqa: N802 (cuda-python's spelling, which loader._address understands)
        return self.address


# L2 promotion of a map's loads: a miss fetches this much around the requested line. 256B suits tiles many CTAs
# re-read from L2 (prefill's K/V, every Q); a decode cache is streamed once, where 256B cost 7 % of the read rate:
# benchmarks/tma_stream_probe.py on the H200 streamed B32 Hkv8 Nk4096 at 4.16 TB/s with it, 4.44-4.49 with 128B or
# none (the device's own read rate 4.39), and the decode kernel followed (docs/benchmarks.md).
L2_PROMOTIONS = {"256B": "CU_TENSOR_MAP_L2_PROMOTION_L2_256B", "128B": "CU_TENSOR_MAP_L2_PROMOTION_L2_128B",
                 "none": "CU_TENSOR_MAP_L2_PROMOTION_NONE"}


class TensorMapEncoder:
    """Tensor maps for one geometry (shape, strides, dtype, box): between calls only the base address changes.

    The argument arrays are built once, the encode goes straight to libcuda (autotune/launch/libcuda.py says why),
    and the last MAX_CACHED maps are kept by address, since a map depends on nothing else: a loop over the same
    buffers (or an allocator handing the same blocks back) encodes nothing after the first call.
    """

    MAX_CACHED = 64

    def __init__(self, shape, strides, dtype, elem_bytes: int, box_rows: int, name: str, l2_promotion: str = "256B"):
        drv = driver()
        if l2_promotion not in L2_PROMOTIONS:
            raise ValueError(f"l2_promotion: expected one of {sorted(L2_PROMOTIONS)}, got {l2_promotion!r}")
        dims, gstrides, box = tensor_map_geometry(shape, strides, elem_bytes, 0, box_rows, name)
        self.name = name
        self._args = (
            int(_data_type(dtype)), 4,
            (ctypes.c_uint64 * 4)(*dims), (ctypes.c_uint64 * 3)(*gstrides),
            (ctypes.c_uint32 * 4)(*box), (ctypes.c_uint32 * 4)(1, 1, 1, 1),
            int(drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE),
            int(drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B),
            int(getattr(drv.CUtensorMapL2promotion, L2_PROMOTIONS[l2_promotion])),
            # NONE fills out-of-bounds elements with zeros: padded key rows then score 0 (masked anyway) and
            # their V rows contribute 0 × p instead of garbage × 0 = NaN.
            int(drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
        )
        self._geometry = (dims, gstrides, box)
        self._by_address: OrderedDict[int, TensorMapBuffer] = OrderedDict()

    def __call__(self, address: int) -> TensorMapBuffer:
        tmap = self._by_address.get(address)
        if tmap is not None:
            return tmap
        if address % 16:
            raise ValueError(f"{self.name}: data pointer must be 16-byte aligned, got 0x{address:x}")
        tmap = TensorMapBuffer()
        dtype, rank, dims, strides, box, elem, interleave, swizzle, l2, oob = self._args
        code = encode_tiled_fn()(tmap.address, dtype, rank, address, dims, strides, box, elem, interleave, swizzle,
                                 l2, oob)
        if code:
            d, st, b = self._geometry
            raise RuntimeError(f"cuTensorMapEncodeTiled({self.name}, dims={d}, strides={st}, box={b}) failed: "
                               f"{error_name(code)}")
        self._by_address[address] = tmap
        if len(self._by_address) > self.MAX_CACHED:
            self._by_address.popitem(last=False)
        return tmap


@functools.lru_cache(maxsize=256)
def _encoder(shape: tuple, strides: tuple, dtype, elem_bytes: int, box_rows: int, name: str,
             l2_promotion: str) -> TensorMapEncoder:
    return TensorMapEncoder(shape, strides, dtype, elem_bytes, box_rows, name, l2_promotion)


def map_encoder(tensor, box_rows: int, name: str = "tensor", l2_promotion: str = "256B") -> TensorMapEncoder:
    """The encoder of maps for tensors of this one's geometry (shape, strides, dtype) and box: call it with a data
    pointer. Shared by every caller of the same geometry."""
    if not getattr(tensor, "is_cuda", False):
        raise ValueError(f"{name}: expected a CUDA tensor")
    return _encoder(tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype, tensor.element_size(), box_rows,
                    name, l2_promotion)


def encode(tensor, box_rows: int, name: str = "tensor", l2_promotion: str = "256B") -> TensorMapBuffer:
    """A CUtensorMap for a (batch, heads, seqlen, head_dim) CUDA tensor view (any strides, last dim contiguous)."""
    return map_encoder(tensor, box_rows, name, l2_promotion)(tensor.data_ptr())


def kv_l2_promotion(seqlen_q: int) -> str:
    """The K/V maps' L2 promotion for a call: none for decode (Shape.is_decode: each cache line is read once per
    K/V head, and 256B promotion cost 7 % of the read rate), 256B for prefill (as measured in every prefill table)."""
    return "none" if seqlen_q <= DECODE_MAX_QUERIES else "256B"


def flash_map_encoders(q, k, v, bc: int) -> tuple[TensorMapEncoder, TensorMapEncoder, TensorMapEncoder]:
    """The encoders of (tm_q, tm_k, tm_v) for the wgmma family with key tiles of `bc` rows: each takes the data
    pointer of a tensor of q's, k's, v's geometry respectively."""
    promotion = kv_l2_promotion(q.shape[2])
    return (map_encoder(q, Q_BOX_ROWS, "q"), map_encoder(k, bc, "k", promotion),
            map_encoder(v, bc, "v", promotion))


def flash_tensor_maps(q, k, v, bc: int):
    """(tm_q, tm_k, tm_v) for one launch of the wgmma family with key tiles of `bc` rows.

    The maps hold the tensors' addresses: encode them again for other tensors (encoding is a cheap host call).
    """
    enc_q, enc_k, enc_v = flash_map_encoders(q, k, v, bc)
    return enc_q(q.data_ptr()), enc_k(k.data_ptr()), enc_v(v.data_ptr())


def as_ctypes(tmap) -> ctypes.Array:
    """The map's 128 opaque bytes as a ctypes array, for loaders that want ctypes kernel arguments."""
    return (ctypes.c_uint8 * TENSOR_MAP_BYTES).from_buffer_copy(ctypes.string_at(int(tmap.getPtr()), TENSOR_MAP_BYTES))


def launch_map_encoders(config, q, k, v) -> tuple:
    """The encoders of launch_extra_args(config, q, k, v), in the same order, each taking the data pointer of a
    tensor of q's, k's, v's geometry: what a prepared launch re-points its maps with for other tensors. () for
    families without tensor maps."""
    if config.family != "wgmma":
        return ()
    return flash_map_encoders(q, k, v, config.bc)


def launch_extra_args(config, q, k, v) -> tuple:
    """The by-value kernel arguments that follow FlashFwdParams for `config`'s family, in order.

    wgmma: (tm_q, tm_k, tm_v) for these very tensors (the maps hold their addresses, so the caller keeps the
    tensors alive until the launch has run); every other family: none.
    """
    if config.family != "wgmma":
        return ()
    return flash_tensor_maps(q, k, v, config.bc)
