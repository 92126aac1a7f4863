"""Rounding a quotient x / d or a product x * m into a format from its exact value, fast.

Block formats divide by scales that are not always powers of two (an E4M3
block scale times an FP32 tensor scale, an FP32 scale), scaling recipes
multiply by FP32 scales, and the element must be the rounding of the exact
quotient or product, not of a floating-point approximation of it.
`round_quotient` and `round_product` get there with the compiled rounding
engine and an exact correction where it matters: the approximation is
monotone, so it can only be wrong where it lands exactly on a "decision
point" (a value of the format or a midpoint: a value of the format with one
more mantissa bit); there the exact side is decided and the approximation
moved one ulp towards it.
"""

from __future__ import annotations

import functools
from fractions import Fraction

import numpy as np

from .codec import encode as encode_values
from .formats import PRESETS, Format
from .rounding import quantize as quantize_values

__all__ = ["round_product", "round_quotient"]

_FP32 = PRESETS["fp32"]


def round_quotient(x, factors, fmt: Format, rounding: str = "nearest_even", *, saturate: bool = False,
                   codes: bool = False, powers_of_two: bool | None = None, seed=None, generator=None,
                   rand_bits=None):
    """x / (f1 * f2 * ...) rounded once, from its exact value, into `fmt`: values (or codes).

    x: float32 or float64 array. factors: positive finite divisors (arrays
    broadcasting against x, or numbers), each exactly a float32, whose
    product has at most 28 significant bits: an FP32 tensor scale times an
    E4M3 block scale, an FP32 scale, a power of two.

    The quotient is first computed in floating point, dividing by one factor
    after the other: every step is monotone and the later factors times a
    value of fmt with one more mantissa bit (a "decision point": a value of
    fmt or a midpoint) are exact, so the computed quotient never crosses a
    decision point. Where it lands exactly on one and the exact quotient is
    elsewhere, it is moved one ulp to the side of the exact quotient, which
    is decided exactly (q * product has at most 28 + man_bits + 2 <= 53
    bits). Stochastic rounding works on the float64 quotient: exact for
    power-of-two divisors, within 2^-53 of the exact probability otherwise.
    powers_of_two: whether every factor is a power of two (None: look); then
    x is multiplied by the exact reciprocal, and only an underflow to 0 can
    land on a decision point.
    """
    x = np.asarray(x)
    factors = [np.asarray(f, dtype=np.float64) for f in factors]
    product = functools.reduce(np.multiply, factors, np.float64(1.0))  # exact: <= 28 bits
    finish = encode_values if codes else quantize_values
    if fmt == _FP32 and rounding == "nearest_even" and x.dtype == np.float32 and _is_float32(product):
        # an IEEE division of float32 numbers is the correctly rounded quotient
        with np.errstate(over="ignore", under="ignore"):
            q = x / product.astype(np.float32)
        if saturate:
            q = np.clip(q, -float(_FP32.max), float(_FP32.max))
        return q.view(np.uint32) if codes else q
    if rounding == "stochastic":
        with np.errstate(under="ignore"):
            w = x.astype(np.float64) / product
        return finish(w, fmt, rounding, saturate, seed, generator=generator, rand_bits=rand_bits)
    finer = _finer(fmt)
    narrow = _FP32.contains(finer)
    pow2 = powers_of_two if powers_of_two is not None else all(not np.any(np.frexp(f)[0] != 0.5) for f in factors)
    with np.errstate(under="ignore", over="ignore", invalid="ignore", divide="ignore"):
        if narrow and x.dtype == np.float32 and pow2:
            q = x * (1.0 / product).astype(np.float32)  # 2^-k: exact in float32 for E8M0's range
        elif narrow and x.dtype == np.float32:
            q = x
            for f in factors:
                q = q / f.astype(np.float32)
        else:
            q = x.astype(np.float64) / product
            if narrow:
                q = q.astype(np.float32)
        if pow2 and x.dtype == np.float32:
            # exact unless the quotient leaves float32's normal range below (possible only for divisors
            # above 1), where only 0 and 2^-126 (float32's min normal) are near a decision point
            check = np.flatnonzero((q == 0) | (np.abs(q) == 2.0**-126)) if np.max(product, initial=0) > 1 else None
        else:
            check = _on_decision_points(q, finer)
    if check is not None and check.size:
        q = _nudge(q, check, x, product)  # q is a fresh array
    return finish(q, fmt, rounding, saturate)


def round_product(x, multiplier, fmt: Format, rounding: str = "nearest_even", *, saturate: bool = False,
                  seed=None, generator=None, rand_bits=None):
    """x * multiplier rounded once, from its exact value, into `fmt` (values as float32 or float64).

    multiplier: float32 numbers (an array broadcasting against x, or a
    number). The product is computed in floating point (monotone) and
    corrected where it lands on a decision point: exactly in float64 for
    float32-or-narrower x (24 + 24 bits), with fractions for float64 x.
    Stochastic rounding works on the float64 product (exact for float32 x).
    """
    x = np.asarray(x)
    m = np.asarray(multiplier, dtype=np.float64)
    if rounding == "stochastic":
        w = x.astype(np.float64) * m
        return quantize_values(w, fmt, rounding, saturate, seed, generator=generator, rand_bits=rand_bits)
    finer = _finer(fmt)
    narrow = _FP32.contains(finer)
    with np.errstate(under="ignore", over="ignore", invalid="ignore"):
        if narrow and x.dtype == np.float32:
            q = x * m.astype(np.float32)
        else:
            q = x.astype(np.float64) * m
            if narrow:
                q = q.astype(np.float32)
        check = _on_decision_points(q, finer)
    if check.size:
        where = np.unravel_index(check, q.shape)
        q_at = q[where]
        xs, ms = np.broadcast_to(x, q.shape)[where], np.broadcast_to(m, q.shape)[where]
        if x.dtype == np.float32:
            residual = xs.astype(np.float64) * ms - q_at.astype(np.float64)  # exact: 48-bit product
        else:
            exact_minus_q = (Fraction(float(a)) * Fraction(float(b)) - Fraction(float(c))
                             for a, b, c in zip(xs, ms, q_at))
            residual = np.array([(d > 0) - (d < 0) for d in exact_minus_q], dtype=np.float64)  # its sign
        direction = np.where(residual > 0, np.inf, -np.inf).astype(q.dtype)
        q[where] = np.where(residual != 0, np.nextafter(q_at, direction), q_at)
    return quantize_values(q, fmt, rounding, saturate)


def _finer(fmt: Format) -> Format:
    """fmt with one more mantissa bit: its values are fmt's values and midpoints (the decision points)."""
    return Format(fmt.exp_bits, fmt.man_bits + 1, fmt.bias, fmt.signed, fmt.infinities,
                  "none" if fmt.nan == "fn" else fmt.nan, fmt.subnormals, fmt.zero)


def _is_float32(values) -> bool:
    with np.errstate(over="ignore"):       # beyond FP32's range: not one
        return bool(np.all(values.astype(np.float32) == values))


def _on_decision_points(q, finer: Format):
    """Flat indices where q is a value of `finer` (a decision point of the target format). A NaN is none,
    and `finer`, which may have no NaN, does not see it."""
    nan = np.isnan(q)
    values = np.where(nan, 0, q) if nan.any() else q
    return np.flatnonzero(quantize_values(values, finer, "toward_zero", saturate=True) == q)


def _nudge(q, flat, x, product):
    """Move q (in place) one ulp toward the exact x / product at the flat indices `flat` where they differ."""
    where = np.unravel_index(flat, q.shape)  # indexes the broadcast views without expanding them
    q_at = q[where]
    residual = np.broadcast_to(x, q.shape)[where].astype(np.float64) - q_at.astype(np.float64) * np.broadcast_to(
        product, q.shape)[where]
    direction = np.where(residual > 0, np.inf, -np.inf).astype(q.dtype)
    q[where] = np.where(residual != 0, np.nextafter(q_at, direction), q_at)
    return q
