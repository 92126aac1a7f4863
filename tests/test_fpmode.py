"""Results do not depend on the thread's flush-to-zero mode (torch.set_flush_denormal(True), -ffast-math).

With the CPU's FTZ/DAZ controls on, numpy and torch read subnormal inputs as zero and write subnormal results
as zero. Expected values are computed with the controls off: ml_dtypes' casts (round to nearest even) for
quantize, encode and decode; exact powers of two for the tensor cores; the block formats' and recipes' results
with the controls off (held to their oracles in test_blocks.py and test_recipes.py). The comparisons are of bit
patterns: under DAZ, a subnormal compares equal to zero.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import fpsim
from fpsim.recipes import CurrentScaling

from foundation_helpers import requires_torch, torch

pytestmark = requires_torch

RNG = np.random.default_rng(0)
SUBNORMALS = np.concatenate([RNG.standard_normal(200) * 2.0**-130, [2.0**-149, -2.0**-149, 2.0**-126 * (1 - 2**-23)],
                             RNG.standard_normal(56) * 2.0**-14]).astype(np.float32)   # float32 and float16 ones
ML_DTYPES = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16, "e4m3": ml_dtypes.float8_e4m3fn,
             "e5m2": ml_dtypes.float8_e5m2}


def bits(a) -> bytes:
    a = a.numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
    return np.ascontiguousarray(a).tobytes()


@pytest.fixture
def flushing():
    """The calling thread's flush-to-zero controls on (as torch.set_flush_denormal(True) sets them) for the test."""
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU has no flush-to-zero controls torch can set")
    try:
        assert torch.tensor([2.0**-140]).mul(1.0).item() == 0.0    # they are on: torch flushes
        yield
    finally:
        torch.set_flush_denormal(False)


@pytest.mark.parametrize("name", list(ML_DTYPES))
def test_quantize_encode_decode_of_subnormals_with_flush_to_zero_on(name, flushing):
    fmt, dtype = fpsim.format(name), ML_DTYPES[name]
    torch.set_flush_denormal(False)
    finite = np.isfinite(SUBNORMALS.astype(dtype).astype(np.float32))   # (e4m3 saturates nothing here)
    x = SUBNORMALS[finite]
    want_values = x.astype(dtype).astype(np.float32)
    want_codes = x.astype(dtype).view(np.uint8 if fmt.bits == 8 else np.uint16)
    x64, x_torch, want64 = x.astype(np.float64), torch.from_numpy(x.copy()), want_values.astype(np.float64)
    torch.set_flush_denormal(True)
    assert bits(fpsim.quantize(x, name)) == bits(want_values)
    assert bits(fpsim.quantize(x64, name)) == bits(want64)
    assert bits(fpsim.quantize(x_torch, name)) == bits(want_values)
    assert bits(fpsim.encode(x, name)) == bits(want_codes)
    assert bits(fpsim.decode(want_codes, name)) == bits(want_values)
    assert torch.tensor([2.0**-140]).mul(1.0).item() == 0.0      # and the mode is back as it was


def test_stochastic_rounding_tensor_cores_blocks_and_recipes_with_flush_to_zero_on(flushing):
    torch.set_flush_denormal(False)
    x = SUBNORMALS[:256].reshape(8, 32)
    want = {"stochastic": bits(fpsim.quantize(x, "bf16", rounding="stochastic", seed=7)),
            "nvfp4": bits(fpsim.quantize(x, "nvfp4")), "mxfp8": bits(fpsim.quantize(x, "mxfp8_e4m3")),
            "current scaling": bits(CurrentScaling("e4m3").quantize(x))}
    torch.set_flush_denormal(True)
    assert bits(fpsim.quantize(x, "bf16", rounding="stochastic", seed=7)) == want["stochastic"]
    assert bits(fpsim.quantize(x, "nvfp4")) == want["nvfp4"]
    assert bits(fpsim.quantize(x, "mxfp8_e4m3")) == want["mxfp8"]
    assert bits(CurrentScaling("e4m3").quantize(x)) == want["current scaling"]
    # one product 2^-70 * 2^-70 = 2^-140: an FP32 subnormal, exact, whatever the accumulation
    tc = fpsim.TensorCore("h100", inputs="bf16", output="fp32")
    a, b = np.zeros((1, 16), np.float32), np.zeros((16, 1), np.float32)
    a[0, 0] = b[0, 0] = 2.0**-70                                            # (normal: unchanged by the mode)
    assert bits(tc.matmul(a, b)) == bits(np.array([[2**9]], np.uint32))      # 2^-140 = 2^9 x 2^-149


def test_the_mode_comes_back_after_an_error(flushing):
    with pytest.raises(ValueError):
        fpsim.quantize(np.float32(1.0), "e4m3", rounding="sideways")
    assert torch.tensor([2.0**-140]).mul(1.0).item() == 0.0
