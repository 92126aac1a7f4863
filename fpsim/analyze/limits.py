"""Where a format loses values: its rounding-to-zero and overflow thresholds, decided by the engine.

Under round-to-nearest-even a nonzero value flushes to zero when |x| <
min_subnormal / 2; exactly min_subnormal / 2 is a tie that goes to zero (its
even neighbour); everything in (min_subnormal / 2, min_subnormal) rounds up to
min_subnormal. A value overflows when |x| reaches max + ulp(max) / 2, the tie
going up or down with the parity of max's significand. Rather than re-derive
those rules, `FormatLimits` asks `fpsim.quantize` what the tie values become.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from fractions import Fraction

import numpy as np

from ..formats import Format, format as get_format
from ..rounding import quantize
from .verdicts import INTENDED_INF_OPS


@dataclasses.dataclass(frozen=True)
class FormatLimits:
    """The thresholds of one format, as exponents and exact floats."""

    fmt: Format
    zero_exponent: int
    """z: values below 2^z flush to zero (2^z = min_subnormal / 2, or min_normal / 2 without subnormals)."""
    tie_to_zero: bool
    """Whether exactly 2^z rounds to zero."""
    overflow_threshold: float
    """T = max + ulp(max) / 2 (inf when beyond float64)."""
    tie_overflows: bool
    """Whether exactly T overflows."""

    @property
    def name(self) -> str:
        return self.fmt.name

    @property
    def emin(self) -> int:
        return self.fmt.emin

    @property
    def emax(self) -> int:
        return self.fmt.emax

    @property
    def max(self) -> float:
        return float(self.fmt.max)

    @property
    def per_tensor_scaled(self) -> bool:
        """8 bits or fewer: scaled per tensor from its amax (FP8 recipes), not by one loss scale."""
        return self.fmt.bits <= 8

    def overflows(self, value: float) -> bool:
        """Whether |value| overflows (rounds beyond max) in this format; NaN counts as overflow."""
        value = abs(float(value))
        if value != value:
            return True
        return value > self.overflow_threshold or (value == self.overflow_threshold and self.tie_overflows)

    def max_scale_exponent(self, amax: float) -> int | None:
        """The largest s with amax * 2^s <= max (the per-tensor scale of FP8 recipes, as a power of two).

        None when amax is zero or not finite.
        """
        if not amax or not math.isfinite(amax):
            return None
        ratio = self.fmt.max / Fraction(amax)
        s = ratio.numerator.bit_length() - ratio.denominator.bit_length()
        while Fraction(2) ** s > ratio:
            s -= 1
        while Fraction(2) ** (s + 1) <= ratio:
            s += 1
        return s

    @classmethod
    def of(cls, fmt: "str | Format") -> "FormatLimits":
        fmt = get_format(fmt)
        if not (fmt.signed and fmt.zero):
            raise ValueError(f"the analyzer needs signed formats with a zero; {fmt.name} is "
                             f"{'unsigned' if not fmt.signed else 'without zero'}")
        z = fmt.min_exponent - 1
        tie = quantize(np.array([math.ldexp(1.0, z)], dtype=np.float64), fmt)
        tie_to_zero = bool(np.asarray(tie, dtype=np.float64)[0] == 0)
        threshold = fmt.max + Fraction(2) ** (fmt.emax - fmt.man_bits) / 2
        try:
            t = float(threshold)
        except OverflowError:
            t = math.inf
        if math.isfinite(t) and Fraction(t) != threshold:  # not a float64: no float value ties
            tie_overflows = False
        elif math.isfinite(t):
            q = float(np.asarray(quantize(np.array([t], dtype=np.float64), fmt), dtype=np.float64)[0])
            tie_overflows = not math.isfinite(q) or abs(q) > float(fmt.max)
        else:
            tie_overflows = False
        return cls(fmt, z, tie_to_zero, t, tie_overflows)


def resolve_formats(formats) -> list[FormatLimits]:
    """FormatLimits for a name, a Format or a sequence of them; ValueError naming what is allowed."""
    if isinstance(formats, (str, Format)):
        formats = (formats,)
    try:
        items = list(formats)
    except TypeError:
        raise TypeError(f"formats must be a format name, a fpsim.Format or a sequence of them, "
                        f"got {type(formats).__name__}") from None
    if not items:
        raise ValueError("formats is empty; give at least one, e.g. ('fp16', 'bf16', 'e4m3', 'e5m2')")
    limits, seen = [], set()
    for item in items:
        lim = FormatLimits.of(item)
        if lim.name in seen:
            raise ValueError(f"format {lim.name!r} given twice")
        seen.add(lim.name)
        limits.append(lim)
    return limits


def inf_overflow_threshold(name: str, dtypes: dict) -> float | None:
    """The lowest overflow threshold of the low-precision dtypes a record's values were produced in (an Inf
    among them is an overflow there), None when none was, or when the op puts Inf on purpose."""
    if name.rpartition(":")[2] in INTENDED_INF_OPS:
        return None
    low = [threshold for dtype, threshold in _low_precision_thresholds().items() if dtype in dtypes]
    return min(low) if low else None


LOW_PRECISION_DTYPES = {"float16": "fp16", "bfloat16": "bf16"}
"""torch's 16-bit float dtypes (autocast computes in them, pure low-precision training stores weights in them),
by name, and the format of each."""


def is_low_precision(dtype) -> bool:
    """Whether a torch dtype is one of LOW_PRECISION_DTYPES."""
    return str(dtype).removeprefix("torch.") in LOW_PRECISION_DTYPES


@functools.lru_cache(maxsize=1)
def _low_precision_thresholds() -> dict:
    return {dtype: FormatLimits.of(fmt).overflow_threshold for dtype, fmt in LOW_PRECISION_DTYPES.items()}
