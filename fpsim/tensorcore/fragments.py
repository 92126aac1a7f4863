"""Register fragments of the MMA instructions: which thread holds which matrix element, and packing.

The PTX ISA fixes, for every MMA shape and element width, which elements of A,
B and C/D each thread of the warp (or warpgroup) holds in which register. The
capture tool packs every fragment register on the host with these layouts and
unpacks the results, so its kernels only move 32-bit words. Elements are the
formats' codes (fpsim's codec), left-aligned in their register slot: a tf32
value sits in a 32-bit slot in binary32's layout, its low 13 bits zero.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..codec import decode, encode
from ..formats import Format, format as get_format

# ---------------------------------------------------------------------------
# Fragment layouts (PTX ISA 9.x, "Matrix fragments for mma.m16n8k4/k8/k16/k32"
# and, for wgmma, "Register fragments and shared memory matrix layouts").
# Each function returns (rows, cols): for every thread and every element index
# i of its fragment, the matrix element it holds. groupID = lane >> 2,
# threadID_in_group = lane % 4; for wgmma (128 threads) warp w of the
# warpgroup holds rows 16w..16w+15 with the same in-warp layout.
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Operand:
    """One operand's register fragment: element i of thread t is matrix
    element (rows[t, i], cols[t, i]); elements pack low-to-high into 32-bit
    registers, elem_bits each."""

    rows: np.ndarray
    cols: np.ndarray
    elem_bits: int
    shape: tuple

    @property
    def threads(self) -> int:
        return self.rows.shape[0]

    @property
    def elems(self) -> int:
        return self.rows.shape[1]

    @property
    def regs(self) -> int:
        return self.elems * self.elem_bits // 32


def _ids(threads: int, elems: int):
    t = np.arange(threads)[:, None]
    i = np.arange(elems)[None, :]
    lane = t % 32
    return t // 32, lane >> 2, lane % 4, i


def frag_a(k: int, elem_bits: int, threads: int = 32) -> Operand:
    """A (M x K, row-major) fragment of mma.m16n8kK / wgmma.m64nNkK."""
    n_elems = (16 * k) // 32            # a 16 x K tile over 32 lanes
    w, g, tg, i = _ids(threads, n_elems)
    if elem_bits == 16 and k == 16:      # .f16/.bf16 m16n8k16: a0..a7
        row = g + 8 * ((i >> 1) & 1)
        col = 2 * tg + (i & 1) + 8 * (i >> 2)
    elif elem_bits == 16 and k == 8:     # .f16/.bf16 m16n8k8: a0..a3
        row = g + 8 * (i >> 1)
        col = 2 * tg + (i & 1)
    elif elem_bits == 32 and k == 8:     # .tf32 m16n8k8: a0..a3
        row = g + 8 * (i & 1)
        col = tg + 4 * (i >> 1)
    elif elem_bits == 32 and k == 4:     # .tf32 m16n8k4: a0, a1
        row = g + 8 * i
        col = tg + 0 * i
    elif elem_bits == 8 and k == 32:     # .e4m3/.e5m2 m16n8k32: a0..a15
        row = g + 8 * ((i >> 2) & 1)
        col = 4 * tg + (i & 3) + 16 * (i >> 3)
    elif elem_bits == 8 and k == 16:     # .e4m3/.e5m2 m16n8k16: a0..a7
        row = g + 8 * (i >> 2)
        col = 4 * tg + (i & 3)
    elif elem_bits == 4 and k == 64:     # .e2m1 m16n8k64 (kind::mxf4, mxf4nvf4): a0..a31, 8 a register
        row = g + 8 * ((i >> 3) & 1)
        col = 8 * tg + (i & 7) + 32 * (i >> 4)
    else:
        raise ValueError(f"no A layout for k={k}, {elem_bits}-bit elements")
    m = 16 * (threads // 32)
    return Operand(np.asarray(16 * w + row), np.asarray(col + 0 * w), elem_bits, (m, k))


def frag_b(k: int, elem_bits: int) -> Operand:
    """B (K x N=8, "col") fragment of mma.m16n8kK: rows are k, cols are n."""
    n_elems = (8 * k) // 32             # a K x 8 tile over 32 lanes
    _, g, tg, i = _ids(32, n_elems)
    if elem_bits == 16 and k == 16:      # b0..b3
        row = 2 * tg + (i & 1) + 8 * (i >> 1)
    elif elem_bits == 16 and k == 8:     # b0, b1
        row = 2 * tg + i
    elif elem_bits == 32 and k == 8:     # b0, b1
        row = tg + 4 * i
    elif elem_bits == 32 and k == 4:     # b0
        row = tg + 0 * i
    elif elem_bits == 8 and k == 32:     # b0..b7
        row = 4 * tg + (i & 3) + 16 * (i >> 2)
    elif elem_bits == 8 and k == 16:     # b0..b3
        row = 4 * tg + i
    elif elem_bits == 4 and k == 64:     # b0..b15
        row = 8 * tg + (i & 7) + 32 * (i >> 3)
    else:
        raise ValueError(f"no B layout for k={k}, {elem_bits}-bit elements")
    return Operand(np.asarray(row), np.asarray(g + 0 * i), elem_bits, (k, 8))


def frag_c(elem_bits: int, threads: int = 32) -> Operand:
    """C/D (M x 8) fragment: c0..c3 (f32: 4 registers; f16: 2 x f16x2)."""
    w, g, tg, i = _ids(threads, 4)
    row = 16 * w + g + 8 * (i >> 1)
    col = 2 * tg + (i & 1) + 0 * w
    return Operand(np.asarray(row), np.asarray(col), elem_bits, (16 * (threads // 32), 8))


# Block scales of mma.sync .block_scale, with the selectors {byte-id, thread-id} = {0, 0}: the
# scale of A's row g (g = lane >> 2) comes from lane 4g, that of row g + 8 from lane 4g + 1, and
# column n's of B from lane 4n; a row's scales for the blocks of K are bytes 0, 1, ... of the
# lane's scale register (.scale_vec::1X, 2X, 4X). Read off CUTLASS's SM120 block-scaled MMA
# traits (SFALayout, SFBLayout for these selectors); every lane of a quad gets its row's
# scales. Not yet run on a GPU: the capture's self-check would expose a wrong layout.

def scale_rows_a(threads: int = 32) -> np.ndarray:
    """The row of A whose scales each lane holds."""
    lane = np.arange(threads) % 32
    return (lane >> 2) + 8 * (lane & 1)


def scale_cols_b(threads: int = 32) -> np.ndarray:
    """The column of B whose scales each lane holds."""
    return (np.arange(threads) % 32) >> 2


def pack_scales(codes, owner: np.ndarray) -> np.ndarray:
    """(T, rows, blocks) scale codes (8 bits) -> (T, lanes, 1) registers: lane t holds row owner[t]."""
    c = np.asarray(codes, dtype=np.uint32)[:, owner, :] & np.uint32(0xFF)
    shifts = (8 * np.arange(c.shape[-1])).astype(np.uint32)
    return np.bitwise_or.reduce(c << shifts, axis=-1)[..., None].astype(np.uint32)


def unpack_scales(regs, owner: np.ndarray, rows: int, blocks: int) -> np.ndarray:
    """(T, lanes, 1) scale registers -> (T, rows, blocks) codes, read from each row's first lane."""
    r = np.asarray(regs, dtype=np.uint32)[..., 0]
    first = np.array([int(np.flatnonzero(owner == row)[0]) for row in range(rows)])
    shifts = (8 * np.arange(blocks)).astype(np.uint32)
    return (r[:, first, None] >> shifts) & np.uint32(0xFF)


# wgmma's B operand lives in shared memory: K-major, no swizzle, two core
# matrices (8 rows of n x 16 bytes) along K, LBO bytes apart (wgmma_kernels.cu).
WGMMA_LBO = 128
WGMMA_B_BYTES = 256


def wgmma_b_offsets(k: int, elem_bits: int) -> np.ndarray:
    """Byte offset in shared memory of B[k, n] (K x 8), shape (K, 8)."""
    es = elem_bits // 8
    kk = np.arange(k)[:, None] * es
    n = np.arange(8)[None, :]
    return (kk // 16) * WGMMA_LBO + n * 16 + kk % 16



def pack(matrix_bits, op: Operand) -> np.ndarray:
    """(T, rows, cols) element bits -> (T, threads, regs) uint32 registers."""
    mb = np.asarray(matrix_bits, dtype=np.uint32)
    if mb.shape[1:] != op.shape:
        raise ValueError(f"matrix shape {mb.shape[1:]} does not match the fragment's {op.shape}")
    elems = mb[:, op.rows, op.cols] & np.uint32((1 << op.elem_bits) - 1)
    per_reg = 32 // op.elem_bits
    elems = elems.reshape(mb.shape[0], op.threads, op.regs, per_reg)
    shifts = (np.arange(per_reg) * op.elem_bits).astype(np.uint32)
    return np.bitwise_or.reduce(elems << shifts, axis=-1).astype(np.uint32)


def unpack(regs, op: Operand) -> np.ndarray:
    """(T, threads, regs) uint32 registers -> (T, rows, cols) element bits."""
    r = np.asarray(regs, dtype=np.uint32)
    per_reg = 32 // op.elem_bits
    shifts = (np.arange(per_reg) * op.elem_bits).astype(np.uint32)
    mask = np.uint32((1 << op.elem_bits) - 1) if op.elem_bits < 32 else np.uint32(0xFFFFFFFF)
    elems = ((r[..., None] >> shifts) & mask).reshape(r.shape[0], op.threads, op.elems)
    out = np.zeros((r.shape[0],) + op.shape, dtype=np.uint32)
    out[:, op.rows, op.cols] = elems
    return out


def pack_wgmma_b(b_bits, k: int, elem_bits: int) -> np.ndarray:
    """(T, K, 8) element bits of B -> (T, 64) uint32 words of its shared-memory image."""
    bb = np.asarray(b_bits, dtype=np.uint32)
    es = elem_bits // 8
    off = wgmma_b_offsets(k, elem_bits)
    image = np.zeros((bb.shape[0], WGMMA_B_BYTES), dtype=np.uint8)
    for byte in range(es):
        image[:, off + byte] = ((bb >> np.uint32(8 * byte)) & np.uint32(0xFF)).astype(np.uint8)
    return image.view("<u4").astype(np.uint32)


def read_wgmma_b(words, k: int, elem_bits: int, lbo: int = WGMMA_LBO) -> np.ndarray:
    """What wgmma reads from the image: core matrix j (K-direction) starts at
    j*LBO, its row n at 16*n bytes, holding 16 bytes of consecutive k.
    Returns (T, K, 8) element bits."""
    img = np.ascontiguousarray(np.asarray(words, dtype=np.uint32)).view(np.uint8)
    es = elem_bits // 8
    per_core = 16 // es
    out = np.zeros((img.shape[0], k, 8), dtype=np.uint32)
    for j in range(k // per_core):
        for n in range(8):
            row = img[:, j * lbo + 16 * n: j * lbo + 16 * n + 16].reshape(-1, per_core, es)
            val = np.zeros(row.shape[:2], dtype=np.uint32)
            for byte in range(es):
                val |= row[:, :, byte].astype(np.uint32) << np.uint32(8 * byte)
            out[:, j * per_core:(j + 1) * per_core, n] = val
    return out


# ---------------------------------------------------------------------------
# Values <-> register elements (fpsim's codec)
# ---------------------------------------------------------------------------

def element_bits(fmt) -> int:
    """Width of a format's register slot: its code width rounded up to 8, 16 or 32 bits."""
    return 1 << (get_format(fmt).bits - 1).bit_length()


def to_elements(values, fmt) -> np.ndarray:
    """Register elements (uint32) of float64 values that are exactly values of fmt."""
    fmt: Format = get_format(fmt)
    x = np.asarray(values, dtype=np.float64)
    codes = encode(x, fmt)
    back = np.asarray(decode(codes, fmt), dtype=np.float64)
    bad = ~((back == x) | (np.isnan(back) & np.isnan(x)))
    if bad.any():
        raise ValueError(f"{int(bad.sum())} value(s) not representable in {fmt.name}, first {x[bad].flat[0]!r}")
    return codes.astype(np.uint32) << np.uint32(element_bits(fmt) - fmt.bits)


def from_elements(elements, fmt) -> np.ndarray:
    """float64 values of register elements of fmt (bits below the code are ignored, as the hardware does)."""
    fmt = get_format(fmt)
    codes = np.asarray(elements, dtype=np.uint32) >> np.uint32(element_bits(fmt) - fmt.bits)
    return np.asarray(decode(codes, fmt), dtype=np.float64)
