"""The log2 histograms are exact: checked against an independent numpy count and against the rounding engine."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import fpsim
from fpsim.analyze.histogram import Log2Counter, Log2Histogram, kernel_available
from fpsim.analyze.limits import FormatLimits

from analyze_helpers import assert_same, numpy_count, observed


def awkward_values(n: int, seed: int, dtype=np.float32) -> np.ndarray:
    """Values at every scale of float32, with powers of two, subnormals, signed zeros, Inf and NaN."""
    rng = np.random.default_rng(seed)
    scales = np.ldexp(1.0, rng.integers(-150, 128, size=n))
    with np.errstate(over="ignore"):
        values = (rng.standard_normal(n) * scales).astype(dtype)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 2.0**-149, -(2.0**-149), 2.0**-126, 2.0**-127,
                         1.0, -0.5, 2.0**127, np.finfo(np.float32).max, np.finfo(np.float32).tiny,
                         3 * 2.0**-140], dtype=dtype)
    powers = np.ldexp(1.0, rng.integers(-126, 128, size=n // 10)).astype(dtype) * rng.choice([-1, 1], n // 10)
    return np.concatenate([values, specials, powers.astype(dtype)])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_float32_counts_match_numpy(seed):
    values = awkward_values(50_000, seed)
    assert_same(observed(torch.from_numpy(values)), numpy_count(values))


def test_large_tensor_counted_in_chunks_is_exact():
    values = awkward_values(400_000, 7)  # above the CPU chunking size
    assert_same(observed(torch.from_numpy(values)), numpy_count(values))


def test_non_contiguous_and_16_bit_inputs():
    values = awkward_values(4096, 3)
    t = torch.from_numpy(values[:4096].reshape(64, 64)).t()  # transposed view
    assert_same(observed(t), numpy_count(t.numpy()))
    for dtype in (torch.float16, torch.bfloat16):
        small = torch.from_numpy(values).to(dtype)
        assert_same(observed(small), numpy_count(small.float().numpy()))


def test_float64_counts_keep_huge_and_tiny_apart():
    v = np.array([1e300, -1e300, 1e-300, 2.0**-126, 2.0**127, 3.0, 0.0, np.nan, -np.inf], dtype=np.float64)
    hist = observed(torch.from_numpy(v))
    assert_same(hist, numpy_count(v))
    assert hist.huge == 2 and hist.tiny == 1


def test_amax_is_exact_and_propagates_nan():
    counter = Log2Counter()
    _, amax = counter.count(torch.tensor([-3.5, 2.0, 1e-30]))
    assert float(amax) == 3.5
    _, amax = counter.count(torch.tensor([1.0, float("nan")]))
    assert math.isnan(float(amax))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_negative_bit_views_count_as_their_values(dtype):
    # a tensor whose negation is lazy (torch._neg_view; the kernel does not read these) raised in the
    # torch path, which read its bits; it counts as the values it holds
    v = torch.tensor([-3.5, 2.0, 1e-30, 0.0, -0.0, float("inf")], dtype=dtype)
    view = torch._neg_view(v)
    assert view.is_neg()
    for kernel in (True, False):
        counts, amax, mass = Log2Counter(kernel=kernel).count(view, mass=True)
        want_counts, want_amax, want_mass = Log2Counter(kernel=kernel).count(-v, mass=True)
        assert torch.equal(torch.as_tensor(counts), torch.as_tensor(want_counts))
        assert float(amax) == float(want_amax) and torch.equal(torch.as_tensor(mass), torch.as_tensor(want_mass))


def test_json_round_trip():
    values = awkward_values(5000, 4)
    hist = observed(torch.from_numpy(values))
    again = Log2Histogram.from_dict(hist.to_dict())
    assert_same(again, {k: getattr(hist, k) for k in ("counts", "pow2", "tiny", "huge", "zeros", "pos_inf",
                                                      "neg_inf", "nan")})


# ------------------------------------------- fractions against the rounding engine
FORMATS = ["fp16", "bf16", "e4m3", "e5m2", "e4m3fnuz", fpsim.Format(4, 3, nan="fn", subnormals=False),
           fpsim.Format(6, 5)]


def engine_values(seed: int) -> np.ndarray:
    """Finite values in float32's normal range, dense around every binade edge and its powers of two."""
    rng = np.random.default_rng(seed)
    e = rng.integers(-120, 100, size=20_000)
    values = np.ldexp(rng.uniform(1.0, 2.0, size=e.size), e)
    edges = np.ldexp(1.0, np.arange(-120, 100))
    near = np.concatenate([edges, np.nextafter(edges.astype(np.float32), np.float32(0)),
                           np.nextafter(edges.astype(np.float32), np.float32(np.inf))])
    out = np.concatenate([values, near]).astype(np.float32)
    return out * rng.choice([-1, 1], size=out.size).astype(np.float32)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f if isinstance(f, str) else f.name)
def test_underflow_and_overflow_counts_agree_with_quantize(fmt):
    lim = FormatLimits.of(fmt)
    values = engine_values(11)
    hist = observed(torch.from_numpy(values))
    scales = (-20, -3, 0, 5, 13, 24, 40)
    at_once = hist.underflows(lim, scales)
    for scale, counted in zip(scales, at_once.tolist()):
        scaled = values.astype(np.float64) * 2.0**scale
        rounded = np.asarray(fpsim.quantize(scaled, fmt), dtype=np.float64)
        flushed = int(((rounded == 0) & (scaled != 0)).sum())
        assert hist.underflow(lim, scale) == flushed, (scale, hist.underflow(lim, scale), flushed)
        assert counted == flushed, (scale, counted, flushed)
        over = np.array([lim.overflows(v) for v in scaled])
        engine_over = ~np.isfinite(rounded) | (np.abs(rounded) > float(lim.fmt.max))
        np.testing.assert_array_equal(over, engine_over)
        sure, possible = hist.overflow_bounds(lim, scale)
        assert sure <= int(over.sum()) <= possible
        magnitude = np.abs(scaled)
        in_subnormal_range = (magnitude > 2.0**lim.zero_exponent) & (magnitude < 2.0**lim.emin)
        if not lim.tie_to_zero:
            in_subnormal_range |= magnitude == 2.0**lim.zero_exponent
        assert hist.subnormal(lim, scale) == int(in_subnormal_range.sum())


def test_tiny_values_count_as_underflow_unless_all_survive():
    lim = FormatLimits.of("bf16")   # its zero threshold 2^-134 lies inside float32's subnormal range
    hist = observed(torch.tensor([2.0**-140, 2.0**-130, 1.0]))
    assert hist.tiny == 2
    assert hist.underflow(lim, 0) == 2           # conservative: some of them would survive in bf16
    assert hist.underflow(lim, 20) == 0          # 2^-149 * 2^20 > 2^-134: all survive
    assert hist.underflows(lim, [0, 20]).tolist() == [2, 0]


# ------------------------------------------- the compiled kernel against the torch path and numpy
def values_without_powers_of_two(n: int, seed: int) -> np.ndarray:
    """float32 values with no exact power of two and no Inf (the kernel's two-pass path), zeros of both signs,
    NaN and subnormals included."""
    rng = np.random.default_rng(seed)
    values = (rng.standard_normal(n) * np.ldexp(1.0, rng.integers(-140, 120, size=n))).astype(np.float32)
    bits = values.view(np.uint32)
    bits |= (bits & 0x7FFFFF == 0) & (bits & 0x7F800000 != 0x7F800000)   # a nonzero mantissa everywhere
    specials = np.array([0.0, -0.0, -0.0, np.nan, 3 * 2.0**-149, -(5 * 2.0**-140), 1.5, -1.5 * 2.0**127],
                        dtype=np.float32)
    out = np.concatenate([values, specials])
    assert not np.any((out.view(np.uint32) & 0x7FFFFF == 0) & (out != 0) & ~np.isnan(out))
    return out


@pytest.mark.skipif(not kernel_available(), reason="the compiled kernel was not built")
@pytest.mark.parametrize("n", [100, 4095, 4096, 50_003])
def test_kernel_two_pass_path_matches_numpy_and_torch(n):
    values = values_without_powers_of_two(n, n)
    for array in (values, np.concatenate([values, [np.float32(np.inf)]]), values[::-1].copy()):
        t = torch.from_numpy(array)
        expected = numpy_count(array)
        assert_same(observed(t, kernel=True), expected)
        assert_same(observed(t, kernel=False), expected)


def numpy_mass(values: np.ndarray) -> np.ndarray:
    """Sum of |x| and of x^2 per float32 exponent field of each finite value, in float64 (numpy alone)."""
    v = np.asarray(values, dtype=np.float32).ravel()
    finite = np.isfinite(v)
    field = (v.view(np.uint32) >> 23) & 0xFF
    magnitude = np.abs(v[finite]).astype(np.float64)
    mass = np.zeros(512)
    np.add.at(mass, field[finite], magnitude)
    np.add.at(mass, 256 + field[finite], magnitude**2)
    return mass


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_mass_per_binade_matches_numpy(kernel, dtype):
    if kernel and not kernel_available():
        pytest.skip("the compiled kernel was not built")
    values = awkward_values(20_000, 5)
    t = torch.from_numpy(values).to(dtype)
    widened = t.float().numpy()
    counts, amax, mass = Log2Counter(kernel=kernel).count(t, mass=True)
    assert_same(Log2Histogram.from_raw(np.asarray(counts)), numpy_count(widened))
    np.testing.assert_allclose(np.asarray(mass), numpy_mass(widened), rtol=1e-12, atol=0)
    assert math.isnan(float(amax))   # awkward_values holds a NaN


@pytest.mark.skipif(not kernel_available(), reason="the compiled kernel was not built")
@pytest.mark.parametrize("n", [1, 600, 4095, 4096, 70_000], ids=lambda n: f"n{n}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_count_into_a_row_and_its_record_match_numpy(n, dtype):
    """The hooks' one-call path (Store.count_into: sparse lists below 4096 values, the lanes above) and the
    record that adds the same tensor again under another row, against numpy's counts and mass."""
    from fpsim.analyze.store import Store

    values = awkward_values(n, 11)[-n:] if n > 1 else np.array([np.nan], np.float32)
    t = torch.from_numpy(values).to(dtype)
    widened = t.float().numpy()
    store = Store(n_formats=1)
    first, again = store.row("op", "activation", t), store.row("module", "activation", t)
    amax, record = store.count_into(first, t.data_ptr(), t.numel(), Log2Counter().kind_of(t), step=3)
    store.add_record(again, record, amax, step=4)
    snapshot = store.snapshot()
    for row, step in ((first, 3), (again, 4)):
        assert_same(Log2Histogram.from_raw(snapshot.raw[row]), numpy_count(widened))
        np.testing.assert_allclose(snapshot.mass[row], numpy_mass(widened), rtol=1e-12, atol=0)
        assert math.isnan(snapshot.amax[row]) and snapshot.first_nonfinite[row] == step
    assert list(snapshot.samples) == [1, 1]


# ------------------------------------------- the kernel's vector (AVX2) loops against its scalar loops and numpy
def _vector_path_available() -> bool:
    if not kernel_available():
        return False
    from fpsim import _fasthist

    before = _fasthist.vector_path()
    try:
        return _fasthist.vector_path(True)
    finally:
        _fasthist.vector_path(before)


@pytest.fixture(params=["vector", "scalar"])
def kernel_path(request):
    """Each kernel test runs on both loops: the AVX2 one (where the CPU has it) and the scalar one."""
    if not kernel_available():
        pytest.skip("the compiled kernel was not built")
    if request.param == "vector" and not _vector_path_available():
        pytest.skip("this CPU has no AVX2/F16C: the vector loop is not used here")
    from fpsim import _fasthist

    before = _fasthist.vector_path()
    _fasthist.vector_path(request.param == "vector")
    yield request.param
    _fasthist.vector_path(before)


@pytest.mark.parametrize("n", [7, 4101, 300_007], ids=lambda n: f"n{n}")   # tails; above a 2^18-value chunk
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_both_kernel_loops_count_and_weigh_as_numpy(kernel_path, n, dtype):
    values = awkward_values(n, n)[-n:]
    t = torch.from_numpy(values).to(dtype)
    widened = t.float().numpy()
    counts, amax, mass = Log2Counter(kernel=True).count(t, mass=True)
    assert_same(Log2Histogram.from_raw(np.asarray(counts)), numpy_count(widened))
    np.testing.assert_allclose(np.asarray(mass), numpy_mass(widened), rtol=1e-12, atol=0)
    finite = widened[np.isfinite(widened)]
    expected_amax = math.nan if np.isnan(widened).any() else float(np.abs(widened).max())
    assert float(amax) == expected_amax or (math.isnan(expected_amax) and math.isnan(float(amax)))
    counts_plain, amax_plain = Log2Counter(kernel=True).count(torch.from_numpy(finite).to(dtype))
    assert float(amax_plain) == float(np.abs(finite).max())
    assert_same(Log2Histogram.from_raw(np.asarray(counts_plain)), numpy_count(finite))


def test_float16_subnormals_are_counted_with_denormals_flushed(kernel_path):
    """torch.set_flush_denormal(True) sets the CPU's FTZ/DAZ bits; the float16 widening must not depend on them."""
    subnormals = torch.arange(1, 1024, dtype=torch.int16).view(torch.float16)   # every positive float16 subnormal
    t = torch.cat([subnormals, -subnormals, torch.full((5,), 1.5, dtype=torch.float16)])
    expected = numpy_count(t.float().numpy())
    expected_mass = numpy_mass(t.float().numpy())
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals")
    try:
        counts, amax, mass = Log2Counter(kernel=True).count(t, mass=True)
    finally:
        torch.set_flush_denormal(False)
    assert_same(Log2Histogram.from_raw(np.asarray(counts)), expected)
    np.testing.assert_allclose(np.asarray(mass), expected_mass, rtol=1e-12, atol=0)
    assert float(amax) == 1.5


@pytest.mark.parametrize("n", [5, 300, 70_001], ids=lambda n: f"n{n}")
def test_both_kernel_loops_count_updates_and_lost_updates_as_numpy(kernel_path, n):
    """`updates` against numpy: u = now - before in float32, its classes, and per format the nonzero updates
    whose exponent field is at most the table's limit for the weight's field (subnormal updates always)."""
    from fpsim import _fasthist

    rng = np.random.default_rng(n)
    before = awkward_values(n, n + 1)[-n:]
    step = (rng.standard_normal(n) * np.ldexp(1.0, rng.integers(-150, 5, size=n))).astype(np.float32)
    step[::7] = 0
    with np.errstate(invalid="ignore", over="ignore"):
        now = (before + step).astype(np.float32)
        update = now - before                                     # float32 subtraction, as the kernel's
    n_formats = 6
    last = rng.integers(0, 255, size=(256, n_formats)).astype(np.int32)
    lost = np.zeros(n_formats, np.int64)
    _, pairs = _fasthist.updates(before.ctypes.data, ((now.ctypes.data, n),), last, n_formats, lost)
    raw = np.zeros(1026, np.int64)
    codes = np.frombuffer(pairs, np.int64).reshape(-1, 2)
    raw[codes[:, 0]] = codes[:, 1]
    assert_same(Log2Histogram.from_raw(raw), numpy_count(update))
    t = (update.view(np.uint32) >> 23) & 0xFF
    g = (before.view(np.uint32) >> 23) & 0xFF
    nonzero = (update != 0) | np.isnan(update)
    expected = [int((nonzero & ((t == 0) | (t <= last[g, f]))).sum()) for f in range(n_formats)]
    assert lost.tolist() == expected


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_chunk_of_values_in_one_binade_keeps_its_sum_of_squares(kernel_path, dtype):
    """300,000 values in [1.99, 2): every chunk's squared significands sum past 2^64 within one exponent field
    (2^18 values of nearly 2^48 each), which no integer counter may hold."""
    rng = np.random.default_rng(3)
    values = rng.uniform(1.99, 2.0, size=300_000).astype(np.float32)
    t = torch.from_numpy(values).to(dtype)
    widened = t.float().numpy()
    counts, amax, mass = Log2Counter(kernel=True).count(t, mass=True)
    np.testing.assert_allclose(np.asarray(mass), numpy_mass(widened), rtol=1e-12, atol=0)
    assert_same(Log2Histogram.from_raw(np.asarray(counts)), numpy_count(widened))
