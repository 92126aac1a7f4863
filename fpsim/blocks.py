"""Block-scaled formats: MX (OCP Microscaling v1.0), NVFP4 and block-wise FP8.

A block format stores a tensor as small elements (FP8, FP6, FP4 or INT8)
and one shared scale per block of elements (E8M0 powers of two for MX, E4M3
for NVFP4, FP32 for DeepSeek-V3's block-wise FP8), plus, for NVFP4, one FP32
scale for the whole tensor. A value is element * block scale * tensor scale.

    fpsim.format("mxfp8_e4m3")                  # a BlockFormat preset
    fpsim.BlockFormat("e4m3", "e8m0", 32, scale_rule="rceil")
    fpsim.quantize(x, "mxfp8_e4m3")             # dequantised values (fpsim.block_codec)

This module says what each format and scale rule is (`BlockFormat`,
`IntFormat`, `SCALE_RULES`, `BLOCK_PRESETS`, `format`); `block_codec`
quantises, encodes and decodes with them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from fractions import Fraction
from typing import Callable

import numpy as np

from .formats import PRESETS, Format, format as get_plain_format
from .quotient import round_quotient

__all__ = ["BLOCK_PRESETS", "SCALE_RULES", "BlockFormat", "IntFormat", "ScaleRule", "format"]

_FP32 = PRESETS["fp32"]


# ------------------------------------------------------------- elements
@dataclasses.dataclass(frozen=True)
class IntFormat:
    """A two's-complement integer element with an implicit scale: values k * 2^-frac_bits.

    MXINT8 (OCP MX v1.0, 5.3.2) is IntFormat(8, 6): k in -128..127, values
    -2 .. 1.984375. Quantisation saturates symmetrically at ±127/64 (the MX
    spec's clamp to the largest magnitude, as the spec authors' reference
    code microsoft/microxcaling does); the code 0x80 (-2) still decodes to -2.
    There is no negative zero.
    """

    bits: int = 8
    frac_bits: int = 6
    name: str = "int8"

    kind = "int"

    def __post_init__(self):
        for field in ("bits", "frac_bits"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"IntFormat.{field} must be an int, got {value!r}")
        if not 2 <= self.bits <= 16 or not 0 <= self.frac_bits <= 64:
            raise ValueError(f"IntFormat(bits={self.bits}, frac_bits={self.frac_bits}): bits must be 2..16 "
                             f"and frac_bits 0..64")

    @functools.cached_property
    def grid(self) -> Format:
        """The sign-magnitude Format with exactly the values ±k * 2^-frac_bits, |k| <= 2^(bits-1) - 1.

        One exponent bit: field 0 holds the subnormals k < 2^(bits-2), field 1
        the rest, both on the grid 2^-frac_bits. Ties to even significand are
        ties to even k. The engine rounds onto this grid.
        """
        return Format(1, self.bits - 2, bias=3 - self.bits + self.frac_bits, nan="none",
                      name=f"{self.name}_grid")

    @property
    def max(self) -> Fraction:
        return self.grid.max

    @property
    def min(self) -> Fraction:
        """The most negative value (the code 0x80 for INT8)."""
        return -Fraction(1 << (self.bits - 1), 1 << self.frac_bits)

    @property
    def emax(self) -> int:
        """floor(log2(max)): the MX spec's emax_elem (0 for INT8)."""
        return self.grid.emax

    def __str__(self) -> str:
        return self.name


INT8 = IntFormat(8, 6, "int8")


def _element(value):
    if isinstance(value, (Format, IntFormat)):
        return value
    if isinstance(value, str) and value.strip().lower() == "int8":
        return INT8
    return get_plain_format(value)


# ----------------------------------------------------------- scale rules
@dataclasses.dataclass(frozen=True)
class ScaleRule:
    """How a block's amax becomes its scale. `compute(amax, fmt, tensor_scale)` takes amaxes (finite,
    >= 0, float32 or float64) and returns float64 scale values of fmt.scale (NaN where out of its range)."""

    name: str
    power_of_two: bool  # needs a scale format of powers of two (E8M0)
    summary: str
    source: str
    compute: Callable = dataclasses.field(repr=False, compare=False)  # amaxes in the input's dtype


def _log2_parts(amax):
    """(m, e) with amax = m * 2^e, m in [0.5, 1) (exact); amax = 0 gives (0, 0)."""
    m, e = np.frexp(amax)
    return m, e.astype(np.int64)


def _pow2_scale(exponent, amax, fmt, *, overflow_nan: bool):
    """2^exponent clamped to the scale format's binades; an all-zero block gets the smallest scale."""
    lo, hi = fmt.scale.emin, fmt.scale.emax
    exponent = np.where(amax == 0, lo, exponent)
    over = exponent > hi
    exponent = np.clip(exponent, lo, hi)
    if -1022 <= lo and hi <= 1023:  # float64's normal binades: its bits directly (ldexp is slower)
        scale = ((exponent.astype(np.int64) + 1023) << 52).view(np.float64)
    else:
        scale = np.ldexp(1.0, exponent)
    return np.where(over, np.nan, scale) if overflow_nan else scale


def _floor_rule(amax, fmt, tensor_scale):
    _, e = _log2_parts(amax)
    return _pow2_scale(e - 1 - fmt.emax_elem, amax, fmt, overflow_nan=True)


def _ceil_rule(amax, fmt, tensor_scale):
    m, e = _log2_parts(amax)
    return _pow2_scale(np.where(m == 0.5, e - 1, e) - fmt.emax_elem, amax, fmt, overflow_nan=True)


def _even_rule(amax, fmt, tensor_scale):
    m, e = _log2_parts(amax)
    carry = m >= 1 - 2.0 ** -(fmt.element_format.man_bits + 2)  # amax rounds (half up) to the next binade
    return _pow2_scale(e - 1 + carry - fmt.emax_elem, amax, fmt, overflow_nan=True)


def _rceil_rule(amax, fmt, tensor_scale):
    descale = round_quotient(amax, [float(fmt.element_max)], _FP32)  # FP32, round to nearest
    m, e = _log2_parts(descale)
    exponent = np.where(np.isinf(descale), fmt.scale.emax, np.where(m == 0.5, e - 1, e))
    return _pow2_scale(exponent, descale, fmt, overflow_nan=False)  # satfinite


def _nearest_rule(amax, fmt, tensor_scale):
    amax = np.maximum(amax, float(np.float32(fmt.amax_floor)))  # the floor as an FP32 number
    factors = [float(fmt.element_max), tensor_scale]
    return round_quotient(amax, factors, fmt.scale, saturate=True).astype(np.float64)


SCALE_RULES: dict[str, ScaleRule] = {
    r.name: r
    for r in (
        ScaleRule("floor", True, "2^(floor(log2(amax)) - emax_elem); beyond E8M0's range: NaN, below: 2^-127",
                  "OCP Microscaling Formats (MX) v1.0, section 6.3; microsoft/microxcaling mx_ops.py; "
                  "torchao ScaleCalculationMode.FLOOR", _floor_rule),
        ScaleRule("ceil", True, "2^(ceil(log2(amax)) - emax_elem): no element saturates",
                  "torchao mx_formats ScaleCalculationMode.CEIL", _ceil_rule),
        ScaleRule("even", True, "2^(floor(log2(amax rounded half up to the element's precision)) - emax_elem)",
                  "torchao mx_formats ScaleCalculationMode.EVEN", _even_rule),
        ScaleRule("rceil", True, "2^ceil(log2(fl32(amax / max_elem))), saturating at 2^127 (cvt.rp.satfinite.ue8m0)",
                  "cuBLAS documentation, 'Computing scaling and conversion factors for FP8 with UE8M0 "
                  "scales'; torchao ScaleCalculationMode.RCEIL", _rceil_rule),
        ScaleRule("nearest", False, "round_to_nearest_even(max(amax, amax_floor) / (max_elem * tensor scale)) "
                  "in the scale format, saturating",
                  "NVFP4: NVIDIA TransformerEngine docs (low_precision_training/nvfp4) and "
                  "custom_recipes/reference_nvfp4.py; FP32 block scales: DeepSeek-V3 inference/kernel.py "
                  "act_quant (s = max(amax, 1e-4) / 448)", _nearest_rule),
    )
}


# ----------------------------------------------------------- the format
@dataclasses.dataclass(frozen=True)
class BlockFormat:
    """Elements of `element` sharing one `scale` per block of `block_size` elements.

    element: a Format (or name) or an IntFormat ("int8"); its kind is
      `kind` ("float" or "int").
    scale: the scale's Format: "e8m0" (MX), "e4m3" (NVFP4), "fp32".
    block_size: elements per block along one axis, or a tuple for blocks
      over several axes ((128, 128): DeepSeek-V3's weight blocks).
    scale_rule: a name in SCALE_RULES.
    tensor_scale: the Format of a per-tensor scale (NVFP4: "fp32"), or None.
      It is fl32(tensor amax / (max_elem * max_scale)), the amax taken over
      the finite values, saturating at FP32's max; 1 when that is 0.
    amax_floor: a lower bound applied to each block's amax before the
      "nearest" rule (DeepSeek-V3 clamps to 1e-4).
    """

    element: object
    scale: object
    block_size: object
    scale_rule: str = "floor"
    tensor_scale: object = None
    amax_floor: float = 0.0
    name: str | None = None

    def __post_init__(self):
        set_ = functools.partial(object.__setattr__, self)
        set_("element", _element(self.element))
        set_("scale", get_plain_format(self.scale))
        if self.tensor_scale is not None:
            set_("tensor_scale", get_plain_format(self.tensor_scale))
        sizes = (self.block_size,) if not isinstance(self.block_size, (tuple, list)) else tuple(self.block_size)
        if not sizes or any(isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1 for b in sizes):
            raise ValueError(f"block_size must be a positive int or a tuple of them, got {self.block_size!r}")
        set_("block_size", int(sizes[0]) if len(sizes) == 1 else tuple(int(b) for b in sizes))
        rule = SCALE_RULES.get(self.scale_rule)
        if rule is None:
            raise ValueError(f"unknown scale_rule {self.scale_rule!r}; allowed: {', '.join(SCALE_RULES)}")
        if rule.power_of_two and (self.scale.man_bits != 0 or self.tensor_scale is not None):
            raise ValueError(f"scale_rule {rule.name!r} makes powers of two: it needs a scale format without "
                             f"mantissa bits (e8m0) and no tensor scale, not scale={self.scale.name}")
        if not rule.power_of_two and not (self.scale.signed or self.scale.zero):
            raise ValueError(f"scale_rule {rule.name!r} rounds to the scale format, which needs a zero")
        if isinstance(self.amax_floor, (bool, np.bool_)) or not isinstance(self.amax_floor, numbers.Real) \
                or not 0 <= self.amax_floor < math.inf:
            raise ValueError(f"amax_floor must be a finite number >= 0, got {self.amax_floor!r}")
        if isinstance(self.amax_floor, np.generic):   # a numpy scalar as the Python number of the same value
            set_("amax_floor", self.amax_floor.item())
        if self.name is None:
            blocks = "x".join(map(str, self.block_shape))
            set_("name", f"{self.element}x{blocks}_{self.scale.name}_{self.scale_rule}")

    @property
    def kind(self) -> str:
        return self.element.kind if isinstance(self.element, IntFormat) else "float"

    @property
    def block_shape(self) -> tuple[int, ...]:
        return self.block_size if isinstance(self.block_size, tuple) else (self.block_size,)

    @property
    def rule(self) -> ScaleRule:
        return SCALE_RULES[self.scale_rule]

    @property
    def element_format(self) -> Format:
        """The Format the elements are rounded to (an IntFormat's grid)."""
        return self.element.grid if isinstance(self.element, IntFormat) else self.element

    @property
    def element_max(self) -> Fraction:
        return self.element.max

    @property
    def emax_elem(self) -> int:
        return self.element.emax

    def tensor_scale_of(self, tensor_amax: float) -> float:
        """The tensor scale for a tensor amax taken over the finite values: fl(amax / (max_elem * max_scale))
        in the tensor-scale format, saturating; 1 when that is 0 (and when the format has no tensor scale)."""
        if self.tensor_scale is None:
            return 1.0
        divisor = [float(self.element_max), float(self.scale.max)]
        return float(round_quotient(np.array([tensor_amax]), divisor, self.tensor_scale, saturate=True)[0]) or 1.0

    def with_rule(self, scale_rule: str) -> "BlockFormat":
        """The same format with another scale rule (named e.g. "mxfp8_e4m3:rceil")."""
        if scale_rule == self.scale_rule:
            return self
        base = self.name.split(":")[0]
        return dataclasses.replace(self, scale_rule=scale_rule, name=f"{base}:{scale_rule}")

    def __str__(self) -> str:
        return self.name


BLOCK_PRESETS: dict[str, BlockFormat] = {
    f.name: f
    for f in (  # OCP MX v1.0 table 1: 32 elements, E8M0 scale
        BlockFormat("e4m3", "e8m0", 32, name="mxfp8_e4m3"),
        BlockFormat("e5m2", "e8m0", 32, name="mxfp8_e5m2"),
        BlockFormat("e3m2", "e8m0", 32, name="mxfp6_e3m2"),
        BlockFormat("e2m3", "e8m0", 32, name="mxfp6_e2m3"),
        BlockFormat("e2m1", "e8m0", 32, name="mxfp4"),
        BlockFormat("int8", "e8m0", 32, name="mxint8"),
        # NVIDIA: 16 E2M1 elements per E4M3 scale, one FP32 tensor scale
        BlockFormat("e2m1", "e4m3", 16, "nearest", tensor_scale="fp32", name="nvfp4"),
        # DeepSeek-V3: FP32 scale amax/448 per 1x128 tile (activations) or 128x128 block (weights)
        BlockFormat("e4m3", "fp32", 128, "nearest", amax_floor=1e-4, name="fp8_block_1x128"),
        BlockFormat("e4m3", "fp32", (128, 128), "nearest", amax_floor=1e-4, name="fp8_block_128x128"),
    )
}
_BLOCK_ALIASES = {"mxfp4_e2m1": "mxfp4", "mxint8_int8": "mxint8"}


def format(name):  # noqa: A001 - the public API name: fpsim.format
    """A format by name: a block preset (BlockFormat) or a plain format (Format); objects pass through."""
    if isinstance(name, (Format, BlockFormat)):
        return name
    if isinstance(name, str):
        key = name.strip().lower().replace("-", "_")
        key = _BLOCK_ALIASES.get(key, key)
        if key in BLOCK_PRESETS:
            return BLOCK_PRESETS[key]
    try:
        return get_plain_format(name)
    except ValueError as error:
        raise ValueError(f"{error}; block formats: {', '.join(BLOCK_PRESETS)}") from None
