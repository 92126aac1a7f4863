"""The compiled block paths (fpsim/_fastblocks.c) and their bridge.

For float32 input in blocks of consecutive elements, the kernels take each
block's amax, its scale and its rounded elements in one pass: MX (an E8M0 scale
rule: floor, ceil, even, rceil; a deterministic rounding mode), the division by
the power-of-two scale folded into the rounding as an exponent offset; and
NVFP4 (round-to-nearest-even, finite input), whose elements are found by exact
comparisons with the E2M1 midpoints times the block's divisor. block_codec uses
them where `covers` says so; without a compiler (`_fastblocks` missing) every
block goes the general way, with the same bits (tests/test_blocks.py checks
every path against fpsim/exact_blocks.py).
"""

from __future__ import annotations

import functools

import numpy as np

from .formats import PRESETS, Format
from .modes import MODES

try:
    from . import _fastblocks
except ImportError:  # built without a compiler: block_codec's general path does everything
    _fastblocks = None

__all__ = ["covers", "quantize"]

RULES = {"floor": 0, "ceil": 1, "even": 2, "rceil": 3}  # the RULE_* enum of _fastblocks.c
_OUTPUTS = {"uint8": 0, "uint16": 1, "float32": 2, "float64": 3}  # its OUT_* enum, by output dtype


def available() -> bool:
    return _fastblocks is not None


def _covers_element(element: Format) -> bool:
    """Signed with subnormals and -0, 1 to 19 mantissa bits, a finest spacing of 2^-21 or coarser (see
    _fastblocks.c) and a max that float32 holds (rceil divides by it in float32)."""
    quantum_exp = element.emin - element.man_bits
    return (element.signed and element.subnormals and element.has_negative_zero and 1 <= element.man_bits <= 19
            and quantum_exp >= -21 and element.bits <= 16 and float(np.float32(element.max)) == element.max)


def _covers_mx(fmt, rounding: str) -> bool:
    """Float elements, an E8M0 scale and a rule in RULES, a deterministic mode."""
    return (not MODES[rounding].stochastic and fmt.kind == "float" and fmt.scale == PRESETS["e8m0"]
            and fmt.scale_rule in RULES and _covers_element(fmt.element))


def _covers_nvfp4(fmt, rounding: str) -> bool:
    """E2M1 elements, E4M3 scales by the "nearest" rule, an FP32 tensor scale (or none), round-to-nearest-even."""
    return (rounding == "nearest_even" and fmt.kind == "float" and fmt.element == PRESETS["e2m1"]
            and fmt.scale == PRESETS["e4m3"] and fmt.scale_rule == "nearest"
            and fmt.tensor_scale in (None, PRESETS["fp32"]))


def covers(fmt, runs, dtype, rounding: str) -> bool:
    """Whether a kernel quantises this: `fmt` (a BlockFormat) that _covers_mx or _covers_nvfp4; `runs`
    (blocks as runs of consecutive elements, see block_codec) set; float32 input."""
    return (_fastblocks is not None and bool(runs) and np.dtype(dtype) == np.float32
            and (_covers_mx(fmt, rounding) or _covers_nvfp4(fmt, rounding)))


@functools.lru_cache(maxsize=64)
def _params(fmt) -> dict:
    from .codec import encode

    element = fmt.element
    nan_code = int(encode(np.float32(np.nan), element)) if element.has_nan else 0
    return dict(rule=RULES[fmt.scale_rule], man_bits=element.man_bits, emin=element.emin, bias=element.bias,
                emax=fmt.emax_elem, top_exp=element.emax - element.man_bits,
                max_significand=element.max_significand, sign_shift=element.bits - 1,
                element_max=float(element.max), nan_code=nan_code)


def quantize(view: np.ndarray, fmt, rounding: str, out_dtype) -> tuple | None:
    """(element codes or dequantised values of dtype `out_dtype`, scale codes, tensor scale or None) of a
    C-contiguous float32 array whose last axis is one block (block_codec's blocked view), or None where no
    kernel applies: covers() must hold, and NVFP4 also needs finite input. The values' dtype must hold every
    value (block_codec._result_dtype); scale codes have the shape view.shape[:-1]."""
    out_dtype = np.dtype(out_dtype)
    src = np.ascontiguousarray(view, dtype=np.float32)
    block = src.shape[-1]
    flat = src.reshape(-1)
    scales = np.empty(src.shape[:-1], dtype=np.uint8)
    if _covers_nvfp4(fmt, rounding):
        from . import _native

        if not flat.size:
            amax = np.float32(0)
        elif _native.available():
            amax = _native.block_amax(flat, flat.size)[0]
        else:
            amax = np.max(np.abs(flat))
        if not np.isfinite(amax):
            return None  # NaN/Inf blocks: the general path
        tensor_scale = fmt.tensor_scale_of(float(amax)) if fmt.tensor_scale is not None else None
        dst = np.empty(src.shape, dtype=out_dtype)
        _fastblocks.quantize_nvfp4(flat.view(np.uint8), dst.reshape(-1).view(np.uint8), scales.reshape(-1),
                                   block=block, values=out_dtype != np.uint8, tensor_scale=tensor_scale or 1.0,
                                   amax_floor=float(np.float32(fmt.amax_floor)))
        return dst, scales, tensor_scale
    dst = np.empty(src.shape, dtype=out_dtype)
    _fastblocks.quantize_mx(flat.view(np.uint8), dst.reshape(-1).view(np.uint8), scales.reshape(-1),
                            block=block, mode=MODES[rounding].kernel_id, output=_OUTPUTS[out_dtype.name],
                            **_params(fmt))
    return dst, scales, None
