"""Block formats (fpsim.blocks) against the exact block oracle and the specs.

Sources of expected values:
- fpsim.exact_blocks, the Fraction oracle, which restates each format and
  scale rule from its source (OCP MX v1.0 and microsoft/microxcaling,
  torchao's ScaleCalculationMode, cuBLAS, NVIDIA's NVFP4, DeepSeek-V3) and
  stands on fpsim.formats and fpsim.exact only; its own preset table
  (exact_blocks.SPEC_PRESETS) is what the presets are checked against;
- codes of single values from fpsim.exact.encode_value;
- a few blocks worked out by hand from the specs (in the tests' comments).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fpsim
import fpsim.strategies as fst
from fpsim import exact, exact_blocks
from fpsim.blocks import BLOCK_PRESETS, SCALE_RULES, BlockEncoding, BlockFormat

DETERMINISTIC = ("nearest_even", "nearest_away", "toward_zero", "up", "down", "odd")
SMALL_PRESETS = [name for name in BLOCK_PRESETS if name != "fp8_block_128x128"]
MX_PRESETS = ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4", "mxint8"]
POW2_RULES = ("floor", "ceil", "even", "rceil")
FAST = settings(max_examples=40, deadline=None, report_multiple_bugs=False, suppress_health_check=[HealthCheck.too_slow,
                                                                        HealthCheck.data_too_large])


# ---------------------------------------------------------------- oracle
def spec(name, rule=None):
    element, scale, block, spec_rule, tensor, floor = exact_blocks.SPEC_PRESETS[name]
    return dict(element=element, scale=scale, block=block, rule=rule or spec_rule, tensor=tensor, floor=floor)


def oracle(x, element, scale, block, rule, tensor=None, floor=0, rounding="nearest_even", axes=None):
    """(dequantised values, {block index: scale}, element values) of x, block by block."""
    x = np.asarray(x, dtype=np.float64)
    dims = len(block)
    axes = tuple(range(x.ndim - dims, x.ndim)) if axes is None else tuple(a % x.ndim for a in axes)
    tail = tuple(range(x.ndim - dims, x.ndim))
    moved = np.moveaxis(x, axes, tail)
    finite = np.abs(moved[np.isfinite(moved)])
    t = exact_blocks.tensor_scale(max(map(Fraction, finite), default=Fraction(0))) if tensor else Fraction(1)
    values, elements, scales = np.empty_like(moved), np.empty_like(moved), {}
    lead, sizes = moved.shape[:-dims], moved.shape[-dims:]
    for li in np.ndindex(*lead):
        for bi in np.ndindex(*[-(-n // b) for n, b in zip(sizes, block)]):
            where = li + tuple(slice(i * b, min((i + 1) * b, n)) for i, b, n in zip(bi, block, sizes))
            part = moved[where]
            s, el, dq = exact_blocks.quantize_block(part.ravel(), element, scale, rule, rounding, tensor=t,
                                                    amax_floor=floor)
            values[where] = np.array(dq).reshape(part.shape)
            elements[where] = np.array(el).reshape(part.shape)
            scales[li + bi] = s
    return np.moveaxis(values, tail, axes), scales, np.moveaxis(elements, tail, axes), t


def assert_same(got, want):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape
    same = (got == want) & (np.signbit(got) == np.signbit(want)) | (np.isnan(got) & np.isnan(want))
    if not same.all():
        i = tuple(np.argwhere(~same)[0])
        raise AssertionError(f"at {i}: got {got[i]!r}, expected {want[i]!r} ({(~same).sum()} of {same.size} differ)")


# ---------------------------------------------------------------- presets
@pytest.mark.parametrize("name", list(exact_blocks.SPEC_PRESETS))
def test_presets_are_their_sources(name):
    element, scale, block, rule, tensor, floor = exact_blocks.SPEC_PRESETS[name]
    fmt = fpsim.format(name)
    assert isinstance(fmt, BlockFormat) and fmt.name == name
    assert str(fmt.element) == element and fmt.scale.name == scale and fmt.block_shape == block
    assert fmt.scale_rule == rule and (fmt.tensor_scale.name if fmt.tensor_scale else None) == tensor
    assert Fraction(float(np.float32(fmt.amax_floor))) == floor
    assert fmt.kind == ("int" if element == "int8" else "float")


def test_format_lookup_keeps_plain_formats():
    assert fpsim.format("e4m3") is fpsim.PRESETS["e4m3"]
    assert fpsim.format("MXFP8-E4M3") is BLOCK_PRESETS["mxfp8_e4m3"]
    with pytest.raises(ValueError, match="unknown format 'mxfp9'.*block formats: mxfp8_e4m3"):
        fpsim.format("mxfp9")


def test_int8_element_is_the_spec_grid():
    # OCP MX v1.0: 8-bit two's complement with an implicit scale of 2^-6
    int8 = fpsim.format("mxint8").element
    values = sorted({float(v) for v in exact.all_values(int8.grid)})
    assert values == [k / 64 for k in range(-127, 128)]
    assert int8.min == -2 and int8.max == Fraction(127, 64) and int8.emax == 0


# ------------------------------------------------------- against the oracle
@pytest.mark.parametrize("name", SMALL_PRESETS)
@FAST
@given(data=st.data())
def test_quantize_and_encode_match_the_oracle(name, data):
    fmt = fpsim.format(name)
    x = data.draw(fst.block_arrays(fmt), label="x")
    rounding = data.draw(st.sampled_from(DETERMINISTIC), label="rounding")
    want, scales, elements, t = oracle(x, **spec(name), rounding=rounding)
    assert_same(fpsim.quantize(x, name, rounding), want)
    enc = fpsim.encode(x, name, rounding)
    assert_same(fpsim.decode(enc), want)
    assert_codes(enc, fmt, scales, elements, t)


def assert_codes(enc, fmt, scales, elements, t):
    for index, s in scales.items():
        assert enc.scales[index] == exact.encode_value(float(s), fmt.scale), (index, s)
    if fmt.kind == "int":
        want = [int(round(v * 64)) & 0xFF for v in elements.ravel()]
    else:
        want = [exact.encode_value(v, fmt.element) for v in elements.ravel()]
    assert enc.codes.ravel().tolist() == want
    assert (enc.tensor_scale is None) == (fmt.tensor_scale is None)
    if fmt.tensor_scale is not None:
        assert Fraction(float(enc.tensor_scale)) == t


@pytest.mark.parametrize("name", MX_PRESETS)
@pytest.mark.parametrize("rule", POW2_RULES)
@FAST
@given(data=st.data())
def test_scale_rules_match_the_oracle(name, rule, data):
    x = data.draw(fst.block_arrays(name), label="x")
    want, scales, _, _ = oracle(x, **spec(name, rule))
    assert_same(fpsim.quantize(x, name, scale_rule=rule), want)
    enc = fpsim.encode(x, fpsim.format(name).with_rule(rule))
    for index, s in scales.items():
        assert enc.scales[index] == exact.encode_value(float(s), "e8m0")


@pytest.mark.parametrize("name", ["mxfp8_e4m3", "mxint8", "nvfp4", "fp8_block_1x128"])
@FAST
@given(data=st.data())
def test_float64_input_matches_the_oracle(name, data):
    x = data.draw(fst.block_arrays(name, dtype=np.float64,
                                   exponents=st.sampled_from([0, -3, 50, -140, 200, -1000])), label="x")
    rounding = data.draw(st.sampled_from(DETERMINISTIC), label="rounding")
    want, _, _, _ = oracle(x, **spec(name), rounding=rounding)
    got = fpsim.quantize(x, name, rounding)
    assert got.dtype == np.float64
    assert_same(got, want)


def test_nvfp4_elements_on_exact_and_near_ties():
    # Elements placed on E2M1 midpoints of the block's own scale: exact ties where float32
    # holds them, otherwise a float32 ulp away; the oracle decides each from the exact quotient.
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((8, 64)) * 3).astype(np.float32)
    enc = fpsim.encode(x, "nvfp4")
    s = fpsim.decode(enc.scales, "e4m3").astype(np.float64).repeat(16, axis=1) * float(enc.tensor_scale)
    mids = rng.choice([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], size=x.shape) * np.sign(x)
    ties = (mids * s).astype(np.float32)
    ties[:, ::16] = x[:, ::16]  # keep each block's amax (and so its scale)
    for rounding in DETERMINISTIC:
        want, _, _, _ = oracle(ties, **spec("nvfp4"), rounding=rounding)
        assert_same(fpsim.quantize(ties, "nvfp4", rounding), want)


# ------------------------------------------------------------- 2-D blocks
SMALL_2D = BlockFormat("e4m3", "fp32", (4, 8), "nearest", amax_floor=1e-4, name="fp8_block_4x8")


@FAST
@given(data=st.data())
def test_two_dimensional_blocks_match_the_oracle(data):
    x = data.draw(fst.block_arrays(SMALL_2D), label="x")
    floor = Fraction(float(np.float32(1e-4)))
    want, scales, _, _ = oracle(x, "e4m3", "fp32", (4, 8), "nearest", floor=floor)
    assert_same(fpsim.quantize(x, SMALL_2D), want)
    enc = fpsim.encode(x, SMALL_2D)
    assert enc.scales.shape == (-(-x.shape[0] // 4), -(-x.shape[1] // 8))
    assert_same(fpsim.decode(enc), want)


def test_deepseek_weight_blocks_at_full_size():
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((130, 200)) * 0.02).astype(np.float32)
    w[5, 7] = 3.0  # an outlier: only its own 128x128 block gets the large scale
    want, scales, _, _ = oracle(w, **spec("fp8_block_128x128"))
    assert_same(fpsim.quantize(w, "fp8_block_128x128"), want)
    enc = fpsim.encode(w, "fp8_block_128x128")
    assert enc.scales.shape == (2, 2) and enc.scales.dtype == np.uint32
    assert Fraction(float(enc.scales.view(np.float32)[0, 0])) == scales[(0, 0)]
    # DeepSeek-V3's act_quant: s = max(amax, 1e-4) / 448 in FP32
    assert float(enc.scales.view(np.float32)[0, 0]) == float(np.float32(3.0) / np.float32(448))


@pytest.mark.parametrize("name", ["mxfp8_e4m3", "nvfp4"])
def test_axis_argument_blocks_another_axis(name):
    x = (np.random.default_rng(1).standard_normal((40, 6)) * 5).astype(np.float32)
    assert_same(fpsim.quantize(x, name, axis=0), fpsim.quantize(x.T, name).T)
    assert_same(fpsim.quantize(x, name, axis=-2), fpsim.quantize(x.T, name, axis=1).T)
    enc = fpsim.encode(x, name, axis=0)
    assert enc.axis == (0,) and enc.scales.shape[0] == -(-40 // fpsim.format(name).block_size)
    assert_same(fpsim.decode(enc), fpsim.quantize(x, name, axis=0))


def test_axis_tuple_for_two_dimensional_blocks():
    x = (np.random.default_rng(2).standard_normal((9, 3, 5)) * 2).astype(np.float32)
    want, _, _, _ = oracle(x, "e4m3", "fp32", (4, 8), "nearest", floor=Fraction(float(np.float32(1e-4))),
                           axes=(2, 0))
    assert_same(fpsim.quantize(x, SMALL_2D, axis=(2, 0)), want)


@pytest.mark.parametrize("call, message", [
    (lambda x: fpsim.quantize(x, "mxfp4", axis=2), "axis=2 is out of range"),
    (lambda x: fpsim.quantize(x, "mxfp4", axis=(0, 1)), "so axis needs 1 axis"),
    (lambda x: fpsim.quantize(x, "fp8_block_128x128", axis=(1, 1)), "the same axis twice"),
    (lambda x: fpsim.quantize(x[0], "fp8_block_128x128"), "blocks over 2 axes; the input has 1 dimension"),
    (lambda x: fpsim.quantize(np.float32(1.0), "mxfp4"), "got a scalar"),
    (lambda x: fpsim.quantize(x, "mxfp4", scale_rule="round"), "unknown scale_rule 'round'"),
    (lambda x: fpsim.quantize(x, "nvfp4", scale_rule="floor"), "needs a scale format without mantissa"),
    (lambda x: fpsim.quantize(x, "mxfp4", "stochastic", rand_bits=0), "rand_bits must be"),
    (lambda x: fpsim.quantize(x, "mxfp4", seed=1), "apply to rounding='stochastic' only"),
    (lambda x: fpsim.quantize(x, "mxfp4", flush_subnormal_inputs=True), "not defined for block formats"),
    (lambda x: fpsim.quantize(x, "e4m3", axis=0), "axis and scale_rule apply to block formats"),
    (lambda x: BlockFormat("e4m3", "e8m0", 0), "block_size must be a positive int"),
])
def test_bad_arguments_are_refused(call, message):
    x = np.ones((2, 40), dtype=np.float32)
    with pytest.raises((ValueError, TypeError), match=message):
        call(x)
