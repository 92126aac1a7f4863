"""quantize(): rounding to a format, on the compiled kernel or the vectorised engine.

quantize checks its arguments, accepts the input (`_arrays.accept`: numpy,
torch, Python numbers, other array libraries) and sends it to one of three
paths that give the same bits: the compiled kernel (`_native`) for float32,
float64 and integer input on the CPU; the engine compiled by torch.compile
(`_compiled`) when asked; else the vectorised engine (`_engine.round_bits`),
on numpy arrays and torch tensors alike. Integers beyond 2^53 that no float
rounding reaches exactly go to the Fraction oracle. Stochastic rounding
draws from the same Philox stream (`philox.py`) on every path.
"""

from __future__ import annotations

import numbers

import numpy as np

from . import _arrays, _compiled, _native, philox
from ._engine import round_bits
from ._fpmode import subnormals_kept
from ._options import RoundingOptions, check_options, refuse_values_without_code
from .formats import Format
from .modes import ROUNDING_MODES

__all__ = ["quantize", "ROUNDING_MODES"]


@subnormals_kept
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
       integers), Python number or list, masked array, matrix, torch tensor
       (a DTensor: each rank's part; not a pending sum, not stochastically), or
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
    accepted = _arrays.accept(x, options.rounding == "stochastic")
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

    if options.grad == "none":
        return blocked(_arrays.detached(x))
    if options.grad == "clipped" and _arrays.requires_grad(x) and _arrays.grad_enabled():
        raise ValueError(f"grad='clipped' needs one range for the whole tensor; {fmt.name} scales each block "
                         f"(use grad='identity' or 'none')")
    return _arrays.straight_through_of(x, blocked)


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
