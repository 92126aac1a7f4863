"""fpsim.strategies: what the strategies draw, that they reach the places where formats break,
and that failures shrink to small, readable examples.

Representability is checked with the Fraction oracle (fpsim.exact), never with the engine, and
whether a dtype holds a format's values with ml_dtypes' (numpy's) own decoding of every code and
cast round trips. Bounds are checked against hypothesis' own st.floats.
Reachability uses hypothesis.find: it fails (NoSuchExample) when a strategy never produces
the input in question.
"""

from __future__ import annotations

import itertools
import math
import subprocess
from decimal import Decimal
from random import Random
import sys
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument, NoSuchExample

import fpsim
import fpsim.strategies as fps
from fpsim import exact
from fpsim.formats import NAN_ENCODINGS, PRESETS, Format

FIND = settings(database=None, max_examples=1000, suppress_health_check=list(HealthCheck))
EVER = settings(FIND, derandomize=True, phases=[Phase.generate])  # deterministic: no flaky searches
DRAW = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def ever(strategy, condition, max_examples: int = 1000):
    """Assert that `strategy` draws an example satisfying `condition` (generation only, no shrinking)."""
    seen = []

    class Found(Exception):
        pass

    @settings(EVER, max_examples=max_examples)
    @given(strategy)
    def search(example):
        if condition(example):
            seen.append(example)
            raise Found

    try:
        search()
    except Found:
        return seen[0]
    raise AssertionError(f"{strategy!r} never drew an example satisfying {condition}")


def reachable(strategy, condition, seed: int = 0, max_examples: int = 1000):
    """The shrunk example of `strategy` satisfying `condition`; NoSuchExample when none is found.
    Seeded, so that the shrunk example is the same on every run."""
    return find(strategy, condition, settings=settings(FIND, max_examples=max_examples), random=Random(seed))


def is_value_of(v: float, fmt: Format) -> bool:
    """v is exactly a value of fmt (NaN and Inf by the format's rules), from the oracle."""
    if math.isnan(v):
        return fmt.has_nan
    if math.isinf(v):
        return fmt.infinities and (fmt.signed or v > 0)
    try:
        exact.encode_value(v, fmt)
        return True
    except ValueError:
        return False


def is_negative_zero(v) -> bool:
    return v == 0 and math.copysign(1.0, v) < 0


# ----------------------------------------------------------------- import
def test_fpsim_imports_without_hypothesis_and_strategies_says_how_to_install():
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'hypothesis' or name.startswith('hypothesis.'):\n"
        "            raise ImportError('blocked for the test')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import fpsim, fpsim.testing\n"
        "assert 'hypothesis' not in sys.modules\n"
        "try:\n"
        "    import fpsim.strategies\n"
        "except ImportError as e:\n"
        "    print('IMPORTERROR', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "IMPORTERROR" in out.stdout and "pip install hypothesis" in out.stdout, out.stdout


def test_strategies_are_not_exported_by_fpsim():
    assert not hasattr(fpsim, "strategies") or "strategies" not in fpsim.__all__


# ---------------------------------------------------------------- formats
@DRAW
@given(fps.formats())
def test_formats_are_valid_formats(fmt):
    assert isinstance(fmt, Format)
    assert Format(fmt.exp_bits, fmt.man_bits, fmt.bias, fmt.signed, fmt.infinities, fmt.nan, fmt.subnormals,
                  fmt.zero) is not None
    if fmt.name not in PRESETS:
        assert 2 <= fmt.exp_bits <= 8 and 0 <= fmt.man_bits <= 10
        assert abs(fmt.bias - ((1 << (fmt.exp_bits - 1)) - 1)) <= 4


@pytest.mark.parametrize("condition", [
    *[pytest.param(lambda f, n=n: f.nan == n and f.name not in PRESETS, id=f"nan={n}") for n in NAN_ENCODINGS],
    pytest.param(lambda f: f.exp_bits == 2 and f.name not in PRESETS, id="exp_bits=2"),
    pytest.param(lambda f: f.exp_bits == 8 and f.man_bits == 10, id="e8m10"),
    pytest.param(lambda f: f.man_bits == 0 and f.name not in PRESETS, id="man_bits=0"),
    pytest.param(lambda f: not f.subnormals and f.zero and f.name not in PRESETS, id="no subnormals"),
    pytest.param(lambda f: not f.signed and f.name not in PRESETS, id="unsigned"),
    pytest.param(lambda f: not f.zero and f.name not in PRESETS, id="no zero"),
    pytest.param(lambda f: f.bias == (1 << (f.exp_bits - 1)) - 1 - 4, id="bias -4"),
    pytest.param(lambda f: f.bias == (1 << (f.exp_bits - 1)) - 1 + 4, id="bias +4"),
    *[pytest.param(lambda f, n=n: f.name == n, id=f"preset {n}") for n in PRESETS],
])
def test_formats_reach_every_kind_of_layout(condition):
    ever(fps.formats(), condition)


def test_formats_options():
    assert reachable(fps.formats(custom=False), lambda f: True).name == "e2m1"  # the smallest preset first
    only = reachable(fps.formats(presets=False, nan=["fnuz"]), lambda f: True)
    assert only.nan == "fnuz" and only.name not in PRESETS
    assert reachable(fps.formats(presets=["bf16"], custom=False), lambda f: True).name == "bf16"
    with pytest.raises(NoSuchExample):
        reachable(fps.formats(max_bits=8), lambda f: f.bits > 8, max_examples=300)
    with pytest.raises(InvalidArgument):
        fps.formats(presets=False, custom=False)
    with pytest.raises(InvalidArgument):
        fps.formats(nan=["signalling"])
    for bad in (dict(exp_bits=(1, 2, 3)), dict(exp_bits=(5, 4)), dict(exp_bits=(0, 4)), dict(exp_bits=(2, 12)),
                dict(man_bits=(0, 53))):
        with pytest.raises(InvalidArgument):
            fps.formats(**bad)
    fmt = ever(fps.formats(presets=False, exp_bits=(np.int64(5), 5), man_bits=(2, np.int8(2)), nan=["ieee"],
                           allow_unsigned=False), lambda f: True)
    assert (fmt.exp_bits, fmt.man_bits, fmt.signed) == (5, 2, True)
    assert ever(fps.formats(presets=False, max_bits=3, nan=["ieee"]), lambda f: True).bits == 3  # unsigned e2m1


@pytest.mark.parametrize("kwargs", [
    dict(bias_offset=-1), dict(bias_offset=1.5), dict(bias_offset=True), dict(exp_bits=5), dict(man_bits=(0.0, 3)),
    dict(man_bits="03"), dict(max_bits=0), dict(max_bits=8.0), dict(allow_unsigned=None), dict(allow_no_zero=1),
    dict(presets=False, exp_bits=(1, 1), nan=["ieee"]), dict(presets=False, man_bits=(0, 0), nan=["ieee"]),
    dict(presets=False, max_bits=2, allow_unsigned=False, nan=["ieee", "fn"]),
], ids=repr)
def test_formats_refuse_bad_arguments_when_created(kwargs):
    """As hypothesis' own strategies (and formats(nan=...) above): InvalidArgument at creation, not an error
    or an endless rejection at draw time."""
    with pytest.raises(InvalidArgument):
        fps.formats(**kwargs)


# ----------------------------------------------------------------- values
@DRAW
@given(fps.formats(), st.data())
def test_values_are_values_of_the_format(fmt, data):
    v = data.draw(fps.values(fmt))
    assert isinstance(v, float)
    assert is_value_of(v, fmt), f"{v!r} is not a value of {fmt}"


@DRAW
@given(fps.formats(), st.data())
def test_values_options_are_respected(fmt, data):
    v = data.draw(fps.values(fmt, allow_nan=False, allow_infinity=False, allow_subnormal=False,
                             allow_negative=False))
    assert math.isfinite(v) and not np.signbit(v)
    assert v == 0 or v >= fmt.min_normal


@DRAW
@given(fps.formats(), st.data())
def test_values_bounds_are_respected(fmt, data):
    lo = data.draw(fps.values(fmt, allow_nan=False, allow_infinity=False))
    hi = data.draw(fps.values(fmt, allow_nan=False, allow_infinity=False, min_value=lo))
    v = data.draw(fps.values(fmt, min_value=lo, max_value=hi))
    assert lo <= v <= hi and is_value_of(v, fmt)


def test_values_bounds_between_grid_points_and_signed_zero_bounds():
    v = reachable(fps.values("e4m3", min_value=1.01, max_value=1.2), lambda v: True)
    assert v == 1.125
    with pytest.raises(InvalidArgument):
        find(fps.values("e4m3", min_value=1.01, max_value=1.1), lambda v: True)
    assert not is_negative_zero(reachable(fps.values("fp16", min_value=0.0, max_value=1.0), lambda v: v == 0))
    assert is_negative_zero(reachable(fps.values("fp16", min_value=-1.0, max_value=-0.0), lambda v: v == 0))
    with pytest.raises(InvalidArgument):
        fps.values("e4m3", allow_infinity=True)
    with pytest.raises(InvalidArgument):
        fps.values("e2m1", allow_nan=True)
    with pytest.raises(InvalidArgument):
        fps.values("e4m3", min_value=2, max_value=1)
    with pytest.raises(InvalidArgument):  # an infinite bound is a bound: no NaN (hypothesis' st.floats refuses it too)
        fps.values("fp16", min_value=-math.inf, allow_nan=True)


def kinds_drawn(strategy, max_examples: int = 200) -> set:
    """Which of finite, inf, -inf and nan a strategy draws (generation only, derandomized)."""
    seen = set()

    @settings(EVER, max_examples=max_examples)
    @given(strategy)
    def collect(v):
        seen.add("nan" if math.isnan(v) else {math.inf: "inf", -math.inf: "-inf"}.get(v, "finite"))

    collect()
    return seen


INF = math.inf
INFINITE_BOUNDS = [
    dict(min_value=-INF), dict(max_value=INF), dict(min_value=-INF, max_value=1.0), dict(min_value=-1.0, max_value=INF),
    dict(min_value=-INF, max_value=INF), dict(min_value=INF), dict(max_value=-INF),
    dict(min_value=-INF, allow_infinity=False), dict(min_value=-INF, max_value=INF, allow_infinity=True),
    dict(min_value=INF, allow_infinity=False), dict(max_value=-INF, allow_infinity=False),
    dict(min_value=-1.0, max_value=1.0, allow_infinity=True),
    dict(min_value=-INF, max_value=INF, allow_nan=False), dict(min_value=-1.0, max_value=-INF),
]


@pytest.mark.parametrize("kwargs", INFINITE_BOUNDS, ids=repr)
def test_values_infinite_bounds_behave_as_hypothesis_floats(kwargs):
    """docs/testing.md: bounds as in hypothesis. -inf and inf are unbounded sides; which of +-Inf, NaN and
    finite values are drawn, and which arguments are refused, is what hypothesis' st.floats does.
    fp16 has infinities and NaN, as float64 does; e4m3 has NaN and no infinities."""
    try:
        st.floats(**kwargs).validate()
    except InvalidArgument:
        for name in ("fp16", "e4m3"):
            with pytest.raises(InvalidArgument):
                fps.values(name, **kwargs)
        return
    want = kinds_drawn(st.floats(**kwargs))
    assert kinds_drawn(fps.values("fp16", **kwargs)) == want
    e4m3 = want - {"inf", "-inf"}
    if e4m3 and not kwargs.get("allow_infinity"):  # allow_infinity=True is refused: e4m3 has no infinities
        assert kinds_drawn(fps.values("e4m3", **kwargs)) == e4m3
    else:
        with pytest.raises(InvalidArgument):
            fps.values("e4m3", **kwargs)


def test_values_take_numpy_and_decimal_bounds_exactly():
    """Bounds are real numbers taken exactly, numpy scalars included (hypothesis' st.floats takes them).
    The exact value is numpy's (Decimal's) own as_integer_ratio; the nearest fp16 values inside the
    bounds are numpy's float16 neighbours."""
    for bound in (np.float32(0.1), np.float16(0.5), np.float64(1 / 3), np.float32(-1e-6), np.int64(3), np.uint8(200),
                  np.longdouble(1) / 3, Decimal("0.3")):
        exact_bound = Fraction(int(bound)) if isinstance(bound, np.integer) else Fraction(*bound.as_integer_ratio())
        f = np.float16(bound)
        up = f if Fraction(float(f)) >= exact_bound else np.nextafter(f, np.float16(np.inf))
        down = f if Fraction(float(f)) <= exact_bound else np.nextafter(f, np.float16(-np.inf))
        above = fps.values("fp16", min_value=bound, allow_infinity=False)
        below = fps.values("fp16", max_value=bound, allow_infinity=False)
        assert ever(above, lambda v: v == float(up)) == float(up)
        assert ever(below, lambda v: v == float(down)) == float(down)
        with pytest.raises(NoSuchExample):
            reachable(above, lambda v: Fraction(v) < exact_bound, max_examples=300)
        with pytest.raises(NoSuchExample):
            reachable(below, lambda v: Fraction(v) > exact_bound, max_examples=300)
        assert reachable(fps.values("e4m3", min_value=bound), lambda v: True) >= exact_bound


def test_values_refuse_nan_bounds():
    for nan in (math.nan, np.float32("nan"), np.float64("nan"), np.float16("nan"), Decimal("NaN")):
        for side in ("min_value", "max_value"):
            with pytest.raises(InvalidArgument, match=f"{side} must not be NaN"):
                fps.values("e4m3", **{side: nan})


def test_values_refuse_bounds_that_are_not_numbers():
    for bad in ("1.0", True, np.bool_(False), 1j, [1.0]):
        with pytest.raises(InvalidArgument, match="must be a real number"):
            fps.values("e4m3", min_value=bad)


@pytest.mark.parametrize("name", ["e4m3", "fp16", "e5m2fnuz", "e2m1", "bf16", "e8m0"])
def test_values_reach_the_edges(name):
    fmt = fpsim.format(name)
    edges = [float(fmt.min_subnormal), float(fmt.min_normal), float(fmt.max)]
    if fmt.subnormals:
        edges.append(float(fmt.min_normal - fmt.min_subnormal))
    for edge in edges:
        ever(fps.values(fmt), lambda v, e=edge: v == e)
        if fmt.signed:
            ever(fps.values(fmt), lambda v, e=edge: v == -e)
    if fmt.zero:
        ever(fps.values(fmt), lambda v: v == 0 and not np.signbit(v))
    if fmt.has_negative_zero:
        ever(fps.values(fmt), is_negative_zero)
    if fmt.infinities:
        ever(fps.values(fmt), lambda v: v == math.inf)
        ever(fps.values(fmt), lambda v: v == -math.inf)
    if fmt.has_nan:
        ever(fps.values(fmt), lambda v: math.isnan(v) and np.signbit(v) == (fmt.nan == "fnuz"))
    # powers of two and their neighbours on the grid
    def power_offset(x):  # (x - 2^e) / spacing for x in [2^e, 2^(e+1)): 0 at a power, 1 just above it
        v = abs(Fraction(x))
        return (v - 2 ** exact.floor_log2(v)) / exact.quantum(fmt, v)

    normal = dict(allow_nan=False, allow_infinity=False, allow_subnormal=False)
    ever(fps.values(fmt, **normal), lambda x: x != 0 and x > 2 * fmt.min_normal and power_offset(x) == 0)
    if fmt.man_bits:
        ever(fps.values(fmt, **normal), lambda x: x != 0 and x > 2 * fmt.min_normal and power_offset(x) == 1)
        ever(fps.values(fmt, **normal), lambda x: x != 0 and x < fmt.max / 2
             and 2 ** (exact.floor_log2(abs(Fraction(x))) + 1) - abs(Fraction(x)) == exact.quantum(fmt, abs(Fraction(x))))


def test_nan_signs_follow_the_format():
    for name, signs in {"e4m3": {True, False}, "fp16": {True, False}, "e4m3fnuz": {True}, "e8m0": {False}}.items():
        seen = set()
        for _ in range(2):
            for sign in (True, False):
                try:
                    reachable(fps.values(name), lambda v, s=sign: math.isnan(v) and bool(np.signbit(v)) == s,
                              max_examples=300)
                    seen.add(sign)
                except NoSuchExample:  # that sign never appears
                    pass
        assert seen == signs, name


# ------------------------------------------------------------------ codes
@DRAW
@given(fps.formats(), st.data())
def test_codes_are_in_range(fmt, data):
    c = data.draw(fps.codes(fmt))
    assert isinstance(c, int) and 0 <= c < 2**fmt.bits


@pytest.mark.parametrize("name", ["e4m3", "e5m2", "e4m3fnuz", "fp16", "bf16", "e2m1", "e8m0", "fp32"])
def test_codes_reach_every_nan_encoding(name):
    fmt = fpsim.format(name)
    nan_codes = [c for c in range(min(1 << fmt.bits, 1 << 16)) if math.isnan(exact.decode_code(c, fmt))]
    if fmt.bits > 16:  # fp32: the first, the quiet and the last NaN of each sign
        nan_codes = [0x7F800001, 0x7FC00000, 0x7FFFFFFF, 0xFF800001, 0xFFC00000, 0xFFFFFFFF]
    elif len(nan_codes) > 8:
        top = ((1 << fmt.exp_bits) - 1) << fmt.man_bits
        sign = 1 << (fmt.bits - 1)
        nan_codes = [top | 1, top | (1 << (fmt.man_bits - 1)), top | ((1 << fmt.man_bits) - 1)]
        nan_codes += [c | sign for c in nan_codes]
    for code in nan_codes:
        ever(fps.codes(fmt), lambda c, want=code: c == want)
    assert not nan_codes or math.isnan(exact.decode_code(nan_codes[0], fmt))


@DRAW
@given(fps.formats(), st.data())
def test_codes_without_nan_or_infinity(fmt, data):
    c = data.draw(fps.codes(fmt, allow_nan=False, allow_infinity=False))
    assert math.isfinite(exact.decode_code(c, fmt))


def test_codes_reach_non_canonical_zeros():
    fmt = Format(4, 3, nan="fn", subnormals=False)
    ever(fps.codes(fmt), lambda c: 0 < (c & 0x7F) < 8)


# -------------------------------------------------------- rounding inputs
@DRAW
@given(fps.formats(), st.sampled_from([np.float16, np.float32, np.float64]), st.data())
def test_rounding_inputs_have_the_dtype(fmt, dtype, data):
    x = data.draw(fps.rounding_inputs(fmt, dtype))
    assert type(x) is dtype


@DRAW
@given(fps.formats(), st.data())
def test_rounding_inputs_options(fmt, data):
    x = data.draw(fps.rounding_inputs(fmt, np.float32, allow_nan=False, allow_infinity=False,
                                      allow_negative=False))
    assert np.isfinite(x) and not np.signbit(x)


def _is_tie(x, fmt) -> bool:
    if not math.isfinite(float(x)) or abs(float(x)) > fmt.max:
        return False
    v = abs(Fraction(float(x)))
    lo, hi = exact.neighbours(fmt, v)
    return lo != hi and v - lo == hi - v


@pytest.mark.parametrize("name,dtype", [("e4m3", np.float32), ("fp16", np.float64), ("e2m1", np.float32),
                                        ("bf16", np.float32), ("e5m2fnuz", np.float64)])
def test_rounding_inputs_reach_ties_and_their_neighbours(name, dtype):
    fmt = fpsim.format(name)
    s = fps.rounding_inputs(fmt, dtype)
    ever(s, lambda x: _is_tie(x, fmt) and abs(x) > 1)
    def step(x, towards):
        with np.errstate(over="ignore"):
            return np.nextafter(x, dtype(towards))
    ever(s, lambda x: _is_tie(step(x, np.inf), fmt) and x > 1)  # 1 ulp below a tie
    ever(s, lambda x: _is_tie(step(x, -np.inf), fmt) and x > 1)  # 1 ulp above
    ever(s, lambda x: _is_tie(x, fmt) and 0 < abs(float(x)) < fmt.min_normal)  # a tie between subnormals
    ever(s, lambda x: x == dtype(float(fmt.min_subnormal) / 2))  # the tie between 0 and the smallest
    threshold = fmt.max + exact.quantum(fmt, fmt.max) / 2  # the overflow threshold
    if threshold < np.finfo(dtype).max:
        t = dtype(float(threshold))
        for candidate in (t, np.nextafter(t, dtype(0)), np.nextafter(t, dtype(np.inf)), -t):
            ever(s, lambda x, c=candidate: x == c)
    ever(s, lambda x: 0 < float(x) < fmt.min_normal and not _is_tie(x, fmt))  # inside the subnormal range
    if fmt.has_nan:
        ever(s, lambda x: np.isnan(x))
    else:  # NaN has no value in the format: drawn only when asked for
        ever(fps.rounding_inputs(fmt, dtype, allow_nan=True), lambda x: np.isnan(x))
    ever(s, lambda x: np.isinf(x) and x < 0)
    if fmt.max > 100:  # ordinary values: off the grid, not ties
        ever(s, lambda x: 2 < abs(float(x)) < fmt.max / 2 and not _is_tie(x, fmt)
             and len(set(exact.neighbours(fmt, abs(Fraction(float(x)))))) == 2)


def test_rounding_inputs_refuse_other_dtypes():
    with pytest.raises(InvalidArgument):
        fps.rounding_inputs("e4m3", np.int32)


# ----------------------------------------------------------------- arrays
@DRAW
@given(fps.formats(), st.data())
def test_arrays_hold_values_of_the_format(fmt, data):
    a = data.draw(fps.arrays(fmt))
    assert a.dtype == (np.float32 if PRESETS["fp32"].contains(fmt) else np.float64)
    assert 1 <= a.ndim <= 2
    assert all(is_value_of(float(v), fmt) for v in a.ravel())


def test_arrays_shape_dtype_and_elements():
    a = ever(fps.arrays("e4m3", (2, 3), dtype=ml_dtypes.float8_e4m3fn), lambda a: True)
    assert a.shape == (2, 3) and a.dtype == ml_dtypes.float8_e4m3fn
    b = ever(fps.arrays("e4m3", 5, dtype=np.float32, elements=fps.rounding_inputs("e4m3", np.float32)),
                  lambda a: any(_is_tie(x, fpsim.format("e4m3")) for x in a))
    assert b.shape == (5,)
    c = ever(fps.arrays("fp16", 4, allow_nan=False, min_value=-1, max_value=1), lambda a: True)
    assert (np.abs(c) <= 1).all()
    with pytest.raises(InvalidArgument):
        find(fps.arrays("e4m3", 3, elements=st.just(1.0), allow_nan=False), lambda a: True)


# Every value of a format, from its ml_dtypes (numpy, for fp16) type decoding every code: an oracle
# independent of fpsim. The held/not-held verdict is the target dtype's own cast round trip.
ML_TYPES = {"e2m1": (ml_dtypes.float4_e2m1fn, 4), "e3m2": (ml_dtypes.float6_e3m2fn, 6),
            "e2m3": (ml_dtypes.float6_e2m3fn, 6), "e4m3": (ml_dtypes.float8_e4m3fn, 8),
            "e5m2": (ml_dtypes.float8_e5m2, 8), "e4m3fnuz": (ml_dtypes.float8_e4m3fnuz, 8),
            "e5m2fnuz": (ml_dtypes.float8_e5m2fnuz, 8), "e8m0": (ml_dtypes.float8_e8m0fnu, 8),
            "bf16": (ml_dtypes.bfloat16, 16), "fp16": (np.float16, 16)}
TARGETS = [np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.float8_e4m3fnuz,
           ml_dtypes.float8_e8m0fnu, np.float32]
ARRAY_OPTIONS = [dict(), dict(allow_nan=False), dict(allow_nan=False, allow_infinity=False),
                 dict(allow_nan=False, allow_infinity=False, allow_subnormal=False),
                 dict(allow_negative=False, allow_nan=False, allow_infinity=False), dict(min_value=-1.0, max_value=1.0)]


def every_value(name) -> np.ndarray:
    dtype, bits = ML_TYPES[name]
    return np.arange(2**bits, dtype=np.uint8 if bits <= 8 else np.uint16).view(dtype).astype(np.float64)


def allowed_values(name, options) -> np.ndarray:
    """The values of `name` that values(name, **options) may draw, by the documented option rules."""
    v = every_value(name)
    bounded = "min_value" in options
    keep = ~np.isnan(v) | (options.get("allow_nan", True) is not False and not bounded)
    keep &= ~np.isinf(v) | (options.get("allow_infinity", True) is not False)
    if options.get("allow_subnormal") is False:
        keep &= ~((v != 0) & (np.abs(v) < float(fpsim.format(name).min_normal)))
    if options.get("allow_negative") is False:
        keep &= ~np.signbit(v)
    if bounded:
        keep &= (v >= options["min_value"]) & (v <= options["max_value"])
    return v[keep]


@pytest.mark.parametrize("name", list(ML_TYPES))
def test_arrays_refuse_a_dtype_that_cannot_hold_the_values(name):
    """arrays(fmt, dtype=...) casts values of fmt into dtype: a dtype that does not hold every value the
    options allow must be refused when the strategy is created (it used to round them, or turn them into
    Inf, silently). Whether it holds them is the dtype's own round trip of every value."""
    for target, options in itertools.product(TARGETS, ARRAY_OPTIONS):
        want = allowed_values(name, options)
        with np.errstate(all="ignore"):
            back = want.astype(target).astype(np.float64)
        held = ((back == want) & (np.signbit(back) == np.signbit(want))) | (np.isnan(back) & np.isnan(want))
        if not held.all():
            with pytest.raises(InvalidArgument, match=rf"dtype={np.dtype(target).name} cannot hold"):
                fps.arrays(name, dtype=target, **options)
            continue
        strategy = fps.arrays(name, dtype=target, **options)
        if options:
            continue

        @settings(EVER, max_examples=10)
        @given(strategy)
        def drawn(a):
            assert a.dtype == np.dtype(target)
            a = a.astype(np.float64)
            assert np.isin(a[~np.isnan(a)], want).all()

        drawn()


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.uint8, bool, np.complex64, object, "U3", ml_dtypes.int4,
                                   "not a dtype"], ids=repr)
def test_arrays_refuse_dtypes_that_are_not_floats(dtype):
    with pytest.raises(InvalidArgument, match="use float32"):
        fps.arrays("e4m3", dtype=dtype)
    with pytest.raises(InvalidArgument):
        fps.arrays("e4m3", dtype=dtype, elements=fps.rounding_inputs("e4m3", np.float32))


def test_arrays_refusal_names_the_dtype_and_what_works():
    with pytest.raises(InvalidArgument, match=r"dtype=int8 .*use float32"):
        fps.arrays("e4m3", dtype=np.int8)
    with pytest.raises(InvalidArgument, match=r"dtype=float16 cannot hold every value of bf16.*use float32"):
        fps.arrays("bf16", dtype=np.float16, allow_nan=False, allow_infinity=False)
    with pytest.raises(InvalidArgument, match=r"-0\.0 is not a float8_e4m3fnuz value.*allow_negative=False"):
        fps.arrays("e4m3", dtype=ml_dtypes.float8_e4m3fnuz, allow_nan=False)
    tiny = Format(2, 1, nan="ieee")  # values 0.5 to 3, +-Inf and NaN: a float8_e4m3fn or float6_e3m2fn value each
    with pytest.raises(InvalidArgument, match=r"inf is not a float8_e4m3fn value.*allow_infinity=False"):
        fps.arrays(tiny, dtype=ml_dtypes.float8_e4m3fn)
    fps.arrays(tiny, dtype=ml_dtypes.float8_e4m3fn, allow_infinity=False)
    with pytest.raises(InvalidArgument, match=r"nan is not a float6_e3m2fn value.*allow_nan=False"):
        fps.arrays(tiny, dtype=ml_dtypes.float6_e3m2fn, allow_infinity=False)
    fps.arrays(tiny, dtype=ml_dtypes.float6_e3m2fn, allow_infinity=False, allow_nan=False)


# ----------------------------------------------------------- dot problems
@DRAW
@given(st.sampled_from(["e4m3", "e5m2", "fp16", "bf16", "tf32"]), st.sampled_from(["fp32", "fp16"]), st.data())
def test_dot_problems_hold_values_of_their_formats(inputs, output, data):
    a, b, c = problem = data.draw(fps.dot_problems(inputs, output_format=output, batch=data.draw(
        st.sampled_from([(), (2,)]))))
    assert a.shape == b.shape and a.shape[:-1] == c.shape and 1 <= a.shape[-1] <= 64
    assert all(is_value_of(float(v), fpsim.format(inputs)) for v in np.concatenate([a.ravel(), b.ravel()]))
    assert all(is_value_of(float(v), fpsim.format(output)) for v in c.ravel())
    want = [sum((Fraction(float(x)) * Fraction(float(y)) for x, y in zip(ra, rb)), Fraction(float(rc)))
            for ra, rb, rc in zip(a.reshape(-1, a.shape[-1]), b.reshape(-1, a.shape[-1]), c.reshape(-1))]
    got = problem.exact()
    assert (list(got.ravel()) if c.ndim else [got]) == want


def test_dot_problems_reach_their_kinds():
    fmt = fpsim.format("bf16")

    def products(p):
        return [Fraction(float(x)) * Fraction(float(y)) for x, y in zip(p.a, p.b)]

    def kind(name):
        return fps.dot_problems("bf16", 8, kinds=[name])

    # cancellation: large products that cancel exactly, leaving a sum far smaller than the largest
    ever(kind("cancellation"), lambda p: max(map(abs, products(p))) > 2**20 * abs(p.exact()) > 0,
              max_examples=300)
    # cancellation against c: c is minus the rounded sum of the products
    ever(kind("random"), lambda p: p.c != 0 and abs(p.exact()) < abs(Fraction(float(p.c))) / 2**20,
              max_examples=300)
    # wide exponent spread within one problem
    ever(kind("spread"), lambda p: max(map(abs, products(p))) > 2**200 * min(abs(q) for q in products(p) if q),
              max_examples=300)
    # products below the fp32 subnormal range, and subnormal inputs
    ever(kind("tiny"), lambda p: any(0 < abs(q) < 2**-149 for q in products(p)), max_examples=300)
    ever(kind("tiny"), lambda p: any(0 < abs(x) < fmt.min_normal for x in p.b), max_examples=300)
    assert ever(fps.dot_problems("e4m3", 7), lambda p: True).a.shape == (7,)
    assert ever(fps.dot_problems("e4m3", st.integers(3, 4)), lambda p: True).a.shape[0] in (3, 4)
    with pytest.raises(InvalidArgument):
        fps.dot_problems("e4m3", kinds=["nonsense"])


@pytest.mark.parametrize("kwargs", [
    dict(batch=(-1,)), dict(batch=-2), dict(batch=(2.0,)), dict(batch=(True,)), dict(batch="ab"), dict(batch=None),
    dict(allow_subnormal=None),
], ids=repr)
def test_dot_problems_refuse_bad_arguments_when_created(kwargs):
    with pytest.raises(InvalidArgument):
        fps.dot_problems("e4m3", **kwargs)


@pytest.mark.parametrize("batch,k", [((0,), None), ((2, 0), 3), (3, None), ((np.int64(2),), np.int64(4))], ids=repr)
def test_dot_problems_take_any_batch_shape(batch, k):
    """batch is a shape as numpy takes one: an int or a tuple of nonnegative ints, empty batches too."""
    shape = (batch,) if isinstance(batch, int) else tuple(int(n) for n in batch)
    p = ever(fps.dot_problems("e4m3", k, batch=batch), lambda p: True)
    assert p.a.shape == p.b.shape and p.a.shape[:-1] == p.c.shape == shape
    assert p.a.shape[-1] >= 1 and (k is None or p.a.shape[-1] == k)
    assert p.exact().shape == shape


# -------------------------------------------------------------- shrinking
# Deliberately broken functions: hypothesis must shrink their failures to small, readable inputs.
# Hypothesis's shrinker finds a local minimum, so these accept any "simple" value: a power of two
# (or 3 times one), or one of the format's edges (0, the subnormal edges, min normal, max), and
# check two seeds each.
SEEDS = [0, 1]


def edges_of(fmt) -> set:
    e = {0.0, float(fmt.min_subnormal), float(fmt.min_normal), float(fmt.max),
         float(fmt.min_normal - fmt.min_subnormal)}
    return e | {-v for v in e}


def simple(v, fmt) -> bool:
    if v in edges_of(fmt) or math.isnan(v) or math.isinf(v):
        return True
    m, _ = math.frexp(abs(v))
    return m in (0.5, 0.75)  # 2^k or 3 * 2^k


@pytest.mark.parametrize("seed", SEEDS)
def test_shrinks_a_subnormal_flush_to_a_simple_subnormal(seed):
    def flushing_cast(v):  # flushes subnormals to zero
        return 0.0 if abs(v) < 2**-6 else v
    v = reachable(fps.values("e4m3"), lambda v: not math.isnan(v) and flushing_cast(v) != v, seed)
    assert 0 < v < 2**-6 and simple(v, fpsim.format("e4m3")), v


def half_up(x):
    """A float32 -> E4M3 cast that rounds ties up instead of to even (saturating)."""
    x = np.float32(x)
    m, e = np.frexp(np.abs(x))
    step = np.ldexp(np.float32(1), np.maximum(e - 1, -6) - 3)
    return np.copysign(np.minimum(np.floor(np.abs(x) / step + np.float32(0.5)) * step, 448), x)


@pytest.mark.parametrize("seed", SEEDS)
def test_shrinks_a_tie_bug_to_a_tie_above_zero_or_a_power_of_two(seed):
    fmt = fpsim.format("e4m3")

    def wrong(x):
        return not np.isnan(x) and half_up(x) != fpsim.quantize(np.float32(x), "e4m3", saturate=True)
    x = reachable(fps.rounding_inputs("e4m3", np.float32), wrong, seed)
    assert _is_tie(x, fmt), x
    lo, _ = exact.neighbours(fmt, abs(Fraction(float(x))))
    assert lo == 0 or simple(float(lo), fmt), x


@pytest.mark.parametrize("seed", SEEDS)
def test_shrinks_range_bugs_to_simple_values(seed):
    fp16, bf16 = fpsim.format("fp16"), fpsim.format("bf16")
    for strategy, fmt, condition in [(fps.values(fp16), fp16, lambda v: v >= 3),
                                     (fps.values(fp16), fp16, lambda v: v <= -3),
                                     (fps.values(bf16), bf16, lambda v: 0 < v < 1e-30)]:
        v = reachable(strategy, condition, seed)
        assert simple(v, fmt), v


def test_shrinks_sign_nan_and_format_bugs():
    assert is_negative_zero(reachable(fps.values("fp16"), is_negative_zero))
    assert math.isnan(reachable(fps.values("fp16"), math.isnan))
    for seed in SEEDS:
        fmt = reachable(fps.formats(), lambda f: not f.subnormals and f.zero, seed)
        assert fmt.bits <= 8 and fmt.exp_bits <= 4, fmt
        assert reachable(fps.formats(), lambda f: f.nan == "fnuz", seed).bits <= 8


@pytest.mark.parametrize("seed", SEEDS)
def test_shrinks_dot_bugs_to_short_simple_problems(seed):
    fmt = fpsim.format("e4m3")

    def dot_ignoring_c(p):
        return sum(Fraction(float(x)) * Fraction(float(y)) for x, y in zip(p.a, p.b))
    p = reachable(fps.dot_problems(fmt), lambda p: dot_ignoring_c(p) != p.exact(), seed, max_examples=300)
    assert p.a.shape == (1,) and simple(float(p.c), fpsim.format("fp32")), p
    assert all(simple(float(v), fmt) for v in (*p.a, *p.b)), p

    def loses_small_terms(p):  # keeps only products within 2^10 of the largest
        q = [Fraction(float(x)) * Fraction(float(y)) for x, y in zip(p.a, p.b)]
        big = max(abs(t) for t in q)
        return sum(t for t in q if abs(t) * 2**10 >= big) != sum(q)
    p = reachable(fps.dot_problems(fmt), loses_small_terms, seed, max_examples=300)
    assert p.a.shape[0] <= 3 and sum(float(x) * float(y) != 0 for x, y in zip(p.a, p.b)) <= 3, p
