"""Assertion helpers for testing casts, quantizers and kernels against fpsim.

    from fpsim.testing import assert_bitwise_equal, assert_within_ulps, ulp

    assert_bitwise_equal(my_cast(x), fpsim.quantize(x, "e4m3"), fmt="e4m3")
    assert_within_ulps(my_kernel(a, b), reference, fmt="fp32", ulps=2)

Both assertions accept numpy arrays (ml_dtypes dtypes included), torch tensors
(any device; a float4_e2m1fn_x2 tensor as its E2M1 codes, two a byte, as
fpsim.decode reads it), numpy scalars and Python numbers, in any mix; a scalar is
compared with every element of the other side. A failure raises
AssertionError listing the first mismatches (index, bit patterns in hex and
decoded values), so that a failing hypothesis example shows what went wrong
bit by bit.

The comparisons are exact: every value is compared as float64, which holds
every value of every fpsim format (and float16/32/64) exactly; an integer it
does not hold (an int64 beyond 2^53) is refused, not rounded. Nothing here
calls the rounding engine: representability and spacing are computed from
the format's definition.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from . import _arrays, exact
from .codec import unpack_fp4_pairs
from .formats import Format, format as get_format

__all__ = ["assert_bitwise_equal", "assert_within_ulps", "ulp"]

MAX_REPORTED = 5
"""How many mismatching elements an assertion message lists."""


# ------------------------------------------------------------------- inputs
class _Side:
    """One side of a comparison: float64 values, raw bits and how to print them."""

    def __init__(self, x, fmt: Format | None, name: str):
        self.name = name
        self.codes = None  # integer codes of fmt, when the input was given as codes
        if _arrays.is_packed_fp4(x):  # two E2M1 codes a byte: compared as the codes fpsim.decode reads
            fmt = fmt or get_format(x.dtype)
            x = unpack_fp4_pairs(x.detach(), fmt)
        self.fmt = fmt
        raw = _to_numpy(x)
        if isinstance(x, (bool, np.bool_)) or raw.dtype == bool:
            raise TypeError(f"{name}: cannot compare booleans ({x!r}); give numbers, arrays or tensors")
        if raw.dtype.kind == "c":
            raise TypeError(f"{name}: complex values are not supported (got dtype {raw.dtype})")
        if raw.dtype.kind in "iu" and fmt is not None and not isinstance(x, int):
            if ((raw < 0) | (raw >= 2 ** fmt.bits)).any():
                bad = tuple(int(i) for i in np.argwhere((raw < 0) | (raw >= 2 ** fmt.bits))[0])
                raise ValueError(f"{name}: integer arrays are bit patterns of {fmt.name}, but "
                                 f"{name}[{bad}] = {int(raw[bad])} is outside 0..{2 ** fmt.bits - 1}")
            self.codes = raw.astype(np.uint64)
            self.values = _decode(self.codes, fmt)
            self.bits, self.width, self.dtype_name = self.codes, fmt.bits, f"{fmt.name} codes"
        elif raw.dtype.kind in "iuO" or isinstance(x, int):
            self.values = _exact_float64(raw, name)
            self.bits, self.width, self.dtype_name = self.values.view(np.uint64), 64, "float64"
        else:
            self.values = raw.astype(np.float64)
            self.width = raw.dtype.itemsize * 8
            self.bits = raw.view(f"uint{self.width}")
            self.dtype_name = str(raw.dtype)
        self.shape = self.values.shape

    def broadcast(self, shape):
        self.values = np.broadcast_to(self.values, shape)
        self.bits = np.broadcast_to(self.bits, shape)
        if self.codes is not None:
            self.codes = np.broadcast_to(self.codes, shape)

    def describe(self, index, fmt: Format | None = None, note: bool = True) -> str:
        """'0x39 (1.125)' in fmt, or the dtype's bits when there is no fmt or the value is not in fmt."""
        fmt = fmt or self.fmt
        value = float(self.values[index])
        shown = _show(value)
        if fmt is not None:
            if self.codes is not None:
                return f"{_hex(int(self.codes[index]), fmt.bits)} ({shown})"
            code = _code_of(value, fmt)
            if code is not None:
                return f"{_hex(code, fmt.bits)} ({shown})"
            raw = _hex(int(self.bits[index]), self.width)
            if note:
                return f"{shown} ({raw} as {self.dtype_name}; not a value of {fmt.name})"
        return f"{_hex(int(self.bits[index]), self.width)} ({shown}) [{self.dtype_name}]"


def _to_numpy(x) -> np.ndarray:
    """A numpy array with the same dtype and bits (torch tensors moved to the CPU)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency of fpsim
        torch = None
    if torch is not None and isinstance(x, torch.Tensor):
        t = x.detach().cpu()
        if t.is_floating_point():
            size = t.element_size()
            ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size]
            bits = t.contiguous().view(ints).numpy().view(f"uint{8 * size}")
            native = _numpy_dtype_of_torch(t.dtype)
            if native is not None:
                return bits.view(native)
            return t.to(torch.float64).numpy()
        return t.numpy()
    return np.asarray(x)


def _exact_float64(raw: np.ndarray, name: str) -> np.ndarray:
    """The float64 values of an integer or object array; ValueError naming the first element that
    float64 does not hold exactly (an int64 beyond 2^53 would otherwise round, and compare equal
    to its neighbour)."""
    values, inexact = _arrays.integers_as_float64(raw)
    if inexact is not None:
        v = raw[inexact]
        raise ValueError(f"{name}{_at(inexact)}: {int(v) if isinstance(v, np.integer) else v!r} is not exactly "
                         f"a float64")
    return values


def _at(index: tuple) -> str:
    return f"[{index}]" if index else ""


def _numpy_dtype_of_torch(dtype):
    from .formats import PRESETS

    for fmt in PRESETS.values():
        if fmt.torch_dtype is not None and fmt.torch_dtype == dtype and fmt.ml_dtype is not None:
            return np.dtype(fmt.ml_dtype)
    return None


def _decode(codes: np.ndarray, fmt: Format) -> np.ndarray:
    """Values of codes, from the format's definition (a table for formats up to 16 bits);
    a NaN code gives a NaN with the code's sign bit."""
    if fmt.bits <= 16:
        values = _decode_table(fmt)[codes.astype(np.int64)]
    else:
        flat = [exact.decode_code(int(c), fmt) for c in codes.ravel()]
        values = np.array(flat, dtype=np.float64).reshape(codes.shape)
    if fmt.signed:
        negative = (codes >> np.uint64(fmt.bits - 1)) & np.uint64(1) == 1
        values = np.where(np.isnan(values) & negative, -np.abs(values), values)
    return values


_TABLES: dict = {}


def _decode_table(fmt: Format) -> np.ndarray:
    if fmt not in _TABLES:
        _TABLES[fmt] = np.array([exact.decode_code(c, fmt) for c in range(1 << fmt.bits)], dtype=np.float64)
    return _TABLES[fmt]


def _code_of(value: float, fmt: Format) -> int | None:
    """The code of a value of fmt (a NaN keeps its sign where the format's NaN codes have one); None if absent."""
    if math.isnan(value):
        if not fmt.has_nan:
            return None
        code = exact.encode_value(value, fmt)
        negative = math.copysign(1.0, value) < 0
        if negative and fmt.signed and fmt.nan in ("ieee", "fn"):
            code |= 1 << (fmt.exp_bits + fmt.man_bits)
        return code
    try:
        return exact.encode_value(value, fmt)
    except ValueError:
        return None


def _hex(code: int, bits: int) -> str:
    return f"0x{code:0{max(1, -(-bits // 4))}x}"


def _show(value: float) -> str:
    if math.isnan(value):
        return "-nan" if math.copysign(1.0, value) < 0 else "nan"
    return repr(value)


def _sides(actual, desired, fmt):
    fmt = get_format(fmt) if fmt is not None else None
    a = _Side(actual, fmt, "actual")
    d = _Side(desired, fmt, "desired")
    if a.shape != d.shape:
        if a.shape == ():
            a.broadcast(d.shape)
        elif d.shape == ():
            d.broadcast(a.shape)
        else:
            raise AssertionError(f"shapes differ: actual {a.shape}, desired {d.shape}")
    return fmt, a, d


def _in_format(values: np.ndarray, fmt: Format) -> np.ndarray:
    """Which float64 values are values of fmt (Inf, NaN and signed zeros by the format's rules)."""
    v = values
    mag = np.abs(v)
    with np.errstate(invalid="ignore", over="ignore"):
        finite = np.isfinite(v)
        step = _ulp_array(np.where(finite, mag, 0.0), fmt)
        on_grid = finite & (np.mod(mag, step) == 0) & (mag <= float(fmt.max))
    on_grid &= (mag >= float(fmt.min_subnormal)) | (mag == 0)
    if not fmt.zero:
        on_grid &= mag != 0
    ok = on_grid
    if not fmt.signed:
        ok &= ~np.signbit(v) | (v == 0)
    if not fmt.has_negative_zero:
        ok &= ~((v == 0) & np.signbit(v))
    if fmt.infinities:
        ok |= np.isinf(v) & (fmt.signed | ~np.signbit(v))
    if fmt.has_nan:
        ok |= np.isnan(v)
    return ok


def _inputs_side(inputs, shape):
    if inputs is None:
        return None
    side = _Side(inputs, None, "inputs")
    if side.shape != shape:
        if side.shape != ():
            raise ValueError(f"inputs have shape {side.shape}, the compared arrays {shape}")
        side.broadcast(shape)
    return side


def _input_text(side, index) -> str:
    return "" if side is None else f"input {side.describe(index)}: "


def _first(mask: np.ndarray) -> list:
    return [tuple(int(i) for i in idx) for idx in np.argwhere(mask)[:MAX_REPORTED]]


def _report(header: str, mask: np.ndarray, lines_for, err_msg: str) -> None:
    __tracebackhide__ = True  # pytest shows the caller's line, not this one
    count = int(mask.sum())
    shown = _first(mask)
    lines = [f"{header}: {count} of {mask.size} elements differ"
             + (f" (first {len(shown)} shown)" if count > len(shown) else "")]
    if err_msg:
        lines.insert(0, err_msg)
    for index in shown:
        lines.append(f"  at {index if index else '()'}: {lines_for(index)}")
    raise AssertionError("\n".join(lines))


# ------------------------------------------------------------ assertions
def assert_bitwise_equal(actual, desired, fmt: "str | Format | None" = None, *, check_nan_sign: bool = False,
                         inputs=None, err_msg: str = "") -> None:
    """Assert that two arrays (or tensors, or scalars) hold the same bits, NaN-aware.

    Equal means: the same value and the same sign of zero (+0 and -0 differ),
    or both NaN. NaN payloads are ignored, and so is the sign of a NaN unless
    `check_nan_sign` (casts disagree on NaN signs, and x86 arithmetic makes
    negative NaNs); the fnuz formats have a single NaN, so their NaN signs
    never count.

    fmt: when given (a name or a Format), both sides must hold values of that
        format (NaN only when it has NaN codes, Inf only when it has
        infinities: fpsim.quantize refuses NaN into a format without NaN),
        mismatches are shown as its bit patterns, and integer
        arrays/tensors (not Python ints) are read as its bit patterns (codes),
        so a kernel that returns uint8 codes can be compared with
        ``fpsim.encode(x, fmt)`` or with ``fpsim.quantize(x, fmt)``. Without
        fmt, bits are shown in each side's own dtype, and integers (arrays,
        tensors, Python ints) are compared as float64 values: one that
        float64 does not hold exactly (an int64 beyond 2^53) raises
        ValueError rather than being rounded.

    inputs: optionally, the inputs the two sides were computed from (same
        shape); each reported mismatch then starts with the exact input and
        its bits (numpy prints arrays rounded to 8 digits, so a falsifying
        example's repr may not show the input exactly).
    err_msg: a line printed above the report.

    Raises AssertionError naming the first mismatching elements: index, bits
    in hex and decoded values.
    """
    __tracebackhide__ = True
    fmt, a, d = _sides(actual, desired, fmt)
    av, dv = a.values, d.values
    a_nan, d_nan = np.isnan(av), np.isnan(dv)
    with np.errstate(invalid="ignore"):
        same = (av == dv) & (np.signbit(av) == np.signbit(dv))
    same |= a_nan & d_nan
    if check_nan_sign and (fmt is None or fmt.nan != "fnuz"):
        same &= ~(a_nan & d_nan & (np.signbit(av) != np.signbit(dv)))
    if a.codes is not None and d.codes is not None:  # both codes: compare the codes themselves
        same = (a.codes == d.codes) | (a_nan & d_nan & same)
    bad = ~same
    if fmt is not None:
        bad |= ~_in_format(av, fmt) if a.codes is None else False
        bad |= ~_in_format(dv, fmt) if d.codes is None else False
    if bad.any():
        where = f" in {fmt.name}" if fmt is not None else ""
        source = _inputs_side(inputs, a.shape)
        _report(f"Not bitwise equal{where}", bad,
                lambda i: f"{_input_text(source, i)}actual {a.describe(i)}, desired {d.describe(i)}", err_msg)


def ulp(x, fmt: "str | Format"):
    """The spacing of fmt's grid at x: 2^(max(floor(log2|x|), emin) - man_bits).

    This is the gap between the values of fmt in the binade holding |x|, so:

    * at a power of two 2^e it is the gap *above* (to the next larger value);
      the gap below 2^e is half as large, except at the bottom of the normal
      range, where the subnormal spacing continues;
    * below min_normal it is the subnormal spacing, min_subnormal; for a
      format without subnormals it is min_normal (its grid there is
      {0, min_normal});
    * at zero it is the gap from 0 to the smallest positive value:
      min_subnormal (min_normal without subnormals);
    * x need not be a value of fmt; beyond max the exponent range is taken
      as unbounded (the spacing keeps doubling); Inf and NaN give NaN.

    Numpy arrays and scalars give float64 (a Python float for a Python
    number); torch tensors give a float64 tensor on the same device.
    """
    fmt = get_format(fmt)
    raw = _to_numpy(x)
    result = _ulp_array(_magnitudes(raw), fmt)
    values = raw if raw.dtype.kind in "fiu" else np.asarray(raw, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        result = np.where(np.isfinite(values), result, np.nan)
    try:
        import torch
    except ImportError:  # pragma: no cover
        torch = None
    if torch is not None and isinstance(x, torch.Tensor):
        return torch.from_numpy(np.ascontiguousarray(result)).to(x.device)
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return float(result)
    return result[()] if result.ndim == 0 else result


def _magnitudes(raw: np.ndarray) -> np.ndarray:
    """|x| as float64 in the same binade as the exact |x|: integers and Fractions that float64 would
    round up to a power of two (2^54 - 1 to 2^54) are rounded down instead."""
    if raw.dtype.kind not in "iuO":
        return np.abs(raw.astype(np.float64))
    mag = np.array(np.abs(np.asarray(raw, dtype=np.float64)))  # an array even for 0-d input, to write to
    if raw.dtype.kind == "O":
        wide = np.ones(raw.shape, dtype=bool)
    else:
        wide = mag > 2.0**53
    for index in map(tuple, np.argwhere(wide)):
        exact_mag = abs(raw[index]) if raw.dtype.kind == "O" else abs(int(raw[index]))
        if float(mag[index]) > exact_mag:  # exact: a Python float against an int or a Fraction
            mag[index] = math.nextafter(float(mag[index]), 0.0)
    return mag


def _ulp_array(mag: np.ndarray, fmt: Format) -> np.ndarray:
    """ulp for finite nonnegative float64 magnitudes (exact powers of two)."""
    mag = np.asarray(mag, dtype=np.float64)
    _, e = np.frexp(np.where(np.isfinite(mag), mag, 1.0))
    e = e.astype(np.int64) - 1  # floor(log2 |x|) for x > 0
    e = np.where(mag > 0, e, fmt.emin - 1)  # zero: below the normal range, as the smallest values
    if fmt.subnormals:
        q = np.maximum(e, fmt.emin) - fmt.man_bits
    else:
        q = np.where(e < fmt.emin, fmt.emin, e - fmt.man_bits)
    return np.ldexp(1.0, q)


def assert_within_ulps(actual, desired, fmt: "str | Format", ulps: float = 1, *, inputs=None,
                       err_msg: str = "") -> None:
    """Assert |actual - desired| <= ulps * ulp(desired, fmt) elementwise (exactly, without rounding error).

    The error is measured in units of fmt's grid spacing at the *desired*
    (reference) value, see `ulp`; ulps may be fractional (0.5 for a
    round-to-nearest result against the exact value). NaN matches NaN,
    an infinity matches only the same infinity, and signs of zero are not
    compared. actual and desired need not be values of fmt: pass the exact
    reference, and the result of the kernel under test.

    inputs, err_msg: as for `assert_bitwise_equal`.

    Raises AssertionError naming the first elements out of tolerance: index,
    bits, values and the error in ulps.
    """
    __tracebackhide__ = True
    if isinstance(ulps, bool) or not isinstance(ulps, (int, float, np.integer, np.floating)) or not ulps >= 0:
        raise ValueError(f"ulps must be a nonnegative number, got {ulps!r}")
    fmt_obj = get_format(fmt)
    _, a, d = _sides(actual, desired, None)
    av, dv = a.values, d.values
    a_nan, d_nan = np.isnan(av), np.isnan(dv)
    finite = np.isfinite(av) & np.isfinite(dv)
    step = _ulp_array(np.where(np.isfinite(dv), np.abs(dv), 0.0), fmt_obj)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(finite, np.abs(av - dv), np.inf)
        tol = step * float(ulps)
        ok = np.asarray(finite & (diff <= tol))  # an array even for 0-d inputs (numpy gives a scalar)
        # float64 subtraction can round: settle elements near the limit with fractions
        near = finite & np.isclose(diff, tol, rtol=1e-9, atol=0)
    for index in map(tuple, np.argwhere(near)):  # argwhere: 0-d arrays too (scalars)
        err = abs(Fraction(float(av[index])) - Fraction(float(dv[index])))
        ok[index] = err <= Fraction(float(step[index])) * Fraction(float(ulps))
    ok |= a_nan & d_nan
    ok |= np.isinf(av) & (av == dv)
    bad = ~ok
    if bad.any():
        source = _inputs_side(inputs, a.shape)

        def line(i):
            if finite[i]:
                err = abs(Fraction(float(av[i])) - Fraction(float(dv[i]))) / Fraction(float(step[i]))
                error = f"{float(err):.6g} ulps"
            else:
                error = "not finite"
            spacing = float(step[i]) if np.isfinite(dv[i]) else math.nan  # as ulp(): NaN at Inf and NaN
            return (f"{_input_text(source, i)}actual {a.describe(i, fmt_obj, False)}, "
                    f"desired {d.describe(i, fmt_obj, False)}: error {error} "
                    f"(ulp {spacing!r} in {fmt_obj.name})")

        _report(f"Not within {ulps} ulps of {fmt_obj.name}", bad, line, err_msg)
