"""The numbers the figures show, computed without matplotlib: format spans on a log2 axis,
rounding-error envelopes, lost fractions and log2 histograms ready to draw."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from fractions import Fraction

import numpy as np

from ..formats import Format, format as get_format
from ..rounding import quantize


def formats(names) -> list[Format]:
    """Formats from a name, a Format or a sequence of them; at least one."""
    if isinstance(names, (str, Format)):
        names = [names]
    out = [get_format(f) for f in names]
    if not out:
        raise ValueError("formats must name at least one format")
    return out


def fraction_log2(value) -> float:
    """log2 of a positive Fraction, exact for powers of two and accurate otherwise (huge or tiny)."""
    value = Fraction(value)
    return math.log2(value.numerator) - math.log2(value.denominator)


def span(fmt: Format) -> tuple[float, float, float]:
    """(log2 of the smallest subnormal, of the smallest normal, of the largest finite value)."""
    lo_norm = fraction_log2(fmt.min_normal)
    lo_sub = fraction_log2(fmt.min_subnormal) if fmt.subnormals else lo_norm
    return lo_sub, lo_norm, fraction_log2(fmt.max)


def values(x) -> np.ndarray:
    """A numpy or torch array as a flat float64 numpy array."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64).ravel()


def relative_error_envelope(fmt, log2_lo: float, log2_hi: float, *, points_per_binade: int = 256,
                            rounding: str = "nearest_even", saturate: bool = False):
    """(binade exponents e, largest |q(x) - x| / |x| for x in [2^e, 2^(e+1))) from a dense
    log-spaced sweep of [2^log2_lo, 2^log2_hi] rounded to `fmt`.

    A value rounded to zero or to Inf/NaN counts as relative error 1 (lost).
    """
    if not log2_hi > log2_lo:
        raise ValueError(f"log2_hi must exceed log2_lo, got {log2_lo} and {log2_hi}")
    n = max(2, int(round((log2_hi - log2_lo) * points_per_binade)) + 1)
    e = np.linspace(log2_lo, log2_hi, n)
    x = np.exp2(e)
    q = np.asarray(quantize(x, fmt, rounding, saturate=saturate), dtype=np.float64)
    with np.errstate(invalid="ignore"):
        rel = np.abs(q - x) / x
    rel = np.where(np.isfinite(q) & (q != 0), rel, 1.0)
    binade = np.floor(np.log2(x)).astype(int)   # exact for powers of two, unlike floor(e)
    first = int(binade.min())
    env = np.zeros(int(binade.max()) - first + 1)
    np.maximum.at(env, binade - first, rel)
    return np.arange(first, first + env.size), env


def lost_fractions(x, fmt, scale: float = 1.0) -> tuple[float, float]:
    """(fraction of nonzero finite values that round to zero, fraction that overflow to Inf/NaN)
    when scaled by `scale` and rounded to `fmt` (nearest even): what a cast would lose."""
    v = values(x) * float(scale)
    v = v[np.isfinite(v) & (v != 0)]
    if v.size == 0:
        return 0.0, 0.0
    q = np.asarray(quantize(v, fmt), dtype=np.float64)
    return float(np.mean(q == 0)), float(np.mean(~np.isfinite(q)))


@dataclasses.dataclass
class Log2Histograms:
    """Histograms on a log2 axis, ready to draw: each series' (label, bin edges, share per bin),
    the x range, and per format the (fraction to zero, fraction overflowing) to annotate."""

    series: list
    xlim: tuple
    lost: dict
    shift: float


def log2_histograms(data, fmts, *, scale: float = 1.0, bins=None, xlim=None, lost=None,
                    annotate_lost: bool = True) -> Log2Histograms:
    """The numbers `plots.log2_histogram` draws (see there for the arguments)."""
    items = dict(data) if isinstance(data, Mapping) else {"values": data}
    if not items:
        raise ValueError("data must hold at least one array of values")
    scale = float(scale)
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    shift = math.log2(scale)
    given, logs, pooled = {}, {}, []
    for label, value in items.items():
        if isinstance(value, tuple) and len(value) == 2:
            edges, counts = np.asarray(value[0], float), np.asarray(value[1], float)
            if edges.shape != (counts.size + 1,):
                raise ValueError(f"{label!r}: a histogram pair needs len(edges) == len(counts) + 1")
            given[label] = (edges + shift, counts)
            continue
        v = values(value) * scale
        keep = np.isfinite(v) & (v != 0)
        pooled.append(v[keep])
        logs[label] = (np.log2(np.abs(v[keep])), int((~keep).sum()))
    data_lo = [float(np.floor(x.min())) for x, _ in logs.values() if x.size] + [e[0] for e, _ in given.values()]
    data_hi = [float(np.ceil(x.max())) + 1 for x, _ in logs.values() if x.size] + [e[-1] for e, _ in given.values()]
    if xlim is None:
        # formats as wide as FP32's exponent range would squash the data: they run off the edges instead
        fmt_lo = [span(f)[0] - 2 for f in fmts if span(f)[0] > -64]
        fmt_hi = [span(f)[2] + 2 for f in fmts if span(f)[2] < 64]
        xlim = (min(data_lo + fmt_lo or [-30.0]) - 1, max(data_hi + fmt_hi or [5.0]) + 1)
    xlim = (float(xlim[0]), float(xlim[1]))
    if bins is None:
        bins = np.arange(math.floor(min([xlim[0]] + data_lo)), math.ceil(max([xlim[1]] + data_hi)) + 1)
    bins = np.asarray(bins, dtype=float)
    series = []
    for label in items:
        if label in given:
            edges, counts = given[label]
            series.append((label, edges, counts / max(1.0, counts.sum())))
            continue
        x, dropped = logs[label]
        counts, edges = np.histogram(x, bins=bins)
        extra = f", {dropped} zero/non-finite" if dropped else ""
        series.append((f"{label} (n = {x.size}{extra})", edges, counts / max(1, x.size)))
    shares = {}
    if annotate_lost and lost is not None:
        shares = {f.name: tuple(lost[f.name]) for f in fmts if f.name in lost}
    elif annotate_lost and pooled and sum(p.size for p in pooled):
        everything = np.concatenate(pooled)
        shares = {f.name: lost_fractions(everything, f) for f in fmts}
    return Log2Histograms(series, xlim, shares, shift)
