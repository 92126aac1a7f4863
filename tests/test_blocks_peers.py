"""Block formats against torchao's MX and NVFP4 code and gfloat's block code.

Sources of expected values: torchao 0.18 (torchao.prototype.mx_formats:
to_mx/to_dtype for MX with ScaleCalculationMode FLOOR, CEIL, EVEN, RCEIL;
nvfp4_quantize for NVFP4 with a per-tensor scale) and gfloat 0.5
(quantize_block with compute_scale_amax, the OCP rule). Both are in the
test extra (torchao pinned in constraints.txt). Where a peer implements the same rule the results must be
bit-identical; where it does not, the tests show the difference and which
side the spec (through the Fraction oracle fpsim.exact_blocks) is on:

- torchao's FLOOR/CEIL/EVEN divide by 2^-126 when they store the scale code
  0 (2^-127), and its RCEIL multiplies by 1 for that code: blocks whose
  scale is 2^-127 (amax below about 2^-119) differ; fpsim and the spec
  divide by 2^-127;
- a block holding Inf: torchao's FLOOR gives it a finite scale (Inf
  saturates to max_elem); the spec and fpsim give NaN;
- RCEIL: torchao's eager fallback computes ceil(log2(descale)) with a
  float32 log2, which rounds to the integer for descales a few ulps above a
  power of two; cuBLAS's rounding (cvt.rp to UE8M0) and fpsim are exact;
- NVFP4: torchao clamps block scales below E4M3's min normal 2^-6 up to
  2^-6 (NVIDIA's definition rounds them to E4M3, subnormal or 0), and it
  computes in FP32 (amax / 6 / s_t and x * (1 / s_t) / s_b, each rounded),
  where NVIDIA's definition rounds the exact quotients once: they differ
  only where a quotient lies within a few FP32 ulps of an E4M3 or E2M1
  rounding boundary, which the tests check for every difference found;
  for an all-zero tensor torchao's tensor scale is 0, fpsim's 1;
- gfloat's MXINT8 element is the full two's-complement range: it rounds to
  -2 (code 0x80) where the spec's clamp to the largest magnitude, as in
  microsoft/microxcaling and fpsim, stops at -127/64.
"""

from __future__ import annotations

import warnings
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fpsim
import fpsim.strategies as fst
from fpsim import exact, exact_blocks

torch = pytest.importorskip("torch")
warnings.filterwarnings("ignore", message=".*Enum subclass.*")
mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
from torchao.prototype.mx_formats.config import ScaleCalculationMode  # noqa: E402
from torchao.prototype.mx_formats.constants import DTYPE_FP6_E2M3, DTYPE_FP6_E3M2  # noqa: E402
from torchao.prototype.mx_formats.kernels import unpack_uint4  # noqa: E402
from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize, per_tensor_amax_to_scale  # noqa: E402

TORCHAO_DTYPES = {"mxfp8_e4m3": torch.float8_e4m3fn, "mxfp8_e5m2": torch.float8_e5m2,
                  "mxfp6_e3m2": DTYPE_FP6_E3M2, "mxfp6_e2m3": DTYPE_FP6_E2M3, "mxfp4": torch.float4_e2m1fn_x2}
MODES = {"floor": ScaleCalculationMode.FLOOR, "ceil": ScaleCalculationMode.CEIL,
         "even": ScaleCalculationMode.EVEN, "rceil": ScaleCalculationMode.RCEIL}
SETTINGS = settings(max_examples=20, deadline=None, report_multiple_bugs=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def torchao_mx(x: np.ndarray, name: str, rule: str):
    """(scale codes, element codes) from torchao's to_mx."""
    scales, data = mx.to_mx(torch.from_numpy(x), TORCHAO_DTYPES[name], 32, MODES[rule])
    if name == "mxfp4":
        codes = unpack_uint4(data.contiguous().view(torch.uint8))
    else:
        codes = data.view(torch.uint8)
    return scales.view(torch.uint8).numpy(), codes.numpy().reshape(x.shape)


def mx_arrays(name):
    shape = st.tuples(st.integers(1, 3), st.sampled_from([32, 64]))
    return fst.block_arrays(name, shape=shape, allow_nan=False, allow_infinity=False)


@pytest.mark.parametrize("name", list(TORCHAO_DTYPES))
@pytest.mark.parametrize("rule", list(MODES))
@SETTINGS
@given(data=st.data())
def test_mx_matches_torchao_where_it_follows_the_rule(name, rule, data):
    x = data.draw(mx_arrays(name), label="x")
    scales, codes = torchao_mx(x, name, rule)
    enc = fpsim.encode(x, name, scale_rule=rule)
    same_rule = enc.scales != 0  # torchao's arithmetic differs for the scale 2^-127
    if rule == "rceil":  # torchao's log2 in float32 misses descales a few ulps above a power of two
        descale = np.abs(x).reshape(x.shape[0], -1, 32).max(axis=-1) / np.float32(fpsim.format(name).element.max)
        m, _ = np.frexp(descale.astype(np.float64))
        same_rule &= ~((m > 0.5) & (m < 0.5 + 2.0**-20))
    assert (scales == enc.scales)[same_rule].all()
    assert (codes == enc.codes)[np.repeat(same_rule, 32, axis=-1)].all()


def test_torchao_rceil_fallback_misses_descales_just_above_a_power_of_two():
    # cuBLAS: 2^ceil(log2(fl32(amax / max_elem))) (cvt.rp.satfinite.ue8m0, exact); descale here is
    # 2^100 * (1 + 2^-23), so the scale is 2^101; torchao's eager fallback takes ceil(log2()) in float32,
    # where log2 rounds to 100
    x = np.zeros((1, 32), dtype=np.float32)
    x[0, 0] = np.float32(3.5494219e31)
    descale = x[0, 0] / np.float32(28)
    assert np.frexp(np.float64(descale))[0] == 0.5 + 2.0**-24
    scales, _ = torchao_mx(x, "mxfp6_e3m2", "rceil")
    assert fpsim.encode(x, "mxfp6_e3m2", scale_rule="rceil").scales.tolist() == [[127 + 101]]
    assert exact_blocks.block_scale(Fraction(float(x[0, 0])), "e3m2", "e8m0", "rceil") == Fraction(2) ** 101
    assert scales.tolist() == [[127 + 100]]


def test_torchao_divides_by_2_to_minus_126_where_the_scale_is_2_to_minus_127():
    # amax 2^-125: floor(-125) - 8 = -133, clamped to -127 (code 0); 2^-125 / 2^-127 = 4
    x = np.zeros((1, 32), dtype=np.float32)
    x[0, 0] = 2.0**-125
    scales, codes = torchao_mx(x, "mxfp8_e4m3", "floor")
    enc = fpsim.encode(x, "mxfp8_e4m3")
    assert scales.tolist() == enc.scales.tolist() == [[0]]
    spec = exact_blocks.quantize_block(x[0], "e4m3", "e8m0", "floor")
    assert spec[1][0] == 4.0 == fpsim.decode(enc.codes[0, :1], "e4m3")[0]  # fpsim follows the spec
    assert fpsim.decode(codes[0, :1], "e4m3")[0] == 2.0  # torchao: 2^-125 / 2^-126


def test_torchao_gives_a_block_holding_inf_a_finite_scale():
    x = np.ones((1, 32), dtype=np.float32)
    x[0, 1] = np.inf
    scales, _ = torchao_mx(x, "mxfp8_e4m3", "floor")
    assert scales[0, 0] != 0xFF and fpsim.encode(x, "mxfp8_e4m3").scales[0, 0] == 0xFF
    assert np.isnan(exact_blocks.quantize_block(x[0], "e4m3", "e8m0", "floor")[0])


# ------------------------------------------------------------------ NVFP4
def torchao_nvfp4(x: np.ndarray):
    t = torch.from_numpy(x)
    tensor_scale = per_tensor_amax_to_scale(t.abs().max())
    scales, data = nvfp4_quantize(t, 16, tensor_scale)
    return float(tensor_scale), scales.view(torch.uint8).numpy(), unpack_uint4(data.contiguous()).numpy()


def near_boundary(q: Fraction, fmt, ulps=8) -> bool:
    """Whether q lies within `ulps` FP32 ulps of a value or midpoint of fmt."""
    finer = fpsim.Format(fmt.exp_bits, fmt.man_bits + 1, fmt.bias, nan="none")
    a = abs(q)
    if a > 2 * fmt.max:
        return False
    lo, hi = exact.neighbours(finer, a)
    ulp = Fraction(2) ** (exact.floor_log2(a) - 23) if a else Fraction(0)
    return min(a - lo, hi - a) <= ulps * ulp


@SETTINGS
@given(data=st.data())
def test_nvfp4_matches_torchao_up_to_fp32_arithmetic_near_boundaries(data):
    x = data.draw(fst.block_arrays("nvfp4", shape=st.tuples(st.integers(1, 3), st.sampled_from([16, 48])),
                                   allow_nan=False, allow_infinity=False, exponents=st.integers(-20, 20)),
                  label="x")
    t, scales, codes = torchao_nvfp4(x)
    enc = fpsim.encode(x, "nvfp4")
    if t == 0:  # an all-zero tensor: torchao's tensor scale is 0, fpsim's 1 (every element is 0 either way)
        assert float(enc.tensor_scale) == 1.0 and not enc.codes.any()
        return
    assert float(enc.tensor_scale) == t  # fl32(amax / 2688): one rounding either way
    e4m3, e2m1 = fpsim.format("e4m3"), fpsim.format("e2m1")
    ours = fpsim.decode(enc.scales, "e4m3").astype(np.float64)
    clamped = ours < 2**-6  # torchao raises these to 2^-6
    amax = np.abs(x).reshape(x.shape[0], -1, 16).max(axis=-1)
    for i in zip(*np.nonzero((scales != enc.scales) & ~clamped)):
        assert near_boundary(Fraction(float(amax[i])) / 6 / Fraction(t), e4m3), i
    same = np.repeat((scales == enc.scales) & ~clamped, 16, axis=-1)
    for i in zip(*np.nonzero((codes != enc.codes) & same)):
        divisor = Fraction(float(ours[i[0], i[1] // 16])) * Fraction(t)
        assert near_boundary(Fraction(float(x[i])) / divisor, e2m1), (i, x[i], divisor)


def test_nvfp4_agrees_with_torchao_on_ordinary_data():
    x = (np.random.default_rng(0).standard_normal((256, 256)) * 3).astype(np.float32)
    t, scales, codes = torchao_nvfp4(x)
    enc = fpsim.encode(x, "nvfp4")
    assert float(enc.tensor_scale) == t
    assert (scales == enc.scales).all() and (codes == enc.codes).all()


# ------------------------------------------------------------------ gfloat
gfloat = pytest.importorskip("gfloat")
gfloat_formats = pytest.importorskip("gfloat.formats")
GFLOAT = {"mxfp8_e4m3": "format_info_mxfp8_e4m3", "mxfp8_e5m2": "format_info_mxfp8_e5m2",
          "mxfp6_e3m2": "format_info_mxfp6_e3m2", "mxfp6_e2m3": "format_info_mxfp6_e2m3",
          "mxfp4": "format_info_mxfp4_e2m1", "mxint8": "format_info_mxint8"}


@pytest.mark.parametrize("name", list(GFLOAT))
@settings(max_examples=25, deadline=None, report_multiple_bugs=False)
@given(data=st.data())
def test_mx_matches_gfloat_quantize_block(name, data):
    # gfloat's compute_scale_amax is the OCP rule, clipped to E8M0's range (the spec: NaN above it,
    # which float32 input never reaches); elements round to nearest even with saturation
    block = data.draw(fst.block_arrays(name, shape=(32,), allow_nan=False, allow_infinity=False), label="x")
    info = getattr(gfloat_formats, GFLOAT[name])
    want = gfloat.quantize_block(info, block.astype(np.float64), gfloat.compute_scale_amax)
    got = fpsim.quantize(block, name).astype(np.float64)
    if name == "mxint8":  # gfloat rounds to -2 (0x80) where the spec's clamp stops at -127/64
        amax = max(abs(Fraction(float(v))) for v in block)
        scale = float(exact_blocks.block_scale(amax, "int8", "e8m0", "floor"))
        minus_two = want == -2 * scale
        assert (got[minus_two] == -127 / 64 * scale).all()
        want = np.where(minus_two, got, want)
    same = (got == want) & (np.signbit(got) == np.signbit(want))
    assert same.all(), (block[~same], got[~same], want[~same])


def test_gfloat_mxint8_reaches_minus_two():
    # X = 2^floor(log2(1.9999999)) = 1; -1.9999999 * 64 = -127.99999 rounds to -128: gfloat keeps it
    # (two's complement's -2), the spec's clamp to the largest magnitude (microxcaling) gives -127/64
    block = np.zeros(32, dtype=np.float32)
    block[0] = np.float32(-1.9999999)
    want = gfloat.quantize_block(gfloat_formats.format_info_mxint8, block.astype(np.float64),
                                 gfloat.compute_scale_amax)
    assert want[0] == -2.0
    assert fpsim.quantize(block, "mxint8")[0] == -127 / 64
    assert exact_blocks.quantize_block(block, "int8", "e8m0", "floor")[2][0] == -127 / 64
