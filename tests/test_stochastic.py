"""Stochastic rounding: single draws against the exact oracle, neighbours only, unbiasedness,
rand_bits truncation, far below the spacing, seeds and generators, the same bits everywhere.

Single draws: the engine's round_bits reads each element's uniform U = 0.w0 w1 w2 ... (32-bit
words, from a stream: Philox, or here words the test chooses) and rounds a magnitude away from
zero when U < f, f the exact fraction of the spacing it lies beyond its lower neighbour (f
truncated to r bits with rand_bits=r). The oracle exact.round_value does the same from its
definition with random_fraction u = U (here exactly the 96 bits of the three chosen words, the
rest 0). Words are chosen at random, at the extremes, and equal to f's own leading words, so
that the engine has to read further words (which a random U does with probability 2^-32).
End to end: quantize(x, seed=s) is held to the oracle with U computed by an independent Philox
(foundation_helpers.reference_word, itself held to Random123's known answers in test_philox.py).

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
from hypothesis import strategies as st

from fpsim import _arrays, _native, exact, philox
from fpsim._engine import round_bits
from fpsim.formats import Format, format as get_format
from fpsim.rounding import quantize

from foundation_helpers import (assert_same_bits, as_float64, format_inputs, random_inputs, reference_fraction,
                                requires_torch, torch)

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


class GivenWords:
    """A stream of chosen words: words[j][i] is word j of element i's U; deeper words are 0."""

    def __init__(self, words, like):
        self.torch = _arrays.is_torch(like)
        self.words_ = [self._array(w) for w in words]

    def _array(self, w):
        return torch.tensor(w, dtype=torch.int64) if self.torch else np.array(w, dtype=np.int64)

    def _depth(self, depth: int, n: int):
        return self.words_[depth] if depth < len(self.words_) else self._array([0] * n)

    def leading_words(self, depth, n, ops):
        return self._depth(depth, n)[:n]

    def words(self, depth, index, ops):
        return self._depth(depth, len(self.words_[0]))[index]


def _position_words(x: float, fmt: Format, rand_bits) -> tuple[int, int, int]:
    """The first three 32-bit words of f (the exact position of |x| between its neighbours),
    truncated to rand_bits when given."""
    _, _, p = exact.stochastic_neighbours(x, fmt)
    if rand_bits is not None:
        p = Fraction(math.floor(p * 2**rand_bits), 2**rand_bits)
    scaled = math.floor(p * 2**96)
    return scaled >> 64, (scaled >> 32) & 0xFFFFFFFF, scaled & 0xFFFFFFFF


@st.composite
def _u_words(draw, x: float, fmt: Format, rand_bits):
    """Three words of U for input x: random, extreme, or equal to f's leading words (and off by one)."""
    finite = math.isfinite(x) and (x != 0 or not fmt.zero)
    kind = draw(st.sampled_from(["random", "extreme", "tie", "tie", "tie2"] if finite else ["random"]))
    word = st.integers(0, 2**32 - 1)
    if kind == "random":
        return draw(word), draw(word), draw(word)
    if kind == "extreme":
        return tuple(draw(st.sampled_from([0, 1, 2**31, 2**32 - 1])) for _ in range(3))
    d0, d1, d2 = _position_words(x, fmt, rand_bits)
    nudge = draw(st.sampled_from([-1, 0, 0, 1]))
    if kind == "tie":
        return d0, min(max(d1 + nudge, 0), 2**32 - 1), draw(word)
    return d0, d1, min(max(d2 + nudge, 0), 2**32 - 1)


def _engine_draw(x: np.ndarray, fmt: Format, words, rand_bits, saturate, flush_in, flush_out, backend):
    w = torch.from_numpy(x) if backend == "torch" else x
    return round_bits(w, fmt, _arrays.Ops(w), rounding="stochastic", saturate=saturate, rand_bits=rand_bits,
                      flush_inputs=flush_in, flush_outputs=flush_out, stream=GivenWords(words, w))


def _check_single_draws(data, fmt, dtype, backend):
    dtype = _working_dtype(fmt, dtype)
    x = data.draw(format_inputs(fmt, dtype))
    saturate, flush_in, flush_out = data.draw(st.tuples(st.booleans(), st.booleans(), st.booleans()))
    if len(x) == 0:
        return
    rand_bits = data.draw(st.one_of(st.none(), st.integers(1, 8), st.integers(9, 52)))
    per_element = [data.draw(_u_words(float(v), fmt, rand_bits)) for v in x]
    words = [list(ws) for ws in zip(*per_element)]
    got = _engine_draw(x, fmt, words, rand_bits, saturate, flush_in, flush_out, backend)
    expected = [exact.round_value(float(v), fmt, "stochastic", saturate, flush_subnormal_inputs=flush_in,
                                  flush_subnormal_outputs=flush_out, rand_bits=rand_bits,
                                  random_fraction=Fraction((w0 << 64) | (w1 << 32) | w2, 2**96))
                for v, (w0, w1, w2) in zip(x, per_element)]
    assert_same_bits(got, np.array(expected), nan_sign=False, inputs=x,
                     what=f"{fmt.name} rand_bits={rand_bits} words={per_element}: ")


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


# ------------------------------------------------- far below the spacing, exactly
FAR_BELOW = [  # (format, input, dtype): f = |x| / spacing far below 2^-26 (float32) and 2^-55 (float64)
    ("fp16", 2.0**-60, np.float32), ("e4m3", 2.0**-100, np.float32), ("e5m2", 2.0**-149, np.float32),
    ("fp16", 2.0**-100, np.float64), ("e4m3", 3 * 2.0**-900, np.float64), ("bf16", 2.0**-1074, np.float64),
    ("e5m2", 1e-300, np.float64), ("e3m2", 3 * 2.0**-140, np.float32),
]


@pytest.mark.parametrize("name,x,dtype", FAR_BELOW, ids=lambda v: v.__name__ if isinstance(v, type) else str(v))
@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_far_below_the_spacing_rounds_up_exactly_when_u_is_below_f(name, x, dtype, backend):
    """P(up) = f exactly however small: U just below f rounds up, U = f or just above does not."""
    if backend == "torch" and torch is None:
        pytest.skip("torch is not installed")
    fmt = get_format(name)
    low, high, p = exact.stochastic_neighbours(x, fmt)
    assert low == 0 and 0 < p < Fraction(1, 2**26)
    scale = 2 ** (32 * 40)  # U to 40 words: enough below every f here
    f_words = math.floor(p * scale)
    cases = {f_words - 1: high, f_words: low if f_words == p * scale else high, f_words + 1: low, 0: high}
    for u, expected in cases.items():
        words = [[(u >> (32 * (39 - j))) & 0xFFFFFFFF] for j in range(40)]
        arr = np.array([x], dtype=dtype)
        got = _engine_draw(arr, fmt, words, None, False, False, False, backend)
        assert as_float64(got)[0] == expected, (u, p)
        assert exact.round_value(x, fmt, "stochastic", random_fraction=Fraction(u, scale)) == expected


# ------------------------------------------------------- the same bits everywhere
SEED = 0x9E3779B97F4A7C15


def _mixed_inputs(n: int, seed: int) -> np.ndarray:
    x = random_inputs(n, np.float32, seed=seed)
    return x[np.isfinite(x)]


@pytest.mark.parametrize("name", ["e4m3", "e2m1", "bf16", "fp16", "e8m0"])
def test_seed_draws_follow_the_documented_stream(name):
    """quantize(x, seed=s)[i] is the oracle's rounding of x[i] with U = Philox word(s, i, 0..2)
    (an independent Philox: foundation_helpers.reference_word), for float32 and float64 input."""
    fmt = get_format(name)
    x = _mixed_inputs(600, seed=50)
    if not fmt.signed:
        x = np.abs(x)
    for dtype in (np.float32, np.float64):
        got = as_float64(quantize(x.astype(dtype), fmt, "stochastic", seed=SEED))
        expected = [exact.round_value(float(v), fmt, "stochastic", random_fraction=reference_fraction(SEED, i, 3))
                    for i, v in enumerate(x)]
        assert_same_bits(got, np.array(expected), nan_sign=False, inputs=x)


@pytest.mark.parametrize("name", ["e4m3", "e5m2", "e2m1", "bf16", "fp16", "tf32", "e8m0"])
@pytest.mark.parametrize("rand_bits", [None, 4, 20, 40])
def test_a_seed_gives_the_same_bits_everywhere(name, rand_bits):
    """numpy float32 and float64, the compiled kernel or the numpy engine, torch CPU tensors (and
    CUDA tensors where a GPU is present): one seed, one result."""
    fmt = get_format(name)
    x = _mixed_inputs(20_000, seed=51)
    if not fmt.signed:
        x = np.abs(x)
    reference = quantize(x, fmt, "stochastic", seed=SEED, rand_bits=rand_bits)
    assert_same_bits(quantize(x.astype(np.float64), fmt, "stochastic", seed=SEED, rand_bits=rand_bits), reference)
    engine = round_bits(x, fmt, _arrays.Ops(x), rounding="stochastic", saturate=False, rand_bits=rand_bits,
                        stream=philox.Stream(SEED))
    assert_same_bits(engine, reference)
    if torch is not None:
        devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
        for device in devices:
            t = torch.from_numpy(x).to(device)
            assert_same_bits(quantize(t, fmt, "stochastic", seed=SEED, rand_bits=rand_bits).cpu().numpy(), reference)
            engine_t = round_bits(t, fmt, _arrays.Ops(t), rounding="stochastic", saturate=False, rand_bits=rand_bits,
                                  stream=philox.Stream(SEED))
            assert_same_bits(engine_t.cpu().numpy(), reference)


def test_generator_draws_the_key():
    """generator=g takes the key from g (two 32-bit draws, low word first) and so advances it."""
    x = _mixed_inputs(5000, seed=52)
    low, high = np.random.default_rng(11).integers(0, 2**32, size=2, dtype=np.uint64)
    expected = quantize(x, "e4m3", "stochastic", seed=int(low) | int(high) << 32)
    assert_same_bits(quantize(x, "e4m3", "stochastic", generator=np.random.default_rng(11)), expected)
    if torch is not None:
        words = torch.randint(0, 2**32, (2,), generator=torch.Generator().manual_seed(11), dtype=torch.int64)
        t = quantize(torch.from_numpy(x), "e4m3", "stochastic", generator=torch.Generator().manual_seed(11))
        assert_same_bits(t.numpy(), quantize(x, "e4m3", "stochastic", seed=int(words[0]) | int(words[1]) << 32))


@pytest.mark.skipif(not _native.available(), reason="the compiled kernel is not built")
def test_the_kernel_and_the_engine_agree_on_integers():
    x = np.arange(-3000, 3000, dtype=np.int32) * 7
    kernel = quantize(x, "e4m3", "stochastic", seed=SEED)
    engine = round_bits(x.astype(np.float64), get_format("e4m3"), _arrays.Ops(x.astype(np.float64)),
                        rounding="stochastic", saturate=False, stream=philox.Stream(SEED))
    assert_same_bits(kernel, engine)
