"""Figure builders for the analyzer's report: each returns a matplotlib Figure (never shows it).

matplotlib is imported inside the functions, and figures are made with
matplotlib.figure.Figure directly (the Agg canvas renders them), so nothing
here touches pyplot's global state or the user's backend.

- magnitude_heatmap: layers x log2 magnitude, with each format's
  representable band drawn above it (and, for gradients, the band moved by
  the recommended loss scale).
- loss_scale_windows: each layer's usable loss-scale window per format, the
  global window and the recommended scale.
- gradscaler_trajectory: the scale torch.amp.GradScaler would use, step by step.
"""

from __future__ import annotations

import numpy as np

from .histogram import E_LO, N_BINS

_KIND_TITLES = {"activation": "Activations (module outputs)", "activation_grad": "Activation gradients",
                "weight": "Weights", "weight_grad": "Weight gradients (as backward produced them)",
                "optimizer_grad": "Weight gradients as the optimizer used them", "update": "Optimizer updates"}
_FORMAT_COLOURS = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]


def _figure(width: float, height: float, names=()):
    """A Figure with fixed margins (constrained layout would cost most of the drawing time); the left one
    fits the longest row label."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    longest = max((len(str(n)) for n in names), default=8)
    fig.subplots_adjust(left=min(0.5, (0.3 + 0.075 * longest) / width), right=0.97,
                        bottom=min(0.3, 0.75 / height), top=1 - min(0.25, 0.6 / height))
    return fig


def _text(name: str) -> str:
    """A name as matplotlib text: a '$' would start mathtext."""
    return str(name).replace("$", r"\$")


def _most_affected(report, layers: list, kind: str, limit: int) -> list:
    """At most `limit` layers, those losing most to underflow or overflow in the first format, in report order."""
    if len(layers) <= limit or not report.limits:
        return layers
    lim = report.limits[0]

    def loss(layer):
        t = layer.tensors[kind]
        return t.underflow_fraction(lim, 0) + (1.0 if t.overflows(lim, 0) else 0.0)

    keep = {id(layer) for layer in sorted(layers, key=loss, reverse=True)[:limit]}
    return [layer for layer in layers if id(layer) in keep]


def _colour(report, name: str) -> str:
    return _FORMAT_COLOURS[report.formats.index(name) % len(_FORMAT_COLOURS)]


def magnitude_heatmap(report, kind: str = "activation_grad", formats=None):
    """Share of each layer's nonzero values per binade [2^e, 2^(e+1)), with the formats' ranges on top.

    Each format row of the upper strip shows where it flushes to zero (left
    of the bar), its subnormal range (light) and normal range (dark) up to its
    overflow threshold; the dashed lines carry its flush and overflow edges
    down through the heatmap. For gradients of a loss-scaled format, a second
    row shows its range seen from the unscaled gradients at the recommended
    loss scale 2^r (the band moved left by r).
    """
    from matplotlib.colors import LogNorm

    from .report import MAX_FIGURE_ROWS

    layers = [layer for layer in report.layers if kind in layer.tensors and layer.tensors[kind].nonzero]
    shown_all = len(layers)
    layers = _most_affected(report, layers, kind, MAX_FIGURE_ROWS)
    limits = [lim for lim in report.limits if formats is None or lim.name in formats]
    rows = []
    for lim in limits:
        rows.append((lim.name, lim, 0))
        ls = report.loss_scale.get(lim.name)
        if (kind in ("activation_grad", "weight_grad") and not lim.per_tensor_scaled and ls is not None
                and ls.recommended_log2):
            rows.append((f"{lim.name} ×2^{ls.recommended_log2}", lim, ls.recommended_log2))
    fig = _figure(11, 1.7 + 0.24 * max(len(layers), 3) + 0.2 * len(rows), [layer.name for layer in layers])
    if not layers:
        ax = fig.add_subplot()
        ax.text(0.5, 0.5, f"no {kind} recorded", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return fig
    matrix = np.array([layer.tensors[kind].hist.counts / layer.tensors[kind].nonzero for layer in layers])
    used = np.flatnonzero(matrix.sum(axis=0))
    lo = used[0] + E_LO if used.size else -30
    hi = used[-1] + E_LO + 1 if used.size else 10
    for lim in limits:  # show the edges of the narrow formats when they are near the data
        if lim.zero_exponent > -64:
            lo = min(lo, lim.zero_exponent)
        if lim.emax < 64:
            hi = max(hi, lim.emax + 1)
    lo, hi = max(lo - 2, E_LO), min(hi + 2, E_LO + N_BINS)
    window = matrix[:, lo - E_LO:hi - E_LO]
    grid = fig.add_gridspec(2, 2, hspace=0.08, wspace=0.02, height_ratios=[0.2 * len(rows) + 0.15, 0.24 * max(len(layers), 3)],
                            width_ratios=[1, 0.018])
    bands = fig.add_subplot(grid[0, 0])
    heat = fig.add_subplot(grid[1, 0], sharex=bands)
    bar_axis = fig.add_subplot(grid[1, 1])
    masked = np.ma.masked_equal(window, 0)
    image = heat.imshow(masked, norm=LogNorm(vmin=1e-6, vmax=1), cmap="viridis", aspect="auto",
                        interpolation="nearest", extent=(lo, hi, len(layers), 0))
    heat.set_facecolor("#f2f2f2")
    heat.set_yticks(np.arange(len(layers)) + 0.5, [_text(layer.name) for layer in layers], fontsize=8)
    heat.set_xlabel("log2 |value|   (bin e holds 2^e ≤ |x| < 2^(e+1))")
    heat.set_xlim(lo, hi)
    cbar = fig.colorbar(image, cax=bar_axis)
    cbar.set_label("share of the layer's\nnonzero values", fontsize=8)
    for i, (label, lim, shift) in enumerate(rows):
        colour = _colour(report, lim.name)
        y = len(rows) - 1 - i
        z, emin, top = lim.zero_exponent - shift, lim.emin - shift, lim.emax + 1 - shift
        bands.broken_barh([(z, emin - z)], (y + 0.12, 0.76), facecolors=colour, alpha=0.3)
        bands.broken_barh([(emin, top - emin)], (y + 0.12, 0.76), facecolors=colour, alpha=0.85)
        if shift == 0:
            for edge in (lim.zero_exponent, lim.emax + 1):
                if lo <= edge <= hi:
                    heat.axvline(edge, color=colour, lw=1.1, ls="--", alpha=0.9)
    bands.set_yticks(np.arange(len(rows)) + 0.5, [r[0] for r in rows[::-1]], fontsize=8)
    bands.set_ylim(0, len(rows))
    bands.tick_params(axis="x", labelbottom=False)
    more = f" ({len(layers)} of {shown_all} layers: the most affected)" if len(layers) < shown_all else ""
    bands.set_title(f"{_KIND_TITLES.get(kind, kind)}{more}: where each layer's values lie, and what each format "
                    f"keeps\n(bars: light = subnormal, dark = normal range; dashed: flush-to-zero and overflow "
                    f"edges at scale 1)", fontsize=9.5)
    bands.grid(axis="x", alpha=0.3)
    heat.grid(axis="x", alpha=0.25)
    return fig


def loss_scale_windows(report, formats=None):
    """Per loss-scaled format, each layer's usable loss-scale window (log2), the shared one and the choice."""
    limits = [lim for lim in report.limits
              if (formats is None and not lim.per_tensor_scaled) or (formats is not None and lim.name in formats)]
    from .report import MAX_FIGURE_ROWS

    layers = [layer for layer in report.layers if any(k in layer.tensors for k in ("activation_grad", "weight_grad"))]
    if len(layers) > MAX_FIGURE_ROWS:   # the ones no shared scale serves first, then in report order
        unserved = set(n for ls in report.loss_scale.values() for n in ls.unserved)
        layers = sorted(layers, key=lambda layer: layer.name not in unserved)[:MAX_FIGURE_ROWS]
    fig = _figure(4.6 * max(len(limits), 1) + 2.0, 2.3 + 0.26 * max(len(layers), 3), [layer.name for layer in layers])
    if not limits or not layers:
        ax = fig.add_subplot()
        ax.text(0.5, 0.5, "no gradients recorded or no loss-scaled format", ha="center", va="center",
                transform=ax.transAxes)
        ax.set_axis_off()
        return fig
    axes = fig.subplots(1, len(limits), sharey=True, squeeze=False)[0]
    search_lo, search_hi = report.settings.scale_range
    handles = {}
    for ax, lim in zip(axes, limits):
        ls = report.loss_scale[lim.name]
        windows = [layer.gradient_window(lim, report.settings) for layer in layers]
        ends = [e for w in windows if w is not None for e in w]
        if ls.min_log2 is not None:
            ends += [ls.min_log2, ls.max_log2]
        lo = max(min(ends + [0], default=-4) - 3, search_lo - 1)
        hi = min(max(ends + [0], default=24) + 3, search_hi + 1)
        if ls.min_log2 is not None:
            handles["shared"] = ax.axvspan(ls.min_log2 - 0.5, ls.max_log2 + 0.5, color="#1f77b4", alpha=0.13)
        for i, (layer, w) in enumerate(zip(layers, windows)):
            if w is None:
                ax.text(lo + 0.5, i, "no usable scale", va="center", fontsize=7.5, color="#d62728")
                continue
            served = layer.name in ls.served
            bar = ax.barh(i, w[1] - w[0] + 1, left=w[0] - 0.5, height=0.6,
                          color="#2ca02c" if served else "#d62728", alpha=0.8)
            handles["served" if served else "unserved"] = bar
        if ls.recommended_log2 is not None:
            handles["recommended"] = ax.axvline(ls.recommended_log2, color="black", lw=1.6)
        handles["one"] = ax.axvline(0, color="grey", lw=0.9, ls=":")
        ax.set_xlim(lo, hi)
        ax.set_xlabel("log2 loss scale")
        if ls.recommended_log2 is None:
            title = f"{lim.name}: no scale serves any layer"
        elif ls.recommended_log2 == 0:
            title = f"{lim.name}: scale 1 (no scaling needed)"
        else:
            title = f"{lim.name}: recommended 2^{ls.recommended_log2} (window 2^{ls.min_log2}..2^{ls.max_log2})"
        ax.set_title(title, fontsize=9.5)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(range(len(layers)), [_text(layer.name) for layer in layers], fontsize=8)
    axes[0].set_ylim(len(layers) - 0.5, -0.5)
    labels = {"served": "usable window of a layer the shared scale serves",
              "unserved": "usable window of a layer no shared scale serves", "shared": "shared window",
              "recommended": "recommended scale", "one": "scale 1"}
    keys = [k for k in labels if k in handles]
    fig.legend([handles[k] for k in keys], [labels[k] for k in keys], loc="lower center",
               ncols=min(len(keys), 3), fontsize=8, frameon=False)
    fig.suptitle("Loss scales 2^s that keep each layer's gradient underflow ≤ "
                 f"{report.settings.underflow_threshold:g} (of nonzero values) without overflow", fontsize=10)
    return fig


def gradscaler_trajectory(report):
    """The loss scale torch.amp.GradScaler (default settings) would use at each step of the observed run."""
    fig = _figure(8, 3.4)
    ax = fig.add_subplot()
    low, high = [], []
    for name, p in report.gradscaler.items():
        colour = _colour(report, name)
        steps = [s for s, _ in p.trajectory] + [p.steps]
        scales = [float(np.log2(v)) for _, v in p.trajectory]
        scales.append(scales[-1])
        ax.step(steps, scales, where="post", color=colour, lw=1.6,
                label=f"{name}: {p.skipped_steps} of {p.steps} steps skipped")
        backoffs = [(s, float(np.log2(v))) for (s, v), (_, before) in zip(p.trajectory[1:], p.trajectory)
                    if v < before]
        if backoffs:
            ax.plot([b[0] for b in backoffs], [b[1] for b in backoffs], "v", color=colour, ms=5,
                    label=f"{name}: a skipped step (overflow, scale halved)")
        low.append(min(scales))
        high.append(max(scales))
        ls = report.loss_scale.get(name)
        if ls is not None and ls.min_log2 is not None:
            ax.axhspan(ls.min_log2, ls.max_log2, color=colour, alpha=0.1,
                       label=f"{name}: the analyzer's usable window")
            low.append(max(ls.min_log2, min(scales) - 12))
            high.append(min(ls.max_log2, max(scales) + 12))
    if low:
        ax.set_ylim(min(low) - 2, max(high) + 2)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("log2 loss scale")
    ax.set_title("Predicted torch.amp.GradScaler scale on this run (init 2^16, backoff 0.5, growth 2 every "
                 "2000 steps)", fontsize=9.5)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return fig
