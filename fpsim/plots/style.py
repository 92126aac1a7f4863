"""The one place that says how fpsim's figures look: sizes, fonts, the colour of each format,
the series palette, the loss-scale window's shading, and the Agg figure every builder starts from.

Every figure (the plot builders, the analyzer's report, the studies) takes its colours from
here, so FP16 has one colour everywhere. Nothing here imports matplotlib at module level.
"""

from __future__ import annotations

import math
import zlib

RC = {
    "font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "legend.fontsize": 9,
    "xtick.labelsize": 9, "ytick.labelsize": 9, "axes.grid": True, "grid.alpha": 0.3,
    "grid.linewidth": 0.6, "lines.linewidth": 1.6, "savefig.dpi": 150,
}
"""matplotlib settings for figures read in print at a 7-inch width."""

FORMAT_COLOURS = {
    "fp16": "#d62728", "bf16": "#1f77b4", "e4m3": "#2ca02c", "e5m2": "#9467bd",
    "fp32": "#7f7f7f", "tf32": "#8c564b", "fp64": "#393b79",
    "e3m2": "#ff7f0e", "e2m3": "#e377c2", "e2m1": "#17becf", "e8m0": "#000000",
    "e4m3fnuz": "#bcbd22", "e5m2fnuz": "#6b6ecf",
    "e3m4": "#843c39", "e4m3ieee": "#7b4173", "e4m3b11fnuz": "#8c6d31", "e5m3fnu": "#637939",
}
"""Each named format's colour, by its canonical name (`Format.name`)."""
_SPARE_COLOURS = ("#e6550d", "#31a354", "#756bb1", "#ad494a", "#5254a3", "#b5cf6b", "#de9ed6", "#9c9ede")

SERIES_COLOURS = ("#222222", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#bcbd22", "#7f7f7f", "#1f77b4",
                  "#2ca02c", "#9467bd")
"""Lines that are not formats (methods, data sets, models), in order; the first four avoid the
colours of FP16, BF16, E4M3 and E5M2."""
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")
LINESTYLES = ("-", "--", "-.", ":")

WINDOW = {"color": "#a1d99b", "alpha": 0.45, "zorder": 0}
"""The shading of a window of good loss scales (predicted or shared), in every figure that has one."""
RECOMMENDED = {"color": "black", "lw": 1.6}
"""The line at a recommended loss scale."""
SUBNORMAL_ALPHA, NORMAL_ALPHA = 0.3, 0.85
"""A format's range bar: its subnormal binades light, its normal binades dark."""
BINADE_LABEL = "log2 |x|  (binade exponent e: |x| = 2^e)"
LITERAL = {"parse_math": False}
"""Text keyword arguments that draw a user's name as written: no mathtext for '$', '_' or '^'."""


def format_colour(fmt) -> str:
    """The colour of a format (a Format, or a name or alias); a custom format gets a fixed colour of its own."""
    from ..formats import Format, format as get_format

    name = fmt.name if isinstance(fmt, Format) else str(fmt)
    if name not in FORMAT_COLOURS:
        try:
            name = get_format(name).name
        except ValueError:   # a label of a format fpsim does not name: still one colour, always the same
            pass
    if name in FORMAT_COLOURS:
        return FORMAT_COLOURS[name]
    return _SPARE_COLOURS[zlib.crc32(name.encode()) % len(_SPARE_COLOURS)]


def series_style(i: int) -> dict:
    """Colour, marker and line style of the i-th series that is not a format."""
    return {"color": SERIES_COLOURS[i % len(SERIES_COLOURS)], "marker": MARKERS[i % len(MARKERS)],
            "linestyle": LINESTYLES[(i // len(SERIES_COLOURS)) % len(LINESTYLES)]}


def figure(width: float, height: float, *, layout: str | None = "constrained", rows: int = 0, cols: int = 1,
           **subplot_kw):
    """A Figure on the Agg canvas (fpsim.plots.canvas), outside pyplot's state, and (with rows) its axes (2-d).

    layout: "constrained" fits the labels for you (it costs a layout pass per save); None keeps
    fixed margins, set by the caller, for figures drawn often (the analyzer's report).
    """
    from matplotlib.figure import Figure

    from .canvas import canvas_class

    fig = Figure(figsize=(width, height), layout=layout)
    canvas_class()(fig)
    if rows:
        return fig, fig.subplots(rows, cols, squeeze=False, **subplot_kw)
    return fig


def rc():
    """A context manager applying RC while a figure is built."""
    import matplotlib

    return matplotlib.rc_context(RC)


def binade_axis(ax, label: str = BINADE_LABEL, decimal: bool = True) -> None:
    """x axis in log2 units, with a decimal (log10) scale on top."""
    ax.set_xlabel(label)
    if decimal:
        top = ax.secondary_xaxis("top", functions=(lambda e: e * math.log10(2), lambda d: d / math.log10(2)))
        top.set_xlabel("log10 |x|")


def bars(ax, rows, lefts, widths, height: float = 0.6, **style):
    """Horizontal bars (row y, from left, of width) as one artist, without autoscaling: the caller sets
    the limits. A report draws a bar per layer and format; one collection each costs as much as a figure."""
    from matplotlib.collections import PolyCollection

    h = height / 2
    boxes = [((x, y - h), (x + w, y - h), (x + w, y + h), (x, y + h)) for y, x, w in zip(rows, lefts, widths)]
    return ax.add_collection(PolyCollection(boxes, **style), autolim=False)


def format_bands(ax, bands, fontsize=None) -> None:
    """One row per band, the first on top: (label, format name, first subnormal, first normal, end) in
    log2 units, drawn light over the subnormal binades and dark over the normal ones, in the format's
    colour. Each bar carries gid "format:NAME" so that a figure's format colours can be read back."""
    n = len(bands)
    for i, (label, name, lo_sub, lo_norm, hi) in enumerate(bands):
        colour, y = format_colour(name), n - 1 - i
        if lo_norm > lo_sub:
            bars(ax, [y], [lo_sub], [lo_norm - lo_sub], facecolors=colour, alpha=SUBNORMAL_ALPHA, hatch="///",
                 edgecolors=colour, linewidths=0, gid=f"format:{name}")
        bars(ax, [y], [lo_norm], [hi - lo_norm], facecolors=colour, alpha=NORMAL_ALPHA, gid=f"format:{name}")
    ax.set_yticks(range(n), [shown(b[0]) for b in reversed(bands)], **({"fontsize": fontsize} if fontsize else {}),
                  **LITERAL)
    ax.set_ylim(-0.6, n - 0.4)
    ax.grid(axis="y", visible=False)


def shown(name) -> str:
    """A name as it is drawn: as written, but a control character (a tab, a newline) as its escape
    (no font has a glyph for it, and a newline would break the row)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(name))


def row_labels(ax, names, positions=None, fontsize: float = 8) -> None:
    """Name each row of `ax` (at y = positions, default 0, 1, ...) at its left, as written. Text
    artists instead of y ticks: a tick is five artists, and a report figure has up to 64 rows."""
    transform = ax.get_yaxis_transform()   # x in axes fraction, y in data
    for y, name in zip(range(len(names)) if positions is None else positions, names):
        ax.text(-0.006, y, shown(name), transform=transform, ha="right", va="center", fontsize=fontsize,
                clip_on=False, **LITERAL)
    ax.set_yticks([])


def outside_legend(fig, axes, title: str | None = None, ncol: int = 1, loc: str = "outside right upper"):
    """One figure legend, outside the axes (constrained layout makes room), of every labelled artist."""
    handles, labels = [], []
    for ax in axes if isinstance(axes, (list, tuple)) else [axes]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if label not in labels and not label.startswith("_"):
                handles.append(handle)
                labels.append(label)
    if handles:
        fig.legend(handles, labels, loc=loc, title=title, ncol=ncol, frameon=False)
