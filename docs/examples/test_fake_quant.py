"""Testing a user's own cast against fpsim with hypothesis, as in docs/testing.md.

Run it with:  pytest docs/examples/test_fake_quant.py
"""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import fpsim
import fpsim.strategies as fps
from fpsim.testing import assert_bitwise_equal

import fake_quant


@given(fps.arrays("e4m3", shape=st.integers(1, 16), dtype=np.float32,
                  elements=fps.rounding_inputs("e4m3", np.float32)))
def test_fake_quant_e4m3(x):
    got = fake_quant.fake_quant_e4m3(x)
    want = fpsim.quantize(x, "e4m3", saturate=True)
    assert_bitwise_equal(got, want, fmt="e4m3", inputs=x)
