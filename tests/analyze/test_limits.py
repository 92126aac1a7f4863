"""Format thresholds: the documented values of the presets, and clear errors."""

from __future__ import annotations

import pytest

import fpsim
from fpsim.analyze.limits import FormatLimits, resolve_formats


def test_fp16_thresholds():
    lim = FormatLimits.of("fp16")
    assert lim.zero_exponent == -25 and lim.tie_to_zero          # 2^-25 = min_subnormal / 2 ties to 0
    assert lim.overflow_threshold == 65520.0 and lim.tie_overflows  # 65504 + 16; max's significand is odd
    assert not lim.overflows(65519.99) and lim.overflows(65520.0)
    assert lim.overflows(float("nan"))


def test_e4m3_overflow_tie_rounds_back_to_max():
    lim = FormatLimits.of("e4m3")
    assert lim.overflow_threshold == 464.0 and not lim.tie_overflows  # 448 has an even significand
    assert not lim.overflows(464.0) and lim.overflows(464.00003)
    assert lim.zero_exponent == -10


def test_bf16_and_e5m2():
    assert FormatLimits.of("bf16").zero_exponent == -134
    e5m2 = FormatLimits.of("e5m2")
    assert e5m2.zero_exponent == -17 and e5m2.overflow_threshold == 61440.0 and e5m2.tie_overflows


def test_per_tensor_scale_exponent():
    lim = FormatLimits.of("e4m3")
    assert lim.max_scale_exponent(1.0) == 8        # 256 <= 448 < 512
    assert lim.max_scale_exponent(448.0) == 0
    assert lim.max_scale_exponent(449.0) == -1
    assert lim.max_scale_exponent(1.75 * 2**-20) == 28
    assert lim.max_scale_exponent(0.0) is None and lim.max_scale_exponent(float("inf")) is None


def test_bad_formats_fail_with_the_allowed_names():
    with pytest.raises(ValueError, match="unknown format 'fp17'.*fp16"):
        resolve_formats(["fp16", "fp17"])
    with pytest.raises(ValueError, match="signed formats with a zero"):
        FormatLimits.of("e8m0")
    with pytest.raises(ValueError, match="given twice"):
        resolve_formats(["fp16", "half"])
    with pytest.raises(ValueError, match="empty"):
        resolve_formats([])
    assert [lim.name for lim in resolve_formats("bf16")] == ["bf16"]
    custom = fpsim.Format(6, 5)
    assert resolve_formats([custom])[0].fmt is custom
