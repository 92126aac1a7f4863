"""Figure builders: format ranges, rounding error, log2 histograms against format
bands, loss-scale windows, accumulation error against K, block-sum sweeps.

Every builder takes plain numbers or arrays (your own data as well as the
studies'), returns a `matplotlib.figure.Figure` on the Agg canvas and never
shows it: save it with ``fig.savefig("x.png")`` or display it in a notebook.
matplotlib is imported here only, and only when a builder runs.

    import fpsim.plots as plots
    plots.format_ranges(["fp16", "bf16", "e4m3", "e5m2"]).savefig("ranges.png")
    plots.log2_histogram({"grad": g}, formats=("fp16", "e4m3"), scale=1024).savefig("h.png")

Axes are labelled with their units (log2 |x| is the binade exponent: 2^-24
sits at -24), legends sit outside the axes so they never hide data, and the
fonts are sized to stay readable when a 7-inch figure is printed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from .formats import Format, format as get_format
from .rounding import quantize

# Readable in print at the default 7-inch width.
_STYLE = {
    "font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "legend.fontsize": 9,
    "xtick.labelsize": 9, "ytick.labelsize": 9, "axes.grid": True, "grid.alpha": 0.3,
    "grid.linewidth": 0.6, "lines.linewidth": 1.6, "savefig.dpi": 150,
}
_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
           "#7f7f7f", "#bcbd22")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")
_LINESTYLES = ("-", "--", "-.", ":")

DEFAULT_FORMATS = ("fp32", "tf32", "bf16", "fp16", "e5m2", "e4m3", "e3m2", "e2m3", "e2m1")
GRADIENT_FORMATS = ("fp16", "bf16", "e4m3", "e5m2")
_SUBNORMAL_STYLE = dict(facecolor="#9ecae1", edgecolor="#3182bd", hatch="///")
_NORMAL_STYLE = dict(facecolor="#3182bd", edgecolor="#3182bd")


def _mpl():
    import matplotlib

    return matplotlib


def _figure(width: float = 7.0, height: float = 4.0, rows: int = 1, cols: int = 1, **subplot_kw):
    """A Figure on the Agg canvas (no pyplot state) with constrained layout, and its axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False, **subplot_kw)
    return fig, axes


def _style():
    return _mpl().rc_context(_STYLE)


def _formats(formats) -> list[Format]:
    if isinstance(formats, (str, Format)):
        formats = [formats]
    out = [get_format(f) for f in formats]
    if not out:
        raise ValueError("formats must name at least one format")
    return out


def _label(fmt: Format) -> str:
    return fmt.name


def _fraction_log2(value) -> float:
    """log2 of a positive Fraction, exact for powers of two and accurate otherwise (huge or tiny)."""
    from fractions import Fraction

    value = Fraction(value)
    return math.log2(value.numerator) - math.log2(value.denominator)


def _binade_axis(ax, label: str = "log2 |x|  (binade exponent e: |x| = 2^e)") -> None:
    """x axis in log2 units with a secondary decimal (log10) scale on top."""
    ax.set_xlabel(label)
    top = ax.secondary_xaxis("top", functions=(lambda e: e * math.log10(2), lambda d: d / math.log10(2)))
    top.set_xlabel("log10 |x|")


def _outside_legend(fig, ax_or_handles=None, title: str | None = None, ncol: int = 1, loc: str = "outside right upper"):
    handles, labels = [], []
    sources = ax_or_handles if isinstance(ax_or_handles, (list, tuple)) else [ax_or_handles]
    for ax in sources:
        h, lab = ax.get_legend_handles_labels()
        for hh, ll in zip(h, lab):
            if ll not in labels and not ll.startswith("_"):
                handles.append(hh)
                labels.append(ll)
    if handles:
        fig.legend(handles, labels, loc=loc, title=title, ncol=ncol, frameon=False)


# ------------------------------------------------------------------ formats
def format_ranges(formats=DEFAULT_FORMATS, *, title: str | None = None, xlim=None, annotate: bool = True):
    """Horizontal bars: each format's subnormal binades (hatched) and normal binades (solid)
    on a log2 axis, annotated with its precision (significand bits) and epsilon."""
    from matplotlib.patches import Patch

    fmts = _formats(formats)
    with _style():
        fig, axes = _figure(7.5, 0.42 * len(fmts) + 1.9)
        ax = axes[0, 0]
        for row, fmt in enumerate(reversed(fmts)):
            lo_sub = _fraction_log2(fmt.min_subnormal)
            lo_norm = _fraction_log2(fmt.min_normal)
            hi = _fraction_log2(fmt.max)
            if fmt.subnormals:
                ax.barh(row, lo_norm - lo_sub, left=lo_sub, height=0.6, **_SUBNORMAL_STYLE)
            ax.barh(row, hi - lo_norm, left=lo_norm, height=0.6, **_NORMAL_STYLE)
            if annotate:
                bits = "bit" if fmt.precision == 1 else "bits"
                note = f"p = {fmt.precision} {bits}, ε = $2^{{{-fmt.man_bits}}}$" + ("" if fmt.signed else ", unsigned")
                ax.annotate(note, (hi, row), xytext=(4, 0), textcoords="offset points", va="center", fontsize=8.5)
        ax.set_yticks(range(len(fmts)), [_label(f) for f in reversed(fmts)])
        ax.set_ylabel("format")
        ax.grid(axis="y", visible=False)
        lows = [_fraction_log2(f.min_subnormal) for f in fmts]
        highs = [_fraction_log2(f.max) for f in fmts]
        if xlim is None:
            span = max(highs) - min(lows)
            xlim = (min(lows) - 0.03 * span, max(highs) + (0.3 if annotate else 0.03) * span)
        ax.set_xlim(*xlim)
        ax.set_ylim(-0.6, len(fmts) - 0.4)
        _binade_axis(ax)
        fig.suptitle(title or "Dynamic range and precision of each format")
        fig.legend([Patch(**_SUBNORMAL_STYLE), Patch(**_NORMAL_STYLE)], ["subnormal binades", "normal binades"],
                   loc="outside lower center", ncol=2, frameon=False)
    return fig


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


def rounding_error(formats=DEFAULT_FORMATS, *, log2_range=None, rounding: str = "nearest_even",
                   saturate: bool = False, title: str | None = None, points_per_binade: int = 256):
    """Largest relative rounding error |q(x) - x| / |x| against magnitude, per format.

    A dense log-spaced sweep of |x| is rounded to each format; the curve is the
    largest error in each binade [2^e, 2^(e+1)). It sits at the unit roundoff 2^-p in
    the normal range, climbs through the subnormal range, and reaches 1 where
    values are lost (flushed to zero, or overflowed to Inf/NaN).
    """
    fmts = _formats(formats)
    if log2_range is None:
        lo = min(_fraction_log2(f.min_subnormal) for f in fmts) - 2
        hi = max(_fraction_log2(f.max) for f in fmts) + 2
    else:
        lo, hi = map(float, log2_range)
    lo, hi = max(lo, -1070.0), min(hi, 1023.0)
    with _style():
        fig, axes = _figure(7.5, 4.2)
        ax = axes[0, 0]
        for i, fmt in enumerate(fmts):
            binades, env = relative_error_envelope(fmt, lo, hi, points_per_binade=points_per_binade,
                                                   rounding=rounding, saturate=saturate)
            shown = np.where(env > 0, env, np.nan)   # exact values (0 error) cannot sit on a log axis
            # one step per binade [2^e, 2^(e+1))
            ax.stairs(shown, np.append(binades, binades[-1] + 1), color=_COLORS[i % 10],
                      linestyle=_LINESTYLES[(i // 10) % 4], linewidth=1.8,
                      label=f"{fmt.name} (u = $2^{{{-fmt.precision}}}$)")
        ax.set_yscale("log", base=10)
        ax.set_ylim(bottom=min(2.0 ** -(max(f.precision for f in fmts) + 3), 1e-3), top=3.0)
        ax.set_xlim(lo, hi)
        _binade_axis(ax)
        ax.set_ylabel("largest relative error |q(x) − x| / |x| in each binade\n(dimensionless; 1 = lost: rounded to 0, Inf or NaN)")
        ax.set_title(title or f"Relative rounding error against magnitude ({rounding.replace('_', ' ')})")
        _outside_legend(fig, ax)
    return fig


# --------------------------------------------------------- log2 histograms
def _histogram_inputs(data) -> dict:
    if isinstance(data, Mapping):
        items = dict(data)
    else:
        items = {"values": data}
    if not items:
        raise ValueError("data must hold at least one array of values")
    return items


def _values(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64).ravel()


def lost_fractions(values, fmt, scale: float = 1.0) -> tuple[float, float]:
    """(fraction of nonzero finite values that round to zero, fraction that overflow to Inf/NaN)
    when scaled by `scale` and rounded to `fmt` (nearest even): what a cast would lose."""
    v = _values(values) * float(scale)
    v = v[np.isfinite(v) & (v != 0)]
    if v.size == 0:
        return 0.0, 0.0
    q = np.asarray(quantize(v, fmt), dtype=np.float64)
    return float(np.mean(q == 0)), float(np.mean(~np.isfinite(q)))


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
    items = _histogram_inputs(data)
    fmts = _formats(formats)
    scale = float(scale)
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    shift = math.log2(scale)
    hists, all_values = {}, []
    for label, value in items.items():
        if isinstance(value, tuple) and len(value) == 2:
            edges, counts = np.asarray(value[0], float), np.asarray(value[1], float)
            if edges.shape != (counts.size + 1,):
                raise ValueError(f"{label!r}: a histogram pair needs len(edges) == len(counts) + 1")
            hists[label] = (edges + shift, counts, None)
            continue
        v = _values(value) * scale
        keep = np.isfinite(v) & (v != 0)
        all_values.append(v[keep])
        hists[label] = (None, np.log2(np.abs(v[keep])), int((~keep).sum()))
    finite_logs = [h[1] for h in hists.values() if h[0] is None and h[1].size]
    data_lo = [float(np.floor(x.min())) for x in finite_logs] + [float(h[0][0]) for h in hists.values()
                                                                  if h[0] is not None]
    data_hi = [float(np.ceil(x.max())) + 1 for x in finite_logs] + [float(h[0][-1]) for h in hists.values()
                                                                     if h[0] is not None]
    # formats as wide as FP32's exponent range would squash the data: they run off the edges instead
    fmt_lo = [_fraction_log2(f.min_subnormal) for f in fmts if _fraction_log2(f.min_subnormal) > -64]
    fmt_hi = [_fraction_log2(f.max) for f in fmts if _fraction_log2(f.max) < 64]
    if xlim is None:
        xlim = (min(data_lo + [v - 2 for v in fmt_lo] or [-30.0]) - 1, max(data_hi + [v + 2 for v in fmt_hi] or [5.0]) + 1)
    xlim = (float(xlim[0]), float(xlim[1]))
    if bins is None:
        lo = min([xlim[0]] + data_lo)
        hi = max([xlim[1]] + data_hi)
        bins = np.arange(math.floor(lo), math.ceil(hi) + 1)
    bins = np.asarray(bins, dtype=float)
    with _style():
        fig, axes = _figure(7.5, 3.2 + 0.42 * len(fmts), rows=2, sharex=True,
                            gridspec_kw={"height_ratios": [3.2, 0.42 * len(fmts) + 0.3]})
        ax, bands = axes[0, 0], axes[1, 0]
        for i, (label, (edges, logs, zeros)) in enumerate(hists.items()):
            color = _COLORS[i % 10]
            if edges is None:
                counts, edges = np.histogram(logs, bins=bins)
                total = max(1, logs.size)
                extra = f", {zeros} zero/non-finite" if zeros else ""
                name = f"{label} (n = {logs.size}{extra})"
            else:
                counts, total, name = logs, max(1.0, logs.sum()), label
            ax.stairs(counts / total, edges, color=color, label=name, linewidth=1.6)
        for j, fmt in enumerate(fmts):
            ax.axvline(_fraction_log2(fmt.min_subnormal), color=_COLORS[(j + 4) % 10], linestyle=":", linewidth=1)
        ax.set_ylabel("fraction of values\nper 1-binade bin")
        ax.set_title(title or ("log2 |x| against format ranges" + (f" (values × 2^{shift:g})" if shift else "")))
        pooled = np.concatenate(all_values) if all_values else np.zeros(0)
        for row, fmt in enumerate(reversed(fmts)):
            color = _COLORS[(len(fmts) - 1 - row + 4) % 10]
            lo_sub, lo_norm = _fraction_log2(fmt.min_subnormal), _fraction_log2(fmt.min_normal)
            hi = _fraction_log2(fmt.max)
            if fmt.subnormals:
                bands.barh(row, lo_norm - lo_sub, left=lo_sub, height=0.6, color=color, alpha=0.35, hatch="///",
                           edgecolor=color)
            bands.barh(row, hi - lo_norm, left=lo_norm, height=0.6, color=color, alpha=0.85)
            shares = None
            if annotate_lost and lost is not None and fmt.name in lost:
                shares = lost[fmt.name]
            elif annotate_lost and lost is None and pooled.size:
                shares = lost_fractions(pooled, fmt)
            if shares is not None:
                under, over = shares
                bands.annotate(f"{100 * under:.3g}% → 0\n{100 * over:.3g}% → Inf/NaN", (1.0, row),
                               xycoords=("axes fraction", "data"), xytext=(6, 0), textcoords="offset points",
                               va="center", fontsize=8.5)
        if annotate_lost and (lost is not None or pooled.size):
            bands.annotate(lost_label + ":", (1.0, 1.0), xycoords="axes fraction", xytext=(6, 2),
                           textcoords="offset points", va="bottom", fontsize=8.5, fontweight="bold")
        bands.set_yticks(range(len(fmts)), [f.name for f in reversed(fmts)])
        bands.set_ylim(-0.6, len(fmts) - 0.4)
        bands.grid(axis="y", visible=False)
        bands.set_ylabel("range\n(hatched:\nsubnormal)")
        ax.set_xlim(*xlim)
        bands.set_xlabel(xlabel or "log2 |x|  (binade exponent e: |x| = 2^e)")
        _outside_legend(fig, ax, loc="outside upper center", ncol=2)
    return fig


# ------------------------------------------------------------- loss scales
def loss_scale_window(scales, losses, *, window=None, reference: float | None = None, title: str | None = None,
                      ylabel: str = "final training loss", window_label: str = "predicted window",
                      reference_label: str = "FP32 reference (no rounding)", logy: bool = True):
    """Final loss against loss scale (log2 axis), with a predicted window of good scales shaded.

    scales: loss scales S (positive). losses: one array (same length) or a
    mapping label -> array; NaN or Inf losses (diverged runs) are drawn as
    crosses on the top edge. window: (lowest, highest) scale predicted to work.
    reference: a loss drawn as a horizontal line (for example FP32 training).
    """
    scales = np.asarray(scales, dtype=float)
    if scales.ndim != 1 or scales.size == 0 or not np.all(scales > 0):
        raise ValueError("scales must be a non-empty 1-d array of positive numbers")
    series = dict(losses) if isinstance(losses, Mapping) else {"final loss": losses}
    x = np.log2(scales)
    with _style():
        fig, axes = _figure(7.5, 4.8)
        ax = axes[0, 0]
        finite_all = np.concatenate([np.asarray(v, float)[np.isfinite(np.asarray(v, float))] for v in series.values()]
                                    + ([np.array([reference])] if reference is not None else []))
        if finite_all.size == 0:
            finite_all = np.array([1.0])
        positive = finite_all[finite_all > 0]
        logy = logy and positive.size == finite_all.size
        top = finite_all.max() * (3.0 if logy else 1.15) if finite_all.max() > 0 else 1.0
        if window is not None:
            lo, hi = (float(w) for w in window)
            if not (lo > 0 and hi >= lo):
                raise ValueError(f"window must be (lowest, highest) positive scales, got {window!r}")
            ax.axvspan(math.log2(lo), math.log2(hi), color="#a1d99b", alpha=0.45, label=window_label, zorder=0)
        if reference is not None:
            ax.axhline(reference, color="0.2", linestyle="--", linewidth=1.2, label=reference_label)
        for i, (label, values) in enumerate(series.items()):
            values = np.asarray(values, dtype=float)
            if values.shape != scales.shape:
                raise ValueError(f"{label!r}: {values.size} losses for {scales.size} scales")
            ok = np.isfinite(values)
            ax.plot(x[ok], values[ok], marker=_MARKERS[i % 10], color=_COLORS[i % 10], label=label)
            if (~ok).any():
                ax.plot(x[~ok], np.full((~ok).sum(), top), linestyle="none", marker="x", markersize=9,
                        color=_COLORS[i % 10], label=f"{label}: diverged (NaN/Inf)")
        if logy:
            ax.set_yscale("log")
            ax.set_ylim(positive.min() / 2.0, top * 1.6)
        else:
            ax.set_ylim(top=top * 1.1)
        ax.set_xlabel("loss scale S  (log2 S)")
        ax.set_ylabel(ylabel)
        ax.set_xticks(np.arange(math.floor(x.min()), math.ceil(x.max()) + 1, max(1, int(np.ptp(x) // 12) or 1)))
        ax.set_title(title or "Final loss against loss scale")
        _outside_legend(fig, ax, loc="outside lower center", ncol=2)
    return fig


# ------------------------------------------------------ accumulation error
def error_vs_k(ks, errors, *, title: str | None = None, ylabel: str = "relative error |d − s| / |s|",
               points=None, panels=None):
    """Error of dot products against their length K, log-log, one line per method.

    errors: mapping label -> array (one value per K); zeros (exact results)
    are left out, as a log axis cannot show them. points: optional list of
    (K, error, label) published values drawn as black stars. panels:
    optional mapping panel title -> errors mapping, drawn side by side with
    a shared y axis and one legend below; `errors` is then ignored.
    """
    ks = np.asarray(ks, dtype=float)
    if ks.ndim != 1 or ks.size == 0 or not np.all(ks > 0):
        raise ValueError("ks must be a non-empty 1-d array of positive lengths")
    groups = dict(panels) if panels is not None else {title or "": errors}
    if not groups or any(not isinstance(g, Mapping) or not g for g in groups.values()):
        raise ValueError("errors (or every panel) must map labels to arrays of errors")
    labels = []
    for g in groups.values():
        labels += [k for k in g if k not in labels]
    style = {lab: (_COLORS[i % 10], _MARKERS[i % 10], _LINESTYLES[(i // 10) % 4]) for i, lab in enumerate(labels)}
    several = len(groups) > 1
    with _style():
        width = 3.8 * len(groups) if several else 7.5
        fig, axes = _figure(width, 4.0 + (0.22 * math.ceil(len(labels) / 2) + 0.3 if several else 0.4),
                            cols=len(groups), sharey=True)
        for ax, (panel, group) in zip(axes[0], groups.items()):
            for label, values in group.items():
                values = np.asarray(values, dtype=float)
                if values.shape != ks.shape:
                    raise ValueError(f"{label!r}: {values.size} errors for {ks.size} values of K")
                shown = np.where(values > 0, values, np.nan)
                color, marker, ls = style[label]
                ax.plot(ks, shown, color=color, marker=marker, linestyle=ls, markersize=4.5, label=label)
            for k, err, plabel in points or ():
                ax.plot([k], [err], marker="*", markersize=14, color="black", linestyle="none", label=plabel,
                        zorder=5)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("K (products per dot product)")
            if several:
                ax.set_title(panel)
        axes[0, 0].set_ylabel(ylabel)
        if several and title:
            fig.suptitle(title)
        elif title:
            axes[0, 0].set_title(title)
        if several:
            _outside_legend(fig, list(axes[0]), loc="outside lower center", ncol=2)
        else:
            _outside_legend(fig, list(axes[0]))
    return fig


# ---------------------------------------------------------- block-sum sweeps
def sweep(x, results, *, exact=None, xlabel: str, ylabel: str, title: str | None = None, marks=None,
          steps: bool = False):
    """Results of some computation as one input grows (for example a block FMA as c
    crosses a binade boundary): one line with markers per model, the exact value dashed.

    results: mapping label -> array of len(x), drawn in order (the last on
    top). exact: optional array. marks: optional list of (x, label) vertical
    lines (a binade boundary). steps: draw step lines instead of segments.
    """
    x = np.asarray(x, dtype=float)
    if not isinstance(results, Mapping) or not results:
        raise ValueError("results must map labels to arrays")
    with _style():
        fig, axes = _figure(7.0, 4.2 + 0.25 * (len(results) + (exact is not None)))
        ax = axes[0, 0]
        if exact is not None:
            exact = np.asarray(exact, float)
            if exact.shape != x.shape:
                raise ValueError(f"exact: {exact.size} values for {x.size} inputs")
            ax.plot(x, exact, color="0.2", linestyle="--", linewidth=1.2, label="exact sum")
        n = len(results)
        for i, (label, values) in enumerate(results.items()):
            values = np.asarray(values, float)
            if values.shape != x.shape:
                raise ValueError(f"{label!r}: {values.size} results for {x.size} inputs")
            ax.plot(x, values, color=_COLORS[i % 10], marker=_MARKERS[i % 10], markersize=9 - 3 * i / max(1, n - 1),
                    linewidth=2.2 - i * 0.8 / max(1, n - 1), drawstyle="steps-post" if steps else "default",
                    label=label, zorder=2 + i)
        for xm, mlabel in marks or ():
            ax.axvline(xm, color="0.4", linestyle=":", linewidth=1.2, zorder=1)
            ax.annotate(mlabel, (xm, 0.02), xycoords=("data", "axes fraction"), xytext=(4, 0),
                        textcoords="offset points", fontsize=9, color="0.3", va="bottom")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if title:
            ax.set_title(title)
        _outside_legend(fig, ax, loc="outside lower center")
    return fig


# ------------------------------------------------------------- loss curves
def loss_curves(curves, *, title: str | None = None, xlabel: str = "step (backward pass)",
                ylabel: str = "training loss", logy: bool = True):
    """Training losses against step, one line per run (for example FP32 beside emulated recipes).

    curves: mapping label -> sequence of losses, drawn in order. A run's
    non-finite losses (NaN, Inf: it diverged) are marked with a cross on the
    top edge at their steps, so a run that broke is seen where it broke.
    """
    if not isinstance(curves, Mapping) or not curves:
        raise ValueError("curves must map run labels to sequences of losses")
    series = {label: np.asarray(list(values), dtype=float) for label, values in curves.items()}
    finite = np.concatenate([v[np.isfinite(v)] for v in series.values()] + [np.zeros(0)])
    logy = logy and finite.size > 0 and bool(np.all(finite > 0))
    top = float(finite.max()) if finite.size else 1.0
    with _style():
        fig, axes = _figure(7.5, 4.6)
        ax = axes[0, 0]
        for i, (label, values) in enumerate(series.items()):
            steps = np.arange(1, values.size + 1)
            ok = np.isfinite(values)
            ax.plot(steps[ok], values[ok], color=_COLORS[i % 10], linestyle=_LINESTYLES[i % 4], label=label)
            if (~ok).any():
                ax.plot(steps[~ok], np.full((~ok).sum(), top), linestyle="none", marker="x", markersize=7,
                        color=_COLORS[i % 10], label=f"{label}: NaN/Inf loss")
        if logy:
            ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title or "Loss curves")
        _outside_legend(fig, ax, loc="outside lower center", ncol=2)
    return fig
