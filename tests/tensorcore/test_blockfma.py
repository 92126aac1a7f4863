"""The block-FMA engine's parameters: overrides, the exact-sum bound, flushing.

Sources of truth: the documented model (docs/tensorcore.md, the blockfma module doc) computed with
exact Fraction arithmetic (`fpsim.exact.round_value`), and the docs' own override example.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from fpsim import exact
from fpsim.tensorcore.blockfma import BlockFMA
from fpsim.tensorcore.core import TensorCore


def test_a_block_size_override_takes_effect():
    """docs: TensorCore("h100", "fp16", "fp32", block_size=32, extra_bits=0) is a device with F = 32.
    16 products 2^-24 then 1.0: in ONE block the window sits at 2^0 with quantum 2^-23, so each
    2^-24 truncates to 0 and d = 1; blocks of 16 would give 16 * 2^-24 = 2^-20 first, then 1 + 2^-20."""
    a = np.zeros((1, 32))
    a[0, :16], a[0, 16] = 2.0**-12, 1.0
    tc = TensorCore("h100", "fp16", "fp32", block_size=32, extra_bits=0)
    assert tc.params.instruction_k == 32
    assert float(tc.dot(a, a)[0]) == 1.0
    # an explicit instruction still cuts the block at its end (the documented m16n8k8 behaviour)
    cut = TensorCore("h100", "fp16", "fp32", block_size=32, extra_bits=0, instruction="m16n8k16")
    assert cut.params.instruction_k == 16 and float(cut.dot(a, a)[0]) == 1 + 2.0**-20


def test_block_sums_beyond_float64_are_refused_and_presets_kept():
    """F products v*v (alignment exponent 0) and c = -2^-47, one unit of a 47-bit window: the exact
    sum needs more than 53 bits for F = 64, so the engine cannot do it and must refuse; a block it
    accepts at the same window is exact."""
    with pytest.raises(ValueError, match="block_size=64 with extra_bits=24 .* 2\\^53"):
        TensorCore("h100", "bf16", "fp32", block_size=64, extra_bits=24, instruction_k=64)
    with pytest.raises(ValueError, match="block_size=32 with extra_bits=24"):
        BlockFMA(block_size=32, extra_bits=24)
    F, v = 15, 2 - 2.0**-7   # (4 * 15 + 2) * 2^47 < 2^53: accepted
    tc = TensorCore("h100", "bf16", "fp32", block_size=F, extra_bits=24, instruction_k=F)
    a = np.full((1, F), v)
    got = float(tc.dot(a, a, np.array([-2.0**-47]))[0])
    assert got == exact.round_value(F * Fraction(v) ** 2 - Fraction(2) ** -47, "fp32", "toward_zero")


def test_subnormal_outputs_false_flushes_results_not_c():
    """Docstring: False flushes subnormal block results; c enters the sum as it is. Product 2^-126
    plus c = 2^-127 (binary32 subnormal) is 1.5 * 2^-126, a normal result; c alone is a subnormal
    result, flushed to +0."""
    tc = TensorCore("h100", "bf16", "fp32", subnormal_outputs=False)
    a = np.array([[2.0**-63], [0.0]])
    got = tc.dot(a, a, np.array([2.0**-127, 2.0**-127]))
    assert got[0] == 1.5 * 2.0**-126 and got[1] == 0
    assert "c enters the sum as it is" in BlockFMA.__doc__
