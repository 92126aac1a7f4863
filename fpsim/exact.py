"""The exact oracle: slow, obviously correct rounding on Python fractions.

This module is the reference the tests hold every fast path to. It stands on
`formats.py` alone (and the mode names of `modes.py`: what each mode does,
overflow included, is decided here from the definitions) and never calls the
engine it checks. Each function works
on one scalar at a time, straight from the definitions:

* the grid of a format near |x| has spacing 2^(max(E, emin) - man_bits),
  where E = floor(log2 |x|) (or min_normal below the normal range when the
  format has no subnormals);
* the two grid neighbours of |x| are found with integer floor division;
* the rounding mode picks one; overflow is decided on the result computed
  with an unbounded exponent range, as IEEE 754 does.

Results are Python floats (every value of every format is exact in binary64),
so signed zeros, infinities and NaN come out as themselves.
"""

from __future__ import annotations

import math
from fractions import Fraction

from .formats import Format, format as get_format
from .modes import ROUNDING_MODES, check_rounding  # names only: no engine behind them

__all__ = ["ROUNDING_MODES", "check_rounding", "round_value", "stochastic_neighbours", "decode_code",
           "encode_value", "all_values", "neighbours", "quantum", "floor_log2"]

NAN = float("nan")
INF = float("inf")


def floor_log2(v: Fraction) -> int:
    """floor(log2(v)) for a positive fraction, exactly."""
    e = v.numerator.bit_length() - v.denominator.bit_length()
    # 2^e <= v < 2^(e+1) after at most one correction
    if v < Fraction(2) ** e:
        e -= 1
    return e


def quantum(fmt: Format, v: Fraction) -> Fraction:
    """Spacing of the format's grid at magnitude v > 0 (exponent range unbounded above)."""
    e = floor_log2(v)
    if e < fmt.emin and not fmt.subnormals:
        return Fraction(2) ** fmt.emin  # the grid below min_normal is {0, min_normal}
    return Fraction(2) ** (max(e, fmt.emin) - fmt.man_bits)


def neighbours(fmt: Format, v: Fraction) -> tuple[Fraction, Fraction]:
    """The grid points lo <= v <= hi around a magnitude v >= 0 (unbounded exponent range)."""
    if v == 0:
        return Fraction(0), Fraction(0)
    q = quantum(fmt, v)
    lo = (v // q) * q
    return lo, (lo if lo == v else lo + q)


def _overflow_value(fmt: Format, negative: bool, rounding: str, saturate: bool) -> float:
    biggest = float(fmt.max)
    if saturate:
        return -biggest if negative else biggest
    towards_infinity = {
        "nearest_even": True, "nearest_away": True, "stochastic": True,
        "toward_zero": False, "odd": False, "up": not negative, "down": negative,
    }[rounding]
    if towards_infinity:
        if fmt.infinities:
            return -INF if negative else INF
        if fmt.has_nan:
            return NAN
    return -biggest if negative else biggest


def _signed(fmt: Format, magnitude: Fraction, negative: bool) -> float:
    if magnitude == 0:
        return -0.0 if (negative and fmt.has_negative_zero) else 0.0
    return -float(magnitude) if negative else float(magnitude)


def round_value(
    x,
    fmt: "Format | str",
    rounding: str = "nearest_even",
    saturate: bool = False,
    *,
    flush_subnormal_inputs: bool = False,
    flush_subnormal_outputs: bool = False,
    random_fraction: Fraction | None = None,
    rand_bits: int | None = None,
) -> float:
    """Round one number exactly into `fmt`.

    `x` is an int, a Fraction or a float (its sign of zero, Inf and NaN count).
    For ``rounding="stochastic"`` give `random_fraction` u in [0, 1): the
    magnitude rounds away from zero when u < the fractional position of |x|
    between its neighbours. With `rand_bits` = r, that position is first
    truncated to r bits, which is how hardware with r random bits behaves
    (comparing u with it is comparing u's top r bits).
    """
    fmt = get_format(fmt)
    check_rounding(rounding)
    if isinstance(x, float):
        if math.isnan(x):
            return NAN
        negative = math.copysign(1.0, x) < 0
        if math.isinf(x):
            if not fmt.signed and negative:
                return NAN
            if fmt.infinities and not saturate:
                return x
            # Inf behaves as a value beyond every finite one
            return _overflow_value(fmt, negative, "nearest_even", saturate)
        v = Fraction(x)
    else:
        v = Fraction(x)
        negative = v < 0
    v = abs(v)
    if flush_subnormal_inputs and fmt.zero and v < fmt.min_normal:
        v = Fraction(0)  # flushed first: a tiny negative input is -0, which any format with a zero takes
    if negative and not fmt.signed and (v != 0 or not fmt.zero):
        return NAN
    if v == 0 and not fmt.zero:
        return NAN
    lo, hi = neighbours(fmt, v)
    if lo == hi:
        chosen = lo
    else:
        q = hi - lo
        frac = (v - lo) / q
        lo_is_even = (lo / q) % 2 == 0
        if rounding == "nearest_even":
            chosen = lo if frac < Fraction(1, 2) or (frac == Fraction(1, 2) and lo_is_even) else hi
        elif rounding == "nearest_away":
            chosen = lo if frac < Fraction(1, 2) else hi
        elif rounding == "toward_zero":
            chosen = lo
        elif rounding == "up":
            chosen = lo if negative else hi
        elif rounding == "down":
            chosen = hi if negative else lo
        elif rounding == "odd":
            chosen = hi if lo_is_even else lo
        else:  # stochastic
            if random_fraction is None:
                raise ValueError("stochastic rounding needs random_fraction")
            position = frac
            if rand_bits is not None:
                position = Fraction(math.floor(frac * 2**rand_bits), 2**rand_bits)
            chosen = hi if random_fraction < position else lo
    if chosen > fmt.max:
        return _overflow_value(fmt, negative, rounding, saturate)
    if chosen == 0 and not fmt.zero:
        chosen = fmt.min_subnormal  # no zero to round to: the smallest value is the nearest
    if flush_subnormal_outputs and 0 < chosen < fmt.min_normal:
        chosen = Fraction(0)
    return _signed(fmt, chosen, negative)


def stochastic_neighbours(x, fmt: "Format | str") -> tuple[float, float, Fraction]:
    """(toward-zero result, away-from-zero result, probability of the second) for exact SR."""
    fmt = get_format(fmt)
    low = round_value(x, fmt, "stochastic", random_fraction=Fraction(1) - Fraction(1, 2**200))
    high = round_value(x, fmt, "stochastic", random_fraction=Fraction(0))
    v = abs(Fraction(x))
    lo, hi = neighbours(fmt, v)
    p = Fraction(0) if lo == hi else (v - lo) / (hi - lo)
    return low, high, p


# ------------------------------------------------------------------- codes
def decode_code(code: int, fmt: "Format | str") -> float:
    """The value of one bit pattern, from the format's definition."""
    fmt = get_format(fmt)
    if not 0 <= code < (1 << fmt.bits):
        raise ValueError(f"code {code} is outside 0..{(1 << fmt.bits) - 1} for {fmt.name}")
    man = code & ((1 << fmt.man_bits) - 1)
    exp = (code >> fmt.man_bits) & ((1 << fmt.exp_bits) - 1)
    negative = fmt.signed and bool(code >> (fmt.exp_bits + fmt.man_bits))
    top = (1 << fmt.exp_bits) - 1
    signed_nan = -NAN if negative else NAN  # a NaN code's sign bit is its sign (the fnuz NaN is negative)
    if fmt.nan == "ieee" and exp == top:
        return signed_nan if man else (-INF if negative else INF)
    if fmt.nan == "fn" and exp == top and man == (1 << fmt.man_bits) - 1:
        return signed_nan
    if fmt.nan == "fnuz" and negative and exp == 0 and man == 0:
        return signed_nan
    if exp == 0 and fmt.zero:
        if not fmt.subnormals:
            man = 0  # exponent field 0 holds only zero when subnormals are off
        magnitude = Fraction(man) * Fraction(2) ** (fmt.emin - fmt.man_bits)
    else:
        magnitude = Fraction((1 << fmt.man_bits) | man) * Fraction(2) ** (exp - fmt.bias - fmt.man_bits)
    return _signed(fmt, magnitude, negative)  # a zero keeps its sign only where the format has -0


def encode_value(value: float, fmt: "Format | str") -> int:
    """The canonical bit pattern of a value of the format (NaN: the format's canonical NaN,
    with the value's sign where the format's NaN has one)."""
    fmt = get_format(fmt)
    sign_shift = fmt.exp_bits + fmt.man_bits
    if math.isnan(value):
        if not fmt.has_nan:
            raise ValueError(f"{fmt.name} has no NaN")
        top = (1 << fmt.exp_bits) - 1
        if fmt.nan == "fnuz":
            return 1 << sign_shift
        sign = (1 << sign_shift) if fmt.signed and math.copysign(1.0, value) < 0 else 0
        if fmt.nan == "fn":
            return sign | ((1 << sign_shift) - 1)
        return sign | (top << fmt.man_bits) | (1 << (fmt.man_bits - 1))  # IEEE quiet NaN
    negative = math.copysign(1.0, value) < 0
    if negative and not fmt.signed:
        raise ValueError(f"{value!r} is negative; {fmt.name} is unsigned")
    sign = (1 << sign_shift) if negative and fmt.signed else 0
    if math.isinf(value):
        if not fmt.infinities:
            raise ValueError(f"{fmt.name} has no infinities")
        return sign | (((1 << fmt.exp_bits) - 1) << fmt.man_bits)
    v = abs(Fraction(value))
    if v == 0:
        if not fmt.zero:
            raise ValueError(f"{fmt.name} has no zero")
        if negative and not fmt.has_negative_zero:
            raise ValueError(f"{fmt.name} has no negative zero")
        return sign
    if v > fmt.max or v < fmt.min_subnormal or neighbours(fmt, v)[0] != v:
        raise ValueError(f"{value!r} is not a value of {fmt.name}")
    e = floor_log2(v)
    if e < fmt.emin:  # subnormal
        return sign | int(v / Fraction(2) ** (fmt.emin - fmt.man_bits))
    significand = int(v / Fraction(2) ** (e - fmt.man_bits))
    return sign | ((e + fmt.bias) << fmt.man_bits) | (significand - (1 << fmt.man_bits))


def all_values(fmt: "Format | str") -> list[float]:
    """Every distinct finite value of a format of at most 16 bits, ascending (zero once)."""
    fmt = get_format(fmt)
    if fmt.bits > 16:
        raise ValueError(f"{fmt.name} has {fmt.bits} bits; all_values enumerates at most 16")
    values = {decode_code(c, fmt) for c in range(1 << fmt.bits)}
    return sorted(v for v in values if math.isfinite(v))
