"""The compiled MX path (fpsim/_fastblocks.c) and its bridge.

For float32 input in blocks of consecutive elements, an E8M0 scale rule
(floor, ceil, even, rceil) and a deterministic rounding mode, the kernel takes
each block's amax, its scale and its rounded elements in one pass, the
division by the power-of-two scale folded into the rounding as an exponent
offset. block_codec uses it where `covers` says so; without a compiler
(`_fastblocks` missing) every block goes the general way, with the same bits
(tests/test_blocks.py checks both against fpsim/exact_blocks.py).
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


def covers(fmt, runs, dtype, rounding: str) -> bool:
    """Whether the kernel quantises this: `fmt` (a BlockFormat) with float elements, an E8M0 scale and a
    rule in RULES; `runs` (blocks as runs of consecutive elements, see block_codec) set; float32 input;
    a deterministic mode."""
    return (_fastblocks is not None and bool(runs) and np.dtype(dtype) == np.float32
            and not MODES[rounding].stochastic and fmt.kind == "float" and fmt.scale == PRESETS["e8m0"]
            and fmt.scale_rule in RULES and _covers_element(fmt.element))


@functools.lru_cache(maxsize=64)
def _params(fmt) -> dict:
    from .codec import encode

    element = fmt.element
    nan_code = int(encode(np.float32(np.nan), element)) if element.has_nan else 0
    return dict(rule=RULES[fmt.scale_rule], man_bits=element.man_bits, emin=element.emin, bias=element.bias,
                emax=fmt.emax_elem, top_exp=element.emax - element.man_bits,
                max_significand=element.max_significand, sign_shift=element.bits - 1,
                element_max=float(element.max), nan_code=nan_code)


def quantize(view: np.ndarray, fmt, rounding: str, out_dtype) -> tuple[np.ndarray, np.ndarray]:
    """(element codes or dequantised values of dtype `out_dtype`, E8M0 scale codes) of a C-contiguous
    float32 array whose last axis is one block (block_codec's blocked view; covers() must hold). The
    values' dtype must hold every value (block_codec._result_dtype); scale codes have the shape
    view.shape[:-1]."""
    out_dtype = np.dtype(out_dtype)
    src = np.ascontiguousarray(view, dtype=np.float32)
    block = src.shape[-1]
    dst = np.empty(src.shape, dtype=out_dtype)
    scales = np.empty(src.shape[:-1], dtype=np.uint8)
    _fastblocks.quantize_mx(src.reshape(-1).view(np.uint8), dst.reshape(-1).view(np.uint8), scales.reshape(-1),
                            block=block, mode=MODES[rounding].kernel_id, output=_OUTPUTS[out_dtype.name],
                            **_params(fmt))
    return dst, scales
