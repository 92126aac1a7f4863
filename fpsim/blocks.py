"""Block-scaled formats: MX (OCP Microscaling v1.0), NVFP4 and block-wise FP8.

A block format stores a tensor as small elements (FP8, FP6, FP4 or INT8)
and one shared scale per block of elements (E8M0 powers of two for MX, E4M3
for NVFP4, FP32 for DeepSeek-V3's block-wise FP8), plus, for NVFP4, one FP32
scale for the whole tensor. A value is element * block scale * tensor scale.

    fpsim.quantize(x, "mxfp8_e4m3")            # dequantised values, blocks along axis -1
    enc = fpsim.encode(x, "nvfp4")              # .codes, .scales, .tensor_scale
    fpsim.decode(enc)                           # the values back, bit for bit
    fpsim.quantize(x, "mxfp8_e4m3", scale_rule="rceil")   # cuBLAS's scale rule

Quantising a block, in order (each step's choices are in docs/blocks.md):

1. take the blocks: the blocked axes are cut into blocks; a last partial
   block is quantised as if padded with zeros (the specs assume whole
   blocks; zeros leave the amax unchanged);
2. amax: the largest magnitude of each block. A block holding NaN or Inf
   gets a NaN scale and decodes to NaN throughout (OCP MX v1.0: a NaN scale
   makes every element of its block NaN);
3. scales: the block's scale rule (`SCALE_RULES`) turns the amax into a
   value of the scale format (and, for NVFP4, the tensor amax into the FP32
   tensor scale);
4. elements: each element is x / (block scale * tensor scale), rounded once
   from its exact value into the element format in the chosen rounding mode,
   saturating at the element's max (as every spec says). A block whose
   scale is 0 (an E4M3 scale that underflows) has elements ±0.

Scales are always computed with round-to-nearest as their sources define;
the rounding mode (stochastic included) applies to the elements.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from fractions import Fraction
from typing import Callable

import numpy as np

from . import _arrays
from .codec import decode as decode_codes, encode as encode_values
from .formats import PRESETS, Format, format as get_plain_format
from .modes import check_rounding
from .rounding import quantize as quantize_values

__all__ = ["BLOCK_PRESETS", "SCALE_RULES", "BlockEncoding", "BlockFormat", "IntFormat", "ScaleRule",
           "decode", "encode", "format", "quantize", "round_quotient"]

_FP32 = PRESETS["fp32"]
_FP64 = PRESETS["fp64"]


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
        if not 2 <= self.bits <= 16 or not 0 <= self.frac_bits <= self.bits + 20:
            raise ValueError(f"IntFormat(bits={self.bits}, frac_bits={self.frac_bits}): bits must be 2..16 "
                             f"and frac_bits 0..bits+20")

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
    """How a block's amax becomes its scale. `compute(amax, fmt, tensor_scale)` takes float64 amaxes
    (finite, >= 0) and returns float64 scale values of fmt.scale (NaN where out of its range)."""

    name: str
    power_of_two: bool  # needs a scale format of powers of two (E8M0)
    summary: str
    source: str
    compute: Callable = dataclasses.field(repr=False, compare=False)


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
        if not isinstance(self.amax_floor, (int, float)) or not 0 <= self.amax_floor < math.inf:
            raise ValueError(f"amax_floor must be a finite number >= 0, got {self.amax_floor!r}")
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


# ----------------------------------------------------- exact quotients
def round_quotient(x, factors, fmt: Format, rounding: str = "nearest_even", *, saturate: bool = False,
                   codes: bool = False, seed=None, generator=None, rand_bits=None):
    """x / (f1 * f2 * ...) rounded once, from its exact value, into `fmt`: values (or codes).

    x: float32 or float64 array. factors: positive finite divisors (arrays
    broadcasting against x, or numbers), each exactly a float32, whose
    product has at most 28 significant bits: an FP32 tensor scale times an
    E4M3 block scale, an FP32 scale, a power of two.

    The quotient is first computed in floating point, dividing by one factor
    after the other: every step is monotone and the later factors times a
    value of fmt with one more mantissa bit (a "decision point": a value of
    fmt or a midpoint) are exact, so the computed quotient never crosses a
    decision point. Where it lands exactly on one and the exact quotient is
    elsewhere, it is moved one ulp to the side of the exact quotient, which
    is decided exactly (q * product has at most 28 + man_bits + 2 <= 53
    bits). Stochastic rounding works on the float64 quotient: exact for
    power-of-two divisors, within 2^-53 of the exact probability otherwise.
    """
    x = np.asarray(x)
    factors = [np.asarray(f, dtype=np.float64) for f in factors]
    product = functools.reduce(np.multiply, factors, np.float64(1.0))  # exact: <= 28 bits
    finish = encode_values if codes else quantize_values
    if rounding == "stochastic":
        with np.errstate(under="ignore"):
            w = x.astype(np.float64) / product
        return finish(w, fmt, rounding, saturate, seed, generator=generator, rand_bits=rand_bits)
    finer = Format(fmt.exp_bits, fmt.man_bits + 1, fmt.bias, fmt.signed, fmt.infinities,
                   "none" if fmt.nan == "fn" else fmt.nan, fmt.subnormals, fmt.zero)
    narrow = _FP32.contains(finer)
    pow2 = all(not np.any(np.frexp(f)[0] != 0.5) for f in factors)
    with np.errstate(under="ignore", over="ignore", invalid="ignore", divide="ignore"):
        if narrow and x.dtype == np.float32:
            q = x
            for f in factors:
                q = q / f.astype(np.float32)
        else:
            q = x.astype(np.float64) / product
            if narrow:
                q = q.astype(np.float32)
        if pow2 and x.dtype == np.float32:
            # exact unless the quotient underflows (possible only for divisors above 2), where
            # only 0 is near a decision point
            check = np.flatnonzero(q == 0) if np.max(product) > 2 else None
        else:
            check = np.flatnonzero(quantize_values(q, finer, "toward_zero", saturate=True) == q)
    if check is not None and check.size:
        q = _nudge(q, check, np.broadcast_to(x, q.shape), np.broadcast_to(product, q.shape))
    return finish(q, fmt, rounding, saturate)


def _nudge(q, flat, x, product):
    """Move q one ulp toward the exact x / product at the flat indices `flat` where they differ."""
    q = np.ascontiguousarray(q).copy()
    q_at = q.reshape(-1)[flat]
    residual = x.reshape(-1)[flat].astype(np.float64) - q_at.astype(np.float64) * product.reshape(-1)[flat]
    direction = np.where(residual > 0, np.inf, -np.inf).astype(q.dtype)
    q.reshape(-1)[flat] = np.where(residual != 0, np.nextafter(q_at, direction), q_at)
    return q


# ------------------------------------------------------------- blocking
@dataclasses.dataclass
class _Blocks:
    """A host array cut into blocks: `view` has each blocked axis a split into (blocks, block_size[a])."""

    view: np.ndarray
    element_axes: tuple[int, ...]  # the block_size axes of view
    axes: tuple[int, ...]          # the blocked axes of the input
    shape: tuple[int, ...]         # the input's shape
    padded: tuple[int, ...]        # the shape after padding to whole blocks

    def unblock(self, values):
        """Back to the input's shape (dropping the padding)."""
        values = values.reshape(self.padded)
        if self.padded != self.shape:
            values = values[tuple(slice(0, n) for n in self.shape)]
        return values

    def block(self, values):
        """An array of the input's shape in the same blocked layout (padded with zeros)."""
        if self.padded != self.shape:
            values = np.pad(values, [(0, p - n) for n, p in zip(self.shape, self.padded)])
        return values.reshape(self.view.shape)


def _axes(axis, ndim: int, fmt: BlockFormat) -> tuple[int, ...]:
    dims = len(fmt.block_shape)
    if ndim < dims:
        raise ValueError(f"{fmt.name} has blocks over {dims} axes; the input has {ndim} "
                         f"dimension{'s' if ndim != 1 else ''}")
    if axis is None:
        return tuple(range(ndim - dims, ndim))
    given = axis if isinstance(axis, (tuple, list)) else (axis,)
    if len(given) != dims:
        needs = "1 axis" if dims == 1 else f"{dims} axes"
        raise ValueError(f"axis={axis!r}: {fmt.name} has blocks of shape {fmt.block_shape}, so axis needs {needs}")
    out = []
    for a in given:
        if isinstance(a, bool) or not isinstance(a, (int, np.integer)) or not -ndim <= a < ndim:
            raise ValueError(f"axis={axis!r} is out of range for an input of {ndim} dimensions "
                             f"(allowed: -{ndim}..{ndim - 1})")
        out.append(int(a) % ndim)
    if len(set(out)) != len(out):
        raise ValueError(f"axis={axis!r} names the same axis twice")
    return tuple(out)


def _cut(array: np.ndarray, fmt: BlockFormat, axis) -> _Blocks:
    axes = _axes(axis, array.ndim, fmt)
    original = array.shape
    size = dict(zip(axes, fmt.block_shape))
    padded = tuple(-(-n // size[i]) * size[i] if i in size else n for i, n in enumerate(array.shape))
    if padded != array.shape:
        array = np.pad(array, [(0, p - n) for n, p in zip(array.shape, padded)])
    shape, element_axes = [], []
    for i, n in enumerate(padded):
        if i in size:
            shape.append(n // size[i])
            element_axes.append(len(shape))
            shape.append(size[i])
        else:
            shape.append(n)
    return _Blocks(array.reshape(shape), tuple(element_axes), axes, original, padded)


def _host(x):
    """(float32 or float64 numpy array, torch device or None) for any accepted input."""
    device = None
    if _arrays.is_torch(x):
        device = x.device
        _arrays.input_format(x)  # TypeError for complex, bool, unknown dtypes
        x = x.detach().cpu()
        x = (x.to(_arrays._torch.float64) if x.dtype == _arrays._torch.float64 or not x.is_floating_point()
             else x.float()).numpy()
    array, _ = _arrays.as_array(x)
    if array.ndim == 0:
        raise ValueError("block formats quantise arrays (blocks of elements), got a scalar")
    in_fmt = _arrays.input_format(array)
    if in_fmt is None:  # integers: exact in float64 up to 2^53
        big = np.abs(array.astype(object) if array.dtype == object else array.astype(np.float64)) > 2**53
        if np.any(big):
            raise ValueError(f"integer {array[np.nonzero(big)][0]!r} exceeds 2^53; block formats take floats "
                             f"or integers exact in float64")
        return array.astype(np.float64), device
    return array.astype(np.float32 if _FP32.contains(in_fmt) else np.float64, copy=False), device


@functools.lru_cache(maxsize=256)
def _result_dtype(fmt: BlockFormat, wide_input: bool):
    """float32 when it holds every dequantised value of float32-or-narrower input, else float64.

    Power-of-two scales add no significand bits; the largest value is
    max_elem times the scale the rule gives to amax = FP32's max.
    """
    if wide_input or fmt.scale.man_bits or fmt.tensor_scale is not None:
        return np.dtype(np.float64)
    with np.errstate(all="ignore"):
        top = fmt.rule.compute(np.array([float(_FP32.max)]), fmt, 1.0)[0] * float(fmt.element_max)
    lowest = fmt.element_format.min_subnormal * Fraction(2) ** fmt.scale.emin
    fits = top <= float(_FP32.max) and lowest >= _FP32.min_subnormal
    return np.dtype(np.float32 if fits else np.float64)


# ------------------------------------------------------------ quantising
@dataclasses.dataclass(frozen=True)
class BlockEncoding:
    """A tensor in a block format: what `fpsim.encode(x, block_format)` returns and `fpsim.decode` takes.

    codes: element codes, the input's shape (unsigned; INT8 elements in two's
      complement); scales: codes of the scale format, one per block (the
      input's shape with each blocked axis divided by its block size, rounded
      up); tensor_scale: the FP32 tensor scale (NVFP4), else None; format:
      the BlockFormat; axis: the blocked axes; dtype: the dtype decode returns.
    Arrays are numpy arrays, or torch tensors when the input was one.
    """

    codes: object
    scales: object
    tensor_scale: object
    format: BlockFormat
    axis: tuple
    dtype: str


def _prepare(x, fmt, axis, scale_rule):
    fmt = format(fmt)
    if not isinstance(fmt, BlockFormat):
        raise TypeError(f"{fmt.name} is not a block format")
    if scale_rule is not None:
        fmt = fmt.with_rule(scale_rule)
    array, device = _host(x)
    return fmt, _cut(array, fmt, axis), device


def _scales(blocks: _Blocks, fmt: BlockFormat):
    """(block scales as float64 with keepdims, tensor scale (float) or None, NaN-block mask)."""
    view = blocks.view
    bits = np.uint32 if view.dtype == np.float32 else np.uint64
    magnitude = view.view(bits) & bits(np.iinfo(bits).max >> 1)  # |x| as bits: NaN > Inf > finite
    amax = magnitude.max(axis=blocks.element_axes, keepdims=True).view(view.dtype).astype(np.float64)
    bad = ~np.isfinite(amax)
    clean = np.where(bad, 0.0, amax)
    tensor_scale = None
    if fmt.tensor_scale is not None:  # the tensor amax is taken over the finite values
        tensor_amax = np.max(clean, initial=0.0)
        if np.any(bad):
            finite = np.abs(view[np.isfinite(view)])
            tensor_amax = float(np.max(finite, initial=0.0))
        divisor = [float(fmt.element_max), float(fmt.scale.max)]
        tensor_scale = float(round_quotient(np.array([tensor_amax]), divisor, fmt.tensor_scale,
                                            saturate=True)[0]) or 1.0
    with np.errstate(all="ignore"):
        scale = fmt.rule.compute(clean, fmt, 1.0 if tensor_scale is None else tensor_scale)
    scale = np.where(bad, np.nan, scale)
    return scale, tensor_scale, bad | np.isnan(scale)


def _elements(blocks, fmt, scale, tensor_scale, nan_blocks, rounding, codes, rng):
    """Element values (float32 or float64) or codes, in the blocked layout."""
    element = fmt.element_format
    zero_blocks = scale == 0
    view = blocks.view
    if np.any(nan_blocks):
        view = np.where(nan_blocks, 0, view)  # their elements are replaced below
    factors = [np.where(nan_blocks | zero_blocks, 1.0, scale)]
    if tensor_scale is not None:
        factors.insert(0, tensor_scale)
    out = round_quotient(view, factors, element, rounding, saturate=True, codes=codes and fmt.kind == "float",
                         **rng)
    if fmt.kind == "int":
        out = np.where(out == 0, 0.0, out)  # two's complement has no -0
        if codes:
            k = np.rint(out.astype(np.float64) * 2.0 ** fmt.element.frac_bits).astype(np.int64)
            out = (k & ((1 << fmt.element.bits) - 1)).astype(np.uint8 if fmt.element.bits <= 8 else np.uint16)
    if np.any(zero_blocks):
        signed_zero = np.copysign(0.0, view) if fmt.kind == "float" else np.zeros(view.shape)
        fill = encode_values(signed_zero.astype(np.float32), element) if codes else signed_zero
        out = np.where(zero_blocks, fill if codes or fmt.kind == "int" else fill.astype(out.dtype), out)
    if np.any(nan_blocks):
        if codes:
            fill = encode_values(np.float32(np.nan), element) if element.has_nan else 0
        else:
            fill = np.nan
        out = np.where(nan_blocks, np.asarray(fill).astype(out.dtype), out)
    return out


def _random(rounding, seed, generator, rand_bits, device):
    check_rounding(rounding)
    if rounding != "stochastic":
        if rand_bits is not None or seed is not None or generator is not None:
            raise ValueError("seed, generator and rand_bits apply to rounding='stochastic' only")
        return {}
    if generator is not None and not isinstance(generator, np.random.Generator):
        torch = _arrays._torch
        if torch is None or not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a numpy.random.Generator or torch.Generator, got {generator!r}")
        seed, generator = int(torch.randint(0, 2**62, (1,), generator=generator)), None
    return dict(seed=seed, generator=generator, rand_bits=rand_bits)


def _to_device(array, device):
    if device is None:
        return array
    return _arrays._torch.from_numpy(np.ascontiguousarray(array)).to(device)


def _check_unsupported(saturate, flush_subnormal_inputs, flush_subnormal_outputs):
    if not isinstance(saturate, (bool, np.bool_)):
        raise TypeError(f"saturate must be a bool, got {saturate!r}")
    if flush_subnormal_inputs or flush_subnormal_outputs:
        raise ValueError("flush_subnormal_inputs/outputs are not defined for block formats")


def quantize(x, fmt, rounding: str = "nearest_even", saturate: bool = False, seed=None, *, generator=None,
             rand_bits=None, axis=None, scale_rule: str | None = None, flush_subnormal_inputs: bool = False,
             flush_subnormal_outputs: bool = False):
    """The dequantised values of x in block format `fmt`: element * scale * tensor scale, exact.

    axis: the blocked axis (an int, or a tuple for blocks over several axes);
      default: the last axes. scale_rule: overrides the format's rule.
    rounding, seed, generator, rand_bits: the elements' rounding, as in
      fpsim.quantize. Elements always saturate at their max, as the specs say
      (`saturate` is accepted for the common signature and changes nothing).
    Returns float32 where it holds every value (MX with the OCP rule on
    float32-or-narrower input), else float64; a torch tensor on the input's
    device for torch input.
    """
    _check_unsupported(saturate, flush_subnormal_inputs, flush_subnormal_outputs)
    fmt, blocks, device = _prepare(x, fmt, axis, scale_rule)
    rng = _random(rounding, seed, generator, rand_bits, device)
    scale, tensor_scale, nan_blocks = _scales(blocks, fmt)
    elements = _elements(blocks, fmt, scale, tensor_scale, nan_blocks, rounding, False, rng)
    dtype = _result_dtype(fmt, blocks.view.dtype == np.float64)
    values = elements.astype(dtype, copy=False) * scale.astype(dtype)
    if tensor_scale is not None:
        values = values * dtype.type(tensor_scale)
    return _to_device(blocks.unblock(values), device)


def encode(x, fmt, rounding: str = "nearest_even", saturate: bool = False, seed=None, *, generator=None,
           rand_bits=None, axis=None, scale_rule: str | None = None, flush_subnormal_inputs: bool = False,
           flush_subnormal_outputs: bool = False) -> BlockEncoding:
    """x in block format `fmt` as codes: a BlockEncoding (.codes, .scales, .tensor_scale); options as quantize."""
    _check_unsupported(saturate, flush_subnormal_inputs, flush_subnormal_outputs)
    fmt, blocks, device = _prepare(x, fmt, axis, scale_rule)
    rng = _random(rounding, seed, generator, rand_bits, device)
    scale, tensor_scale, nan_blocks = _scales(blocks, fmt)
    codes = _elements(blocks, fmt, scale, tensor_scale, nan_blocks, rounding, True, rng)
    scale_codes = encode_values(np.squeeze(scale, axis=blocks.element_axes), fmt.scale)
    dtype = _result_dtype(fmt, blocks.view.dtype == np.float64)
    ts = None
    if tensor_scale is not None:
        ts = np.float32(tensor_scale) if device is None else _arrays._torch.tensor(tensor_scale, device=device)
    return BlockEncoding(_to_device(blocks.unblock(codes), device), _to_device(scale_codes, device), ts, fmt,
                         blocks.axes, dtype.name)


def decode(encoding: BlockEncoding):
    """The values of a BlockEncoding (element * scale * tensor scale) in its dtype, bit for bit."""
    if not isinstance(encoding, BlockEncoding):
        raise TypeError(f"decode of a block format takes a BlockEncoding, got {type(encoding).__name__}")
    fmt = encoding.format
    device = encoding.codes.device if _arrays.is_torch(encoding.codes) else None
    host = [a.cpu().numpy() if _arrays.is_torch(a) else np.asarray(a) for a in (encoding.codes, encoding.scales)]
    codes, scale_codes = host
    blocks = _cut(np.zeros(codes.shape, dtype=np.float32), fmt, encoding.axis)
    expected = tuple(np.delete(blocks.view.shape, blocks.element_axes))
    if scale_codes.shape != expected:
        raise ValueError(f"scales of shape {scale_codes.shape} do not fit codes of shape {codes.shape} in "
                         f"{fmt.name} along axes {encoding.axis}: expected {expected}")
    if fmt.kind == "int":
        signed = codes.astype(np.int64)
        signed = np.where(signed >= 1 << (fmt.element.bits - 1), signed - (1 << fmt.element.bits), signed)
        elements = signed * 2.0 ** -fmt.element.frac_bits
    else:
        elements = decode_codes(codes, fmt.element).astype(np.float64)
    scale = np.expand_dims(decode_codes(scale_codes, fmt.scale).astype(np.float64), blocks.element_axes)
    values = blocks.block(elements) * scale
    if fmt.tensor_scale is not None:
        values = values * float(encoding.tensor_scale)
    return _to_device(blocks.unblock(values.astype(encoding.dtype)), device)
