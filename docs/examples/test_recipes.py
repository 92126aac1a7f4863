"""More ways to test your own code against fpsim (docs/testing.md, "Recipes").

Run them with:  pytest docs/examples/test_recipes.py
"""

from fractions import Fraction

import ml_dtypes
import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

import fpsim
import fpsim.strategies as fps
from fpsim.testing import assert_bitwise_equal

SHAPES = st.integers(1, 32)


# 1. A cast that returns bit patterns (uint8 codes), here ml_dtypes' own:
#    integer arrays are read as codes of `fmt`, so codes compare with codes.
@given(fps.arrays("e5m2", SHAPES, dtype=np.float32, elements=fps.rounding_inputs("e5m2", np.float32)))
def test_ml_dtypes_e5m2_codes(x):
    codes = x.astype(ml_dtypes.float8_e5m2).view(np.uint8)
    assert_bitwise_equal(codes, fpsim.encode(x, "e5m2"), fmt="e5m2", inputs=x)


# 2. A torch cast (any device: move the expected values there, or compare on the CPU).
#    PyTorch's float8_e4m3fn cast saturates: fpsim says so with saturate=True.
@given(fps.arrays("e4m3", SHAPES, dtype=np.float32, elements=fps.rounding_inputs("e4m3", np.float32)))
def test_torch_float8_e4m3fn_cast(x):
    got = torch.from_numpy(x).to(torch.float8_e4m3fn)
    assert_bitwise_equal(got, fpsim.quantize(x, "e4m3", saturate=True), fmt="e4m3", inputs=x)


# 3. A float32 dot-product kernel: the classic error bound against the exact result,
#    |d - exact| <= gamma_n * (sum |a_k b_k| + |c|), gamma_n = n u / (1 - n u), n = K + 1 terms.
def dot_fp32(a, b, c):
    """The kernel under test: float32 accumulation (BLAS), then + c in float32."""
    return np.float32(np.dot(a.astype(np.float32), b.astype(np.float32))) + np.float32(c)


@given(fps.dot_problems("e4m3", output_format="fp32"))
def test_dot_fp32_error_bound(problem):
    a, b, c = problem
    got = Fraction(float(dot_fp32(a, b, c)))
    n, u = a.shape[-1] + 1, Fraction(1, 2**24)
    gamma = n * u / (1 - n * u)
    size = sum(abs(Fraction(float(x)) * Fraction(float(y))) for x, y in zip(a, b)) + abs(Fraction(float(c)))
    assert abs(got - problem.exact()) <= gamma * size, problem
