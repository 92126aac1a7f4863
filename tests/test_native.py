"""The compiled fast path (fpsim/_fastround.c via fpsim._native) against the numpy engine and the oracle.

The kernel claims to give the numpy engine's bits (round_bits for values, _packing.pack for codes)
on every float32, float64 and integer input it covers, stochastic rounding included (both read the
same Philox stream, fpsim/philox.py). Both are compared here bit for bit on inputs covering every
bit-pattern class of float32 and float64 (random patterns, every exponent field with edge
mantissas, NaN payloads of both signs, +-0, subnormals, +-Inf, dense sweeps around every value of
each 8-bit format), on every integer dtype's edge values, for every preset the kernel covers,
every mode, saturate and both flush options; also through quantize/encode and torch CPU tensors.
The engine itself is held to the exact oracle in test_rounding.py and test_stochastic.py; the
integer cases and the kernel's general path (stochastic ties, integers beyond 2^53) are also
held to the oracle (fpsim.exact) here directly, and so is float64 input into float32's own format
(the hardware's conversion), also held to numpy's astype(float32) for nearest-even, and float64 input
into the other formats at the inputs where a float32 intermediate double-rounds (hypothesis), below the
format's min normal and in every output type.
"""

from __future__ import annotations

import struct
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fpsim import _arrays, _native, exact, philox
from fpsim._packing import pack
from fpsim.codec import code_dtype, encode
from fpsim.formats import PRESETS, Format
from fpsim.rounding import _quantize_engine, quantize, round_bits

from foundation_helpers import (CUSTOM_FORMATS, assert_same_bits, assert_same_codes, codable, custom_formats,
                                expected_nan_sign, fmt_id, next_down, next_up, reference_fraction, reference_word, requires_torch, sweep_points,
                                torch)

pytestmark = pytest.mark.skipif(not _native.available(),
                                reason="the compiled kernel fpsim._fastround is not built (numpy engine only)")

DETERMINISTIC = ("nearest_even", "nearest_away", "toward_zero", "up", "down", "odd")
FLUSH = [(False, False), (True, False), (False, True), (True, True)]
KEY = 0x243F6A8885A308D3
UINT = {np.float32: np.uint32, np.float64: np.uint64}


def _bit_pattern_inputs(seed: int, dtype=np.float32, n_random: int = 8_000) -> np.ndarray:
    """Inputs of `dtype` from every bit-pattern class."""
    rng = np.random.default_rng(seed)
    P, fields = (23, 256) if dtype == np.float32 else (52, 2048)
    uint = UINT[dtype]
    width = 8 * np.dtype(dtype).itemsize
    random_bits = rng.integers(0, 2**width, size=n_random, dtype=np.uint64).astype(uint)
    one = uint(1)
    top = uint((1 << P) - 1)
    mantissas = np.array([0, 1, 2, top >> one, (top >> one) + one, (top >> one) + uint(2), top, top - one,
                          one << uint(P - 2), uint(3) << uint(P - 2), (one << uint(P - 3)) - one, one << uint(P - 3)],
                         dtype=uint)
    if dtype == np.float64:  # 2048 exponent fields: the edge mantissas only
        mantissas = mantissas[[0, 1, 3, 4, 6, 7, 8]]
    mantissas = np.concatenate([mantissas, rng.integers(0, 1 << P, size=8 if P == 23 else 3, dtype=np.uint64).astype(uint)])
    every_field = ((np.arange(fields, dtype=uint) << uint(P))[:, None] | mantissas[None, :]).ravel()
    sign = one << uint(width - 1)
    every_field = np.concatenate([every_field, every_field | sign])
    inf = uint(fields - 1) << uint(P)
    nan_payloads = np.array([inf | (one << uint(P - 1)), inf | one, inf | top, inf | uint(0x5A5A5)], dtype=uint)
    nan_payloads = np.concatenate([nan_payloads, nan_payloads | sign])
    specials = np.array([0, 1, top, one << uint(P), inf - one, inf], dtype=uint)
    specials = np.concatenate([specials, specials | sign])
    out = np.concatenate([random_bits, every_field, nan_payloads, specials]).view(dtype)
    if dtype == np.float64:  # float64 input near float32's edges too
        out = np.concatenate([out, _bit_pattern_inputs(seed, np.float32, n_random // 4)[::4].astype(np.float64)])
    return out


def _kernel_formats():
    presets = [f for f in PRESETS.values() if _native.covers(np.float32, f)]
    customs = [f for f in CUSTOM_FORMATS.values() if _native.covers(np.float32, f)]
    return presets, customs


KERNEL_PRESETS, KERNEL_CUSTOMS = _kernel_formats()


def test_isa_names_loops_this_cpu_can_run():
    """_native.isa() against the CPU's own flags (/proc/cpuinfo): the AVX-512 loops (x86-64-v4) only where
    AVX-512 F, BW, CD, DQ and VL all are, the AVX2 loops only with AVX2."""
    isa = _native.isa()
    assert isa in ("x86-64-v4", "avx2", "default")
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            flags = set(next(line for line in f if line.startswith("flags")).split(":", 1)[1].split())
    except (OSError, StopIteration):
        pytest.skip("no /proc/cpuinfo flags to check against")
    if isa == "x86-64-v4":
        assert {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"} <= flags
    if isa in ("x86-64-v4", "avx2"):
        assert "avx2" in flags


def test_kernel_covers_the_expected_presets():
    names = {f.name for f in KERNEL_PRESETS}
    assert {"fp16", "bf16", "tf32", "e4m3", "e5m2", "e4m3fnuz", "e5m2fnuz", "e3m2", "e2m3", "e2m1", "e8m0"} <= names
    for dtype in (np.float64, np.int8, np.uint64):
        assert {f.name for f in PRESETS.values() if _native.covers(dtype, f)} == names | {"fp32"}
    assert _native.route(np.float32, PRESETS["e8m0"]) == (32, "working")  # float32 subnormals: the general path
    assert _native.route(np.float32, PRESETS["bf16"], "stochastic", rand_bits=40) == (64, "float32")
    assert _native.route(np.float32, Format(9, 3)) == (64, "float32")  # values beyond float32
    assert _native.route(np.float64, PRESETS["bf16"]) == (64, "working")  # values: in float64 lanes, rounded once
    assert _native.route(np.float64, PRESETS["bf16"], codes=True) == (32, "float64")  # codes: rounded to odd first
    assert _native.route(np.float64, Format(8, 21), codes=True) == (32, "float64")
    assert _native.route(np.float64, Format(8, 22), codes=True) == (64, "working")  # too wide for odd's margin
    assert _native.route(np.float64, Format(8, 3, bias=150), codes=True) == (64, "working")  # spacing 2^-152
    assert _native.route(np.float64, Format(8, 7, bias=141), codes=True) == (32, "float64")  # spacing 2^-147
    assert _native.route(np.float64, Format(8, 8, bias=141), codes=True) == (64, "working")  # spacing 2^-148
    assert _native.route(np.float64, PRESETS["bf16"], "stochastic", codes=True) == (64, "working")
    assert _native.route(np.float64, PRESETS["bf16"], "stochastic") == (64, "working")
    assert _native.route(np.float64, PRESETS["tf32"]) == (64, "working")
    assert _native.route(np.float64, PRESETS["fp32"]) == (32, "float64")  # the hardware's conversion (_casts)
    assert _native.route(np.float64, PRESETS["fp32"], "nearest_away") == (32, "float64")  # toward zero, then up
    assert _native.route(np.float64, PRESETS["fp32"], "stochastic") == (64, "working")
    assert not _native.covers(np.float64, PRESETS["fp64"]) and not _native.covers(np.float16, PRESETS["e4m3"])


def _options(rounding, saturate, flush_in, flush_out, rand_bits):
    return dict(rounding=rounding, saturate=saturate, flush_inputs=flush_in, flush_outputs=flush_out,
                rand_bits=rand_bits if rounding == "stochastic" else None)


def _engine(x, fmt: Format, codes: bool, key=KEY, **options):
    ops = _arrays.Ops(x)
    stochastic = options["rounding"] == "stochastic"
    if x.dtype.kind in "iu":  # the engine's integer path: float64, rounded to odd beyond 2^53, or the oracle
        values = _quantize_engine(x, None, PRESETS["fp64"], fmt, ops, options, key if stochastic else None)
    else:
        values = round_bits(x, fmt, ops, stream=philox.Stream(key) if stochastic else None, **options)
    return pack(values, fmt, ops).astype(code_dtype(fmt)) if codes else values


def _kernel(x, fmt: Format, codes: bool, key=KEY, **options):
    return _native.run(x, fmt, key=key, codes=codes, values_dtype=x.dtype if x.dtype.kind == "f" else None,
                       **options)


def _code_inputs(x: np.ndarray, fmt: Format) -> np.ndarray:
    """Inputs the engine can encode: for formats without NaN, no NaN, no negatives if also unsigned and
    no zeros if also without zero (those round to NaN, which encode refuses)."""
    if fmt.has_nan:
        return x
    keep = ~np.isnan(x) if x.dtype.kind == "f" else np.ones(x.shape, dtype=bool)
    if not fmt.signed:
        keep &= ~(np.signbit(x) & (x != 0))
    if not fmt.zero:
        keep &= x != 0
    return x[keep]


def _bits(values: np.ndarray) -> np.ndarray:
    return values.view(UINT[values.dtype.type]) if values.dtype.kind == "f" else values


def _compare(x, fmt, rounding, saturate, flush_in, flush_out, rand_bits=None, key=KEY):
    if x.dtype == np.float32 and not PRESETS["fp32"].contains(fmt):
        x = x.astype(np.float64)  # as quantize does: the format's values need float64
    options = _options(rounding, saturate, flush_in, flush_out, rand_bits)
    what = f"{fmt.name} {x.dtype} {options}: "
    got = _kernel(x, fmt, False, key, **options)
    # NaN bits: both sides produce the canonical NaN, so compare the raw bits (payload and sign too)
    assert_same_codes(_bits(got), _bits(_engine(x, fmt, False, key, **options)), what=what)
    xc = _code_inputs(x, fmt)
    got_codes = _kernel(xc, fmt, True, key, **options)
    assert got_codes.dtype == code_dtype(fmt)
    assert_same_codes(got_codes, _engine(xc, fmt, True, key, **options), what="codes " + what)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("fmt", KERNEL_PRESETS + KERNEL_CUSTOMS, ids=fmt_id)
@pytest.mark.parametrize("rounding", DETERMINISTIC)
def test_kernel_matches_numpy_engine_on_every_bit_pattern_class(fmt, rounding, dtype):
    x = _bit_pattern_inputs(seed=40, dtype=dtype, n_random=8_000 if dtype == np.float32 else 3_000)
    if fmt.bits <= 16:
        x = np.concatenate([x, sweep_points(fmt, dtype)[:: 1 if fmt.bits <= 8 else 17]])
    for saturate in (False, True):
        for flush_in, flush_out in FLUSH:
            _compare(x, fmt, rounding, saturate, flush_in, flush_out)


WIDE_FORMATS = [PRESETS["fp32"], PRESETS["tf32"], Format(8, 21, name="e8m21"),  # (float64 rounded to odd's edge) Format(11, 20, name="e11m20"), Format(9, 30, bias=300, name="e9m30_b300"),
                Format(10, 51, nan="fn", name="e10m51fn"), Format(10, 6, signed=False, nan="none", name="e10m6u")]


@pytest.mark.parametrize("fmt", WIDE_FORMATS, ids=fmt_id)
@pytest.mark.parametrize("rounding", DETERMINISTIC + ("stochastic",))
def test_kernel_matches_numpy_engine_for_formats_beyond_float32(fmt, rounding):
    """float64 input into fp32, tf32 and custom formats up to binary64's range (and into e8m21, the widest
    format for which float64 input is rounded to odd at float32's precision first)."""
    assert _native.covers(np.float64, fmt)
    x = _bit_pattern_inputs(seed=45, dtype=np.float64, n_random=4_000)
    for saturate in (False, True):
        for flush_in, flush_out in FLUSH[::3]:
            _compare(x, fmt, rounding, saturate, flush_in, flush_out, rand_bits=None)


# float32's own format, whose float64 input the hardware converts (_native._casts), and a twin by fields
FLOAT32_TWINS = [PRESETS["fp32"], Format(8, 23, name="e8m23")]
CAST_MODES = ("nearest_even", "nearest_away", "toward_zero", "up", "down", "odd")


def _float32_edge_inputs() -> np.ndarray:
    """float64 values at float32's rounding boundaries: each float32 (every exponent field, edge mantissas)
    and its neighbours in float64 at one ulp, just below, at and just above half an ulp; the overflow
    threshold 2^128 - 2^103 and 2^128 with their neighbours; float32's subnormals and below."""
    f32 = _bit_pattern_inputs(seed=50, dtype=np.float32, n_random=2_000)
    f32 = f32[np.isfinite(f32)].astype(np.float64)
    with np.errstate(over="ignore"):  # (float32's max: its spacing overflows, the points are Inf)
        ulp = np.spacing(np.abs(f32).astype(np.float32)).astype(np.float64)
    points = [f32 + sign * ulp * t for sign in (1, -1) for t in (0.5, 1.0)]
    points = np.concatenate([f32] + points)
    points = np.concatenate([np.nextafter(points, np.inf), np.nextafter(points, -np.inf), points])
    limits = np.array([2.0**128 - 2.0**103, 2.0**128, 2.0**-149, 2.0**-150, 2.0**-126, 1e-320, 5e-324, 1e308])
    limits = np.concatenate([limits, np.nextafter(limits, 0), np.nextafter(limits, np.inf)])
    return np.concatenate([points, limits, -limits])


@pytest.mark.parametrize("fmt", FLOAT32_TWINS, ids=fmt_id)
@pytest.mark.parametrize("rounding", CAST_MODES)
def test_hardware_cast_of_float64_into_float32s_format(fmt, rounding):
    """float64 input into float32's own format takes the hardware's conversion (route (32, "float64")),
    where the kernel, the engine and (nearest-even) numpy's astype(float32) agree bit for bit on every
    bit-pattern class and at float32's rounding boundaries, every option; and exact.round_value (the
    oracle) agrees on the boundaries."""
    assert _native.route(np.float64, fmt, rounding) == (32, "float64")
    x = np.concatenate([_bit_pattern_inputs(seed=46, dtype=np.float64, n_random=4_000), _float32_edge_inputs()])
    for saturate in (False, True):
        for flush_in, flush_out in FLUSH:
            _compare(x, fmt, rounding, saturate, flush_in, flush_out)
    got = quantize(x, fmt, rounding)
    if rounding == "nearest_even":
        with np.errstate(over="ignore"):
            assert_same_bits(got, x.astype(np.float32).astype(np.float64), inputs=x)
    boundaries = _float32_edge_inputs()[::7]
    expected = np.array([exact.round_value(float(v), fmt, rounding) for v in boundaries])
    assert_same_bits(quantize(boundaries, fmt, rounding), expected, inputs=boundaries)
    for output in (np.float32, np.float64):  # values of both dtypes, through the kernel's store
        assert_same_bits(_native.run(x, fmt, rounding=rounding, saturate=False, flush_inputs=False,
                                     flush_outputs=False, values_dtype=output), got.astype(output), inputs=x)


# formats of float64 input in float64 lanes: values as float64 and float32, codes of 1, 2 and 4 bytes,
# subnormals and none
FLOAT64_FORMATS = [PRESETS[name] for name in ("bf16", "fp16", "tf32", "e4m3", "e5m2", "e4m3fnuz", "e2m1", "e8m0")] + [
    Format(8, 21, name="e8m21"), Format(3, 2, subnormals=False, name="e3m2_nosub"),
    Format(5, 4, signed=False, nan="none", name="e5m4u")]


def _double_rounding_traps(fmt: Format, codes: np.ndarray) -> np.ndarray:
    """float64 inputs near the format's rounding boundaries that a float32 intermediate rounds wrongly:
    for each code's value v and the next value above, the midpoint m, and m moved by 1 to 3 float64 ulps
    and by float32's quarter and half ulp at m (nearest-even in float32 takes m + 1 ulp of float64 to m
    itself, a tie, which a second rounding then breaks to even); also v and its float64 neighbours."""
    values = np.array([exact.decode_code(int(c), fmt) for c in codes], dtype=np.float64)
    values = values[np.isfinite(values)]
    above = np.array([exact.neighbours(fmt, Fraction(float(np.nextafter(v, np.inf))))[1] if v < fmt.max else v
                      for v in np.abs(values)], dtype=np.float64)
    mid = (np.abs(values) + above) / 2  # exact: at most 22 significant bits
    f32_ulp = np.spacing(mid.astype(np.float32)).astype(np.float64)
    steps = [np.nextafter(mid, np.inf), np.nextafter(mid, 0), next_up(mid, 3), next_down(mid, 3)]
    steps += [mid + f32_ulp / 4, mid - f32_ulp / 4, mid + f32_ulp / 2, mid - f32_ulp / 2]
    points = np.concatenate([mid, *steps, values, np.nextafter(values, np.inf), np.nextafter(values, -np.inf)])
    points = np.concatenate([points, -points]) if fmt.signed else points
    return points[np.isfinite(points)]


@settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(FLOAT64_FORMATS), st.sampled_from(DETERMINISTIC), st.booleans(), st.sampled_from(FLUSH),
       st.lists(st.integers(0, 2**32 - 1), min_size=4, max_size=24), st.sampled_from(["values", "float32", "codes"]))
@example(PRESETS["e4m3fnuz"], "up", False, (False, False), [0, 0, 0, 127], "values")   # overflow to fnuz's NaN
@example(PRESETS["e4m3fnuz"], "up", False, (False, False), [0, 0, 0, 127], "float32")
def test_float64_rounds_once_at_the_boundaries_a_float32_intermediate_gets_wrong(fmt, rounding, saturate, flush,
                                                                               draws, output):
    """float64 input against exact.round_value of the float64 value (the oracle), at the points where
    rounding through float32 to nearest first gives a wrong answer: values in float64 lanes (one pass),
    codes rounded to odd at float32's precision first, then by the float32 passes."""
    assert _native.route(np.float64, fmt, rounding) == (64, "working")
    assert _native.route(np.float64, fmt, rounding, codes=True) == (32, "float64")
    codes = np.array(draws, dtype=np.uint64) % (1 << fmt.bits)
    x = _double_rounding_traps(fmt, codes)
    x = x[codable(x, fmt, flush[0])]
    if not x.size:
        return
    options = dict(saturate=saturate, flush_subnormal_inputs=flush[0], flush_subnormal_outputs=flush[1])
    expected = np.array([exact.round_value(float(v), fmt, rounding, **options) for v in x])
    if output == "codes":
        want = np.array([exact.encode_value(float(v), fmt) for v in expected], dtype=np.uint64)
        assert_same_codes(encode(x, fmt, rounding, **options).astype(np.uint64), want)
    elif output == "float32":  # (the kernel's float32 values: exact, every value of these formats fits)
        got = _native.run(x, fmt, rounding=rounding, saturate=saturate, flush_inputs=flush[0],
                          flush_outputs=flush[1], values_dtype=np.float32)
        got = got.astype(np.float64)
    else:
        got = np.asarray(quantize(x, fmt, rounding, **options), dtype=np.float64)
    if output != "codes":   # the oracle's NaN is unsigned: a NaN's sign is the documented one (fnuz: negative)
        assert_same_bits(got, expected, nan_sign=False, inputs=x)
        nan = np.isnan(got)
        assert np.array_equal(np.signbit(got[nan]), expected_nan_sign(fmt, np.signbit(x[nan])))


# formats whose finest spacing is at float32's limit for odd rounding (2^-147) or just past it (2^-148, 2^-150,
# 2^-151: the float64 passes), with subnormals and without (then the spacing of the lowest normal binade)
FINEST_SPACING_FORMATS = [Format(8, 7, bias=141, name="e8m7_b141"),
                          Format(8, 7, bias=141, subnormals=False, name="e8m7_b141_nosub"),
                          Format(8, 8, bias=141, name="e8m8_b141"),
                          Format(8, 3, bias=148, subnormals=False, name="e8m3_b148_nosub"),
                          Format(8, 10, bias=140, subnormals=False, name="e8m10_b140_nosub")]


@pytest.mark.parametrize("fmt", FINEST_SPACING_FORMATS, ids=fmt_id)
@pytest.mark.parametrize("rounding", DETERMINISTIC)
def test_float64_codes_at_the_finest_spacing_float32_allows(fmt, rounding):
    """The narrowest margin of float64 codes through float32 lanes: a format whose finest spacing is 2^-147,
    two bits above float32's subnormal grid, so that its midpoints there are float32 subnormals and rounding
    to odd must not land on one; finer formats take the float64 passes (a format without subnormals whose
    lowest binade was taken for its min normal went through float32 lanes and came back one code off).
    Codes at the double-rounding traps of the lowest codes, against the oracle (exact.round_value,
    exact.encode_value)."""
    lanes = (32, "float64") if fmt.emin - fmt.man_bits >= -147 else (64, "working")
    assert _native.route(np.float64, fmt, rounding, codes=True) == lanes
    lowest = np.arange(0, 300, dtype=np.uint64)
    codes = np.concatenate([lowest, lowest | (1 << (fmt.bits - 1))])
    x = _double_rounding_traps(fmt, codes % (1 << fmt.bits))
    x = np.concatenate([x, x / 3, np.nextafter(x / 3, 0)])
    expected = np.array([exact.encode_value(exact.round_value(float(v), fmt, rounding), fmt) for v in x],
                        dtype=np.uint64)
    assert_same_codes(encode(x, fmt, rounding).astype(np.uint64), expected)


def test_the_double_rounding_traps_are_traps():
    """The inputs above do catch double rounding: through float32 first (nearest-even), bf16 and e4m3 give
    wrong answers at some of them, which the kernel does not (test above)."""
    for fmt in (PRESETS["bf16"], PRESETS["e4m3"]):
        x = _double_rounding_traps(fmt, np.arange(0, 1 << min(fmt.bits, 10), 7, dtype=np.uint64))
        x = x[codable(x, fmt)]
        expected = np.array([exact.round_value(float(v), fmt) for v in x])
        twice = quantize(x.astype(np.float32), fmt).astype(np.float64)
        assert np.count_nonzero(twice != expected) > 10
        assert_same_bits(quantize(x, fmt), expected, inputs=x)


@pytest.mark.parametrize("fmt", [PRESETS["e4m3"], PRESETS["fp16"], Format(3, 2, subnormals=False, name="e3m2_nosub")],
                         ids=fmt_id)
@pytest.mark.parametrize("rounding", DETERMINISTIC)
def test_float64_below_the_band_in_dense_and_sparse_chunks(fmt, rounding):
    """float64 input below the format's min normal (the kernel's below-band pass): chunks (2048 elements)
    where such inputs are most (every element rewritten), a few (one by one) or none, against the oracle."""
    rng = np.random.default_rng(7)
    tiny = rng.uniform(-1, 1, 3000) * fmt.min_normal * 1.5  # below min normal mostly
    ordinary = rng.standard_normal(3000)
    ordinary[::500] = tiny[:6]  # a few below min normal
    x = np.concatenate([tiny, ordinary, ordinary * 2])
    x = x[codable(x, fmt)]
    expected = np.array([exact.round_value(float(v), fmt, rounding) for v in x])
    assert_same_bits(quantize(x, fmt, rounding), expected, inputs=x)
    want = np.array([exact.encode_value(float(v), fmt) for v in expected], dtype=np.uint64)
    assert_same_codes(encode(x, fmt, rounding).astype(np.uint64), want)


def test_kernel_refuses_the_cast_outside_the_hardwares_modes():
    """The kernel's check (_fastround.c): parameters asking for the hardware's conversion in a mode it
    lacks, from another input, or into codes of another width, are refused rather than rounded."""
    from fpsim import _fastround
    from fpsim.modes import MODES

    x = np.linspace(-3.0, 3.0, 8)
    params = _native.kernel_params(PRESETS["fp32"], rounding="nearest_even", saturate=False, flush_inputs=False,
                                   flush_outputs=False, rand_bits=None, key=None, width=32, input_kind="float64",
                                   output="codes", code_bytes=4)
    names, codes = zip(*(field.split(":") for field in _fastround.KERNEL_FIELDS.split()))
    layout = "=" + "".join(codes)
    values = dict(zip(names, struct.unpack(layout, params)))
    assert values["cast"] == 1
    dst = np.empty(x.size, dtype=np.uint32)
    _fastround.round_array(x.view(np.uint8), dst.view(np.uint8), params)
    assert_same_codes(dst, x.astype(np.float32).view(np.uint32))
    for change in ({"mode": MODES["stochastic"].kernel_id}, {"mode": -1}, {"mode": len(MODES)},
                   {"input": 1}, {"width": 64}, {"code_bytes": 2}, {"cast": 2}):
        bad = struct.pack(layout, *(dict(values, **change)[name] for name in names))
        with pytest.raises(ValueError, match="out of range"):
            _fastround.round_array(x.view(np.uint8), dst.view(np.uint8), bad)


STOCHASTIC_RAND_BITS = [None, 1, 3, 8, 13, 23, 26, 32, 33, 52]
KERNEL_RAND_BITS_CASES = [None, 1, 8, 23, 40]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("fmt", KERNEL_PRESETS + KERNEL_CUSTOMS[:4], ids=fmt_id)
@pytest.mark.parametrize("rand_bits", KERNEL_RAND_BITS_CASES)
def test_kernel_stochastic_matches_numpy_engine_with_the_same_stream(fmt, rand_bits, dtype):
    x = _bit_pattern_inputs(seed=44, dtype=dtype, n_random=3000 if dtype == np.float32 else 1500)
    if fmt.bits <= 16:
        x = np.concatenate([x, sweep_points(fmt, dtype)[:: 1 if fmt.bits <= 8 else 37]])
    for saturate in (False, True):
        for i, (flush_in, flush_out) in enumerate(FLUSH):
            _compare(x, fmt, "stochastic", saturate, flush_in, flush_out, rand_bits, key=KEY + i)


@settings(deadline=None, max_examples=150,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(custom_formats(), st.sampled_from(DETERMINISTIC + ("stochastic",)), st.booleans(), st.sampled_from(FLUSH),
       st.sampled_from(STOCHASTIC_RAND_BITS), st.integers(0, 2**64 - 1), st.sampled_from([np.float32, np.float64]))
def test_kernel_matches_numpy_engine_on_random_custom_formats(fmt, rounding, saturate, flush, rand_bits, key, dtype):
    if not _native.covers(dtype, fmt, rounding, rand_bits if rounding == "stochastic" else None):
        return
    x = _bit_pattern_inputs(key % 2**32, dtype, n_random=1000)
    if len(x):
        _compare(x, fmt, rounding, saturate, *flush, rand_bits=rand_bits, key=key)


@pytest.mark.parametrize("fmt", [Format(3, 2, bias=0, signed=False, nan="fn"),
                                 Format(2, 1, bias=0, signed=False, subnormals=False)], ids=fmt_id)
def test_kernel_negative_inputs_of_unsigned_formats_with_flush(fmt):
    assert fmt.min_normal > 1 and _native.covers(np.float32, fmt)
    for dtype in (np.float32, np.float64):
        x = np.array([-2.0, -3.0, -100.0, 2.0, -0.5, 0.5], dtype=dtype)
        for flush_in, flush_out in FLUSH:
            _compare(x, fmt, "nearest_even", False, flush_in, flush_out)


def test_kernel_encode_refuses_zero_for_formats_without_zero_and_nan():
    fmt = CUSTOM_FORMATS["e3m0_unsigned_nozero"]
    assert not fmt.zero and not fmt.has_nan
    for dtype in (np.float32, np.float64, np.int32):
        with pytest.raises(ValueError):
            encode(np.array([0], dtype=dtype), fmt)


@pytest.mark.parametrize("fmt", [Format(4, 3, bias=142, nan="fn"), Format(1, 0, bias=128, nan="fnuz",
                                                                           subnormals=False)],
                         ids=fmt_id)
def test_kernel_formats_below_float32_min_normal(fmt):
    """Formats whose max lies below float32's min normal: float32 input gives the float64 answer
    (the kernel's float64 path)."""
    assert fmt.max < 2.0**-126
    x = np.array([1e-39, 3e-40, float(fmt.max)], dtype=np.float32)
    assert_same_bits(quantize(x, fmt), quantize(x.astype(np.float64), fmt), inputs=x)


# ------------------------------------------------------------ integers
INTEGER_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
INTEGER_FORMATS = ["e4m3", "e5m2", "e2m1", "bf16", "fp16", "tf32", "fp32", "e8m0", "e4m3fnuz"]


def _integer_inputs(dtype, seed: int) -> np.ndarray:
    """Every edge of the dtype: 0, +-1, min, max, powers of two +-1 and +-2 (2^53 included), random values."""
    info = np.iinfo(dtype)
    rng = np.random.default_rng(seed)
    points = {0, 1, 2, 3, info.max, info.max - 1, info.min, info.min + 1}
    for e in range(1, info.bits):
        for delta in (-1, 0, 1, 3):
            points |= {2**e + delta, -(2**e) - delta}
    points |= {int(v) for v in rng.integers(info.min, info.max, size=200, dtype=dtype, endpoint=True)}
    if info.bits == 64:  # beyond 2^53: at and around ties of the formats with the most mantissa bits
        points |= {(int(v) << s) + d for v in rng.integers(1, 2**11, size=12) for s in (52, 53) for d in (-1, 0, 1)}
    values = sorted(p for p in points if info.min <= p <= info.max)
    return np.array(values, dtype=dtype)


@pytest.mark.parametrize("dtype", INTEGER_DTYPES, ids=lambda d: d.__name__)
@pytest.mark.parametrize("name", INTEGER_FORMATS)
def test_kernel_rounds_integers_like_the_engine(dtype, name):
    fmt = PRESETS[name]
    x = _integer_inputs(dtype, seed=7)
    for rounding in DETERMINISTIC + ("stochastic",):
        _compare(x, fmt, rounding, rounding in ("nearest_even", "up"), False, rounding == "down")


@pytest.mark.parametrize("dtype", [np.int64, np.uint64], ids=lambda d: d.__name__)
@pytest.mark.parametrize("name", ["e4m3", "bf16", "fp32", "tf32"])
@pytest.mark.parametrize("rounding", DETERMINISTIC + ("stochastic",))
def test_integers_beyond_2_53_match_the_oracle(dtype, name, rounding):
    """Integers beyond 2^53 (the kernel's general path; the engine rounds to odd or asks the oracle):
    each result is exact.round_value of the integer, U from the stream for stochastic rounding."""
    fmt = PRESETS[name]
    x = _integer_inputs(dtype, seed=8)
    x = x[np.abs(x.astype(np.float64)) >= 2.0**52]
    got = quantize(x, fmt, rounding, seed=KEY if rounding == "stochastic" else None)
    expected = [exact.round_value(int(v), fmt, rounding,
                                  random_fraction=reference_fraction(KEY, i, 3) if rounding == "stochastic" else None)
                for i, v in enumerate(x)]
    assert_same_bits(got, np.array(expected), nan_sign=False, inputs=x)


# ---------------------------------------------------- the general path's ties
def _tied_inputs(dtype, n: int):
    """Inputs whose dropped fraction f starts with the element's own first word of U and goes on, so
    that U's second word decides (probability 2^-32 otherwise), and the indices that hold them.
    float64 into bf16 (45 dropped bits): 1 + (w0 2^13 + t) 2^-52, f = w0 / 2^32 + t / 2^45, at every
    index. float32 far below fp16's min normal (33 dropped bits): (2 w0 + 1) 2^-57, f = (2 w0 + 1) /
    2^33, at the indices whose w0 has 23 bits (the significand has 24)."""
    words = np.array([reference_word(KEY, i, 0) for i in range(n)], dtype=np.int64)
    if dtype == np.float64:
        t = 1 + (np.arange(n) * 2654435761) % (2**13 - 1)
        return 1.0 + (words * 2**13 + t) * 2.0**-52, np.arange(n)
    x = np.full(n, 0.3, dtype=np.float32)
    tied = np.flatnonzero((words >= 2**22) & (words < 2**23))
    x[tied] = ((2 * words[tied] + 1) * 2.0**-57).astype(np.float32)
    return x, tied


@pytest.mark.parametrize("dtype,name", [(np.float64, "bf16"), (np.float32, "fp16")], ids=["float64-bf16", "float32-fp16"])
def test_stochastic_ties_read_the_next_word_like_the_oracle(dtype, name):
    fmt = PRESETS[name]
    x, tied = _tied_inputs(dtype, 64 if dtype == np.float64 else 40_000)
    assert len(tied) >= 16
    got = quantize(x, fmt, "stochastic", seed=KEY)
    expected = [exact.round_value(float(x[i]), fmt, "stochastic", random_fraction=reference_fraction(KEY, int(i), 4))
                for i in tied]
    assert_same_bits(got[tied], np.array(expected), inputs=x[tied])
    assert_same_bits(got, _engine(x, fmt, False, KEY, **_options("stochastic", False, False, False, None)), inputs=x)


# ------------------------------------------------ through the public API
@pytest.mark.parametrize("fmt", KERNEL_PRESETS, ids=fmt_id)
def test_quantize_and_encode_use_the_kernel_bits(fmt):
    """quantize/encode on float32 and float64 numpy arrays (the kernel) == the numpy engine, and the
    float32 answers == those of the same values as float64 (single rounding from the exact value)."""
    x = _bit_pattern_inputs(seed=41, n_random=5000)
    x = x[codable(x, fmt)]  # quantize refuses the others (the kernel itself is compared above)
    for rounding in DETERMINISTIC + ("stochastic",):
        seed = KEY if rounding == "stochastic" else None
        options = _options(rounding, False, False, False, None)
        for saturate in (False, True):
            options["saturate"] = saturate
            got = quantize(x, fmt, rounding, saturate, seed)
            assert got.dtype == np.float32
            assert_same_codes(got.view(np.uint32), _engine(x, fmt, False, **options).view(np.uint32))
            wide = quantize(x.astype(np.float64), fmt, rounding, saturate, seed)
            assert wide.dtype == np.float64
            assert_same_bits(got, wide, inputs=x)
            xc = _code_inputs(x, fmt)
            codes = encode(xc, fmt, rounding, saturate, seed)
            assert_same_codes(codes, _engine(xc, fmt, True, **options))
            assert_same_codes(codes, encode(xc.astype(np.float64), fmt, rounding, saturate, seed))


def test_non_contiguous_and_multidimensional_input():
    x = _bit_pattern_inputs(seed=42, n_random=4096)[:4096].reshape(64, 64)
    view = x[::2, ::3]
    options = _options("nearest_even", False, False, False, None)
    for dtype in (np.float32, np.float64):
        v = view.astype(dtype)[:, ::-1]
        got = quantize(v, "e4m3")
        assert got.shape == v.shape
        assert_same_bits(got, _engine(np.ascontiguousarray(v), PRESETS["e4m3"], False, **options))
        # stochastic: element (i, j) draws the words of its C-order index, whatever the memory layout
        s = quantize(v, "e4m3", "stochastic", seed=3)
        assert_same_bits(s, quantize(np.ascontiguousarray(v), "e4m3", "stochastic", seed=3))


def test_float16_input_encodes_through_the_kernel_like_the_engine():
    x = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    options = _options("nearest_even", False, False, False, None)
    for name in ("e4m3", "e5m2", "bf16"):
        xc = _code_inputs(x.astype(np.float32), PRESETS[name]).astype(np.float16)
        assert_same_codes(encode(xc, name), _engine(xc.astype(np.float32), PRESETS[name], True, **options))


@requires_torch
@pytest.mark.parametrize("fmt", KERNEL_PRESETS, ids=fmt_id)
def test_torch_cpu_tensors_go_through_the_kernel(fmt):
    x = _bit_pattern_inputs(seed=43, n_random=5000)
    x = x[codable(x, fmt)]  # quantize refuses the others (the kernel itself is compared above)
    for dtype in (torch.float32, torch.float64):
        t = torch.from_numpy(x).to(dtype)
        for rounding in DETERMINISTIC + ("stochastic",):
            seed = KEY if rounding == "stochastic" else None
            got = quantize(t, fmt, rounding, seed=seed)
            assert isinstance(got, torch.Tensor) and got.dtype == dtype and got.device.type == "cpu"
            options = _options(rounding, False, False, False, None)
            expected = round_bits(t, fmt, _arrays.Ops(t), stream=philox.Stream(KEY) if seed else None, **options)
            assert_same_bits(got.numpy(), expected.numpy())  # the torch engine
            assert_same_bits(got.numpy(), quantize(t.numpy(), fmt, rounding, seed=seed))


@requires_torch
def test_torch_integer_tensors_go_through_the_kernel():
    x = _integer_inputs(np.int64, seed=9)
    for rounding in ("nearest_even", "stochastic"):
        got = quantize(torch.from_numpy(x), "bf16", rounding, seed=KEY)
        assert got.dtype == torch.float64
        assert_same_bits(got.numpy(), quantize(x, "bf16", rounding, seed=KEY))
