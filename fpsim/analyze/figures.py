"""The analyzer report's figures: this module picks from a report what each figure shows and
hands plain numbers to `fpsim.plots`, which draws (and holds every colour and style).

- magnitude_heatmap: layers x log2 magnitude, with each format's
  representable band drawn above it (and, for gradients, the band moved by
  the recommended loss scale).
- loss_scale_windows: each layer's usable loss-scale window per format, the
  global window and the recommended scale.
- gradscaler_trajectory: the scale torch.amp.GradScaler would use, step by step.
"""

from __future__ import annotations

import numpy as np

from .. import plots
from .histogram import E_LO, N_BINS
from .store import GRADIENT_KINDS, KINDS

MAX_FIGURE_ROWS = 64
"""Heatmaps show at most this many layers (the most affected ones); report.json has them all."""

_KIND_TITLES = {"activation": "Activations (module outputs)", "activation_grad": "Activation gradients",
                "weight": "Weights", "weight_grad": "Weight gradients (as backward produced them)",
                "optimizer_grad": "Weight gradients as the optimizer used them", "update": "Optimizer updates"}


def _limits(report, formats) -> list:
    """The report's format limits that `formats` names (all of them for None), in report order; a name the
    report lacks is refused. Names and aliases both work ("float16" is fp16)."""
    if formats is None:
        return list(report.limits)
    wanted = set()
    for given in [formats] if isinstance(formats, str) else formats:
        try:
            wanted.add(report.format_name(given))       # (names and aliases: Report.format_name)
        except KeyError:
            raise ValueError(f"formats: the report has no format {given!r}; allowed: "
                             f"{', '.join(report.formats)}") from None
    return [lim for lim in report.limits if lim.name in wanted]


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


def magnitude_heatmap(report, kind: str = "activation_grad", formats=None):
    """Share of each layer's nonzero values per binade [2^e, 2^(e+1)), with the formats' ranges on top.

    Each format row of the upper strip shows where it flushes to zero (left
    of the bar), its subnormal range (light) and normal range (dark) up to its
    overflow threshold; the dashed lines carry its flush and overflow edges
    down through the heatmap. For gradients of a loss-scaled format, a second
    row shows its range seen from the unscaled gradients at the recommended
    loss scale 2^r (the band moved left by r).

    kind: one of the recorded tensor kinds (activation, activation_grad,
    weight, weight_grad, optimizer_grad, update); a kind no layer recorded
    gives a figure that says so. formats: names of the report's formats
    (default: all). Anything else is refused with a ValueError.
    """
    if not isinstance(kind, str) or kind not in KINDS:
        raise ValueError(f"unknown tensor kind {kind!r}; allowed: {', '.join(KINDS)}")
    limits = _limits(report, formats)
    layers = [layer for layer in report.layers if kind in layer.tensors and layer.tensors[kind].nonzero]
    shown_all = len(layers)
    layers = _most_affected(report, layers, kind, MAX_FIGURE_ROWS)
    bands, edges = [], []
    for lim in limits:
        bands.append((lim.name, lim.name, lim.zero_exponent, lim.emin, lim.emax + 1))
        edges += [(lim.zero_exponent, lim.name), (lim.emax + 1, lim.name)]
        ls = report.loss_scale.get(lim.name)
        if (kind in GRADIENT_KINDS and not lim.per_tensor_scaled and ls is not None
                and ls.recommended_log2):
            r = ls.recommended_log2
            bands.append((f"{lim.name} ×2^{r}", lim.name, lim.zero_exponent - r, lim.emin - r, lim.emax + 1 - r))
    if not layers:
        return plots.magnitude_heatmap([], np.zeros((0, 1)), 0, 1, bands, title=f"no {kind} recorded")
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
    more = f" ({len(layers)} of {shown_all} layers: the most affected)" if len(layers) < shown_all else ""
    title = (f"{_KIND_TITLES.get(kind, kind)}{more}: where each layer's values lie, and what each format keeps\n"
             f"(bars: light = subnormal, dark = normal range; dashed: flush-to-zero and overflow edges at scale 1)")
    return plots.magnitude_heatmap([layer.name for layer in layers], matrix[:, lo - E_LO:hi - E_LO], int(lo), int(hi),
                                   bands, edges=edges, title=title,
                                   colorbar_label="share of the layer's\nnonzero values")


def loss_scale_windows(report, formats=None):
    """Per loss-scaled format, each layer's usable loss-scale window (log2), the shared one and the choice.

    formats: names of the report's formats (default: those it loss-scales); a name the report lacks is
    refused with a ValueError."""
    limits = [lim for lim in _limits(report, formats) if formats is not None or not lim.per_tensor_scaled]
    layers = [layer for layer in report.layers if any(k in layer.tensors for k in GRADIENT_KINDS)]
    if len(layers) > MAX_FIGURE_ROWS:   # the ones no shared scale serves first, then in report order
        unserved = set(n for ls in report.loss_scale.values() for n in ls.unserved)
        layers = sorted(layers, key=lambda layer: layer.name not in unserved)[:MAX_FIGURE_ROWS]
    search_lo, search_hi = report.settings.scale_range
    panels = []
    for lim in limits if layers else ():
        ls = report.loss_scale[lim.name]
        windows = [layer.gradient_window(lim, report.settings) for layer in layers]
        ends = [e for w in windows if w is not None for e in w]
        shared = (ls.min_log2, ls.max_log2) if ls.min_log2 is not None else None
        ends += list(shared or ())
        xlim = (max(min(ends + [0]) - 3, search_lo - 1), min(max(ends + [0]) + 3, search_hi + 1))
        if ls.recommended_log2 is None:
            title = f"{lim.name}: no scale serves any layer"
        elif ls.recommended_log2 == 0:
            title = f"{lim.name}: scale 1 (no scaling needed)"
        else:
            title = f"{lim.name}: recommended 2^{ls.recommended_log2} (window 2^{ls.min_log2}..2^{ls.max_log2})"
        panels.append(plots.WindowPanel(lim.name, title, windows, [layer.name in ls.served for layer in layers],
                                        shared, ls.recommended_log2, xlim))
    return plots.layer_windows([layer.name for layer in layers], panels,
                               title="Loss scales 2^s at which each layer's gradients overflow nowhere and lose "
                                     f"at most {report.settings.underflow_threshold:g} of their nonzero values "
                                     "(or less than one rounding's error) to zeros")


def gradscaler_trajectory(report):
    """The loss scale torch.amp.GradScaler (default settings) would use at each step of the observed run."""
    trajectories, windows = {}, {}
    for name, p in report.gradscaler.items():
        steps = [s for s, _ in p.trajectory] + [p.steps]
        scales = [float(np.log2(v)) for _, v in p.trajectory]
        scales.append(scales[-1])
        backoffs = [(s, float(np.log2(v))) for (s, v), (_, before) in zip(p.trajectory[1:], p.trajectory)
                    if v < before]
        trajectories[name] = (steps, scales, f"{name}: {p.skipped_steps} of {p.steps} steps skipped", backoffs)
        ls = report.loss_scale.get(name)
        if ls is not None and ls.min_log2 is not None:
            windows[name] = (ls.min_log2, ls.max_log2)
    return plots.scale_trajectories(trajectories, windows=windows,
                                    title="Predicted torch.amp.GradScaler scale on this run (init 2^16, backoff 0.5, "
                                          "growth 2 every 2000 steps)")
