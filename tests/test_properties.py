"""Properties that must hold for every format and rounding mode, checked with fpsim's own strategies.

Each test states one property; fpsim.strategies finds the inputs (ties, the
overflow edge, subnormals, random custom formats) and fpsim.testing reports
failures bit by bit. Expected values never come from the code under test
except where the property relates two of its answers (monotonicity,
symmetry, idempotence, bracketing). Exact sums and neighbours come from
Fractions (fpsim.exact).

Runtime: moderate max_examples and no deadline keep the module near 10 s (two cores);
FPSIM_PROPERTY_EXAMPLES=2000 searches deeper.
"""

from __future__ import annotations

import math
import os
import warnings
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import fpsim
import fpsim.strategies as fps
from fpsim import decode, encode, exact, quantize
from fpsim.testing import assert_bitwise_equal, assert_within_ulps
from fpsim.tensorcore import devices

# FPSIM_PROPERTY_EXAMPLES=2000 makes a deep search (minutes); CI runs the default.
EXAMPLES = int(os.environ.get("FPSIM_PROPERTY_EXAMPLES", "60"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SYMMETRIC = ["nearest_even", "nearest_away", "toward_zero", "odd"]
DETERMINISTIC = SYMMETRIC + ["up", "down"]
NEAREST = ["nearest_even", "nearest_away"]
DTYPES = st.sampled_from([np.float32, np.float64])
SIZES = st.integers(1, 24)


@st.composite
def formats_and_inputs(draw, formats=fps.formats(), allow_nan=None):
    """A format and a float32/float64 array of inputs where rounding into it is delicate."""
    fmt = draw(formats)
    dtype = draw(DTYPES)
    x = draw(fps.arrays(fmt, SIZES, dtype=dtype, elements=fps.rounding_inputs(fmt, dtype, allow_nan=allow_nan)))
    return fmt, x


def as64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def in_range(fmt, x) -> np.ndarray:
    """Inputs inside the format's finite range that it can represent the sign of: no overflow, no NaN."""
    mag = np.abs(as64(x))
    ok = np.isfinite(mag) & (mag <= float(fmt.max))
    if not fmt.signed:
        ok &= ~np.signbit(x) | (mag == 0)
    if not fmt.zero:  # below the smallest value, every mode gives that value (there is no zero)
        ok &= mag >= float(fmt.min_subnormal)
    return ok


# ------------------------------------------------------ non-canonical codes
def fnuz_negative_noncanonical_codes(fmt, c) -> np.ndarray:
    """Codes with the sign bit and exponent field 0 of a fnuz format without subnormals: non-canonical
    spellings of +0 (the format has no -0), which re-encode to the zero code, not to themselves
    (test_noncanonical_negative_codes_of_fnuz_decode_to_a_value checks what they decode to)."""
    if fmt.nan != "fnuz" or fmt.subnormals or fmt.man_bits == 0:
        return np.zeros(np.shape(c), dtype=bool)
    c = np.asarray(c, dtype=np.uint64)
    sign = np.uint64(1 << (fmt.bits - 1))
    return ((c & sign) != 0) & ((c >> np.uint64(fmt.man_bits)) & np.uint64((1 << fmt.exp_bits) - 1) == 0) & (
        (c & np.uint64((1 << fmt.man_bits) - 1)) != 0)


# --------------------------------------------------------------- rounding
@SETTINGS
@given(formats_and_inputs(allow_nan=False), st.sampled_from(DETERMINISTIC), st.booleans())
def test_rounding_is_monotonic(case, rounding, saturate):
    """x <= y implies q(x) <= q(y), wherever both results are numbers (not NaN)."""
    fmt, x = case
    x = np.sort(x)
    y = as64(quantize(x, fmt, rounding, saturate))
    number = ~np.isnan(y)
    xs, ys = x[number], y[number]
    with np.errstate(invalid="ignore"):  # inf - inf
        drops = np.nonzero(np.diff(ys) < 0)[0]
    if drops.size:
        i = drops[0]
        raise AssertionError(f"{fmt} {rounding} saturate={saturate}: not monotonic: "
                             f"{xs[i]!r} -> {ys[i]!r} but {xs[i + 1]!r} -> {ys[i + 1]!r}")


@SETTINGS
@given(formats_and_inputs(), st.sampled_from(fpsim.ROUNDING_MODES), st.booleans(), st.integers(0, 2**32 - 1))
def test_rounding_is_idempotent(case, rounding, saturate, seed):
    """q(q(x)) == q(x) bit for bit (NaN included), and every result is a value of the format."""
    fmt, x = case
    y = quantize(x, fmt, rounding, saturate, seed=seed if rounding == "stochastic" else None)
    again = quantize(y, fmt, rounding, saturate, seed=seed + 1 if rounding == "stochastic" else None)
    assert_bitwise_equal(again, y, fmt, check_nan_sign=True, err_msg=f"{fmt} {rounding} saturate={saturate}")


SIGNED_FORMATS = fps.formats(allow_unsigned=False).filter(lambda f: f.signed)


@SETTINGS
@given(formats_and_inputs(SIGNED_FORMATS), st.sampled_from(SYMMETRIC + ["up", "down"]), st.booleans())
def test_rounding_is_sign_symmetric(case, rounding, saturate):
    """q(-x) == -q(x) for the symmetric modes; up(-x) == -down(x) and down(-x) == -up(x).

    Where the format has no -0 (fnuz), -q(x) = -0 stands for +0; NaN signs are
    not compared (a fnuz NaN reads negative whatever the input's sign).
    """
    fmt, x = case
    mirror = {"up": "down", "down": "up"}.get(rounding, rounding)
    lhs = quantize(-x, fmt, rounding, saturate)
    rhs = -quantize(x, fmt, mirror, saturate)
    if not fmt.has_negative_zero:
        rhs = rhs + 0.0
    assert_bitwise_equal(lhs, rhs, fmt, err_msg=f"{fmt} {rounding}(-x) vs -{mirror}(x), saturate={saturate}")


@SETTINGS
@given(formats_and_inputs(allow_nan=False), st.booleans())
def test_directed_modes_bracket_the_input(case, saturate):
    """down(x) <= x <= up(x) and |toward_zero(x)| <= |x| for x in the format's range."""
    fmt, x = case
    x = x[in_range(fmt, x)]
    exact_x = as64(x)
    down = as64(quantize(x, fmt, "down", saturate))
    up = as64(quantize(x, fmt, "up", saturate))
    toward = as64(quantize(x, fmt, "toward_zero", saturate))
    for name, ok in (("down(x) <= x", down <= exact_x), ("x <= up(x)", exact_x <= up),
                     ("|toward_zero(x)| <= |x|", np.abs(toward) <= np.abs(exact_x))):
        if not ok.all():
            i = int(np.argmin(ok))
            raise AssertionError(f"{fmt}: {name} fails for x = {x[i]!r}: down {down[i]!r}, up {up[i]!r}, "
                                 f"toward_zero {toward[i]!r}")


@SETTINGS
@given(formats_and_inputs(allow_nan=False), st.sampled_from(DETERMINISTIC))
def test_rounding_error_is_at_most_half_an_ulp_for_nearest_modes(case, rounding):
    """|q(x) - x| <= ulp(x)/2 for the nearest modes and < ulp(x) for the others, for x in range."""
    fmt, x = case
    x = x[in_range(fmt, x)]
    y = quantize(x, fmt, rounding)
    assert_within_ulps(y, x, fmt, 0.5 if rounding in NEAREST else 1, err_msg=f"{fmt} {rounding}")


# ------------------------------------------------------------------ codec
@SETTINGS
@given(fps.formats(), st.data())
def test_decode_inverts_encode(fmt, data):
    """decode(encode(v)) == v for every value of the format (signed zeros, Inf and NaN signs included),
    from float32 (the compiled path) and float64 inputs alike."""
    v = data.draw(fps.arrays(fmt, SIZES))
    codes = encode(v, fmt)
    assert_bitwise_equal(decode(codes, fmt), v, fmt, check_nan_sign=True)
    assert_bitwise_equal(encode(v.astype(np.float64), fmt), codes, fmt, check_nan_sign=True)


@SETTINGS
@given(fps.formats(), st.data())
def test_encode_inverts_decode(fmt, data):
    """encode(decode(c)) == c for every canonical code; a NaN code comes back as a NaN of the same sign,
    a non-canonical zero (exponent field 0 without subnormals) as the zero of its sign."""
    c = np.array(data.draw(st.lists(fps.codes(fmt), min_size=1, max_size=24)), dtype=np.uint64)
    c = c[~fnuz_negative_noncanonical_codes(fmt, c)]
    v = decode(c, fmt)
    again = encode(v, fmt)
    assert_bitwise_equal(decode(again, fmt), v, fmt, check_nan_sign=True)
    canonical = ~np.isnan(as64(v)) & ~((as64(v) == 0) & ((c & np.uint64((1 << fmt.man_bits) - 1)) != 0))
    assert_bitwise_equal(again[canonical], c[canonical], fmt)


# ------------------------------------------------------------ stochastic
@SETTINGS
@given(formats_and_inputs(), st.booleans(), st.integers(0, 2**32 - 1))
def test_stochastic_rounding_returns_a_neighbour(case, saturate, seed):
    """Every stochastic result is down(x) or up(x) (so a value of the format next to x)."""
    fmt, x = case
    y = as64(quantize(x, fmt, "stochastic", saturate, seed=seed))
    down = as64(quantize(x, fmt, "down", saturate))
    up = as64(quantize(x, fmt, "up", saturate))
    same_bits = lambda a, b: (a == b) & (np.signbit(a) == np.signbit(b)) | (np.isnan(a) & np.isnan(b))  # noqa: E731
    ok = same_bits(y, down) | same_bits(y, up)
    if not ok.all():
        i = int(np.argmin(ok))
        raise AssertionError(f"{fmt} saturate={saturate}: stochastic({x[i]!r}) = {y[i]!r}, "
                             f"neither down {down[i]!r} nor up {up[i]!r}")


SR_SAMPLES = 20000
SR_ALPHA = 1e-9
"""Chance that one unbiasedness check fails although the rounding is unbiased. The Bernstein bound
used below holds for every p, so with at most 60 checks a run fails by chance with probability
below 6e-8."""


def bernstein_limit(n: int, p: float, alpha: float) -> float:
    """s with P(|Binomial(n, p) - n p| >= s) <= alpha (Bernstein's inequality)."""
    L = math.log(2 / alpha)
    variance = n * p * (1 - p)
    return L / 3 + math.sqrt((L / 3) ** 2 + 2 * variance * L)


@SETTINGS
@given(fps.formats().filter(lambda f: f.zero), DTYPES, st.data(), st.integers(0, 2**32 - 1))
def test_stochastic_rounding_is_unbiased(fmt, dtype, data, seed):
    """E[stochastic(x)] = x: x rounds away from zero with probability p = (|x| - lo) / (hi - lo).

    Statistical: the count of results equal to hi among SR_SAMPLES draws must be within
    Bernstein's bound of n p at level SR_ALPHA (false-failure rate below 1e-9 per example)."""
    x = data.draw(fps.rounding_inputs(fmt, dtype, allow_nan=False, allow_infinity=False))
    assume(in_range(fmt, np.array([x]))[0])
    lo, hi = exact.neighbours(fmt, abs(Fraction(float(x))))
    assume(hi <= fmt.max)
    sign = -1.0 if np.signbit(x) else 1.0
    y = as64(quantize(np.full(SR_SAMPLES, x, dtype=dtype), fmt, "stochastic", seed=seed)) * sign
    if lo == hi:
        assert (y == float(lo)).all(), f"{x!r} is a value of {fmt}, stochastic rounding changed it"
        return
    assert np.isin(y, [float(lo), float(hi)]).all(), f"{x!r}: results outside {{{float(lo)}, {float(hi)}}}"
    p = float((abs(Fraction(float(x))) - lo) / (hi - lo))
    ups = int((y == float(hi)).sum())
    limit = bernstein_limit(SR_SAMPLES, p, SR_ALPHA)
    assert abs(ups - SR_SAMPLES * p) <= limit, (
        f"{fmt}: stochastic({x!r}) rounded up {ups} of {SR_SAMPLES} times; expected {SR_SAMPLES * p:.1f} "
        f"+- {limit:.1f} (p = {p:.6g}, lo = {float(lo)!r}, hi = {float(hi)!r})")


# ------------------------------------------------------------ tensor core
TC_CONFIGS = sorted(k for k in devices.PARAMETERS if not devices.is_block(k[1]))  # (generation, inputs, output, path)
# (block-scaled MMAs take scales: tests/tensorcore/test_block_scaled.py has their exact-fit problems)


@st.composite
def exact_fit_dot_problems(draw):
    """A tensor-core configuration and a dot problem whose exact result fits every window.

    Every a (and b) is (2^j + r) * 2^(e - j) with e in [ea, ea + s]: a normal value with j
    fraction bits. Every product and c are then multiples of 2^(ea + eb - 2j), and any sum of
    them is below 2^T, T = ea + eb + 2s + 2 + ceil(log2(K + 1)). When
    T - (ea + eb - 2j) <= the window's bits (23 + extra_bits) and the output's precision, no
    bit is shifted out when the terms are aligned and no partial sum needs rounding, in any
    block order, so the model must return the exact sum.
    """
    gen, inputs, output, path = draw(st.sampled_from(TC_CONFIGS))
    tc = fpsim.TensorCore(gen, inputs, output, path=path)
    params = tc.params
    fin, fout = tc.inputs, params.output_format
    budget = min(params.window_bits, fout.man_bits + 1)
    spread = draw(st.integers(0, 2))
    k_bits = draw(st.integers(0, min(7, budget - 2 - 2 * spread)))  # ceil(log2(K + 1)) <= k_bits
    assume(k_bits >= 1)
    K = draw(st.integers(1, 2 ** k_bits - 1))
    j = draw(st.integers(0, min(fin.man_bits, (budget - 2 - 2 * spread - k_bits) // 2)))
    bottom = max(fout.emin, params.min_align_exp - params.window_bits)  # lowest bit: 2^(ea + eb - 2j)
    e_lo, e_hi = fin.emin, fin.emax - spread
    ea = draw(st.integers(e_lo, e_hi))
    eb_lo = max(e_lo, bottom + 2 * j - ea)
    eb_hi = min(e_hi, fout.emax - 2 * spread - 2 - k_bits - ea)
    assume(eb_lo <= eb_hi)
    eb = draw(st.integers(eb_lo, eb_hi))

    def element(base):
        e = draw(st.integers(base, base + spread))
        r = draw(st.integers(0, 2 ** j - 1))
        zero = draw(st.integers(0, 7)) == 0
        negative = draw(st.booleans())
        value = 0.0 if zero else math.ldexp(2 ** j + r, e - j)
        assume(value <= fin.max)  # the top binade of E4M3FN ends at 448, its all-ones code is NaN
        return -value if negative and value else value

    a = np.array([element(ea) for _ in range(K)])
    b = np.array([element(eb) for _ in range(K)])
    unit = math.ldexp(1.0, ea + eb - 2 * j)
    c_units = draw(st.integers(-(2 ** (2 * j + 2 + 2 * spread)), 2 ** (2 * j + 2 + 2 * spread)))
    c = np.array(c_units * unit)
    return tc, a, b, c


@settings(max_examples=max(150, EXAMPLES), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(exact_fit_dot_problems())
def test_block_fma_is_exact_when_no_bit_is_shifted_out(problem):
    """TensorCore.dot equals the exact sum whenever the exact sum (and every partial sum) fits the
    alignment window and the output format: truncation and rounding have nothing to remove."""
    tc, a, b, c = problem
    total = sum((Fraction(float(x)) * Fraction(float(y)) for x, y in zip(a, b)), Fraction(float(c)))
    desired = float(total) + 0.0  # an exact zero sum is +0 (round to nearest: x + (-x) = +0)
    assert_bitwise_equal(tc.dot(a, b, c), desired, tc.output,
                         err_msg=f"{tc!r}\na = {a.tolist()}\nb = {b.tolist()}\nc = {float(c)!r}")


@pytest.mark.parametrize("config", TC_CONFIGS, ids=lambda t: "-".join(t))
def test_exact_fit_problems_reach_every_configuration(config):
    """The property above is not vacuous: a hand-made exact-fit problem for each configuration."""
    gen, inputs, output, path = config
    tc = fpsim.TensorCore(gen, inputs, output, path=path)
    a = np.resize(np.array([1.5, -1.0, 0.5, 1.0]), 40)
    b = np.resize(np.array([1.0, 0.75, -1.5, 1.25]), 40)
    c = np.array(2.0)
    total = sum((Fraction(float(x)) * Fraction(float(y)) for x, y in zip(a, b)), Fraction(2))
    assert_bitwise_equal(tc.dot(a, b, c), float(total), tc.output)


# ------------------------------------------------ bugs found here (fixed)
def test_noncanonical_negative_codes_of_fnuz_decode_to_a_value():
    fmt = fpsim.Format(4, 3, bias=8, nan="fnuz", subnormals=False)
    codes = np.array([0x81, 0x87], dtype=np.uint8)
    assert not np.signbit(exact.decode_code(0x81, fmt))
    assert_bitwise_equal(decode(codes, fmt), np.zeros(2), fmt)  # the format's only zero, +0


def test_decode_of_bf16_special_codes_emits_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        values = decode(np.array([0x7F80, 0xFF80, 0x7FC0], dtype=np.uint16), "bf16")
    assert_bitwise_equal(values, np.array([np.inf, -np.inf, np.nan]), "bf16")
