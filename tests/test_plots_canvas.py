"""fpsim.plots.canvas draws text as matplotlib's own Agg canvas does: the oracle is matplotlib's
FigureCanvasAgg drawing the same figure (its measurement of every string exactly, its pixels to within
the one-pixel placement of whole-string rasterisation)."""

from __future__ import annotations

import io

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.font_manager import FontProperties  # noqa: E402

from fpsim.plots.canvas import canvas_class  # noqa: E402

STRINGS = ["GPT.transformer.h.11.attn.c_attn:addmm", "fp16 ×2^17", "10⁻⁶", "a $name$ as written", "Wj gy"]


def _pixels(canvas_type) -> np.ndarray:
    fig = Figure(figsize=(6, 4))
    canvas_type(fig)
    ax = fig.add_subplot()
    for i, s in enumerate(STRINGS):
        ax.text(0.05, 0.1 + 0.15 * i, s, fontsize=7 + 2 * i, parse_math=False)
    ax.set_ylabel("a rotated label, 90°")
    ax.set_title("$2^{-24}$ in mathtext")          # mathtext goes matplotlib's own way
    buffer = io.BytesIO()
    fig.savefig(buffer, format="rgba", dpi=100)
    width, height = fig.canvas.get_width_height()
    return np.frombuffer(buffer.getvalue(), np.uint8).reshape(height, width, 4)[..., :3].astype(float)


def test_the_canvas_is_matplotlibs_agg_with_its_own_renderer():
    canvas = canvas_class()
    assert issubclass(canvas, FigureCanvasAgg) and canvas is not FigureCanvasAgg
    assert canvas_class() is canvas


def test_strings_measure_exactly_as_matplotlib_measures_them():
    fig = Figure()
    ours, theirs = canvas_class()(fig).get_renderer(), FigureCanvasAgg(Figure()).get_renderer()
    for size in (7, 9.5, 12):
        prop = FontProperties(size=size)
        for s in STRINGS:
            assert ours.get_text_width_height_descent(s, prop, False) == \
                theirs.get_text_width_height_descent(s, prop, False)


def test_text_pixels_match_matplotlib_within_a_pixel():
    ours, theirs = _pixels(canvas_class()), _pixels(FigureCanvasAgg)
    ink_ours, ink_theirs = (255 - ours).sum(), (255 - theirs).sum()
    assert abs(ink_ours - ink_theirs) <= 0.02 * ink_theirs     # the same glyphs, the same amount of ink
    for axis in ((1, 2), (0, 2)):            # the rows, then the columns, that hold ink
        a, b = np.flatnonzero((ours < 250).any(axis=axis)), np.flatnonzero((theirs < 250).any(axis=axis))
        assert abs(a[0] - b[0]) <= 1 and abs(a[-1] - b[-1]) <= 1   # everything drawn where matplotlib draws it
    assert (np.abs(ours - theirs).max(axis=-1) > 64).mean() < 0.05
