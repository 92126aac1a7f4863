"""Random rows and inputs of a capture: reproducible from a seed, exactly values of their formats.

* `random_rows`: ``wide`` rows (random signs, exponents uniform over the input
  format's normal range, limited so that products and sums stay finite in the
  output format, random significands; c of random exponent in the products'
  range) and ``upstream`` rows (the upstream captures' distribution: a, b
  N(0, 1) rounded to the input format, c uniform on [0, 1) rounded to the c
  format);
* `rounded`: values rounded to a format as the recorded captures' random
  inputs were (the library cases use it too);
* `case_seed`: one seed per case, from the run's seed and the case's name.
"""

from __future__ import annotations

import math
import zlib

import numpy as np

from ..formats import PRESETS, format as get_format
from ..rounding import quantize
from .probes import ProbeSet, check_args

_FP32 = PRESETS["fp32"]


def case_seed(seed: int, name: str) -> int:
    """A per-case seed: the same for the same --seed and case on every run."""
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**32)


def rounded(x, fmt) -> np.ndarray:
    """float64 values rounded to ``fmt`` (nearest even, saturating, so that no Inf or NaN appears),
    through binary32 first, as the recorded captures' random inputs were: the rows of a seed stay
    the same."""
    return np.asarray(quantize(quantize(np.asarray(x, dtype=np.float64), "fp32"), fmt, saturate=True),
                      dtype=np.float64)


def _random_significand(rng, n, bits: int) -> np.ndarray:
    """n significands in [1, 2) with ``bits`` bits, uniformly."""
    frac = rng.integers(0, 2 ** (bits - 1), n)
    return 1.0 + frac / 2.0 ** (bits - 1)


def _wide(rng, inputs: str, k: int, n: int, c_format: str):
    spec, out = get_format(inputs), get_format(c_format)
    # keep |sum| < 2^(out.emax): k * 4 * 2^(2*ehi) <= 2^(out.emax)
    ehi = min(spec.emax - 1, (out.emax - 2 - math.ceil(math.log2(k))) // 2)
    elo = max(spec.emin, math.ceil(_FP32.emin / 2))
    q = spec.precision

    def values(shape):
        e = rng.integers(elo, ehi + 1, shape)
        s = rng.choice([-1.0, 1.0], shape)
        return s * _random_significand(rng, int(np.prod(shape)), q).reshape(shape) * np.exp2(e)

    a, b = values((n, k)), values((n, k))
    ce = rng.integers(max(2 * elo, out.emin), 2 * ehi + 1, n)
    c = rng.choice([-1.0, 1.0], n) * _random_significand(rng, n, out.precision) * np.exp2(ce)
    return a, b, c


def _upstream(rng, inputs: str, k: int, n: int, c_format: str):
    a = rounded(rng.standard_normal((n, k)), inputs)
    b = rounded(rng.standard_normal((n, k)), inputs)
    c = rounded(rng.random(n), c_format)
    return a, b, c


def random_rows(inputs: str, k: int, n: int, seed: int, c_format: str = "fp32",
                style: str = "mixed") -> ProbeSet:
    """n random rows: ``style`` "wide", "upstream" or "mixed" (half of each)."""
    check_args(inputs, k, c_format)
    if style not in ("wide", "upstream", "mixed"):
        raise ValueError(f"unknown style {style!r}; allowed: wide, upstream, mixed")
    rng = np.random.default_rng(seed)
    parts = []
    if style in ("wide", "mixed"):
        nw = n if style == "wide" else n // 2
        parts.append(("random:wide",) + _wide(rng, inputs, k, nw, c_format))
    if style in ("upstream", "mixed"):
        nu = n if style == "upstream" else n - n // 2
        parts.append(("random:upstream",) + _upstream(rng, inputs, k, nu, c_format))
    tags = np.concatenate([np.full(p[1].shape[0], p[0]) for p in parts]).astype(str)
    ps = ProbeSet(inputs, k, c_format, tags,
                  np.concatenate([p[1] for p in parts]).reshape(-1, k),
                  np.concatenate([p[2] for p in parts]).reshape(-1, k),
                  np.concatenate([p[3] for p in parts]))
    ps.check()
    return ps
