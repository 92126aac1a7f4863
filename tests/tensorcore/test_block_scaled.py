"""Block-scaled MMAs (Blackwell kind::mxf8f6f4, mxf4, mxf4nvf4) in the TensorCore model.

Sources of expected values:
- the PTX ISA ("Block Scaling for mma.sync"): D = (A * scale_A)(B * scale_B) + C with one scale
  per 32 elements of K (16 for mxf4nvf4 with .ue4m3 scales), the instruction shapes m16n8k32
  (mxf8f6f4) and m16n8k64 (mxf4, mxf4nvf4) and the instruction syntax;
- exact sums on fractions of the decoded element and scale values (fpsim.exact_blocks' decoded
  blocks, Fraction arithmetic), rounded once to binary32 nearest-even by fpsim.exact.round_value:
  the model's documented accumulator (the B200 FP8 path's) where it claims exactness, i.e. where
  every scaled product and c lie within its 31-bit window (inputs built so below).
No GPU capture of these instructions exists yet: the model is marked NOT validated, and these
tests check the semantics it claims, not the hardware.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

import fpsim
from fpsim import exact
from fpsim.tensorcore import devices

RNG = np.random.default_rng(14)


def element_values(fmt_name, shape, lo=-2, hi=2):
    """Random element values of a format with exponents in [lo, hi] (so products stay in the window)."""
    values = [v for v in exact.all_values(fmt_name) if v == v and v != 0 and lo <= exact.floor_log2(Fraction(abs(v))) <= hi]
    return RNG.choice(values, size=shape)


def pow2_scales(shape, lo=-2, hi=2):
    return np.ldexp(1.0, RNG.integers(lo, hi + 1, size=shape))


def exact_dot(a, sa, b, sb, c, block):
    """sum_k a_k sa_{k // block} b_k sb_{k // block} + c, on fractions."""
    total = Fraction(float(c))
    for k in range(a.shape[-1]):
        total += (Fraction(float(a[k])) * Fraction(float(sa[k // block]))
                  * Fraction(float(b[k])) * Fraction(float(sb[k // block])))
    return total


def round_fp32(v: Fraction) -> float:
    return exact.round_value(v, "fp32", "nearest_even")


@pytest.mark.parametrize("inputs, inputs_b, k", [("mxfp8_e4m3", None, 32), ("mxfp8_e5m2", None, 32),
                                                  ("mxfp6_e3m2", None, 32), ("mxfp6_e2m3", None, 32),
                                                  ("mxfp4", None, 64), ("mxfp8_e4m3", "mxfp4", 32)])
def test_one_instruction_is_the_exact_scaled_sum_rounded_once(inputs, inputs_b, k):
    tc = fpsim.TensorCore("b200", inputs, "fp32", inputs_b=inputs_b)
    assert tc.params.k == k  # PTX: m16n8k32 for mxf8f6f4 (A and B mixed too), m16n8k64 for mxf4
    fa, fb = fpsim.format(inputs), fpsim.format(inputs_b or inputs)
    rows = 20
    a = element_values(fa.element.name, (rows, k))
    b = element_values(fb.element.name, (rows, k))
    sa, sb = pow2_scales((rows, k // 32)), pow2_scales((rows, k // 32))
    c = np.array([round_fp32(Fraction(int(n), 64)) for n in RNG.integers(-2000, 2000, rows)])
    got = tc.dot(a, b, c, scale_a=sa, scale_b=sb)
    want = [round_fp32(exact_dot(a[i], sa[i], b[i], sb[i], c[i], 32)) for i in range(rows)]
    assert got.tolist() == want


def test_nvfp4_scales_are_e4m3_per_16_elements():
    tc = fpsim.TensorCore("b200", "nvfp4", "fp32")
    assert tc.params.k == 64 and devices.instruction("b200", "nvfp4", "fp32").scaling.block == 16
    rows = 20
    a, b = element_values("e2m1", (rows, 64), -1, 2), element_values("e2m1", (rows, 64), -1, 2)
    e4m3 = [v for v in exact.all_values("e4m3") if v == v and 0.25 <= v <= 4]  # not powers of two
    sa, sb = RNG.choice(e4m3, (rows, 4)), RNG.choice(e4m3, (rows, 4))
    got = tc.dot(a, b, scale_a=sa, scale_b=sb)
    want = [round_fp32(exact_dot(a[i], sa[i], b[i], sb[i], 0.0, 16)) for i in range(rows)]
    assert got.tolist() == want


def test_instructions_chain_over_k_with_one_rounding_each():
    # K = 96: three m16n8k32 instructions, each result rounded to binary32 and taken as the next C
    tc = fpsim.TensorCore("b200", "mxfp8_e4m3", "fp32")
    a, b = element_values("e4m3", (8, 96)), element_values("e4m3", (8, 96))
    sa, sb = pow2_scales((8, 3)), pow2_scales((8, 3))
    got = tc.dot(a, b, scale_a=sa, scale_b=sb)
    for i in range(8):
        d = 0.0
        for j in range(3):
            ks = slice(32 * j, 32 * (j + 1))
            d = round_fp32(exact_dot(a[i, ks], sa[i, j:j + 1], b[i, ks], sb[i, j:j + 1], d, 32))
        assert got[i] == d


def test_matmul_takes_scale_b_along_k_by_n_and_agrees_with_dot():
    tc = fpsim.TensorCore("b200", "mxfp4", "fp32")
    A, B = element_values("e2m1", (3, 64), -1, 2), element_values("e2m1", (64, 5), -1, 2)
    sa, sb = pow2_scales((3, 2), -8, 8), pow2_scales((2, 5), -8, 8)
    D = tc.matmul(A, B, scale_a=sa, scale_b=sb)
    for i in range(3):
        for j in range(5):
            assert D[i, j] == round_fp32(exact_dot(A[i], sa[i], B[:, j], sb[:, j], 0.0, 32))


def test_large_e8m0_scales_beyond_float32_products():
    # scales 2^100 * 2^-120: each scaled product is far outside the elements' range, the sum is not
    tc = fpsim.TensorCore("b200", "mxfp8_e4m3", "fp32")
    a, b = element_values("e4m3", (4, 32)), element_values("e4m3", (4, 32))
    sa, sb = np.full((4, 1), 2.0**100), np.full((4, 1), 2.0**-120)
    got = tc.dot(a, b, scale_a=sa, scale_b=sb)
    assert got.tolist() == [round_fp32(exact_dot(a[i], sa[i], b[i], sb[i], 0.0, 32)) for i in range(4)]


def test_block_scaled_paths_are_marked_not_validated():
    tc = fpsim.TensorCore("b200", "mxfp8_e4m3", "fp32")
    assert tc.unvalidated and "not yet validated" in tc.unvalidated
    assert "NOT YET VALIDATED" in repr(tc)
    assert all(devices.unvalidated("b200", name, "fp32") for name in devices.BLOCK_INPUTS)
    assert devices.unvalidated("b200", "e4m3", "fp32") is None
    assert fpsim.TensorCore("h100", "e4m3", "fp32").unvalidated is None


def test_ptx_of_the_block_scaled_instructions():
    # PTX ISA, mma with .block_scale: shape, layouts, kind, block_scale, scale_vec, types, stype
    found = {(i.inputs, i.k): i for i in devices.INSTRUCTIONS if i.block_kind}
    assert found[("mxfp8_e4m3", 32)].ptx("fp32") == (
        "mma.sync.aligned.m16n8k32.row.col.kind::mxf8f6f4.block_scale.scale_vec::1X.f32.e4m3.e4m3.f32.ue8m0")
    assert found[("mxfp4", 64)].ptx("fp32") == (
        "mma.sync.aligned.m16n8k64.row.col.kind::mxf4.block_scale.scale_vec::2X.f32.e2m1.e2m1.f32.ue8m0")
    assert found[("nvfp4", 64)].ptx("fp32") == (
        "mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X.f32.e2m1.e2m1.f32.ue4m3")
    assert found[("mxfp4", 32)].block_kind == "mxf8f6f4"
    assert all(i.generations == ("blackwell",) for i in found.values())


@pytest.mark.parametrize("call, message", [
    (lambda tc, a, s: tc.dot(a, a), "mxfp8_e4m3 inputs need scale_a: one e8m0 scale per 32"),
    (lambda tc, a, s: tc.dot(a, a, scale_a=s, scale_b=s[:, :0]), r"scale_b must have shape \(2, 1\)"),
    (lambda tc, a, s: tc.dot(a, a, scale_a=s * 3, scale_b=s), "is not a e8m0 value"),
    (lambda tc, a, s: tc.dot(a[:, :16], a[:, :16], scale_a=s, scale_b=s), "K = 16 is not a multiple"),
    (lambda tc, a, s: fpsim.TensorCore("h100", "e4m3", "fp32").dot(a, a, scale_a=s, scale_b=s),
     "scale_a and scale_b belong to block formats"),
    (lambda tc, a, s: fpsim.TensorCore("b200", "nvfp4", "fp32").dot(
        np.ones((1, 64)), np.ones((1, 64)), scale_a=-np.ones((1, 4)), scale_b=np.ones((1, 4))), "negative scale"),
    (lambda tc, a, s: fpsim.TensorCore("b200", "nvfp4", "fp32", inputs_b="mxfp4"), "mixed input formats"),
    (lambda tc, a, s: fpsim.TensorCore("h100", "mxfp8_e4m3", "fp32"), "do not support mxfp8_e4m3"),
])
def test_bad_block_arguments_are_refused(call, message):
    tc = fpsim.TensorCore("b200", "mxfp8_e4m3", "fp32")
    with pytest.raises(ValueError, match=message):
        call(tc, np.ones((2, 32)), np.ones((2, 1)))


def test_torch_tensors_give_the_same_bits():
    torch = pytest.importorskip("torch")
    tc = fpsim.TensorCore("b200", "nvfp4", "fp32")
    a, b = element_values("e2m1", (3, 64), -1, 2), element_values("e2m1", (3, 64), -1, 2)
    sa, sb = np.full((3, 4), 0.375), np.full((3, 4), 1.5)
    want = tc.dot(a, b, scale_a=sa, scale_b=sb)
    got = tc.dot(*(torch.from_numpy(v) for v in (a, b)), scale_a=torch.from_numpy(sa), scale_b=torch.from_numpy(sb))
    assert isinstance(got, torch.Tensor) and got.numpy().tolist() == want.tolist()


@pytest.mark.parametrize("inputs", devices.BLOCK_INPUTS)
def test_zero_rows_give_positive_zero(inputs):
    # as every other modelled data path (test_model.py): sums of zeros of any sign are +0
    tc = fpsim.TensorCore("b200", inputs, "fp32")
    k, block = tc.params.k, fpsim.format(inputs).block_size
    a = np.zeros((2, k))
    a[0, ::2] = -0.0
    a[1] = -0.0
    s = np.ones((2, k // block))
    d = tc.dot(a, np.ones_like(a), np.array([-0.0, 0.0]), scale_a=s, scale_b=s)
    assert np.all(d == 0) and not np.signbit(d).any()
