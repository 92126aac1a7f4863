"""From counts to decisions: loss-scale windows, the recommended scale, FP8 recipes, per-layer verdicts.

Every fraction is a count from the exact histograms over the nonzero finite
values of a tensor kind, summed over all observed steps. A loss scale 2^s
multiplies gradients only (activation_grad, weight_grad); activations and
weights are judged at scale 1. A tensor's window is the set of s where its
underflow fraction is at most `underflow_threshold` and nothing overflows
(decided exactly from the amax); underflow falls and overflow grows with s,
so windows are intervals. Underflow beyond the threshold is forgiven where it
cannot matter: when the values that flush carry so little of the tensor's
norm that losing them adds less relative L2 error than one rounding in the
format (2^-(man_bits + 1)), as the rounding noise of a gradient that is
exactly zero in exact arithmetic does (a key projection's bias: softmax
cancels it), however many values it holds. Formats of 8 bits or fewer are
judged with one power-of-two scale per tensor instead, 2^s with amax * 2^s <= max (delayed
scaling with an amax history as long as the run), less `fp8_margin` binades.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import numpy as np

from .effect import effects
from .histogram import Log2Histogram
from .store import GRADIENT_KINDS

FORWARD_KINDS = ("activation", "weight")
VERDICTS = ("ok", "loss_scale", "fp32")
MAX_HEADROOM = 8
"""The recommended scale sits at most this many binades above the window's lower end."""
FLUSH_SCALES = 256
"""TensorStats.flush_error is computed for the log2 scales -FLUSH_SCALES..FLUSH_SCALES at once (beyond them, as
at their ends: nothing or everything flushes)."""
OVERFLOW_SEARCH = 1024
"""TensorStats.overflows_at searches the first overflowing log2 scale in -OVERFLOW_SEARCH..OVERFLOW_SEARCH (and
asks `overflows` itself beyond)."""


def unit_roundoff(lim) -> float:
    """The relative error of one round-to-nearest in the format: half its machine epsilon, 2^-(man_bits + 1)."""
    return float(lim.fmt.eps) / 2

INTENDED_INF_OPS = ("masked_fill", "masked_fill_", "fill", "fill_", "where", "index_put", "index_put_",
                    "masked_scatter", "clamp", "max", "min", "amax", "amin")
"""Ops whose Inf outputs are put there on purpose (-inf attention masks) or passed through: no overflow, no alarm."""

MASK_VALUES = (3.4028234663852886e38, 3.3895313892515355e38)
"""torch.finfo(float32).max and torch.finfo(bfloat16).max: a tensor whose largest magnitude is one of these holds
masks (transformers fills attention scores with torch.finfo(dtype).min; an add passes it on), stand-ins for
-inf that a softmax turns into 0. They become ±Inf in a narrower format, as -inf masks are, and, like them, are
no overflow: the other values are judged. (A genuine value in float32's top binade, 2^127 and above, is left
out with them.)"""
MASK_BINADE = 127

_KIND_WORDS = {"activation": "activations", "activation_grad": "activation gradients", "weight": "weights",
               "weight_grad": "weight gradients", "optimizer_grad": "gradients as the optimizer used them",
               "update": "updates"}


@dataclasses.dataclass(frozen=True)
class Settings:
    """What the verdicts tolerate."""

    underflow_threshold: float = 1e-3
    fp8_margin: int = 0
    scale_range: tuple = (-32, 64)

    @classmethod
    def checked(cls, underflow_threshold, fp8_margin, scale_range) -> "Settings":
        if isinstance(underflow_threshold, bool) or not isinstance(underflow_threshold, (int, float)) \
                or not 0 <= underflow_threshold < 1:
            raise ValueError(f"underflow_threshold must be a fraction in [0, 1), got {underflow_threshold!r}")
        if isinstance(fp8_margin, bool) or not isinstance(fp8_margin, int) or fp8_margin < 0:
            raise ValueError(f"fp8_margin must be an int >= 0 (binades of headroom), got {fp8_margin!r}")
        try:
            lo, hi = scale_range
        except (TypeError, ValueError):
            lo = hi = None
        if any(isinstance(v, bool) or not isinstance(v, numbers.Integral) for v in (lo, hi)):
            raise ValueError(f"scale_range must be two ints (log2 of the smallest and largest loss scale "
                             f"searched), got {scale_range!r}")
        lo, hi = int(lo), int(hi)
        if lo > 0 or hi < 0 or hi - lo > 512:
            raise ValueError(f"scale_range must hold 0 and span at most 512 binades, got {scale_range!r}")
        return cls(float(underflow_threshold), fp8_margin, (lo, hi))


@dataclasses.dataclass
class TensorStats:
    """Everything counted for one (layer, kind)."""

    layer: str
    kind: str
    hist: Log2Histogram
    amax: float
    first_nonfinite_step: int | None
    samples: int
    lost_updates: dict | None = None
    inf_overflow_threshold: float | None = None
    """When the values were produced in a low-precision dtype (autocast), that dtype's overflow threshold:
    an Inf among them is an overflow of every format whose threshold is not above it."""
    mass: object = None
    """The mass per binade (effect.Mass: sum |x|, sum x^2), None where none was kept (updates)."""
    _windows: dict = dataclasses.field(default_factory=dict, init=False, repr=False, compare=False)
    """(format limits, settings) -> window, ("flush", format limits) -> flush errors by scale: each is asked for
    many times (verdicts, loss scale, report, figures)."""

    @property
    def nonzero(self) -> int:
        return self.hist.nonzero

    def underflow_fraction(self, lim, scale: int = 0) -> float:
        return self.hist.underflow(lim, scale) / self.nonzero if self.nonzero else 0.0

    def underflow_fractions(self, lim, scales) -> np.ndarray:
        """`underflow_fraction` at each of the log2 `scales` at once."""
        counts = self.hist.underflows(lim, scales)
        return counts / self.nonzero if self.nonzero else np.zeros(counts.shape)

    def subnormal_fraction(self, lim, scale: int = 0) -> float:
        return self.hist.subnormal(lim, scale) / self.nonzero if self.nonzero else 0.0

    def overflows(self, lim, scale: int = 0) -> bool:
        """Whether any value overflows at scale 2^scale: exact from the amax when it is finite (and no mask
        value: MASK_VALUES)."""
        masks = self.amax in MASK_VALUES
        if math.isfinite(self.amax) and not masks:
            try:
                return self.amax > 0 and lim.overflows(math.ldexp(self.amax, scale))
            except OverflowError:     # beyond float64: beyond every format
                return True
        if (self.hist.pos_inf or self.hist.neg_inf) and self.inf_overflow_threshold is not None \
                and scale >= 0 and lim.overflow_threshold <= self.inf_overflow_threshold:
            return True
        top = self.hist.top_exponent(MASK_BINADE if masks else None)  # Inf/NaN or masks in the data: judge the
        return top is not None and top + scale >= lim.emax                 # other finite values, conservatively

    def overflows_at(self, lim, scales) -> np.ndarray:
        """`overflows` at each of the log2 `scales` at once. Overflow only grows with the scale (every branch
        of `overflows` is monotone in it), so it is `scales >= s0` for the first overflowing scale s0, found
        by bisection and kept."""
        key = ("first overflow", lim)
        if key not in self._windows:
            lo, hi = -OVERFLOW_SEARCH, OVERFLOW_SEARCH      # lo does not overflow, hi does (or nothing ever does)
            if self.overflows(lim, lo):
                hi = lo
            elif self.overflows(lim, hi):
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    lo, hi = (lo, mid) if self.overflows(lim, mid) else (mid, hi)
            else:
                hi = None
            self._windows[key] = hi
        first, scales = self._windows[key], np.asarray(scales, dtype=np.int64)
        out = np.zeros(scales.shape, bool) if first is None else scales >= first
        beyond = np.flatnonzero(np.abs(scales) > OVERFLOW_SEARCH)      # outside the search: asked one by one
        out[beyond] = [self.overflows(lim, int(s)) for s in scales[beyond]]
        return out

    def overflow_fraction(self, lim, scale: int = 0) -> float:
        """Fraction beyond the overflow threshold; an upper bound when the threshold's binade is partly used."""
        if not self.nonzero or not self.overflows(lim, scale):
            return 0.0
        sure, possible = self.hist.overflow_bounds(lim, scale)
        return max(possible, 1) / self.nonzero

    def flush_error(self, lim, scale: int = 0) -> float | None:
        """The relative L2 error that flushing to zero adds at scale 2^scale: the square root of the share of
        sum x^2 carried by the values that flush (effect.py). None without mass."""
        error = float(self.flush_errors(lim, [scale])[0])
        return None if math.isnan(error) else error

    def flush_errors(self, lim, scales) -> np.ndarray:
        """`flush_error` at each of the log2 `scales` at once (NaN where it is None)."""
        if self.mass is None:
            return np.full(len(scales), np.nan)
        key = ("flush", lim)
        if key not in self._windows:   # every scale at once: windows ask for dozens
            every = np.arange(-FLUSH_SCALES, FLUSH_SCALES + 1)
            lost = effects(self.hist, self.mass, lim, every, False, rounding=False)["mass_lost_l2"]
            self._windows[key] = np.sqrt(lost)
        return self._windows[key][np.clip(np.asarray(scales, dtype=np.int64), -FLUSH_SCALES, FLUSH_SCALES)
                                  + FLUSH_SCALES]

    def underflow_matters(self, lim, scale: int, threshold: float) -> bool:
        return bool(self.underflows_matter(lim, [scale], threshold)[0])

    def underflows_matter(self, lim, scales, threshold: float) -> np.ndarray:
        """Per log2 scale: more than `threshold` of the nonzero values flush to zero at scale 2^scale, and
        together they carry enough of the tensor's norm to matter: flushing them adds more relative L2 error
        than one rounding in the format, 2^-(man_bits + 1) (always, without mass)."""
        errors = self.flush_errors(lim, scales)
        return (self.underflow_fractions(lim, scales) > threshold) & ~(errors <= unit_roundoff(lim))

    def fits(self, lim, scale: int, threshold: float) -> bool:
        return not self.underflow_matters(lim, scale, threshold) and not self.overflows(lim, scale)

    def window(self, lim, settings: Settings):
        """(lo, hi): the log2 loss scales with no underflow that matters and no overflow; None if none."""
        key = (lim, settings)
        if key not in self._windows:
            lo_range, hi_range = settings.scale_range
            if not self.nonzero:
                self._windows[key] = lo_range, hi_range
            else:
                scales = np.arange(lo_range, hi_range + 1)
                fit = ~self.underflows_matter(lim, scales, settings.underflow_threshold) \
                    & ~self.overflows_at(lim, scales)
                ok = scales[fit]
                self._windows[key] = (int(ok[0]), int(ok[-1])) if ok.size else None
        return self._windows[key]

    def tensor_scale(self, lim, margin: int = 0) -> int | None:
        """log2 of the per-tensor scale an FP8 recipe would use: amax * 2^s <= max, less `margin`."""
        s = lim.max_scale_exponent(self.amax)
        if s is None:
            top = self.hist.top_exponent()
            if top is None:
                return None
            s = lim.emax - top - 1
        return s - margin

    def lost_update_fraction(self, lim) -> float | None:
        if self.lost_updates is None or lim.name not in self.lost_updates or not self.nonzero:
            return None
        return self.lost_updates[lim.name] / self.nonzero


@dataclasses.dataclass
class Layer:
    """One entry of the report: a module (its outputs, parameters, gradients) or an op site `Module:op`."""

    name: str
    type: str
    tensors: dict  # kind -> TensorStats
    dtypes: dict = dataclasses.field(default_factory=dict)   # dtype name -> tensors produced in it (ops)
    tied_with: list = dataclasses.field(default_factory=list)

    @property
    def is_op(self) -> bool:
        return self.type == "op"

    @property
    def module(self) -> str:
        """The module an op ran in (for a module entry: its own name)."""
        return self.name.rpartition(":")[0] if self.is_op else self.name

    @property
    def first_nonfinite_step(self) -> int | None:
        if self.is_op and self.name.rpartition(":")[2] in INTENDED_INF_OPS:
            return None
        steps = [t.first_nonfinite_step for t in self.tensors.values() if t.first_nonfinite_step is not None]
        return min(steps) if steps else None

    def gradient_window(self, lim, settings: Settings):
        """Intersection of the windows of the layer's gradient tensors (full range when it has none)."""
        lo, hi = settings.scale_range
        for kind in GRADIENT_KINDS:
            t = self.tensors.get(kind)
            if t is None:
                continue
            w = t.window(lim, settings)
            if w is None:
                return None
            lo, hi = max(lo, w[0]), min(hi, w[1])
            if lo > hi:
                return None
        return lo, hi


@dataclasses.dataclass
class LossScale:
    """One global loss scale for a format: the window that serves the most layers."""

    fmt: str
    recommended_log2: int | None
    min_log2: int | None
    max_log2: int | None
    served: list
    unserved: list
    searched: tuple

    def to_dict(self) -> dict:
        def pw(e):
            return None if e is None else math.ldexp(1.0, e)
        return {"recommended": pw(self.recommended_log2), "min": pw(self.min_log2), "max": pw(self.max_log2),
                "recommended_log2": self.recommended_log2, "min_log2": self.min_log2, "max_log2": self.max_log2,
                "layers_served": len(self.served), "unserved_layers": list(self.unserved),
                "searched_log2": list(self.searched)}


@dataclasses.dataclass
class Verdict:
    verdict: str
    reason: str
    window: tuple | None = None          # the layer's gradient window (loss-scaled formats)
    tensor_scales: dict | None = None    # kind -> log2 per-tensor scale (per-tensor-scaled formats)

    def to_dict(self) -> dict:
        out = {"verdict": self.verdict, "reason": self.reason}
        if self.tensor_scales is None:      # a loss-scaled format: the layer's gradient window
            out["window_log2"] = None if self.window is None else list(self.window)
        else:                               # a per-tensor-scaled format: each kind's scale
            out["tensor_scales_log2"] = dict(self.tensor_scales)
        return out


# ---------------------------------------------------------------- loss scale
def choose_loss_scale(layers: list, lim, settings: Settings) -> LossScale:
    """The window serving the most layers (widest on ties), and a scale inside it.

    Layers without gradient data constrain nothing. The recommended scale is 1
    when the window holds 1, else the window's middle but at most MAX_HEADROOM
    binades above its lower end.
    """
    lo_range, hi_range = settings.scale_range
    windows = {layer.name: layer.gradient_window(lim, settings) for layer in layers}
    best = None  # (count, width, -distance to 0, lo, hi, served)
    s = lo_range
    while s <= hi_range:
        served = frozenset(n for n, w in windows.items() if w is not None and w[0] <= s <= w[1])
        end = s
        while end + 1 <= hi_range and frozenset(
                n for n, w in windows.items() if w is not None and w[0] <= end + 1 <= w[1]) == served:
            end += 1
        distance = 0 if s <= 0 <= end else min(abs(s), abs(end))
        key = (len(served), end - s, -distance)
        if served and (best is None or key > best[0]):
            best = (key, s, end, served)
        s = end + 1
    names = [layer.name for layer in layers]
    if best is None:
        if all(w is not None for w in windows.values()):  # no layer has gradient data: nothing to scale
            return LossScale(lim.name, 0, lo_range, hi_range, names, [], (lo_range, hi_range))
        return LossScale(lim.name, None, None, None, [], names, (lo_range, hi_range))
    _, lo, hi, served = best
    recommended = 0 if lo <= 0 <= hi else min((lo + hi) // 2, lo + MAX_HEADROOM)
    return LossScale(lim.name, recommended, lo, hi, [n for n in names if n in served],
                     [n for n in names if n not in served], (lo_range, hi_range))


# ------------------------------------------------------------------ verdicts
def _pct(fraction: float) -> str:
    if fraction == 0:
        return "0%"
    if fraction < 1e-4:
        return f"{fraction * 100:.1e}%"
    return f"{fraction * 100:.2g}%" if fraction < 0.1 else f"{fraction * 100:.0f}%"


def _pow2(e: int) -> str:
    return f"2^{e}"


def loss_scaled_verdict(layer: Layer, lim, choice: LossScale, settings: Settings) -> Verdict:
    """ok / loss_scale / fp32 for a format used with one global loss scale (fp16, bf16, ...)."""
    thr = settings.underflow_threshold
    problems = []
    for kind in FORWARD_KINDS:
        t = layer.tensors.get(kind)
        if t is None or not t.nonzero:
            continue
        if t.overflows(lim, 0):
            problems.append(f"{_KIND_WORDS[kind]} overflow {lim.name}: max |x| = {t.amax:.3g} "
                            f"> {lim.max:.6g}")
        if t.underflow_matters(lim, 0, thr):
            problems.append(f"{_pct(t.underflow_fraction(lim, 0))} of nonzero {_KIND_WORDS[kind]} flush to zero "
                            f"in {lim.name}{_carrying(t, lim, 0)} (no loss scale applies to them)")
    window = layer.gradient_window(lim, settings)
    grads = [layer.tensors[k] for k in GRADIENT_KINDS if k in layer.tensors and layer.tensors[k].nonzero]
    needs_scale = False
    if grads:
        worst0 = max(grads, key=lambda t: (t.underflow_matters(lim, 0, thr), t.underflow_fraction(lim, 0)))
        uf0 = worst0.underflow_fraction(lim, 0)
        if window is None:
            lo, hi = settings.scale_range
            alone = [t for t in grads if t.window(lim, settings) is None]
            if alone:
                t = alone[0]
                problems.append(f"no loss scale in {_pow2(lo)}..{_pow2(hi)} keeps the underflow of its "
                                f"{_KIND_WORDS[t.kind]} <= {_pct(thr)} without overflow (they span {_span(t)} "
                                f"binades; {lim.name} holds {lim.emax - lim.zero_exponent})")
            else:
                spans = ", ".join(f"{_KIND_WORDS[t.kind]} {_pow2(w[0])}..{_pow2(w[1])}"
                                  for t in grads for w in [t.window(lim, settings)])
                problems.append(f"its gradients need loss scales that do not overlap ({spans})")
        elif choice.recommended_log2 is None or not window[0] <= choice.recommended_log2 <= window[1]:
            r = choice.recommended_log2
            problems.append(f"needs a loss scale in {_pow2(window[0])}..{_pow2(window[1])}"
                            + ("" if r is None else f", {'above' if r < window[0] else 'below'} the recommended "
                               f"{_pow2(r)} that serves the other layers"))
        elif not window[0] <= 0 <= window[1]:
            needs_scale = True
            r = choice.recommended_log2
            if worst0.overflows(lim, 0):
                why = f"{_KIND_WORDS[worst0.kind]} overflow at scale 1"
            else:
                why = f"{_pct(uf0)} of nonzero {_KIND_WORDS[worst0.kind]} underflow at scale 1" \
                      f"{_carrying(worst0, lim, 0)}"
            after = max(t.underflow_fraction(lim, r) for t in grads)
            reason = (f"{why}; loss scale {_pow2(r)} keeps underflow at {_pct(after)} without overflow "
                      f"(this layer's window {_pow2(window[0])}..{_pow2(window[1])})")
    nonfinite = layer.first_nonfinite_step
    if problems:
        text = "; ".join(problems)
        if nonfinite is not None:
            text += f"; it produced Inf/NaN in FP32 from step {nonfinite}"
        return Verdict("fp32", text, window)
    if needs_scale:
        return Verdict("loss_scale", reason, window)
    return Verdict("ok", _ok_reason(layer, lim, thr), window)


def _carrying(t: TensorStats, lim, scale: int) -> str:
    """', adding X relative L2 error' for values that flush at scale 2^scale, where the mass says."""
    error = t.flush_error(lim, scale)
    return "" if error is None else f", adding {error:.2g} relative L2 error"


def _span(t: TensorStats) -> int:
    top, bottom = t.hist.top_exponent(), t.hist.bottom_exponent()
    return 0 if top is None else top - bottom + 1


def _ok_reason(layer: Layer, lim, threshold: float) -> str:
    parts = []
    forward = [t for k, t in layer.tensors.items() if k in FORWARD_KINDS and t.nonzero]
    if forward:
        amax = max(t.amax for t in forward)
        parts.append(f"values fit {lim.name} (max |x| = {amax:.3g})")
    grads = [t for k, t in layer.tensors.items() if k in GRADIENT_KINDS and t.nonzero]
    if grads:
        uf = max(t.underflow_fraction(lim, 0) for t in grads)
        parts.append(f"gradient underflow {_pct(uf)} at scale 1")
    forgiven = [t for t in layer.tensors.values() if t.nonzero and t.underflow_fraction(lim, 0) > threshold
                and not t.underflow_matters(lim, 0, threshold)]
    if forgiven:
        t = max(forgiven, key=lambda t: t.underflow_fraction(lim, 0))
        parts.append(f"the {_pct(t.underflow_fraction(lim, 0))} of {_KIND_WORDS[t.kind]} that flush add only "
                     f"{t.flush_error(lim, 0):.2g} relative L2 error, below one {lim.name} rounding "
                     f"({unit_roundoff(lim):.2g})")
    return "; ".join(parts) if parts else "nothing recorded"


def per_tensor_verdict(layer: Layer, lim, settings: Settings) -> Verdict:
    """ok / loss_scale / fp32 for an FP8-like format with one power-of-two scale per tensor."""
    thr = settings.underflow_threshold
    scales, unscaled_ok, failures, notes = {}, True, [], []
    for kind in FORWARD_KINDS + GRADIENT_KINDS:
        t = layer.tensors.get(kind)
        if t is None or not t.nonzero:
            continue
        s = t.tensor_scale(lim, settings.fp8_margin)
        scales[kind] = s
        if not t.fits(lim, 0, thr):
            unscaled_ok = False
        lost = t.underflow_fraction(lim, s) if s is not None else 1.0
        if s is None or t.underflow_matters(lim, s, thr):
            failures.append(f"{_pct(lost)} of nonzero {_KIND_WORDS[kind]} underflow even with the per-tensor "
                            f"scale {_pow2(s) if s is not None else '(none)'}")
        else:
            notes.append(f"{_KIND_WORDS[kind]} ×{_pow2(s)} lose {_pct(lost)}")
    if failures:
        return Verdict("fp32", "; ".join(failures), tensor_scales=scales)
    if not scales:
        return Verdict("ok", "nothing recorded", tensor_scales=scales)
    if unscaled_ok:
        return Verdict("ok", f"every tensor fits {lim.name} unscaled", tensor_scales=scales)
    return Verdict("loss_scale", "per-tensor scaling from the amax: " + "; ".join(notes), tensor_scales=scales)


def fp8_recipe(layers: list, limits: list, settings: Settings) -> dict:
    """Per tensor kind, the per-tensor-scaled format with the most mantissa bits that loses <= threshold.

    Pooled over layers: lost = sum of values underflowing at each tensor's own
    scale / sum of nonzero values. {kind: {"choice": name or None, "lost": {fmt: fraction}}}.
    """
    candidates = [lim for lim in limits if lim.per_tensor_scaled]
    if not candidates:
        return {}
    recipe = {}
    for kind in FORWARD_KINDS + GRADIENT_KINDS:
        tensors = [layer.tensors[kind] for layer in layers if kind in layer.tensors and layer.tensors[kind].nonzero]
        if not tensors:
            continue
        total = sum(t.nonzero for t in tensors)
        lost = {}
        for lim in candidates:
            count = 0
            for t in tensors:
                s = t.tensor_scale(lim, settings.fp8_margin)
                count += t.nonzero if s is None else t.hist.underflow(lim, s)
            lost[lim.name] = count / total
        fitting = [lim for lim in candidates if lost[lim.name] <= settings.underflow_threshold]
        choice = max(fitting, key=lambda lim: (lim.fmt.man_bits, -lost[lim.name])) if fitting else None
        recipe[kind] = {"choice": None if choice is None else choice.name, "lost": lost}
    return recipe
