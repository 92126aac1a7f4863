"""accumulation.reference_dot at its edges.

Sources of truth: IEEE 754 addition (Inf - Inf is NaN, an empty sum adds nothing to c), and the
module's promise of exactness for binary32 inputs only.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from fpsim.tensorcore.accumulation import METHODS, reference_dot


@pytest.mark.parametrize("method", METHODS)
def test_an_empty_dot_is_c(method):
    empty = np.ones((2, 0))
    assert reference_dot(empty, empty, None, method).tolist() == [0.0, 0.0]
    assert reference_dot(empty, empty, np.array([1.0, -2.5]), method).tolist() == [1.0, -2.5]


@pytest.mark.parametrize("method", METHODS)
def test_infinities_follow_ieee_addition(method):
    ones = np.ones((1, 2), np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        assert math.isnan(reference_dot(np.array([[np.inf, -np.inf]], np.float32), ones, None, method)[0])
        assert math.isnan(reference_dot(np.array([[np.inf, 1]], np.float32), ones, np.array([-np.inf], np.float32),
                                        method)[0])
        assert reference_dot(np.array([[np.inf, 1]], np.float32), ones, None, method)[0] == np.inf
        # finite products whose running sum overflows binary32: Inf, as IEEE addition gives
        big = np.array([[3e38, 3e38, 1.0]], np.float32)
        assert reference_dot(big, np.ones((1, 3), np.float32), None, method)[0] == np.inf


def test_values_that_are_not_binary32_are_refused():
    """(1 + 2^-52)^2 - (1 + 2^-51) = 2^-104 exactly, which float64 products cannot give."""
    a = np.array([[1 + 2.0**-52]])
    with pytest.raises(ValueError, match=r"a\[0, 0\] = 1.0000000000000002 is not a binary32 value"):
        reference_dot(a, a, np.array([-(1 + 2.0**-51)]))
    with pytest.raises(ValueError, match=r"c\[0\] = 1e\+300 is not a binary32 value"):
        reference_dot(np.ones((1, 1)), np.ones((1, 1)), np.array([1e300]))
