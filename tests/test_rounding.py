"""fpsim.rounding.quantize against ml_dtypes, torch, numpy and the exact oracle.

Sources of expected values:
- ml_dtypes ``astype`` (float32 input: one correctly rounded RNE cast for every
  format it has) and torch ``.to(dtype)`` where they implement the same cast;
- numpy's float64 -> float16 and float64 -> float32 casts, Python's float();
- the Fraction oracle fpsim.exact.round_value, itself checked in test_exact.py
  against ml_dtypes, numpy, Python and a brute-force rounder.

Where the libraries do NOT implement the same cast we say so and compare with
the oracle instead:
- torch, and ml_dtypes before 0.7 (0.7 still for bfloat16), round float64 input
  through float32 for bfloat16 and all float8/6/4 types (numpy's float16 is
  direct), so on float64 input they differ
  from a single rounding exactly when the float32 intermediate lands on a tie
  of the target format (or underflows to zero, for E8M0);
- torch's float32 -> float8_e4m3fn cast saturates (overflow and Inf to +-448):
  compared with ``saturate=True``;
- ml_dtypes casts NaN to zero for float6/float4 (no NaN in the format); fpsim's
  documented answer is NaN: compared with the oracle;
- torch widens the fnuz NaN code to a positive NaN (fpsim and ml_dtypes: negative);
- for E8M0, ml_dtypes and torch round float32 *subnormal* inputs as if their
  first stored mantissa bit were the half bit (1.4 * 2^-127 -> 2^-126, where
  the nearest value is 2^-127), and torch ignores the sign and maps zero to
  2^-127: those inputs are compared with the oracle only.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fpsim import exact
from fpsim.formats import PRESETS, Format, format as get_format
from fpsim.rounding import ROUNDING_MODES, quantize

from foundation_helpers import (BYTE_PRESETS, CUSTOM_FORMATS, as_float64, assert_same_bits, custom_formats, expected_nan_sign,
                      fmt_id, format_inputs, codable, oracle, oracle_finite_values, preset_formats,
                      random_inputs, reference_fraction, requires_torch, sweep_points, torch)

DETERMINISTIC = ("nearest_even", "nearest_away", "toward_zero", "up", "down", "odd")
ML_FORMATS = list(BYTE_PRESETS) + ["fp16", "bf16"]  # all have an ml_dtypes/numpy type
TORCH_FORMATS = ["e4m3", "e5m2", "e4m3fnuz", "e5m2fnuz", "e8m0", "fp16", "bf16"]


def _ml_cast(x: np.ndarray, fmt: Format) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(fmt.ml_dtype).astype(np.float64)


def _ml_comparable(x: np.ndarray, fmt: Format) -> np.ndarray:
    """Where ml_dtypes' cast of `x` (float32) is the same operation as quantize (see module doc)."""
    ok = np.ones(x.shape, dtype=bool)
    if not fmt.has_nan:
        ok &= ~np.isnan(x)  # ml_dtypes turns NaN into 0 for the MX FP6/FP4 types; fpsim returns NaN
    if fmt.name == "e8m0":
        tiny = np.abs(x) < np.finfo(np.float32).tiny
        ok &= ~tiny | (x == 0)
    return ok


def _midpoints(fmt: Format) -> np.ndarray:
    """Every tie of the format (between neighbours, and between max and the next grid point above)."""
    values = oracle_finite_values(fmt)
    positive = [v for v in values if v > 0]
    ties = [(a + b) / 2 for a, b in zip([0.0] + positive[:-1], positive)]
    above = float(fmt.max + exact.quantum(fmt, fmt.max))
    ties.append(float(fmt.max) / 2 + above / 2)
    ties = np.array(ties)
    return np.concatenate([ties, -ties])


def _float64_comparable(x64: np.ndarray, fmt: Format) -> np.ndarray:
    """float64 inputs where rounding through float32 first cannot change the result: the float32
    intermediate is not a tie of the format and does not underflow to zero.
    (All ties of these formats are float32 numbers, and float32 rounding is monotone, so an
    intermediate that is not a tie lies on the same side of every tie as the input.)"""
    with np.errstate(over="ignore"):
        x32 = x64.astype(np.float32).astype(np.float64)
        on_tie = np.isin(x32, _midpoints(fmt))
        underflow = (x32 == 0) & (x64 != 0)
        return ~on_tie & ~underflow & _ml_comparable(x64.astype(np.float32), fmt)


def _nan_sign_checked(result, x, fmt, what=""):
    """Every NaN in `result` has the documented sign."""
    r = as_float64(result)
    xs = as_float64(x)
    nan = np.isnan(r)
    expected = expected_nan_sign(fmt, np.signbit(xs))
    bad = nan & (np.signbit(r) != expected)
    assert not bad.any(), f"{what}NaN sign wrong for inputs {xs[bad][:8]}"


# ------------------------------------------------- sweeps around every value
@pytest.mark.parametrize("name", [n for n in ML_FORMATS if n not in ("fp16", "bf16")])
def test_nearest_even_float32_sweep_matches_ml_dtypes_and_oracle(name):
    fmt = get_format(name)
    x = sweep_points(fmt, np.float32)
    x = x[codable(x, fmt)]  # NaN into FP6/FP4: refused, test_inputs_without_a_code_are_refused
    got = quantize(x, fmt)
    assert got.dtype == np.float32
    ok = _ml_comparable(x, fmt)
    assert_same_bits(got[ok], _ml_cast(x[ok], fmt), inputs=x[ok])
    assert_same_bits(got, oracle(x, fmt), inputs=x, nan_sign=False)
    _nan_sign_checked(got, x, fmt)


@pytest.mark.parametrize("name", [n for n in ML_FORMATS if n not in ("fp16", "bf16")])
def test_nearest_even_float64_sweep_matches_oracle_and_ml_dtypes_where_comparable(name):
    fmt = get_format(name)
    x = sweep_points(fmt, np.float64)
    x = x[codable(x, fmt)]
    got = quantize(x, fmt)
    assert got.dtype == np.float64
    assert_same_bits(got, oracle(x, fmt), inputs=x, nan_sign=False)
    ok = _float64_comparable(x, fmt)
    assert ok.mean() > 0.4  # most points: only the float64 neighbours of ties are excluded
    assert_same_bits(got[ok], _ml_cast(x[ok], fmt), inputs=x[ok])


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_16_bit_float32_sweep_matches_ml_dtypes(name):
    fmt = get_format(name)
    x = sweep_points(fmt, np.float32)
    got = quantize(x, fmt)
    assert got.dtype == np.float32
    assert_same_bits(got, _ml_cast(x, fmt), inputs=x)
    sample = x[::97]
    assert_same_bits(got[::97], oracle(sample, fmt), inputs=sample, nan_sign=False)


def test_fp16_float64_sweep_matches_numpy_float16():
    """numpy rounds float64 -> float16 once (no float32 step), so every point is comparable."""
    fmt = get_format("fp16")
    x = sweep_points(fmt, np.float64)
    got = quantize(x, fmt)
    assert got.dtype == np.float64
    with np.errstate(over="ignore"):
        assert_same_bits(got, x.astype(np.float16), inputs=x)


def test_bf16_float64_sweep_matches_oracle_and_ml_dtypes_where_comparable():
    fmt = get_format("bf16")
    x = sweep_points(fmt, np.float64)
    got = quantize(x, fmt)
    ok = _float64_comparable(x, fmt)
    assert_same_bits(got[ok], _ml_cast(x[ok], fmt), inputs=x[ok])
    rest = np.zeros_like(ok)
    rest[np.flatnonzero(~ok)[::29]] = True  # a sample of the double-rounding cases (~9000)
    rest[::151] = True  # and of the comparable ones
    assert_same_bits(got[rest], oracle(x[rest], fmt), inputs=x[rest], nan_sign=False)


# ----------------------------------------------------------- torch casts
def _torch_comparable(x32: np.ndarray, fmt: Format) -> np.ndarray:
    if fmt.name != "e8m0":
        return np.ones(x32.shape, dtype=bool)
    # torch's e8m0 cast ignores the sign, maps zero to 2^-127 and shares ml_dtypes' subnormal quirk
    return (x32 > 0) & (x32 >= np.finfo(np.float32).tiny) & np.isfinite(x32)


@requires_torch
@pytest.mark.parametrize("name", TORCH_FORMATS)
@pytest.mark.parametrize("input_dtype", ["float32", "float64"])
def test_nearest_even_sweep_matches_torch(name, input_dtype):
    fmt = get_format(name)
    x = sweep_points(fmt, np.float32)
    if name in ("fp16", "bf16"):
        x = x[::7]
    ok = _torch_comparable(x, fmt)
    x = x[ok]
    saturate = name == "e4m3"  # torch's float8_e4m3fn cast saturates
    t = torch.from_numpy(x).to(getattr(torch, input_dtype))  # exact: float32 values
    got = quantize(t, fmt, saturate=saturate)
    assert isinstance(got, torch.Tensor) and got.dtype == t.dtype and got.device == t.device
    expected = t.to(fmt.torch_dtype)
    # torch widens the fnuz NaN code (0x80) to a positive NaN; fpsim's convention (and ml_dtypes')
    # reads it as negative: NaN signs are compared for the other formats only
    assert_same_bits(got, expected, inputs=x, nan_sign=fmt.nan != "fnuz")


# ----------------------------------------------------------- random inputs
RANDOM_N = 1 << 19  # float32 inputs per format; float64: half as many (~0.8e6 per format in all)


@pytest.mark.parametrize("name", ML_FORMATS)
def test_nearest_even_random_float32_matches_ml_dtypes(name):
    fmt = get_format(name)
    x = random_inputs(RANDOM_N, np.float32, seed=sum(map(ord, name)))
    x = x[codable(x, fmt)]
    got = quantize(x, fmt)
    ok = _ml_comparable(x, fmt)
    assert_same_bits(got[ok], _ml_cast(x[ok], fmt), inputs=x[ok])
    if not ok.all():
        assert_same_bits(got[~ok], oracle(x[~ok], fmt), inputs=x[~ok], nan_sign=False)


@pytest.mark.parametrize("name", ML_FORMATS)
def test_nearest_even_random_float64_matches_ml_dtypes_where_comparable(name):
    fmt = get_format(name)
    x = random_inputs(RANDOM_N // 2, np.float64, seed=1 + sum(map(ord, name)))
    # add values a hair off the format's ties, where rounding through float32 goes wrong
    ties = _midpoints(fmt)
    rng = np.random.default_rng(5)
    pick = rng.choice(ties, size=2000)
    x = np.concatenate([x, pick * (1 + rng.choice([-1.0, 1.0], size=2000) * 2.0**-40)])
    x = x[codable(x, fmt)]
    got = quantize(x, fmt)
    if name == "fp16":  # numpy's float64 -> float16 cast is direct: compare everything
        with np.errstate(over="ignore"):
            assert_same_bits(got, x.astype(np.float16), inputs=x)
        return
    ok = _float64_comparable(x, fmt)
    assert_same_bits(got[ok], _ml_cast(x[ok], fmt), inputs=x[ok])
    assert (~ok).sum() > 100  # the double-rounding cases are present, and checked against the oracle:
    assert_same_bits(got[~ok], oracle(x[~ok], fmt), inputs=x[~ok], nan_sign=False)


# --------------------------------------------------- the double-rounding trap
def test_float64_input_is_rounded_once_not_through_float32():
    """|x| = 431.99999999999994 is just below 432, the E4M3 tie between 416 and 448, so the nearest
    E4M3 value of x is -416. Rounding through float32 first makes x exactly -432, a tie, which goes
    to the even -448: torch does that (and ml_dtypes before 0.7); fpsim must not."""
    x = np.float64(-431.99999999999994)
    assert float(np.float32(x)) == -432.0  # the float32 step lands on the tie
    expected = exact.round_value(float(x), "e4m3")
    assert expected == -416.0
    got = quantize(x, "e4m3")
    assert_same_bits(got, expected)
    if torch is not None:
        tt = quantize(torch.tensor([x], dtype=torch.float64), "e4m3")
        assert_same_bits(tt, np.array([expected]))
        assert float(torch.tensor([x], dtype=torch.float64).to(torch.float8_e4m3fn).double()) == -448.0


@pytest.mark.parametrize("name", ["bf16", "e5m2", "e2m1", "e8m0"])
def test_float64_single_rounding_other_formats(name):
    """The same trap for other formats: just off a tie by far less than a float32 ulp."""
    fmt = get_format(name)
    ties = _midpoints(fmt)
    ties = ties[(np.abs(ties) > float(fmt.min_normal)) & (np.abs(ties) < float(fmt.max))][:200]
    x = np.concatenate([ties * (1 + 2.0**-45), ties * (1 - 2.0**-45)])
    assert_same_bits(quantize(x, fmt), oracle(x, fmt), inputs=x, nan_sign=False)


# -------------------------------------------------- every mode vs the oracle
def _check_against_oracle(x: np.ndarray, fmt: Format, rounding: str, saturate: bool, flush_in: bool,
                          flush_out: bool, torch_too: bool = True) -> None:
    """quantize == the oracle on the inputs that have a value in `fmt`; the rest is refused."""
    kw = dict(flush_subnormal_inputs=flush_in, flush_subnormal_outputs=flush_out)
    ok = codable(x, fmt, flush_inputs=flush_in)
    if not ok.all():
        with pytest.raises(ValueError, match="has no NaN|is unsigned|has no zero"):
            quantize(x, fmt, rounding, saturate, **kw)
        x = x[ok]
        if len(x) == 0:
            return
    got = quantize(x, fmt, rounding, saturate, **kw)
    expected = oracle(x, fmt, rounding, saturate, **kw)
    what = f"{fmt.name} {rounding} sat={saturate} flush={flush_in, flush_out}: "
    assert_same_bits(got, expected, inputs=x, nan_sign=False, what=what)
    _nan_sign_checked(got, x, fmt, what)
    if torch_too and torch is not None:
        got_t = quantize(torch.from_numpy(x), fmt, rounding, saturate, **kw)
        assert isinstance(got_t, torch.Tensor)
        assert_same_bits(got_t, got, inputs=x, what="torch vs numpy: " + what)


option_flags = st.tuples(st.sampled_from(DETERMINISTIC), st.booleans(), st.booleans(), st.booleans())


@settings(deadline=None, max_examples=250, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), preset_formats, st.sampled_from([np.float32, np.float64]), option_flags)
def test_every_mode_matches_oracle_presets(data, fmt, dtype, options):
    x = data.draw(format_inputs(fmt, dtype))
    _check_against_oracle(x, fmt, *options)


@settings(deadline=None, max_examples=250,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(st.data(), custom_formats(), st.sampled_from([np.float32, np.float64]), option_flags)
def test_every_mode_matches_oracle_custom_formats(data, fmt, dtype, options):
    x = data.draw(format_inputs(fmt, dtype))
    _check_against_oracle(x, fmt, *options)


@pytest.mark.parametrize("fmt", [CUSTOM_FORMATS["e4m3fn_unsigned"], CUSTOM_FORMATS["e4m3_unsigned_nonan"]],
                         ids=fmt_id)
def test_flushed_negative_input_of_unsigned_format(fmt):
    x = np.array([-float(fmt.min_normal) / 2], dtype=np.float32)
    got = quantize(x, fmt, flush_subnormal_inputs=True)
    assert got[0] == 0 and not np.signbit(got[0])  # documented: flushed to -0, and -0 -> +0 (unsigned)
    ref = exact.round_value(float(x[0]), fmt, flush_subnormal_inputs=True)
    assert_same_bits(got, np.array([ref]))


@pytest.mark.parametrize("fmt", [Format(2, 1, bias=-3, signed=False, nan="none", subnormals=False),
                                 Format(2, 1, bias=-3, signed=False, subnormals=False)], ids=fmt_id)
def test_flush_keeps_negative_infinity_negative(fmt):
    assert fmt.emin > 0
    x = np.array([-np.inf], dtype=np.float64)
    if not fmt.has_nan:  # nothing to give: refused
        with pytest.raises(ValueError, match="is unsigned; the input holds a negative value at index \\(0,\\)"):
            quantize(x, fmt, flush_subnormal_inputs=True)
        return
    got = quantize(x, fmt, flush_subnormal_inputs=True)
    assert np.isnan(got[0]), got  # documented: a negative input into an unsigned format is NaN
    assert_same_bits(got, np.array([exact.round_value(-np.inf, fmt, flush_subnormal_inputs=True)]))


BUGGY_NO_SUBNORMAL_FORMATS = [Format(2, 3, nan="none", subnormals=False),
                              Format(2, 11, bias=1, signed=False, subnormals=False, zero=False),
                              Format(3, 7, nan="fn", subnormals=False)]


@pytest.mark.parametrize("fmt", BUGGY_NO_SUBNORMAL_FORMATS, ids=fmt_id)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tiny_inputs_of_formats_without_subnormals(fmt, dtype):
    m = float(fmt.min_normal)
    x = np.array([m * 0.2, m * 0.6, m * 0.5, -m * 0.3, m * 0.99], dtype=dtype)
    if not fmt.signed:
        x = np.abs(x)
    for rounding in DETERMINISTIC:
        assert_same_bits(quantize(x, fmt, rounding), oracle(x, fmt, rounding), inputs=x, nan_sign=False,
                         what=f"{rounding}: ")


@pytest.mark.parametrize("rounding", DETERMINISTIC)
@pytest.mark.parametrize("fmt", [get_format(n) for n in BYTE_PRESETS] + list(CUSTOM_FORMATS.values()),
                         ids=fmt_id)
def test_every_mode_sweep_matches_oracle(fmt, rounding):
    """Deterministic version of the above: every value, tie and +-1 ulp neighbour (float32 and float64),
    saturate on and off (flush options are covered by the next test and the hypothesis tests).
    With saturate, values in range must not change: the oracle is evaluated with saturate only
    where it matters (beyond max/2 and non-finite), to keep the run short."""
    for dtype in (np.float32, np.float64):
        x = sweep_points(fmt, dtype, ulps=(1,))
        if fmt.bits > 8:
            x = x[::211]
        x = x[codable(x, fmt)]
        expected = oracle(x, fmt, rounding)
        big = ~(np.abs(x.astype(np.float64)) < float(fmt.max) / 2)
        expected_sat = expected.copy()
        expected_sat[big] = oracle(x[big], fmt, rounding, True)
        for saturate, exp in ((False, expected), (True, expected_sat)):
            got = quantize(x, fmt, rounding, saturate)
            what = f"{fmt.name} {rounding} saturate={saturate}: "
            assert_same_bits(got, exp, inputs=x, nan_sign=False, what=what)
            _nan_sign_checked(got, x, fmt, what)
            if dtype is np.float64 and torch is not None:
                assert_same_bits(quantize(torch.from_numpy(x), fmt, rounding, saturate), got, inputs=x,
                                 what="torch: " + what)


@pytest.mark.parametrize("fmt", [get_format(n) for n in ("fp16", "bf16", "e4m3", "e5m2fnuz", "e2m1", "e8m0")]
                         + [CUSTOM_FORMATS["e4m3fn_nosub"], CUSTOM_FORMATS["e3m4fnuz_b2"]], ids=fmt_id)
def test_flush_options_match_oracle_near_the_subnormal_range(fmt):
    for dtype in (np.float32, np.float64):
        x = sweep_points(fmt, dtype)
        x = x[np.abs(x) <= 2 * float(fmt.min_normal)]
        x = x[:: max(1, len(x) // 400)]
        for rounding in DETERMINISTIC:
            for flush_in, flush_out in ((True, False), (False, True), (True, True)):
                _check_against_oracle(x, fmt, rounding, False, flush_in, flush_out)


BELOW_ONE_FORMATS = [Format(4, 3, bias=20, nan="fn"), Format(3, 2, bias=8), Format(5, 2, bias=40, nan="fnuz"),
                     Format(1, 0, bias=2, nan="fnuz", subnormals=False)]


@pytest.mark.parametrize("fmt", BELOW_ONE_FORMATS, ids=fmt_id)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_zero_input_of_formats_below_one(fmt, dtype):
    assert fmt.max < 1
    x = np.array([0.0, -0.0, float(fmt.max) / 2, float(fmt.min_subnormal) / 4], dtype=dtype)
    for saturate in (False, True):
        assert_same_bits(quantize(x, fmt, saturate=saturate), oracle(x, fmt, saturate=saturate), inputs=x,
                         nan_sign=False)


# ----------------------------------------------- overflow and special inputs
def _spec_overflow(fmt: Format, negative: bool, rounding: str, saturate: bool) -> float:
    """The documented overflow result, written from the docs (not from the oracle)."""
    big = -float(fmt.max) if negative else float(fmt.max)
    if saturate:
        return big
    sign = -1.0 if negative else 1.0
    natural = math.copysign(math.inf, sign) if fmt.infinities else (
        math.copysign(math.nan, sign) if fmt.has_nan else big)
    if rounding in ("nearest_even", "nearest_away", "stochastic"):
        return natural
    if rounding in ("toward_zero", "odd"):
        return big
    if rounding == "up":
        return big if negative else natural
    return natural if negative else big  # down


@pytest.mark.parametrize("rounding", ROUNDING_MODES)
@pytest.mark.parametrize("name", [n for n in PRESETS if n not in ("fp64",)])
@pytest.mark.parametrize("saturate", [False, True])
def test_overflow_follows_the_documented_table(name, rounding, saturate):
    fmt = get_format(name)
    beyond = float(fmt.max) * 4
    signs = (False, True) if fmt.signed else (False,)
    for negative in signs:
        x = np.array([-beyond if negative else beyond], dtype=np.float64)
        got = quantize(x, fmt, rounding, saturate, seed=0 if rounding == "stochastic" else None)
        assert_same_bits(got, np.array([_spec_overflow(fmt, negative, rounding, saturate)]), inputs=x,
                         nan_sign=False, what=f"{rounding}: ")
        _nan_sign_checked(got, x, fmt)


@pytest.mark.parametrize("name", [n for n in PRESETS])
@pytest.mark.parametrize("saturate", [False, True])
def test_infinity_and_nan_inputs(name, saturate):
    """Inf stays Inf where the format has it (unless saturate), else NaN if the format has NaN, else max;
    saturate clamps Inf to +-max; NaN stays NaN. e8m0 is unsigned: -Inf is NaN."""
    fmt = get_format(name)
    x = np.array([np.inf, -np.inf, np.nan, -np.nan])
    big = float(fmt.max)
    if saturate:
        inf_results = [big, -big]
    elif fmt.infinities:
        inf_results = [np.inf, -np.inf]
    elif fmt.has_nan:
        inf_results = [np.nan, -np.nan]
    else:
        inf_results = [big, -big]
    if not fmt.signed:
        inf_results[1] = np.nan
    expected = np.array(inf_results + [np.nan, -np.nan])
    if not fmt.has_nan:  # no code for NaN: refused (test_inputs_without_a_code_are_refused)
        x, expected = x[:2], expected[:2]
    for rounding in DETERMINISTIC:
        got = quantize(x, fmt, rounding, saturate)
        assert_same_bits(got, expected, inputs=x, nan_sign=False, what=f"{rounding}: ")
        _nan_sign_checked(got, x, fmt)


def test_nan_signs_follow_the_convention_for_nan_inputs():
    x = np.array([np.nan, -np.nan], dtype=np.float32)
    for name, signs in {"e4m3": [False, True], "e5m2": [False, True], "bf16": [False, True],
                        "e4m3fnuz": [True, True], "e5m2fnuz": [True, True], "e8m0": [False, False],
                        "e4m3b11fnuz": [True, True], "e5m3fnu": [False, False]}.items():
        for dtype in (np.float32, np.float64):
            got = quantize(x.astype(dtype), name)
            assert np.isnan(got).all(), name
            assert list(np.signbit(got)) == signs, name


@pytest.mark.parametrize("name", ["e4m3fnuz", "e5m2fnuz"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fnuz_overflow_nan_reads_negative(name, dtype):
    x = np.array([1e6, np.inf, -1e6, -np.inf, np.nan], dtype=dtype)
    got = quantize(x, name)
    assert np.isnan(got).all()
    assert np.signbit(got).all()  # the NaN code is the -0 code: it reads negative
    assert np.signbit(_ml_cast(x.astype(np.float32), get_format(name))).all()  # as ml_dtypes


def test_unsigned_and_no_zero_rules_of_e8m0():
    """E8M0 (as ml_dtypes): zero and negatives are NaN, tiny positives become 2^-127."""
    x = np.array([0.0, -0.0, -1.0, -1e-300, 1e-300, 2.0**-140, 2.0**-127, 2.0**-128, 3.0 * 2**-129])
    got = quantize(x, "e8m0")
    m = 2.0**-127
    expected = np.array([np.nan, np.nan, np.nan, np.nan, m, m, m, m, m])
    assert_same_bits(got, expected, inputs=x)
    for rounding in DETERMINISTIC:
        assert_same_bits(quantize(x, "e8m0", rounding), expected, inputs=x, what=rounding)


# ------------------------------------------------------------- signed zeros
@pytest.mark.parametrize("name", list(PRESETS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_signed_zeros(name, dtype):
    """-0 and negative values that round to zero keep their sign wherever the format has -0;
    fnuz and unsigned formats with a zero give +0 for -0; e8m0 has no zero (NaN)."""
    fmt = get_format(name)
    tiny = float(fmt.min_subnormal) / 4
    x = np.array([0.0, -0.0, tiny, -tiny], dtype=dtype)
    x = x[(x != 0) | (np.arange(4) < 2)]  # tiny may underflow in float32 for wide formats
    for rounding in ("nearest_even", "nearest_away", "toward_zero", "up", "odd"):
        got = quantize(x, fmt, rounding)
        if not fmt.zero:
            assert np.isnan(got[:2]).all()
            continue
        assert got[0] == 0 and not np.signbit(got[0])
        assert got[1] == 0 and np.signbit(got[1]) == fmt.has_negative_zero, f"{rounding}: -0 -> {got[1]!r}"
        if len(x) == 4 and not fmt.signed:  # a negative value, however tiny: NaN (as ml_dtypes)
            assert np.isnan(got[3]), f"{rounding}: -tiny -> {got[3]!r}"
        elif len(x) == 4 and rounding in ("nearest_even", "toward_zero", "up"):
            # -tiny rounds to zero under these modes
            assert got[3] == 0 and np.signbit(got[3]) == fmt.has_negative_zero, f"{rounding}: -tiny -> {got[3]!r}"
    if torch is not None:
        got_t = quantize(torch.from_numpy(x), fmt)
        assert_same_bits(got_t, quantize(x, fmt))


@pytest.mark.parametrize("fmt", [CUSTOM_FORMATS["e4m3fn_unsigned"], CUSTOM_FORMATS["e4m3_unsigned_nonan"]],
                         ids=fmt_id)
def test_unsigned_formats_map_negative_zero_to_zero_and_negatives_to_nan(fmt):
    """-0 is +0; a negative value is NaN where the format has NaN, else refused."""
    x = np.array([-0.0, 0.0, -1.0, -1e-30], dtype=np.float32)
    if not fmt.has_nan:
        with pytest.raises(ValueError, match=r"is unsigned; the input holds a negative value at index \(2,\)"):
            quantize(x, fmt)
        x = x[:2]
    got = quantize(x, fmt)
    assert got[0] == 0 and not np.signbit(got[0])
    assert got[1] == 0 and not np.signbit(got[1])
    assert np.isnan(got[2:]).all() and not np.signbit(got[2:]).any()


# ------------------------------------------------------------ integer inputs
@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
                                   np.uint64])
def test_integer_arrays_round_from_their_exact_value(dtype):
    info = np.iinfo(dtype)
    rng = np.random.default_rng(6)
    values = [int(info.min), int(info.max), 0, 1, int(info.max) - 1, int(info.min) + 1]
    values += [int(v) for v in rng.integers(int(info.min), int(info.max), size=200, endpoint=True, dtype=dtype)]
    if info.max > 2**53:
        values += [2**53 + 1, 2**53 + 3, 2**60 + 1, 2**63 - 1] + ([-(2**53) - 1, -(2**62) - 1] if info.min else [])
        values += [2**64 - 1, 2**64 - 2**11] if info.max > 2**63 else []
    x = np.array([v for v in values if info.min <= v <= info.max], dtype=dtype)
    got = quantize(x, "fp64")
    assert got.dtype == np.float64
    assert_same_bits(got, np.array([float(int(v)) for v in x]))  # Python's int -> float: RNE
    for fmt in ("fp32", "bf16", "e4m3", "fp16"):
        for rounding in ("nearest_even", "toward_zero", "up", "down", "odd"):
            expected = np.array([exact.round_value(int(v), fmt, rounding) for v in x])
            got = quantize(x, fmt, rounding)
            assert_same_bits(got, expected, nan_sign=False, what=f"{fmt} {rounding}: ")
            _nan_sign_checked(got, x, get_format(fmt))


BIG_INTEGERS = [2**53 + 1, 2**53 + 3, 2**54 + 2, 2**60 + 1, 2**63 - 1, 3 * 2**52 + 1, (2**24 + 1) << 38,
                (2**24 + 1) << 38 | 1, (2**8 + 1) << 47, ((2**8 + 1) << 47) + 1, 2**62 + 2**61 + 2**9 + 1]


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_engine_rounds_integers_beyond_2_53_from_their_exact_value(backend):
    """The engine without the kernel: beyond 2^53 an integer is rounded to odd at 53 bits, then to
    the format (deterministic modes, at most 50 mantissa bits), or rounded by the oracle itself
    (stochastic rounding: U from the same stream; 51 or more mantissa bits). Values at and next to
    the ties of fp32 and bf16 included."""
    from fpsim import _arrays
    from fpsim.rounding import _quantize_engine

    if backend == "torch" and torch is None:
        pytest.skip("torch is not installed")
    values = BIG_INTEGERS + [-v for v in BIG_INTEGERS] + [-(2**63), 7, -3, 0]
    x = np.array(values, dtype=np.int64)
    array = torch.from_numpy(x) if backend == "torch" else x
    ops = _arrays.Ops(array)
    key = 0x5EED
    for name in ("fp32", "tf32", "bf16", "e4m3", "fp16", "fp64"):
        for rounding in ROUNDING_MODES:
            options = dict(rounding=rounding, saturate=False, rand_bits=None, flush_inputs=False, flush_outputs=False)
            got = _quantize_engine(array, None, PRESETS["fp64"], get_format(name), ops, options,
                                   key if rounding == "stochastic" else None)
            u = [reference_fraction(key, i, 3) if rounding == "stochastic" else None for i in range(len(x))]
            expected = [exact.round_value(v, name, rounding, random_fraction=ui) for v, ui in zip(values, u)]
            assert_same_bits(as_float64(got), np.array(expected), nan_sign=False, what=f"{name} {rounding}: ")


def test_big_negative_integer_overflow_nan_keeps_sign():
    x = np.array([-(2**53) - 1, -5000], dtype=np.int64)
    got = quantize(x, "e4m3")
    assert np.isnan(got).all()
    assert np.signbit(got).all()


@requires_torch
def test_integer_tensors_round_from_their_exact_value():
    values = [2**62 + 1, -(2**62) - 1, 2**63 - 1, 2**53 + 1, 3, -7, 0]
    t = torch.tensor(values, dtype=torch.int64)
    for rounding in ("nearest_even", "up", "down", "toward_zero"):
        got = quantize(t, "fp64", rounding)
        assert isinstance(got, torch.Tensor) and got.dtype == torch.float64
        assert_same_bits(got, np.array([exact.round_value(v, "fp64", rounding) for v in values]))
    assert_same_bits(quantize(t, "fp64"), np.array([float(v) for v in values]))


@pytest.mark.parametrize("value", [7, -7, 2**40 + 1, 2**53, -(2**53)])
def test_python_int_scalars(value):
    got = quantize(value, "fp64")
    assert np.ndim(got) == 0
    assert_same_bits(got, float(value))
    assert_same_bits(quantize(value, "e4m3", "up"), exact.round_value(value, "e4m3", "up"))


@pytest.mark.parametrize("value", [2**53 + 1, -(2**60) - 1, 2**64 + 1, 3**100, -(7**80)],
                         ids=["2^53+1", "-(2^60+1)", "2^64+1", "3^100", "-(7^80)"])
def test_python_int_scalars_beyond_2_to_53(value):
    got = quantize(value, "fp64")
    assert np.ndim(got) == 0
    assert_same_bits(got, float(value))  # Python's int -> float rounds to nearest even
    assert_same_bits(quantize(value, "bf16", "toward_zero"), exact.round_value(value, "bf16", "toward_zero"))


# ---------------------------------------------------------- result dtypes
RESULT_DTYPES = [
    # (input dtype, format, documented result dtype)
    (np.float32, "e4m3", np.float32), (np.float32, "bf16", np.float32), (np.float32, "fp16", np.float32),
    (np.float32, "e8m0", np.float32), (np.float32, "tf32", np.float32), (np.float32, "e2m1", np.float32),
    (np.float32, "fp64", np.float64), (np.float32, Format(11, 4), np.float64),
    (np.float64, "e4m3", np.float64), (np.float64, "fp32", np.float64),
    (np.float16, "bf16", np.float32), (np.float16, "e4m3", np.float16), (np.float16, "e5m2", np.float16),
    (np.float16, "e4m3fnuz", np.float16), (np.float16, "e8m0", np.float32), (np.float16, "fp64", np.float64),
    (ml_dtypes.bfloat16, "e4m3", ml_dtypes.bfloat16), (ml_dtypes.bfloat16, "fp16", np.float32),
    (ml_dtypes.bfloat16, "e8m0", ml_dtypes.bfloat16), (ml_dtypes.bfloat16, "tf32", np.float32),
    (ml_dtypes.float8_e4m3fn, "e4m3", ml_dtypes.float8_e4m3fn), (ml_dtypes.float8_e4m3fn, "e5m2", np.float32),
    (ml_dtypes.float8_e4m3fn, "e2m1", ml_dtypes.float8_e4m3fn), (ml_dtypes.float8_e5m2, "e2m1", ml_dtypes.float8_e5m2),
    (ml_dtypes.float8_e5m2, "e2m3", np.float32), (ml_dtypes.float8_e4m3fn, "e4m3fnuz", np.float32),
    (np.int32, "e4m3", np.float64), (np.uint8, "fp16", np.float64), (np.int64, "fp32", np.float64),
]


@pytest.mark.parametrize("in_dtype,fmt,out_dtype", RESULT_DTYPES,
                         ids=[f"{np.dtype(a).name}-{b if isinstance(b, str) else b.name}"
                              for a, b, _ in RESULT_DTYPES])
def test_result_dtype_rule(in_dtype, fmt, out_dtype):
    """The input's dtype when it holds every value of the format, else float32 if that does, else float64."""
    x = np.array([1, 2, 3, 0, 0.75, -0.375], dtype=in_dtype)
    got = quantize(x, fmt)
    assert got.dtype == np.dtype(out_dtype)
    assert_same_bits(got, oracle(x, fmt), inputs=x, nan_sign=False)


def test_values_of_ml_dtypes_inputs_are_rounded_exactly():
    x = np.array([1.3, -2.7, 300.0, 1e-3], dtype=ml_dtypes.bfloat16)
    for fmt in ("e4m3", "e2m1", "fp16"):
        assert_same_bits(quantize(x, fmt), oracle(x, fmt), inputs=x)


@requires_torch
@pytest.mark.parametrize("in_dtype,fmt,out_dtype", [
    ("float32", "e4m3", "float32"), ("float32", "bf16", "float32"), ("float64", "e5m2", "float64"),
    ("float16", "bf16", "float32"), ("float16", "e4m3", "float16"), ("bfloat16", "e4m3", "bfloat16"),
    ("bfloat16", "fp16", "float32"), ("float32", "fp64", "float64"), ("int64", "e4m3", "float64"),
    ("int32", "fp16", "float64"), ("float8_e4m3fn", "e5m2", "float32"), ("float8_e5m2", "e5m2", "float8_e5m2"),
])
def test_torch_result_dtype_and_device(in_dtype, fmt, out_dtype):
    t = torch.tensor([1, 2, 3, 0, -5]).to(getattr(torch, in_dtype))
    got = quantize(t, fmt)
    assert isinstance(got, torch.Tensor)
    assert got.dtype == getattr(torch, out_dtype) and got.device == t.device
    assert_same_bits(got, oracle(t, fmt), nan_sign=False)


@requires_torch
@pytest.mark.parametrize("name", ["e4m3", "e5m2fnuz", "bf16", "fp16", "e2m1", "e8m0", "tf32"])
@pytest.mark.parametrize("rounding", DETERMINISTIC)
def test_torch_and_numpy_give_the_same_bits(name, rounding):
    x = random_inputs(4096, np.float32, seed=7)
    x = x[codable(x, get_format(name))]
    for dtype in (np.float32, np.float64):
        xn = x.astype(dtype)
        for saturate in (False, True):
            got_n = quantize(xn, name, rounding, saturate)
            got_t = quantize(torch.from_numpy(xn), name, rounding, saturate)
            assert got_t.dtype == {np.float32: torch.float32, np.float64: torch.float64}[dtype]
            assert_same_bits(got_t, got_n, inputs=xn)


def test_scalars_come_back_as_scalars():
    for x in (1.3, np.float64(1.3)):
        got = quantize(x, "e4m3")
        assert np.ndim(got) == 0 and not isinstance(got, np.ndarray)
        assert_same_bits(got, 1.25)


@pytest.mark.parametrize("x", [np.float32(1.3), np.float16(1.3), np.array(1.3, dtype=np.float32)],
                         ids=["np.float32", "np.float16", "0-d float32 array"])
def test_float32_scalars_keep_their_shape(x):
    got = quantize(x, "e4m3")
    assert np.shape(got) == ()
    assert got.dtype == x.dtype


def test_array_shapes_are_preserved():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 7
    for rounding in ("nearest_even", "stochastic"):
        assert quantize(x, "e4m3", rounding, seed=1).shape == (2, 3, 4)
        assert quantize(x.astype(np.float64), "e4m3", rounding, seed=1).shape == (2, 3, 4)
        assert quantize(x.T, "bf16", rounding, seed=1).shape == (4, 3, 2)
    assert_same_bits(quantize(x.T, "e4m3"), quantize(np.ascontiguousarray(x.T), "e4m3"))


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("bad", [
    np.array([1 + 2j]), 1 + 2j, np.complex64(1), "1.0", np.array(["1.0"]), np.array(["1.0"], dtype=object),
    True, np.bool_(True), np.array([True, False]), None, {1.0},
], ids=["complex_array", "complex", "np.complex64", "str", "str_array", "object_array", "bool", "np.bool_",
        "bool_array", "None", "set"])
def test_bad_inputs_raise_type_error_naming_what_is_allowed(bad):
    with pytest.raises(TypeError, match="allowed"):
        quantize(bad, "e4m3")


@requires_torch
@pytest.mark.parametrize("dtype", ["complex64", "bool"])
def test_bad_torch_inputs_raise_type_error(dtype):
    with pytest.raises(TypeError, match="allowed"):
        quantize(torch.zeros(3, dtype=getattr(torch, dtype)), "e4m3")


def test_unknown_rounding_lists_the_modes():
    with pytest.raises(ValueError) as info:
        quantize(np.float32([1.0]), "e4m3", rounding="nearest")
    for mode in ROUNDING_MODES:
        assert mode in str(info.value)


def test_unknown_format_raises_value_error():
    with pytest.raises(ValueError, match="e4m3"):
        quantize(np.float32([1.0]), "e4m4")


def test_rand_bits_without_stochastic_is_refused():
    with pytest.raises(ValueError, match="stochastic"):
        quantize(np.float32([1.0]), "e4m3", rounding="nearest_even", rand_bits=8)


@pytest.mark.parametrize("bits", [0, 53, -1, 2.5, True, "8"])
def test_rand_bits_out_of_range_is_refused(bits):
    with pytest.raises(ValueError if isinstance(bits, int) and not isinstance(bits, bool) else TypeError,
                       match="rand_bits must be an int in 1..52"):
        quantize(np.float32([1.0]), "e4m3", rounding="stochastic", rand_bits=bits, seed=0)


def test_seed_and_generator_together_are_refused():
    with pytest.raises(ValueError, match="seed"):
        quantize(np.float32([1.0]), "e4m3", rounding="stochastic", seed=1, generator=np.random.default_rng(1))


@pytest.mark.parametrize("flag", ["saturate", "flush_subnormal_inputs", "flush_subnormal_outputs"])
def test_non_bool_flags_are_refused(flag):
    with pytest.raises(TypeError, match=flag):
        quantize(np.float32([1.0]), "e4m3", **{flag: "yes"})


def test_wrong_generator_type_is_refused():
    with pytest.raises(TypeError, match="Generator"):
        quantize(np.float32([1.0]), "e4m3", rounding="stochastic", generator=np.random.RandomState(0))
    if torch is not None:
        with pytest.raises(TypeError, match="Generator"):
            quantize(torch.ones(3), "e4m3", rounding="stochastic", generator=np.random.default_rng(0))


# -------------------------------------------------- wide formats (fp32, fp64)
@settings(deadline=None, max_examples=200)
@given(st.lists(st.floats(width=64), min_size=1, max_size=20))
def test_fp32_of_float64_matches_numpy_cast(values):
    x = np.array(values, dtype=np.float64)
    with np.errstate(over="ignore"):
        expected = x.astype(np.float32)  # numpy: one correctly rounded RNE cast
    assert_same_bits(quantize(x, "fp32"), expected, inputs=x)


@settings(deadline=None, max_examples=100)
@given(st.lists(st.floats(width=64), min_size=1, max_size=20))
def test_fp64_of_float64_is_the_identity(values):
    x = np.array(values, dtype=np.float64)
    for rounding in DETERMINISTIC:
        assert_same_bits(quantize(x, "fp64", rounding), x, inputs=x)
