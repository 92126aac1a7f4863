"""Quantising to block formats: fpsim.quantize, encode and decode for a `BlockFormat`.

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
3. scales: the block's scale rule (`blocks.SCALE_RULES`) turns the amax into
   a value of the scale format (and, for NVFP4, the tensor amax over the
   finite values into the FP32 tensor scale);
4. elements: each element is x / (block scale * tensor scale), rounded once
   from its exact value into the element format in the chosen rounding mode
   (`quotient.round_quotient`), saturating at the element's max, as every
   spec says. A block whose scale is 0 (an E4M3 scale that underflows) has
   elements ±0.

Scales are always computed with round-to-nearest as their sources define;
the rounding mode (stochastic included) applies to the elements. Torch
tensors are quantised on the host and come back on their device.
"""

from __future__ import annotations

import dataclasses
import functools
from fractions import Fraction

import numpy as np

from . import _arrays, _native, _native_blocks
from ._fpmode import subnormals_kept
from ._arrays import numpy_generator, on_device  # shared with fpsim.recipes through this module
from .blocks import BlockFormat, format
from .codec import code_dtype, decode as decode_codes, encode as encode_values
from .formats import PRESETS
from .modes import check_rounding
from .quotient import round_quotient
from .rounding import quantize as quantize_values

__all__ = ["BlockEncoding", "decode", "encode", "host_array", "numpy_generator", "on_device", "quantize"]

_FP32 = PRESETS["fp32"]

# ------------------------------------------------------------- blocking
@dataclasses.dataclass
class _Blocks:
    """A host array cut into blocks: `view` has each blocked axis a split into (blocks, block_size[a])."""

    view: np.ndarray
    element_axes: tuple[int, ...]  # the block_size axes of view
    axes: tuple[int, ...]          # the blocked axes of the input
    shape: tuple[int, ...]         # the input's shape
    padded: tuple[int, ...]        # the shape after padding to whole blocks

    @property
    def runs(self) -> int | None:
        """The block size where each block is a run of consecutive elements of `view` (blocks of
        one axis, the last): the layout of the compiled kernel's block entry points; else None."""
        if self.element_axes == (self.view.ndim - 1,) and self.view.flags.c_contiguous:
            return self.view.shape[-1]
        return None

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
        over = "1 axis" if dims == 1 else f"{dims} axes"
        raise ValueError(f"{fmt.name} has blocks over {over}; the input has {ndim} "
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


def host_array(x):
    """(float32 or float64 numpy array holding x's values exactly, torch device or None) for any accepted input.

    Shared with fpsim.recipes: torch tensors are processed on the host and returned with `on_device`.
    """
    x = _arrays.accept(x).array  # TypeError for what no path takes; masked and foreign arrays as numpy
    _arrays.input_format(x)  # TypeError for complex, bool, unknown dtypes
    ops = _arrays.Ops(x)
    device = ops.device
    array = ops.host_values(x)
    in_fmt = _arrays.input_format(array)
    if in_fmt is None:  # integers: those float64 holds exactly (compared as integers, before any conversion)
        values, inexact = _arrays.integers_as_float64(array)
        if inexact is not None:
            v = array[inexact]
            raise ValueError(f"integer {int(v) if isinstance(v, np.integer) else v!r} is not exactly a float64; "
                             f"block formats and recipes take floats or integers exact in float64")
        return values, device
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


def _prepare(x, fmt, axis, scale_rule, rounding: str = "nearest_even"):
    """(format, _Blocks or None for a meta tensor, torch device or None, _arrays.Accepted of x)."""
    fmt = format(fmt)
    if not isinstance(fmt, BlockFormat):
        raise TypeError(f"{fmt.name} is not a block format")
    if scale_rule is not None:
        fmt = fmt.with_rule(scale_rule)
    accepted = _arrays.accept(x, rounding == "stochastic")
    if _arrays.is_meta(accepted.array):
        _axes(axis, accepted.array.ndim, fmt)
        return fmt, None, None, accepted
    array, device = host_array(accepted.array)
    blocks = _cut(array, fmt, axis)
    _refuse_split_blocks(x, blocks.axes, fmt)
    return fmt, blocks, device, accepted


def _refuse_split_blocks(x, axes: tuple, fmt: BlockFormat) -> None:
    """A DTensor sharded along a blocked axis: each rank would cut its own part into blocks, which are not
    the whole tensor's (ValueError)."""
    if type(x).__name__ != "DTensor":
        return
    split = [p for p in x.placements if p.is_shard() and p.dim % x.ndim in axes]
    if split:
        raise ValueError(f"{fmt.name} cuts blocks along axes {axes}, and this DTensor is sharded along "
                         f"{split[0].dim}: quantise x.full_tensor(), or shard along another axis")


def _meta_shapes(x, fmt: BlockFormat, axis) -> tuple:
    """(scales' shape, an input of one block in x's dtype on the host): what a meta tensor's results need."""
    axes = _axes(axis, x.ndim, fmt)
    size = dict(zip(axes, fmt.block_shape))
    scales = tuple(-(-n // size[i]) if i in size else n for i, n in enumerate(x.shape))
    one = np.zeros(tuple(size.get(i, 1) for i in range(x.ndim)),
                   dtype=np.float64 if x.dtype.is_floating_point and x.itemsize == 8 or not x.dtype.is_floating_point
                   else np.float32)
    return scales, one


def _meta_like(x, shape, array):
    """A meta tensor of `shape` in the torch dtype of numpy `array` (no data: a traced call's result)."""
    import torch

    return torch.empty(shape, dtype=torch.from_numpy(np.asarray(array)).dtype, device="meta")


def _scales(blocks: _Blocks, fmt: BlockFormat):
    """(block scales as float64 with keepdims, tensor scale (float) or None, NaN-block mask).

    The amaxes keep the input's dtype (float32 or float64), which holds them exactly.
    """
    view = blocks.view
    if _native.available() and blocks.runs:
        amax = _native.block_amax(view, blocks.runs)
    else:
        bits = np.uint32 if view.dtype == np.float32 else np.uint64
        magnitude = view.view(bits) & bits(np.iinfo(bits).max >> 1)  # |x| as bits: NaN > Inf > finite
        amax = magnitude.max(axis=blocks.element_axes, keepdims=True).view(view.dtype)
    bad = ~np.isfinite(amax)
    clean = np.where(bad, view.dtype.type(0), amax)
    tensor_scale = None
    if fmt.tensor_scale is not None:  # the tensor amax is taken over the finite values
        tensor_amax = np.max(clean, initial=0)
        if np.any(bad):
            tensor_amax = np.max(np.abs(view[np.isfinite(view)]), initial=0)
        tensor_scale = fmt.tensor_scale_of(tensor_amax)
    with np.errstate(all="ignore"):
        scale = fmt.rule.compute(clean, fmt, 1.0 if tensor_scale is None else tensor_scale)
    scale = np.where(bad, np.nan, scale)
    return scale, tensor_scale, bad | np.isnan(scale)


def _elements(blocks, fmt, scale, tensor_scale, nan_blocks, rounding, codes, rng, values_dtype=None):
    """Element values (values_dtype, else float32 or float64) or codes, in the blocked layout;
    with values_dtype, the dequantised values (element * scale * tensor scale) in it.

    Float elements of float32 input in blocks of consecutive elements go through the compiled
    kernel's block entry point in deterministic modes (one pass: divide, round, store), the rest
    through round_quotient; both round the exact quotient (tests/test_blocks.py checks them
    against exact_blocks)."""
    element = fmt.element_format
    zero_blocks = scale == 0
    view = blocks.view
    factors = [np.where(nan_blocks | zero_blocks, 1.0, scale)]  # (their elements are replaced below)
    if tensor_scale is not None:
        factors.insert(0, tensor_scale)
    divisor = factors[-1] * tensor_scale if tensor_scale is not None else factors[0]  # exact: <= 28 bits
    if (fmt.kind == "float" and view.dtype == np.float32 and blocks.runs
            and _native.covers_blocks(element, rounding)):
        out = _native.run_blocks(view, divisor, blocks.runs, element, rounding=rounding, saturate=True,
                                 codes=codes, values_dtype=values_dtype, rescale=values_dtype is not None)
        scaled = values_dtype is not None
    else:
        scaled = False
        if np.any(nan_blocks):
            view = np.where(nan_blocks, 0, view)  # their elements are replaced below
        out = round_quotient(view, factors, element, rounding, saturate=True,
                             codes=codes and fmt.kind == "float", powers_of_two=fmt.rule.power_of_two, **rng)
    if fmt.kind == "int":
        out = np.where(out == 0, 0.0, out)  # two's complement has no -0
        if codes:
            k = np.rint(out.astype(np.float64) * 2.0 ** fmt.element.frac_bits).astype(np.int64)
            out = (k & ((1 << fmt.element.bits) - 1)).astype(np.uint8 if fmt.element.bits <= 8 else np.uint16)
    if np.any(zero_blocks):  # elements ±0: the input's sign where the element format has -0
        zeros = np.copysign(np.float32(0), view).astype(np.float32)
        if fmt.kind == "int":
            zeros = np.zeros(view.shape, dtype=np.float32) if not codes else np.zeros(view.shape, dtype=out.dtype)
        else:
            zeros = (encode_values if codes else quantize_values)(zeros, element)
        out = np.where(zero_blocks, zeros.astype(out.dtype), out)
    if np.any(nan_blocks):
        if codes:
            fill = encode_values(np.float32(np.nan), element) if element.has_nan else 0
        else:
            fill = np.nan
        out = np.where(nan_blocks, np.asarray(fill).astype(out.dtype), out)
    if values_dtype is not None and not scaled:  # dequantise (exact: values_dtype holds the values)
        out = out.astype(values_dtype)  # a fresh array
        out *= divisor.astype(values_dtype)
    return out


def _random(rounding, seed, generator, rand_bits):
    check_rounding(rounding)
    if rounding != "stochastic":
        if rand_bits is not None or seed is not None or generator is not None:
            raise ValueError("seed, generator and rand_bits apply to rounding='stochastic' only")
        return {}
    if seed is not None and generator is not None:
        raise ValueError("give either seed or generator, not both")
    return dict(seed=seed, generator=numpy_generator(generator), rand_bits=rand_bits)


def _check_unsupported(saturate, flush_subnormal_inputs, flush_subnormal_outputs):
    if not isinstance(saturate, (bool, np.bool_)):
        raise TypeError(f"saturate must be a bool, got {saturate!r}")
    if flush_subnormal_inputs or flush_subnormal_outputs:
        raise ValueError("flush_subnormal_inputs/outputs are not defined for block formats")


@subnormals_kept
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
    rng = _random(rounding, seed, generator, rand_bits)
    fmt, blocks, device, accepted = _prepare(x, fmt, axis, scale_rule, rounding)
    if blocks is None:  # a meta tensor: the result's shape and dtype
        _, one = _meta_shapes(accepted.array, fmt, axis)
        return accepted.give_back(_meta_like(accepted.array, accepted.array.shape,
                                             np.empty(0, _result_dtype(fmt, one.dtype == np.float64))))
    dtype = _result_dtype(fmt, blocks.view.dtype == np.float64)
    native = None
    if _native_blocks.covers(fmt, blocks.runs, blocks.view.dtype, rounding):
        native = _native_blocks.quantize(blocks.view, fmt, rounding, dtype)
    if native is not None:
        values = native[0]
    else:
        scale, tensor_scale, nan_blocks = _scales(blocks, fmt)
        values = _elements(blocks, fmt, scale, tensor_scale, nan_blocks, rounding, False, rng, dtype)
    return accepted.give_back(on_device(blocks.unblock(values), device))


@subnormals_kept
def encode(x, fmt, rounding: str = "nearest_even", saturate: bool = False, seed=None, *, generator=None,
           rand_bits=None, axis=None, scale_rule: str | None = None, flush_subnormal_inputs: bool = False,
           flush_subnormal_outputs: bool = False) -> BlockEncoding:
    """x in block format `fmt` as codes: a BlockEncoding (.codes, .scales, .tensor_scale); options as quantize."""
    _check_unsupported(saturate, flush_subnormal_inputs, flush_subnormal_outputs)
    rng = _random(rounding, seed, generator, rand_bits)
    if type(x).__name__ == "DTensor":
        raise ValueError(f"encode of a DTensor in {fmt if isinstance(fmt, str) else format(fmt).name}: its codes "
                         f"and block scales are not one sharded tensor; encode x.to_local() on each rank, or "
                         f"x.full_tensor()")
    fmt, blocks, device, accepted = _prepare(x, fmt, axis, scale_rule, rounding)
    if blocks is None:  # a meta tensor: the results' shapes and dtypes
        scales_shape, one = _meta_shapes(accepted.array, fmt, axis)
        probe = encode(one, fmt, axis=axis)
        ts = None if probe.tensor_scale is None else _meta_like(accepted.array, (), probe.tensor_scale)
        return BlockEncoding(accepted.give_back(_meta_like(accepted.array, accepted.array.shape, probe.codes)),
                             _meta_like(accepted.array, scales_shape, probe.scales), ts, fmt, probe.axis, probe.dtype)
    native = None
    if _native_blocks.covers(fmt, blocks.runs, blocks.view.dtype, rounding):
        native = _native_blocks.quantize(blocks.view, fmt, rounding, code_dtype(fmt.element))
    if native is not None:
        codes, scale_codes, tensor_scale = native
    else:
        scale, tensor_scale, nan_blocks = _scales(blocks, fmt)
        codes = _elements(blocks, fmt, scale, tensor_scale, nan_blocks, rounding, True, rng)
        scale_codes = _scale_codes(np.squeeze(scale, axis=blocks.element_axes), fmt.scale)
    dtype = _result_dtype(fmt, blocks.view.dtype == np.float64)
    ts = None
    if tensor_scale is not None:
        ts = on_device(np.float32(tensor_scale), device)
    return BlockEncoding(accepted.give_back(on_device(blocks.unblock(codes), device)),
                         on_device(scale_codes, device), ts, fmt, blocks.axes, dtype.name)


def _scale_codes(scale, scale_format):
    """Codes of exact scale values (float64): FP32's are its bits, others go through float32 when it holds them."""
    if scale_format == _FP32:
        return scale.astype(np.float32).view(np.uint32)
    return encode_values(scale.astype(np.float32) if _FP32.contains(scale_format) else scale, scale_format)


@subnormals_kept
def decode(encoding: BlockEncoding):
    """The values of a BlockEncoding (element * scale * tensor scale) in its dtype, bit for bit."""
    if not isinstance(encoding, BlockEncoding):
        raise TypeError(f"decode of a block format takes a BlockEncoding, got {type(encoding).__name__}")
    fmt = encoding.format
    if (encoding.tensor_scale is None) != (fmt.tensor_scale is None):
        raise ValueError(f"{fmt.name} " + ("has a tensor scale: this encoding's tensor_scale is None"
                                           if fmt.tensor_scale is not None else
                                           f"has no tensor scale, got tensor_scale {encoding.tensor_scale!r}"))
    accepted = _arrays.accept(encoding.codes)   # masked codes give masked values, meta codes meta values
    if _arrays.is_meta(accepted.array):
        return accepted.give_back(_meta_like(accepted.array, accepted.array.shape, np.empty(0, encoding.dtype)))
    device = _arrays.Ops(accepted.array).device
    codes, scale_codes = (_arrays.Ops(a).to_host(a) for a in (accepted.array, encoding.scales))
    blocks = _cut(np.zeros(codes.shape, dtype=np.float32), fmt, encoding.axis)
    expected = tuple(np.delete(blocks.view.shape, blocks.element_axes))
    if scale_codes.shape != expected:
        raise ValueError(f"scales of shape {scale_codes.shape} do not fit codes of shape {codes.shape} in "
                         f"{fmt.name} along axes {encoding.axis}: expected {expected}")
    if fmt.kind == "int":
        _check_int_codes(codes, fmt.element)
        signed = codes.astype(np.int64)
        signed = np.where(signed >= 1 << (fmt.element.bits - 1), signed - (1 << fmt.element.bits), signed)
        elements = signed * 2.0 ** -fmt.element.frac_bits
    else:
        elements = decode_codes(codes, fmt.element).astype(np.float64)
    scale = np.expand_dims(decode_codes(scale_codes, fmt.scale).astype(np.float64), blocks.element_axes)
    values = blocks.block(elements) * scale
    if fmt.tensor_scale is not None:
        values = values * float(encoding.tensor_scale)
    return accepted.give_back(on_device(blocks.unblock(values.astype(encoding.dtype)), device))


def _check_int_codes(codes: np.ndarray, element) -> None:
    """Integer element codes (two's complement in `element.bits`), as decode of a float element checks its own."""
    if codes.dtype.kind not in "iu":
        raise TypeError(f"codes of {element.name} must be integers, got dtype {codes.dtype}")
    outside = (codes < 0) | (codes >= 1 << element.bits)
    if np.any(outside):
        i = tuple(int(k[0]) for k in np.nonzero(outside))
        raise ValueError(f"code {codes[i]} at index {i} is outside 0..{(1 << element.bits) - 1} for "
                         f"{element.name} ({element.bits} bits)")
