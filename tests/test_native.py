"""The compiled fast path (fpsim/_fastround.c via fpsim._native) against the numpy engine.

The kernel claims to give the numpy engine's bits (round_bits for values,
codec._pack for codes) on every float32 input it covers. Both are compared
here bit for bit on inputs covering every float32 bit-pattern class: random
uint32 patterns, every exponent field with edge mantissas, NaN payloads of
both signs, +-0, subnormals, +-Inf, and dense sweeps around every value of
each 8-bit format; for every preset it covers, every deterministic mode,
saturate and both flush options; also through quantize/encode and torch CPU
tensors. (The engine itself is held to the exact oracle in test_rounding.py.)
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fpsim import _arrays, _native
from fpsim.codec import _pack, code_dtype, encode
from fpsim.formats import PRESETS, Format
from fpsim.rounding import quantize, round_bits

from foundation_helpers import (CUSTOM_FORMATS, assert_same_bits, assert_same_codes, codable, custom_formats, fmt_id,
                      requires_torch, sweep_points, torch)

pytestmark = pytest.mark.skipif(not _native.available(),
                                reason="the compiled kernel fpsim._fastround is not built (numpy engine only)")

DETERMINISTIC = ("nearest_even", "nearest_away", "toward_zero", "up", "down", "odd")
FLUSH = [(False, False), (True, False), (False, True), (True, True)]


def _bit_pattern_inputs(seed: int, n_random: int = 8_000) -> np.ndarray:
    """float32 inputs from every bit-pattern class."""
    rng = np.random.default_rng(seed)
    random_bits = rng.integers(0, 2**32, size=n_random, dtype=np.uint64).astype(np.uint32)
    fields = np.arange(256, dtype=np.uint32) << np.uint32(23)
    mantissas = np.array([0, 1, 2, 0x3FFFFF, 0x400000, 0x400001, 0x7FFFFF, 0x7FFFFE, 0x200000, 0x600000,
                          0x0FFFFF, 0x100000], dtype=np.uint32)
    mantissas = np.concatenate([mantissas, rng.integers(0, 1 << 23, size=8).astype(np.uint32)])
    every_field = (fields[:, None] | mantissas[None, :]).ravel()
    every_field = np.concatenate([every_field, every_field | np.uint32(0x80000000)])
    nan_payloads = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF, 0xFFFFFFFF,
                             0x7FA00000, 0xFFA5A5A5], dtype=np.uint32)
    specials = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 1, 0x80000001, 0x007FFFFF, 0x807FFFFF,
                         0x00800000, 0x80800000, 0x7F7FFFFF, 0xFF7FFFFF], dtype=np.uint32)
    return np.concatenate([random_bits, every_field, nan_payloads, specials]).view(np.float32)


def _kernel_formats():
    presets = [f for f in PRESETS.values() if _native.covers(np.zeros(1, np.float32), f, "nearest_even")]
    customs = [f for f in CUSTOM_FORMATS.values() if _native.covers(np.zeros(1, np.float32), f, "nearest_even")]
    return presets, customs


KERNEL_PRESETS, KERNEL_CUSTOMS = _kernel_formats()


def test_kernel_covers_the_expected_presets():
    names = {f.name for f in KERNEL_PRESETS}
    assert {"fp16", "bf16", "tf32", "e4m3", "e5m2", "e4m3fnuz", "e5m2fnuz", "e3m2", "e2m3", "e2m1",
            "e8m0"} <= names
    assert not _native.covers(np.zeros(1, np.float64), PRESETS["e4m3"], "nearest_even")  # float32 only


def _engine(x: np.ndarray, fmt: Format, rounding, saturate, flush_in, flush_out, codes: bool, rand_bits=None,
            draws=None):
    ops = _arrays.Ops(x)
    extra = dict(rand_bits=rand_bits, random_ints=draws.astype(np.int64)) if rounding == "stochastic" else {}
    values = round_bits(x, fmt, ops, rounding=rounding, saturate=saturate, flush_inputs=flush_in,
                        flush_outputs=flush_out, **extra)
    return _pack(values, fmt, ops).astype(code_dtype(fmt)) if codes else values


def _kernel(x: np.ndarray, fmt: Format, rounding, saturate, flush_in, flush_out, codes: bool, rand_bits=None,
            draws=None):
    extra = dict(rand_bits=rand_bits, draws=draws) if rounding == "stochastic" else {}
    return _native.run(x, fmt, rounding=rounding, saturate=saturate, flush_inputs=flush_in,
                       flush_outputs=flush_out, codes=codes, **extra)


def _code_inputs(x: np.ndarray, fmt: Format) -> np.ndarray:
    """Inputs the engine can encode: for formats without NaN, no NaN, no negatives if also unsigned and
    no zeros if also without zero (those round to NaN, which encode refuses)."""
    if fmt.has_nan:
        return x
    keep = ~np.isnan(x)
    if not fmt.signed:
        keep &= ~(np.signbit(x) & (x != 0))
    if not fmt.zero:
        keep &= x != 0
    return x[keep]


def _draws(n: int, rand_bits, seed: int) -> np.ndarray:
    """Uniform draws for stochastic rounding, with the extremes over-represented."""
    r = rand_bits or _FLOAT32_RAND_BITS
    rng = np.random.default_rng(seed)
    d = rng.integers(0, 1 << r, size=n, dtype=np.int64)
    pick = rng.random(n)
    d[pick < 0.05] = 0
    d[(pick >= 0.05) & (pick < 0.1)] = (1 << r) - 1
    return d.astype(np.uint32)


_FLOAT32_RAND_BITS = 26  # float32 input: 23 + 3 bits make stochastic rounding exact (the engine's default)


def _compare(x, fmt, rounding, saturate, flush_in, flush_out, rand_bits=None, seed=0):
    what = f"{fmt.name} {rounding} saturate={saturate} flush={flush_in, flush_out} rand_bits={rand_bits}: "
    xc = _code_inputs(x, fmt)
    draws = draws_c = None
    if rounding == "stochastic":
        draws, draws_c = _draws(len(x), rand_bits, seed), _draws(len(xc), rand_bits, seed + 1)
    got = _kernel(x, fmt, rounding, saturate, flush_in, flush_out, False, rand_bits, draws)
    assert got.dtype == np.float32
    # NaN bits: both sides produce the canonical NaN, so compare the raw bits (payload and sign too)
    expected = _engine(x, fmt, rounding, saturate, flush_in, flush_out, False, rand_bits, draws)
    assert_same_codes(got.view(np.uint32), expected.view(np.uint32), what=what)
    got_c = _kernel(xc, fmt, rounding, saturate, flush_in, flush_out, True, rand_bits, draws_c)
    assert got_c.dtype == code_dtype(fmt)
    assert_same_codes(got_c, _engine(xc, fmt, rounding, saturate, flush_in, flush_out, True, rand_bits, draws_c),
                      what="codes " + what)


@pytest.mark.parametrize("fmt", KERNEL_PRESETS + KERNEL_CUSTOMS, ids=fmt_id)
@pytest.mark.parametrize("rounding", DETERMINISTIC)
def test_kernel_matches_numpy_engine_on_every_bit_pattern_class(fmt, rounding):
    x = _bit_pattern_inputs(seed=40)
    if fmt.bits <= 16:
        x = np.concatenate([x, sweep_points(fmt, np.float32)[:: 1 if fmt.bits <= 8 else 17]])
    for saturate in (False, True):
        for flush_in, flush_out in FLUSH:
            _compare(x, fmt, rounding, saturate, flush_in, flush_out)


STOCHASTIC_RAND_BITS = [None, 1, 3, 8, 13, 23, 26]
KERNEL_RAND_BITS_CASES = [None, 1, 8, 23]


@pytest.mark.parametrize("fmt", KERNEL_PRESETS + KERNEL_CUSTOMS[:4], ids=fmt_id)
@pytest.mark.parametrize("rand_bits", KERNEL_RAND_BITS_CASES)
def test_kernel_stochastic_matches_numpy_engine_with_the_same_draws(fmt, rand_bits):
    if not _native.covers(np.zeros(1, np.float32), fmt, "stochastic"):
        pytest.skip("this build's kernel does not do stochastic rounding")
    x = _bit_pattern_inputs(seed=44, n_random=3000)
    if fmt.bits <= 16:
        x = np.concatenate([x, sweep_points(fmt, np.float32)[:: 1 if fmt.bits <= 8 else 37]])
    for saturate in (False, True):
        for i, (flush_in, flush_out) in enumerate(FLUSH):
            _compare(x, fmt, "stochastic", saturate, flush_in, flush_out, rand_bits, seed=i)


@settings(deadline=None, max_examples=150,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(custom_formats(), st.sampled_from(DETERMINISTIC + ("stochastic",)), st.booleans(), st.sampled_from(FLUSH),
       st.sampled_from(STOCHASTIC_RAND_BITS), st.integers(0, 2**32 - 1))
def test_kernel_matches_numpy_engine_on_random_custom_formats(fmt, rounding, saturate, flush, rand_bits, seed):
    if not _native.covers(np.zeros(1, np.float32), fmt, rounding):
        return
    x = _bit_pattern_inputs(seed, n_random=2000)
    if len(x):
        _compare(x, fmt, rounding, saturate, *flush, rand_bits=rand_bits, seed=seed)


@pytest.mark.parametrize("fmt", [Format(3, 2, bias=0, signed=False, nan="fn"),
                                 Format(2, 1, bias=0, signed=False, subnormals=False)], ids=fmt_id)
def test_kernel_negative_inputs_of_unsigned_formats_with_flush(fmt):
    assert fmt.min_normal > 1 and _native.covers(np.zeros(1, np.float32), fmt, "nearest_even")
    x = np.array([-2.0, -3.0, -100.0, 2.0], dtype=np.float32)
    _compare(x, fmt, "nearest_even", False, True, False)


def test_kernel_encode_refuses_zero_for_formats_without_zero_and_nan():
    fmt = CUSTOM_FORMATS["e3m0_unsigned_nozero"]
    assert not fmt.zero and not fmt.has_nan
    with pytest.raises(ValueError):
        encode(np.array([0.0], dtype=np.float64), fmt)  # the engine refuses
    with pytest.raises(ValueError):
        encode(np.array([0.0], dtype=np.float32), fmt)  # the kernel must too


@pytest.mark.parametrize("fmt", [Format(4, 3, bias=142, nan="fn"), Format(1, 0, bias=128, nan="fnuz",
                                                                           subnormals=False)],
                         ids=fmt_id)
def test_kernel_formats_below_float32_min_normal(fmt):
    """Formats whose max lies below float32's min normal: float32 input gives the float64 answer
    (the kernel leaves them to the numpy engine)."""
    assert fmt.max < 2.0**-126
    x = np.array([1e-39, 3e-40, float(fmt.max)], dtype=np.float32)
    assert_same_bits(quantize(x, fmt), quantize(x.astype(np.float64), fmt), inputs=x)


# ------------------------------------------------ through the public API
@pytest.mark.parametrize("fmt", KERNEL_PRESETS, ids=fmt_id)
def test_quantize_and_encode_of_float32_use_the_kernel_bits(fmt):
    """quantize/encode on float32 numpy arrays (the kernel) == the numpy engine, and == quantize of the same
    values as float64 (which never takes the kernel)."""
    x = _bit_pattern_inputs(seed=41, n_random=5000)
    x = x[codable(x, fmt)]  # quantize refuses the others (the kernel itself is compared above)
    for rounding in DETERMINISTIC:
        for saturate in (False, True):
            got = quantize(x, fmt, rounding, saturate)
            assert got.dtype == np.float32
            assert_same_codes(got.view(np.uint32),
                              _engine(x, fmt, rounding, saturate, False, False, False).view(np.uint32))
            assert_same_bits(got, quantize(x.astype(np.float64), fmt, rounding, saturate), inputs=x)
            xc = _code_inputs(x, fmt)
            assert_same_codes(encode(xc, fmt, rounding, saturate),
                              _engine(xc, fmt, rounding, saturate, False, False, True))
            assert_same_codes(encode(xc, fmt, rounding, saturate), encode(xc.astype(np.float64), fmt, rounding,
                                                                          saturate))


def test_non_contiguous_and_multidimensional_input():
    x = _bit_pattern_inputs(seed=42, n_random=4096)[:4096].reshape(64, 64)
    view = x[::2, ::3]
    got = quantize(view, "e4m3")
    assert got.shape == view.shape
    assert_same_codes(got.view(np.uint32),
                      _engine(np.ascontiguousarray(view), PRESETS["e4m3"], "nearest_even", False, False,
                              False, False).view(np.uint32))


def test_float16_input_encodes_through_the_kernel_like_the_engine():
    x = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    for name in ("e4m3", "e5m2", "bf16"):
        xc = _code_inputs(x.astype(np.float32), PRESETS[name]).astype(np.float16)
        assert_same_codes(encode(xc, name), _engine(xc.astype(np.float32), PRESETS[name], "nearest_even",
                                                    False, False, False, True))


@requires_torch
@pytest.mark.parametrize("fmt", KERNEL_PRESETS, ids=fmt_id)
def test_torch_cpu_tensors_go_through_the_kernel(fmt):
    x = _bit_pattern_inputs(seed=43, n_random=5000)
    x = x[codable(x, fmt)]
    t = torch.from_numpy(x)
    for rounding in DETERMINISTIC:
        got = quantize(t, fmt, rounding)
        assert isinstance(got, torch.Tensor) and got.dtype == torch.float32 and got.device.type == "cpu"
        expected = round_bits(t, fmt, _arrays.Ops(t), rounding=rounding, saturate=False)  # torch engine
        assert_same_codes(got.numpy().view(np.uint32), expected.numpy().view(np.uint32))
        assert_same_codes(got.numpy().view(np.uint32), _kernel(x, fmt, rounding, False, False, False,
                                                               False).view(np.uint32))
