"""Helpers shared by the analyzer tests: an independent numpy count of log2 binades."""

from __future__ import annotations

import numpy as np

from fpsim.analyze.histogram import E_LO, N_BINS, Log2Counter, Log2Histogram


def numpy_count(values: np.ndarray) -> dict:
    """Independent count with numpy's frexp on float64: binade, exact powers of two, specials."""
    v = np.asarray(values, dtype=np.float64).ravel()
    finite = np.isfinite(v)
    nonzero = finite & (v != 0)
    mant, exp = np.frexp(np.abs(v[nonzero]))       # |x| = mant * 2^exp, mant in [0.5, 1)
    binade = exp - 1
    counts = np.zeros(N_BINS, dtype=np.int64)
    pow2 = np.zeros(N_BINS, dtype=np.int64)
    inside = (binade >= E_LO) & (binade <= E_LO + N_BINS - 1)
    np.add.at(counts, binade[inside] - E_LO, 1)
    np.add.at(pow2, binade[inside & (mant == 0.5)] - E_LO, 1)
    return {
        "counts": counts, "pow2": pow2,
        "tiny": int((binade < E_LO).sum()), "huge": int((binade > E_LO + N_BINS - 1).sum()),
        "zeros": int((v == 0).sum()), "pos_inf": int((v == np.inf).sum()), "neg_inf": int((v == -np.inf).sum()),
        "nan": int(np.isnan(v).sum()),
    }


def observed(tensor, kernel=None) -> Log2Histogram:
    """The histogram Log2Counter makes of `tensor` (kernel=False: with torch operations only)."""
    counts, _ = Log2Counter(kernel=kernel).count(tensor)
    return Log2Histogram.from_raw(np.asarray(counts))


def assert_same(hist: Log2Histogram, expected: dict) -> None:
    np.testing.assert_array_equal(hist.counts, expected["counts"])
    np.testing.assert_array_equal(hist.pow2, expected["pow2"])
    for key in ("tiny", "huge", "zeros", "pos_inf", "neg_inf", "nan"):
        assert getattr(hist, key) == expected[key], key


