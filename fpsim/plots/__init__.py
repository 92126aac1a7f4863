"""Figure builders: format ranges, rounding error, log2 histograms against format bands, loss-scale
windows, accumulation error against K, block-sum sweeps, and the analyzer report's heatmaps.

Every builder takes plain numbers or arrays (your own data as well as the studies' and the
analyzer's), returns a `matplotlib.figure.Figure` on the Agg canvas and never shows it: save it
with ``fig.savefig("x.png")`` or display it in a notebook. matplotlib is imported only when a
builder runs, and pyplot never.

    import fpsim.plots as plots
    plots.format_ranges(["fp16", "bf16", "e4m3", "e5m2"]).savefig("ranges.png")
    plots.log2_histogram({"grad": g}, formats=("fp16", "e4m3"), scale=1024).savefig("h.png")

The package has one job per module: `style` (sizes, fonts, each format's colour: FP16 is the
same red in every figure), `data` (the numbers figures show, computed without matplotlib), and
the drawing modules `ranges`, `losses` and `accumulation`. Axes are labelled with their units
(log2 |x| is the binade exponent: 2^-24 sits at -24), legends sit outside the axes, and names
(layers, series) are drawn as written, whatever characters they hold.
"""

from .accumulation import error_vs_k, sweep
from .data import lost_fractions, relative_error_envelope
from .losses import WindowPanel, layer_windows, loss_curves, loss_scale_window, scale_trajectories, shade_window
from .ranges import DEFAULT_FORMATS, GRADIENT_FORMATS, format_ranges, log2_histogram, magnitude_heatmap, rounding_error
from .style import FORMAT_COLOURS, format_colour

__all__ = ["DEFAULT_FORMATS", "FORMAT_COLOURS", "GRADIENT_FORMATS", "WindowPanel", "error_vs_k", "format_colour",
           "format_ranges", "layer_windows", "log2_histogram", "loss_curves", "loss_scale_window", "lost_fractions",
           "magnitude_heatmap", "relative_error_envelope", "rounding_error", "scale_trajectories", "shade_window",
           "sweep"]
