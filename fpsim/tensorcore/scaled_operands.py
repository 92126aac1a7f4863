"""Block-scaled operands as cuBLAS takes them through torch: element tensors and swizzled scales.

Blackwell's block-scaled GEMMs (`torch.nn.functional.scaled_mm` with
``ScalingType.BlockWise1x32`` for MXFP8/MXFP4, ``BlockWise1x16`` for NVFP4)
read A (M, K) row-major and B (K, N) column-major, FP4 elements two to a
byte, and each operand's scales in cuBLAS's "1D block scaling factors
layout": the (rows, K / block) scale matrix padded to multiples of 128 rows
and 4 columns and stored as 128 x 4 tiles of 512 bytes, the scale of (row r,
column c) of a tile at byte (r % 32) * 16 + (r // 32) * 4 + c (cuBLAS
documentation, "1D Block Scaling Factors Layout"). This module builds those
tensors from fpsim values; `library_capture` runs the call.
"""

from __future__ import annotations

import numpy as np

from ..blocks import BlockFormat
from ..codec import encode

TILE_ROWS, TILE_COLS = 128, 4


def swizzle_offsets(rows: int, cols: int) -> np.ndarray:
    """(rows, cols) -> the byte offset of each scale in cuBLAS's swizzled layout (tiles row-block major)."""
    r = np.arange(rows)[:, None]
    c = np.arange(cols)[None, :]
    col_tiles = -(-cols // TILE_COLS)
    tile = (r // TILE_ROWS) * col_tiles + c // TILE_COLS
    within = (r % 32) * 16 + ((r % TILE_ROWS) // 32) * 4 + c % TILE_COLS
    return tile * (TILE_ROWS * TILE_COLS) + within


def swizzled(codes) -> np.ndarray:
    """Scale codes (rows, K / block), uint8 -> the flat uint8 buffer cuBLAS reads (padding zero)."""
    codes = np.asarray(codes, dtype=np.uint8)
    rows, cols = codes.shape
    size = -(-rows // TILE_ROWS) * -(-cols // TILE_COLS) * TILE_ROWS * TILE_COLS
    out = np.zeros(size, dtype=np.uint8)
    out[swizzle_offsets(rows, cols)] = codes
    return out


def packed_fp4(codes) -> np.ndarray:
    """E2M1 codes (..., K) -> bytes (..., K / 2): element 2i in the low nibble, 2i + 1 in the high
    one (torch.float4_e2m1fn_x2)."""
    codes = np.asarray(codes, dtype=np.uint8)
    if codes.shape[-1] % 2:
        raise ValueError(f"FP4 elements pack two to a byte; the last axis has {codes.shape[-1]}")
    return (codes[..., 0::2] & 0xF) | ((codes[..., 1::2] & 0xF) << 4)


def _elements(torch, values, fmt: BlockFormat, dev):
    """Row-major (rows, K) element values -> the torch tensor of their codes."""
    codes = np.asarray(encode(values, fmt.element))
    if fmt.element.bits == 4:
        return torch.from_numpy(np.ascontiguousarray(packed_fp4(codes))).to(dev).view(torch.float4_e2m1fn_x2)
    dtype = fmt.element.torch_dtype
    if dtype is None:
        raise ValueError(f"torch has no dtype for {fmt.element.name} elements")
    return torch.from_numpy(np.ascontiguousarray(codes.astype(np.uint8))).to(dev).view(dtype)


def _scales(torch, values, fmt: BlockFormat, dev):
    codes = np.asarray(encode(values, fmt.scale)).astype(np.uint8)
    return torch.from_numpy(swizzled(codes)).to(dev).view(fmt.scale.torch_dtype)


def operands(torch, a, b, scale_a, scale_b, fmt: BlockFormat, dev):
    """(A, B, SA, SB) for scaled_mm: A from a (M, K), B column-major from b (K, N), SA from
    scale_a (M, K / block), SB from scale_b (K / block, N); all values exact in their formats."""
    A = _elements(torch, a, fmt, dev)
    B = _elements(torch, np.asarray(b).T, fmt, dev).t()
    return A, B, _scales(torch, scale_a, fmt, dev), _scales(torch, np.asarray(scale_b).T, fmt, dev)
