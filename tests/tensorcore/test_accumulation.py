"""accumulation.reference_dot at its edges.

Sources of truth: IEEE 754 addition (Inf - Inf is NaN, an empty sum adds nothing to c; the sign of
a zero, section 6.3: x + x keeps the sign of x, an exact zero sum of opposite-signed terms is +0 when
rounding to nearest), the module's promise of exactness for binary32 inputs only (2^60 + 1 needs 61
significant bits), and reference_dot's docstring (a float32 array of shape a.shape[:-1]).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

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


def test_the_sign_of_a_zero_follows_ieee_addition():
    """(-0) * 1 + (-0) is -0 (x + x keeps x's sign); with a +0 term or a cancellation the exact zero
    is +0; K = 0 gives c itself, -0 included (the docstring)."""
    neg, pos, one = np.float32(-0.0), np.float32(0.0), np.float32(1.0)
    cases = [([], [], neg, True), ([neg], [one], neg, True), ([neg, neg], [one, one], neg, True),
             ([pos], [one], neg, False), ([neg], [one], pos, False), ([one, -one], [one, one], neg, False)]
    for method in METHODS:
        for a, b, c, negative in cases:
            got = reference_dot(np.array(a, np.float32), np.array(b, np.float32), np.array(c), method)
            assert got == 0 and bool(np.signbit(got)) == negative, (method, a, c)


def test_the_result_is_a_float32_array_of_shape_a_shape_without_k():
    for method in METHODS:
        for k in (0, 1, 3):
            for shape in ((k,), (2, k)):
                a = np.ones(shape, np.float32)
                for c in (None, np.ones(shape[:-1], np.float32)):
                    got = reference_dot(a, a, c, method)
                    assert type(got) is np.ndarray and got.dtype == np.float32 and got.shape == shape[:-1], \
                        (method, shape, c is None, type(got))
                    assert got.tolist() == (np.full(shape[:-1], k + (c is not None), np.float32)).tolist()


@pytest.mark.parametrize("make", [np.array, lambda v: np.array(v, dtype=np.int64), list, torch.tensor],
                         ids=["numpy", "int64", "list", "torch"])
def test_integers_are_compared_as_integers(make):
    """2^60 + 1 is no binary32 value, although float64 rounds it to 2^60, which is one."""
    one = make([1])
    with pytest.raises(ValueError, match=r"a\[0\] = 1152921504606846977 is not a binary32 value"):
        reference_dot(make([2**60 + 1]), one)
    with pytest.raises(ValueError, match=r"b\[1\] = 9223372036854775807 is not a binary32 value"):
        reference_dot(make([1, 1]), make([1, 2**63 - 1]))
    assert float(reference_dot(make([2**60]), one)) == 2.0**60


def test_an_integer_beyond_float64s_range_is_a_value_error():
    with pytest.raises(ValueError, match=r"a\[1\] = -1.0000000000000000e\+400 \(an integer beyond float64's range\) "
                                         r"is not a binary32 value"):
        reference_dot([1, -10**400], [1, 1])
