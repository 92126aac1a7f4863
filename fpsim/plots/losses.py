"""Figures of training losses and loss scales: loss curves over steps, final loss against the loss
scale, each layer's usable loss-scale window, and a loss scale over the steps of a run. Every
window of good scales is shaded by one function (`shade_window`), so a predicted window looks the
same in a study and in a report."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import numpy as np

from .style import (LINESTYLES, NORMAL_ALPHA, RECOMMENDED, SUBNORMAL_ALPHA, WINDOW, bars, figure, format_colour,
                    outside_legend, rc, row_labels, series_style, shown)

SCALE_LABEL = "loss scale S  (log2 S)"


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
    with rc():
        fig, axes = figure(7.5, 4.6, rows=1)
        ax = axes[0, 0]
        for i, (label, values) in enumerate(series.items()):
            steps = np.arange(1, values.size + 1)
            ok = np.isfinite(values)
            colour = series_style(i)["color"]
            ax.plot(steps[ok], values[ok], color=colour, linestyle=LINESTYLES[i % len(LINESTYLES)], label=label)
            if (~ok).any():
                ax.plot(steps[~ok], np.full((~ok).sum(), top), linestyle="none", marker="x", markersize=7,
                        color=colour, label=f"{label}: NaN/Inf loss")
        if logy:
            ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title or "Loss curves")
        outside_legend(fig, ax, loc="outside lower center", ncol=2)
    return fig


def shade_window(ax, lo_log2: float, hi_log2: float, recommended_log2=None, *, label: str | None = None,
                 recommended_label: str | None = None):
    """Shade the window [lo, hi] of good loss scales (log2 units on the x axis) and mark the
    recommended one. Returns (span, line or None)."""
    span = ax.axvspan(lo_log2, hi_log2, label=label, **WINDOW)
    line = None
    if recommended_log2 is not None:
        line = ax.axvline(recommended_log2, label=recommended_label, **RECOMMENDED)
    return span, line


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
    for label, values in series.items():
        if np.shape(values) != scales.shape:
            raise ValueError(f"{label!r}: {np.size(values)} losses for {scales.size} scales")
    if window is not None:
        lo, hi = (float(w) for w in window)
        if not (lo > 0 and hi >= lo):
            raise ValueError(f"window must be (lowest, highest) positive scales, got {window!r}")
    x = np.log2(scales)
    finite = np.concatenate([np.asarray(v, float)[np.isfinite(np.asarray(v, float))] for v in series.values()]
                            + ([np.array([reference])] if reference is not None else []))
    if finite.size == 0:
        finite = np.array([1.0])
    positive = finite[finite > 0]
    logy = logy and positive.size == finite.size
    top = finite.max() * (3.0 if logy else 1.15) if finite.max() > 0 else 1.0
    with rc():
        fig, axes = figure(7.5, 4.8, rows=1)
        ax = axes[0, 0]
        if window is not None:
            shade_window(ax, math.log2(lo), math.log2(hi), label=window_label)
        if reference is not None:
            ax.axhline(reference, color="0.2", linestyle="--", linewidth=1.2, label=reference_label)
        for i, (label, values) in enumerate(series.items()):
            values = np.asarray(values, dtype=float)
            ok = np.isfinite(values)
            style = series_style(i)
            ax.plot(x[ok], values[ok], marker=style["marker"], color=style["color"], label=label)
            if (~ok).any():
                ax.plot(x[~ok], np.full((~ok).sum(), top), linestyle="none", marker="x", markersize=9,
                        color=style["color"], label=f"{label}: diverged (NaN/Inf)")
        if logy:
            ax.set_yscale("log")
            ax.set_ylim(positive.min() / 2.0, top * 1.6)
        else:
            ax.set_ylim(top=top * 1.1)
        ax.set_xlabel(SCALE_LABEL)
        ax.set_ylabel(ylabel)
        ax.set_xticks(np.arange(math.floor(x.min()), math.ceil(x.max()) + 1, max(1, int(np.ptp(x) // 12) or 1)))
        ax.set_title(title or "Final loss against loss scale")
        outside_legend(fig, ax, loc="outside lower center", ncol=2)
    return fig


@dataclasses.dataclass
class WindowPanel:
    """One format's panel of `layer_windows`: per row, its usable window (lo, hi) in log2 or None, and
    whether the shared window serves it; the shared window, the recommended scale, the x range."""

    format: str
    title: str
    windows: list
    served: list
    shared: tuple | None
    recommended: int | None
    xlim: tuple


def layer_windows(rows, panels, *, title: str = ""):
    """Each row's (layer's) usable loss-scale window as a bar, one panel per format: solid in the
    format's colour where the shared window (shaded) serves it, light and hatched where none does."""
    from matplotlib.patches import Patch

    rows = [shown(r) for r in rows]
    width = 4.6 * max(len(panels), 1) + 2.0
    height = 2.3 + 0.26 * max(len(rows), 3)
    fig = figure(width, height, layout=None)
    longest = max((len(r) for r in rows), default=8)
    fig.subplots_adjust(left=min(0.5, (0.3 + 0.065 * longest) / width), right=0.97, bottom=1.05 / height,
                        top=1 - 0.75 / height, wspace=0.12)
    if not panels or not rows:
        ax = fig.add_subplot()
        ax.text(0.5, 0.5, "no gradients recorded or no loss-scaled format", ha="center", va="center",
                transform=ax.transAxes)
        ax.set_axis_off()
        return fig
    axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    handles = {}
    for ax, panel in zip(axes, panels):
        colour = format_colour(panel.format)
        lo, hi = panel.xlim
        if panel.shared is not None:
            handles["shared"], _ = shade_window(ax, panel.shared[0] - 0.5, panel.shared[1] + 0.5)
        for i, w in enumerate(panel.windows):
            if w is None:
                ax.text(lo + 0.5, i, "no usable scale", va="center", fontsize=7.5, color="0.3")
        unserved_style = dict(alpha=SUBNORMAL_ALPHA + 0.15, hatch="///", edgecolors=colour, linewidths=0)
        for served, style in ((True, dict(alpha=NORMAL_ALPHA)), (False, unserved_style)):
            kept = [(i, w) for i, (w, s) in enumerate(zip(panel.windows, panel.served))
                    if w is not None and s == served]
            if kept:
                bars(ax, [i for i, _ in kept], [w[0] - 0.5 for _, w in kept], [w[1] - w[0] + 1 for _, w in kept],
                     facecolors=colour, gid=f"format:{panel.format}", **style)
        if panel.recommended is not None:
            handles["recommended"] = ax.axvline(panel.recommended, **RECOMMENDED)
        handles["one"] = ax.axvline(0, color="grey", lw=0.9, ls=":")
        ax.set_xlim(lo, hi)
        ax.set_xlabel("log2 loss scale")
        ax.set_title(panel.title, fontsize=9.5, y=1.0, pad=4)   # a fixed position: no search of the axes
        ax.grid(axis="x", alpha=0.3)
    handles["served"] = Patch(facecolor="0.35", alpha=NORMAL_ALPHA)
    handles["unserved"] = Patch(facecolor="0.35", alpha=SUBNORMAL_ALPHA + 0.15, hatch="///", edgecolor="0.35")
    row_labels(axes[0], rows)
    axes[0].set_ylim(len(rows) - 0.5, -0.5)
    labels = {"served": "usable window of a layer the shared scale serves",
              "unserved": "usable window of a layer no shared scale serves", "shared": "shared window",
              "recommended": "recommended scale", "one": "scale 1"}
    keys = [k for k in labels if k in handles]
    fig.legend([handles[k] for k in keys], [labels[k] for k in keys], loc="lower center",
               ncols=min(len(keys), 3), fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=10)
    return fig


def scale_trajectories(trajectories, *, windows=None, title: str = "", ylabel: str = "log2 loss scale"):
    """A loss scale over the steps of a run, one step line per format.

    trajectories: {format name: (steps, log2 scales, label, [(step, log2 scale) of back-offs])};
    the last step ends the line. windows: {format name: (lo, hi)} log2 windows shaded behind.
    """
    fig = figure(8, 3.4, layout=None)
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.15, top=0.88)
    ax = fig.add_subplot()
    low, high = [], []
    for name, (steps, scales, label, backoffs) in trajectories.items():
        colour = format_colour(name)
        ax.step(steps, scales, where="post", color=colour, lw=1.6, label=label, gid=f"format:{name}")
        if backoffs:
            ax.plot([b[0] for b in backoffs], [b[1] for b in backoffs], "v", color=colour, ms=5,
                    label=f"{name}: a skipped step (overflow, scale halved)")
        low.append(min(scales))
        high.append(max(scales))
        window = (windows or {}).get(name)
        if window is not None:
            ax.axhspan(window[0], window[1], color=colour, alpha=0.1, label=f"{name}: the analyzer's usable window")
            low.append(max(window[0], min(scales) - 12))
            high.append(min(window[1], max(scales) + 12))
    if low:
        ax.set_ylim(min(low) - 2, max(high) + 2)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9.5)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return fig
