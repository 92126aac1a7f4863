"""The rounding engine: decompose -> round the significand -> finish, on numpy arrays and torch tensors.

Every float input is taken apart into sign, integral significand and the
exponent of its last bit, exactly (float32 and float64 bits, never through a
narrower type). Rounding to a format then means dropping `d` low bits of the
significand, where `d` follows from the format's grid spacing at that
magnitude (fixed in the normal range, growing in the subnormal range). The
rounding mode decides, from the dropped bits, whether the kept part goes up
by one. Overflow is judged on that result, as IEEE 754 does with an
unbounded exponent.

The same code runs on numpy arrays and torch tensors (see `_arrays.Ops`). It
sits below everything that dispatches to it: `rounding.quantize` (which
tries the compiled kernel first), `_compiled` (the engine traced by
torch.compile) and `_native`, which takes the kernel's edge answers from it.
"""

from __future__ import annotations

from typing import NamedTuple

from .formats import PRESETS, Format
from .modes import mode as get_mode

# the working containers, from their formats: (mantissa bits, exponent bias, magnitude mask) by width
_LAYOUT = {fmt.bits: (fmt.man_bits, fmt.bias, (1 << (fmt.bits - 1)) - 1) for fmt in (PRESETS["fp32"], PRESETS["fp64"])}


class Parts(NamedTuple):
    """A float array taken apart exactly: |w| = sig * 2^lsb_exp, 2^exponent <= |w| < 2^(exponent+1)."""

    width: int
    P: int
    negative: object
    is_nan: object
    is_inf: object
    is_zero: object
    sig: object
    lsb_exp: object
    exponent: object


def decompose(w, ops) -> Parts:
    """Split float32/float64 values into sign, integral significand and exponents (int64 arrays)."""
    width = 64 if str(w.dtype).endswith("float64") else 32
    P, bias_in, mag_mask = _LAYOUT[width]
    u = ops.float_bits(w)
    a = u & mag_mask
    inf_bits = ((1 << (width - 1 - P)) - 1) << P
    is_nan = a > inf_bits
    is_inf = a == inf_bits
    e_field = a >> P
    sig = (a & ((1 << P) - 1)) | ops.where(e_field > 0, 1 << P, 0)
    lsb_exp = ops.clip(e_field, lo=1) - (bias_in + P)
    is_zero = sig == 0
    special = is_nan | is_inf
    # floor(log2|w|): the biased field for normal numbers; for subnormals, the bit length of the
    # significand, read from the exponent of its (exact) float64 value: integer work only
    P64, bias64, _ = _LAYOUT[64]
    sig_log2 = (ops.float_bits(ops.astype(sig, "float64")) >> P64) - bias64
    exponent = ops.where(is_zero | special, 0, ops.where(e_field > 0, e_field - bias_in, sig_log2 + lsb_exp))
    return Parts(width, P, u < 0, is_nan, is_inf, is_zero, sig, lsb_exp, exponent)


def round_bits(w, fmt: Format, ops, *, rounding, saturate, rand_bits=None, flush_inputs=False,
               flush_outputs=False, stream=None):
    """The engine: round float32/float64 array `w` to `fmt`; returns an array of w's dtype.

    `stream` (stochastic only) gives the words of each element's uniform U
    (a `philox.Stream`; tests pass their own words to hold single draws to
    the exact oracle).
    """
    with ops.quiet_float_errors():  # Inf/NaN lanes are replaced below
        return _round_bits(w, fmt, ops, rounding, saturate, rand_bits, flush_inputs, flush_outputs, stream)


def _round_bits(w, fmt, ops, rounding, saturate, rand_bits, flush_inputs, flush_outputs, stream):
    parts = decompose(w, ops)
    width, P, M = parts.width, parts.P, fmt.man_bits
    negative, is_nan, is_inf, is_zero = parts.negative, parts.is_nan, parts.is_inf, parts.is_zero
    sig, lsb_exp, exponent = parts.sig, parts.lsb_exp, parts.exponent

    if flush_inputs and fmt.zero:
        tiny = (exponent < fmt.emin) & ~is_nan & ~is_inf
        sig = ops.where(tiny, 0, sig)
        is_zero = is_zero | tiny

    # grid spacing 2^q at this magnitude; d low bits of sig fall below it
    if fmt.subnormals:
        q = ops.clip(exponent, lo=fmt.emin) - M
    else:
        q = ops.where(exponent < fmt.emin, fmt.emin, exponent - M)
    drop_all = q - lsb_exp  # bits below the grid spacing (can exceed the significand)
    d = ops.clip(drop_all, lo=0, hi=P + 3)
    keep = sig >> d
    dropped = sig - (keep << d)
    half = ops.shift_left(1, d) >> 1
    inexact = dropped != 0

    if rounding == "nearest_even":
        up = (dropped > half) | ((dropped == half) & inexact & ((keep & 1) == 1))
    elif rounding == "nearest_away":
        up = (dropped >= half) & inexact
    elif rounding == "toward_zero" or rounding == "odd":
        up = None
    elif rounding == "up":
        up = inexact & ~negative
    elif rounding == "down":
        up = inexact & negative
    else:  # stochastic: up when U < the dropped fraction of the spacing, dropped / 2^drop_all exactly
        # (drop_all is the true count: a value far below the spacing has a tiny fraction)
        up = _stochastic_up(dropped, drop_all, rand_bits, stream, ops)
    if rounding == "odd":
        n = keep | ops.astype(inexact, "int64")
    elif up is None:
        n = keep
    else:
        n = keep + ops.astype(up, "int64")

    # value = n * 2^q, exact in the working dtype (or Inf beyond it); overflow is value > max
    magnitude = ops.to_float(n, w) * exact_pow2(q, w, ops, width)
    overflow = magnitude > float(fmt.max)

    if not fmt.zero:
        magnitude = ops.where(n == 0, float(fmt.min_subnormal), magnitude)
    if flush_outputs and fmt.zero:
        magnitude = ops.where(magnitude < float(fmt.min_normal), 0.0, magnitude)
    big = float(fmt.max)
    overflow_to_inf = _overflow_goes_to_infinity(rounding, negative, ops, saturate)
    special_overflow = float("inf") if fmt.infinities else (float("nan") if fmt.has_nan else big)
    over_value = ops.where(overflow_to_inf, ops.constant(special_overflow, w), ops.constant(big, w))
    magnitude = ops.where(overflow, over_value, magnitude)
    if fmt.infinities and not saturate:
        magnitude = ops.where(is_inf, float("inf"), magnitude)
    else:
        magnitude = ops.where(is_inf, big if (saturate or not fmt.has_nan) else float("nan"), magnitude)

    keeps_sign = negative if fmt.has_negative_zero else (negative & (magnitude != 0))
    result = ops.where(keeps_sign, -magnitude, magnitude)
    invalid = is_nan
    if not fmt.signed:
        invalid = invalid | (negative & ~(is_zero & fmt.zero))
    if not fmt.zero:
        invalid = invalid | is_zero
    # Every NaN, whether from the input or from overflow, gets the canonical bits by
    # construction: negating a NaN does not flip its sign on every device. NaN is found in the
    # bits: compiled code (torch.compile) may assume that x != x never holds.
    P, _, magnitude_mask = _LAYOUT[width]
    invalid = invalid | ((ops.float_bits(result) & magnitude_mask) > ((magnitude_mask >> P) << P))
    return ops.where(invalid, _nan_like(fmt, negative, w, ops, width), result)


def _stochastic_up(dropped, count, rand_bits, stream, ops):
    """Whether U_i < f_i = dropped / 2^count for each element (0 <= dropped < 2^min(count, 62)), with f
    truncated to rand_bits bits when given. U_i's words come from `stream` (see philox.py): the first
    for every element, further ones only where U's first words equal f's leading bits."""
    if stream is None:
        raise ValueError("stochastic rounding needs a stream of random words")
    shape = tuple(dropped.shape)
    dropped, count = dropped.reshape(-1), count.reshape(-1)
    n = dropped.shape[0]
    first = stream.leading_words(0, n, ops)
    if rand_bits is not None:  # U's top r bits against f truncated to r bits
        r = rand_bits
        truncated = ops.where(count >= r, dropped >> ops.clip(count - r, lo=0, hi=62),
                              dropped << ops.clip(r - count, lo=0, hi=62))
        draw = first >> (32 - r) if r <= 32 else (first << (r - 32)) | (stream.leading_words(1, n, ops) >> (64 - r))
        return (draw < truncated).reshape(shape)
    digit, more = _fraction_digit(dropped, count, 0, ops)
    up = first < digit
    tie = (first == digit) & more
    depth = 0
    while bool(tie.any()):  # probability 2^-32 per element and word
        depth += 1
        index = ops.flat_nonzero(tie)
        word = stream.words(depth, index, ops)
        digit, more = _fraction_digit(dropped[index], count[index], depth, ops)
        up[index] = word < digit
        tie = tie & False
        tie[index] = (word == digit) & more
    return up.reshape(shape)


def _fraction_digit(dropped, count, depth: int, ops):
    """Word `depth` of f = dropped / 2^count (its bits 32 depth + 1 .. 32 (depth + 1) after the point),
    and whether f has bits beyond it."""
    shift = 32 * (depth + 1) - count  # the word is floor(dropped * 2^shift) mod 2^32
    left = ops.clip(shift, lo=0, hi=32)
    right = ops.clip(-shift, lo=0, hi=62)
    low = dropped & ((ops.shift_left(1, ops.clip(32 - left, lo=0)) - 1))  # the bits that stay below 2^32
    digit = ops.where(shift >= 0, ops.where(shift >= 32, 0, low << left), (dropped >> right) & 0xFFFFFFFF)
    more = (shift < 0) & ((dropped & (ops.shift_left(1, right) - 1)) != 0)
    return digit, more


def _overflow_goes_to_infinity(rounding, negative, ops, saturate):
    """Whether an overflowing result becomes the special overflow value (else ±max), per element."""
    positive_goes, negative_goes = (False, False) if saturate else get_mode(rounding).to_infinity
    if positive_goes == negative_goes:
        return negative | True if positive_goes else negative & False
    return negative if negative_goes else ~negative


def exact_pow2(q, like, ops, width):
    """2^q as floats of like's dtype, built from bits (exact, subnormal powers included)."""
    P, bias, _ = _LAYOUT[width]
    lowest = 1 - bias - P
    q = ops.clip(q, lo=lowest, hi=bias)
    bits = ops.where(q >= 1 - bias, (q + bias) << P, ops.shift_left(1, ops.clip(q - lowest, lo=0, hi=P)))
    return ops.bits_float(bits, like)


def _nan_like(fmt: Format, negative, like, ops, width):
    """The canonical quiet NaN of the working dtype with the sign that decoding the format's NaN gives.

    Signed NaN codes keep the input's sign; the fnuz NaN is the negative-zero
    code, so it reads as negative; an unsigned format's NaN is positive.
    """
    if fmt.nan == "fnuz":
        negative = negative | True
    elif not fmt.signed:
        negative = negative & False
    return quiet_nan(negative, like, ops, width)


def quiet_nan(negative, like, ops, width):
    """The quiet NaN of the working dtype (float32 or float64, `width` bits), negative where `negative`."""
    P = _LAYOUT[width][0]
    quiet = (((1 << (width - 1 - P)) - 1) << P) | (1 << (P - 1))
    return ops.bits_float(ops.where(negative, -(1 << (width - 1)) | quiet, quiet), like)
