"""encode() and decode(): between values and the bit patterns of a format.

encode rounds like `quantize` (same engine, same options), then packs sign,
exponent field and mantissa field into unsigned integers (uint8 up to 8 bits,
uint16 up to 16, then uint32, uint64). decode is the exact inverse on every
code: NaN codes give a quiet NaN (its sign as the code says), and codes that
are not canonical (the exponent-0 codes of a format without subnormals)
decode to zero.
"""

from __future__ import annotations

import numpy as np

from . import _arrays, _native, philox
from .modes import check_rounding
from .formats import PRESETS, Format, format as get_format
from .rounding import _LAYOUT, decompose, quantize

__all__ = ["encode", "decode", "code_dtype"]


def code_dtype(fmt: "str | Format", torch: bool = False):
    """The unsigned integer dtype that holds a code of `fmt`."""
    fmt = get_format(fmt)
    width = next(w for w in (8, 16, 32, 64) if fmt.bits <= w)
    if torch:
        return getattr(_arrays._torch, f"uint{width}")
    return np.dtype(f"uint{width}")


def encode(x, fmt: "str | Format", rounding: str = "nearest_even", saturate: bool = False,
           seed: int | None = None, **options):
    """Round `x` into `fmt` (as `quantize` does) and return the bit patterns.

    NaN becomes the format's canonical NaN; a format without NaN refuses it
    (ValueError), as it refuses negative values when it is unsigned.
    """
    fmt = get_format(fmt)
    if not fmt.has_nan:
        _refuse_unencodable(x, fmt, bool(options.get("flush_subnormal_inputs", False)))
    fast = _encode_native(x, fmt, rounding, saturate, seed, options)
    if fast is not None:
        return fast
    values = quantize(x, fmt, rounding, saturate, seed, **options)
    scalar = not (isinstance(values, np.ndarray) or _arrays.is_torch(values))
    ops = _arrays.Ops(values)
    values = np.asarray(values) if scalar else values
    codes = _pack(_as_working(values, fmt, ops), fmt, ops)
    if ops.torch:
        return codes.to(code_dtype(fmt, torch=True))
    codes = codes.astype(code_dtype(fmt))
    return codes[()] if scalar else codes


def _refuse_unencodable(x, fmt: Format, flush_inputs: bool) -> None:
    """For a format without NaN: refuse, naming the element, inputs that have no code."""
    values = x.detach().cpu().numpy() if _arrays.is_torch(x) else np.asarray(x)
    if values.dtype.kind not in "fiu":
        if _arrays._numpy_format(values.dtype) is None:
            return  # quantize() refuses these with its own error
        values = values.astype(np.float32)  # ml_dtypes input, exactly
    checks = []
    if values.dtype.kind == "f":
        checks.append((np.isnan, f"{fmt.name} has no NaN; the input holds NaN"))
    if not fmt.signed:
        def negative(v):
            below = v < 0
            if flush_inputs and fmt.zero:  # flushed to -0 first, which an unsigned format takes as +0
                below &= ~(np.abs(v) < float(fmt.min_normal))
            return below
        checks.append((negative, f"{fmt.name} is unsigned; the input holds a negative value"))
    if not fmt.zero:
        checks.append((lambda v: v == 0, f"{fmt.name} has no zero; the input holds 0"))
    for test, message in checks:
        bad = test(values)
        if np.any(bad):
            where = tuple(int(i) for i in np.argwhere(bad)[0]) if np.ndim(bad) else ()
            raise ValueError(f"{message} at index {where}")


def _encode_native(x, fmt: Format, rounding, saturate, seed, options):
    """Codes straight from the compiled kernel for float16/32/64 and integer numpy arrays, else None."""
    if not isinstance(x, np.ndarray) or x.dtype.kind not in "fiu":
        return None
    unknown = set(options) - {"flush_subnormal_inputs", "flush_subnormal_outputs", "generator", "rand_bits"}
    if unknown:
        raise TypeError(f"unexpected keyword arguments {sorted(unknown)}")
    check_rounding(rounding)
    work = x.astype(np.float32) if x.dtype == np.float16 else x  # exactly
    rand_bits = options.get("rand_bits")
    stochastic = rounding == "stochastic"
    if not stochastic and (seed is not None or options.get("generator") is not None or rand_bits is not None):
        return None  # quantize() refuses these with a clear error
    if not _native.covers(work.dtype, fmt, rounding, rand_bits if stochastic else None):
        return None
    key = philox.key_from(seed, options.get("generator"), torch_input=False) if stochastic else None
    return _native.run(work, fmt, rounding=rounding, saturate=bool(saturate),
                       flush_inputs=bool(options.get("flush_subnormal_inputs", False)),
                       flush_outputs=bool(options.get("flush_subnormal_outputs", False)),
                       rand_bits=rand_bits, key=key, codes=True)


def decode(codes, fmt: "str | Format"):
    """The values of bit patterns of `fmt`: float32 when the format fits it, else float64."""
    fmt = get_format(fmt)
    ops, ints, scalar = _check_codes(codes, fmt)
    out_fmt = PRESETS["fp32"] if PRESETS["fp32"].contains(fmt) else PRESETS["fp64"]
    values = _unpack(ints, fmt, ops, out_fmt)
    return values[()] if scalar else values


# ---------------------------------------------------------------- packing
def _as_working(values, fmt, ops):
    wide = not PRESETS["fp32"].contains(fmt)  # e.g. a custom format reaching below 2^-149
    if ops.torch:
        torch = _arrays._torch
        return values.to(torch.float64 if wide else torch.float32)
    return values.astype(np.float64 if wide else np.float32)


def _pack(work, fmt: Format, ops):
    """Codes (int64) of values that are already exact in `fmt`."""
    p = decompose(work, ops)
    M = fmt.man_bits
    sign_bit = _sign_bit(fmt)
    if p.is_nan.any():
        if not fmt.has_nan:
            raise ValueError(f"{fmt.name} has no NaN; the input holds NaN at index "
                             f"{_first_index(p.is_nan, ops)}")
    if not fmt.signed and (p.negative & ~p.is_zero).any():
        raise ValueError(f"{fmt.name} is unsigned; the input holds a negative value at index "
                         f"{_first_index(p.negative & ~p.is_zero, ops)}")
    subnormal = p.exponent < fmt.emin
    q = ops.where(subnormal, fmt.emin - M, p.exponent - M)
    n = p.sig >> ops.clip(q - p.lsb_exp, lo=0)
    field = ops.where(subnormal, 0, p.exponent + fmt.bias)
    if not fmt.zero:  # E8M0: the exponent field 0 is a normal binade
        field = p.exponent + fmt.bias
        n = ops.where(subnormal, 1 << M, n)
    magnitude = (field << M) | (n & ((1 << M) - 1))
    magnitude = ops.where(p.is_zero, 0, magnitude)
    top = (1 << fmt.exp_bits) - 1
    if fmt.infinities:
        magnitude = ops.where(p.is_inf, top << M, magnitude)
    negative = p.negative & (fmt.has_negative_zero | ~p.is_zero) if fmt.signed else p.negative & False
    codes = ops.where(negative, magnitude | sign_bit, magnitude)
    if fmt.has_nan:
        codes = ops.where(p.is_nan, _nan_code(fmt, p.negative, ops), codes)
    return codes


def _sign_bit(fmt: Format) -> int:
    """The sign bit as an int64 value (the top bit of a 64-bit code is int64's sign)."""
    bit = 1 << (fmt.exp_bits + fmt.man_bits)
    return bit - (1 << 64) if bit == 1 << 63 else bit


def _nan_code(fmt: Format, negative, ops):
    sign_bit = _sign_bit(fmt)
    if fmt.nan == "fnuz":
        return sign_bit
    if fmt.nan == "fn":
        positive = (1 << (fmt.exp_bits + fmt.man_bits)) - 1
    else:  # ieee quiet NaN
        positive = (((1 << fmt.exp_bits) - 1) << fmt.man_bits) | (1 << (fmt.man_bits - 1))
    if not fmt.signed:
        return positive
    return ops.where(negative, positive | sign_bit, positive)


def _unpack(ints, fmt: Format, ops, out_fmt: Format):
    """Values of int64 codes, built from sign, exponent and mantissa fields."""
    M = fmt.man_bits
    man = ints & ((1 << M) - 1)
    field = (ints >> M) & ((1 << fmt.exp_bits) - 1)
    negative = ((ints >> (fmt.exp_bits + M)) & 1) == 1 if fmt.signed else ints < 0
    top = (1 << fmt.exp_bits) - 1
    normal = field >= fmt.min_exp_field
    n = ops.where(normal, man | (1 << M), man if fmt.subnormals else 0)
    q = ops.where(normal, field - fmt.bias - M, fmt.emin - M)
    width = 64 if out_fmt.name == "fp64" else 32
    like = _empty_float(ints, width, ops)
    from .rounding import _pow2  # exact powers of two, subnormal ones included

    with np.errstate(over="ignore"):  # the Inf/NaN codes' lanes overflow; they are replaced below
        magnitude = ops.to_float(n, like) * _pow2(q, like, ops, width)
    inf = float("inf")
    if fmt.nan == "ieee":
        special = field == top
        magnitude = ops.where(special & (man == 0), inf, magnitude)
        is_nan = special & (man != 0)
    elif fmt.nan == "fn":
        is_nan = (field == top) & (man == (1 << M) - 1)
    elif fmt.nan == "fnuz":
        is_nan = negative & (field == 0) & (man == 0)
    else:
        is_nan = negative & False
    # a zero keeps its sign only where the format has -0 (non-canonical zero codes)
    keeps_sign = negative if fmt.has_negative_zero else negative & (magnitude != 0)
    values = ops.where(keeps_sign, -magnitude, magnitude)
    P = _LAYOUT[width][0]
    quiet = (((1 << (width - 1 - P)) - 1) << P) | (1 << (P - 1))
    nan_bits = ops.where(negative, -(1 << (width - 1)) | quiet, quiet)
    return ops.where(is_nan, ops.bits_float(nan_bits, like), values)


def _empty_float(ints, width, ops):
    if ops.torch:
        torch = _arrays._torch
        return torch.empty(ints.shape, dtype=torch.float64 if width == 64 else torch.float32, device=ints.device)
    return np.empty(ints.shape, dtype=np.float64 if width == 64 else np.float32)


def _check_codes(codes, fmt: Format):
    """int64 array of codes, refusing non-integers and codes outside the format."""
    if _arrays.is_torch(codes):
        torch = _arrays._torch
        if codes.is_floating_point() or codes.is_complex() or codes.dtype == torch.bool:
            raise TypeError(f"codes must be an integer tensor, got {codes.dtype}")
        # uint64 (fp64 codes): the same bits as int64, which the unpacking reads
        ints = codes.view(torch.int64) if codes.dtype == torch.uint64 else codes.to(torch.int64)
        scalar = False
    else:
        scalar = np.ndim(codes) == 0
        arr = np.asarray(codes)
        if arr.dtype.kind not in "iu":
            raise TypeError(f"codes must be integers, got dtype {arr.dtype}")
        if arr.dtype == np.uint64 and fmt.bits == 64:
            arr = arr.view(np.int64)
        ints = arr.astype(np.int64)
    ops = _arrays.Ops(ints)
    if fmt.bits < 64:
        outside = (ints < 0) | (ints >= (1 << fmt.bits))
        if outside.any():
            i = _first_index(outside, ops)
            raise ValueError(f"code {int(ints[i])} at index {i} is outside 0..{(1 << fmt.bits) - 1} "
                             f"for {fmt.name} ({fmt.bits} bits)")
    return ops, ints, scalar


def _first_index(mask, ops):
    if ops.torch:
        flat = mask.reshape(-1).nonzero()
        idx = int(flat[0]) if len(flat) else 0
        return tuple(int(i) for i in np.unravel_index(idx, tuple(mask.shape))) if mask.dim() else ()
    return tuple(int(i) for i in np.argwhere(mask)[0]) if mask.ndim else ()
