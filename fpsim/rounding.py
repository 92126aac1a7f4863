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
compiled kernel (`_native`) takes over float32, float64 and integer input on
the CPU; it is tested to give identical bits (for stochastic rounding, from
the same Philox stream, `philox.py`).
"""

from __future__ import annotations

import numbers
from typing import NamedTuple

import numpy as np

from . import _arrays, _compiled, _native, philox
from ._options import RoundingOptions, check_options, refuse_values_without_code
from .modes import ROUNDING_MODES, mode as get_mode
from .formats import PRESETS, Format, format as get_format

__all__ = ["quantize", "ROUNDING_MODES"]

# the working containers, from their formats: (mantissa bits, exponent bias, magnitude mask) by width
_LAYOUT = {fmt.bits: (fmt.man_bits, fmt.bias, (1 << (fmt.bits - 1)) - 1) for fmt in (PRESETS["fp32"], PRESETS["fp64"])}


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
    compile: bool = False,
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
    seed, generator: the key of ``stochastic``'s Philox stream (fpsim.philox):
       the seed itself (0 <= seed < 2^64), or 64 bits drawn from a numpy
       Generator (numpy input) or torch.Generator (tensors), which advances
       it; a fresh key when neither is given. Element i's draw depends on the
       key and i only: the same bits on numpy and torch, float32 and float64.
    rand_bits: for ``stochastic``, r random bits decide each rounding: the
       fraction is truncated to r bits (probability floor(f 2^r) / 2^r, biased
       toward zero by less than 2^-r of the spacing); None: exact probability f.
    flush_subnormal_inputs: inputs below the format's min normal become ±0
       before rounding. flush_subnormal_outputs: results below min normal
       become ±0.
    grad: for a torch tensor that requires grad, what backward does:
       ``"identity"`` (straight-through), ``"clipped"`` (zero where |x| > max),
       ``"none"`` (a detached result).
    compile: for torch tensors, round through the engine compiled by
       torch.compile: one fused kernel per format and options (a Triton kernel
       on a GPU), the same bits; the first call per format, options, dtype and
       device compiles (seconds). Deterministic modes. On the CPU the built-in
       C kernel is faster: compile is for GPU tensors.

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
    if not isinstance(compile, (bool, np.bool_)):
        raise TypeError(f"compile must be True or False, got {type(compile).__name__} {compile!r}")
    if not isinstance(fmt, Format):
        if compile:
            raise ValueError(f"compile=True applies to element formats, not the block format {fmt.name}")
        return _quantize_blocks(x, fmt, options, block_options)
    if block_options:
        raise TypeError(f"unexpected keyword arguments {sorted(block_options)} (axis and scale_rule apply to "
                        f"block formats only)")
    accepted = _arrays.accept(x)
    array = accepted.array
    if compile:
        _compiled.check(array, options.rounding)
    if _arrays.requires_grad(array):
        rounded = round_array(array.detach(), fmt, options, compile)
        if options.grad != "none" and _arrays.grad_enabled():
            from ._autograd import straight_through

            rounded = straight_through(array, rounded, fmt, options.grad)
        return accepted.give_back(rounded)
    return accepted.give_back(round_array(array, fmt, options, compile))


def _quantize_blocks(x, fmt, options: RoundingOptions, block_options: dict):
    """A block format's dequantised values (fpsim.block_codec), with quantize's gradient options."""
    from . import block_codec

    def blocked(values):
        return block_codec.quantize(values, fmt, options.rounding, options.saturate, options.seed,
                                    generator=options.generator, rand_bits=options.rand_bits,
                                    flush_subnormal_inputs=options.flush_inputs,
                                    flush_subnormal_outputs=options.flush_outputs, **block_options)

    if not _arrays.requires_grad(x):
        return blocked(x)
    rounded = blocked(x.detach())
    if options.grad == "none" or not _arrays.grad_enabled():
        return rounded
    if options.grad == "clipped":
        raise ValueError(f"grad='clipped' needs one range for the whole tensor; {fmt.name} scales each block "
                         f"(use grad='identity' or 'none')")
    from ._autograd import straight_through

    return straight_through(x, rounded, None, "identity")


def round_array(array, fmt: Format, options: RoundingOptions, compile: bool = False):
    """The engine on an accepted numpy array or torch tensor (see `_arrays.accept`): rounded values
    in the result dtype. Refuses inputs that have no value in `fmt`. compile: the engine compiled
    by torch.compile (`_compiled`; float tensors, deterministic modes)."""
    in_fmt = _arrays.input_format(array)
    out_fmt = _arrays.result_format(in_fmt, fmt)
    ops = _arrays.Ops(array)
    if _arrays.is_meta(array):  # no data to round: the result's shape and dtype
        return ops.empty(array.shape, out_fmt)
    refuse_values_without_code(array, fmt, options.flush_inputs)
    engine = options.engine()
    if compile:
        return ops.as_dtype_of(_compiled.round_bits(_working_values(array, out_fmt, ops), fmt, engine), out_fmt)
    key = philox.key_from(options.seed, options.generator, ops.torch) if options.rounding == "stochastic" else None
    result = _quantize_native(array, in_fmt, out_fmt, fmt, ops, engine, key)
    if result is None:
        result = _quantize_engine(array, in_fmt, out_fmt, fmt, ops, engine, key)
    return ops.as_dtype_of(result, out_fmt)


def _quantize_native(array, in_fmt, out_fmt: Format, fmt: Format, ops, options, key):
    """The compiled kernel's values for numpy arrays and CPU tensors, or None where it does not apply."""
    if not ops.on_host:
        return None
    if not _native.available():
        _native.warn_once_without_kernel()
        return None
    host = ops.to_host(_working_values(array, out_fmt, ops) if in_fmt is not None else array)
    rand_bits = options["rand_bits"] if options["rounding"] == "stochastic" else None
    if not _native.covers(host.dtype, fmt, options["rounding"], rand_bits):
        return None
    values_dtype = host.dtype if in_fmt is not None else np.float64
    result = _native.run(host, fmt, rounding=options["rounding"], saturate=options["saturate"],
                         flush_inputs=options["flush_inputs"], flush_outputs=options["flush_outputs"],
                         rand_bits=options["rand_bits"], key=key, codes=False, values_dtype=values_dtype)
    return ops.from_host(result)


def _quantize_engine(array, in_fmt, out_fmt: Format, fmt: Format, ops, options, key):
    """The numpy (or torch) engine: floats in their working dtype, integers through float64."""
    stream = philox.Stream(key) if key is not None else None
    if in_fmt is not None:
        return round_bits(_working_values(array, out_fmt, ops), fmt, ops, stream=stream, **options)
    work, exact = _integers_as_float64(array, fmt, options["rounding"], ops)
    result = round_bits(work, fmt, ops, stream=stream, **options)
    if exact is not None:
        result = _round_big_integers(array, result, exact, fmt, options, ops, stream)
    return result


def _working_values(array, out_fmt: Format, ops):
    """The float input as float32 or float64 holding exactly the same values."""
    wide = out_fmt.exp_bits > 8 or out_fmt.man_bits > 23
    return ops.astype(array, "float64" if wide else "float32")


def _integers_as_float64(array, fmt: Format, rounding: str, ops):
    """Integers as float64, and a mask of those the Fraction oracle must round (or None).

    Up to 2^53 the float64 is exact. Beyond, the magnitude is rounded to odd at 53 bits (truncated,
    with the last bit set when any dropped bit is): a second rounding of that to at most 51 bits
    (man_bits <= 50) gives the correctly rounded result in every deterministic mode (Boldo and
    Melquiond, "When double rounding is odd", 2005). Stochastic rounding and wider formats need
    the exact value: those integers (and Python ints beyond 64 bits) go to the oracle. Object
    arrays hold Python ints, and floats beside them (from a list such as [0.5, 2**70]).
    """
    values = ops.to_host(array)
    limit = 2**53
    if values.dtype == object:
        flat = values.ravel()
        integral = [isinstance(v, numbers.Integral) for v in flat]
        big = np.array([i and abs(int(v)) > limit for v, i in zip(flat, integral)], dtype=bool)
        work = np.array([0.0 if b else float(int(v) if i else v) for v, i, b in zip(flat, integral, big)],
                        dtype=np.float64).reshape(values.shape)
        exact = big.reshape(values.shape)
    else:
        work = values.astype(np.float64)
        big = values > limit
        if values.dtype.kind == "i":
            big |= values < -limit
        exact = None
        if big.any():
            work[big] = _odd_rounded(values[big])
            if rounding == "stochastic" or fmt.man_bits > 50:
                exact = big
    return ops.from_host(work), (exact if exact is not None and exact.any() else None)


def _odd_rounded(values: np.ndarray) -> np.ndarray:
    """int64/uint64 values beyond 2^53 as float64, rounded to odd at 53 bits (exactly)."""
    negative = values < 0
    magnitude = values.astype(np.uint64)  # two's complement: negate the negatives below
    magnitude[negative] = np.uint64(0) - magnitude[negative]
    exponent = np.frexp(magnitude.astype(np.float64))[1].astype(np.int64)  # bit length, or one more
    exponent -= (magnitude >> (exponent - 1).astype(np.uint64)) == 0
    shift = (exponent - 53).astype(np.uint64)
    kept = magnitude >> shift
    sticky = (magnitude & ((np.uint64(1) << shift) - np.uint64(1))) != 0
    result = np.ldexp((kept | sticky.astype(np.uint64)).astype(np.float64), shift.astype(np.int64))
    return np.where(negative, -result, result)


def _round_big_integers(array, result, exact, fmt, options, ops, stream):
    """Round the integers marked `exact` from their value with the Fraction oracle (rare, slow, exact);
    stochastic rounding reads U from the same stream as the engine and the kernel."""
    from fractions import Fraction

    from .exact import round_value

    values = ops.to_host(array)
    rounded = ops.to_host(result).copy()
    flat_values, flat_rounded = values.reshape(-1), rounded.reshape(-1)
    host = _arrays.Ops(flat_rounded)
    for i in np.flatnonzero(exact.reshape(-1)):
        value = int(flat_values[i])
        u = None
        if options["rounding"] == "stochastic":
            # enough words that U's comparison with every bit of the dropped fraction is settled
            e = abs(value).bit_length() - 1
            dropped_bits = (max(e, fmt.emin) - fmt.man_bits) if (e >= fmt.emin or fmt.subnormals) else fmt.emin
            count = max(1, -(-dropped_bits // 32), -(-(options["rand_bits"] or 0) // 32))
            index = np.array([i], dtype=np.int64)
            words = [int(stream.words(j, index, host)[0]) for j in range(count)]
            u = Fraction(sum(w << (32 * (count - 1 - j)) for j, w in enumerate(words)), 1 << (32 * count))
        flat_rounded[i] = round_value(value, fmt, options["rounding"], options["saturate"],
                                      flush_subnormal_inputs=options["flush_inputs"],
                                      flush_subnormal_outputs=options["flush_outputs"],
                                      random_fraction=u, rand_bits=options["rand_bits"])
        if flat_rounded[i] != flat_rounded[i]:  # the engine's NaN sign convention (see _nan_like)
            negative = (value < 0 or fmt.nan == "fnuz") and fmt.signed
            flat_rounded[i] = -np.nan if negative else np.nan
    return ops.from_host(rounded)


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
    # floor(log2|w|): the biased field for normal numbers; for subnormals, the bit length of the
    # significand, read from the exponent of its (exact) float64 value: integer work only
    P64, bias64, _ = _LAYOUT[64]
    sig_log2 = (ops.float_bits(ops.astype(sig, "float64")) >> P64) - bias64
    exponent = ops.where(is_zero | special, 0, ops.where(e_field > 0, e_field - bias_in, sig_log2 + lsb_exp))
    return Parts(width, P, u < 0, is_nan, is_inf, is_zero, sig, lsb_exp, exponent)


def round_bits(w, fmt: Format, ops, *, rounding, saturate, rand_bits=None, flush_inputs=False,
               flush_outputs=False, stream=None):
    """The engine: round float32/float64 array `w` to `fmt`; returns an array of w's dtype.

    `stream` (stochastic only) gives the words of each element's uniform U
    (a `philox.Stream`; tests pass their own words to hold single draws to
    the exact oracle).
    """
    with ops.quiet_float_errors():  # Inf/NaN lanes are replaced below
        return _round_bits(w, fmt, ops, rounding, saturate, rand_bits, flush_inputs, flush_outputs, stream)


def _round_bits(w, fmt, ops, rounding, saturate, rand_bits, flush_inputs, flush_outputs, stream):
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
    else:  # stochastic: up when U < the dropped fraction of the spacing, dropped / 2^drop_all exactly
        # (drop_all is the true count: a value far below the spacing has a tiny fraction)
        up = _stochastic_up(dropped, drop_all, rand_bits, stream, ops)
    if rounding == "odd":
        n = keep | ops.astype(inexact, "int64")
    elif up is None:
        n = keep
    else:
        n = keep + ops.astype(up, "int64")

    # value = n * 2^q, exact in the working dtype (or Inf beyond it); overflow is value > max
    magnitude = ops.to_float(n, w) * exact_pow2(q, w, ops, width)
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
    # construction: negating a NaN does not flip its sign on every device. NaN is found in the
    # bits: compiled code (torch.compile) may assume that x != x never holds.
    P, _, magnitude_mask = _LAYOUT[width]
    invalid = invalid | ((ops.float_bits(result) & magnitude_mask) > ((magnitude_mask >> P) << P))
    return ops.where(invalid, _nan_like(fmt, negative, w, ops, width), result)


def _stochastic_up(dropped, count, rand_bits, stream, ops):
    """Whether U_i < f_i = dropped / 2^count for each element (0 <= dropped < 2^min(count, 62)), with f
    truncated to rand_bits bits when given. U_i's words come from `stream` (see philox.py): the first
    for every element, further ones only where U's first words equal f's leading bits."""
    if stream is None:
        raise ValueError("stochastic rounding needs a stream of random words")
    shape = tuple(dropped.shape)
    dropped, count = dropped.reshape(-1), count.reshape(-1)
    n = dropped.shape[0]
    first = stream.leading_words(0, n, ops)
    if rand_bits is not None:  # U's top r bits against f truncated to r bits
        r = rand_bits
        truncated = ops.where(count >= r, dropped >> ops.clip(count - r, lo=0, hi=62),
                              dropped << ops.clip(r - count, lo=0, hi=62))
        draw = first >> (32 - r) if r <= 32 else (first << (r - 32)) | (stream.leading_words(1, n, ops) >> (64 - r))
        return (draw < truncated).reshape(shape)
    digit, more = _fraction_digit(dropped, count, 0, ops)
    up = first < digit
    tie = (first == digit) & more
    depth = 0
    while bool(tie.any()):  # probability 2^-32 per element and word
        depth += 1
        index = ops.flat_nonzero(tie)
        word = stream.words(depth, index, ops)
        digit, more = _fraction_digit(dropped[index], count[index], depth, ops)
        up[index] = word < digit
        tie = tie & False
        tie[index] = (word == digit) & more
    return up.reshape(shape)


def _fraction_digit(dropped, count, depth: int, ops):
    """Word `depth` of f = dropped / 2^count (its bits 32 depth + 1 .. 32 (depth + 1) after the point),
    and whether f has bits beyond it."""
    shift = 32 * (depth + 1) - count  # the word is floor(dropped * 2^shift) mod 2^32
    left = ops.clip(shift, lo=0, hi=32)
    right = ops.clip(-shift, lo=0, hi=62)
    low = dropped & ((ops.shift_left(1, ops.clip(32 - left, lo=0)) - 1))  # the bits that stay below 2^32
    digit = ops.where(shift >= 0, ops.where(shift >= 32, 0, low << left), (dropped >> right) & 0xFFFFFFFF)
    more = (shift < 0) & ((dropped & (ops.shift_left(1, right) - 1)) != 0)
    return digit, more


def _overflow_goes_to_infinity(rounding, negative, ops, saturate):
    """Whether an overflowing result becomes the special overflow value (else ±max), per element."""
    positive_goes, negative_goes = (False, False) if saturate else get_mode(rounding).to_infinity
    if positive_goes == negative_goes:
        return negative | True if positive_goes else negative & False
    return negative if negative_goes else ~negative


def exact_pow2(q, like, ops, width):
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
    if fmt.nan == "fnuz":
        negative = negative | True
    elif not fmt.signed:
        negative = negative & False
    return quiet_nan(negative, like, ops, width)


def quiet_nan(negative, like, ops, width):
    """The quiet NaN of the working dtype (float32 or float64, `width` bits), negative where `negative`."""
    P = _LAYOUT[width][0]
    quiet = (((1 << (width - 1 - P)) - 1) << P) | (1 << (P - 1))
    return ops.bits_float(ops.where(negative, -(1 << (width - 1)) | quiet, quiet), like)
