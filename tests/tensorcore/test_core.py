"""TensorCore's entry points: what they accept, refuse and give back.

Sources of truth: numpy's empty-array conventions and result dtypes documented in core.TensorCore
(fp32 output -> float32), fpsim.quantize's refusals (TypeError for complex, strings), and exact
sums of small integers (exact in every format).
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
