"""Figures of accumulation: dot-product error against its length K, and results of a computation
as one input sweeps a range (a block FMA as its addend crosses a binade boundary)."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from .style import figure, outside_legend, rc, series_style


def error_vs_k(ks, errors, *, title: str | None = None, ylabel: str = "relative error |d − s| / |s|",
               points=None, panels=None):
    """Error of dot products against their length K, log-log, one line per method.

    errors: mapping label -> array of errors >= 0 (one value per K). A log
    axis cannot show 0, so zeros (exact results) are left out of the line,
    as are NaN and Inf; a series with no positive finite error at all (an
    exact method) is listed in the legend as "label: error 0 at every K
    (exact)" (its panel's title added when there are several), and a figure
    with nothing to draw at all says so in its axes, with y from 1e-8 to 1:
    it still saves. points: optional list of (K, error, label) published
    values, K and error positive and finite, drawn as black stars. panels:
    optional mapping panel title -> errors mapping, drawn side by side with
    a shared y axis and one legend below; `errors` is then ignored.
    Negative errors are refused (ValueError): pass magnitudes.
    """
    ks = np.asarray(ks, dtype=float)
    if ks.ndim != 1 or ks.size == 0 or not np.all(ks > 0) or not np.all(np.isfinite(ks)):
        raise ValueError(f"ks must be a non-empty 1-d array of positive finite lengths, got {ks.tolist()!r}")
    groups = dict(panels) if panels is not None else {title or "": errors}
    if not groups or any(not isinstance(g, Mapping) or not g for g in groups.values()):
        raise ValueError("errors (or every panel) must map labels to arrays of errors")
    series = {}
    for panel, group in groups.items():
        for label, values in group.items():
            values = np.asarray(values, dtype=float)
            if values.shape != ks.shape:
                raise ValueError(f"{label!r}: {values.size} errors for {ks.size} values of K")
            if np.any(values < 0):
                raise ValueError(f"{label!r}: errors are magnitudes (>= 0), got {float(values[values < 0][0])!r} at "
                                 f"K = {ks[values < 0][0]:g}")
            series[panel, label] = values
    points = list(points or ())
    for point in points:
        if len(point) != 3 or not all(np.isfinite(float(v)) and float(v) > 0 for v in point[:2]):
            raise ValueError(f"points must be (K, error, label) with K and error positive and finite, got {point!r}")
    labels = []
    for g in groups.values():
        labels += [k for k in g if k not in labels]
    style = {lab: series_style(i) for i, lab in enumerate(labels)}
    several = len(groups) > 1
    drawable = {key: np.isfinite(v) & (v > 0) for key, v in series.items()}
    anything = bool(points) or any(d.any() for d in drawable.values())
    with rc():
        width = 3.8 * len(groups) if several else 7.5
        fig, axes = figure(width, 4.0 + (0.22 * math.ceil(len(labels) / 2) + 0.3 if several else 0.4),
                            rows=1, cols=len(groups), sharey=True)
        for ax, (panel, group) in zip(axes[0], groups.items()):
            drawn = bool(points)
            for label in group:
                values, shown = series[panel, label], drawable[panel, label]
                drawn |= bool(shown.any())
                if shown.any():
                    ax.plot(ks, np.where(shown, values, np.nan), markersize=4.5, label=label, **style[label])
                else:   # a legend entry only: a log axis has no place for its errors
                    why = "error 0 at every K (exact)" if np.all(values == 0) else "no positive finite error"
                    ax.plot([], [], markersize=4.5, label=f"{label}{f' ({panel})' if several else ''}: {why}",
                            **style[label])
            for k, err, plabel in points:
                ax.plot([k], [err], marker="*", markersize=14, color="black", linestyle="none", label=plabel,
                        zorder=5)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            if not drawn:   # matplotlib cannot place ticks on a log axis without data: fix the x range
                ax.set_xlim(ks.min() / 2, ks.max() * 2)
                ax.text(0.5, 0.5, "every error is 0 or not finite:\nnothing to show on a log axis", ha="center",
                        va="center", transform=ax.transAxes, color="0.3")
            ax.set_xlabel("K (products per dot product)")
            if several:
                ax.set_title(panel)
        if not anything:
            axes[0, 0].set_ylim(1e-8, 1.0)
        axes[0, 0].set_ylabel(ylabel)
        if several and title:
            fig.suptitle(title)
        elif title:
            axes[0, 0].set_title(title)
        if several:
            outside_legend(fig, list(axes[0]), loc="outside lower center", ncol=2)
        else:
            outside_legend(fig, list(axes[0]))
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
    with rc():
        fig, axes = figure(7.0, 4.2 + 0.25 * (len(results) + (exact is not None)), rows=1)
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
            style = series_style(i)
            ax.plot(x, values, color=style["color"], marker=style["marker"], markersize=9 - 3 * i / max(1, n - 1),
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
        outside_legend(fig, ax, loc="outside lower center")
    return fig
