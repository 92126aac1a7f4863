"""Reference summations to compare tensor cores with: exact, binary32 sequential, pairwise, Kahan.

    d = reference_dot(a, b, c, method="exact")

a, b: (..., K) arrays of floats; c: (...) or None. Products are formed exactly
(float64 holds the product of two binary32 values exactly).

- ``exact``: the exact value of sum(a*b) + c, rounded once to binary32
  (nearest even): math.fsum gives the float64 nearest the exact sum, a second
  fsum gives the sign of what it left out, and that sign decides the rounding
  to binary32 exactly (the double rounding is then innocuous).
- ``fp32``: recursive summation in binary32, s = fl(s + fl(a_k b_k)), from s = c.
- ``pairwise``: binary32 pairwise summation of fl(a_k b_k) (halves summed
  recursively), then + c.
- ``kahan``: binary32 Kahan compensated summation, from s = c.
"""

from __future__ import annotations

import math

import numpy as np

from ..rounding import quantize

METHODS = ("exact", "fp32", "pairwise", "kahan")


def reference_dot(a, b, c=None, method: str = "exact") -> np.ndarray:
    """sum_k a[..., k] * b[..., k] + c[...] by a reference method (binary32 result)."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; allowed: {', '.join(METHODS)}")
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim == 0:
        raise ValueError(f"a and b need the same shape with a last axis (K), got {a.shape} and {b.shape}")
    c = np.zeros(a.shape[:-1]) if c is None else np.asarray(c, dtype=np.float64)
    if c.shape != a.shape[:-1]:
        raise ValueError(f"c must have shape {a.shape[:-1]}, got {c.shape}")
    products = a * b
    if method == "exact":
        return _exact(products, c)
    p32 = products.astype(np.float32)
    c32 = c.astype(np.float32)
    if method == "fp32":
        s = c32.copy()
        for k in range(p32.shape[-1]):
            s = s + p32[..., k]
        return s
    if method == "pairwise":
        return _pairwise(p32) + c32
    s, comp = c32.copy(), np.zeros_like(c32)
    for k in range(p32.shape[-1]):
        y = p32[..., k] - comp
        t = s + y
        comp = (t - s) - y
        s = t
    return s


def _exact(products: np.ndarray, c: np.ndarray) -> np.ndarray:
    flat_p = products.reshape(-1, products.shape[-1])
    flat_c = c.reshape(-1)
    nearest = np.empty(flat_c.shape)
    for i in range(flat_c.size):
        terms = list(flat_p[i]) + [float(flat_c[i])]
        hi = math.fsum(terms)
        rest = math.fsum(terms + [-hi]) if math.isfinite(hi) else 0.0
        # hi is the float64 nearest the exact sum; nudging it one float64 step towards
        # the remainder keeps it strictly on the exact sum's side of every binary32
        # rounding boundary, so rounding it once more is exact.
        nearest[i] = hi if rest == 0 else math.nextafter(hi, math.copysign(math.inf, rest))
    return np.asarray(quantize(nearest.reshape(c.shape), "fp32"), dtype=np.float32)


def _pairwise(p32: np.ndarray) -> np.ndarray:
    K = p32.shape[-1]
    size = 1 << max(0, (K - 1).bit_length())
    padded = np.zeros(p32.shape[:-1] + (size,), dtype=np.float32)
    padded[..., :K] = p32
    while padded.shape[-1] > 1:
        padded = padded[..., 0::2] + padded[..., 1::2]
    return padded[..., 0]
