"""Stochastic rounding: single draws against the exact oracle, neighbours only, unbiasedness,
rand_bits truncation, seeds and generators.

Single draws: the engine's round_bits takes the random integers (random_ints)
that decide each rounding; it rounds a magnitude up when draw + (position of
the input between its neighbours, as an r-bit integer T) carries out of r bits,
i.e. when k >= 2^r - T. The oracle exact.round_value rounds up when a uniform
u in [0, 1) is below the position. Both are exact stochastic rounding; draw k
is the oracle's u = (2^r - 1 - k) / 2^r (then k >= 2^r - T <=> u * 2^r < T).

Statistical tests use Chernoff bounds (valid for every p and sample size, no
normal approximation): for X ~ Binomial(n, p), mu = n p,
  P(X >= (1 + d) mu) <= exp(-d^2 mu / (2 + d)),  P(X <= (1 - d) mu) <= exp(-d^2 mu / 2).
Each check's two thresholds are set so that its false-failure probability is at
most ALPHA_TOTAL / number of checks in the file, so that a correct
implementation fails any of them with probability <= 1e-6 in all (union
bound) over the choice of seed. The seeds are fixed, so the tests are
deterministic; changing a seed keeps that guarantee.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fpsim import _arrays, exact
from fpsim.formats import Format, format as get_format
from fpsim.rounding import quantize, round_bits

from foundation_helpers import (assert_same_bits, as_float64, custom_formats, format_inputs,
                      preset_formats, random_inputs, requires_torch, torch)

ALPHA_TOTAL = 1e-6
N_CHECKS = 200  # upper bound on the number of binomial checks made in this file
ALPHA = ALPHA_TOTAL / N_CHECKS


def binomial_bounds(n: int, p: float, alpha: float = ALPHA) -> tuple[float, float]:
    """[lo, hi] such that a Binomial(n, p) count falls outside with probability <= alpha (Chernoff)."""
    mu = n * p
    if mu == 0:
        return 0.0, 0.0
    L = math.log(2 / alpha)  # alpha/2 per side
    d_hi = (L + math.sqrt(L * L + 8 * mu * L)) / (2 * mu)  # solves d^2 mu / (2 + d) = L
    d_lo = math.sqrt(2 * L / mu)
    return max(0.0, (1 - d_lo) * mu), (1 + d_hi) * mu


def test_binomial_bounds_are_sane():
    lo, hi = binomial_bounds(10**6, 0.5)
    assert 0.49 * 10**6 < lo < 0.5 * 10**6 < hi < 0.51 * 10**6
    lo, hi = binomial_bounds(10**5, 2.0**-16)
    assert lo == 0 and 1.5 < hi < 60  # mu = 1.5: wide, but an 8x bias (mu' = 12500) cannot pass


# -------------------------------------------------------- single draws
def _working_dtype(fmt: Format, dtype):
    """The engine works in float32 only for formats float32 holds (quantize does the same)."""
    fits = (fmt.man_bits <= 23 and fmt.max <= Fraction(float(np.finfo(np.float32).max))
            and fmt.min_subnormal >= Fraction(2) ** -149)
    return dtype if (dtype is np.float64 or fits) else np.float64


def _far_below_quantum(fmt: Format, x: np.ndarray) -> np.ndarray:
    """Inputs more than P + 3 bits below the format's spacing at their magnitude (P: the input's
    mantissa bits): the engine clips its shift there, see test_stochastic_far_below_the_quantum."""
    P = 23 if x.dtype == np.float32 else 52
    info = np.finfo(x.dtype)
    out = np.zeros(x.shape, dtype=bool)
    for i, v in enumerate(x):
        v = float(v)
        if not math.isfinite(v) or v == 0:
            continue
        a = abs(Fraction(v))
        lsb = max(exact.floor_log2(a), int(np.log2(info.tiny))) - P
        q = exact.floor_log2(exact.quantum(fmt, a))
        out[i] = q - lsb > P + 3
    return out


def _engine_draw(x: np.ndarray, fmt: Format, draws, rand_bits, saturate, flush_in, flush_out, backend):
    if backend == "torch":
        w = torch.from_numpy(x)
        ints = torch.tensor(draws, dtype=torch.int64)
    else:
        w, ints = x, np.array(draws, dtype=np.int64)
    return round_bits(w, fmt, _arrays.Ops(w), rounding="stochastic", saturate=saturate, rand_bits=rand_bits,
                      flush_inputs=flush_in, flush_outputs=flush_out, random_ints=ints)


def _check_single_draws(data, fmt, dtype, backend):
    dtype = _working_dtype(fmt, dtype)
    x = data.draw(format_inputs(fmt, dtype))
    saturate, flush_in, flush_out = data.draw(st.tuples(st.booleans(), st.booleans(), st.booleans()))
    x = x[~_far_below_quantum(fmt, x)]
    if len(x) == 0:
        return
    rand_bits = data.draw(st.one_of(st.none(), st.integers(1, 8), st.integers(9, 52)))
    r = rand_bits if rand_bits is not None else (23 if dtype is np.float32 else 52) + 3
    top = (1 << r) - 1
    k_strategy = st.one_of(st.integers(0, top), st.sampled_from([0, 1, top, top - 1, 1 << (r - 1),
                                                               (1 << (r - 1)) - 1]))
    draws = data.draw(st.lists(k_strategy, min_size=len(x), max_size=len(x)))
    got = _engine_draw(x, fmt, draws, rand_bits, saturate, flush_in, flush_out, backend)
    expected = [exact.round_value(float(v), fmt, "stochastic", saturate, flush_subnormal_inputs=flush_in,
                                  flush_subnormal_outputs=flush_out, rand_bits=rand_bits,
                                  random_fraction=Fraction(top - k, 1 << r)) for v, k in zip(x, draws)]
    assert_same_bits(got, np.array(expected), nan_sign=False, inputs=x,
                     what=f"{fmt.name} rand_bits={rand_bits} draws={draws}: ")


@settings(deadline=None, max_examples=250, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), preset_formats, st.sampled_from([np.float32, np.float64]))
def test_single_draws_match_the_oracle_presets(data, fmt, dtype):
    _check_single_draws(data, fmt, dtype, "numpy")


@settings(deadline=None, max_examples=250,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(st.data(), custom_formats(), st.sampled_from([np.float32, np.float64]))
def test_single_draws_match_the_oracle_custom_formats(data, fmt, dtype):
    _check_single_draws(data, fmt, dtype, "numpy")


@requires_torch
@settings(deadline=None, max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), preset_formats, st.sampled_from([np.float32, np.float64]))
def test_single_draws_match_the_oracle_torch(data, fmt, dtype):
    _check_single_draws(data, fmt, dtype, "torch")


# --------------------------------------------------- neighbours only
@pytest.mark.parametrize("name", ["e4m3", "e5m2", "e4m3fnuz", "e2m1", "e3m2", "e8m0", "bf16", "fp16", "tf32"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_results_are_one_of_the_two_neighbours(name, dtype):
    fmt = get_format(name)
    x = random_inputs(600, dtype, seed=20)
    x = x[np.isfinite(x)]
    if not fmt.signed:
        x = np.abs(x)
    scale = float(fmt.max) / 4
    x = np.concatenate([x, (x[:300] / np.max(np.abs(x[:300]))) * scale]).astype(dtype)
    x = x[(np.abs(x) <= float(fmt.max)) & (x != 0)]
    got = as_float64(quantize(np.repeat(x, 8), fmt, "stochastic", seed=21)).reshape(-1, 8)
    for v, results in zip(x, got):
        low, high, _ = exact.stochastic_neighbours(float(v), fmt)
        for r in results:
            assert (r == low and np.signbit(r) == np.signbit(low)) or r == high, (v, r, low, high)


@pytest.mark.parametrize("name", ["e4m3", "e2m1", "bf16", "e8m0"])
def test_representable_values_never_move(name):
    values = np.array([v for v in exact.all_values(name) if v != 0] + [0.0] * get_format(name).zero)
    x = np.repeat(values, 50 if len(values) < 1000 else 1)
    assert_same_bits(quantize(x, name, "stochastic", seed=22), x)
    assert_same_bits(quantize(x.astype(np.float32), name, "stochastic", seed=23), x)


# ---------------------------------------------------------- unbiasedness
# (format, lower neighbour lo, position p in (0, 1)) -> input lo + p * (hi - lo), exact in float32
POSITIONS = [
    ("e4m3", 1.0, 0.5), ("e4m3", 1.0, 1 / 8), ("e4m3", 1.0, 7 / 8), ("e4m3", 256.0, 3 / 16),
    ("e4m3", 2.0**-9, 0.25),                      # subnormal
    ("e4m3", 0.0, 0.75),                          # between 0 and the smallest subnormal
    ("e5m2", 57344.0, 0.5),                       # between max and the overflow point: NaN/Inf half the time
    ("bf16", 1.0, 2.0**-15), ("bf16", 3.0, 1 - 2.0**-15), ("bf16", 1.0, 1 / 3 - (1 / 3) % 2.0**-16),
    ("fp16", 2.0**-24, 0.5), ("fp16", 0.0, 0.125),
    ("e2m1", 4.0, 0.375), ("e8m0", 2.0**10, 0.3125),
]


def _input_at(name: str, lo: float, p: float) -> tuple[float, float]:
    fmt = get_format(name)
    hi = lo + float(exact.quantum(fmt, Fraction(lo))) if lo > 0 else float(fmt.min_subnormal)
    x = lo + p * (hi - lo)
    low, high, prob = exact.stochastic_neighbours(x, fmt)
    assert (low, float(prob)) == (lo, p)  # the input sits where intended
    return x, hi


@pytest.mark.parametrize("name,lo,p", POSITIONS, ids=[f"{n}-{lo:g}-{p:.4g}" for n, lo, p in POSITIONS])
@pytest.mark.parametrize("backend", ["numpy32", "numpy64", "torch32"])
def test_stochastic_rounding_is_unbiased(name, lo, p, backend):
    """The count of rounds up is Binomial(n, p): checked with Chernoff bounds (false failure <= ALPHA)."""
    if backend == "torch32" and torch is None:
        pytest.skip("torch is not installed")
    fmt = get_format(name)
    x, hi = _input_at(name, lo, p)
    n = 200_000
    seed = 1000 + POSITIONS.index((name, lo, p)) * 3 + ["numpy32", "numpy64", "torch32"].index(backend)
    arr = np.full(n, x, dtype=np.float64 if backend == "numpy64" else np.float32)
    got = quantize(torch.from_numpy(arr) if backend == "torch32" else arr, fmt, "stochastic", seed=seed)
    got = as_float64(got)
    up = ~(got == lo)
    assert np.all((got == lo) | (got == hi) | (np.isnan(got) | np.isinf(got)) & (hi > float(fmt.max)))
    lo_b, hi_b = binomial_bounds(n, p)
    assert lo_b <= up.sum() <= hi_b, f"{up.sum()} rounds up of {n}, expected {n * p:.1f} in [{lo_b:.1f}, {hi_b:.1f}]"


@pytest.mark.parametrize("name,x,dtype", [
    ("fp16", 2.0**-40, np.float32), ("fp16", 2.0**-30, np.float32), ("e4m3", 2.0**-40, np.float32),
    ("e5m2", 1e-12, np.float32), ("fp16", 2.0**-90, np.float64), ("bf16", 2.0**-200, np.float64),
    ("e4m3", 2.0**-70, np.float64)], ids=lambda v: v.__name__ if isinstance(v, type) else str(v))
def test_stochastic_far_below_the_quantum(name, x, dtype):
    fmt = get_format(name)
    n = 200_000
    low, high, prob = exact.stochastic_neighbours(x, fmt)
    assert low == 0 and dtype(x) == x and prob > 0
    got = as_float64(quantize(np.full(n, x, dtype=dtype), fmt, "stochastic", seed=31))
    lo_b, hi_b = binomial_bounds(n, float(prob))
    assert lo_b <= (got != 0).sum() <= hi_b, f"{(got != 0).sum()} of {n} up, expected {n * float(prob):.3g}"


# ------------------------------------------------------------- rand_bits
@pytest.mark.parametrize("rand_bits,p", [(1, 0.75), (2, 0.3125), (2, 0.875), (3, 0.4375), (4, 0.53125),
                                         (8, 19912 / 65536)])
@pytest.mark.parametrize("backend", ["numpy32", "numpy64", "torch32"])
def test_rand_bits_truncates_the_probability(rand_bits, p, backend):
    """With r random bits the probability of rounding up is floor(p * 2^r) / 2^r."""
    if backend == "torch32" and torch is None:
        pytest.skip("torch is not installed")
    x, hi = _input_at("bf16", 1.0, p)
    n = 100_000
    arr = np.full(n, x, dtype=np.float64 if backend == "numpy64" else np.float32)
    got = quantize(torch.from_numpy(arr) if backend == "torch32" else arr, "bf16", "stochastic",
                   seed=rand_bits * 7 + int(p * 1000), rand_bits=rand_bits)
    up = (as_float64(got) == hi).sum()
    truncated = math.floor(p * 2**rand_bits) / 2**rand_bits
    assert truncated != p
    lo_b, hi_b = binomial_bounds(n, truncated)
    assert lo_b <= up <= hi_b, f"{up} up of {n}: expected about {n * truncated} (p={p} truncated to {truncated})"
    other_lo, other_hi = binomial_bounds(n, p)
    if other_lo > hi_b:  # where the two hypotheses are told apart, the untruncated one is ruled out
        assert not (other_lo <= up <= other_hi)


@pytest.mark.parametrize("rand_bits", [27, 32, 33, 40, 52])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_many_rand_bits_are_accepted_and_unbiased(rand_bits, dtype):
    """rand_bits may be anything in 1..52; with more bits than the position has, rounding is exact."""
    p = 0.3125
    x, hi = _input_at("bf16", 1.0, p)
    n = 100_000
    got = quantize(np.full(n, x, dtype=dtype), "bf16", "stochastic", seed=rand_bits, rand_bits=rand_bits)
    up = (as_float64(got) == hi).sum()
    lo_b, hi_b = binomial_bounds(n, p)
    assert lo_b <= up <= hi_b


@pytest.mark.parametrize("rand_bits", [1, 3, 6])
def test_positions_below_one_random_step_never_round_up(rand_bits):
    """p < 2^-r truncates to 0: never rounds up (deterministic)."""
    p = 2.0 ** -(rand_bits + 1)
    x, _ = _input_at("bf16", 1.0, p)
    got = quantize(np.full(50_000, x, dtype=np.float32), "bf16", "stochastic", seed=5, rand_bits=rand_bits)
    assert np.all(got == 1.0)


# ------------------------------------------------- seeds and generators
def test_seed_makes_it_reproducible():
    x = np.linspace(-3, 3, 10_000, dtype=np.float32) + np.float32(0.01)
    a = quantize(x, "e4m3", "stochastic", seed=123)
    b = quantize(x, "e4m3", "stochastic", seed=123)
    c = quantize(x, "e4m3", "stochastic", seed=124)
    assert_same_bits(a, b)
    assert not np.array_equal(a, c)  # identical with probability far below 1e-100


def test_numpy_generator_is_accepted_and_advances():
    x = np.linspace(-3, 3, 10_000) + 0.01
    a = quantize(x, "e4m3", "stochastic", generator=np.random.default_rng(7))
    b = quantize(x, "e4m3", "stochastic", generator=np.random.default_rng(7))
    assert_same_bits(a, b)
    g = np.random.default_rng(7)
    first = quantize(x, "e4m3", "stochastic", generator=g)
    second = quantize(x, "e4m3", "stochastic", generator=g)
    assert_same_bits(first, a)
    assert not np.array_equal(first, second)


@requires_torch
def test_torch_generator_and_seed():
    x = torch.linspace(-3, 3, 10_000) + 0.01
    g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    a = quantize(x, "e4m3", "stochastic", generator=g1)
    b = quantize(x, "e4m3", "stochastic", generator=g2)
    assert isinstance(a, torch.Tensor) and a.dtype == torch.float32
    assert torch.equal(a, b)
    assert not torch.equal(a, quantize(x, "e4m3", "stochastic", generator=g1))
    assert torch.equal(quantize(x, "e4m3", "stochastic", seed=3), quantize(x, "e4m3", "stochastic", seed=3))


def test_fresh_entropy_without_seed():
    x = np.linspace(-3, 3, 10_000, dtype=np.float32) + np.float32(0.01)
    a = quantize(x, "e4m3", "stochastic")
    b = quantize(x, "e4m3", "stochastic")
    assert not np.array_equal(a, b)  # identical with probability far below 1e-100
    if torch is not None:
        t = torch.from_numpy(x)
        assert not torch.equal(quantize(t, "e4m3", "stochastic"), quantize(t, "e4m3", "stochastic"))


def test_deterministic_modes_ignore_seed():
    x = np.linspace(-3, 3, 1000, dtype=np.float32)
    assert_same_bits(quantize(x, "e4m3", "nearest_even", seed=1), quantize(x, "e4m3", "nearest_even"))
