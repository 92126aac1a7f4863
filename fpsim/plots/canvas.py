"""The Agg canvas every fpsim figure is drawn on: matplotlib's own, with plain text rasterised a string
at a time.

matplotlib 3.11's Agg renderer lays out each string with libraqm and then renders it glyph by glyph
from Python (a FreeType call, a transform and a blit per glyph), and it shapes the string twice: to
measure it and to draw it. A report figure holds a few hundred labels, so that is most of its time.
This renderer shapes each string once (FT2Font.set_text, the call the measurement makes anyway),
rasterises the whole string into one bitmap with FreeType (draw_glyphs_to_bitmap: the way matplotlib
drew text up to 3.10) and blits it once; a string drawn again, on this figure or a later one, reuses
its bitmap. Same fonts, hinting, kerning and placement (to a pixel); mathtext, TeX and anything this
path cannot do go to matplotlib's own path.
"""

from __future__ import annotations

import math

_CLASSES: list = []
_STRINGS: dict = {}
"""(text, font file, size, dpi, hinting) -> (width, height, descent, bitmap, x, y offsets): the strings shaped and
rasterised so far, shared by every figure (a report's figures repeat the same layer names)."""
MAX_STRINGS = 8192
"""Strings kept at most (then the cache starts again): a few MB."""


def canvas_class():
    """FigureCanvasAgg with the renderer described above (made on first use: matplotlib is imported lazily)."""
    if _CLASSES:
        return _CLASSES[0]
    from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg, get_hinting_flag

    class StringRenderer(RendererAgg):
        """RendererAgg drawing plain text a whole string at a time (see the module doc)."""

        def _string(self, s, prop):
            font = self._prepare_font(prop)
            flags = get_hinting_flag()
            key = (s, font.fname, prop.get_size_in_points(), self.dpi, flags)
            entry = _STRINGS.get(key)
            if entry is None:
                font.set_text(s, 0.0, flags=flags)
                width, height = font.get_width_height()
                font.draw_glyphs_to_bitmap(antialiased=True)
                if len(_STRINGS) >= MAX_STRINGS:
                    _STRINGS.clear()
                entry = _STRINGS[key] = (width / 64.0, height / 64.0, font.get_descent() / 64.0,
                                         font.get_image(), *font.get_bitmap_offset())
            return entry

        def get_text_width_height_descent(self, s, prop, ismath):
            if ismath:
                return super().get_text_width_height_descent(s, prop, ismath)
            try:
                width, height, descent = self._string(s, prop)[:3]
            except Exception:  # noqa: BLE001 (a matplotlib whose internals differ: its own way)
                return super().get_text_width_height_descent(s, prop, ismath)
            return width, height, descent

        def draw_text(self, gc, x, y, s, prop, angle, ismath=False, mtext=None):
            if ismath or not gc.get_antialiased():
                return super().draw_text(gc, x, y, s, prop, angle, ismath, mtext)
            try:
                _, _, descent, bitmap, x_offset, y_offset = self._string(s, prop)
            except Exception:  # noqa: BLE001 (as above)
                return super().draw_text(gc, x, y, s, prop, angle, ismath, mtext)
            # as matplotlib 3.10's draw_text: the bitmap's corner, moved by the descent along the angle
            x = round(x + x_offset / 64.0 + descent * math.sin(math.radians(angle)))
            y = round(y + y_offset / 64.0 + descent * math.cos(math.radians(angle)))
            self._renderer.draw_text_image(bitmap, x, y + 1, angle, gc)

    class StringCanvas(FigureCanvasAgg):
        """FigureCanvasAgg drawing through StringRenderer."""

        def get_renderer(self):
            w, h = self.get_width_height(physical=True)
            key = w, h, self.figure.dpi
            if self._lastKey != key:
                self.renderer = StringRenderer(w, h, self.figure.dpi)
                self._lastKey = key
            return self.renderer

    try:   # the matplotlib internals this uses; without them, matplotlib's canvas as it is
        from matplotlib.ft2font import FT2Font

        needed = ("set_text", "get_width_height", "draw_glyphs_to_bitmap", "get_image", "get_bitmap_offset",
                  "get_descent")
        usable = all(hasattr(FT2Font, name) for name in needed) and hasattr(RendererAgg, "_prepare_font")
    except ImportError:
        usable = False
    _CLASSES.append(StringCanvas if usable else FigureCanvasAgg)
    return _CLASSES[0]
