"""Figure builders: they return labelled Agg figures with legends off the data, refuse bad input,
and keep matplotlib out of `import fpsim`. Expected numbers come from the format definitions
(written out by hand) and IEEE round-to-nearest, never from the builders themselves."""

from __future__ import annotations

import io
import subprocess
import sys

import numpy as np
import pytest
import torch

from fpsim import plots

matplotlib = pytest.importorskip("matplotlib")
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402


def _figures():
    rng = np.random.default_rng(0)
    grads = {"activation grads": rng.lognormal(-18, 3, 5000) * rng.choice([-1, 1], 5000),
             "weight grads": torch.tensor(rng.lognormal(-10, 2, 3000))}
    ks = [16, 64, 256, 1024]
    return {
        "format_ranges": plots.format_ranges(),
        "format_ranges_narrow": plots.format_ranges(["fp16", "e4m3"], xlim=(-30, 20)),
        "rounding_error": plots.rounding_error(["fp16", "bf16", "e4m3"], points_per_binade=32),
        "log2_histogram": plots.log2_histogram(grads),
        "log2_histogram_scaled": plots.log2_histogram(grads["activation grads"], formats=("fp16",), scale=2.0 ** 10),
        "log2_histogram_binned": plots.log2_histogram({"binned": (np.arange(-30, 1), np.ones(30))}),
        "loss_scale_window": plots.loss_scale_window(
            [1, 2, 4, 8, 16], {"fp16 grads": [2.0, 1.0, 0.5, 0.5, float("nan")]}, window=(4, 8), reference=0.5),
        "error_vs_k": plots.error_vs_k(ks, {"a": [1e-7, 2e-7, 4e-7, 8e-7], "b": [1e-3, 0, 1e-2, 2e-2]},
                                       points=[(256, 0.02, "published")]),
        "error_vs_k_panels": plots.error_vs_k(ks, None, panels={"left": {"a": [1, 2, 3, 4]},
                                                                "right": {"a": [4, 3, 2, 1], "b": [1, 1, 1, 1]}}),
        "error_vs_k_exact": plots.error_vs_k(ks, {"exact": [0, 0, 0, 0]}),
        "error_vs_k_exact_panel": plots.error_vs_k(ks, None, panels={"left": {"exact": [0, 0, 0, 0]},
                                                                     "right": {"b": [1e-3, 0, 1e-2, 2e-2]}}),
        "loss_curves": plots.loss_curves({"fp32": [2.0, 1.0, 0.5], "fp16": [2.0, float("inf"), float("nan")]}),
        "sweep": plots.sweep([0, 1, 2, 3], {"model": [0, 1, 0, 1]}, exact=[0, 1, 2, 3], xlabel="c (units)",
                             ylabel="d (units)", marks=[(2, "boundary")]),
    }


@pytest.fixture(scope="module")
def figures():
    return _figures()


def test_builders_return_agg_figures_that_save(figures):
    for name, fig in figures.items():
        assert isinstance(fig, Figure), name
        assert isinstance(fig.canvas, FigureCanvasAgg), name
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
        assert buffer.getvalue().startswith(b"\x89PNG"), name


def test_every_axis_is_labelled(figures):
    for name, fig in figures.items():
        for ax in fig.axes:
            if not ax.get_visible() or ax.get_label() == "<colorbar>":
                continue
            # shared x axes label only the bottom panel; shared y axes only the first
            if ax.get_xlabel() == "":
                assert any(other.get_xlabel() for other in fig.axes if other is not ax), name
            assert ax.get_ylabel() or any(o.get_ylabel() for o in fig.axes if o is not ax), name


def test_legends_sit_outside_every_axes(figures):
    for name, fig in figures.items():
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        for ax in fig.axes:
            assert ax.get_legend() is None, f"{name}: legend drawn inside the axes"
        for legend in fig.legends:
            box = legend.get_window_extent(renderer)
            for ax in fig.axes:
                assert not box.overlaps(ax.get_window_extent(renderer)), f"{name}: legend overlaps an axes"


def test_every_artist_lies_inside_the_saved_figure(figures):
    for name, fig in figures.items():
        fig.savefig(io.BytesIO(), format="png")
        renderer = fig.canvas.get_renderer()
        boxes = [ax.get_tightbbox(renderer) for ax in fig.axes if ax.get_visible()]
        boxes += [legend.get_window_extent(renderer) for legend in fig.legends]
        for box in boxes:
            assert box.x0 >= -1 and box.y0 >= -1, f"{name}: clipped at the left or bottom"
            assert box.x1 <= fig.bbox.x1 + 1 and box.y1 <= fig.bbox.y1 + 1, f"{name}: clipped at the right or top"


def test_a_format_has_one_colour_in_every_builder():
    """Read back from the drawn artists: fp16's range bar, its error curve and its subnormal line agree."""
    from matplotlib.colors import to_rgb

    def colours(fig, name):
        found = set()
        for artist in fig.findobj(lambda a: a.get_gid() == f"format:{name}"):
            if hasattr(artist, "get_xydata"):
                found.add(to_rgb(artist.get_color()))
            elif getattr(artist, "get_fill", lambda: True)():
                found.update(to_rgb(c) for c in np.atleast_2d(artist.get_facecolor()))
            else:
                found.add(to_rgb(artist.get_edgecolor()))
        return found

    figs = [plots.format_ranges(["bf16", "fp16"]), plots.rounding_error(["fp16", "e4m3"], points_per_binade=8),
            plots.log2_histogram(np.array([1e-3, 1.0]), ("e5m2", "fp16"))]
    found = [colours(fig, "fp16") for fig in figs]
    assert all(len(f) == 1 for f in found) and found[0] == found[1] == found[2]
    assert colours(figs[0], "bf16") != found[0]
    assert plots.format_colour("float16") == plots.format_colour("fp16")   # aliases are the same format


def test_every_preset_has_a_colour_of_its_own():
    from fpsim.formats import PRESETS

    assert len({plots.format_colour(name) for name in PRESETS}) == len(PRESETS)


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")   # matplotlib's own savefig: it raised for a log axis with no data
    return buffer.getvalue()


def _legend_texts(fig) -> list:
    return [t.get_text() for legend in fig.legends for t in legend.get_texts()]


def test_error_vs_k_of_an_exact_method_saves_and_says_so():
    # an exact kernel (one of the studies' own methods) has error 0 at every K: a log axis cannot show it,
    # so the legend says it, and the figure still saves as a PNG (the signature from the PNG specification)
    ks = [16, 64, 256]
    fig = plots.error_vs_k(ks, {"exact": [0.0, 0.0, 0.0]})
    assert _png(fig).startswith(b"\x89PNG\r\n\x1a\n")
    assert _legend_texts(fig) == ["exact: error 0 at every K (exact)"]
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert any("nothing to show on a log axis" in t for t in texts)
    beside = plots.error_vs_k(ks, {"exact": [0.0, 0.0, 0.0], "fp32": [1e-7, 0.0, 4e-7]})
    assert _png(beside).startswith(b"\x89PNG\r\n\x1a\n")
    assert _legend_texts(beside) == ["exact: error 0 at every K (exact)", "fp32"]
    for nothing in ([float("nan")] * 3, [float("inf")] * 3):
        assert _png(plots.error_vs_k(ks, {"x": nothing})).startswith(b"\x89PNG\r\n\x1a\n")


def test_log_axis_builders_save_when_no_value_is_positive():
    # every builder with a log axis, given only values a log axis cannot show
    figs = [plots.error_vs_k([16, 64], None, panels={"a": {"exact": [0, 0]}, "b": {"exact": [0, 0]}}),
            plots.rounding_error(["fp64"], log2_range=(0, 4), points_per_binade=8),   # fp64 holds every 2^e
            plots.loss_curves({"zero": [0.0, 0.0], "broke": [float("nan"), float("inf")]}),
            plots.loss_scale_window([1, 2], [0.0, 0.0]),
            plots.loss_scale_window([1, 2], [float("nan"), float("nan")]),
            plots.magnitude_heatmap(["a"], np.zeros((1, 3)), -2, 1, [])]
    for fig in figs:
        assert _png(fig).startswith(b"\x89PNG\r\n\x1a\n")


def test_magnitude_heatmap_refuses_shares_that_do_not_fit_its_rows_and_binades():
    # the docstring's contract: shares of shape (len(rows), hi - lo), each a share in [0, 1]
    rows = ["layer a", "layer b", "layer c"]
    with pytest.raises(ValueError, match=r"\(3, 2\) for 3 rows and binades -2\.\.0, got shape \(1, 7\)"):
        plots.magnitude_heatmap(rows, np.full((1, 7), 0.1), -2, 0, [])
    with pytest.raises(ValueError, match=r"got shape \(3, 7\)"):
        plots.magnitude_heatmap(rows, np.full((3, 7), 0.1), -2, 0, [])
    with pytest.raises(ValueError, match="lo must be below hi, got lo=0 and hi=0"):
        plots.magnitude_heatmap(rows, np.zeros((3, 0)), 0, 0, [])
    with pytest.raises(TypeError, match="lo must be an int"):
        plots.magnitude_heatmap(rows, np.zeros((3, 2)), -2.5, 0, [])
    for bad in (1.5, -0.1, float("nan")):
        with pytest.raises(ValueError, match="shares must lie in \\[0, 1\\]"):
            plots.magnitude_heatmap(rows, np.full((3, 2), bad), -2, 0, [])
    assert _png(plots.magnitude_heatmap(rows, np.full((3, 2), 0.5), -2, 0, [])).startswith(b"\x89PNG")
    assert _png(plots.magnitude_heatmap([], np.zeros((0, 1)), 0, 1, [])).startswith(b"\x89PNG")


def test_relative_error_envelope_matches_round_to_nearest():
    # fp16: unit roundoff u = 2^-11, so the largest error in a normal binade is u / (1 + u)
    binades, env = plots.relative_error_envelope("fp16", -27, 17, points_per_binade=512)
    by_binade = dict(zip(binades.tolist(), env.tolist()))
    u = 2.0 ** -11
    for e in range(-14, 16):
        assert u / (1 + u) * 0.8 <= by_binade[e] <= u / (1 + u)  # the sweep samples, so it may miss the worst point
    assert by_binade[-27] == 1.0            # below 2^-25 everything rounds to zero
    assert by_binade[16] == 1.0             # 65520 and up overflow to Inf
    assert by_binade[-25] == 1.0            # 2^-25 ties to even: 0
    assert 0.3 < by_binade[-24] <= 1 / 3    # [2^-24, 2^-23) rounds to 2^-24 or 2^-23: worst at 1.5 * 2^-24


def test_lost_fractions_count_zeros_and_overflow():
    # fp16: 2^-25 is half the smallest subnormal and ties to even (0); 2^-24 survives; 70000 > 65520 overflows
    values = np.array([2.0 ** -25, 2.0 ** -24, 1.0, 70000.0, 0.0, np.nan])
    assert plots.lost_fractions(values, "fp16") == (0.25, 0.25)
    # scaling by 2 rescues 2^-25 and pushes 1 and 70000 ... only 70000 beyond max
    assert plots.lost_fractions(values, "fp16", scale=2.0) == (0.0, 0.25)
    assert plots.lost_fractions(torch.tensor([1e-9, 1.0]), "bf16") == (0.0, 0.0)


@pytest.mark.parametrize("call", [
    lambda: plots.format_ranges(["fp99"]),
    lambda: plots.format_ranges([]),
    lambda: plots.log2_histogram({"x": [1.0]}, scale=0),
    lambda: plots.log2_histogram({}),
    lambda: plots.log2_histogram({"h": (np.arange(3), np.ones(3))}),
    lambda: plots.loss_scale_window([1, 2], [1.0]),
    lambda: plots.loss_scale_window([0, 2], [1.0, 2.0]),
    lambda: plots.loss_scale_window([1, 2], [1.0, 2.0], window=(4, 2)),
    lambda: plots.error_vs_k([16, 32], {"a": [1.0]}),
    lambda: plots.error_vs_k([16, 32], {}),
    lambda: plots.error_vs_k([16, 32], {"signed": [1e-3, -1e-3]}),
    lambda: plots.error_vs_k([16, 32], {"a": [1e-3, 1e-2]}, points=[(16, 0.0, "published")]),
    lambda: plots.sweep([0, 1], {"a": [0]}, xlabel="x", ylabel="y"),
    lambda: plots.relative_error_envelope("fp16", 3, 1),
    lambda: plots.loss_curves({}),
])
def test_bad_input_is_refused(call):
    with pytest.raises((ValueError, TypeError)):
        call()


def test_import_fpsim_leaves_matplotlib_alone_and_builders_skip_pyplot():
    code = ("import sys, fpsim, fpsim.plots; a = 'matplotlib' in sys.modules; "
            "fpsim.plots.format_ranges(['fp16']); print(a, 'matplotlib.pyplot' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]
