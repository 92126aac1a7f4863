"""Hypothesis strategies that find the inputs where floating-point formats break.

    from hypothesis import given
    import fpsim.strategies as fps

    @given(fps.rounding_inputs("e4m3", np.float32))
    def test_my_cast(x):
        assert_bitwise_equal(my_cast(x), fpsim.quantize(x, "e4m3"), fmt="e4m3")

hypothesis is an optional dependency of fpsim: ``import fpsim`` works without
it, and this module, imported explicitly as ``fpsim.strategies``, raises
ImportError saying how to install it.

The strategies (each documented below):

* `formats()`: the presets and random valid custom formats;
* `values(fmt)`: values of a format (Python floats), biased towards zeros,
  the subnormal edges, min normal, max, powers of two and their neighbours;
* `codes(fmt)`: bit patterns (Python ints), every kind of NaN code included;
* `rounding_inputs(fmt, dtype)`: float32/float64 inputs at and around the
  midpoints between neighbouring values, at the overflow threshold, in the
  subnormal range, plus ordinary floats;
* `arrays(fmt, shape)`: numpy arrays of values of a format;
* `dot_problems(inputs_format, k)`: (a, b, c) for dot products, with
  cancellation, wide exponent spread and tiny products;
* `block_arrays(block_format)`: arrays for block formats (MX, NVFP4, ...),
  biased to block-amax edges, ties of the scaled elements and partial blocks.

Everything is built from integers (codes, exponents, positions on the
format's grid), so hypothesis shrinks a failure towards simple values: 0,
1.0, the smallest change from 1.0 that still fails, the first preset
formats (the 4- to 8-bit ones). Values are computed from the format's
definition (`fpsim.formats`, `fpsim.exact`), never by the rounding engine
under test.
"""

from __future__ import annotations

import decimal
import math
import numbers
from fractions import Fraction
from typing import NamedTuple

import numpy as np

try:
    from hypothesis import reject
    from hypothesis import strategies as st
    from hypothesis.errors import InvalidArgument
    from hypothesis.extra import numpy as hnp
except ImportError as error:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        "fpsim.strategies needs hypothesis, an optional dependency of fpsim; install it with "
        "`pip install hypothesis` (or `pip install 'fpsim[test]'`). The rest of fpsim, fpsim.testing "
        "included, works without it."
    ) from error

from . import exact
from .formats import NAN_ENCODINGS, PRESETS, Format, format as get_format

__all__ = ["DotProblem", "arrays", "block_arrays", "codes", "dot_problems", "formats", "rounding_inputs",
           "values"]


# ------------------------------------------------------------ the grid
class _Grid:
    """The finite values of a format as a monotone sequence of integer positions ("ordinals").

    Position 0 is +0 (the smallest value when the format has no zero),
    positive positions count up through the positive values, negative ones
    mirror them. -0 has no position (see `values`). With subnormals=False the
    subnormal values are skipped.
    """

    def __init__(self, fmt: Format, subnormals: bool = True):
        self.fmt = fmt
        m = fmt.man_bits
        self.code_max = (fmt.max_exp_field << m) | (fmt.max_significand - (1 << m))
        if not fmt.zero:
            self.code_lo = 0  # exponent field 0 is a normal binade
        elif fmt.subnormals and subnormals:
            self.code_lo = 1
        else:
            self.code_lo = 1 << m  # the exponent-0 codes hold only zero
        self.subnormals = fmt.subnormals and subnormals
        positives = self.code_max - self.code_lo + 1
        self.hi = positives if fmt.zero else positives - 1
        self.lo = -positives if fmt.signed else 0

    def magnitude(self, code: int) -> float:
        fmt, m = self.fmt, self.fmt.man_bits
        field, man = code >> m, code & ((1 << m) - 1)
        if field >= fmt.min_exp_field:
            return math.ldexp((1 << m) | man, field - fmt.bias - m)
        return math.ldexp(man, fmt.emin - m)

    def value(self, s: int) -> float:
        if s >= 0:
            if self.fmt.zero:
                return 0.0 if s == 0 else self.magnitude(self.code_lo + s - 1)
            return self.magnitude(self.code_lo + s)
        return -self.magnitude(self.code_lo - s - 1)

    def mirror(self, s: int) -> int:
        """The position of -value(s), for s >= 0 (s itself for zero)."""
        if self.fmt.zero:
            return -s
        return -s - 1

    def position_of_code(self, code: int) -> int:
        """Position of the positive value with magnitude code `code` (code >= code_lo)."""
        return code - self.code_lo + (1 if self.fmt.zero else 0)

    def position_of_power(self, e: int) -> int:
        """Position of 2^e, for e in [lowest_exponent, emax]."""
        fmt, m = self.fmt, self.fmt.man_bits
        if e >= fmt.emin:
            code = (e + fmt.bias) << m
        else:
            code = 1 << (e - fmt.emin + m)
        return self.position_of_code(code)

    @property
    def lowest_exponent(self) -> int:
        return self.fmt.emin - self.fmt.man_bits if self.subnormals else self.fmt.emin

    def at_least(self, x) -> int:
        """The smallest position whose value is >= x (hi + 1 when none)."""
        x = Fraction(x)
        lo, hi = self.lo, self.hi + 1
        while lo < hi:
            mid = (lo + hi) // 2
            if Fraction(self.value(mid)) >= x:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def at_most(self, x) -> int:
        """The largest position whose value is <= x (lo - 1 when none)."""
        x = Fraction(x)
        lo, hi = self.lo - 1, self.hi
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if Fraction(self.value(mid)) <= x:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def edge_positions(self) -> list[int]:
        """Positive positions where bugs live, simplest first: 0, 1, min subnormal, max subnormal,
        min normal and its neighbours, max and the value below it."""
        fmt, m = self.fmt, self.fmt.man_bits
        out = [0]
        if fmt.emin <= 0 <= fmt.emax:
            out.append(self.position_of_power(0))
        if self.subnormals:
            out += [self.position_of_code(1), self.position_of_code((1 << m) - 1)]
        normal = self.position_of_power(fmt.emin)
        top = self.position_of_code(self.code_max)
        out += [normal, normal + 1, top, top - 1, normal - 1]
        seen, result = set(), []
        for s in out:
            if 0 <= s <= self.hi and s not in seen:
                seen.add(s)
                result.append(s)
        return result


def _nan_values(fmt: Format) -> list[float]:
    """The NaNs a format's codes decode to: its sign counts where the format has signed NaN codes."""
    nan = float("nan")
    if fmt.nan == "fnuz":
        return [math.copysign(nan, -1.0)]
    if not fmt.signed:
        return [math.copysign(nan, 1.0)]
    return [math.copysign(nan, 1.0), math.copysign(nan, -1.0)]


def _check_bool(name, value, allow_none=False):
    if value is None and allow_none:
        return
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidArgument(f"{name} must be a bool{' or None' if allow_none else ''}, got {value!r}")


# ------------------------------------------------------------- formats
def _preset_order(fmt: Format):
    return (fmt.bits, fmt.name)


@st.composite
def _custom_formats(draw, exp_bits, man_bits, bias_offset, nan, allow_unsigned, allow_no_zero, max_bits):
    encoding = draw(st.sampled_from(nan))
    e_lo = max(exp_bits[0], 2 if encoding == "ieee" else 1)
    if e_lo > exp_bits[1]:
        reject()
    e = draw(st.integers(e_lo, exp_bits[1]))
    unsigned = encoding != "fnuz" and allow_unsigned and draw(st.integers(0, 3)) == 3
    m_lo = max(man_bits[0], 1 if encoding == "ieee" else 0)
    m_hi = man_bits[1] if max_bits is None else min(man_bits[1], max_bits - e - (0 if unsigned else 1))
    if m_lo > m_hi:
        reject()
    m = draw(st.integers(m_lo, m_hi))
    subnormals = m > 0 and not draw(st.booleans())  # shrinks to "with subnormals", as IEEE formats
    zero = subnormals or encoding == "fnuz" or not allow_no_zero or draw(st.integers(0, 7)) != 7
    default_bias = (1 << (e - 1)) - 1
    bias = default_bias + draw(st.integers(-bias_offset, bias_offset))
    try:
        return Format(e, m, bias=bias, signed=not unsigned, nan=encoding, subnormals=subnormals, zero=zero)
    except ValueError:  # only outside the default ranges, e.g. exp_bits=1 with nan="fn" and man_bits=0
        reject()


def formats(*, presets=True, custom: bool = True, exp_bits=(2, 8), man_bits=(0, 10), bias_offset: int = 4,
            nan=NAN_ENCODINGS, allow_unsigned: bool = True, allow_no_zero: bool = True,
            max_bits: int | None = None):
    """Formats: the presets and random valid custom layouts (`fpsim.Format` objects).

    presets: True for every preset, False for none, or a list of preset names.
        They come first, smallest first (e2m1, e2m3, e3m2, e4m3, ...), so a
        failure shrinks towards a small preset.
    custom: also draw custom layouts: exp_bits and man_bits in the given
        inclusive (lowest, highest) ranges of ints (within 1..11 and 0..52),
        bias within `bias_offset` (a nonnegative int) of the IEEE default
        2^(exp_bits-1) - 1, every NaN encoding in `nan` ("ieee" with
        infinities, "fn", "fnuz", "none"), subnormals on and off, unsigned
        formats (a quarter, when `allow_unsigned`) and formats without a zero
        (E8M0-like, when `allow_no_zero`). Only valid combinations are drawn;
        arguments that leave none are refused (InvalidArgument) here, not
        when drawing.
    max_bits: only formats of at most this many bits (sign included), e.g. 16
        to enumerate every code.
    """
    _check_bool("custom", custom)
    _check_bool("allow_unsigned", allow_unsigned)
    _check_bool("allow_no_zero", allow_no_zero)
    exp_bits = _check_range("exp_bits", exp_bits, 1, 11)
    man_bits = _check_range("man_bits", man_bits, 0, 52)
    if not _is_int(bias_offset) or bias_offset < 0:
        raise InvalidArgument(f"bias_offset must be a nonnegative int, got {bias_offset!r}")
    if max_bits is not None and (not _is_int(max_bits) or max_bits < 1):
        raise InvalidArgument(f"max_bits must be a positive int or None, got {max_bits!r}")
    if presets is True:
        chosen = list(PRESETS.values())
    elif presets is False or presets is None:
        chosen = []
    else:
        chosen = [get_format(p) for p in presets]
    if max_bits is not None:
        chosen = [f for f in chosen if f.bits <= max_bits]
    chosen.sort(key=_preset_order)
    unknown = [n for n in nan if n not in NAN_ENCODINGS]
    if unknown or not nan:
        raise InvalidArgument(f"nan must be a non-empty list of {', '.join(NAN_ENCODINGS)}; got {nan!r}")
    branches = []
    if chosen:
        branches.append(st.sampled_from(chosen))
    if custom:
        if not any(_smallest_layout(n, exp_bits, man_bits, bool(allow_unsigned)) <= (max_bits or 64) for n in nan):
            raise InvalidArgument(f"no custom layout has exp_bits in {exp_bits}, man_bits in {man_bits}, a NaN "
                                  f"encoding in {tuple(nan)} and at most max_bits={max_bits} bits; "
                                  f"widen them, or give custom=False")
        branches.append(_custom_formats(exp_bits, man_bits, int(bias_offset), tuple(nan),
                                        bool(allow_unsigned), bool(allow_no_zero), max_bits))
    if not branches:
        raise InvalidArgument("formats() with presets=False and custom=False has nothing to draw")
    return st.one_of(branches)


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _check_range(name, pair, lowest: int, highest: int) -> tuple[int, int]:
    """An inclusive (lowest, highest) pair of ints within lowest..highest, or InvalidArgument."""
    try:
        lo, hi = pair
    except (TypeError, ValueError):
        lo = hi = None
    if not (_is_int(lo) and _is_int(hi)) or lo > hi:
        raise InvalidArgument(f"{name} must be a (lowest, highest) pair of ints, got {pair!r}")
    if lo < lowest or hi > highest:
        raise InvalidArgument(f"{name} must lie in {lowest}..{highest}, got {pair!r}")
    return int(lo), int(hi)


def _smallest_layout(encoding: str, exp_bits, man_bits, allow_unsigned: bool) -> float:
    """The fewest bits a custom layout with this NaN encoding can have (inf when none fits the ranges),
    by the limits `_custom_formats` draws within."""
    e_lo = max(exp_bits[0], 2 if encoding == "ieee" else 1)
    m_lo = max(man_bits[0], 1 if encoding == "ieee" else 0)
    if e_lo > exp_bits[1] or m_lo > man_bits[1]:
        return math.inf
    return e_lo + m_lo + (0 if allow_unsigned and encoding != "fnuz" else 1)


# -------------------------------------------------------------- values
def _check_bound(name, value):
    """A bound as hypothesis takes one: None, or a real number (int, float, Fraction, Decimal, numpy
    scalar), as its exact value: a float (which keeps the sign of zero, and +-inf) or a Fraction."""
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, decimal.Decimal)):
        raise InvalidArgument(f"{name} must be a real number (an int, float, Fraction or numpy scalar) or None, "
                              f"got {value!r}")
    if isinstance(value, numbers.Integral):  # numpy integers too
        return Fraction(int(value))
    if isinstance(value, numbers.Rational):
        return Fraction(value.numerator, value.denominator)
    if value != value or (isinstance(value, decimal.Decimal) and value.is_nan()):  # noqa: PLR0124 - NaN
        raise InvalidArgument(f"{name} must not be NaN")
    f = float(value)
    if f == value:  # exact (Decimal and numpy floats compare exactly with a float)
        return f
    return Fraction(*value.as_integer_ratio()) if hasattr(value, "as_integer_ratio") else Fraction(value)


def _value_plan(fmt: Format, allow_nan, allow_infinity, allow_subnormal, allow_negative, min_value, max_value):
    """What `values` draws, checked: (grid, lo, hi, specials), the finite values being grid positions
    lo..hi and the specials (-0, +-Inf, NaN, edges of the grid) a list of floats."""
    for name, flag in (("allow_nan", allow_nan), ("allow_infinity", allow_infinity)):
        _check_bool(name, flag, allow_none=True)
    _check_bool("allow_subnormal", allow_subnormal)
    _check_bool("allow_negative", allow_negative)
    min_arg, max_arg = min_value, max_value
    min_value, max_value = _check_bound("min_value", min_value), _check_bound("max_value", max_value)
    bounded = min_value is not None or max_value is not None  # an infinite bound too, as in hypothesis
    if min_value == -math.inf:  # unbounded on that side
        min_value = None
    if max_value == math.inf:
        max_value = None
    if min_value is not None and max_value is not None and min_value > max_value:
        raise InvalidArgument(f"min_value={min_arg!r} is above max_value={max_arg!r}")
    if allow_nan and not fmt.has_nan:
        raise InvalidArgument(f"allow_nan=True, but {fmt.name} has no NaN")
    if allow_infinity and not fmt.infinities:
        raise InvalidArgument(f"allow_infinity=True, but {fmt.name} has no infinities")
    if allow_nan and bounded:
        raise InvalidArgument("allow_nan=True cannot be combined with min_value or max_value")
    if allow_infinity and min_value is not None and max_value is not None:
        raise InvalidArgument(f"allow_infinity=True cannot be combined with both min_value={min_arg!r} and "
                              f"max_value={max_arg!r}")
    if allow_infinity is False and (min_value == math.inf or max_value == -math.inf):
        raise InvalidArgument(f"allow_infinity=False excludes min_value={min_arg!r}, max_value={max_arg!r}")
    if allow_nan is None:
        allow_nan = fmt.has_nan and not bounded
    if allow_infinity is None:
        allow_infinity = fmt.infinities and (min_value is None or max_value is None)

    grid = _Grid(fmt, subnormals=allow_subnormal)
    lo, hi = grid.lo, grid.hi
    if not allow_negative:
        lo = max(lo, 0)
    min_is_positive_zero = min_value is not None and min_value == 0 and math.copysign(1.0, float(min_value)) > 0
    max_is_negative_zero = max_value is not None and max_value == 0 and math.copysign(1.0, float(max_value)) < 0
    if min_value is not None:
        lo = max(lo, grid.hi + 1 if min_value == math.inf else grid.at_least(min_value))
    if max_value is not None:
        hi = min(hi, grid.lo - 1 if max_value == -math.inf else grid.at_most(max_value))
        if max_is_negative_zero and fmt.zero:
            hi = min(hi, -1)

    def inside(s):
        return lo <= s <= hi

    edges = []

    def add(v):
        if all((v, math.copysign(1.0, v)) != (e, math.copysign(1.0, e)) for e in edges):
            edges.append(v)

    negative_zero = (fmt.has_negative_zero and allow_negative and not min_is_positive_zero
                     and (min_value is None or min_value <= 0) and (max_value is None or max_value >= 0))
    for s in grid.edge_positions():
        for t in (s, grid.mirror(s)):
            if inside(t):
                add(grid.value(t))
        if s == 0 and negative_zero:
            add(-0.0)
    if allow_infinity:
        if max_value is None:
            edges.append(math.inf)
        if min_value is None and allow_negative and fmt.signed:
            edges.append(-math.inf)
    if allow_nan:
        edges += _nan_values(fmt)
    if lo > hi and not edges:
        raise InvalidArgument(f"no value of {fmt.name} satisfies min_value={min_arg!r}, max_value={max_arg!r}, "
                              f"allow_negative={allow_negative}, allow_subnormal={allow_subnormal}")
    return grid, lo, hi, edges


def values(fmt, *, allow_nan: bool | None = None, allow_infinity: bool | None = None,
           allow_subnormal: bool = True, allow_negative: bool = True, min_value=None, max_value=None):
    """Values exactly representable in `fmt`, as Python floats (exact: every fpsim value fits binary64).

    Biased towards where bugs live: +0 and -0, 1.0, the smallest and largest
    subnormals, min normal and its neighbours, max and the value below it,
    powers of two and their neighbours on the grid, then any value. Shrinks
    towards 0, then 1.0 and its neighbours.

    allow_nan, allow_infinity: None means "when the format has them and no
        bound excludes them" (as hypothesis.strategies.floats). NaN comes with
        the sign(s) the format's NaN codes decode to: both for IEEE and fn
        formats, negative for fnuz, positive for unsigned formats.
    allow_subnormal: False leaves out the subnormal values.
    allow_negative: False leaves out negative numbers and -0.
    min_value, max_value: inclusive bounds, as in hypothesis.strategies.floats:
        real numbers (ints, floats, Fractions, numpy scalars, taken exactly;
        they need not be values of fmt), not NaN; -inf and inf mean unbounded
        on that side (and still rule out NaN, and Inf when both bounds are
        finite); min_value=inf leaves only +Inf. min_value=0.0 excludes -0.0
        and max_value=-0.0 excludes +0.0.
    """
    fmt = get_format(fmt)
    grid, lo, hi, edges = _value_plan(fmt, allow_nan, allow_infinity, allow_subnormal, allow_negative,
                                      min_value, max_value)
    # Branch order is shrink order: any value first (it shrinks to 1.0, a failure above 1000
    # to 1024), then the edges (0, -0, NaN, ...), which the first branch does not reach.
    branches = []
    if lo <= hi:
        branches.append(_positions(grid, lo, hi, fmt.signed and allow_negative).map(grid.value))
    if edges:
        branches.append(st.sampled_from(edges))
    return st.one_of(branches)


def _witnesses(grid: _Grid, lo: int, hi: int) -> list[float]:
    """Values at grid positions lo..hi that a float dtype holds only if it holds all of them: both
    ends, and in every binade the first two (two neighbours: their spacing is the binade's)."""
    fmt, out = grid.fmt, []

    def side(p_lo, p_hi, sign):
        if p_lo > p_hi:
            return
        out.extend([sign * grid.value(p_lo), sign * grid.value(p_hi)])
        for e in range(grid.lowest_exponent, fmt.emax + 1):
            first = max(grid.position_of_power(e), p_lo)
            last = min(grid.position_of_power(e + 1) - 1 if e < fmt.emax else grid.hi, p_hi)
            out.extend(sign * grid.value(s) for s in range(first, min(first + 1, last) + 1))

    side(max(lo, 0), hi, 1.0)
    if lo <= min(hi, -1):  # negative position s holds -value(s') for the positive s' it mirrors
        flip = (lambda s: -s) if fmt.zero else (lambda s: -s - 1)
        side(flip(min(hi, -1)), flip(lo), -1.0)
    return out


@st.composite
def _positions(draw, grid: _Grid, lo: int, hi: int, signed: bool) -> int:
    """A grid position in [lo, hi], drawn as (sign, exponent, mantissa) so that it shrinks well.

    The exponent shrinks towards 0 and the mantissa towards 0, so a failure shrinks to a
    power of two near 1 (a failure above 1000 to 1024). The mantissa is any (kind 0), or
    biased to where bugs live: 0 (the power of two itself), 1 (just above it) or all ones
    (just below the next power). Positions outside [lo, hi] are clamped to it.
    """
    fmt, M = grid.fmt, grid.fmt.man_bits
    magnitudes = [abs(grid.value(lo)), abs(grid.value(hi))]
    first_positive = max(lo, 1 if fmt.zero else 0)
    if first_positive <= hi:  # the smallest positive value allowed
        magnitudes.append(grid.value(first_positive))
    if lo <= min(hi, -1):  # the negative value nearest zero allowed
        magnitudes.append(abs(grid.value(min(hi, -1))))
    nonzero = [m for m in magnitudes if m > 0] or [float(fmt.min_subnormal)]
    e_lo = max(grid.lowest_exponent, exact.floor_log2(Fraction(min(nonzero))))
    e_hi = min(fmt.emax, exact.floor_log2(Fraction(max(nonzero))))
    can_negative = signed and lo < 0
    can_positive = hi >= 0
    negative = draw(st.booleans()) if can_negative and can_positive else can_negative
    e = draw(st.integers(e_lo, max(e_lo, e_hi)))
    if e >= fmt.emin:
        bits, base = M, ((e + fmt.bias) << M)
        top = (fmt.max_significand - (1 << M)) if e == fmt.emax else (1 << M) - 1
    else:  # a subnormal binade: leading bit at e, e - (emin - M) bits below it
        bits = e - (fmt.emin - M)
        base, top = 1 << bits, (1 << bits) - 1
    kind = draw(st.integers(0, 3))
    if kind == 0:
        m = draw(st.integers(0, top)) if top > 0 else 0
    else:
        m = (0, min(1, top), top)[kind - 1]
    s = grid.position_of_code(base | m)
    if negative:
        s = grid.mirror(s)
    return min(max(s, lo), hi)


# --------------------------------------------------------------- codes
def _special_codes(fmt: Format) -> list[int]:
    """Codes of zeros, subnormal and normal edges, max, Inf and NaN (every NaN when there are few)."""
    m, e = fmt.man_bits, fmt.exp_bits
    sign = 1 << (e + m) if fmt.signed else 0
    grid = _Grid(fmt)
    top_field = (1 << e) - 1
    mags = [0] if fmt.zero else []
    if fmt.zero and not fmt.subnormals and m > 0:
        mags.append(1)  # not canonical: an exponent-0 code of a format without subnormals (reads as 0)
    if fmt.subnormals:
        mags += [1, (1 << m) - 1]
    normal = (fmt.emin + fmt.bias) << m
    mags += [normal, normal + 1, grid.code_max, grid.code_max - 1]
    if fmt.emin <= 0 <= fmt.emax:
        mags.append(fmt.bias << m)
    if fmt.infinities:
        mags.append(top_field << m)
    nan_mags = []
    if fmt.nan == "ieee":
        payloads = range(1, 1 << m) if m <= 5 else sorted({1, 2, 1 << (m - 1), (1 << (m - 1)) | 1, (1 << m) - 1})
        nan_mags = [(top_field << m) | p for p in payloads]
    elif fmt.nan == "fn":
        nan_mags = [(1 << (e + m)) - 1]
    out = []
    for mag in mags + nan_mags:
        for code in ((mag, mag | sign) if sign else (mag,)):
            if code not in out:
                out.append(code)
    if fmt.nan == "fnuz":
        out.append(sign)  # the negative-zero code is the one NaN
    return out


def codes(fmt, *, allow_nan: bool = True, allow_infinity: bool = True):
    """Bit patterns of `fmt` as Python ints in [0, 2^bits).

    Biased towards the special codes: both zeros, the non-canonical
    exponent-0 codes of formats without subnormals, the subnormal and normal
    edges, max, 1.0, the infinities and every NaN encoding (all NaN codes of
    small IEEE formats, the edge payloads of wider ones, both signs; the fn
    all-ones codes; the fnuz negative-zero code). Shrinks towards 0.
    """
    fmt = get_format(fmt)
    _check_bool("allow_nan", allow_nan)
    _check_bool("allow_infinity", allow_infinity)

    def keep(code):
        value = exact.decode_code(code, fmt)
        if math.isnan(value):
            return allow_nan
        return allow_infinity or not math.isinf(value)

    specials = [c for c in _special_codes(fmt) if keep(c)]
    generic = st.integers(0, (1 << fmt.bits) - 1)
    if not (allow_nan and allow_infinity):
        generic = generic.filter(keep)
    return st.one_of(st.sampled_from(specials), generic) if specials else generic


# ------------------------------------------------------ rounding inputs
_FLOAT_DTYPES = (np.float16, np.float32, np.float64)


def _check_dtype(dtype):
    dtype = np.dtype(dtype)
    if dtype not in [np.dtype(d) for d in _FLOAT_DTYPES]:
        raise InvalidArgument(f"dtype must be numpy float16, float32 or float64, got {dtype}")
    return dtype.type


def _to_dtype(v, dtype):
    """The float of `dtype` nearest to v (a Fraction or float), ties to even; Inf beyond its range."""
    try:
        f = float(v)  # correctly rounded; exact for every midpoint of a format of < 52 mantissa bits
    except OverflowError:
        f = math.inf if v > 0 else -math.inf
    with np.errstate(over="ignore"):
        return dtype(f)


def _step(x, steps: int, dtype):
    with np.errstate(over="ignore"):
        direction = dtype(math.inf if steps > 0 else -math.inf)
        for _ in range(abs(steps)):
            x = np.nextafter(x, direction)
    return dtype(x)


def rounding_inputs(fmt, dtype=np.float32, *, allow_nan: bool | None = None, allow_infinity: bool = True,
                    allow_negative: bool | None = None):
    """Inputs of `dtype` (numpy float32 or float64 scalars; float16 works too) where rounding into `fmt` is delicate.

    Drawn from, in this order (the order a failure shrinks through):

    * the values of fmt, exact or 1 ulp of `dtype` away, from 1.0 outwards;
    * the midpoints between neighbouring values of fmt (between 0 and the
      smallest subnormal included), exact or 1 ulp of `dtype` away;
    * both of those at the edges: 0, the subnormal edges, min normal, max;
    * the subnormal range of fmt: any float of dtype in [0, min_normal];
    * the overflow edge: max, the overflow threshold (the midpoint between
      max and the next grid point above it), that grid point, 2*max, each
      exact or 1 ulp away; dtype's max; Inf and NaN when allowed;
    * any float of dtype (NaN and Inf when allowed).

    Each is positive or negative (negative inputs too when fmt is unsigned
    and has NaN: they must round to NaN, or to 0 for -0). Where a point is
    beyond dtype's range it becomes Inf (dtype's max when allow_infinity is
    False).

    By default (None) only inputs that `fpsim.quantize` takes are drawn: NaN
    only when fmt has NaN, negatives not for an unsigned format without NaN,
    and no zero for a format with neither zero nor NaN (quantize refuses
    inputs that have no value in fmt). True draws them anyway.
    """
    fmt = get_format(fmt)
    dtype = _check_dtype(dtype)
    if allow_nan is None:
        allow_nan = fmt.has_nan
    if allow_negative is None:
        allow_negative = fmt.signed or fmt.has_nan
    for name, flag in (("allow_nan", allow_nan), ("allow_infinity", allow_infinity),
                       ("allow_negative", allow_negative)):
        _check_bool(name, flag)
    grid = _Grid(fmt)
    width = np.dtype(dtype).itemsize * 8
    finfo = np.finfo(dtype)
    signs = 2 if allow_negative else 1
    edges = grid.edge_positions()

    def finish(x, negative):
        x = dtype(abs(x)) if not allow_negative else dtype(x)  # 1 ulp below 0 is negative
        if not allow_infinity and math.isinf(x):
            x = dtype(math.copysign(finfo.max, x))
        return dtype(-x) if negative else x

    def near(point_of):
        """(position, ulp offset, sign): positions shrink to 1.0 (see _positions), the offset to 0."""
        return st.tuples(_positions(grid, 0, grid.hi, False), st.sampled_from([0, -1, 1]), st.booleans()
                         if allow_negative else st.just(False)).map(
            lambda p: finish(_step(_to_dtype(point_of(p[0]), dtype), p[1], dtype), p[2]))

    def near_edges(point_of):
        def build(i):
            i, negative = divmod(i, signs)
            j, offset = divmod(i, 3)
            return finish(_step(_to_dtype(point_of(edges[j]), dtype), (0, -1, 1)[offset], dtype), negative)
        return st.integers(0, len(edges) * 3 * signs - 1).map(build)

    def midpoint(s):
        s = min(s, grid.hi - 1)
        if s < 0:  # a format with a single value
            return Fraction(grid.value(0))
        return (Fraction(grid.value(s)) + Fraction(grid.value(s + 1))) / 2

    def value(s):
        return Fraction(grid.value(s))

    top = fmt.max
    above = top + exact.quantum(fmt, top)
    overflow = []
    for point in (top, (top + above) / 2, above, 2 * top):
        for offset in (0, -1, 1):
            x = _step(_to_dtype(point, dtype), offset, dtype)
            overflow += [finish(x, False)] + ([finish(x, True)] if allow_negative else [])
    overflow += [finish(finfo.max, False)] + ([finish(finfo.max, True)] if allow_negative else [])
    if allow_infinity:
        overflow += [dtype(math.inf)] + ([dtype(-math.inf)] if allow_negative else [])
    if allow_nan:
        overflow.append(dtype(math.nan))
    tiny_top = float(_to_dtype(fmt.min_normal, dtype))
    tiny = st.floats(-tiny_top if allow_negative else 0.0, tiny_top, width=width).map(dtype)
    ordinary = st.floats(width=width, allow_nan=allow_nan, allow_infinity=allow_infinity).map(
        lambda x: dtype(x) if allow_negative else dtype(abs(x)))
    # Branch order is shrink order: near 1.0 first, the edges and the special values last.
    inputs = st.one_of(near(value), near(midpoint), near_edges(value), near_edges(midpoint), tiny,
                       st.sampled_from(overflow), ordinary)
    if not fmt.zero and not fmt.has_nan:  # zero has no value there; the smallest one stands in
        inputs = inputs.map(lambda x: x if x != 0 else dtype(_to_dtype(fmt.min_subnormal, dtype)))
    return inputs


# -------------------------------------------------------------- arrays
def arrays(fmt, shape=None, *, dtype=None, elements=None, **value_options):
    """Numpy arrays of values of `fmt` (hypothesis.extra.numpy.arrays with `values` as elements).

    shape: an int, a tuple or a strategy of shapes; default: 1 to 2
        dimensions of 1 to 8 elements.
    dtype: float32 when it holds every value of fmt, else float64 (default);
        float16, longdouble or an ml_dtypes float dtype (e.g.
        ``ml_dtypes.float8_e4m3fn``) are built in float64 and cast. A dtype
        that cannot hold every value the options allow (NaN, Inf, negative
        or subnormal values, the range or precision of fmt) is refused with
        InvalidArgument, as is any dtype that is not a float type.
    elements: another strategy for the elements, e.g.
        ``rounding_inputs(fmt, np.float32)`` with ``dtype=np.float32``; its
        values must fit `dtype`.
    value_options: passed to `values` (allow_nan, allow_infinity,
        allow_subnormal, allow_negative, min_value, max_value).
    """
    fmt = get_format(fmt)
    if shape is None:
        shape = hnp.array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=8)
    default = np.dtype(np.float32 if PRESETS["fp32"].contains(fmt) else np.float64)
    if elements is not None and value_options:
        raise InvalidArgument(f"give elements or value options ({', '.join(value_options)}), not both")
    target = default if dtype is None else _float_dtype(dtype, default)
    if elements is None:
        elements = values(fmt, **value_options)
        if dtype is not None:
            _check_holds(target, fmt, default, value_options)
    if target in (np.dtype(np.float32), np.dtype(np.float64)):
        return hnp.arrays(target, shape, elements=elements)
    return hnp.arrays(np.float64, shape, elements=elements).map(lambda a: a.astype(target))


def _float_dtype(dtype, default: np.dtype) -> np.dtype:
    """dtype as a numpy dtype, if it is a float type (numpy's or ml_dtypes'); InvalidArgument if not."""
    try:
        target = np.dtype(dtype)
    except TypeError:
        raise InvalidArgument(f"dtype={dtype!r} is not a numpy dtype; use {default} (the default), float64 "
                              f"or an ml_dtypes float type that holds the format's values") from None
    if target.kind != "f":
        try:
            get_format(target)  # the ml_dtypes float types (numpy kind "V")
        except (TypeError, ValueError):
            raise InvalidArgument(f"dtype={target} is not a floating-point dtype; use {default} (the default), "
                                  f"float64 or an ml_dtypes float type that holds the format's values") from None
    return target


def _check_holds(target: np.dtype, fmt: Format, default: np.dtype, value_options: dict) -> None:
    """InvalidArgument unless `target` holds every value that values(fmt, **value_options) draws.

    Membership is the dtype's own round trip (numpy's or ml_dtypes' cast from float64), on the
    specials and on `_witnesses`: a dtype that holds two neighbouring values of a binade holds
    their spacing, hence the whole binade between the ends."""
    options = dict(allow_nan=None, allow_infinity=None, allow_subnormal=True, allow_negative=True,
                   min_value=None, max_value=None)
    options.update(value_options)
    grid, lo, hi, edges = _value_plan(fmt, **options)
    wanted = np.array(edges + _witnesses(grid, lo, hi), dtype=np.float64)
    with np.errstate(all="ignore"):
        back = wanted.astype(target).astype(np.float64)
        held = ((back == wanted) & (np.signbit(back) == np.signbit(wanted))) | (np.isnan(back) & np.isnan(wanted))
    if held.all():
        return
    v = float(wanted[np.argmin(held)])
    if math.isnan(v):
        leave_out = "allow_nan=False"
    elif math.isinf(v):
        leave_out = "allow_infinity=False"
    elif math.copysign(1.0, v) < 0 and not np.signbit(np.array(v).astype(target)):
        leave_out = "allow_negative=False"
    elif 0 < abs(v) < fmt.min_normal:
        leave_out = "allow_subnormal=False"
    else:
        leave_out = "min_value or max_value"
    raise InvalidArgument(f"dtype={target} cannot hold every value of {fmt.name} that these options allow: "
                          f"{v!r} is not a {target} value; use {default} (the default for {fmt.name}), "
                          f"or leave such values out ({leave_out})")


# ----------------------------------------------------------- dot problems
class DotProblem(NamedTuple):
    """Inputs of one dot-product test: d = sum_k a[..., k] * b[..., k] + c[...].

    a, b: float64 arrays of shape batch + (k,) holding values of the inputs
    format; c: float64 array of shape batch holding values of the output
    format. Unpacks as ``a, b, c = problem``.
    """

    a: np.ndarray
    b: np.ndarray
    c: np.ndarray

    def exact(self):
        """The exact d (Fractions): a Fraction when batch is (), else an object array of Fractions."""
        a = self.a.reshape(-1, self.a.shape[-1])
        b = self.b.reshape(a.shape)
        c = self.c.reshape(-1)
        sums = [sum((Fraction(float(x)) * Fraction(float(y)) for x, y in zip(ra, rb)), Fraction(float(rc)))
                for ra, rb, rc in zip(a, b, c)]
        if self.c.ndim == 0:
            return sums[0]
        out = np.empty(len(sums), dtype=object)
        out[:] = sums
        return out.reshape(self.c.shape)


DOT_KINDS = ("random", "cancellation", "spread", "tiny")
"""How dot_problems builds a and b: "random", independent values; "cancellation", pairs of
products that cancel exactly (a[j] = -a[i], b[j] = b[i], the partner in the mirrored
position) around one or two residual terms; "spread", exponents from both ends of the
range; "tiny", tiny and subnormal inputs, whose products underflow or land near the
output's subnormal range."""


def _signed(strategy, signed: bool):
    if not signed:
        return strategy
    return st.tuples(strategy, st.booleans()).map(lambda p: -p[0] if p[1] else p[0])


def _term_strategies(fin: Format, allow_subnormal: bool) -> dict:
    """Strategies of (a_k, b_k) pairs, by kind."""
    finite = dict(allow_nan=False, allow_infinity=False)
    any_value = values(fin, allow_subnormal=allow_subnormal, **finite)
    top = _signed(values(fin, allow_negative=False, min_value=fin.max / 2, **finite), fin.signed)
    tiny = _signed(values(fin, allow_negative=False, allow_subnormal=allow_subnormal,
                          max_value=2 * fin.min_normal, **finite), fin.signed)
    mixed = st.one_of(any_value, top, tiny)
    return {
        "random": st.tuples(any_value, any_value),
        "spread": st.tuples(mixed, mixed),
        "tiny": st.tuples(st.one_of(tiny, any_value), tiny),
        "residual": st.tuples(st.one_of(tiny, any_value), any_value),
    }


def dot_problems(inputs_format, k=None, *, output_format="fp32", batch=(), kinds=DOT_KINDS,
                 allow_subnormal: bool = True):
    """(a, b, c) for dot-product tests, as a `DotProblem` (a NamedTuple; ``a, b, c = problem``).

    inputs_format: the format of a and b; output_format: the format of c
        (the accumulator's, "fp32" by default).
    k: the length of the dot product: an int, a strategy of ints, or None
        (default) for 1 to 64, which then shrinks towards short problems.
    batch: leading shape of a, b and c, an int or a tuple of nonnegative ints
        (default (): a, b of shape (k,), c 0-d).
    kinds: which of DOT_KINDS to draw: "random", "cancellation" (products
        that cancel exactly around small terms), "spread" (exponents from
        both ends of the range), "tiny" (tiny and subnormal inputs, so that
        products underflow or fall near the output's subnormal range). c is
        0, any finite value of the output format, or the negated sum of the
        products rounded to the output format (cancellation against c).
    allow_subnormal: False keeps subnormal inputs out of a and b.

    Values are finite; `DotProblem.exact()` gives the exact result as Fractions.
    """
    fin, fout = get_format(inputs_format), get_format(output_format)
    if not (k is None or isinstance(k, st.SearchStrategy) or (_is_int(k) and k >= 1)):
        raise InvalidArgument(f"k must be a positive int, a strategy or None, got {k!r}")
    if _is_int(k):
        k = int(k)
    _check_bool("allow_subnormal", allow_subnormal)
    kinds = tuple(kinds)
    if not kinds or any(kd not in DOT_KINDS for kd in kinds):
        raise InvalidArgument(f"kinds must be a non-empty subset of {DOT_KINDS}, got {kinds!r}")
    if "cancellation" in kinds and not fin.signed:
        kinds = tuple(kd for kd in kinds if kd != "cancellation") or ("random",)
    shape = (batch,) if _is_int(batch) else batch
    try:
        shape = tuple(shape)
    except TypeError:
        shape = None
    if shape is None or not all(_is_int(n) and n >= 0 for n in shape):
        raise InvalidArgument(f"batch must be a shape: a tuple of nonnegative ints, got {batch!r}")
    batch = tuple(int(n) for n in shape)
    rows = math.prod(batch)
    terms = _term_strategies(fin, allow_subnormal)
    finite_out = values(fout, allow_nan=False, allow_infinity=False)

    @st.composite
    def row(draw, kind, K):
        if K is None:
            sizes = dict(min_size=1, max_size=64)
        else:
            sizes = dict(min_size=K, max_size=K)
        if kind == "cancellation":
            if K is None:
                pairs = draw(st.lists(terms["random"], min_size=0, max_size=31))
                residual = draw(st.lists(terms["residual"], min_size=1, max_size=2))
            else:
                pairs = draw(st.lists(terms["random"], min_size=(K - 1) // 2, max_size=(K - 1) // 2))
                residual = draw(st.lists(terms["residual"], min_size=K - 2 * len(pairs),
                                         max_size=K - 2 * len(pairs)))
            mirrored = [(-x, y) for x, y in reversed(pairs)]
            both = pairs + residual + mirrored
            turn = draw(st.integers(0, len(both) - 1))
            both = both[turn:] + both[:turn]
        else:
            both = draw(st.lists(terms[kind], **sizes))
        a = [x for x, _ in both]
        b = [y for _, y in both]
        total = sum((Fraction(x) * Fraction(y) for x, y in both), Fraction(0))
        c_kind = draw(st.sampled_from(["zero", "value", "cancel"]))
        if c_kind == "zero":
            c = 0.0
        elif c_kind == "value":
            c = draw(finite_out)
        else:  # c cancels the products' sum, up to its rounding into the output format
            c = exact.round_value(-total, fout, "nearest_even")
            if not math.isfinite(c):
                c = 0.0
        return a, b, c

    @st.composite
    def build(draw):
        K = draw(k) if isinstance(k, st.SearchStrategy) else k
        if K is not None and (isinstance(K, bool) or not isinstance(K, (int, np.integer)) or K < 1):
            raise InvalidArgument(f"the k strategy drew {K!r}; it must draw positive ints")
        if K is None and rows != 1:  # one length for every row
            K = draw(st.integers(1, 64))
        kind = draw(st.sampled_from(kinds))
        got = [draw(row(kind, K)) for _ in range(rows)]
        size = len(got[0][0]) if got else K
        a = np.array([g[0] for g in got], dtype=np.float64).reshape(batch + (size,))
        b = np.array([g[1] for g in got], dtype=np.float64).reshape(batch + (size,))
        c = np.array([g[2] for g in got], dtype=np.float64).reshape(batch)
        return DotProblem(a, b, c)

    return build()


# ------------------------------------------------------------ block arrays
def block_arrays(block_format, shape=None, *, dtype=np.float32, allow_nan: bool = True,
                 allow_infinity: bool = True, exponents=None):
    """Arrays where block quantisation (`fpsim.BlockFormat`, or a preset name) is delicate.

    One exponent B is drawn per array (from `exponents`, default: 0, ±1, ±8,
    ±40 and the ends of float32's range, then any); each element is then, in
    shrink order: a grid point or midpoint of the element format (one more
    mantissa bit) times 2^B, 2^(B - 1) or 2^(B - 5) (so a block's elements
    sit on ties of its scale when its amax is in the top binade); the block
    amax edges max_elem * 2^B and 2^(B + emax_elem + 1) (the binade where the
    OCP rule saturates and a round-up rule moves) exactly or 1 ulp of
    `dtype` away; zero; tiny values 2^(B - 40); NaN and ±Inf when allowed
    (otherwise values beyond `dtype`'s range become its max).

    shape: default: 1 or 2 dimensions whose blocked axes hold 1 element, a
    block, a block and a bit, or two and a half blocks (partial blocks).
    Values are rounded to `dtype` (float32 or float64).
    """
    from .blocks import format as get_block_format  # the format's facts only, never its engine

    fmt = get_block_format(block_format)
    dtype = _check_dtype(dtype)
    _check_bool("allow_nan", allow_nan)
    _check_bool("allow_infinity", allow_infinity)
    finer = fmt.element_format
    finer = Format(finer.exp_bits, finer.man_bits + 1, finer.bias, finer.signed, finer.infinities,
                   "none" if finer.nan == "fn" else finer.nan, finer.subnormals, finer.zero)
    points = sorted({abs(v) for v in exact.all_values(finer)} if finer.bits <= 16 else {1.0})
    elem_max = float(fmt.element_max)
    top_binade = 2.0 ** (fmt.emax_elem + 1)
    low, high = (-149, 127) if dtype is np.float32 else (-1074, 1023)
    if exponents is None:
        exponents = st.one_of(st.sampled_from([0, 1, -1, 8, -8, 40, -40, -126, -133, 100, 120, 126]),
                              st.integers(low + 10, high - 10))
    if shape is None:
        dims = len(fmt.block_shape)
        side = [st.sampled_from(sorted({1, b, b + 1, max(b - 1, 1), 2 * b + b // 2})) for b in fmt.block_shape]
        lead = st.lists(st.integers(1, 3), min_size=0, max_size=1 if dims == 1 else 0)
        shape = st.tuples(lead, st.tuples(*side)).map(lambda p: tuple(p[0]) + p[1])

    biggest = float(np.finfo(dtype).max)

    def scaled(value, e):
        with np.errstate(over="ignore", under="ignore"):
            v = float(dtype(math.ldexp(value, e) if -1100 < e < 1100 else (0.0 if e < 0 else math.inf)))
        return v if allow_infinity or not math.isinf(v) else biggest

    @st.composite
    def build(draw):
        B = draw(exponents)
        shp = draw(shape) if isinstance(shape, st.SearchStrategy) else tuple(shape)
        edges = []
        for v in (elem_max, top_binade):
            x = dtype(scaled(v, B))
            with np.errstate(over="ignore"):
                above = float(np.nextafter(x, dtype(np.inf)))
            edges += [float(x), float(np.nextafter(x, dtype(0))), scaled(above, 0)]
        specials = [0.0, -0.0, scaled(1.0, B - 40)]
        if allow_nan:
            specials.append(math.nan)
        if allow_infinity:
            specials += [math.inf, -math.inf]
        magnitude = st.one_of(
            st.tuples(st.sampled_from(points), st.sampled_from([0, -1, -5])).map(lambda p: scaled(p[0], B + p[1])),
            st.sampled_from(edges), st.sampled_from(specials))
        element = st.tuples(magnitude, st.booleans()).map(lambda p: -p[0] if p[1] else p[0])
        return draw(hnp.arrays(np.float64, shp, elements=element)).astype(dtype)

    return build()
