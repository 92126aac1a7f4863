"""encode() and decode(): between values and the bit patterns of a format.

encode rounds like `quantize` (same engine, same options), then packs sign,
exponent field and mantissa field into unsigned integers (uint8 up to 8 bits,
uint16 up to 16, then uint32, uint64). decode is the exact inverse on every
code: NaN codes give a quiet NaN (its sign as the code says), and codes that
are not canonical (the exponent-0 codes of a format without subnormals)
decode to zero. The fields themselves are built and read in `_packing`;
this module checks the input and takes the kernel's fast path where it applies.
"""

from __future__ import annotations

import numpy as np

from . import _arrays, _native, philox
from ._fpmode import subnormals_kept
from ._options import RoundingOptions, check_options, first_index, refuse_values_without_code
from ._packing import code_dtype, pack, unpack
from .formats import PRESETS, Format, format as get_format
from .rounding import round_array

__all__ = ["encode", "decode", "code_dtype"]


@subnormals_kept
def encode(x, fmt: "str | Format", rounding: str = "nearest_even", saturate: bool = False,
           seed: int | None = None, *, generator=None, rand_bits: int | None = None,
           flush_subnormal_inputs: bool = False, flush_subnormal_outputs: bool = False, **block_options):
    """Round `x` into `fmt` (as `quantize` does, same options) and return the bit patterns.

    NaN becomes the format's canonical NaN; a format without NaN refuses it
    (ValueError), as it refuses negative values when it is unsigned. Codes
    carry no gradient: a tensor that requires grad is read detached.
    A block format returns a `fpsim.block_codec.BlockEncoding` (.codes,
    .scales, .tensor_scale); it also takes ``axis=`` and ``scale_rule=``.
    """
    if not isinstance(fmt, Format):  # a name, or a block format (one level up: fpsim.blocks)
        from . import blocks
        fmt = blocks.format(fmt)
    options = check_options(rounding, saturate, seed, generator, rand_bits, flush_subnormal_inputs,
                            flush_subnormal_outputs)
    if not isinstance(fmt, Format):
        from . import block_codec

        return block_codec.encode(_arrays.detached(x), fmt, rounding, saturate, seed, generator=generator,
                                  rand_bits=rand_bits, flush_subnormal_inputs=flush_subnormal_inputs,
                                  flush_subnormal_outputs=flush_subnormal_outputs, **block_options)
    if block_options:
        raise TypeError(f"unexpected keyword arguments {sorted(block_options)} (axis and scale_rule apply to "
                        f"block formats only)")
    accepted = _arrays.accept(x, options.rounding == "stochastic")
    array = _arrays.detached(accepted.array)
    if _arrays.is_meta(array):  # no data: the result's shape and dtype
        return accepted.give_back(_arrays.Ops(array).empty(array.shape, code_dtype(fmt).name))
    fast = _encode_native(array, fmt, options)
    if fast is not None:
        return accepted.give_back(fast)
    values = round_array(array, fmt, options)
    ops = _arrays.Ops(values)
    codes = pack(_as_working(values, fmt, ops), fmt, ops)
    return accepted.give_back(ops.astype(codes, np.dtype(code_dtype(fmt)).name))


def _encode_native(array, fmt: Format, options: RoundingOptions):
    """Codes straight from the compiled kernel for float16/32/64 and integer numpy arrays, else None."""
    if not isinstance(array, np.ndarray) or array.dtype.kind not in "fiu":
        return None
    work = array.astype(np.float32) if array.dtype == np.float16 else array  # exactly
    stochastic = options.rounding == "stochastic"
    if not _native.covers(work.dtype, fmt, options.rounding, options.rand_bits if stochastic else None):
        return None
    refuse_values_without_code(work, fmt, options.flush_inputs)
    key = philox.key_from(options.seed, options.generator, torch_input=False) if stochastic else None
    return _native.run(work, fmt, rounding=options.rounding, saturate=options.saturate,
                       flush_inputs=options.flush_inputs, flush_outputs=options.flush_outputs,
                       rand_bits=options.rand_bits, key=key, codes=True)


@subnormals_kept
def decode(codes, fmt: "str | Format | None" = None):
    """The values of bit patterns of `fmt`: float32 when the format fits it, else float64.

    decode(encoding) takes what encode returned for a block format. A
    torch.float4_e2m1fn_x2 tensor (two E2M1 codes per byte, the first in the
    low nibble) decodes to twice as many values along its last dimension."""
    if fmt is None:
        from . import block_codec
        return block_codec.decode(codes)
    if type(codes).__name__ == "BlockEncoding":
        raise TypeError(f"a BlockEncoding carries its format ({codes.format.name}): decode it without one, "
                        f"fpsim.decode(encoding)")
    fmt = get_format(fmt)
    accepted = _arrays.accept(codes)
    out_fmt = PRESETS["fp32"] if PRESETS["fp32"].contains(fmt) else PRESETS["fp64"]
    if _arrays.is_meta(accepted.array):  # no data: the result's shape and dtype
        return accepted.give_back(_arrays.Ops(accepted.array).empty(accepted.array.shape, out_fmt))
    ints = _check_codes(accepted.array, fmt)
    values = unpack(ints, fmt, _arrays.Ops(ints), out_fmt)
    return accepted.give_back(values)


# ---------------------------------------------------------------- checks
def _as_working(values, fmt, ops):
    wide = not PRESETS["fp32"].contains(fmt)  # e.g. a custom format reaching below 2^-149
    return ops.astype(values, "float64" if wide else "float32")


def _check_codes(codes, fmt: Format):
    """The codes as int64, refusing non-integers and codes outside the format."""
    ops = _arrays.Ops(codes)
    if _arrays.is_packed_fp4(codes):
        codes = unpack_fp4_pairs(codes, fmt)
    if codes.dtype == object:  # Python ints beyond int64
        if not all(isinstance(v, int) for v in codes.ravel()):
            raise TypeError("codes must be integers, got an object array of other values")
        outside = np.array([not 0 <= v < (1 << fmt.bits) for v in codes.ravel()]).reshape(codes.shape)
        _refuse_outside(codes, outside, fmt)
        codes = codes.astype(np.uint64)
    if not ops.is_integer(codes):
        raise TypeError(f"codes must be integers, got dtype {codes.dtype}")
    ints = ops.int64_bits(codes)  # uint64 (fp64 codes): the same bits, which the unpacking reads
    if fmt.bits < 64:  # a uint64 code beyond 2^63 reads as a negative int64; the message shows it as given
        _refuse_outside(codes, (ints < 0) | (ints >= (1 << fmt.bits)), fmt)
    return ints


def _refuse_outside(codes, outside, fmt: Format) -> None:
    if bool(outside.any()):
        i = first_index(outside)
        code = int(_arrays.Ops(codes).to_host(codes[i]))  # through numpy: torch has no int() of a uint64 >= 2^63
        raise ValueError(f"code {code} at index {i} is outside 0..{(1 << fmt.bits) - 1} "
                         f"for {fmt.name} ({fmt.bits} bits)")


def unpack_fp4_pairs(packed, fmt: Format):
    """The uint8 codes of a torch.float4_e2m1fn_x2 tensor: low nibble first, last dimension doubled (fmt:
    the 4-bit format they are read in; fpsim.testing compares such tensors through this too)."""
    ops = _arrays.Ops(packed)
    if fmt.bits != 4:
        raise ValueError(f"a torch.float4_e2m1fn_x2 tensor holds 4-bit codes; {fmt.name} has {fmt.bits} bits")
    byte = ops.view(packed, "uint8")
    pairs = ops.stack([byte & 0xF, byte >> 4], -1)
    return pairs.reshape(*byte.shape[:-1], 2 * byte.shape[-1]) if byte.ndim else pairs
