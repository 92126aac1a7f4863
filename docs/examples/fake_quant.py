"""A user's own float32 -> FP8 E4M3 "fake quantization", as in docs/testing.md.

`fake_quant_e4m3_v1` is the first version, with the bug that hypothesis finds
(ties round half up instead of to even); `fake_quant_e4m3` is the fixed one.
Both return float32 arrays holding E4M3 values and saturate at +-448, as the
fake-quantization step of FP8 training recipes does.
"""

import numpy as np

E4M3_MAX = np.float32(448.0)


def _spacing(a):
    """The E4M3 grid spacing at |x| = a: 2^(e - 3), e = the binade's exponent, at least -6."""
    _, e = np.frexp(a)  # a = m * 2^e with 0.5 <= m < 1, exactly
    e = np.maximum(e - 1, -6)  # the smallest normal binade is 2^-6; subnormals share its spacing
    return np.ldexp(np.float32(1.0), e - 3)  # 3 mantissa bits


def fake_quant_e4m3_v1(x):
    """Round float32 values to the nearest E4M3 value, saturating at +-448 (first version)."""
    x = np.asarray(x, dtype=np.float32)
    a = np.abs(x)
    step = _spacing(a)
    with np.errstate(over="ignore"):  # beyond 448: saturated below
        q = np.floor(a / step + np.float32(0.5)) * step  # round to nearest
    return np.copysign(np.minimum(q, E4M3_MAX), x)


def fake_quant_e4m3(x):
    """Round float32 values to the nearest E4M3 value, ties to even, saturating at +-448."""
    x = np.asarray(x, dtype=np.float32)
    a = np.abs(x)
    step = _spacing(a)
    with np.errstate(over="ignore"):  # beyond 448: saturated below
        q = np.rint(a / step) * step  # round to nearest, ties to even
    return np.copysign(np.minimum(q, E4M3_MAX), x)
