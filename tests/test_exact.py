"""The exact oracle (fpsim.exact) against sources that do not share its code.

Every other test holds the engine to this oracle, so the oracle itself is
checked here against: ml_dtypes / numpy decoding of every code, numpy's
correctly rounded float64->float32 and float64->float16 casts, Python's
correctly rounded int->float and Fraction->float, and a brute-force rounder
written below from the definitions (search the sorted list of values; no
exponent arithmetic).
"""

from __future__ import annotations

import bisect
import math
from fractions import Fraction
from functools import lru_cache

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fpsim import exact
from fpsim.formats import Format, format as get_format

from foundation_helpers import (BYTE_PRESETS, CUSTOM_FORMATS, SMALL_PRESETS, assert_same_bits, fmt_id, oracle_decoded,
                      oracle_finite_values, sweep_points)

DETERMINISTIC = ("nearest_even", "nearest_away", "toward_zero", "up", "down", "odd")
SMALL_FORMATS = [get_format(n) for n in BYTE_PRESETS] + [f for f in CUSTOM_FORMATS.values() if f.bits <= 8]


# ---------------------------------------------------------- decode_code
@pytest.mark.parametrize("name", [n for n in SMALL_PRESETS if get_format(n).ml_dtype is not None])
def test_decode_code_matches_ml_dtypes_on_every_code(name):
    fmt = get_format(name)
    codes = np.arange(1 << fmt.bits, dtype=np.uint8 if fmt.bits <= 8 else np.uint16)
    reference = codes.view(fmt.ml_dtype).astype(np.float64) if fmt.bits in (8, 16) else \
        _sub_byte_reference(codes, fmt)
    # the oracle's decode_code returns a plain (positive) NaN for every NaN code: sign not compared
    assert_same_bits(oracle_decoded(fmt), reference, inputs=codes, nan_sign=False)


def _sub_byte_reference(codes, fmt):
    """ml_dtypes float6/float4 values of codes: their uint8 storage holds the code in the low bits."""
    return codes.astype(np.uint8).view(fmt.ml_dtype).astype(np.float64)


def test_decode_code_fp16_matches_numpy_float16():
    codes = np.arange(1 << 16, dtype=np.uint16)
    assert_same_bits(oracle_decoded(get_format("fp16")), codes.view(np.float16).astype(np.float64),
                     nan_sign=False)


@pytest.mark.parametrize("name,width", [("fp32", 32), ("fp64", 64)])
def test_decode_code_matches_numpy_on_random_codes(name, width):
    rng = np.random.default_rng(1)
    codes = rng.integers(0, 2**width, size=3000, dtype=np.uint64).astype(f"uint{width}")
    special = np.array([0, 1 << (width - 1), 1, (1 << (width - 1)) - 1], dtype=f"uint{width}")
    codes = np.concatenate([codes, special])
    got = np.array([exact.decode_code(int(c), name) for c in codes], dtype=np.float64)
    assert_same_bits(got, codes.view(f"float{width}").astype(np.float64), nan_sign=False)


def test_decode_code_tf32_is_float32_with_13_low_bits_zero():
    rng = np.random.default_rng(2)
    codes = np.concatenate([rng.integers(0, 1 << 19, size=3000), [0, 1, 1 << 18, (1 << 19) - 1]])
    got = np.array([exact.decode_code(int(c), "tf32") for c in codes], dtype=np.float64)
    ref = (codes.astype(np.uint32) << np.uint32(13)).view(np.float32)
    with np.errstate(invalid="ignore"):
        ref = ref.astype(np.float64)
    assert_same_bits(got, ref, nan_sign=False)


def test_decode_code_rejects_codes_outside_the_format():
    with pytest.raises(ValueError, match="256"):
        exact.decode_code(256, "e4m3")
    with pytest.raises(ValueError):
        exact.decode_code(-1, "e4m3")
    with pytest.raises(ValueError, match="16"):
        exact.decode_code(16, "e2m1")


@pytest.mark.parametrize("fmt", [f for f in CUSTOM_FORMATS.values() if not f.subnormals and f.zero],
                         ids=fmt_id)
def test_non_canonical_codes_of_formats_without_subnormals_decode_to_zero(fmt):
    decoded = oracle_decoded(fmt)
    for man in range(1 << fmt.man_bits):
        assert decoded[man] == 0 and not np.signbit(decoded[man])
        if fmt.signed:
            neg = decoded[(1 << (fmt.exp_bits + fmt.man_bits)) | man]
            assert neg == 0 and (np.signbit(neg) or not fmt.has_negative_zero)


# ------------------------------------------------------------ all_values
# Distinct finite values by hand: codes minus Inf/NaN codes, with +-0 counted once.
ALL_VALUES_COUNT = {
    "e4m3": 256 - 2 - 1, "e5m2": 256 - 8 - 1, "e4m3fnuz": 256 - 1, "e5m2fnuz": 256 - 1,
    "e3m2": 64 - 1, "e2m3": 64 - 1, "e2m1": 16 - 1, "e8m0": 255,
    "fp16": 65536 - 2 * 1024 - 1, "bf16": 65536 - 2 * 128 - 1,
}


@pytest.mark.parametrize("name", list(ALL_VALUES_COUNT))
def test_all_values_count_and_order(name):
    values = exact.all_values(name)
    assert len(values) == ALL_VALUES_COUNT[name]
    assert all(a < b for a, b in zip(values, values[1:]))
    fmt = get_format(name)
    assert values[-1] == float(fmt.max)
    if fmt.signed:
        assert values[0] == -float(fmt.max)


def test_all_values_refuses_wide_formats():
    with pytest.raises(ValueError, match="16"):
        exact.all_values("fp32")


# ------------------------------------------------------------- encode_value
@pytest.mark.parametrize("fmt", [get_format(n) for n in BYTE_PRESETS] + list(CUSTOM_FORMATS.values())[:9],
                         ids=fmt_id)
def test_encode_value_inverts_decode_code(fmt):
    """Every code maps back to itself, except NaN codes (-> the canonical NaN of their sign) and the
    non-canonical exponent-0 codes of formats without subnormals (-> the zero of their sign)."""
    decoded = oracle_decoded(fmt)
    sign_bit = 1 << (fmt.exp_bits + fmt.man_bits) if fmt.signed else 0
    for code, value in enumerate(decoded):
        value = float(value)
        if math.isnan(value):
            if not fmt.has_nan:
                pytest.fail(f"{fmt.name} has no NaN but code {code:#x} decoded to NaN")
            negative = fmt.signed and fmt.nan != "fnuz" and bool(code & sign_bit)
            assert exact.encode_value(value, fmt) == _canonical_positive_nan(fmt) | (sign_bit if negative else 0)
            continue
        expected = code
        if value == 0:
            expected = (code & sign_bit) if fmt.has_negative_zero else 0
        assert exact.encode_value(value, fmt) == expected, f"code {code:#x} value {value!r}"


def _canonical_positive_nan(fmt: Format) -> int:
    if fmt.nan == "fnuz":
        return 1 << (fmt.exp_bits + fmt.man_bits)          # the negative-zero code
    if fmt.nan == "fn":
        return (1 << (fmt.exp_bits + fmt.man_bits)) - 1    # all ones
    return (((1 << fmt.exp_bits) - 1) << fmt.man_bits) | (1 << (fmt.man_bits - 1))  # quiet NaN


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_encode_value_matches_numpy_bits_on_random_codes(name):
    fmt = get_format(name)
    rng = np.random.default_rng(3)
    codes = rng.integers(0, 1 << 16, size=1500).astype(np.uint16)
    with np.errstate(invalid="ignore"):
        values = codes.view(fmt.ml_dtype).astype(np.float64)
    for code, value in zip(codes, values):
        if not np.isnan(value):
            assert exact.encode_value(float(value), fmt) == int(code)


@pytest.mark.parametrize("value,fmt,why", [
    (0.3, "e4m3", "not a value"), (float("inf"), "e4m3", "infinit"), (float("nan"), "e2m1", "NaN"),
    (-1.0, "e8m0", "unsigned"), (0.0, "e8m0", "zero"), (-0.0, "e4m3fnuz", "negative zero"),
    (500.0, "e4m3", "not a value"), (2.0**-10, "e4m3", "not a value"),
])
def test_encode_value_refuses_non_values(value, fmt, why):
    with pytest.raises(ValueError, match=why):
        exact.encode_value(value, fmt)


# --------------------------------------------------- brute-force reference
@lru_cache(maxsize=None)
def _brute_grid(fmt: Format):
    """[0, every positive value ascending, G] with G = max + spacing of max's binade; and max, G."""
    positives = [Fraction(v) for v in oracle_finite_values(fmt) if v > 0]
    top = positives[-1]
    top_spacing = Fraction(2) ** (math.frexp(float(top))[1] - 1 - fmt.man_bits)
    G = top + top_spacing
    return [Fraction(0)] + positives + [G], top, G


def brute_round(x: float, fmt: Format, rounding: str, saturate: bool = False, flush_in: bool = False,
                flush_out: bool = False, u: Fraction | None = None, rand_bits: int | None = None) -> float:
    """Round by searching the sorted list of the format's values, straight from the rules in the docs.

    Overflow follows IEEE 754: the result is computed as if the top binade's
    spacing continued, so the only grid point above max that matters is
    G = max + spacing(max); landing on it (or beyond) overflows.
    """
    if math.isnan(x):
        return math.nan
    neg = math.copysign(1.0, x) < 0
    grid, top, G = _brute_grid(fmt)
    positives = grid[1:-1]

    def overflow(toward_infinity: bool) -> float:
        if saturate or not toward_infinity:
            return -float(top) if neg else float(top)
        if fmt.infinities:
            return -math.inf if neg else math.inf
        if fmt.has_nan:
            return math.nan
        return -float(top) if neg else float(top)

    if math.isinf(x):
        if neg and not fmt.signed:
            return math.nan
        if fmt.infinities and not saturate:
            return x
        return overflow(True)
    a = abs(Fraction(x))
    if flush_in and fmt.zero and a < fmt.min_normal:
        a = Fraction(0)  # documented: flushed first, so a tiny negative is -0 (+0 when unsigned)
    if neg and not fmt.signed and (a != 0 or not fmt.zero):
        return math.nan
    if a == 0 and not fmt.zero:
        return math.nan
    away_direction = {"nearest_even": None, "nearest_away": None, "stochastic": None, "toward_zero": False,
                      "odd": False, "up": not neg, "down": neg}[rounding]
    if a >= G:
        chosen = None  # overflow
        to_inf = away_direction if away_direction is not None else True
        return overflow(to_inf)
    i = bisect.bisect_right(grid, a) - 1
    lo = grid[i]
    if lo == a:
        chosen = lo
    else:
        hi = grid[i + 1]
        q = hi - lo
        lo_even = (lo / q).denominator == 1 and (lo / q).numerator % 2 == 0
        if rounding == "nearest_even":
            chosen = lo if (a - lo < hi - a or (a - lo == hi - a and lo_even)) else hi
        elif rounding == "nearest_away":
            chosen = lo if a - lo < hi - a else hi
        elif rounding == "toward_zero":
            chosen = lo
        elif rounding in ("up", "down"):
            chosen = hi if away_direction else lo
        elif rounding == "odd":
            chosen = hi if lo_even else lo
        else:
            position = (a - lo) / q
            if rand_bits is not None:
                position = Fraction(math.floor(position * 2**rand_bits), 2**rand_bits)
            chosen = hi if u < position else lo
    if chosen == G:
        return overflow(True if away_direction is None else away_direction)
    if chosen == 0 and not fmt.zero:
        chosen = positives[0]
    if flush_out and 0 < chosen < fmt.min_normal:
        chosen = Fraction(0)
    if chosen == 0:
        return -0.0 if (neg and fmt.has_negative_zero) else 0.0
    return -float(chosen) if neg else float(chosen)


@pytest.mark.parametrize("rounding", DETERMINISTIC)
@pytest.mark.parametrize("fmt", SMALL_FORMATS, ids=fmt_id)
def test_round_value_matches_brute_force_on_sweeps(fmt, rounding):
    points = sweep_points(fmt, np.float64, ulps=(1,))
    for saturate in (False, True):
        got = np.array([exact.round_value(float(p), fmt, rounding, saturate) for p in points])
        ref = np.array([brute_round(float(p), fmt, rounding, saturate) for p in points])
        assert_same_bits(got, ref, inputs=points, what=f"{fmt.name} {rounding} saturate={saturate}: ")


@pytest.mark.parametrize("fmt", SMALL_FORMATS, ids=fmt_id)
def test_round_value_flush_options_match_brute_force(fmt):
    points = sweep_points(fmt, np.float64)
    points = points[np.abs(points) < 4 * float(fmt.min_normal)]
    for rounding in DETERMINISTIC:
        for flush_in, flush_out in ((True, False), (False, True), (True, True)):
            got = np.array([exact.round_value(float(p), fmt, rounding, flush_subnormal_inputs=flush_in,
                                              flush_subnormal_outputs=flush_out) for p in points])
            ref = np.array([brute_round(float(p), fmt, rounding, flush_in=flush_in, flush_out=flush_out)
                            for p in points])
            assert_same_bits(got, ref, inputs=points, what=f"{rounding} flush={flush_in, flush_out}: ")


@pytest.mark.parametrize("fmt", SMALL_FORMATS[:9], ids=fmt_id)
@pytest.mark.parametrize("rand_bits", [None, 2, 5])
def test_round_value_stochastic_matches_brute_force(fmt, rand_bits):
    points = sweep_points(fmt, np.float64)[::3]
    r = rand_bits or 8
    for k in (0, 1, 2 ** (r - 1) - 1, 2 ** (r - 1), 2**r - 1):
        u = Fraction(k, 2**r)
        got = np.array([exact.round_value(float(p), fmt, "stochastic", random_fraction=u, rand_bits=rand_bits)
                        for p in points])
        ref = np.array([brute_round(float(p), fmt, "stochastic", u=u, rand_bits=rand_bits) for p in points])
        assert_same_bits(got, ref, inputs=points, what=f"u={u}: ")


def test_round_value_stochastic_needs_a_random_fraction():
    with pytest.raises(ValueError):
        exact.round_value(1.3, "e4m3", "stochastic")


def test_check_rounding_lists_modes():
    with pytest.raises(ValueError) as info:
        exact.check_rounding("nearest")
    for mode in exact.ROUNDING_MODES:
        assert mode in str(info.value)
    assert set(exact.ROUNDING_MODES) == set(DETERMINISTIC) | {"stochastic"}


# --------------------------------------------- wide formats vs numpy / Python
def _directed_reference(x: Fraction, nearest: float, rounding: str, next_toward) -> float:
    """Directed results from the correctly rounded nearest value and nextafter (finite, in range)."""
    lo = nearest if Fraction(nearest) <= x else next_toward(nearest, -math.inf)
    hi = nearest if Fraction(nearest) >= x else next_toward(nearest, math.inf)
    if rounding == "up":
        return hi
    if rounding == "down":
        return lo
    if rounding == "toward_zero":
        return lo if x >= 0 else hi
    raise AssertionError(rounding)


finite64 = st.floats(allow_nan=False, allow_infinity=False, width=64)


@settings(deadline=None, max_examples=300)
@given(st.one_of(finite64, finite64.map(lambda v: v / 3)))
def test_round_value_fp32_matches_numpy_cast(x):
    with np.errstate(over="ignore"):
        expected = np.float32(x)  # numpy rounds float64 -> float32 to nearest even, once
    assume(np.isfinite(expected))
    assert_same_bits(exact.round_value(x, "fp32"), expected, inputs=x)
    f = Fraction(x)
    for rounding in ("up", "down", "toward_zero"):
        with np.errstate(over="ignore"):
            ref = _directed_reference(f, float(expected), rounding,
                                      lambda v, t: float(np.nextafter(np.float32(v), np.float32(t))))
        if abs(ref) > float(np.finfo(np.float32).max):
            continue
        got = exact.round_value(x, "fp32", rounding)
        if ref == 0:  # sign of a zero result is the input's
            ref = math.copysign(0.0, x)
        assert_same_bits(got, ref, inputs=x, what=f"{rounding}: ")


@settings(deadline=None, max_examples=300)
@given(st.one_of(finite64, st.floats(-70000, 70000), st.floats(-1e-4, 1e-4)))
def test_round_value_fp16_matches_numpy_cast(x):
    with np.errstate(over="ignore"):
        expected = np.float16(x)  # numpy's float64 -> float16 cast is correctly rounded, not via float32
    assert_same_bits(exact.round_value(x, "fp16"), expected, inputs=x)


@settings(deadline=None, max_examples=300)
@given(st.integers(min_value=-(2**1100), max_value=2**1100) | st.integers(-(2**70), 2**70))
def test_round_value_of_integers_matches_python_float(n):
    try:
        expected = float(n)  # Python's int -> float is correctly rounded (nearest even)
    except OverflowError:
        expected = math.inf if n > 0 else -math.inf
    assert_same_bits(exact.round_value(n, "fp64"), expected, inputs=None)


@settings(deadline=None, max_examples=300)
@given(st.fractions(max_denominator=2**80).filter(lambda f: f != 0 and abs(f) < 2**1000),
       st.sampled_from(("nearest_even", "up", "down", "toward_zero")))
def test_round_value_of_fractions_matches_python(f, rounding):
    nearest = float(f)  # Fraction -> float is int / int: correctly rounded
    if rounding == "nearest_even":
        expected = nearest
    else:
        expected = _directed_reference(f, nearest, rounding, math.nextafter)
    if expected == 0:
        expected = math.copysign(0.0, float(f.numerator))
    assert_same_bits(exact.round_value(f, "fp64", rounding), expected)


@settings(deadline=None, max_examples=200)
@given(st.fractions(min_value=Fraction(1, 2**60), max_value=Fraction(2**60)))
def test_floor_log2(v):
    e = exact.floor_log2(v)
    assert Fraction(2) ** e <= v < Fraction(2) ** (e + 1)


@pytest.mark.parametrize("fmt", SMALL_FORMATS, ids=fmt_id)
def test_neighbours_and_stochastic_neighbours_bracket_the_input(fmt):
    positives = [Fraction(v) for v in oracle_finite_values(fmt) if v > 0]
    rng = np.random.default_rng(4)
    for _ in range(50):
        i = int(rng.integers(0, len(positives) - 1))
        lo, hi = positives[i], positives[i + 1]
        t = Fraction(int(rng.integers(1, 255)), 256)
        v = lo + (hi - lo) * t
        assert exact.neighbours(fmt, v) == (lo, hi)
        low, high, p = exact.stochastic_neighbours(float(v), fmt)
        assert (low, high) == (float(lo), float(hi)) and p == t
        assert exact.neighbours(fmt, lo) == (lo, lo)
    assert exact.neighbours(fmt, Fraction(0)) == (0, 0)
