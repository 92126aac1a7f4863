"""The compiled fast path of the rounding engine (fpsim/_fastround.c), and its bridge.

The kernel covers float32 numpy input in the deterministic modes, for formats
inside float32's range. It takes every edge value (overflow, Inf, NaN, zero,
negative input of an unsigned format) as data computed here by the numpy
engine, and hands back the few elements it does not round (inputs below min
normal of formats without a subnormal grid), which the numpy engine finishes.
Tests compare the result with the numpy engine bit for bit.
"""

from __future__ import annotations

import functools

import numpy as np

from .formats import Format

try:
    from . import _fastround
except ImportError:  # built without a compiler: the numpy engine does everything
    _fastround = None

_MODES = {"nearest_even": 0, "nearest_away": 1, "toward_zero": 2, "up": 3, "down": 4, "odd": 5}
_FLOAT32_MIN_NORMAL_BITS = 0x00800000
# Inputs whose result depends only on sign, mode and options, in pairs (+, -):
# overflow, Inf, NaN, zero; then a negative value (for unsigned formats).
_EDGE_INPUTS = np.array([3.4028235e38, -3.4028235e38, np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0, -1.0],
                        dtype=np.float32)


def available() -> bool:
    return _fastround is not None


def covers(work, fmt: Format, rounding: str) -> bool:
    """Whether the kernel applies: float32 numpy input, a deterministic mode, a format within float32."""
    return (
        _fastround is not None
        and isinstance(work, np.ndarray)
        and work.dtype == np.float32
        and rounding in _MODES
        and fmt.man_bits <= 22
        and fmt.emax <= 127
        and fmt.emin - fmt.man_bits >= -149
    )


def _reference(fmt: Format, options: tuple, codes: bool):
    """The numpy engine for float32 input: values, or codes when `codes` (what the kernel must match)."""
    from . import _arrays
    from .codec import _pack, code_dtype
    from .rounding import round_bits

    engine_options = dict(options)

    def reference(values):
        ops = _arrays.Ops(values)
        rounded = round_bits(values, fmt, ops, **engine_options)
        return _pack(rounded, fmt, ops).astype(code_dtype(fmt)) if codes else rounded

    return reference


@functools.lru_cache(maxsize=256)
def _edge_answers(fmt: Format, options: tuple, codes: bool) -> tuple:
    """The engine's outputs for _EDGE_INPUTS, as the kernel's integers (0 where the engine
    refuses the input: the caller has checked that the data holds none, e.g. NaN for a
    format without NaN)."""
    reference = _reference(fmt, options, codes)
    answers = []
    for value in _EDGE_INPUTS:
        try:
            out = np.asarray(reference(np.array([value], dtype=np.float32)))
            answers.append(int(out.view(np.uint32 if out.dtype == np.float32 else out.dtype)[0]))
        except ValueError:
            answers.append(0)
    return tuple(answers)


def run(work: np.ndarray, fmt: Format, *, rounding, saturate, flush_inputs, flush_outputs, codes: bool):
    """Round float32 `work` with the kernel: float32 values, or codes when `codes`."""
    from .codec import code_dtype

    options = (("rounding", rounding), ("saturate", saturate), ("flush_inputs", flush_inputs),
               ("flush_outputs", flush_outputs))
    src = np.ascontiguousarray(work)
    out_dtype = code_dtype(fmt) if codes else np.dtype(np.float32)
    dst = np.empty(src.shape, dtype=out_dtype)
    answers = _edge_answers(fmt, options, codes)
    over, inf, nan, zero = (tuple(answers[i:i + 2]) for i in range(0, 8, 2))
    lo = max(int(np.float32(float(fmt.min_normal)).view(np.uint32)), _FLOAT32_MIN_NORMAL_BITS)
    hi = int(np.float32(float(fmt.max)).view(np.uint32))
    flush = flush_inputs or flush_outputs
    left = _fastround.round_f32(
        src, dst.view(np.uint8), _MODES[rounding], out_dtype.itemsize if codes else 0, lo, hi,
        23 - fmt.man_bits, ((127 - fmt.bias) << fmt.man_bits) & 0xFFFFFFFF, 31 - (fmt.exp_bits + fmt.man_bits),
        int(fmt.signed), int(fmt.subnormals and fmt.zero and not flush and fmt.emin >= -126), fmt.emin,
        fmt.man_bits, over, inf, nan, zero, answers[8],
    )
    if left:
        magnitude = src.view(np.uint32) & np.uint32(0x7FFFFFFF)
        redo = (magnitude < lo) & (magnitude != 0)
        dst[redo] = _reference(fmt, options, codes)(src[redo])
    return dst
