"""The bit fields of a format's codes: exact values to codes and back, on numpy arrays and torch tensors.

pack builds sign, exponent field and mantissa field from values that are
already exact in the format (the engine's output, `_engine.round_bits`);
unpack builds the values back from the fields. `codec` (encode, decode) adds
the checks and the kernel's fast path on top; `_native` takes the kernel's
edge codes from pack. Codes are int64 here (a 64-bit code's top bit is int64's sign).
"""

from __future__ import annotations

import numpy as np

from . import _arrays
from ._engine import decompose, exact_pow2, quiet_nan
from ._options import first_index
from .formats import Format, format as get_format


def code_dtype(fmt: "str | Format", torch: bool = False):
    """The unsigned integer dtype that holds a code of `fmt`."""
    fmt = get_format(fmt)
    width = next(w for w in (8, 16, 32, 64) if fmt.bits <= w)
    return _arrays.dtype(f"uint{width}", torch)


def pack(work, fmt: Format, ops):
    """Codes (int64) of values that are already exact in `fmt`."""
    p = decompose(work, ops)
    M = fmt.man_bits
    sign_bit = _sign_bit(fmt)
    if p.is_nan.any():
        if not fmt.has_nan:
            raise ValueError(f"{fmt.name} has no NaN; the input holds NaN at index "
                             f"{first_index(p.is_nan)}")
    if not fmt.signed and (p.negative & ~p.is_zero).any():
        raise ValueError(f"{fmt.name} is unsigned; the input holds a negative value at index "
                         f"{first_index(p.negative & ~p.is_zero)}")
    subnormal = p.exponent < fmt.emin
    q = ops.where(subnormal, fmt.emin - M, p.exponent - M)
    n = p.sig >> ops.clip(q - p.lsb_exp, lo=0)
    field = ops.where(subnormal, 0, p.exponent + fmt.bias)
    if not fmt.zero:  # E8M0: the exponent field 0 is a normal binade
        field = p.exponent + fmt.bias
        n = ops.where(subnormal, 1 << M, n)
    magnitude = (field << M) | (n & ((1 << M) - 1))
    magnitude = ops.where(p.is_zero, 0, magnitude)
    top = (1 << fmt.exp_bits) - 1
    if fmt.infinities:
        magnitude = ops.where(p.is_inf, top << M, magnitude)
    negative = p.negative & (fmt.has_negative_zero | ~p.is_zero) if fmt.signed else p.negative & False
    codes = ops.where(negative, magnitude | sign_bit, magnitude)
    if fmt.has_nan:
        codes = ops.where(p.is_nan, _nan_code(fmt, p.negative, ops), codes)
    return codes


def _sign_bit(fmt: Format) -> int:
    """The sign bit as an int64 value (the top bit of a 64-bit code is int64's sign)."""
    bit = 1 << (fmt.exp_bits + fmt.man_bits)
    return bit - (1 << 64) if bit == 1 << 63 else bit


def _nan_code(fmt: Format, negative, ops):
    sign_bit = _sign_bit(fmt)
    if fmt.nan == "fnuz":
        return sign_bit
    if fmt.nan == "fn":
        positive = (1 << (fmt.exp_bits + fmt.man_bits)) - 1
    else:  # ieee quiet NaN
        positive = (((1 << fmt.exp_bits) - 1) << fmt.man_bits) | (1 << (fmt.man_bits - 1))
    if not fmt.signed:
        return positive
    return ops.where(negative, positive | sign_bit, positive)


def unpack(ints, fmt: Format, ops, out_fmt: Format):
    """Values of int64 codes, built from sign, exponent and mantissa fields."""
    M = fmt.man_bits
    man = ints & ((1 << M) - 1)
    field = (ints >> M) & ((1 << fmt.exp_bits) - 1)
    negative = ((ints >> (fmt.exp_bits + M)) & 1) == 1 if fmt.signed else ints < 0
    top = (1 << fmt.exp_bits) - 1
    normal = field >= fmt.min_exp_field
    n = ops.where(normal, man | (1 << M), man if fmt.subnormals else 0)
    q = ops.where(normal, field - fmt.bias - M, fmt.emin - M)
    width = 64 if out_fmt.name == "fp64" else 32
    like = _empty_float(ints, width, ops)
    with np.errstate(over="ignore"):  # the Inf/NaN codes' lanes overflow; they are replaced below
        magnitude = ops.to_float(n, like) * exact_pow2(q, like, ops, width)
    inf = float("inf")
    if fmt.nan == "ieee":
        special = field == top
        magnitude = ops.where(special & (man == 0), inf, magnitude)
        is_nan = special & (man != 0)
    elif fmt.nan == "fn":
        is_nan = (field == top) & (man == (1 << M) - 1)
    elif fmt.nan == "fnuz":
        is_nan = negative & (field == 0) & (man == 0)
    else:
        is_nan = negative & False
    # a zero keeps its sign only where the format has -0 (non-canonical zero codes)
    keeps_sign = negative if fmt.has_negative_zero else negative & (magnitude != 0)
    values = ops.where(keeps_sign, -magnitude, magnitude)
    return ops.where(is_nan, quiet_nan(negative, like, ops, width), values)


def _empty_float(ints, width, ops):
    return ops.zeros(ints.shape, "float64" if width == 64 else "float32")
