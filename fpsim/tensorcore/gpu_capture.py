"""Capture real tensor-core outputs on a CUDA GPU into an fpsim capture file.

Run from the repository root on a machine with an NVIDIA GPU::

    python3 -m fpsim.tensorcore.gpu_capture --out h200.npz [--formats fp16,bf16,...]
        [--rows 4096] [--seed 0] [--skip-library] [--skip-wgmma] [--log FILE]

Two levels are captured (see :mod:`fpsim.tensorcore.captures` for the file):

* instruction level: small CUDA kernels (``cuda/mma_kernels.cu``,
  ``cuda/wgmma_kernels.cu``) each run ONE warp-level ``mma.sync`` or one
  warpgroup ``wgmma.mma_async`` per tile. Every recorded output is a designed
  row: a tile holds 8 rows, A[r, :] = a_r, B[:, r] = b_r, C[r, r] = c_r for
  r < 8 (all else 0), and only D[r, r] is kept. The host packs all fragment
  registers (``pack``) and unpacks the results (``unpack``) with the PTX ISA
  layouts written out in the ``frag_*`` functions below, so the kernels only
  move 32-bit words.
* library level: ``torch.matmul``/``torch.mm``/``torch._scaled_mm`` on CUDA,
  as cuBLAS computes them, with the flags that change their numerics.

Self-check: every instruction case also runs full random small-integer tiles
and rows of the ``exact`` probe family, whose exact results any correct MMA
returns. Any difference means a layout or packing bug: the case is recorded in
``meta["failures"]`` and left out, and the driver goes on. Each group of cases
(mma, wgmma, library) runs in its own process, so a kernel that crashes or
hangs cannot take the others with it.

This module imports only numpy, ml_dtypes, fpsim.tensorcore.captures and
.probes at import time; torch, cupy and the CUDA compiler are used lazily, so
it imports on any machine. ``--simulate`` runs the whole instruction-level
pipeline through a numpy model of the MMA (A@B+C in float64, rounded to the
accumulator format) instead of a GPU: that is how the host code is tested.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .captures import (Capture, CaptureCase, fp8_path_from_sass, f32_bits, is_representable, load_capture,
                       merge_captures, new_meta, save_capture, widen_bf16_bits,
                       widen_fp16_bits)
from .probes import concat, probe_rows, random_rows, round_to_format

ALL_FORMATS = ("fp16", "bf16", "tf32", "e4m3", "e5m2")
GROUPS = ("mma", "library", "wgmma")       # the riskiest group last
LAYOUT_TILES = 4          # full random-integer tiles per case for the self-check
# seconds before a group's process is stopped; they add up to less than the
# job's outer limit (tools/gpu_capture_job.sh), so a hang costs one group only
GROUP_TIMEOUT_S = {"mma": 120, "library": 90, "wgmma": 70}


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
    else:
        raise ValueError(f"no B layout for k={k}, {elem_bits}-bit elements")
    return Operand(np.asarray(row), np.asarray(g + 0 * i), elem_bits, (k, 8))


def frag_c(elem_bits: int, threads: int = 32) -> Operand:
    """C/D (M x 8) fragment: c0..c3 (f32: 4 registers; f16: 2 x f16x2)."""
    w, g, tg, i = _ids(threads, 4)
    row = 16 * w + g + 8 * (i >> 1)
    col = 2 * tg + (i & 1) + 0 * w
    return Operand(np.asarray(row), np.asarray(col), elem_bits, (16 * (threads // 32), 8))


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


# ---------------------------------------------------------------------------
# The instructions
# ---------------------------------------------------------------------------

ELEM_BITS = {"fp16": 16, "bf16": 16, "tf32": 32, "e4m3": 8, "e5m2": 8, "fp32": 32}
FP8_SM90_NOTE = ("On sm_90 ptxas lowers FP8 mma.sync to F2FP conversions (fp8 -> f16) and two "
                 "chained HMMA f16 instructions started from a zero accumulator, then adds C "
                 "with a separate FADD (f32) or HADD2 (f16) (cuobjdump of nvcc 13.0 sm_90a "
                 "output); Hopper's native FP8 tensor-core path is wgmma (QGMMA).")


@dataclass(frozen=True)
class MmaSpec:
    """One kernel of cuda/*.cu: the instruction, its operands and its layouts."""

    kernel: str
    group: str          # "mma" (mma.sync, one warp) or "wgmma" (one warpgroup)
    inputs: str
    k: int
    acc: str            # accumulator = C = D format: "fp32" or "fp16"
    instruction: str
    min_cc: tuple
    notes: str = ""

    @property
    def threads(self) -> int:
        return 32 if self.group == "mma" else 128

    @property
    def m(self) -> int:
        return 16 if self.group == "mma" else 64

    @property
    def a(self) -> Operand:
        return frag_a(self.k, ELEM_BITS[self.inputs], self.threads)

    @property
    def b(self) -> Operand:
        return frag_b(self.k, ELEM_BITS[self.inputs])

    @property
    def c(self) -> Operand:
        return frag_c(ELEM_BITS[self.acc], self.threads)

    @property
    def b_words(self) -> int:
        """32-bit words of B per thread (mma) or per tile (wgmma smem image)."""
        return self.b.regs if self.group == "mma" else WGMMA_B_BYTES // 4


PTX_TYPE = {"fp32": "f32", "fp16": "f16", "bf16": "bf16", "tf32": "tf32",
            "e4m3": "e4m3", "e5m2": "e5m2"}


def _mma(kernel, inputs, k, acc, min_cc=(8, 0), notes=""):
    d, t = PTX_TYPE[acc], PTX_TYPE[inputs]
    instr = f"mma.sync.aligned.m16n8k{k}.row.col.{d}.{t}.{t}.{d}"
    return MmaSpec(kernel, "mma", inputs, k, acc, instr, min_cc, notes)


def _wgmma(kernel, inputs, k, acc):
    d, t = PTX_TYPE[acc], PTX_TYPE[inputs]
    instr = f"wgmma.mma_async.sync.aligned.m64n8k{k}.{d}.{t}.{t}"
    return MmaSpec(kernel, "wgmma", inputs, k, acc, instr, (9, 0),
                   "A from registers, B from shared memory (K-major, no swizzle), "
                   "one warpgroup per m64n8 tile; the path cuBLAS uses on Hopper")


MMA_SPECS = (
    _mma("mma_m16n8k16_f32_f16", "fp16", 16, "fp32"),
    _mma("mma_m16n8k16_f16_f16", "fp16", 16, "fp16"),
    _mma("mma_m16n8k8_f32_f16", "fp16", 8, "fp32"),
    _mma("mma_m16n8k8_f16_f16", "fp16", 8, "fp16"),
    _mma("mma_m16n8k16_f32_bf16", "bf16", 16, "fp32"),
    _mma("mma_m16n8k8_f32_bf16", "bf16", 8, "fp32"),
    _mma("mma_m16n8k8_f32_tf32", "tf32", 8, "fp32"),
    _mma("mma_m16n8k4_f32_tf32", "tf32", 4, "fp32"),
    _mma("mma_m16n8k32_f32_e4m3", "e4m3", 32, "fp32", (8, 9), FP8_SM90_NOTE),
    _mma("mma_m16n8k32_f16_e4m3", "e4m3", 32, "fp16", (8, 9), FP8_SM90_NOTE),
    _mma("mma_m16n8k16_f32_e4m3", "e4m3", 16, "fp32", (8, 9), FP8_SM90_NOTE),
    _mma("mma_m16n8k32_f32_e5m2", "e5m2", 32, "fp32", (8, 9), FP8_SM90_NOTE),
    _mma("mma_m16n8k32_f16_e5m2", "e5m2", 32, "fp16", (8, 9), FP8_SM90_NOTE),
    _mma("mma_m16n8k16_f32_e5m2", "e5m2", 16, "fp32", (8, 9), FP8_SM90_NOTE),
    _wgmma("wgmma_m64n8k16_f32_f16", "fp16", 16, "fp32"),
    _wgmma("wgmma_m64n8k16_f16_f16", "fp16", 16, "fp16"),
    _wgmma("wgmma_m64n8k16_f32_bf16", "bf16", 16, "fp32"),
    _wgmma("wgmma_m64n8k8_f32_tf32", "tf32", 8, "fp32"),
    _wgmma("wgmma_m64n8k32_f32_e4m3", "e4m3", 32, "fp32"),
    _wgmma("wgmma_m64n8k32_f16_e4m3", "e4m3", 32, "fp16"),
    _wgmma("wgmma_m64n8k32_f32_e5m2", "e5m2", 32, "fp32"),
    _wgmma("wgmma_m64n8k32_f16_e5m2", "e5m2", 32, "fp16"),
)

CUDA_SOURCES = {"mma": "mma_kernels.cu", "wgmma": "wgmma_kernels.cu"}


def cuda_source_path(group: str) -> Path:
    """Path of the .cu file of a kernel group."""
    return Path(__file__).resolve().parent / "cuda" / CUDA_SOURCES[group]


# ---------------------------------------------------------------------------
# Values <-> element bits, and packing fragments
# ---------------------------------------------------------------------------

def encode(values, fmt: str) -> np.ndarray:
    """Bit patterns (as uint32) of float64 values exactly representable in fmt."""
    x = np.asarray(values, dtype=np.float64)
    bad = ~is_representable(x, fmt)
    if bad.any():
        raise ValueError(f"{int(bad.sum())} value(s) not representable in {fmt}, "
                         f"first {x[bad].flat[0]!r}")
    with np.errstate(over="ignore", invalid="ignore"):
        if fmt in ("fp32", "tf32"):
            return x.astype(np.float32).view(np.uint32)
        if fmt == "fp16":
            return x.astype(np.float16).view(np.uint16).astype(np.uint32)
        import ml_dtypes

        dt = {"bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn,
              "e5m2": ml_dtypes.float8_e5m2}[fmt]
        raw = x.astype(dt)
        return raw.view(np.uint16 if fmt == "bf16" else np.uint8).astype(np.uint32)


def decode(bits, fmt: str) -> np.ndarray:
    """float64 values of bit patterns of fmt (tf32: the low 13 bits are ignored,
    as the hardware does)."""
    b = np.asarray(bits, dtype=np.uint32)
    if fmt == "fp32":
        return b.view(np.float32).astype(np.float64)
    if fmt == "tf32":
        return (b & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)
    if fmt == "fp16":
        return b.astype(np.uint16).view(np.float16).astype(np.float64)
    import ml_dtypes

    if fmt == "bf16":
        return b.astype(np.uint16).view(ml_dtypes.bfloat16).astype(np.float64)
    dt = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}[fmt]
    return b.astype(np.uint8).view(dt).astype(np.float64)


def widen_to_f32_bits(bits, fmt: str) -> np.ndarray:
    """Accumulator/output bits -> binary32 bits of the same value (exact)."""
    if fmt == "fp32":
        return np.asarray(bits, dtype=np.uint32)
    if fmt == "fp16":
        return widen_fp16_bits(np.asarray(bits).astype(np.uint16))
    if fmt == "bf16":
        return widen_bf16_bits(bits)
    raise ValueError(f"cannot widen {fmt!r}")


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
# Tiles from rows, and the numpy model of the MMA
# ---------------------------------------------------------------------------

def rows_to_tiles(a, b, c, m: int):
    """8 rows per tile: A[t, r, :] = a_r, B[t, :, r] = b_r, C[t, r, r] = c_r."""
    a, b, c = (np.asarray(x, dtype=np.float64) for x in (a, b, c))
    rows, k = a.shape
    tiles = -(-rows // 8)
    pad = tiles * 8 - rows
    a = np.concatenate([a, np.zeros((pad, k))]).reshape(tiles, 8, k)
    b = np.concatenate([b, np.zeros((pad, k))]).reshape(tiles, 8, k)
    c = np.concatenate([c, np.zeros(pad)]).reshape(tiles, 8)
    A = np.zeros((tiles, m, k))
    A[:, :8, :] = a
    B = b.transpose(0, 2, 1).copy()
    C = np.zeros((tiles, m, 8))
    C[:, np.arange(8), np.arange(8)] = c
    return A, B, C


def tile_diagonals(D, rows: int) -> np.ndarray:
    """D[t, r, r] for r < 8, flattened back to the first ``rows`` rows."""
    return np.asarray(D)[:, np.arange(8), np.arange(8)].reshape(-1)[:rows]


def layout_tiles(spec: MmaSpec, n: int, seed: int):
    """n full tiles of small integers: every entry of D is exactly known."""
    rng = np.random.default_rng(seed)
    A = rng.integers(-3, 4, (n, spec.m, spec.k)).astype(np.float64)
    B = rng.integers(-3, 4, (n, spec.k, 8)).astype(np.float64)
    C = rng.integers(-8, 9, (n, spec.m, 8)).astype(np.float64)
    return A, B, C


def pack_operands(spec: MmaSpec, A, B, C):
    """Float64 tiles -> (a_regs, b_words, c_regs) as the kernel reads them."""
    a_regs = pack(encode(A, spec.inputs), spec.a)
    b_bits = encode(B, spec.inputs)
    if spec.group == "mma":
        b_words = pack(b_bits, spec.b)
    else:
        b_words = pack_wgmma_b(b_bits, spec.k, ELEM_BITS[spec.inputs])
    c_regs = pack(encode(C, spec.acc), spec.c)
    return a_regs, b_words, c_regs


def simulate_mma(spec: MmaSpec, a_regs, b_words, c_regs) -> np.ndarray:
    """The MMA in numpy, from the packed registers: D = A@B + C in float64,
    rounded to the accumulator format, packed as the D registers."""
    A = decode(unpack(a_regs, spec.a), spec.inputs)
    if spec.group == "mma":
        B = decode(unpack(b_words, spec.b), spec.inputs)
    else:
        B = decode(read_wgmma_b(b_words, spec.k, ELEM_BITS[spec.inputs]), spec.inputs)
    C = decode(unpack(c_regs, spec.c), spec.acc)
    with np.errstate(invalid="ignore", over="ignore"):
        D = np.einsum("tmk,tkn->tmn", A, B) + C
        D = D.astype(np.float32 if spec.acc == "fp32" else np.float16).astype(np.float64)
    return pack(encode(D, spec.acc), spec.c)


class SelfCheckError(RuntimeError):
    """The GPU did not return the exact result of rows that every MMA computes exactly."""


def run_tiles(spec: MmaSpec, A, B, C, launcher) -> np.ndarray:
    """Pack, launch, unpack: (T, M, 8) accumulator bits of D."""
    a_regs, b_words, c_regs = pack_operands(spec, A, B, C)
    d_regs = launcher(spec, a_regs, b_words, c_regs)
    d_regs = np.asarray(d_regs, dtype=np.uint32).reshape(A.shape[0], spec.threads, spec.c.regs)
    return unpack(d_regs, spec.c)


def _first_mismatch(got, want) -> str:
    bad = np.argwhere(~_same_value(got, want))
    idx = tuple(bad[0])
    return f"at {idx}: got {got[idx]!r}, expected {want[idx]!r}"


def _same_value(got, want) -> np.ndarray:
    return (got == want) | (np.isnan(got) & np.isnan(want))


def case_seed(seed: int, name: str) -> int:
    """A per-case seed: the same for the same --seed and case on every run."""
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**32)


def capture_instruction_case(spec: MmaSpec, n_random: int, seed: int, launcher,
                             probes: bool = True) -> CaptureCase:
    """Run probes and random rows through one instruction; self-check; return the case."""
    rows = [probe_rows(spec.inputs, spec.k, spec.acc)] if probes else []
    if n_random:
        rows.append(random_rows(spec.inputs, spec.k, n_random, case_seed(seed, spec.kernel),
                                spec.acc, "mixed"))
    ps = concat(*rows)

    LA, LB, LC = layout_tiles(spec, LAYOUT_TILES, case_seed(seed + 1, spec.kernel))
    A, B, C = rows_to_tiles(ps.a, ps.b, ps.c, spec.m)
    D_bits = run_tiles(spec, np.concatenate([LA, A]), np.concatenate([LB, B]),
                       np.concatenate([LC, C]), launcher)
    D = decode(D_bits, spec.acc)

    # self-check 1: whole integer tiles (every layout position)
    want = np.einsum("tmk,tkn->tmn", LA, LB) + LC
    got = D[:LAYOUT_TILES]
    n_bad_tiles = int((~_same_value(got, want)).sum())
    # self-check 2: exact rows through the diagonal construction
    d_rows = tile_diagonals(D[LAYOUT_TILES:], len(ps))
    exact = ps.family_mask("exact")
    want_rows = ps.exact_sum()[exact]
    n_bad_rows = int((~_same_value(d_rows[exact], want_rows)).sum())
    if n_bad_tiles or n_bad_rows:
        detail = []
        if n_bad_tiles:
            detail.append(f"{n_bad_tiles}/{got.size} entries of {LAYOUT_TILES} integer tiles "
                          f"wrong, first {_first_mismatch(got, want)}")
        if n_bad_rows:
            detail.append(f"{n_bad_rows}/{int(exact.sum())} exact rows wrong, first "
                          f"{_first_mismatch(d_rows[exact], want_rows)}")
        raise SelfCheckError(f"{spec.kernel}: self-check failed ({'; '.join(detail)}): "
                             "a fragment-layout or packing bug, not arithmetic; case left out")

    d_out = widen_to_f32_bits(tile_diagonals(D_bits[LAYOUT_TILES:], len(ps)), spec.acc)
    c_out = widen_to_f32_bits(encode(ps.c, spec.acc), spec.acc)
    meta = {"name": spec.kernel, "kind": "dot", "level": "instruction",
            "inputs": spec.inputs, "c_format": spec.acc, "output": spec.acc, "k": spec.k,
            "instruction": spec.instruction,
            "flags": {"group": spec.group, "layout": "row.col", "threads": spec.threads,
                      "tile": f"m{spec.m}n8k{spec.k}"},
            "notes": (spec.notes + " " if spec.notes else "") +
                     "Each row is D[r,r] of a tile with A[r,:]=a, B[:,r]=b, C[r,r]=c, zeros elsewhere.",
            "rows_random": int(n_random), "rows_probe": int(len(ps) - n_random),
            "self_check": {"integer_tiles": LAYOUT_TILES, "exact_rows": int(exact.sum()),
                           "passed": True}}
    return CaptureCase(meta, f32_bits(ps.a), f32_bits(ps.b), c_out, d_out, ps.tags.astype(str))


# ---------------------------------------------------------------------------
# Compiling and launching on the GPU (lazy imports)
# ---------------------------------------------------------------------------

def find_nvcc() -> str | None:
    for cand in (shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if cand and os.path.exists(cand):
            return cand
    return None


def arch_for(cc: tuple, group: str) -> str:
    """sm_XY, with the 'a' suffix on 9.0 (wgmma needs sm_90a)."""
    major, minor = cc
    suffix = "a" if (major, minor) == (9, 0) else ""
    return f"{major}{minor}{suffix}"


def compile_flags(cc: tuple, group: str) -> list:
    arch = arch_for(cc, group)
    flags = [f"-gencode=arch=compute_{arch},code=sm_{arch}"]
    if cc < (8, 9):
        flags.append("-DFPSIM_NO_FP8")
    return flags


def compile_cubin(group: str, cc: tuple, workdir: Path, log) -> tuple:
    """Compile a kernel group to a cubin: nvcc if present, else NVRTC through
    CuPy. Returns (cubin path, compiler description)."""
    src = cuda_source_path(group)
    out = workdir / f"{group}.cubin"
    nvcc = find_nvcc()
    if nvcc:
        cmd = [nvcc, "-cubin", *compile_flags(cc, group), "-o", str(out), str(src)]
        log(f"compile: {' '.join(cmd)}")
        t0 = time.time()
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"nvcc failed for {src.name}:\n{res.stdout}{res.stderr}")
        version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
        log(f"compiled {src.name} in {time.time() - t0:.1f} s")
        return out, "nvcc " + version.strip().splitlines()[-1]
    from cupy_backends.cuda.libs import nvrtc  # noqa: WPS433 (lazy)

    arch = arch_for(cc, group)
    opts = [f"--gpu-architecture=sm_{arch}"] + (["-DFPSIM_NO_FP8"] if cc < (8, 9) else [])
    prog = nvrtc.createProgram(src.read_text(), src.name, [], [])
    try:
        nvrtc.compileProgram(prog, opts)
    except Exception as e:  # noqa: BLE001 (report the compiler log)
        raise RuntimeError(f"NVRTC failed for {src.name}: {e}\n{nvrtc.getProgramLog(prog)}") from e
    out.write_bytes(nvrtc.getCUBIN(prog))
    return out, "nvrtc %d.%d" % nvrtc.getVersion()


def dump_sass(cubin: Path, dest: Path | None, log) -> str | None:
    """Write cuobjdump --dump-sass of the cubin next to the capture, if possible."""
    tool = shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump"
    if dest is None or not os.path.exists(tool):
        return
    res = subprocess.run([tool, "--dump-sass", str(cubin)], capture_output=True, text=True)
    dest.write_text(res.stdout + res.stderr)
    log(f"SASS written to {dest}")
    return res.stdout


class CupyLauncher:
    """Runs kernels of a cubin through CuPy (RawModule)."""

    backend = "cupy"
    sass = None  # the cubin's SASS, when dumped

    def __init__(self, cubin: Path):
        import cupy

        self.cp = cupy
        self.module = cupy.RawModule(path=str(cubin))

    def __call__(self, spec: MmaSpec, a_regs, b_words, c_regs):
        cp = self.cp
        tiles = a_regs.shape[0]
        a = cp.asarray(np.ascontiguousarray(a_regs).reshape(-1))
        b = cp.asarray(np.ascontiguousarray(b_words).reshape(-1))
        c = cp.asarray(np.ascontiguousarray(c_regs).reshape(-1))
        d = cp.zeros(tiles * spec.threads * spec.c.regs, dtype=cp.uint32)
        grid, block = launch_shape(spec, tiles)
        fn = self.module.get_function(spec.kernel)
        fn((grid,), (block,), (a, b, c, d, np.int32(tiles)))
        cp.cuda.runtime.deviceSynchronize()
        return cp.asnumpy(d).reshape(tiles, spec.threads, spec.c.regs)


def launch_shape(spec: MmaSpec, tiles: int) -> tuple:
    """(grid, block): 4 warps (tiles) per block for mma, one warpgroup per block for wgmma."""
    if spec.group == "mma":
        return -(-tiles // 4), 128
    return tiles, 128


TORCH_LAUNCH_DECL = ("void launch(std::string name, int64_t grid, int64_t block, torch::Tensor a, "
                     "torch::Tensor b, torch::Tensor c, torch::Tensor d, int64_t tiles);")


def torch_launcher_source(group: str) -> str:
    """The .cu source plus a host launcher for torch.utils.cpp_extension.load_inline."""
    specs = [s for s in MMA_SPECS if s.group == group]
    calls = "\n".join(
        f'  {"if" if i == 0 else "else if"} (name == "{s.kernel}") '
        f"{s.kernel}<<<(unsigned)grid, (unsigned)block>>>(pa, pb, pc, pd, (int)tiles);"
        for i, s in enumerate(specs))
    return (cuda_source_path(group).read_text() + """
#include <torch/extension.h>
#include <cuda_runtime.h>
void launch(std::string name, int64_t grid, int64_t block, torch::Tensor a, torch::Tensor b,
            torch::Tensor c, torch::Tensor d, int64_t tiles) {
  const u32* pa = reinterpret_cast<const u32*>(a.data_ptr<int32_t>());
  const u32* pb = reinterpret_cast<const u32*>(b.data_ptr<int32_t>());
  const u32* pc = reinterpret_cast<const u32*>(c.data_ptr<int32_t>());
  u32* pd = reinterpret_cast<u32*>(d.data_ptr<int32_t>());
""" + calls + """
  else TORCH_CHECK(false, "unknown kernel ", name);
  cudaError_t err = cudaDeviceSynchronize();
  TORCH_CHECK(err == cudaSuccess, "kernel ", name, " failed: ", cudaGetErrorString(err));
}
""")


class TorchLauncher:
    """Fallback without CuPy: the kernels built as a torch extension (load_inline)."""

    backend = "torch-inline"

    def __init__(self, group: str, cc: tuple):
        import torch
        from torch.utils.cpp_extension import load_inline

        self.torch = torch
        major, minor = cc
        os.environ["TORCH_CUDA_ARCH_LIST"] = f"{major}.{minor}" + ("a" if cc == (9, 0) else "")
        flags = ["-DFPSIM_NO_FP8"] if cc < (8, 9) else []
        self.ext = load_inline(
            name=f"fpsim_{group}_kernels", cpp_sources=TORCH_LAUNCH_DECL,
            cuda_sources=torch_launcher_source(group), functions=["launch"],
            extra_cuda_cflags=flags, verbose=False)

    def __call__(self, spec: MmaSpec, a_regs, b_words, c_regs):
        torch = self.torch
        tiles = a_regs.shape[0]

        def dev(x):
            return torch.from_numpy(np.ascontiguousarray(x).reshape(-1).view(np.int32)).cuda()

        d = torch.zeros(tiles * spec.threads * spec.c.regs, dtype=torch.int32, device="cuda")
        grid, block = launch_shape(spec, tiles)
        self.ext.launch(spec.kernel, grid, block, dev(a_regs), dev(b_words), dev(c_regs), d, tiles)
        return d.cpu().numpy().view(np.uint32).reshape(tiles, spec.threads, spec.c.regs)


def simulated_launcher(spec, a_regs, b_words, c_regs):
    """Launcher stand-in for --simulate: the numpy model of the MMA."""
    return simulate_mma(spec, a_regs, b_words, c_regs)


simulated_launcher.backend = "numpy-simulation"


# ---------------------------------------------------------------------------
# Library level (torch on CUDA)
# ---------------------------------------------------------------------------

LIBRARY_KS = (64, 1024, 8192)
LIBRARY_MN = 32


def _first_line(e: BaseException, limit: int = 300) -> str:
    text = str(e).strip()
    line = text.splitlines()[0] if text else type(e).__name__
    return line if len(line) <= limit else line[:limit] + "..."


def _library_inputs(rng, fmt: str, shape) -> np.ndarray:
    return round_to_format(rng.standard_normal(shape), fmt)


def _torch_out_bits(t, output: str) -> np.ndarray:
    """A result tensor -> binary32 bit patterns of its values (exact widening)."""
    import torch

    if output == "fp32":
        return t.float().cpu().numpy().view(np.uint32)
    raw = t.contiguous().view(torch.int16).cpu().numpy().view(np.uint16)
    return widen_to_f32_bits(raw, output)


class _Flags:
    """Set torch.backends.cuda.matmul flags for one call and restore them after."""

    def __init__(self, torch, **flags):
        self.torch, self.flags, self.old = torch, flags, {}

    def __enter__(self):
        m = self.torch.backends.cuda.matmul
        for key, value in self.flags.items():
            self.old[key] = getattr(m, key)
            setattr(m, key, value)
        return self

    def __exit__(self, *exc):
        m = self.torch.backends.cuda.matmul
        for key, value in self.old.items():
            setattr(m, key, value)


@dataclass(frozen=True)
class LibraryCall:
    """One library-level case: a torch call on inputs of given formats."""

    name: str
    fa: str             # A's format
    fb: str             # B's format
    output: str
    call: str           # what is recorded as the case's "instruction"
    flags: dict
    notes: str
    optional: bool      # an API this torch may lack: a failure is a skip, not an error


def library_calls(k: int, formats) -> list:
    """The torch calls captured for one K, in order (cases sharing inputs adjacent)."""
    calls = []
    for fmt in ("fp16", "bf16"):
        if fmt not in formats:
            continue
        flag = f"allow_{fmt}_reduced_precision_reduction"
        for reduced in (False, True):
            calls.append(LibraryCall(
                f"torch_matmul_{fmt}_rr{int(reduced)}_k{k}", fmt, fmt, fmt, "torch.matmul",
                {flag: reduced}, f"{fmt} inputs and output through cuBLAS", False))
        calls.append(LibraryCall(
            f"torch_mm_{fmt}_outfp32_k{k}", fmt, fmt, "fp32", "torch.mm(out_dtype=torch.float32)",
            {}, f"{fmt} inputs, fp32 output", True))
    if "tf32" in formats:
        calls.append(LibraryCall(
            f"torch_matmul_tf32_k{k}", "tf32", "tf32", "fp32",
            "torch.matmul (float32 tensors, TF32 on)", {"tf32": True},
            "inputs are tf32 values held in float32 tensors", False))
    for fa, fb in (("e4m3", "e4m3"), ("e5m2", "e4m3"), ("e4m3", "e5m2")):
        if fa not in formats and fb not in formats:
            continue
        for out in ("fp32", "bf16"):
            for fast in (False, True):
                calls.append(LibraryCall(
                    f"torch_scaled_mm_{fa}x{fb}_{out}_fast{int(fast)}_k{k}", fa, fb, out,
                    "torch._scaled_mm", {"use_fast_accum": fast, "scale_a": 1.0, "scale_b": 1.0},
                    "unit scales; B column-major", True))
    return calls


def _run_library_call(torch, c: LibraryCall, A, B, dev):
    """The result tensor of one call (flags set for the call only)."""
    if c.call == "torch._scaled_mm":
        one = torch.ones((), device=dev, dtype=torch.float32)
        odt = torch.float32 if c.output == "fp32" else torch.bfloat16
        return torch._scaled_mm(A, B, scale_a=one, scale_b=one, out_dtype=odt,
                                use_fast_accum=c.flags["use_fast_accum"])
    if c.call.startswith("torch.mm(out_dtype"):
        return torch.mm(A, B, out_dtype=torch.float32)
    with _Flags(torch, **_torch_flags(torch, c.flags)):
        return torch.matmul(A, B)


def _torch_flags(torch, flags: dict) -> dict:
    """Our flag names -> torch.backends.cuda.matmul attributes."""
    if flags.get("tf32"):
        m = torch.backends.cuda.matmul
        return {"fp32_precision": "tf32"} if hasattr(m, "fp32_precision") else {"allow_tf32": True}
    return flags


def library_cases(seed: int, formats, log, ks=LIBRARY_KS, mn=LIBRARY_MN, dev="cuda"):
    """Yield ("case", CaptureCase), ("skip", {...}) or ("fail", {...}) per torch call.

    ``dev="cpu"`` (used by --simulate) exercises the same code on torch's CPU
    kernels; such cases are not tensor-core data.
    """
    import torch

    rng = np.random.default_rng(case_seed(seed, "library"))
    tdt = {"fp16": torch.float16, "bf16": torch.bfloat16,
           "e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}

    def to_dev(x, fmt, column_major=False):
        x = np.ascontiguousarray(x.T if column_major else x, dtype=np.float32)
        t = torch.from_numpy(x).to(dev)
        t = t if fmt == "tf32" else t.to(tdt[fmt])
        return t.t() if column_major else t

    for k in ks:
        inputs = {}                              # (fa, fb) -> (a, b, A, B, first case name)
        for c in library_calls(k, formats):
            key = (c.fa, c.fb, c.call == "torch._scaled_mm")
            if key not in inputs:
                a = _library_inputs(rng, c.fa, (mn, k))
                b = _library_inputs(rng, c.fb, (k, mn))
                # _scaled_mm wants B column-major
                inputs[key] = [a, b, to_dev(a, c.fa), to_dev(b, c.fb, key[2]), None]
            a, b, A, B, first = inputs[key]
            try:
                d = _run_library_call(torch, c, A, B, dev)
                if dev == "cuda":
                    torch.cuda.synchronize()
                d_bits = _torch_out_bits(d, c.output)
            except Exception as e:  # noqa: BLE001 (an unsupported call or a failure)
                what = "skip" if c.optional else "fail"
                yield what, {"case": c.name, "reason": f"{c.call}: {_first_line(e)}"}
                continue
            meta = {"name": c.name, "kind": "matmul", "level": "library", "inputs": c.fa,
                    "c_format": None, "output": c.output, "k": int(k), "instruction": c.call,
                    "flags": dict(c.flags, **({"torch_flags": _torch_flags(torch, c.flags)}
                                             if c.flags.get("tf32") else {})),
                    "notes": f"{c.notes}; {mn}x{k} @ {k}x{mn}, d = a @ b (no c)"}
            if c.fb != c.fa:
                meta["inputs_b"] = c.fb
            if first:
                meta["same_inputs_as"] = first
            else:
                inputs[key][4] = c.name
            yield "case", CaptureCase(meta, f32_bits(a), f32_bits(b), None, d_bits)


# ---------------------------------------------------------------------------
# Environment facts
# ---------------------------------------------------------------------------

def _run(cmd) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def environment(simulate: bool) -> dict:
    """GPU name, compute capability, driver, CUDA, torch, CuPy, nvcc versions."""
    env = {"python": sys.version.split()[0], "numpy": np.__version__}
    try:
        import ml_dtypes

        env["ml_dtypes"] = ml_dtypes.__version__
    except ImportError:
        pass
    try:
        import torch

        env["torch"] = torch.__version__
        env["cuda"] = torch.version.cuda
        if not simulate and torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name(0)
            env["compute_capability"] = "%d.%d" % torch.cuda.get_device_capability(0)
    except ImportError:
        env["torch"] = None
    try:
        import cupy

        env["cupy"] = cupy.__version__
    except Exception:  # noqa: BLE001 (cupy may fail to import in many ways)
        env["cupy"] = None
    smi = _run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
    if smi:
        env["driver"] = smi.splitlines()[0].split(",")[-1].strip()
    nvcc = find_nvcc()
    if nvcc:
        lines = _run([nvcc, "--version"]).splitlines()
        env["nvcc"] = lines[-1] if lines else None
    return env


# ---------------------------------------------------------------------------
# Groups, processes and the command line
# ---------------------------------------------------------------------------

class Log:
    """Prints and appends to a log file."""

    def __init__(self, path: Path | None):
        self.path = path
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)

    def __call__(self, msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        if self.path:
            with open(self.path, "a") as f:
                f.write(line + "\n")


def _specs_for(group: str, formats, cc) -> tuple:
    chosen, skipped = [], []
    for s in MMA_SPECS:
        if s.group != group or s.inputs not in formats:
            continue
        if cc is not None and tuple(cc) < s.min_cc:
            skipped.append({"case": s.kernel, "reason": f"needs compute capability {s.min_cc}"})
        elif cc is not None and s.group == "wgmma" and tuple(cc) != (9, 0):
            skipped.append({"case": s.kernel, "reason": "wgmma exists on sm_90a only"})
        else:
            chosen.append(s)
    return chosen, skipped


def run_group(group: str, args, log) -> Capture:
    """Run one group of cases in this process and return its capture."""
    env = environment(args.simulate)
    meta = new_meta(env.get("gpu", "numpy simulation" if args.simulate else "unknown"),
                    compute_capability=env.get("compute_capability"), driver=env.get("driver"),
                    cuda=env.get("cuda"), torch=env.get("torch"), seed=args.seed,
                    source="fpsim.tensorcore.gpu_capture",
                    licence="captured by the fpsim project; no third-party data",
                    environment=env, command=" ".join(sys.argv), skipped=[])
    capture = Capture(meta, [])
    if group == "library":
        dev = "cpu" if args.simulate else "cuda"
        meta["backend"] = "torch-cpu (simulation, not tensor-core data)" if args.simulate else "torch"
        for what, item in library_cases(args.seed, args.formats, log, dev=dev):
            if what == "skip":
                log(f"skip {item['case']}: {item['reason']}")
                meta["skipped"].append(item)
            elif what == "fail":
                log(f"FAIL {item['case']}: {item['reason']}")
                meta["failures"].append({"case": item["case"], "error": item["reason"]})
            else:
                try:
                    item.validate()
                except ValueError as e:
                    log(f"FAIL {item.name}: {e}")
                    meta["failures"].append({"case": item.name, "error": f"ValueError: {e}"})
                    continue
                item.meta["backend"] = meta["backend"]
                log(f"ok   {item.name}: {item.d.shape}")
                capture.cases.append(item)
        return capture

    cc = None if args.simulate else tuple(int(x) for x in env["compute_capability"].split("."))
    specs, skipped = _specs_for(group, args.formats, cc)
    meta["skipped"] += skipped
    if args.simulate:
        launcher = simulated_launcher
    else:
        launcher = _gpu_launcher(group, cc, args, log, meta)
    meta["backend"] = launcher.backend
    for spec in specs:
        t0 = time.time()
        try:
            case = capture_instruction_case(spec, args.rows, args.seed, launcher)
            case.validate()
        except Exception as e:  # noqa: BLE001 (record and go on)
            msg = f"{type(e).__name__}: {e}"
            log(f"FAIL {spec.kernel}: {msg}")
            meta["failures"].append({"case": spec.kernel, "error": msg})
            continue
        case.meta["backend"] = launcher.backend
        case.meta["compiler"] = meta.get("compiler")
        sass = getattr(launcher, "sass", None) or ""
        path = fp8_path_from_sass(sass, spec.kernel) if spec.inputs in ("e4m3", "e5m2") else None
        if path:
            case.meta["path"] = path
        capture.cases.append(case)
        log(f"ok   {spec.kernel}: {case.rows} rows, self-check passed ({time.time() - t0:.1f} s)")
    return capture


def _gpu_launcher(group, cc, args, log, meta):
    workdir = Path(tempfile.mkdtemp(prefix="fpsim-capture-"))
    if args.backend in ("auto", "cupy"):
        try:
            import cupy  # noqa: F401 (only: is CuPy there?)

            cubin, compiler = compile_cubin(group, cc, workdir, log)
            meta["compiler"] = compiler
            launcher = CupyLauncher(cubin)
            if args.sass_dir:
                launcher.sass = dump_sass(cubin, Path(args.sass_dir) / f"{group}.sass", log)
            return launcher
        except ImportError:
            if args.backend == "cupy":
                raise
            log("CuPy not importable: building the kernels with torch load_inline")
    meta["compiler"] = "torch.utils.cpp_extension.load_inline"
    return TorchLauncher(group, cc)


def _bootstrap_command() -> list:
    """Run this module in a child Python without executing fpsim/__init__.py
    (other fpsim modules may need builds that the GPU machine lacks)."""
    root = str(Path(__file__).resolve().parents[2])
    code = ("import os, sys, types, runpy\n"
            "root = sys.argv.pop(1)\n"
            "for name, sub in (('fpsim', ('fpsim',)), ('fpsim.tensorcore', ('fpsim', 'tensorcore'))):\n"
            "    if name not in sys.modules:\n"
            "        m = types.ModuleType(name); m.__path__ = [os.path.join(root, *sub)]\n"
            "        sys.modules[name] = m\n"
            "runpy.run_module('fpsim.tensorcore.gpu_capture', run_name='__main__', alter_sys=True)\n")
    return [sys.executable, "-c", code, root]


def _child_args(args, group: str, out: Path) -> list:
    argv = ["--group", group, "--out", str(out), "--rows", str(args.rows),
            "--seed", str(args.seed), "--formats", ",".join(args.formats),
            "--backend", args.backend]
    if args.log:
        argv += ["--log", str(args.log)]
    if args.sass_dir:
        argv += ["--sass-dir", str(args.sass_dir)]
    if args.simulate:
        argv.append("--simulate")
    return argv


def run_group_process(group: str, args, workdir: Path, log) -> Capture:
    """Run a group in a child process; a crash or a hang becomes a recorded failure."""
    out = workdir / f"{group}.npz"
    cmd = _bootstrap_command() + _child_args(args, group, out)
    t0 = time.time()
    timeout = args.group_timeout or GROUP_TIMEOUT_S[group]
    try:
        res = subprocess.run(cmd, timeout=timeout, capture_output=True, text=True)
        tail = (res.stdout + res.stderr)[-4000:]
        ok = res.returncode == 0 and out.exists()
        error = None if ok else f"group process exited with {res.returncode}:\n{tail}"
    except subprocess.TimeoutExpired as e:
        ok, error = False, f"group process timed out after {timeout} s (hang or too slow)"
        tail = str(e.stdout or "")[-2000:]
    if tail and not ok:
        log(f"group {group} output tail:\n{tail}")
    if ok:
        log(f"group {group} done in {time.time() - t0:.1f} s")
        return load_capture(out)
    log(f"FAIL group {group}: {error.splitlines()[0]}")
    return Capture(new_meta("unknown", failures=[{"case": f"group:{group}", "error": error}]), [])


def _merged(parts, groups, args, argv) -> Capture:
    """The capture of all groups run so far, with the run's facts in its meta."""
    with_cases = [p for p in parts if p.cases] or parts
    capture = merge_captures(with_cases[0], *[p for p in parts if p is not with_cases[0]])
    capture.meta["skipped"] = sum((p.meta.get("skipped", []) for p in parts), [])
    capture.meta["groups"] = groups
    capture.meta["groups_done"] = len(parts)
    capture.meta["rows_random_per_case"] = args.rows
    capture.meta["command"] = " ".join(["python3 -m fpsim.tensorcore.gpu_capture"]
                                       + list(sys.argv[1:] if argv is None else argv))
    return capture


def _split_library(capture: Capture, out: Path, log) -> None:
    """Keep a too-large file under the size limit: library cases go to <out>-library.npz."""
    lib = [c for c in capture.cases if c.meta["level"] == "library"]
    if not lib:
        return
    other = Path(out).with_name(Path(out).stem + "-library.npz")
    save_capture(Capture(dict(capture.meta, failures=[]), lib), other)
    capture.cases = [c for c in capture.cases if c.meta["level"] != "library"]
    capture.meta["library_file"] = other.name
    save_capture(capture, out)
    log(f"file over the size limit: library cases moved to {other}")


def cuda_problem() -> str | None:
    """Why this machine cannot capture (None when it can)."""
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed; the capture needs torch with CUDA."
    if not torch.cuda.is_available():
        built = torch.version.cuda
        return (f"no CUDA device: torch.cuda.is_available() is False (torch {torch.__version__}, "
                f"{'built with CUDA ' + built if built else 'built without CUDA'}). "
                "Run this on a machine with an NVIDIA GPU, or pass --simulate to test the host code.")
    return None


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="python3 -m fpsim.tensorcore.gpu_capture",
        description="Capture real tensor-core outputs into an fpsim capture file (.npz).")
    p.add_argument("--out", required=True, type=Path, help="capture file to write (.npz)")
    p.add_argument("--formats", default=",".join(ALL_FORMATS),
                   help="input formats, comma-separated (default: all: %(default)s)")
    p.add_argument("--rows", type=int, default=4096,
                   help="random rows per instruction case, half wide-spread, half upstream-like "
                        "(probes come on top; default %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-library", action="store_true", help="no torch library-level cases")
    p.add_argument("--skip-wgmma", action="store_true", help="no Hopper wgmma cases")
    p.add_argument("--log", type=Path, help="append progress to this file")
    p.add_argument("--sass-dir", type=Path, help="write cuobjdump SASS of the kernels here")
    p.add_argument("--backend", choices=("auto", "cupy", "torch"), default="auto",
                   help="kernel launcher: CuPy if importable (auto), or torch load_inline")
    p.add_argument("--simulate", action="store_true",
                   help="no GPU: run the instruction cases through the numpy MMA model")
    p.add_argument("--in-process", action="store_true",
                   help="run the groups in this process (no isolation)")
    p.add_argument("--group-timeout", type=int, default=None,
                   help="seconds before a group process is stopped (default: per group, "
                        + ", ".join(f"{g} {t}" for g, t in GROUP_TIMEOUT_S.items()) + ")")
    p.add_argument("--max-mib", type=float, default=15.0,
                   help="above this size, library cases go to a second file <out>-library.npz")
    p.add_argument("--group", choices=GROUPS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    formats = [f.strip().lower() for f in args.formats.split(",") if f.strip()]
    unknown = sorted(set(formats) - set(ALL_FORMATS))
    if unknown:
        p.error(f"unknown format(s) {unknown}; allowed: {list(ALL_FORMATS)}")
    if args.rows < 0:
        p.error("--rows must be >= 0")
    args.formats = formats
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    log = Log(args.log)
    if not args.simulate:
        problem = cuda_problem()
        if problem:
            print(f"gpu_capture: {problem}", file=sys.stderr)
            return 2
    if args.group:                      # a child process: one group, one file
        capture = run_group(args.group, args, log)
        save_capture(capture, args.out)
        return 0

    groups = [g for g in GROUPS if not (g == "library" and args.skip_library)
              and not (g == "wgmma" and args.skip_wgmma)]
    log(f"capture: groups {groups}, formats {args.formats}, rows {args.rows}, seed {args.seed}")
    t0 = time.time()
    parts = []
    with tempfile.TemporaryDirectory(prefix="fpsim-capture-") as tmp:
        for group in groups:
            if args.in_process:
                try:
                    parts.append(run_group(group, args, log))
                except Exception as e:  # noqa: BLE001
                    log(f"FAIL group {group}: {type(e).__name__}: {e}")
                    parts.append(Capture(new_meta("unknown", failures=[
                        {"case": f"group:{group}", "error": f"{type(e).__name__}: {e}"}]), []))
            else:
                parts.append(run_group_process(group, args, Path(tmp), log))
            capture = _merged(parts, groups, args, argv)
            save_capture(capture, args.out)      # after every group: a later kill keeps it
    size = os.path.getsize(args.out)
    if size > args.max_mib * 2**20:
        _split_library(capture, args.out, log)
        size = os.path.getsize(args.out)
    log(f"wrote {args.out}: {len(capture.cases)} case(s), "
        f"{len(capture.meta['failures'])} failure(s), {size / 2**20:.1f} MiB, "
        f"{time.time() - t0:.0f} s")
    for f in capture.meta["failures"]:
        log(f"  failure {f['case']}: {f['error'].splitlines()[0]}")
    return 0 if capture.cases else 1


if __name__ == "__main__":
    sys.exit(main())
