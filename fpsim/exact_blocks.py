"""The exact oracle for block formats: one block at a time, on Python fractions.

It stands on `formats.py` and `exact.py` only (never on `blocks.py` or the
engine) and restates each format and scale rule from its source:

* MX (OCP Microscaling Formats v1.0): 32 elements share an E8M0 scale
  X = 2^(floor(log2(amax)) - emax_elem) (section 6.3), clamped to E8M0's
  smallest value 2^-127 below and NaN above its largest (as the spec
  authors' reference, microsoft/microxcaling, does); elements are V / X
  rounded into the element format, clamped to its largest magnitude. A NaN
  scale makes the whole block NaN. MXINT8's element is k / 64, k an 8-bit
  two's-complement integer, clamped symmetrically to |k| <= 127.
* the round-up rules: "ceil" 2^(ceil(log2(amax)) - emax_elem) and "even"
  (amax first rounded half up to the element's mantissa width), both from
  torchao's ScaleCalculationMode; "rceil" 2^ceil(log2(fl32(amax / max_elem)))
  saturating at 2^127, from cuBLAS's "Computing scaling and conversion
  factors for FP8 with UE8M0 scales".
* NVFP4 (NVIDIA): tensor scale fl32(amax / (6 * 448)), block scale
  RNE_E4M3(amax_block / 6 / tensor scale), elements RNE_E2M1(x / (block
  scale * tensor scale)) with saturation, 16 elements per block.
* DeepSeek-V3 block-wise FP8: FP32 scale fl32(max(amax, 1e-4) / 448) per
  block, elements x / scale rounded to E4M3 with saturation.

Blocks holding NaN or Inf get a NaN scale; a zero scale gives ±0 elements.
Results are Python floats (dequantised values, exact in binary64) and
Fractions (scales).
"""

from __future__ import annotations

import math
from fractions import Fraction

from . import exact
from .formats import format as get_format

__all__ = ["SPEC_PRESETS", "block_scale", "quantize_block", "round_element", "tensor_scale"]

NAN = float("nan")

SPEC_PRESETS = {  # name: (element, scale, block shape, rule, tensor scale format, amax floor)
    "mxfp8_e4m3": ("e4m3", "e8m0", (32,), "floor", None, 0),
    "mxfp8_e5m2": ("e5m2", "e8m0", (32,), "floor", None, 0),
    "mxfp6_e3m2": ("e3m2", "e8m0", (32,), "floor", None, 0),
    "mxfp6_e2m3": ("e2m3", "e8m0", (32,), "floor", None, 0),
    "mxfp4": ("e2m1", "e8m0", (32,), "floor", None, 0),
    "mxint8": ("int8", "e8m0", (32,), "floor", None, 0),
    "nvfp4": ("e2m1", "e4m3", (16,), "nearest", "fp32", 0),
    "fp8_block_1x128": ("e4m3", "fp32", (128,), "nearest", None, Fraction(float.fromhex("0x1.a36e2ep-14"))),
    "fp8_block_128x128": ("e4m3", "fp32", (128, 128), "nearest", None, Fraction(float.fromhex("0x1.a36e2ep-14"))),
}
"""The presets as their sources define them (1e-4 as the FP32 number DeepSeek's kernel compares with)."""

INT8_MAX = Fraction(127, 64)


def _element_max(element) -> Fraction:
    return INT8_MAX if element == "int8" else get_format(element).max


def _element_emax(element) -> int:
    return 0 if element == "int8" else get_format(element).emax


def _element_man_bits(element) -> int:
    return 6 if element == "int8" else get_format(element).man_bits


def _ceil_log2(v: Fraction) -> int:
    e = exact.floor_log2(v)
    return e if v == Fraction(2) ** e else e + 1


def _pow2(e: int, scale_fmt, overflow_nan: bool):
    lo, hi = scale_fmt.emin, scale_fmt.emax
    if e > hi:
        return NAN if overflow_nan else Fraction(2) ** hi
    return Fraction(2) ** max(e, lo)


def tensor_scale(amax, element="e2m1", scale="e4m3") -> Fraction:
    """NVFP4's FP32 tensor scale: fl32(amax / (max_elem * max_scale)), saturating; 1 when that is 0."""
    s = exact.round_value(Fraction(amax) / (_element_max(element) * get_format(scale).max), "fp32", saturate=True)
    return Fraction(s) if s != 0 else Fraction(1)


def block_scale(amax, element, scale, rule, tensor=Fraction(1), amax_floor=0):
    """The scale of a block with this amax (a Fraction >= 0, or NaN/Inf): a Fraction, or NaN."""
    scale_fmt = get_format(scale)
    if isinstance(amax, float) and not math.isfinite(amax):
        return NAN
    amax = Fraction(amax)
    emax = _element_emax(element)
    if rule in ("floor", "ceil", "even"):
        if amax == 0:
            return Fraction(2) ** scale_fmt.emin
        if rule == "floor":
            e = exact.floor_log2(amax)
        elif rule == "ceil":
            e = _ceil_log2(amax)
        else:  # round amax half up to (man_bits + 1) significant bits, then floor(log2)
            e = exact.floor_log2(amax)
            step = Fraction(2) ** (e - _element_man_bits(element))
            e = exact.floor_log2(math.floor(amax / step + Fraction(1, 2)) * step)
        return _pow2(e - emax, scale_fmt, overflow_nan=True)
    if rule == "rceil":
        descale = exact.round_value(amax / _element_max(element), "fp32")
        if math.isinf(descale):    # fl32 overflows (float64 input): the conversion saturates, as beyond 2^127
            return Fraction(2) ** scale_fmt.emax
        descale = Fraction(descale)
        return Fraction(2) ** scale_fmt.emin if descale == 0 else _pow2(_ceil_log2(descale), scale_fmt, False)
    if rule == "nearest":
        amax = max(amax, Fraction(amax_floor))
        s = exact.round_value(amax / (_element_max(element) * Fraction(tensor)), scale_fmt, saturate=True)
        return Fraction(s)
    raise ValueError(f"unknown rule {rule!r}")


def round_element(v, element, rounding="nearest_even", random_fraction=None) -> float:
    """v (a Fraction, or a float zero) rounded into the element format with saturation
    (int8: the k/64 grid, |k| <= 127, no -0)."""
    if element != "int8":
        return exact.round_value(v, element, rounding, saturate=True, random_fraction=random_fraction)
    negative = v < 0
    a = abs(Fraction(v)) * 64
    lo = math.floor(a)
    frac = a - lo
    if frac == 0:
        k = lo
    elif rounding == "nearest_even":
        k = lo + (frac > Fraction(1, 2) or (frac == Fraction(1, 2) and lo % 2 == 1))
    elif rounding == "nearest_away":
        k = lo + (frac >= Fraction(1, 2))
    elif rounding == "toward_zero":
        k = lo
    elif rounding == "up":
        k = lo + (not negative)
    elif rounding == "down":
        k = lo + negative
    elif rounding == "odd":
        k = lo if lo % 2 == 1 else lo + 1
    else:
        if random_fraction is None:
            raise ValueError("stochastic rounding needs random_fraction")
        k = lo + (random_fraction < frac)
    k = min(k, 127)
    return 0.0 if k == 0 else float(Fraction(-k if negative else k, 64))


def quantize_block(values, element, scale, rule, rounding="nearest_even", *, tensor=Fraction(1), amax_floor=0,
                   random_fractions=None):
    """(scale, element values, dequantised values) of one block of floats.

    tensor: the tensor scale (NVFP4), 1 otherwise. random_fractions: one
    u in [0, 1) per element for stochastic rounding.
    """
    values = [float(v) for v in values]
    if any(not math.isfinite(v) for v in values):
        amax = NAN
    else:
        amax = max((abs(Fraction(v)) for v in values), default=Fraction(0))
    s = block_scale(amax, element, scale, rule, tensor, amax_floor)
    has_nan = element != "int8" and get_format(element).has_nan
    if isinstance(s, float):  # NaN
        return s, [NAN if has_nan else 0.0] * len(values), [NAN] * len(values)
    elements = []
    for i, v in enumerate(values):
        if s == 0:
            elements.append(0.0 if element == "int8" else math.copysign(0.0, v))
            continue
        u = None if random_fractions is None else random_fractions[i]
        quotient = v if v == 0 else Fraction(v) / (s * Fraction(tensor))  # a float zero keeps its sign
        elements.append(round_element(quotient, element, rounding, u))
    dequantised = [_product(e, s * Fraction(tensor)) for e in elements]
    return s, elements, dequantised


def _product(element: float, factor: Fraction) -> float:
    if element == 0:
        return element  # keeps the element's sign
    return float(Fraction(element) * factor)
