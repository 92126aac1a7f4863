"""The report's figures as matplotlib really draws them: every artist inside the saved canvas
(nothing clipped, the colorbar included), legends clear of the axes, layer names of any characters
drawn as written, and each format in the same colour as in the studies' figures.

Sources of truth: matplotlib's own renderer (window extents of the drawn artists, and its
`Text._preprocess_math`, which decides whether a string is rendered as mathtext) and the colours
read back from the drawn artists of the two figure families; nothing is taken from fpsim's style table.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from fpsim import plots
from fpsim.analyze import figures, watch
from fpsim.analyze.demo import SensorNet, sensor_data, train

matplotlib = pytest.importorskip("matplotlib")
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.text import Text  # noqa: E402

ODD_NAMES = ("cost$a", "x_1^2", "$\\frac{1}{0}$", "back\\slash{", "tab\there", "plain")
DRAWN = {"tab\there": "tab\\there"}   # a control character is drawn as its escape: no font has its glyph


class OddNames(nn.Module):
    """Layers whose names hold mathtext's special characters."""

    def __init__(self):
        super().__init__()
        for i, name in enumerate(ODD_NAMES):
            self.add_module(name, nn.Linear(8 if i == 0 else 16, 16))
        self.out = nn.Linear(16, 3)

    def forward(self, x):
        for name in ODD_NAMES:
            x = torch.tanh(getattr(self, name)(x))
        return self.out(x)


@pytest.fixture(scope="module")
def report():
    torch.manual_seed(0)
    model = SensorNet(hidden=16, depth=3)
    with watch(model, every=2) as w:
        train(model, sensor_data(samples=512), 4, batch=128)
    return w.report()


@pytest.fixture(scope="module")
def odd_report():
    torch.manual_seed(0)
    model = OddNames()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch(model) as w:
        for _ in range(3):
            x = torch.randn(32, 8)
            loss = nn.functional.cross_entropy(model(x), torch.randint(0, 3, (32,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return w.report()


def _saved(fig):
    """Save as report.save does, then return the renderer of that draw."""
    if not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    fig.savefig(io.BytesIO(), format="png", dpi=100)
    return fig.canvas.get_renderer()


def test_every_artist_lies_inside_the_saved_figure(report):
    for name, fig in report.figures().items():
        renderer = _saved(fig)
        canvas = fig.bbox
        boxes = [(f"axes {ax.get_label() or i}", ax.get_tightbbox(renderer)) for i, ax in enumerate(fig.axes)
                 if ax.get_visible()]
        boxes += [("legend", leg.get_window_extent(renderer)) for leg in fig.legends]
        if fig._suptitle is not None:
            boxes.append(("suptitle", fig._suptitle.get_window_extent(renderer)))
        for what, box in boxes:
            assert box.x0 >= canvas.x0 - 1 and box.y0 >= canvas.y0 - 1, f"{name}: {what} clipped at the left/bottom"
            assert box.x1 <= canvas.x1 + 1 and box.y1 <= canvas.y1 + 1, f"{name}: {what} clipped at the right/top"


def test_the_colorbar_and_its_label_are_inside(report):
    fig = figures.magnitude_heatmap(report, "activation_grad")
    renderer = _saved(fig)
    bars = [image.colorbar for ax in fig.axes for image in ax.images if image.colorbar is not None]
    assert len(bars) == 1
    box = bars[0].ax.get_tightbbox(renderer)
    assert bars[0].ax.yaxis.label.get_text() and box.x1 <= fig.bbox.x1


def test_figure_legends_leave_the_axes_and_their_labels_clear(report):
    for name, fig in report.figures().items():
        renderer = _saved(fig)
        for legend in fig.legends:
            box = legend.get_window_extent(renderer)
            for ax in fig.axes:
                assert not box.overlaps(ax.get_tightbbox(renderer)), f"{name}: the legend covers an axes or its labels"


def test_names_of_any_characters_are_drawn_as_written(odd_report, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")    # a figure left out warns, and so does a glyph missing from the font
        paths = odd_report.save(tmp_path)
    assert "loss_scale_windows.png" in paths and "magnitudes_activation.png" in paths
    for name, fig in odd_report.figures().items():
        if name == "gradscaler.png":
            continue
        _saved(fig)
        expected = {DRAWN.get(n, n) for n in ODD_NAMES}
        labels = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text() in expected]
        drawn = {t.get_text() for t in labels}
        assert expected <= drawn, f"{name}: {sorted(expected - drawn)} missing"
        for t in labels:
            assert t._preprocess_math(t.get_text()) == (t.get_text(), False), f"{name}: {t.get_text()!r} as mathtext"


def _format_colours(figs) -> dict:
    """{format name: set of RGB colours} of the drawn artists tagged as that format's."""
    out = {}
    for fig in figs:
        _saved(fig)
        for artist in fig.findobj(lambda a: str(a.get_gid() or "").startswith("format:")):
            name = artist.get_gid().split(":", 1)[1]
            if isinstance(artist, Line2D):
                colours = [artist.get_color()]
            elif isinstance(artist, Patch) and not artist.get_fill():   # a step line
                colours = [artist.get_edgecolor()]
            else:
                colours = np.atleast_2d(artist.get_facecolor())
            out.setdefault(name, set()).update(tuple(round(c, 4) for c in to_rgb(colour)) for colour in colours)
    return out


def test_analyzer_and_study_figures_give_a_format_one_colour(report):
    analyzer = _format_colours(report.figures().values())
    # the studies' figures, drawn as studies/gradient_underflow.py and studies/format_ranges.py draw them
    rng = np.random.default_rng(0)
    study = _format_colours([
        plots.log2_histogram({"activation gradients": rng.lognormal(-18, 3, 2000)}, ("fp16", "bf16", "e4m3", "e5m2")),
        plots.format_ranges(["fp32", "bf16", "fp16", "e5m2", "e4m3"]),
        plots.rounding_error(["fp16", "bf16", "e4m3"], points_per_binade=8),
    ])
    assert {"fp16", "bf16", "e4m3", "e5m2"} <= set(analyzer) and {"fp16", "bf16", "e4m3", "e5m2"} <= set(study)
    for name in set(analyzer) | set(study):
        seen = analyzer.get(name, set()) | study.get(name, set())
        assert len(seen) == 1, f"{name} drawn in {len(seen)} colours: {sorted(seen)}"
    colours = {name: next(iter(analyzer.get(name) or study[name])) for name in set(analyzer) | set(study)}
    assert len(set(colours.values())) == len(colours), f"two formats share a colour: {colours}"


def test_a_kind_or_format_the_report_cannot_have_is_refused(report):
    # the kinds a record holds are fpsim.analyze.store's; a misspelt kind drew an empty "no ... recorded"
    # figure, and a format the report lacks was silently left out of the bands
    allowed = "activation, activation_grad, weight, weight_grad, optimizer_grad, update"
    with pytest.raises(ValueError, match=f"unknown tensor kind 'not_a_kind'; allowed: {allowed}"):
        figures.magnitude_heatmap(report, "not_a_kind")
    with pytest.raises(ValueError, match="no format 'fp99'; allowed: fp16, bf16, e4m3, e5m2"):
        figures.magnitude_heatmap(report, "activation_grad", formats=["fp99"])
    with pytest.raises(ValueError, match="no format 'e3m2'; allowed: fp16, bf16, e4m3, e5m2"):
        figures.loss_scale_windows(report, ["e3m2"])
    # names and aliases of the report's formats, a single name as a string too
    fig = figures.magnitude_heatmap(report, "weight_grad", formats="float16")
    assert {a.get_gid() for a in fig.findobj(lambda a: str(a.get_gid() or "").startswith("format:"))} == {"format:fp16"}
