"""TensorCore's entry points: what they accept, refuse and give back.

Sources of truth: numpy's empty-array conventions and result dtypes documented in core.TensorCore
(fp32 output -> float32), fpsim.quantize's refusals (TypeError for complex, strings), exact
sums of small integers (exact in every format), IEEE 754 and BLAS for K = 0 (an empty sum adds
nothing: D = C, -0 included), integer arithmetic (2^60 + 1 has 61 significant bits: no bf16 or
binary32 value), and docs/tensorcore.md (an unsupported combination is refused with the list of
what the device supports; its preset table lists each generation's input formats).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fpsim.tensorcore.core import TensorCore


def test_matmul_with_no_rows_gives_an_empty_result():
    tc = TensorCore("h100", "fp16", "fp32")
    out = tc.matmul(np.ones((0, 3)), np.ones((3, 2)))
    assert out.shape == (0, 2) and out.dtype == np.float32
    out = tc.matmul(torch.ones(0, 3), torch.ones(3, 2))
    assert tuple(out.shape) == (0, 2) and out.dtype == torch.float32


@pytest.mark.parametrize("a", [np.array([[1 + 5j, 2]]), np.array([["1.5", "2"]]), torch.tensor([[1 + 5j, 2]])],
                         ids=["complex", "strings", "torch-complex"])
def test_complex_and_string_inputs_are_refused(a):
    tc = TensorCore("h100", "fp16", "fp32")
    b = torch.ones(1, 2) if isinstance(a, torch.Tensor) else np.ones((1, 2))
    with pytest.raises(TypeError, match="^a: cannot round"):
        tc.dot(a, b)
    with pytest.raises(TypeError, match="^c: cannot round"):
        tc.dot(b, b, np.array(["1"]) if isinstance(b, np.ndarray) else torch.tensor([1j]))


def test_a_tensor_that_requires_grad_is_read_detached():
    """1*1 + 2*1 + 3*1 + 4*1 = 10, exact; the result carries no gradient."""
    tc = TensorCore("h100", "fp16", "fp32")
    a = torch.tensor([[1.0, 2.0, 3.0, 4.0]], requires_grad=True)
    out = tc.dot(a, torch.ones(1, 4))
    assert out.tolist() == [10.0] and not out.requires_grad
    out = tc.matmul(a, torch.ones(4, 2, requires_grad=True), torch.zeros(1, 2, requires_grad=True))
    assert out.tolist() == [[10.0, 10.0]] and not out.requires_grad


def test_an_empty_k_gives_c_under_every_schedule():
    """split_k raised ValueError (range() arg 3 must not be zero) where the others give C."""
    for schedule in ({}, {"split_k": 4}, {"split_k": 2, "epilogue": "fp16"}, {"promote_every": 16}):
        tc = TensorCore("h100", "fp16", "fp32", **schedule)
        out = np.asarray(tc.dot(np.ones((3, 0)), np.ones((3, 0)), np.array([1.5, -0.0, -2.0])), np.float32)
        assert out.tolist() == [1.5, 0.0, -2.0] and np.signbit(out).tolist() == [0, 1, 1], schedule
        out = tc.dot(np.ones(0), np.ones(0), np.float32(-0.0))
        assert out.shape == () and out == 0 and np.signbit(out), schedule
        out = tc.matmul(np.ones((2, 0)), np.ones((0, 3)))
        assert out.shape == (2, 3) and out.tolist() == [[0.0] * 3] * 2 and not np.signbit(out).any(), schedule
        out = tc.matmul(torch.ones(2, 0), torch.ones(0, 3), -torch.zeros(2, 3))
        assert out.tolist() == [[0.0] * 3] * 2 and bool(torch.signbit(out).all()), schedule


INTEGER_OPERANDS = {"numpy": lambda v: np.array(v, dtype=np.int64), "uint64": lambda v: np.array(v, dtype=np.uint64),
                    "torch": torch.tensor, "list": list}


@pytest.mark.parametrize("make", INTEGER_OPERANDS.values(), ids=INTEGER_OPERANDS)
def test_integer_operands_are_compared_as_integers(make):
    """2^60 + 1 is no bf16 value, although float64 rounds it to 2^60, which is one; the same for
    2^63 - 1 (63 significant bits) and, as c, for binary32."""
    tc = TensorCore("h100", "bf16", "fp32")
    one = make([1])
    with pytest.raises(ValueError, match=r"^a\[0\] = 1152921504606846977 is not a bf16 value; round the inputs"):
        tc.dot(make([2**60 + 1]), one)
    with pytest.raises(ValueError, match=r"^b\[0, 1\] = 9223372036854775807 is not a bf16 value"):
        tc.dot(make([[1, 1]]), make([[1, 2**63 - 1]]))
    with pytest.raises(ValueError, match=r"^c\[0\] = 1152921504606846977 is not a fp32 value"):
        tc.dot(make([[1]]), make([[1]]), make([2**60 + 1]))
    assert float(tc.dot(make([2**60]), one)) == 2.0**60           # 2^60 is a bf16 value: accepted, exact
    rounded = TensorCore("h100", "bf16", "fp32", round_inputs="nearest_even")
    assert float(rounded.dot(make([2**60 + 2**52]), one)) == 2.0**60   # a tie below 2^60 + 2^53: to even


def test_python_ints_beyond_float64s_range_are_a_value_error():
    tc = TensorCore("h100", "bf16", "fp32")
    with pytest.raises(ValueError, match=r"^a\[0\] = 1.0000000000000000e\+400 \(an integer beyond float64's range\) "
                                         r"is not a bf16 value"):
        tc.dot([10**400], [1])
    with pytest.raises(ValueError, match=r"^c\[\] = 1152921504606846977 is not a fp32 value"):
        tc.dot([1.0], [1.0], 2**60 + 1)


# the input formats of docs/tensorcore.md's preset table, per generation
HOPPER = "fp16, bf16, tf32, e4m3, e5m2"
BLACKWELL = HOPPER + ", mxfp8_e4m3, mxfp8_e5m2, mxfp6_e3m2, mxfp6_e2m3, mxfp4, nvfp4"


@pytest.mark.parametrize("device,inputs,inputs_b,formats,mixed", [
    ("h100", "fp32", None, HOPPER, "e4m3 with e5m2"),
    ("h100", "fp64", None, HOPPER, "e4m3 with e5m2"),
    ("h100", "e2m1", None, HOPPER, "e4m3 with e5m2"),
    ("h100", "mxfp4", None, HOPPER, "e4m3 with e5m2"),
    ("v100", "bf16", None, "fp16", "none"),
    ("b200", "fp32", None, BLACKWELL, "e4m3 with e5m2; mxfp8_e4m3 with mxfp8_e5m2 with mxfp6_e3m2 with mxfp6_e2m3 "
                                      "with mxfp4"),
], ids=["h100-fp32", "h100-fp64", "h100-e2m1", "h100-mxfp4", "v100-bf16", "b200-fp32"])
def test_unsupported_inputs_are_refused_with_what_the_device_takes(device, inputs, inputs_b, formats, mixed):
    gen = {"h100": "hopper", "v100": "volta", "b200": "blackwell"}[device]
    want = (f"{device} ({gen}) tensor cores do not support {inputs} inputs with fp32 output; input formats: {formats}; "
            f"mixed input formats (A and B differing): {mixed}; supported: ")
    with pytest.raises(ValueError) as error:
        TensorCore(device, inputs, "fp32")
    assert str(error.value).startswith(want) and "fp16->fp32 (native)" in str(error.value)


def test_mixed_inputs_a_device_cannot_take_are_refused_with_what_it_takes():
    with pytest.raises(ValueError) as error:
        TensorCore("h100", "fp16", "fp32", inputs_b="bf16")
    assert str(error.value).startswith(f"h100 (hopper) tensor cores do not support fp16 inputs with bf16 for B; input "
                                       f"formats: {HOPPER}; mixed input formats (A and B differing): e4m3 with e5m2; "
                                       f"supported: bf16->fp32 (native), ")
