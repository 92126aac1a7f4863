"""Figures of where values sit against the formats' ranges: the ranges themselves, the rounding
error across them, log2 histograms and per-layer heatmaps above each format's band."""

from __future__ import annotations

import numbers

import numpy as np

from . import data as D
from .style import (BINADE_LABEL, LITERAL, binade_axis, figure, format_bands, format_colour, outside_legend, rc,
                    row_labels, series_style, shown)

DEFAULT_FORMATS = ("fp32", "tf32", "bf16", "fp16", "e5m2", "e4m3", "e3m2", "e2m3", "e2m1")
GRADIENT_FORMATS = ("fp16", "bf16", "e4m3", "e5m2")


def _band(fmt) -> tuple:
    return (fmt.name, fmt.name) + D.span(fmt)


def format_ranges(formats=DEFAULT_FORMATS, *, title: str | None = None, xlim=None, annotate: bool = True):
    """Horizontal bars: each format's subnormal binades (light, hatched) and normal binades (dark)
    on a log2 axis, annotated with its precision (significand bits) and epsilon."""
    from matplotlib.patches import Patch

    fmts = D.formats(formats)
    with rc():
        fig, axes = figure(7.5, 0.42 * len(fmts) + 1.9, rows=1)
        ax = axes[0, 0]
        format_bands(ax, [_band(f) for f in fmts])
        if annotate:
            for i, fmt in enumerate(fmts):
                bits = "bit" if fmt.precision == 1 else "bits"
                note = f"p = {fmt.precision} {bits}, ε = $2^{{{-fmt.man_bits}}}$" + ("" if fmt.signed else
                                                                                   ", unsigned")
                ax.annotate(note, (D.span(fmt)[2], len(fmts) - 1 - i), xytext=(4, 0), textcoords="offset points",
                            va="center", fontsize=8.5)
        ax.set_ylabel("format")
        if xlim is None:
            lows, highs = [D.span(f)[0] for f in fmts], [D.span(f)[2] for f in fmts]
            width = max(highs) - min(lows)
            xlim = (min(lows) - 0.03 * width, max(highs) + (0.3 if annotate else 0.03) * width)
        ax.set_xlim(*xlim)
        binade_axis(ax)
        fig.suptitle(title or "Dynamic range and precision of each format")
        fig.legend([Patch(facecolor="0.5", alpha=0.3, hatch="///", edgecolor="0.5"), Patch(facecolor="0.35")],
                   ["subnormal binades", "normal binades"], loc="outside lower center", ncol=2, frameon=False)
    return fig


def rounding_error(formats=DEFAULT_FORMATS, *, log2_range=None, rounding: str = "nearest_even",
                   saturate: bool = False, title: str | None = None, points_per_binade: int = 256):
    """Largest relative rounding error |q(x) - x| / |x| against magnitude, per format.

    A dense log-spaced sweep of |x| is rounded to each format; the curve is the
    largest error in each binade [2^e, 2^(e+1)). It sits at the unit roundoff 2^-p in
    the normal range, climbs through the subnormal range, and reaches 1 where
    values are lost (flushed to zero, or overflowed to Inf/NaN).
    """
    fmts = D.formats(formats)
    if log2_range is None:
        lo = min(D.span(f)[0] for f in fmts) - 2
        hi = max(D.span(f)[2] for f in fmts) + 2
    else:
        lo, hi = map(float, log2_range)
    lo, hi = max(lo, -1070.0), min(hi, 1023.0)
    with rc():
        fig, axes = figure(7.5, 4.2, rows=1)
        ax = axes[0, 0]
        for fmt in fmts:
            binades, env = D.relative_error_envelope(fmt, lo, hi, points_per_binade=points_per_binade,
                                                     rounding=rounding, saturate=saturate)
            visible = np.where(env > 0, env, np.nan)   # exact values (0 error) cannot sit on a log axis
            ax.stairs(visible, np.append(binades, binades[-1] + 1), color=format_colour(fmt.name), linewidth=1.8,
                      label=f"{fmt.name} (u = $2^{{{-fmt.precision}}}$)", gid=f"format:{fmt.name}")
        # the limits first: a format exact over the whole range (no positive error) leaves no data to scale
        ax.set_ylim(bottom=min(2.0 ** -(max(f.precision for f in fmts) + 3), 1e-3), top=3.0)
        ax.set_yscale("log", base=10)
        ax.set_xlim(lo, hi)
        binade_axis(ax)
        ax.set_ylabel("largest relative error |q(x) − x| / |x| in each binade\n"
                      "(dimensionless; 1 = lost: rounded to 0, Inf or NaN)")
        ax.set_title(title or f"Relative rounding error against magnitude ({rounding.replace('_', ' ')})")
        outside_legend(fig, ax)
    return fig


def log2_histogram(data, formats=GRADIENT_FORMATS, *, scale: float = 1.0, bins=None, title: str | None = None,
                   xlabel: str | None = None, annotate_lost: bool = True, lost=None, xlim=None,
                   lost_label: str = "lost"):
    """Histograms of log2 |x| (one step line per array) above bars of each format's range.

    data: an array (numpy or torch) or a mapping label -> array; zeros and
    non-finite values are left out of the histogram (their count is in the
    legend). A value can also be a pair (edges, counts) of a histogram you
    already have on a log2 axis. scale multiplies the values first (a loss
    scale): the figure then shows where the scaled values sit. With
    annotate_lost, each format bar says which share of all the (scaled)
    values would round to zero or overflow in that format; pass lost =
    {format name: (fraction to zero, fraction overflowing)} to annotate
    fractions you computed yourself (for histograms given as counts).
    """
    fmts = D.formats(formats)
    h = D.log2_histograms(data, fmts, scale=scale, bins=bins, xlim=xlim, lost=lost, annotate_lost=annotate_lost)
    with rc():
        fig, axes = figure(7.5, 3.2 + 0.42 * len(fmts), rows=2, sharex=True,
                           gridspec_kw={"height_ratios": [3.2, 0.42 * len(fmts) + 0.3]})
        ax, bands = axes[0, 0], axes[1, 0]
        for i, (label, edges, shares) in enumerate(h.series):
            ax.stairs(shares, edges, color=series_style(i)["color"], label=label, linewidth=1.6)
        for fmt in fmts:
            ax.axvline(D.span(fmt)[0], color=format_colour(fmt.name), linestyle=":", linewidth=1,
                       gid=f"format:{fmt.name}")
        ax.set_ylabel("fraction of values\nper 1-binade bin")
        ax.set_title(title or ("log2 |x| against format ranges" + (f" (values × 2^{h.shift:g})" if h.shift else "")))
        format_bands(bands, [_band(f) for f in fmts])
        for i, fmt in enumerate(fmts):
            if fmt.name in h.lost:
                under, over = h.lost[fmt.name]
                bands.annotate(f"{100 * under:.3g}% → 0\n{100 * over:.3g}% → Inf/NaN", (1.0, len(fmts) - 1 - i),
                               xycoords=("axes fraction", "data"), xytext=(6, 0), textcoords="offset points",
                               va="center", fontsize=8.5)
        if h.lost:
            bands.annotate(lost_label + ":", (1.0, 1.0), xycoords="axes fraction", xytext=(6, 2),
                           textcoords="offset points", va="bottom", fontsize=8.5, fontweight="bold")
        bands.set_ylabel("range\n(hatched:\nsubnormal)")
        ax.set_xlim(*h.xlim)
        bands.set_xlabel(xlabel or BINADE_LABEL)
        outside_legend(fig, ax, loc="outside upper center", ncol=2)
    return fig


def magnitude_heatmap(rows, shares, lo: int, hi: int, bands, *, edges=(), title: str = "",
                      xlabel: str = "log2 |value|   (bin e holds 2^e ≤ |x| < 2^(e+1))",
                      colorbar_label: str = "share of the row's\nnonzero values"):
    """Rows (layers) x binades [lo, hi): the share of each row's values per binade (a log colour
    scale; 0 left blank), under a strip of format bands.

    rows: row names (drawn as written). lo < hi: ints. shares: array of shape (len(rows),
    hi - lo), each share in [0, 1] (anything else is refused: ValueError). bands: (label,
    format name, first subnormal, first normal, end) in log2 units, one strip row each.
    edges: (x, format name) dashed lines carried down through the heatmap (flush and overflow edges).
    Fixed margins, no layout pass: the analyzer draws these on every report.
    """
    from matplotlib.colors import LogNorm

    rows = [shown(r) for r in rows]
    for name, value in (("lo", lo), ("hi", hi)):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{name} must be an int (a binade exponent), got {type(value).__name__} {value!r}")
    if not lo < hi:
        raise ValueError(f"lo must be below hi, got lo={lo} and hi={hi}")
    shares = np.asarray(shares, dtype=float)
    if shares.shape != (len(rows), hi - lo):
        raise ValueError(f"shares must have shape (len(rows), hi - lo) = ({len(rows)}, {hi - lo}) for {len(rows)} "
                         f"rows and binades {lo}..{hi}, got shape {shares.shape}")
    if not np.all((shares >= 0) & (shares <= 1)):   # NaN fails this too
        bad = shares[~((shares >= 0) & (shares <= 1))][0]
        raise ValueError(f"shares must lie in [0, 1] (a share of each row's values), got {float(bad)!r}")
    height = 1.7 + 0.24 * max(len(rows), 3) + 0.2 * len(bands)
    width = 11.0
    longest = max(max((len(r) for r in rows), default=8), max((len(b[0]) for b in bands), default=8))
    fig = figure(width, height, layout=None)
    left = min(0.5, (0.3 + 0.065 * longest) / width)
    fig.subplots_adjust(left=left, right=1 - 1.05 / width, bottom=min(0.3, 0.6 / height),
                        top=1 - min(0.3, 0.62 / height))
    if not rows:
        ax = fig.add_subplot()
        ax.text(0.5, 0.5, title or "nothing recorded", ha="center", va="center", transform=ax.transAxes, **LITERAL)
        ax.set_axis_off()
        return fig
    heights = [0.2 * len(bands) + 0.15, 0.24 * max(len(rows), 3)]   # inches, about
    grid = fig.add_gridspec(2, 2, hspace=0.3 / sum(heights), wspace=0.02, width_ratios=[1, 0.018],
                            height_ratios=heights)   # hspace: a gap of about 0.15 inch, whatever the rows
    strip = fig.add_subplot(grid[0, 0])
    heat = fig.add_subplot(grid[1, 0], sharex=strip)
    bar_axis = fig.add_subplot(grid[1, 1])
    image = heat.imshow(np.ma.masked_equal(shares, 0), norm=LogNorm(vmin=1e-6, vmax=1),
                        cmap="viridis", aspect="auto", interpolation="nearest", extent=(lo, hi, len(rows), 0))
    heat.set_facecolor("#f2f2f2")
    row_labels(heat, rows, np.arange(len(rows)) + 0.5)
    heat.set_xlabel(xlabel)
    heat.set_xlim(lo, hi)
    cbar = fig.colorbar(image, cax=bar_axis)
    # plain-text labels at every other decade, no minor ticks: mathtext and 50 minor ticks cost more than the heatmap
    cbar.set_ticks([1e-6, 1e-4, 1e-2, 1], labels=["10⁻⁶", "10⁻⁴", "10⁻²", "1"])
    cbar.minorticks_off()
    cbar.set_label(colorbar_label, fontsize=8)
    cbar.ax.tick_params(labelsize=8)
    format_bands(strip, bands, fontsize=8)
    strip.set_ylim(-0.5, max(len(bands), 1) - 0.5)
    for x, name in edges:
        if lo <= x <= hi:
            heat.axvline(x, color=format_colour(name), lw=1.1, ls="--", alpha=0.9, gid=f"format:{name}")
    strip.tick_params(axis="x", labelbottom=False)
    strip.set_title(title, fontsize=9.5, y=1.0, pad=4)   # a fixed position: no search of the axes below
    strip.grid(axis="x", alpha=0.3)
    heat.grid(axis="x", alpha=0.25)
    return fig
