"""Capturing Blackwell's block-scaled GEMMs (torch scaled_mm, MXFP8/MXFP4/NVFP4) and checking them.

Sources of truth:
- the scale layout and FP4 packing: torchao's own MX code (`to_blocked`, `from_blocked`,
  `pack_uint4`, `unpack_uint4`, `f4_unpacked_to_f32`), which feeds the same cuBLAS kernels;
- torch's float8 dtypes for the element and scale codes;
- exact integer arithmetic for the validation of a block-scaled case: with small integer
  elements and power-of-two scales every product and sum is exact, so any correct model of
  D = (A * scale_A)(B * scale_B) returns the integer matmul of the scaled values.
No GPU here: on the CPU the scaled calls must be recorded as skips with torch's reason.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fpsim
from fpsim.blocks import BLOCK_PRESETS
from fpsim.tensorcore import scaled_operands
from fpsim.tensorcore.captures import Capture, CaptureCase, f32_bits, load_capture, new_meta, save_capture
from fpsim.tensorcore.library_capture import BLOCK_SCALED, library_cases
from fpsim.tensorcore.validate import validate_case

mx_utils = pytest.importorskip("torchao.prototype.mx_formats.utils")
mx_kernels = pytest.importorskip("torchao.prototype.mx_formats.kernels")


@pytest.mark.parametrize("shape", [(1, 1), (32, 2), (128, 4), (130, 5), (256, 33)])
def test_swizzled_scales_are_torchaos_blocked_layout(shape):
    codes = np.random.default_rng(sum(shape)).integers(0, 255, shape).astype(np.uint8)
    want = mx_utils.to_blocked(torch.from_numpy(codes)).numpy().ravel()
    np.testing.assert_array_equal(scaled_operands.swizzled(codes), want)


def test_fp4_packing_is_torchaos():
    codes = np.random.default_rng(0).integers(0, 16, (8, 64)).astype(np.uint8)
    want = mx_kernels.pack_uint4(torch.from_numpy(codes)).numpy()
    np.testing.assert_array_equal(scaled_operands.packed_fp4(codes), want)
    with pytest.raises(ValueError, match="two to a byte"):
        scaled_operands.packed_fp4(codes[:, :3])


def _decoded(t, fmt):
    """What the scaled_mm tensors hold, read back with torchao's and torch's decoders."""
    if fmt.element.bits == 4:
        return mx_kernels.f4_unpacked_to_f32(mx_kernels.unpack_uint4(t.view(torch.uint8).contiguous())).double()
    return t.double()


@pytest.mark.parametrize("name", sorted(BLOCK_SCALED))
def test_operands_hold_the_values_and_scales_cublas_should_read(name):
    rng = np.random.default_rng(1)
    fmt = BLOCK_PRESETS[name]
    m, k, n = 32, 128, 16
    values = element_values(fmt.element.name)
    a = rng.choice(values, (m, k))
    b = rng.choice(values, (k, n))
    scale_values = np.exp2(np.arange(-3.0, 4.0)) if fmt.scale.name == "e8m0" else np.array([0.125, 0.75, 1.0, 3.5, 8.0])
    sa = rng.choice(scale_values, (m, k // fmt.block_size))
    sb = rng.choice(scale_values, (k // fmt.block_size, n))
    A, B, SA, SB = scaled_operands.operands(torch, a, b, sa, sb, fmt, "cpu")
    assert B.stride()[0] == 1  # B column-major, as scaled_mm wants it
    np.testing.assert_array_equal(_decoded(A, fmt).numpy(), a)
    np.testing.assert_array_equal(_decoded(B.t(), fmt).numpy(), b.T)
    for got, want in ((SA, sa), (SB, sb.T)):
        rows, cols = want.shape
        back = mx_utils.from_blocked(got.view(torch.uint8), rows, cols).view(fmt.scale.torch_dtype)
        np.testing.assert_array_equal(back.double().numpy(), want)


def element_values(name):
    """Every finite value of an element format: the decode of all its codes (inputs only; the check
    is torch's and torchao's reading of the tensors built from them)."""
    fmt = fpsim.format(name)
    values = np.asarray(fpsim.decode(np.arange(1 << fmt.bits), fmt), dtype=np.float64)
    return values[np.isfinite(values)]


def _integer_case(name="mx_case"):
    """A block-scaled matmul whose exact result is an integer matmul (every step exact)."""
    rng = np.random.default_rng(2)
    m, k, n = 4, 64, 3
    a = rng.integers(-2, 3, (m, k)).astype(np.float64)
    b = rng.integers(-2, 3, (k, n)).astype(np.float64)
    sa = np.exp2(rng.integers(0, 3, (m, k // 32))).astype(np.float64)
    sb = np.exp2(rng.integers(0, 3, (k // 32, n))).astype(np.float64)
    d = (a * np.repeat(sa, 32, axis=1)) @ (b * np.repeat(sb, 32, axis=0))
    meta = {"name": name, "kind": "matmul", "level": "library", "inputs": "mxfp8_e4m3", "c_format": None,
            "output": "fp32", "k": k, "instruction": "torch.nn.functional.scaled_mm", "flags": {}, "notes": ""}
    return CaptureCase(meta, f32_bits(a), f32_bits(b), None, f32_bits(d), None, f32_bits(sa), f32_bits(sb))


def test_a_block_scaled_case_round_trips_and_validates_with_its_scales(tmp_path):
    path = save_capture(Capture(new_meta("NVIDIA B200"), [_integer_case()]), tmp_path / "b200.npz")
    case = load_capture(path).case("mx_case")
    np.testing.assert_array_equal(case.scale_b, _integer_case().scale_b)
    result = validate_case(case, "b200")
    assert result.rows == 12 and result.matched == 12  # every element of D
    # the scales matter: the same case with its scales dropped is wrong on most rows
    unscaled = CaptureCase(case.meta, case.a, case.b, None, case.d, None, f32_bits(np.ones((4, 2))),
                           f32_bits(np.ones((2, 3))))
    assert validate_case(unscaled, "b200").matched < 6


def test_block_scaled_cases_with_bad_scales_are_refused():
    good = _integer_case()
    with pytest.raises(ValueError, match="missing array 'scale_b'"):
        CaptureCase(good.meta, good.a, good.b, None, good.d, None, good.scale_a, None).validate()
    with pytest.raises(ValueError, match=r"scale_a.*shape \(4, 1\), expected \(4, 2\)"):
        CaptureCase(good.meta, good.a, good.b, None, good.d, None, good.scale_a[:, :1], good.scale_b).validate()
    with pytest.raises(ValueError, match="scale_a value 3.0 .* not representable in e8m0"):
        CaptureCase(good.meta, good.a, good.b, None, good.d, None, f32_bits(np.full((4, 2), 3.0)),
                    good.scale_b).validate()
    plain = dict(good.meta, inputs="e4m3")
    with pytest.raises(ValueError, match="belong to block formats"):
        CaptureCase(plain, good.a, good.b, None, good.d, None, good.scale_a, good.scale_b).validate()


def test_without_a_block_scaled_gemm_the_calls_are_skips_with_torchs_reason():
    seen = {}
    for what, item in library_cases(0, tuple(BLOCK_SCALED), ks=(64,), dev="cpu"):
        seen[item["case"] if what != "case" else item.name] = (what, item)
    assert set(seen) == {f"torch_scaled_mm_{f}_{out}_k64" for f in BLOCK_SCALED for out in ("fp32", "bf16")}
    for what, item in seen.values():
        assert what == "skip" and item["reason"].startswith("torch.nn.functional.scaled_mm: ")
