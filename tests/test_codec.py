"""fpsim.codec: encode/decode between values and bit patterns.

Expected values: the oracle's decode_code for every code (itself checked against
ml_dtypes in test_exact.py), ml_dtypes / numpy views of the same bits, torch
views, and the canonical-code rules written out below from the format docs.
NaN payloads are not preserved by design: NaN codes are compared by the
documented canonical NaN code and sign.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fpsim import exact
from fpsim.codec import code_dtype, decode, encode
from fpsim.formats import Format, format as get_format

from foundation_helpers import (BYTE_PRESETS, CUSTOM_FORMATS, SMALL_PRESETS, assert_same_bits, assert_same_codes,
                      custom_formats, fmt_id, format_inputs, codable, oracle_decoded, random_inputs,
                      requires_torch, sweep_points, torch)

DETERMINISTIC = ("nearest_even", "nearest_away", "toward_zero", "up", "down", "odd")
ENUMERABLE = [get_format(n) for n in SMALL_PRESETS] + list(CUSTOM_FORMATS.values())
ENUMERABLE_IDS = [fmt_id(f) for f in ENUMERABLE]


def _codes(fmt: Format) -> np.ndarray:
    return np.arange(1 << fmt.bits, dtype=np.uint64).astype(code_dtype(fmt))


def _sign_bit(fmt: Format) -> int:
    return (1 << (fmt.exp_bits + fmt.man_bits)) if fmt.signed else 0


def _canonical_nan_code(fmt: Format, negative: bool) -> int:
    """The documented canonical NaN: IEEE quiet NaN, the all-ones code (fn), the -0 code (fnuz);
    signed fn/ieee formats keep the sign."""
    if fmt.nan == "fnuz":
        return _sign_bit(fmt)
    if fmt.nan == "fn":
        positive = (1 << (fmt.exp_bits + fmt.man_bits)) - 1
    else:
        positive = (((1 << fmt.exp_bits) - 1) << fmt.man_bits) | (1 << (fmt.man_bits - 1))
    return positive | (_sign_bit(fmt) if negative else 0)


def _code_is_negative(fmt: Format, code: np.ndarray) -> np.ndarray:
    return (code.astype(np.uint64) & np.uint64(_sign_bit(fmt))) != 0 if fmt.signed else np.zeros(code.shape, bool)


def _expected_decoded_nan_sign(fmt: Format, codes: np.ndarray) -> np.ndarray:
    """NaN codes decode with the code's sign (fn/ieee), negative (fnuz), positive (unsigned)."""
    if fmt.nan == "fnuz":
        return np.ones(codes.shape, bool)
    return _code_is_negative(fmt, codes)


def _fits_float32(fmt: Format) -> bool:
    v = oracle_decoded(fmt)
    v = v[np.isfinite(v)]
    with np.errstate(over="ignore"):
        return bool(np.all(v.astype(np.float32).astype(np.float64) == v))


# ------------------------------------------------------- every code, decode
@pytest.mark.parametrize("fmt", ENUMERABLE, ids=ENUMERABLE_IDS)
def test_decode_every_code_matches_the_oracle(fmt):
    codes = _codes(fmt)
    got = decode(codes, fmt)
    assert got.dtype == (np.float32 if _fits_float32(fmt) else np.float64)
    assert got.shape == codes.shape
    expected = oracle_decoded(fmt)
    assert_same_bits(got, expected, nan_sign=False, inputs=codes)
    nan = np.isnan(got)
    assert np.array_equal(np.signbit(got[nan]), _expected_decoded_nan_sign(fmt, codes[nan]))


@pytest.mark.parametrize("name", [n for n in SMALL_PRESETS if get_format(n).ml_dtype is not None])
def test_decode_every_code_matches_ml_dtypes(name):
    fmt = get_format(name)
    codes = _codes(fmt)
    storage = codes.astype(np.uint8) if fmt.bits <= 8 else codes
    reference = storage.view(fmt.ml_dtype).astype(np.float32)
    # NaN signs included: ml_dtypes reads fn/ieee NaN with the code's sign, fnuz NaN negative, e8m0 positive
    assert_same_bits(decode(codes, fmt), reference, inputs=codes)


def test_decode_fp16_matches_numpy_float16():
    codes = np.arange(1 << 16, dtype=np.uint16)
    assert_same_bits(decode(codes, "fp16"), codes.view(np.float16))


@pytest.mark.parametrize("name,width", [("fp32", 32), ("fp64", 64)])
def test_decode_wide_formats_match_numpy_views(name, width):
    rng = np.random.default_rng(10)
    codes = rng.integers(0, 2**width, size=200_000, dtype=np.uint64).astype(f"uint{width}")
    special = np.array([0, 1 << (width - 1), 1, (1 << (width - 1)) - 1, (1 << width) - 1], dtype=f"uint{width}")
    codes = np.concatenate([codes, special])
    got = decode(codes, name)
    assert got.dtype == np.dtype(f"float{width}")
    assert_same_bits(got, codes.view(f"float{width}"), inputs=None)


def test_decode_tf32_is_float32_with_13_low_bits_zero():
    rng = np.random.default_rng(11)
    codes = np.concatenate([rng.integers(0, 1 << 19, size=100_000), np.arange(0, 1 << 19, 97)]).astype(np.uint32)
    got = decode(codes, "tf32")
    assert got.dtype == np.float32
    assert_same_bits(got, (codes << np.uint32(13)).view(np.float32))


@requires_torch
@pytest.mark.parametrize("name", [n for n in SMALL_PRESETS if get_format(n).torch_dtype is not None])
def test_decode_every_code_matches_torch(name):
    fmt = get_format(name)
    codes = _codes(fmt)
    t_codes = torch.from_numpy(codes.astype(np.int64))
    got = decode(t_codes, fmt)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32 and got.device == t_codes.device
    storage = torch.from_numpy(codes.view(np.int8) if fmt.bits == 8 else codes.view(np.int16))
    reference = storage.view(fmt.torch_dtype).to(torch.float32)
    # torch widens the fnuz NaN code 0x80 to +NaN; fpsim and ml_dtypes read it negative
    assert_same_bits(got, reference, nan_sign=fmt.nan != "fnuz", inputs=codes)
    assert_same_bits(got, decode(codes, fmt))


# ------------------------------------------------ every code, re-encode
@pytest.mark.parametrize("fmt", ENUMERABLE, ids=ENUMERABLE_IDS)
def test_every_code_re_encodes_to_its_canonical_code(fmt):
    """Codes of values re-encode to themselves; NaN codes to the canonical NaN (sign per the rules);
    the non-canonical exponent-0 codes of formats without subnormals decode to zero and re-encode
    to the zero code of their sign."""
    codes = _codes(fmt)
    values = decode(codes, fmt)
    got = encode(values, fmt)
    assert got.dtype == code_dtype(fmt)
    expected = codes.astype(np.uint64).copy()
    negative = _code_is_negative(fmt, codes)
    nan = np.isnan(values)
    for i in np.flatnonzero(nan):
        expected[i] = _canonical_nan_code(fmt, bool(negative[i]))
    exp_field = (codes.astype(np.uint64) >> np.uint64(fmt.man_bits)) & np.uint64((1 << fmt.exp_bits) - 1)
    if fmt.zero and not fmt.subnormals:
        noncanonical = (exp_field == 0) & ~nan
        assert np.all(values[noncanonical] == 0)
        expected[noncanonical] = np.where(negative[noncanonical] & fmt.has_negative_zero, _sign_bit(fmt), 0)
    assert_same_codes(got, expected)
    # the exact oracle's encoder agrees on every non-NaN value
    if fmt.bits <= 8:
        for v, c in zip(values[~nan], got[~nan]):
            assert exact.encode_value(float(v), fmt) == int(c)


@pytest.mark.parametrize("name", [n for n in SMALL_PRESETS if get_format(n).ml_dtype is not None])
def test_encode_values_of_every_code_matches_ml_dtypes_bits(name):
    fmt = get_format(name)
    codes = _codes(fmt)
    storage = codes.astype(np.uint8) if fmt.bits <= 8 else codes
    values = storage.view(fmt.ml_dtype).astype(np.float32)
    values = values[~np.isnan(values)]  # NaN payloads are not preserved: NaN codes are tested above
    got = encode(values, fmt)
    reference = values.astype(fmt.ml_dtype).view(np.uint8 if fmt.bits <= 8 else np.uint16)
    assert_same_codes(got, reference & ((1 << fmt.bits) - 1))


# --------------------------------------------- encode rounds like quantize
@pytest.mark.parametrize("name", [n for n in BYTE_PRESETS] + ["fp16", "bf16"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_encode_nearest_even_matches_ml_dtypes_bits(name, dtype):
    """On float32 input ml_dtypes rounds once; on float64 input only the float32-exact points are
    compared with it (it rounds float64 through float32), the rest with the oracle."""
    fmt = get_format(name)
    x = np.concatenate([sweep_points(fmt, dtype)[:: 1 if fmt.bits <= 8 else 11],
                        random_inputs(50_000, dtype, seed=12)])
    if not fmt.has_nan:
        x = x[~np.isnan(x)]  # encode refuses NaN for these formats (tested below)
    got = encode(x, fmt)
    assert got.dtype == code_dtype(fmt)
    with np.errstate(over="ignore", invalid="ignore"):
        x32 = x.astype(np.float32)
    comparable = x32.astype(dtype) == x
    if fmt.name == "e8m0":  # ml_dtypes' E8M0 cast misrounds float32 subnormals (see test_rounding.py)
        comparable &= ~((np.abs(x) < np.finfo(np.float32).tiny) & (x != 0))
    nan = np.isnan(x)
    comparable &= ~nan
    with np.errstate(over="ignore", invalid="ignore"):
        reference = x32[comparable].astype(fmt.ml_dtype).view(np.uint8 if fmt.bits <= 8 else np.uint16)
    assert_same_codes(got[comparable], reference & ((1 << fmt.bits) - 1), what=f"{name}: ")
    # NaN: the canonical NaN, not numpy's payload-preserving float16 cast
    nan_expected = [_canonical_nan_code(fmt, bool(np.signbit(v)) and fmt.signed) for v in x[nan]]
    assert_same_codes(got[nan], np.array(nan_expected, dtype=np.uint64))
    rest = np.flatnonzero(~comparable)[::37]
    expected = [_oracle_code(v, fmt) for v in x[rest]]
    assert_same_codes(got[rest], np.array(expected, dtype=np.uint64), what=f"{name} (oracle): ")


def _oracle_code(x: float, fmt: Format, rounding="nearest_even", saturate=False, **kw) -> int:
    r = exact.round_value(float(x), fmt, rounding, saturate, **kw)
    if math.isnan(r):
        negative = math.copysign(1.0, float(x)) < 0
        return _canonical_nan_code(fmt, negative and fmt.signed)
    return exact.encode_value(r, fmt)


@pytest.mark.parametrize("rounding", DETERMINISTIC)
@pytest.mark.parametrize("fmt", [get_format(n) for n in ("e4m3", "e5m2", "e4m3fnuz", "e2m1", "e8m0", "bf16")]
                         + [CUSTOM_FORMATS[k] for k in ("e4m3fn_nosub", "e4m3fn_unsigned", "e11m4_ieee")],
                         ids=fmt_id)
def test_encode_every_mode_matches_oracle(fmt, rounding):
    """Codes of the values, ties and +-1 ulp neighbours (a third of them, in turn by dtype), saturate on and
    off (the oracle is asked with saturate only beyond max/2, where it can matter)."""
    for start, dtype in enumerate((np.float32, np.float64)):
        x = sweep_points(fmt, dtype, ulps=(1,))[start::3 if fmt.bits <= 8 else 401]
        if not fmt.has_nan:
            x = x[~np.isnan(x)]
        expected = np.array([_oracle_code(v, fmt, rounding) for v in x], dtype=np.uint64)
        big = ~(np.abs(x.astype(np.float64)) < float(fmt.max) / 2)
        expected_sat = expected.copy()
        expected_sat[big] = [_oracle_code(v, fmt, rounding, True) for v in x[big]]
        for saturate, exp in ((False, expected), (True, expected_sat)):
            assert_same_codes(encode(x, fmt, rounding, saturate), exp, what=f"{dtype.__name__} saturate={saturate}: ")


@pytest.mark.parametrize("fmt", [get_format("fp16"), get_format("e4m3"), CUSTOM_FORMATS["e3m4fnuz_b2"]],
                         ids=fmt_id)
def test_encode_flush_options_match_oracle(fmt):
    x = sweep_points(fmt, np.float32)
    x = x[np.abs(x) <= 2 * float(fmt.min_normal)]
    x = x[:: max(1, len(x) // 500)]
    for flush_in, flush_out in ((True, False), (False, True), (True, True)):
        kw = dict(flush_subnormal_inputs=flush_in, flush_subnormal_outputs=flush_out)
        for dtype in (np.float32, np.float64):
            got = encode(x.astype(dtype), fmt, "nearest_even", **kw)
            expected = np.array([_oracle_code(v, fmt, **kw) for v in x], dtype=np.uint64)
            assert_same_codes(got, expected, what=f"{kw}: ")


@settings(deadline=None, max_examples=150)
@given(st.lists(st.floats(width=32), min_size=1, max_size=30), st.sampled_from(["fp32", "bf16", "tf32", "e5m2"]),
       st.sampled_from(DETERMINISTIC))
def test_encode_random_floats_matches_oracle(values, name, rounding):
    """encode(x) == the code of the oracle's rounding of x, for float32 and float64 input."""
    x = np.array(values, dtype=np.float32)
    for arr in (x, x.astype(np.float64)):
        got = encode(arr, name, rounding)
        expected = np.array([_oracle_code(v, get_format(name), rounding) for v in arr], dtype=np.uint64)
        assert_same_codes(got, expected)


@pytest.mark.parametrize("fmt", [Format(8, 7, nan="fn", bias=126), Format(8, 3, nan="none", bias=100),
                                 CUSTOM_FORMATS["e8m7_unsigned_nozero"], Format(1, 0, bias=151, nan="fnuz",
                                                                                subnormals=False),
                                 Format(8, 3, nan="fn", bias=150)], ids=fmt_id)
def test_encode_values_beyond_float32_range(fmt):
    """Formats with exp_bits <= 8 and man_bits <= 23 whose range still passes float32's (bias < 127, a top
    binade at 2^128, values below 2^-149) must not be packed through float32."""
    x = np.array([float(fmt.max), 2.0**128, 1.0, float(fmt.min_subnormal)])
    expected = np.array([_oracle_code(v, fmt) for v in x], dtype=np.uint64)
    assert_same_codes(encode(x, fmt), expected)


@settings(deadline=None, max_examples=200,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(st.data(), custom_formats(), st.sampled_from([np.float32, np.float64]), st.sampled_from(DETERMINISTIC),
       st.booleans())
def test_encode_and_decode_random_custom_formats_match_the_oracle(data, fmt, dtype, rounding, saturate):
    codes = np.array(data.draw(st.lists(st.integers(0, (1 << fmt.bits) - 1), min_size=1, max_size=20)),
                     dtype=np.uint64).astype(code_dtype(fmt))
    got = decode(codes, fmt)
    assert_same_bits(got, np.array([exact.decode_code(int(c), fmt) for c in codes]), nan_sign=False, inputs=codes)
    nan = np.isnan(got)
    assert np.array_equal(np.signbit(got[nan]), _expected_decoded_nan_sign(fmt, codes[nan]))
    x = data.draw(format_inputs(fmt, dtype))
    x = x[codable(x, fmt)]  # the rest is refused: test_encode_refuses_inputs_without_a_code
    if len(x) == 0:
        return
    expected = []
    for v in x:
        r = exact.round_value(float(v), fmt, rounding, saturate)
        expected.append(None if (math.isnan(r) and not fmt.has_nan) else _oracle_code(v, fmt, rounding, saturate))
    if None in expected:  # the format has no NaN for that result: encode refuses the array
        with pytest.raises(ValueError):
            encode(x, fmt, rounding, saturate)
        return
    assert_same_codes(encode(x, fmt, rounding, saturate), np.array(expected, dtype=np.uint64))


def test_encode_fp32_and_fp64_are_the_bit_patterns():
    rng = np.random.default_rng(13)
    bits32 = rng.integers(0, 2**32, size=100_000, dtype=np.uint64).astype(np.uint32)
    x32 = bits32.view(np.float32)
    finite = ~np.isnan(x32)
    assert_same_codes(encode(x32, "fp32")[finite], bits32[finite])
    bits64 = rng.integers(0, 2**64, size=100_000, dtype=np.uint64)
    x64 = bits64.view(np.float64)
    finite = ~np.isnan(x64)
    assert_same_codes(encode(x64, "fp64")[finite], bits64[finite])
    assert encode(x64, "fp64").dtype == np.uint64


# ------------------------------------------------------ NaN and signs
@pytest.mark.parametrize("name", ["fp16", "bf16", "e4m3", "e5m2", "e4m3fnuz", "e5m2fnuz", "e8m0", "fp32", "tf32"])
def test_nan_encodes_to_the_canonical_nan(name):
    fmt = get_format(name)
    x = np.array([np.nan, -np.nan], dtype=np.float32)
    expected = [_canonical_nan_code(fmt, False), _canonical_nan_code(fmt, fmt.signed)]
    for arr in (x, x.astype(np.float64)):
        assert_same_codes(encode(arr, fmt), np.array(expected, dtype=np.uint64))
    # NaN payloads are not preserved
    payload = np.array([0x7F800001, 0xFFA00000], dtype=np.uint32).view(np.float32)
    assert_same_codes(encode(payload, fmt), np.array(expected, dtype=np.uint64))


def test_canonical_nan_codes_by_hand():
    assert_same_codes(encode(np.float32([np.nan, -np.nan]), "e4m3"), np.array([0x7F, 0xFF]))
    assert_same_codes(encode(np.float32([np.nan, -np.nan]), "e5m2"), np.array([0x7E, 0xFE]))
    assert_same_codes(encode(np.float32([np.nan, -np.nan]), "e4m3fnuz"), np.array([0x80, 0x80]))
    assert_same_codes(encode(np.float32([np.nan, -np.nan]), "fp16"), np.array([0x7E00, 0xFE00]))
    assert_same_codes(encode(np.float32([np.nan, -np.nan]), "bf16"), np.array([0x7FC0, 0xFFC0]))
    assert_same_codes(encode(np.float32([np.nan, -np.nan]), "e8m0"), np.array([0xFF, 0xFF]))


@pytest.mark.parametrize("name", ["e3m2", "e2m3", "e2m1"])
def test_formats_without_nan_refuse_nan(name):
    with pytest.raises(ValueError, match="NaN"):
        encode(np.array([1.0, np.nan], dtype=np.float32), name)
    with pytest.raises(ValueError, match="NaN"):
        encode(np.array([1.0, np.nan]), name)


def test_unsigned_format_without_nan_refuses_negative_values():
    fmt = CUSTOM_FORMATS["e4m3_unsigned_nonan"]
    with pytest.raises(ValueError):
        encode(np.array([1.0, -2.0], dtype=np.float32), fmt)
    assert_same_codes(encode(np.array([-0.0, 0.0], dtype=np.float32), fmt), np.array([0, 0]))


@pytest.mark.parametrize("name", list(SMALL_PRESETS) + ["fp32", "fp64", "tf32"])
def test_signed_zero_codes(name):
    fmt = get_format(name)
    x = np.array([0.0, -0.0], dtype=np.float32)
    if not fmt.zero:
        assert_same_codes(encode(x, fmt), np.array([_canonical_nan_code(fmt, False)] * 2))  # e8m0: NaN
        return
    neg_zero = _sign_bit(fmt) if fmt.has_negative_zero else 0
    for arr in (x, x.astype(np.float64)):
        assert_same_codes(encode(arr, fmt), np.array([0, neg_zero], dtype=np.uint64))
    assert np.signbit(decode(np.array([neg_zero], dtype=np.uint64), fmt)[0]) == fmt.has_negative_zero


# --------------------------------------------------------- dtypes, errors
@pytest.mark.parametrize("name,dtype", [("e2m1", np.uint8), ("e3m2", np.uint8), ("e4m3", np.uint8),
                                        ("e8m0", np.uint8), ("fp16", np.uint16), ("bf16", np.uint16),
                                        ("tf32", np.uint32), ("fp32", np.uint32), ("fp64", np.uint64)])
def test_code_dtype(name, dtype):
    assert code_dtype(name) == np.dtype(dtype)
    assert encode(np.float32([1.0]), name).dtype == np.dtype(dtype)
    if torch is not None:
        assert code_dtype(name, torch=True) == getattr(torch, np.dtype(dtype).name)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64, np.int8, np.int16, np.int32,
                                   np.int64])
def test_decode_accepts_any_integer_dtype(dtype):
    codes = np.array([0x38, 0x00, 0x7F, 0x01], dtype=dtype)
    assert_same_bits(decode(codes, "e4m3"), np.array([exact.decode_code(int(c), "e4m3") for c in codes]),
                     nan_sign=False)


def test_decode_fp64_codes_with_the_sign_bit_set():
    codes = np.array([0xBFF8000000000000, 0x8000000000000000, 0xFFF0000000000000], dtype=np.uint64)
    assert_same_bits(decode(codes, "fp64"), codes.view(np.float64))


OUT_OF_RANGE = [
    (np.array([0, 256], dtype=np.uint16), "e4m3", "256"), (np.array([-1, 3]), "e4m3", "-1"),
    (np.array([16], dtype=np.uint8), "e2m1", "16"), (np.array([1 << 19], dtype=np.uint32), "tf32", str(1 << 19)),
    (np.array([1 << 16]), "bf16", str(1 << 16)), (np.array([64]), "e3m2", "64"),
]


@pytest.mark.parametrize("codes,fmt,bad", OUT_OF_RANGE, ids=[f"{f}-{b}" for _, f, b in OUT_OF_RANGE])
def test_decode_refuses_codes_out_of_range_naming_them(codes, fmt, bad):
    with pytest.raises(ValueError, match=bad):
        decode(codes, fmt)


@pytest.mark.parametrize("codes", [np.array([1.0]), np.float32(3), 1.5, np.array([True]),
                                   np.array([1 + 1j])], ids=["float_array", "np.float32", "float", "bool", "complex"])
def test_decode_refuses_non_integer_codes(codes):
    with pytest.raises(TypeError):
        decode(codes, "e4m3")


def test_scalar_codes_and_values():
    got = decode(np.uint8(0x38), "e4m3")
    assert np.ndim(got) == 0 and got == 1.0 and got.dtype == np.float32
    assert decode(0x3C00, "fp16") == 1.0
    code = encode(1.0, "e4m3")
    assert np.ndim(code) == 0 and int(code) == 0x38 and code.dtype == np.uint8
    assert int(encode(np.float64(-2.0), "bf16")) == 0xC000


@pytest.mark.parametrize("x", [np.float32(1.0), np.array(1.0, dtype=np.float32), np.float16(1.0)],
                         ids=["np.float32", "0-d float32", "np.float16"])
def test_encode_float32_scalar_keeps_its_shape(x):
    assert np.shape(encode(x, "e4m3")) == ()


def test_encode_passes_options_and_refuses_unknown_ones():
    x = np.float32([1.0625, 3.0])
    assert_same_codes(encode(x, "e4m3", "up"), np.array([0x39, 0x44]))
    with pytest.raises(TypeError):
        encode(x, "e4m3", bogus=True)
    with pytest.raises(TypeError):
        encode(x.astype(np.float64), "e4m3", bogus=True)


# ---------------------------------------------------------------- torch
@requires_torch
@pytest.mark.parametrize("name", ["e4m3", "e5m2", "e4m3fnuz", "e2m1", "e8m0", "fp16", "bf16", "tf32", "fp32"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_torch_encode_decode_match_numpy(name, dtype):
    fmt = get_format(name)
    x = random_inputs(20_000, np.float32, seed=14).astype(dtype)
    if fmt.bits <= 16:
        x = np.concatenate([x, sweep_points(fmt, np.float32)[:: 5 if fmt.bits <= 8 else 101].astype(dtype)])
    if not fmt.has_nan:
        x = x[~np.isnan(x)]
    t = torch.from_numpy(x)
    for rounding in ("nearest_even", "toward_zero", "up"):
        codes_t = encode(t, fmt, rounding)
        assert isinstance(codes_t, torch.Tensor) and codes_t.device == t.device
        assert codes_t.dtype == code_dtype(fmt, torch=True)
        codes_n = encode(x, fmt, rounding)
        assert_same_codes(codes_t, codes_n)
        values_t = decode(codes_t.to(torch.int64), fmt)
        assert isinstance(values_t, torch.Tensor) and values_t.device == t.device
        assert values_t.dtype == (torch.float32 if fmt.bits <= 32 else torch.float64)
        assert_same_bits(values_t, decode(codes_n, fmt))
        assert_same_bits(values_t, quantize_np(x, fmt, rounding))


def quantize_np(x, fmt, rounding):
    from fpsim.rounding import quantize
    return quantize(x, fmt, rounding)


@requires_torch
@pytest.mark.parametrize("name", ["e4m3", "fp16", "fp32"])
def test_torch_decode_accepts_the_code_dtype_encode_returns(name):
    t = torch.tensor([1.5, -2.0, 0.0])
    codes = encode(t, name)
    assert_same_bits(decode(codes, name), t)


@requires_torch
def test_torch_fp64_round_trip():
    t = torch.tensor([1.5, -2.0, 0.0], dtype=torch.float64)
    assert_same_bits(decode(encode(t, "fp64"), "fp64"), t)


@requires_torch
@pytest.mark.parametrize("dtype", ["int32", "uint32", "uint64"])
def test_torch_decode_refuses_codes_out_of_range_as_numpy_does(dtype):
    """The same code in a tensor and in a numpy array: the same refusal, naming the code as given
    (a uint64 code of 2^63 and above too, which the int64 view reads as negative)."""
    bad = 2**63 + 5 if dtype == "uint64" else 300
    for codes in (np.array([1, bad], dtype=dtype), torch.tensor([1, bad], dtype=getattr(torch, dtype))):
        with pytest.raises(ValueError, match=f"code {bad} at index \\(1,\\) is outside 0..255"):
            decode(codes, "e4m3")


@requires_torch
def test_torch_decode_refuses_float_tensors():
    with pytest.raises(TypeError):
        decode(torch.tensor([1.0]), "e4m3")
