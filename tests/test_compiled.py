"""fpsim.quantize(t, fmt, compile=True): the engine compiled by torch.compile (fpsim/_compiled.py).

Source of truth: the exact oracle (fpsim.exact.round_value on each element) over
dense points around every value of the format, its ties, overflow edge and
specials (tests/foundation_helpers.sweep_points), and over random float64 inputs
at many scales. Each case compiles once (about 10-30 s on the CPU), so the cases
are few and cover both working dtypes, a directed and an odd mode, saturation,
flushing, a format without Inf/NaN, a second length (the recompile with a dynamic
length) and the straight-through gradient.
"""

from __future__ import annotations

import numpy as np
import pytest

from fpsim.formats import PRESETS

from foundation_helpers import assert_same_bits, codable, expected_nan_sign, oracle, random_inputs, sweep_points

torch = pytest.importorskip("torch")
import fpsim  # noqa: E402


def assert_matches_oracle(got, expected, fmt, x):
    """Every bit against the oracle, and each NaN's sign as docs/formats define it (the oracle's NaN is
    unsigned)."""
    got = got.numpy()
    assert_same_bits(got, expected, nan_sign=False, inputs=x)
    nan = np.isnan(got.astype(np.float64))
    assert not (nan & (np.signbit(got) != expected_nan_sign(fmt, np.signbit(x)))).any()


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_e4m3_nearest_even_float32_against_the_oracle():
    fmt = PRESETS["e4m3"]
    x = sweep_points(fmt, np.float32)
    x = x[codable(x, fmt)]
    got = fpsim.quantize(torch.from_numpy(x), fmt, compile=True)
    assert got.dtype == torch.float32
    assert_matches_oracle(got, oracle(x, fmt), fmt, x)


def test_e2m1_up_saturating_two_lengths_and_a_shape_against_the_oracle():
    fmt = PRESETS["e2m1"]
    x = sweep_points(fmt, np.float32)
    x = x[codable(x, fmt)]
    expected = oracle(x, fmt, "up", saturate=True)
    got = fpsim.quantize(torch.from_numpy(x), fmt, "up", saturate=True, compile=True)
    assert_matches_oracle(got, expected, fmt, x)
    part = x[: len(x) // 2 * 2 - 2]  # another length: torch.compile recompiles with a dynamic one
    got = fpsim.quantize(torch.from_numpy(part).reshape(2, -1), fmt, "up", saturate=True, compile=True)
    assert got.shape == (2, len(part) // 2)
    assert_matches_oracle(got.reshape(-1), expected[: len(part)], fmt, part)


def test_e5m2_odd_flushing_float64_against_the_oracle():
    fmt = PRESETS["e5m2"]
    x = random_inputs(3000, np.float64, seed=5)
    x = x[codable(x, fmt)]
    got = fpsim.quantize(torch.from_numpy(x), fmt, "odd", flush_subnormal_outputs=True, compile=True)
    assert got.dtype == torch.float64
    assert_matches_oracle(got, oracle(x, fmt, "odd", flush_subnormal_outputs=True), fmt, x)


def test_straight_through_gradient_as_without_compile():
    x = torch.tensor([0.3, -7.0, 1000.0], requires_grad=True)
    y = fpsim.quantize(x, "e4m3", compile=True)  # the engine of the first test (cached)
    y.sum().backward()
    assert torch.equal(x.grad, torch.ones(3))
    assert torch.equal(y.detach().view(torch.int32), torch.tensor([0.3125, -7.0, float("nan")]).view(torch.int32))


@pytest.mark.parametrize("x, kwargs, error, message", [
    (np.ones(3, dtype=np.float32), {}, TypeError, "applies to torch tensors"),
    ("int", {}, TypeError, "floating-point tensors"),
    ("float", {"rounding": "stochastic", "seed": 1}, ValueError, "deterministic rounding modes"),
    ("float", {"compile": 1}, TypeError, "compile must be True or False"),
])
def test_what_compile_refuses(x, kwargs, error, message):
    if isinstance(x, str):
        x = torch.arange(3) if x == "int" else torch.ones(3)
    kwargs = {"compile": True, **kwargs}
    with pytest.raises(error, match=message):
        fpsim.quantize(x, "e4m3", **kwargs)


def test_block_formats_refuse_compile():
    with pytest.raises(ValueError, match="element formats"):
        fpsim.quantize(torch.ones(32), "mxfp8_e4m3", compile=True)
