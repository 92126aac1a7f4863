"""Capturing Blackwell's block-scaled products and checking them: the GEMMs of torch's scaled_mm
(MXFP8/MXFP4/NVFP4, library level) and the block-scaled mma.sync of sm_120a (instruction level).

Sources of truth:
- the scale layout and FP4 packing of scaled_mm: torchao's own MX code (`to_blocked`,
  `from_blocked`, `pack_uint4`, `unpack_uint4`, `f4_unpacked_to_f32`), which feeds the same
  cuBLAS kernels; torch's float8 dtypes for the element and scale codes;
- the register layouts of the block-scaled mma.sync: CUTLASS's SM120 MMA traits (CuTe layouts
  ALayout, BLayout, SFALayout, SFBLayout of SM120_16x8x64_TN_VS), evaluated here from their
  shapes and strides;
- exact integer arithmetic: with small integer elements and power-of-two scales every product
  and sum is exact, so any correct model of D = (A * scale_A)(B * scale_B) + C returns the
  integer result.
No GPU here: on the CPU the scaled_mm calls must be recorded as skips with torch's reason, and
the instruction-level path runs on fpsim's model (simulate), where a launcher that reads the
scales from the wrong lanes must fail the self-check.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fpsim
from fpsim.blocks import BLOCK_PRESETS
from fpsim.tensorcore import fragments as fr
from fpsim.tensorcore import gpu_capture as gc
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


# ------------------------------------------------- block-scaled mma.sync (sm_120a)
def cute_layout(thread_shape, thread_stride, value_shape, value_stride, threads=32):
    """Index of (thread, value) in a CuTe layout ((T...), (V...)) -> (...) (colexicographic)."""
    def offsets(shape, stride, n):
        out = []
        for i in range(n):
            total, rest = 0, i
            for size, step in zip(shape, stride):
                total += (rest % size) * step
                rest //= size
            out.append(total)
        return np.array(out)
    values = int(np.prod(value_shape))
    return offsets(thread_shape, thread_stride, threads)[:, None] + offsets(value_shape, value_stride, values)[None, :]


def test_fp4_k64_fragments_are_cutlass_sm120_layouts():
    # ALayout (T32,V32) -> (M16,K64): ((4,8),(8,2,2)) : ((128,1),(16,8,512)), index m + 16 k
    a = cute_layout((4, 8), (128, 1), (8, 2, 2), (16, 8, 512))
    op = fr.frag_a(64, 4)
    np.testing.assert_array_equal(op.rows, a % 16)
    np.testing.assert_array_equal(op.cols, a // 16)
    # BLayout (T32,V16) -> (N8,K64): ((4,8),(8,2)) : ((64,1),(8,256)), index n + 8 k
    b = cute_layout((4, 8), (64, 1), (8, 2), (8, 256))
    op = fr.frag_b(64, 4)
    np.testing.assert_array_equal(op.rows, b // 8)
    np.testing.assert_array_equal(op.cols, b % 8)


def test_scale_lanes_are_cutlass_sm120_sfa_sfb_layouts():
    # SFALayout (T32,V64) -> (M16,K64): ((2,2,8),64) : ((8,0,1),16); SFBLayout ((4,8),64) : ((0,1),8)
    sfa = cute_layout((2, 2, 8), (8, 0, 1), (64,), (16,))
    assert (sfa % 16 == sfa[:, :1] % 16).all()          # each lane: one row of A, every k
    np.testing.assert_array_equal(fr.scale_rows_a(), sfa[:, 0] % 16)
    sfb = cute_layout((4, 8), (0, 1), (64,), (8,))
    np.testing.assert_array_equal(fr.scale_cols_b(), sfb[:, 0] % 8)
    # a row's scales for the blocks of K are bytes 0, 1, ... of the lane's register
    codes = np.arange(16 * 4, dtype=np.uint32).reshape(1, 16, 4)
    regs = fr.pack_scales(codes, fr.scale_rows_a())
    assert regs[0, 5, 0] == (codes[0, 9] << np.arange(0, 32, 8, dtype=np.uint32)).sum()  # lane 5: row 9
    np.testing.assert_array_equal(fr.unpack_scales(regs, fr.scale_rows_a(), 16, 4), codes)


SCALED_SPECS = [s for s in gc.MMA_SPECS if s.scaling]


@pytest.mark.parametrize("spec", SCALED_SPECS, ids=lambda s: s.kernel)
def test_simulated_block_scaled_capture_passes_its_self_check_and_validates(spec, tmp_path):
    case = gc.capture_instruction_case(spec, 32, 0, gc.simulated_launcher)
    assert case.meta["self_check"]["passed"] and case.scale_a.shape == (case.rows, spec.blocks)
    back = load_capture(save_capture(Capture(new_meta("simulation"), [case]), tmp_path / "c.npz")).case(spec.kernel)
    result = validate_case(back, "blackwell")
    assert result.matched == result.rows == 64 + 32


@pytest.mark.parametrize("spec", SCALED_SPECS, ids=lambda s: s.kernel)
def test_a_gpu_reading_scales_from_other_lanes_fails_the_self_check(spec):
    lanes = np.arange(32)
    swapped = lanes.copy()
    swapped[1::4], swapped[2::4] = lanes[2::4], lanes[1::4]   # row g + 8 read from row g's lane

    def misreading(spec, a_regs, b_words, c_regs):
        a_regs = a_regs.copy()
        a_regs[:, :, -1] = a_regs[:, swapped, -1]
        return gc.simulated_launcher(spec, a_regs, b_words, c_regs)

    with pytest.raises(gc.SelfCheckError, match="self-check failed"):
        gc.capture_instruction_case(spec, 0, 0, misreading)


def test_block_scaled_mma_runs_on_sm120_only():
    for cc in ((10, 0), (9, 0)):
        chosen, skipped = gc._specs_for("mma", ("mxfp8_e4m3", "nvfp4", "mxfp4"), cc)
        assert not chosen and len(skipped) == 3
    chosen, skipped = gc._specs_for("mma", ("mxfp8_e4m3", "nvfp4", "mxfp4"), (10, 0))
    assert "needs sm_120a" in skipped[0]["reason"]
    chosen, _ = gc._specs_for("mma", ("mxfp8_e4m3", "nvfp4", "mxfp4"), (12, 0))
    assert sorted(s.kernel for s in chosen) == sorted(s.kernel for s in SCALED_SPECS if s.inputs != "mxfp8_e5m2")
