"""Shared helpers for the fpsim foundation tests (imported by name: a conftest module of that
name would clash with tests/analyze/conftest.py).

Expected values in these tests come from independent sources only: the
Fraction oracle `fpsim.exact` (which never calls the engine), ml_dtypes,
torch, numpy's own casts, Python's float(), and hand formulas from the
OCP FP8 / OCP MX specifications. The helpers here only compare and build
inputs; none of them calls the code under test.
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache

import numpy as np
import pytest
from hypothesis import assume
from hypothesis import strategies as st

from fpsim import exact
from fpsim.formats import NAN_ENCODINGS, PRESETS, Format

try:
    import torch
except ImportError:  # pragma: no cover - torch is a dependency of fpsim
    torch = None


requires_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

# ------------------------------------------------------------------ formats
PRESET_NAMES = list(PRESETS)
SMALL_PRESETS = [name for name, f in PRESETS.items() if f.bits <= 16]   # enumerable: every code
BYTE_PRESETS = [name for name, f in PRESETS.items() if f.bits <= 8]     # fp8, fp6, fp4, e8m0

# Custom layouts that exercise each rule of the encoding on its own.
CUSTOM_FORMATS = {
    "e4m3fn_nosub": Format(4, 3, nan="fn", subnormals=False),
    "e4m3fn_unsigned": Format(4, 3, signed=False, nan="fn"),
    "e4m3_unsigned_nonan": Format(4, 3, signed=False, nan="none"),
    "e3m4fnuz_b2": Format(3, 4, bias=2, nan="fnuz"),
    "e5m2_nonan_nosub": Format(5, 2, nan="none", subnormals=False),
    "e4m0fn": Format(4, 0, nan="fn", subnormals=False),
    "e3m0_unsigned_nozero": Format(3, 0, signed=False, nan="none", subnormals=False, zero=False),
    "e1m3_nonan": Format(1, 3, nan="none"),
    "e2m2_ieee_b0": Format(2, 2, bias=0),
    "e6m9_ieee": Format(6, 9),
    "e5m10_fnuz": Format(5, 10, nan="fnuz"),
    "e8m7_unsigned_nozero": Format(8, 7, signed=False, nan="none", subnormals=False, zero=False),
    "e11m4_ieee": Format(11, 4),  # float64's exponent range in 16 bits
}


def fmt_id(fmt) -> str:
    """A readable test id: the preset name, or the CUSTOM_FORMATS key (default names can coincide)."""
    if isinstance(fmt, str):
        return fmt
    for key, custom in CUSTOM_FORMATS.items():
        if custom is fmt:
            return key
    return fmt.name


@lru_cache(maxsize=None)
def oracle_decoded(fmt: Format) -> np.ndarray:
    """exact.decode_code of every code of a format of <= 16 bits, as float64 (computed once per session)."""
    return np.array([exact.decode_code(c, fmt) for c in range(1 << fmt.bits)], dtype=np.float64)


@lru_cache(maxsize=None)
def oracle_finite_values(fmt: Format) -> tuple:
    """The distinct finite values (zero once, as +0) ascending, from the oracle's decoder."""
    v = oracle_decoded(fmt)
    return tuple(float(x) + 0.0 for x in np.unique(v[np.isfinite(v)]))


# --------------------------------------------------------------- comparison
def as_float64(x) -> np.ndarray:
    """Values of a numpy array, numpy/Python scalar or torch tensor as a float64 numpy array (exact)."""
    if torch is not None and isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        if x.dtype != torch.float64:
            x = x.to(torch.float32)  # every format below fp64 fits float32 exactly, NaN sign kept
        x = x.numpy()
    arr = np.asarray(x)
    if arr.dtype.kind == "f" and arr.dtype.itemsize in (2, 4, 8):
        return arr.astype(np.float64)
    return arr.astype(np.float32).astype(np.float64)  # ml_dtypes: through float32, exact


def assert_same_bits(actual, expected, *, nan_sign: bool = True, inputs=None, what: str = "") -> None:
    """Bit-exact comparison of values: NaN == NaN (same sign when `nan_sign`), +0 != -0.

    Both sides are compared as float64, which holds every value of every
    format exactly, so this checks every bit of the value (NaN payloads
    apart, which fpsim does not preserve by design).
    """
    a = as_float64(actual)
    e = as_float64(expected)
    assert a.shape == e.shape, f"{what}shape {a.shape} != expected {e.shape}"
    a_nan, e_nan = np.isnan(a), np.isnan(e)
    bad = a_nan != e_nan
    both = ~a_nan & ~e_nan
    bad |= both & ((a != e) | (np.signbit(a) != np.signbit(e)))
    if nan_sign:
        bad |= a_nan & e_nan & (np.signbit(a) != np.signbit(e))
    if bad.any():
        idx = np.argwhere(bad)[:8]
        lines = []
        for i in idx:
            i = tuple(i)
            src = ""
            if inputs is not None:
                src = f"input {as_float64(inputs)[i]!r} ({float(as_float64(inputs)[i]).hex()}): "
            lines.append(f"  at {i}: {src}got {a[i]!r}, expected {e[i]!r}")
        raise AssertionError(f"{what}{int(bad.sum())} of {bad.size} values differ:\n" + "\n".join(lines))


def assert_same_codes(actual, expected, *, what: str = "") -> None:
    a = np.asarray(actual.cpu().numpy() if torch is not None and isinstance(actual, torch.Tensor) else actual)
    e = np.asarray(expected)
    assert a.shape == e.shape, f"{what}shape {a.shape} != {e.shape}"
    bad = a.astype(np.uint64) != e.astype(np.uint64)
    if bad.any():
        idx = np.argwhere(bad)[:8]
        lines = [f"  at {tuple(i)}: got {int(a[tuple(i)]):#x}, expected {int(e[tuple(i)]):#x}" for i in idx]
        raise AssertionError(f"{what}{int(bad.sum())} of {bad.size} codes differ:\n" + "\n".join(lines))


# ------------------------------------------------------------------ oracle
def oracle(values, fmt, rounding="nearest_even", saturate=False, **kw) -> np.ndarray:
    """exact.round_value applied to each element (taken as its exact float value)."""
    flat = as_float64(values).ravel()
    out = np.array([exact.round_value(float(v), fmt, rounding, saturate, **kw) for v in flat], dtype=np.float64)
    return out.reshape(np.shape(as_float64(values)))


# ---------------------------------------------------------- input builders
def next_up(x: np.ndarray, steps: int = 1) -> np.ndarray:
    with np.errstate(over="ignore"):
        for _ in range(steps):
            x = np.nextafter(x, np.array(np.inf, dtype=x.dtype))
    return x


def next_down(x: np.ndarray, steps: int = 1) -> np.ndarray:
    with np.errstate(over="ignore"):
        for _ in range(steps):
            x = np.nextafter(x, np.array(-np.inf, dtype=x.dtype))
    return x


def grid_step_above(fmt: Format) -> float:
    """The grid point just above max with an unbounded exponent (where overflow would round to);
    Inf when that is beyond float64."""
    try:
        return float(fmt.max + exact.quantum(fmt, fmt.max))
    except OverflowError:
        return math.inf


def sweep_points(fmt: Format, dtype, ulps=(1, 2)) -> np.ndarray:
    """Dense inputs around every representable value of a <= 16-bit format, in `dtype`.

    Every value, every midpoint between neighbours, and both of those +-k ulps
    of `dtype` for k in `ulps`; the overflow boundary (max, the midpoint to the next
    grid point above max, +-ulps, beyond); half the smallest subnormal; signed
    zeros, +-Inf, NaN. Midpoints are exact in float32 and float64 for these
    formats, so the +-ulp points sit on both sides of every tie.
    """
    finite = oracle_finite_values(fmt)
    values = sorted(set(finite) | {-v for v in finite}) if fmt.signed else list(finite)
    pts = list(values)
    pts += [(a + b) / 2 for a, b in zip(values[:-1], values[1:])]
    big, above = float(fmt.max), grid_step_above(fmt)
    edge = [big, big / 2 + above / 2, above, 2 * above, 1e30, float(fmt.min_subnormal) / 2,
            float(fmt.min_subnormal) / 4, float(fmt.min_normal) / 2 * 3]
    pts += edge + [-p for p in edge]
    with np.errstate(over="ignore"):
        base = np.array(pts, dtype=np.float64).astype(dtype)
    finfo = np.finfo(dtype)
    base = base[np.isfinite(base)]
    out = [base]
    for k in ulps:
        out += [next_up(base, k), next_down(base, k)]
    out.append(np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, finfo.smallest_subnormal,
                         -finfo.smallest_subnormal, finfo.max, -finfo.max, finfo.tiny, -finfo.tiny], dtype=dtype))
    return np.concatenate(out)


def random_inputs(n: int, dtype, seed: int) -> np.ndarray:
    """Random inputs at many scales: normal draws times 2^k for k in a wide range, plus raw bit patterns."""
    rng = np.random.default_rng(seed)
    scales = np.ldexp(1.0, rng.integers(-140, 130, size=n))
    values = rng.standard_normal(n) * scales
    with np.errstate(over="ignore"):
        values = values.astype(dtype)
    width = np.dtype(dtype).itemsize * 8
    raw = rng.integers(0, 2**width, size=n // 8, dtype=np.uint64).astype(f"uint{width}").view(dtype)
    return np.concatenate([values, raw])


# ------------------------------------------------ the stochastic-rounding stream
def reference_philox(counter, key):
    """Philox4x32-10 on Python ints, from Salmon et al. (SC'11), independent of fpsim.philox: ten rounds of two 32x32->64 multiplications
    (constants 0xD2511F53, 0xCD9E8D57), the key bumped by 0x9E3779B9, 0xBB67AE85 between rounds."""
    x0, x1, x2, x3 = counter
    k0, k1 = key
    for _ in range(10):
        p0, p1 = 0xD2511F53 * x0, 0xCD9E8D57 * x2
        x0, x1, x2, x3 = (p1 >> 32) ^ x1 ^ k0, p1 & 0xFFFFFFFF, (p0 >> 32) ^ x3 ^ k1, p0 & 0xFFFFFFFF
        k0, k1 = (k0 + 0x9E3779B9) & 0xFFFFFFFF, (k1 + 0xBB67AE85) & 0xFFFFFFFF
    return x0, x1, x2, x3


def reference_word(key: int, index: int, depth: int) -> int:
    """word(index, depth) of the stream, as philox.py documents it."""
    block = index >> 2
    out = reference_philox((block & 0xFFFFFFFF, block >> 32, depth, 0), (key & 0xFFFFFFFF, key >> 32))
    return out[index & 3]


def reference_fraction(key: int, index: int, words: int) -> Fraction:
    """U of element `index` to `words` 32-bit words (exact), as the oracle's random_fraction."""
    return sum(Fraction(reference_word(key, index, j), 2 ** (32 * (j + 1))) for j in range(words))


# ---------------------------------------------------- hypothesis strategies

@st.composite
def custom_formats(draw) -> Format:
    """Random valid Format objects: any NaN encoding, signedness, zero/subnormal rules, bias and widths
    up to binary64's (exp_bits 1..11, man_bits 0..52)."""
    nan = draw(st.sampled_from(NAN_ENCODINGS))
    exp_bits = draw(st.integers(2 if nan == "ieee" else 1, 11))
    man_bits = draw(st.one_of(st.integers(1 if nan == "ieee" else 0, 10), st.integers(11, 52)))
    signed = True if nan == "fnuz" else draw(st.booleans())
    zero = True if nan == "fnuz" else draw(st.booleans())
    subnormals = zero and man_bits > 0 and draw(st.booleans())
    default_bias = (1 << (exp_bits - 1)) - 1
    bias = draw(st.one_of(st.just(default_bias), st.integers(default_bias - 4, default_bias + 4),
                          st.integers(-1100, 1100)))
    try:
        fmt = Format(exp_bits, man_bits, bias=bias, signed=signed, nan=nan, subnormals=subnormals, zero=zero)
    except ValueError:  # a layout beyond binary64's range or finer than its grid (test_formats.py)
        assume(False)
    return fmt


preset_formats = st.sampled_from([PRESETS[n] for n in PRESET_NAMES])
any_formats = st.one_of(preset_formats, custom_formats())


def _fraction_to(dtype, v) -> float:
    """The float of `dtype` nearest to the Fraction/float v (ties to even), as a numpy scalar."""
    try:
        f = float(v)
    except OverflowError:  # beyond float64's rounding threshold
        f = math.inf if v > 0 else -math.inf
    with np.errstate(over="ignore"):
        return np.asarray(f).astype(dtype)[()]


@st.composite
def format_inputs(draw, fmt: Format, dtype) -> np.ndarray:
    """Inputs of `dtype` biased towards where rounding is delicate for `fmt`: its values, the ties
    between them, their neighbours +-1..2 ulps of `dtype`, the range edges (min_subnormal/2,
    min_subnormal, min_normal, max, the overflow threshold, the next grid point above max),
    plus arbitrary floats (Inf, NaN and subnormals included)."""
    M = fmt.man_bits
    top = fmt.max
    above = top + exact.quantum(fmt, top)
    edges = [fmt.min_subnormal / 2, fmt.min_subnormal, fmt.min_normal, fmt.min_normal - fmt.min_subnormal,
             (fmt.min_normal + fmt.min_subnormal) / 2 if fmt.subnormals else fmt.min_normal / 2,
             top, (top + above) / 2, above, top * 2]
    n = draw(st.integers(1, 12))
    out = []
    for _ in range(n):
        kind = draw(st.sampled_from(["value", "tie", "tie", "edge", "random"]))
        if kind == "random":
            x = draw(st.floats(width=32 if dtype == np.float32 else 64))
            out.append(np.asarray(x, dtype=dtype)[()])
            continue
        if kind == "edge":
            v = draw(st.sampled_from(edges))
        else:
            e = draw(st.integers(fmt.emin - (M if fmt.subnormals else 0), fmt.emax))
            q = Fraction(2) ** (max(e, fmt.emin) - M)
            lo_sig = (Fraction(2) ** e / q) if e >= fmt.emin else Fraction(1)
            hi_sig = 2 * lo_sig if e >= fmt.emin else Fraction(2) ** (e - (fmt.emin - M) + 1)
            sig = draw(st.integers(int(lo_sig), max(int(lo_sig), int(hi_sig) - 1)))
            v = sig * q + (q / 2 if kind == "tie" else 0)
        x = _fraction_to(dtype, v)
        steps = draw(st.integers(-2, 2))
        if steps > 0:
            x = next_up(np.asarray(x), steps)[()]
        elif steps < 0:
            x = next_down(np.asarray(x), -steps)[()]
        if draw(st.booleans()):
            x = -x
        out.append(x)
    return np.array(out, dtype=dtype)


def codable(x, fmt: Format, flush_inputs: bool = False) -> np.ndarray:
    """Which inputs have a value in `fmt` at all (the rest quantize and encode refuse): for a format
    without NaN, no NaN, no negative nonzero value if it is unsigned (after flushing: a tiny negative
    flushes to -0, which it takes as +0) and no zero if it has none. From the format's definition."""
    x = np.asarray(x, dtype=np.float64)
    keep = np.ones(x.shape, dtype=bool)
    if fmt.has_nan:
        return keep
    keep &= ~np.isnan(x)
    if not fmt.signed:
        negative = x < 0
        if flush_inputs and fmt.zero:
            negative &= ~(np.abs(x) < float(fmt.min_normal))
        keep &= ~negative
    if not fmt.zero:
        keep &= x != 0
    return keep


def expected_nan_sign(fmt: Format, negative_input):
    """The documented sign of every NaN quantize returns: the input's for signed formats,
    negative for fnuz (its NaN is the negative-zero code), positive for unsigned formats."""
    if fmt.nan == "fnuz":
        return np.ones_like(negative_input, dtype=bool)
    if not fmt.signed:
        return np.zeros_like(negative_input, dtype=bool)
    return np.asarray(negative_input, dtype=bool)
