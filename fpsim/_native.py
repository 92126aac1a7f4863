"""The compiled fast path of the rounding engine (fpsim/_fastround.c), and its bridge.

The kernel rounds float32, float64 and integer numpy arrays (torch CPU tensors
through their numpy view) in every mode, for formats inside the working
float's range: float32 input works in float32 for formats whose normal range
float32 holds, float64 input into float32's own format takes the hardware's
conversion (in every mode it has, and odd), float64 input's codes in deterministic
modes are rounded to odd at float32's precision and then in float32 (`route`); the
other float64 cases, integers and the remaining float32 cases work in float64. It
takes every edge value (overflow, Inf, NaN, zero, negative input of an unsigned
format) as data computed here by the numpy engine, and draws its stochastic-rounding
words from the same Philox stream as the engine (fpsim/philox.py). Tests compare the two bit for bit.
"""

from __future__ import annotations

import functools
import struct

import numpy as np

from . import _arrays
from ._engine import round_bits
from ._packing import code_dtype, pack
from .formats import PRESETS, Format
from .modes import MODES

try:
    from . import _fastround
except ImportError:  # built without a compiler: the numpy engine does everything
    _fastround = None

# the kernel's input kinds and output kinds (the IN_* and OUT_* enums of _fastround.c)
_INPUTS = {"working": 0, "float32": 1, "float64": 2, "int8": 3, "int16": 4, "int32": 5, "int64": 6,
           "uint8": 7, "uint16": 8, "uint32": 9, "uint64": 10}
_OUTPUTS = {"float32": 0, "float64": 1, "codes": 2}
_VALUE_OUTPUTS = {np.dtype(np.float32): "float32", np.dtype(np.float64): "float64"}  # (dtype.name costs ~2 us)
# the working containers, from their formats: (mantissa bits P, exponent bias, float type, bits type) by width
_LAYOUT = {fmt.bits: (fmt.man_bits, fmt.bias, np.dtype(f"float{fmt.bits}").type, np.dtype(f"uint{fmt.bits}").type)
           for fmt in (PRESETS["fp32"], PRESETS["fp64"])}
# Inputs whose result depends only on sign, mode and options, in pairs (+, -): the largest finite
# value (it overflows whenever anything does), Inf, NaN, zero; then a negative (for unsigned formats).
_EDGE_INPUTS = ("max", "-max", "inf", "-inf", "nan", "-nan", "0", "-0", "-max")


def available() -> bool:
    return _fastround is not None


def isa() -> str | None:
    """The instruction set of the compiled rounding loops on this CPU ("x86-64-v4", "avx2", "default"), or
    None without the kernel."""
    return _fastround.isa() if _fastround is not None else None


NO_KERNEL_WARNING = (
    "fpsim's compiled rounding kernel is not built (fpsim was installed without a C compiler), so "
    "quantize() and encode() run on the numpy engine: the same bits, but hundreds of times slower "
    "(150 to 850 times on 200,000 values, benchmarks/bench_engine.py, docs/speed.md). Install a C compiler "
    "and the Python headers (Debian: apt install gcc python3-dev) and reinstall fpsim to build it.")
_warned = []


def warn_once_without_kernel() -> None:
    """The one-time warning that the numpy engine runs where the kernel would."""
    if _fastround is None and not _warned:
        import warnings

        _warned.append(True)
        warnings.warn(NO_KERNEL_WARNING, RuntimeWarning, stacklevel=4)


def _fits(fmt: Format, width: int) -> bool:
    """Whether the kernel rounds to `fmt` in this working float: one bit or more is dropped, the
    format's max and its least nonzero magnitude are the float's numbers, and its band (from min normal
    up) reaches the float's normal range. (A format without subnormals may be finer than the float in
    its lowest binade: every input of the float's own grid there is the format's already.)"""
    P, bias, _, _ = _LAYOUT[width]
    return (fmt.man_bits <= P - 1 and fmt.emax <= bias and fmt.min_exponent >= 1 - bias - P
            and fmt.max >= 2 ** (1 - bias))


# the rounding modes the hardware's float64 -> float32 conversion gives (odd: toward zero and a sticky bit;
# nearest_away: toward zero, then up where the rest is at least half the spacing)
_CAST_MODES = ("nearest_even", "nearest_away", "toward_zero", "up", "down", "odd")


def _casts(fmt: Format, rounding: str) -> bool:
    """Whether float64 input into `fmt` is the hardware's conversion to float32 (the kernel's cast_chunk):
    float32's own values and code layout (its max, subnormals, a zero, a sign), in a mode the conversion has."""
    fp32 = PRESETS["fp32"]
    return (bool(_fastround.HARDWARE_CAST) and rounding in _CAST_MODES and fmt.bits == 32 and fmt.signed
            and fmt.zero and fmt.subnormals and fmt.man_bits == fp32.man_bits and fmt.bias == fp32.bias
            and fmt.emin == fp32.emin and fmt.max == fp32.max)


def _rounds_after_odd(fmt: Format, rounding: str) -> bool:
    """Whether rounding a float64 to odd at float32's precision, then into `fmt`, is rounding it into `fmt`
    once: a deterministic mode, a format the float32 kernel rounds to with at most 21 mantissa bits (its
    values all have an even last bit in float32) and a finest spacing of 2^-147 or coarser (two bits above
    float32's subnormal grid; the spacing of its lowest binade, with subnormals or without: a float64
    input there is rounded to odd on float32's grid first). Boldo and Melquiond, "Emulation of FMA and
    correctly rounded sums: proved algorithms using rounding to odd", IEEE TC 2008."""
    quantum_exp = fmt.emin - fmt.man_bits
    return (not MODES[rounding].stochastic and _fits(fmt, 32) and fmt.man_bits <= 21 and quantum_exp >= -147)


def route(dtype, fmt: Format, rounding: str = "nearest_even", rand_bits=None, codes: bool = False
          ) -> tuple[int, str] | None:
    """(working width, input kind) of the kernel for an array of `dtype` (into `codes` or values), or None
    where it does not apply.

    float64 input into float32's own format is the hardware's conversion (_casts). Its codes, in
    deterministic modes and formats of at most 21 mantissa bits, are rounded to odd at float32's precision
    chunk by chunk and rounded again by the float32 passes (_rounds_after_odd: twice as many elements per
    vector). Otherwise it works in float64, which writes float64 values straight from the passes (measured
    faster than narrowing, then widening the results: benchmarks/bench_rounding.py --sections float64)."""
    return _route(np.dtype(dtype), fmt, rounding, rand_bits, codes)


@functools.lru_cache(maxsize=1024)  # (asked twice a call: its Fraction comparisons cost ~10 us each time)
def _route(dtype: np.dtype, fmt: Format, rounding: str, rand_bits, codes: bool) -> tuple[int, str] | None:
    if _fastround is None or not dtype.isnative:  # (byte-swapped arrays go to the engine)
        return None
    if dtype == np.float32 and _fits(fmt, 32) and (rand_bits or 0) <= 32:
        return 32, "working"
    if dtype == np.float64 and (_casts(fmt, rounding) or (codes and _rounds_after_odd(fmt, rounding))):
        return 32, "float64"
    if not _fits(fmt, 64):
        return None
    if dtype == np.float32:
        return 64, "float32"
    if dtype == np.float64:
        return 64, "working"
    if dtype.kind in "iu" and dtype.name in _INPUTS:
        return 64, dtype.name
    return None


def covers(dtype, fmt: Format, rounding: str = "nearest_even", rand_bits=None) -> bool:
    return route(dtype, fmt, rounding, rand_bits) is not None


class _ZeroWords:
    """A stream whose U is 0: every inexact magnitude rounds away from zero (for the edge inputs)."""

    @staticmethod
    def leading_words(depth, n, ops):
        return np.zeros(n, dtype=np.int64)

    @staticmethod
    def words(depth, index, ops):
        return np.zeros(len(index), dtype=np.int64)


@functools.lru_cache(maxsize=256)
def _edge_answers(fmt: Format, options: tuple, width: int, codes: bool) -> tuple:
    """The engine's outputs for _EDGE_INPUTS in the working float, as the kernel's integers (0 where
    the engine refuses the input: the caller has checked that the data holds none)."""
    P, _, float_type, bits_type = _LAYOUT[width]
    big = float(np.finfo(float_type).max)
    values = {"max": big, "-max": -big, "inf": np.inf, "-inf": -np.inf, "nan": np.nan, "-nan": -np.nan,
              "0": 0.0, "-0": -0.0}
    engine_options = dict(options)
    answers = []
    for name in _EDGE_INPUTS:
        x = np.array([values[name]], dtype=float_type)
        ops = _arrays.Ops(x)
        try:
            rounded = round_bits(x, fmt, ops, stream=_ZeroWords(), **engine_options)
            out = pack(rounded, fmt, ops) if codes else rounded.view(bits_type)
            answers.append(int(out[0]) & ((1 << 64) - 1))
        except ValueError:
            answers.append(0)
    return tuple(answers)


@functools.lru_cache(maxsize=256)  # (about 100 us to build: as long as rounding 100,000 elements)
def kernel_params(fmt: Format, *, rounding, saturate, flush_inputs, flush_outputs, rand_bits, key, width, input_kind,
                  output, code_bytes) -> bytes:
    """The kernel's parameters (kernel_t in _fastround.c), packed: every number the kernel uses, from `fmt`."""
    P, bias_in, float_type, bits_type = _LAYOUT[width]
    M = fmt.man_bits
    mode = MODES[rounding].kernel_id
    band_mode = mode
    if M == 0:  # the kept significand is the implicit 1, always odd, while the band's bit pattern
        # would read the exponent's last bit as its parity
        band_mode = {"nearest_even": MODES["nearest_away"], "odd": MODES["toward_zero"]}.get(rounding, MODES[rounding]).kernel_id
    quantum_exp = fmt.min_exponent
    flush_inputs = bool(flush_inputs and fmt.zero)  # (a format without zero has nothing to flush to)
    flush_outputs = bool(flush_outputs and fmt.zero)
    options = (("rounding", rounding), ("saturate", saturate), ("flush_inputs", flush_inputs),
               ("flush_outputs", flush_outputs), ("rand_bits", rand_bits))
    cast = width == 32 and input_kind == "float64" and _casts(fmt, rounding)
    if cast:  # float32's max does not overflow float32's format: the answers of float64 input, as float32 bits
        edges = _edge_answers(fmt, options, 64, output == "codes")
        if output != "codes":
            edges = tuple(int(np.array(e, dtype=np.uint64).view(np.float64).astype(np.float32).view(np.uint32))
                          for e in edges)
    else:
        edges = _edge_answers(fmt, options, width, output == "codes")
    answers = dict(zip(("over_pos", "over_neg", "inf_pos", "inf_neg", "nan_pos", "nan_neg", "zero_pos", "zero_neg",
                        "negative"), edges))

    def bits(value) -> int:
        return int(np.array(float(value), dtype=float_type).view(bits_type))

    values = dict(
        mode=mode, band_mode=band_mode, width=width, input=_INPUTS[input_kind],
        output=_OUTPUTS[output], code_bytes=code_bytes,
        lo=bits(max(fmt.min_normal, 2 ** (1 - bias_in))), hi=bits(fmt.max), drop=P - M,
        rebias=((bias_in - fmt.bias) << M) & ((1 << 64) - 1),
        code_sign_shift=fmt.bits - 1 if fmt.signed else 0, is_signed=int(fmt.signed),
        below_general=int(fmt.emin < 1 - bias_in), below_offset=quantum_exp + bias_in + P, quantum=2.0 ** quantum_exp,
        code_unit=1 if fmt.subnormals else fmt.min_exp_field << M, min_count=0 if fmt.zero else 1,
        zero_below=((1 << M) if flush_outputs and fmt.subnormals else 1) if fmt.zero else 0,
        flush_inputs=int(flush_inputs), key=key or 0, rand_bits=(rand_bits or 0) if rounding == "stochastic" else 0,
        man_bits=M, emin=fmt.emin, bias=fmt.bias, quantum_exp=quantum_exp, top_exp=fmt.emax - M,
        max_significand=fmt.max_significand, subnormals=int(fmt.subnormals), flush_outputs=int(flush_outputs),
        cast=int(cast), **answers)
    names, codes = zip(*(field.split(":") for field in _fastround.KERNEL_FIELDS.split()))
    return struct.pack("=" + "".join(codes), *(values[name] for name in names))


def run(array: np.ndarray, fmt: Format, *, rounding, saturate, flush_inputs, flush_outputs, rand_bits=None, key=None,
        codes: bool = False, values_dtype=None) -> np.ndarray:
    """Round `array` with the kernel (route() must apply): codes when `codes`, else values of
    `values_dtype` (float32 or float64, default float64). `key`: stochastic's Philox key."""
    width, input_kind = route(array.dtype, fmt, rounding, rand_bits if rounding == "stochastic" else None, codes)
    src = np.ascontiguousarray(array)  # C order: the element index of the stream is the flat index
    if codes:
        out_dtype, output = code_dtype(fmt), "codes"
    else:
        out_dtype = np.dtype(values_dtype or np.float64)
        output = _VALUE_OUTPUTS[out_dtype]
    params = kernel_params(fmt, rounding=rounding, saturate=saturate, flush_inputs=flush_inputs,
                           flush_outputs=flush_outputs, rand_bits=rand_bits, key=key, width=width,
                           input_kind=input_kind, output=output, code_bytes=out_dtype.itemsize)
    dst = np.empty(src.shape, dtype=out_dtype)
    _fastround.round_array(src.reshape(-1).view(np.uint8), dst.reshape(-1).view(np.uint8), params)
    return dst.reshape(np.shape(array))


def covers_blocks(fmt: Format, rounding: str) -> bool:
    """Whether `run_blocks` rounds float32 quotients into `fmt`: deterministic modes, where rounding
    the float64 quotient to odd at float32's precision first is exact (formats of at most 21 mantissa
    bits, whose values all have an even last bit in float32), and the format's first rounding boundary
    at 2^-126 or above (its finest spacing 2^-125 or coarser; without subnormals, its min normal), so
    that float32's subnormals lie below it and a power-of-two divisor may multiply in float32 (the
    kernel keeps a quotient that rounded up onto 2^-126 below it)."""
    return _fastround is not None and _rounds_after_odd(fmt, rounding) and fmt.min_exponent >= -125


def run_blocks(array: np.ndarray, divisors: np.ndarray, block: int, fmt: Format, *, rounding, saturate,
               codes: bool = False, values_dtype=None, rescale: bool = False) -> np.ndarray:
    """array / divisors[i // block], each element rounded once from its exact quotient (covers_blocks
    must apply). array: float32, its flat C order in whole blocks of `block` elements; divisors: one
    positive finite float64 per block, a power of two or of at most 28 significant bits. rescale:
    values times their divisor again (the dequantised values; values_dtype must hold them)."""
    src = np.ascontiguousarray(array, dtype=np.float32)
    scales = np.ascontiguousarray(divisors, dtype=np.float64)
    out_dtype = code_dtype(fmt) if codes else np.dtype(values_dtype or np.float64)
    params = kernel_params(fmt, rounding=rounding, saturate=saturate, flush_inputs=False, flush_outputs=False,
                           rand_bits=None, key=None, width=32, input_kind="float32",
                           output="codes" if codes else out_dtype.name, code_bytes=out_dtype.itemsize)
    dst = np.empty(src.shape, dtype=out_dtype)
    _fastround.round_blocks(src.reshape(-1).view(np.uint8), dst.reshape(-1).view(np.uint8), params,
                            scales.reshape(-1).view(np.uint8), block, rescale)
    return dst.reshape(np.shape(array))


def block_amax(array: np.ndarray, block: int) -> np.ndarray:
    """The largest magnitude of each run of `block` consecutive elements of a float32 or float64 array
    (its flat C order), NaN above Inf: shape array.shape[:-1] + (array.shape[-1] // block,)."""
    src = np.ascontiguousarray(array)
    width = 64 if src.dtype == np.float64 else 32
    dst = np.empty(src.shape[:-1] + (src.shape[-1] // block,), dtype=src.dtype)
    _fastround.block_amax(src.reshape(-1).view(np.uint8), dst.reshape(-1).view(np.uint8), block, width)
    return dst
