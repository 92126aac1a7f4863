"""quantize(): the one vectorised rounding engine.

Every float input is taken apart into sign, integral significand and the
exponent of its last bit, exactly (float32 and float64 bits, never through a
narrower type). Rounding to a format then means dropping `d` low bits of the
significand, where `d` follows from the format's grid spacing at that
magnitude (fixed in the normal range, growing in the subnormal range). The
rounding mode decides, from the dropped bits, whether the kept part goes up
by one. Overflow is judged on that result, as IEEE 754 does with an
unbounded exponent.

The same code runs on numpy arrays and torch tensors (see `_arrays.Ops`). A
compiled kernel (`_native`) takes over float32 input on the CPU; it is tested
to give identical bits (for stochastic rounding, with the same draws).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import _arrays, _native
from ._options import RoundingOptions, check_options, refuse_values_without_code
from .modes import ROUNDING_MODES, mode as get_mode
from .formats import Format, format as get_format

__all__ = ["quantize", "ROUNDING_MODES"]

_LAYOUT = {  # container: (mantissa bits, exponent bias, magnitude mask)
    32: (23, 127, 0x7FFFFFFF),
    64: (52, 1023, 0x7FFFFFFFFFFFFFFF),
}


def quantize(
    x,
    fmt: "str | Format",
    rounding: str = "nearest_even",
    saturate: bool = False,
    seed: int | None = None,
    *,
    generator=None,
    rand_bits: int | None = None,
    flush_subnormal_inputs: bool = False,
    flush_subnormal_outputs: bool = False,
    grad: str = "identity",
    **block_options,
):
    """Round `x` to the nearest values of `fmt` under `rounding`; same array type and device back.

    x: numpy array or scalar (float16/32/64 in any byte order, ml_dtypes types,
       integers), Python number or list, masked array, matrix, torch tensor, or
       an array of another library (array API / DLPack, e.g. jax). Floats are
       rounded once from their exact value.
    fmt: a format name (``"e4m3"``, ``"bf16"``, ...), a float dtype
       (``torch.bfloat16``, ``ml_dtypes.float8_e4m3fn``) or a `fpsim.Format`.
    rounding: one of ``nearest_even, nearest_away, toward_zero, up, down, odd,
       stochastic``.
    saturate: clamp overflow (and Inf) to ±max instead of the format's own
       overflow value (Inf, else NaN, else max). NaN stays NaN.
    seed, generator: randomness for ``stochastic`` (a numpy Generator for
       numpy input, a torch.Generator for tensors); fresh entropy when neither
       is given.
    rand_bits: for ``stochastic``, how many random bits decide each rounding
       (hardware uses a limited number); None means exact probabilities.
    flush_subnormal_inputs: inputs below the format's min normal become ±0
       before rounding. flush_subnormal_outputs: results below min normal
       become ±0.
    grad: for a torch tensor that requires grad, what backward does:
       ``"identity"`` (straight-through), ``"clipped"`` (zero where |x| > max),
       ``"none"`` (a detached result).

    The result dtype is the input's when it holds every value of `fmt`
    (float32 in, float32 out for FP8), else float32 or float64. Inputs that
    have no value in `fmt` (NaN for a format without NaN, ...) are refused.

    Block formats (``"mxfp8_e4m3"``, ``"nvfp4"``, a `fpsim.BlockFormat`) go to
    `fpsim.block_codec.quantize`, which also takes ``axis=`` and ``scale_rule=``.
    """
    if not isinstance(fmt, Format):  # a name, or a block format (one level up: fpsim.blocks)
        from . import blocks
        fmt = blocks.format(fmt)
    options = check_options(rounding, saturate, seed, generator, rand_bits, flush_subnormal_inputs,
                            flush_subnormal_outputs, grad)
    if not isinstance(fmt, Format):
        return _quantize_blocks(x, fmt, options, block_options)
    if block_options:
        raise TypeError(f"unexpected keyword arguments {sorted(block_options)} (axis and scale_rule apply to "
                        f"block formats only)")
    accepted = _arrays.accept(x)
    array = accepted.array
    if _arrays.is_torch(array) and array.requires_grad:
        rounded = round_array(array.detach(), fmt, options)
        if options.grad != "none" and _arrays._torch.is_grad_enabled():
            from ._autograd import straight_through

            rounded = straight_through(array, rounded, fmt, options.grad)
        return accepted.give_back(rounded)
    return accepted.give_back(round_array(array, fmt, options))


def _quantize_blocks(x, fmt, options: RoundingOptions, block_options: dict):
    """A block format's dequantised values (fpsim.block_codec), with quantize's gradient options."""
    from . import block_codec

    def blocked(values):
        return block_codec.quantize(values, fmt, options.rounding, options.saturate, options.seed,
                                    generator=options.generator, rand_bits=options.rand_bits,
                                    flush_subnormal_inputs=options.flush_inputs,
                                    flush_subnormal_outputs=options.flush_outputs, **block_options)

    if not (_arrays.is_torch(x) and x.requires_grad):
        return blocked(x)
    rounded = blocked(x.detach())
    if options.grad == "none" or not _arrays._torch.is_grad_enabled():
        return rounded
    if options.grad == "clipped":
        raise ValueError(f"grad='clipped' needs one range for the whole tensor; {fmt.name} scales each block "
                         f"(use grad='identity' or 'none')")
    from ._autograd import straight_through

    return straight_through(x, rounded, None, "identity")


def round_array(array, fmt: Format, options: RoundingOptions):
    """The engine on an accepted numpy array or torch tensor (see `_arrays.accept`): rounded values
    in the result dtype. Refuses inputs that have no value in `fmt`."""
    in_fmt = _arrays.input_format(array)
    out_fmt = _arrays.result_format(in_fmt, fmt)
    if _arrays.is_meta(array):  # no data to round: the result's shape and dtype
        return _arrays._torch.empty(array.shape, dtype=out_fmt.torch_dtype, device="meta")
    refuse_values_without_code(array, fmt, options.flush_inputs)
    engine = options.engine()
    ops = _arrays.Ops(array)
    rng = ops.generator(options.seed, options.generator) if options.rounding == "stochastic" else None

    big_integers = None
    if in_fmt is None:
        work, big_integers = _integers_as_float64(array, ops)
    else:
        work = _working_values(array, out_fmt, ops)
    draws = None
    if rng is not None:  # one draw per element, whichever path rounds them
        width = 64 if str(work.dtype).endswith("float64") else 32
        draws = ops.random_ints(tuple(work.shape), options.rand_bits or _LAYOUT[width][0] + 3, rng)
    result = _quantize_native(work, fmt, ops, engine, draws)
    if result is None:
        result = round_bits(work, fmt, ops, random_ints=draws, **engine)
    if big_integers is not None:
        result = _round_big_integers(array, result, big_integers, fmt, engine, ops)
    return _to_result_dtype(result, out_fmt, ops)


def _quantize_native(work, fmt: Format, ops, options, draws=None):
    """The compiled kernel's result for float32 input on the CPU, or None where it does not apply."""
    host = work.numpy() if ops.torch and work.device.type == "cpu" else work
    if not _native.available():
        if isinstance(host, np.ndarray):
            _native.warn_once_without_kernel()
        return None
    if not _native.covers(host, fmt, options["rounding"]):
        return None
    if (options["rand_bits"] or 0) > _native.FLOAT32_RAND_BITS:
        return None  # more random bits than a float32 input has below its last bit
    if draws is not None and ops.torch:
        draws = draws.numpy()
    result = _native.run(host, fmt, rounding=options["rounding"], saturate=options["saturate"],
                         flush_inputs=options["flush_inputs"], flush_outputs=options["flush_outputs"],
                         codes=False, rand_bits=options["rand_bits"], draws=draws)
    return _arrays._torch.from_numpy(result) if ops.torch else result


def _working_values(array, out_fmt: Format, ops):
    """The float input as float32 or float64 holding exactly the same values."""
    wide = out_fmt.exp_bits > 8 or out_fmt.man_bits > 23
    if ops.torch:
        torch = _arrays._torch
        return array.to(torch.float64 if wide else torch.float32)
    return array.astype(np.float64 if wide else np.float32, copy=False)


def _integers_as_float64(array, ops):
    """Integers as float64, exact; those beyond 2^53 (no exact float64) are masked out as 0.

    Object arrays hold Python ints, and floats beside them (from a list such as [0.5, 2**70]),
    which are float64 already."""
    values = array.cpu().numpy() if ops.torch else np.asarray(array)
    if values.dtype == object:
        flat = values.ravel()
        big = np.array([not isinstance(v, float) and abs(int(v)) > 2**53 for v in flat], dtype=bool)
        work = np.array([0.0 if b else (v if isinstance(v, float) else float(int(v))) for v, b in zip(flat, big)],
                        dtype=np.float64).reshape(values.shape)
        big = big.reshape(values.shape)
    else:
        limit = 2**53
        big = values > limit
        if values.dtype.kind == "i":
            big |= values < -limit
        work = np.where(big, 0, values).astype(np.float64)
    if ops.torch:
        work = _arrays._torch.from_numpy(work).to(array.device)
    return work, (big if big.any() else None)


def _round_big_integers(array, result, big, fmt, options, ops):
    """Round integers beyond 2^53 from their exact value with the Fraction oracle (rare, slow, exact)."""
    from .exact import round_value

    values = array.cpu().numpy() if ops.torch else np.asarray(array)
    rounded = (result.cpu().numpy() if ops.torch else np.asarray(result)).copy()
    for index in np.ndindex(big.shape):
        if not big[index]:
            continue
        value = int(values[index])
        rounded[index] = round_value(value, fmt, options["rounding"], options["saturate"],
                                     flush_subnormal_inputs=options["flush_inputs"],
                                     flush_subnormal_outputs=options["flush_outputs"])
        if rounded[index] != rounded[index]:  # the engine's NaN sign convention (see _nan_like)
            negative = (value < 0 or fmt.nan == "fnuz") and fmt.signed
            rounded[index] = -np.nan if negative else np.nan
    if ops.torch:
        return _arrays._torch.from_numpy(rounded).to(result.device)
    return rounded


def _to_result_dtype(result, out_fmt: Format, ops):
    if ops.torch:
        return result.to(out_fmt.torch_dtype)
    target = np.dtype(out_fmt.ml_dtype)
    return result if result.dtype == target else result.astype(target)


class Parts(NamedTuple):
    """A float array taken apart exactly: |w| = sig * 2^lsb_exp, 2^exponent <= |w| < 2^(exponent+1)."""

    width: int
    P: int
    negative: object
    is_nan: object
    is_inf: object
    is_zero: object
    sig: object
    lsb_exp: object
    exponent: object


def decompose(w, ops) -> Parts:
    """Split float32/float64 values into sign, integral significand and exponents (int64 arrays)."""
    width = 64 if str(w.dtype).endswith("float64") else 32
    P, bias_in, mag_mask = _LAYOUT[width]
    u = ops.float_bits(w)
    a = u & mag_mask
    inf_bits = ((1 << (width - 1 - P)) - 1) << P
    is_nan = a > inf_bits
    is_inf = a == inf_bits
    e_field = a >> P
    sig = (a & ((1 << P) - 1)) | ops.where(e_field > 0, 1 << P, 0)
    lsb_exp = ops.clip(e_field, lo=1) - (bias_in + P)
    is_zero = sig == 0
    special = is_nan | is_inf
    exponent = ops.where(is_zero | special, 0, ops.floor_log2(ops.where(special, 1.0, w)))
    return Parts(width, P, u < 0, is_nan, is_inf, is_zero, sig, lsb_exp, exponent)


def round_bits(w, fmt: Format, ops, *, rounding, saturate, rand_bits=None, flush_inputs=False,
               flush_outputs=False, rng=None, random_ints=None):
    """The engine: round float32/float64 array `w` to `fmt`; returns an array of w's dtype.

    `random_ints` (stochastic only) replaces the generator with given draws,
    uniform integers in [0, 2^r) where r = rand_bits or P+3 bits; tests use it
    to compare single draws with the exact oracle.
    """
    with np.errstate(over="ignore", invalid="ignore"):  # Inf/NaN lanes are replaced below
        return _round_bits(w, fmt, ops, rounding, saturate, rand_bits, flush_inputs, flush_outputs,
                           rng, random_ints)


def _round_bits(w, fmt, ops, rounding, saturate, rand_bits, flush_inputs, flush_outputs, rng, random_ints):
    parts = decompose(w, ops)
    width, P, M = parts.width, parts.P, fmt.man_bits
    negative, is_nan, is_inf, is_zero = parts.negative, parts.is_nan, parts.is_inf, parts.is_zero
    sig, lsb_exp, exponent = parts.sig, parts.lsb_exp, parts.exponent

    if flush_inputs and fmt.zero:
        tiny = (exponent < fmt.emin) & ~is_nan & ~is_inf
        sig = ops.where(tiny, 0, sig)
        is_zero = is_zero | tiny

    # grid spacing 2^q at this magnitude; d low bits of sig fall below it
    if fmt.subnormals:
        q = ops.clip(exponent, lo=fmt.emin) - M
    else:
        q = ops.where(exponent < fmt.emin, fmt.emin, exponent - M)
    drop_all = q - lsb_exp  # bits below the grid spacing (can exceed the significand)
    d = ops.clip(drop_all, lo=0, hi=P + 3)
    keep = sig >> d
    dropped = sig - (keep << d)
    half = ops.shift_left(1, d) >> 1
    inexact = dropped != 0

    if rounding == "nearest_even":
        up = (dropped > half) | ((dropped == half) & inexact & ((keep & 1) == 1))
    elif rounding == "nearest_away":
        up = (dropped >= half) & inexact
    elif rounding == "toward_zero" or rounding == "odd":
        up = None
    elif rounding == "up":
        up = inexact & ~negative
    elif rounding == "down":
        up = inexact & negative
    else:  # stochastic: carry out of (dropped bits, truncated to r) + r random bits
        r = rand_bits if rand_bits is not None else P + 3
        draws = random_ints if random_ints is not None else ops.random_ints(tuple(w.shape), r, rng)
        # the dropped bits as an r-bit fraction of the spacing: shift by the true count
        # (a value far below the spacing has a tiny fraction, not the clipped one)
        top = ops.where(drop_all >= r, dropped >> ops.clip(drop_all - r, lo=0, hi=62),
                        dropped << ops.clip(r - drop_all, lo=0))
        up = (top + draws) >= (1 << r)
    if rounding == "odd":
        n = keep | inexact.to(keep.dtype) if ops.torch else keep | inexact
    elif up is None:
        n = keep
    else:
        n = keep + (up.to(keep.dtype) if ops.torch else up)

    # value = n * 2^q, exact in the working dtype (or Inf beyond it); overflow is value > max
    magnitude = ops.to_float(n, w) * _pow2(q, w, ops, width)
    overflow = magnitude > float(fmt.max)

    if not fmt.zero:
        magnitude = ops.where(n == 0, float(fmt.min_subnormal), magnitude)
    if flush_outputs and fmt.zero:
        magnitude = ops.where(magnitude < float(fmt.min_normal), 0.0, magnitude)
    big = float(fmt.max)
    overflow_to_inf = _overflow_goes_to_infinity(rounding, negative, ops, saturate)
    special_overflow = float("inf") if fmt.infinities else (float("nan") if fmt.has_nan else big)
    over_value = ops.where(overflow_to_inf, ops.constant(special_overflow, w), ops.constant(big, w))
    magnitude = ops.where(overflow, over_value, magnitude)
    if fmt.infinities and not saturate:
        magnitude = ops.where(is_inf, float("inf"), magnitude)
    else:
        magnitude = ops.where(is_inf, big if (saturate or not fmt.has_nan) else float("nan"), magnitude)

    keeps_sign = negative if fmt.has_negative_zero else (negative & (magnitude != 0))
    result = ops.where(keeps_sign, -magnitude, magnitude)
    invalid = is_nan
    if not fmt.signed:
        invalid = invalid | (negative & ~(is_zero & fmt.zero))
    if not fmt.zero:
        invalid = invalid | is_zero
    # Every NaN, whether from the input or from overflow, gets the canonical bits by
    # construction: negating a NaN does not flip its sign on every device.
    invalid = invalid | (result != result)
    return ops.where(invalid, _nan_like(fmt, negative, w, ops, width), result)


def _overflow_goes_to_infinity(rounding, negative, ops, saturate):
    """Whether an overflowing result becomes the special overflow value (else ±max), per element."""
    positive_goes, negative_goes = (False, False) if saturate else get_mode(rounding).to_infinity
    if positive_goes == negative_goes:
        return negative | True if positive_goes else negative & False
    return negative if negative_goes else ~negative


def _pow2(q, like, ops, width):
    """2^q as floats of like's dtype, built from bits (exact, subnormal powers included)."""
    P, bias, _ = _LAYOUT[width]
    lowest = 1 - bias - P
    q = ops.clip(q, lo=lowest, hi=bias)
    bits = ops.where(q >= 1 - bias, (q + bias) << P, ops.shift_left(1, ops.clip(q - lowest, lo=0, hi=P)))
    return ops.bits_float(bits, like)


def _nan_like(fmt: Format, negative, like, ops, width):
    """The canonical quiet NaN of the working dtype with the sign that decoding the format's NaN gives.

    Signed NaN codes keep the input's sign; the fnuz NaN is the negative-zero
    code, so it reads as negative; an unsigned format's NaN is positive.
    """
    P = _LAYOUT[width][0]
    quiet = (((1 << (width - 1 - P)) - 1) << P) | (1 << (P - 1))
    sign_bit = -(1 << (width - 1))
    if fmt.nan == "fnuz":
        negative = negative | True
    elif not fmt.signed:
        negative = negative & False
    return ops.bits_float(ops.where(negative, sign_bit | quiet, quiet), like)
