"""The compiled fast path of the rounding engine (fpsim/_fastround.c), and its bridge.

The kernel covers float32 numpy input in every mode, for formats
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
from .modes import MODES

try:
    from . import _fastround
except ImportError:  # built without a compiler: the numpy engine does everything
    _fastround = None

FLOAT32_RAND_BITS = 26  # exact stochastic rounding of float32 input: 23 + 3 bits, as the numpy engine
_FLOAT32_MIN_NORMAL_BITS = 0x00800000
# Inputs whose result depends only on sign, mode and options, in pairs (+, -):
# overflow, Inf, NaN, zero; then a negative value (for unsigned formats; negatives below min
# normal, which flush_subnormal_inputs turns into -0, go to the numpy engine).
_EDGE_INPUTS = np.array([3.4028235e38, -3.4028235e38, np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0,
                         -3.4028235e38], dtype=np.float32)  # (the last: never flushed as subnormal)


def available() -> bool:
    return _fastround is not None


NO_KERNEL_WARNING = (
    "fpsim's compiled rounding kernel is not built (fpsim was installed without a C compiler), so "
    "quantize() and encode() run on the numpy engine: the same bits, but about 100 to 350 times slower "
    "on float32 input (measured in docs/speed.md). Install a C compiler and the Python headers (Debian: "
    "apt install gcc python3-dev) and reinstall fpsim to build it.")
_warned = []


def warn_once_without_kernel() -> None:
    """The one-time warning that the numpy engine runs where the kernel would."""
    if _fastround is None and not _warned:
        import warnings

        _warned.append(True)
        warnings.warn(NO_KERNEL_WARNING, RuntimeWarning, stacklevel=4)


def covers(work, fmt: Format, rounding: str) -> bool:
    """Whether the kernel applies: float32 numpy input, a deterministic mode, a format within float32."""
    return (
        _fastround is not None
        and isinstance(work, np.ndarray)
        and work.dtype == np.float32
        and rounding in MODES
        and fmt.man_bits <= 22
        and fmt.emax <= 127
        and fmt.emin - fmt.man_bits >= -149
        and fmt.max >= 2 ** -126  # the kernel's normal band starts at float32's min normal
    )


def _reference(fmt: Format, options: tuple, codes: bool):
    """The numpy engine for float32 input: values, or codes when `codes` (what the kernel must match).

    reference(values, draws) takes the stochastic draws of those values (the largest by default).
    """
    from . import _arrays
    from .codec import _pack, code_dtype
    from .rounding import round_bits

    engine_options = dict(options)

    def reference(values, draws=None):
        ops = _arrays.Ops(values)
        if engine_options["rounding"] == "stochastic" and draws is None:
            # the largest draw: every inexact value rounds away from zero, so the
            # overflow edge input (float32 max) overflows as it can in the kernel
            bits = engine_options["rand_bits"] or FLOAT32_RAND_BITS
            draws = np.full(values.shape, (1 << bits) - 1, dtype=np.uint32)
        rounded = round_bits(values, fmt, ops, random_ints=draws, **engine_options)
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


def run(work: np.ndarray, fmt: Format, *, rounding, saturate, flush_inputs, flush_outputs, codes: bool,
        rand_bits=None, draws=None):
    """Round float32 `work` with the kernel: float32 values, or codes when `codes`.

    Stochastic rounding needs `draws`: one integer in [0, 2^r) per element, r =
    rand_bits or 26 (the same draws the numpy engine takes).
    """
    from .codec import code_dtype

    options = (("rounding", rounding), ("saturate", saturate), ("flush_inputs", flush_inputs),
               ("flush_outputs", flush_outputs), ("rand_bits", rand_bits))
    stochastic = rounding == "stochastic"
    draw_buffer = np.ascontiguousarray(draws, dtype=np.uint32).reshape(-1) if stochastic else b""
    src = np.ascontiguousarray(work)
    out_dtype = code_dtype(fmt) if codes else np.dtype(np.float32)
    dst = np.empty(src.shape, dtype=out_dtype)
    answers = _edge_answers(fmt, options, codes)
    over, inf, nan, zero = (tuple(answers[i:i + 2]) for i in range(0, 8, 2))
    lo = max(int(np.float32(float(fmt.min_normal)).view(np.uint32)), _FLOAT32_MIN_NORMAL_BITS)
    hi = int(np.float32(float(fmt.max)).view(np.uint32))
    flush = flush_inputs or flush_outputs
    left = _fastround.round_f32(
        src, dst.view(np.uint8), MODES[rounding].kernel_id, out_dtype.itemsize if codes else 0, lo, hi,
        23 - fmt.man_bits, ((127 - fmt.bias) << fmt.man_bits) & 0xFFFFFFFF, 31 - (fmt.exp_bits + fmt.man_bits),
        int(fmt.signed), int(fmt.subnormals and fmt.zero and not flush and fmt.emin >= -126), fmt.emin,
        fmt.man_bits, over, inf, nan, zero, answers[8], draw_buffer,
        (rand_bits or FLOAT32_RAND_BITS) if stochastic else 0,
    )
    if left:
        magnitude = src.view(np.uint32) & np.uint32(0x7FFFFFFF)
        redo = (magnitude < lo) & (magnitude != 0)
        subset_draws = np.asarray(draws).reshape(src.shape)[redo] if stochastic else None
        dst[redo] = _reference(fmt, options, codes)(src[redo], subset_draws)
    return dst.reshape(np.shape(work))  # (ascontiguousarray makes 0-d arrays 1-d)
