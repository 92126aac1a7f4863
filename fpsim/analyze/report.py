"""The analyzer's report: per-layer statistics and verdicts, saved as JSON, HTML and PNG figures.

`build_report` turns the host copy of the accumulators into layers (the
recorded modules) and op sites, runs the verdicts and the GradScaler replay,
and keeps as findings the ops that judge worse than their module's output;
`Report.save` writes report.json first, then the figures and the HTML page,
every file atomically (a temporary file in the same directory, then
os.replace), so a reader never sees half a file, even when the run is dying
as it writes. The JSON schema is documented in docs/analyzer.md; SCHEMA
names its version.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import io
import json
import math
import os
import re
import tempfile

from .effect import Mass, tensor_effects
from .gradscaler import simulate_gradscaler
from .histogram import Log2Histogram
from .limits import inf_overflow_threshold
from .store import KINDS, NO_STEP
from .verdicts import (GRADIENT_KINDS, Layer, Settings, TensorStats, choose_loss_scale, fp8_recipe,
                       loss_scaled_verdict, per_tensor_verdict)

SCHEMA = "fpsim.analyze.report/2"
SEVERITY = {"ok": 0, "loss_scale": 1, "fp32": 2}
FIGURE_KINDS = ("activation", "activation_grad", "weight_grad")
"""The heatmaps a report draws (the other kinds are in report.json and in fpsim.analyze.figures)."""
PNG_OPTIONS = {"compress_level": 1}
"""How report figures are compressed: zlib's fastest level, half the time of the default (6) for files
about a fifth larger."""


@dataclasses.dataclass
class Report:
    """Statistics and verdicts of one observed run (see docs/analyzer.md)."""

    limits: list
    settings: Settings
    run: dict
    layers: list
    verdicts: dict        # layer name -> {format name -> Verdict}
    loss_scale: dict      # format name -> LossScale
    gradscaler: dict      # format name -> GradScalerPrediction (loss-scaled formats narrower than FP32: fp16)
    fp8: dict             # tensor kind -> {"choice", "lost"}
    rank: int = 0
    ops: list = dataclasses.field(default_factory=list)       # every op site observed (Layer, type "op")
    findings: list = dataclasses.field(default_factory=list)  # the ops among `layers` that judge worse
    shadow: dict | None = None        # what the shadow steps measured (shadow.ShadowSteps.evidence), when run
    counted: dict | None = None       # with shadow steps: the value-count verdicts and loss scales they replace
    shadow_evidence: dict = dataclasses.field(default_factory=dict)  # layer -> {format: evidence}
    recipes: dict | None = None       # what each scaling recipe loses per layer and kind (recipe_choice), when run

    @classmethod
    def load(cls, path) -> "Report":
        """The report saved at `path` (its folder or its report.json), to render, save or compare again."""
        from .load import read_report_json, report_fields

        data = read_report_json(path)
        try:
            return cls(*report_fields(data))
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as err:   # a damaged file
            missing = f"no {err.args[0]!r} entry" if isinstance(err, KeyError) else f"{type(err).__name__}: {err}"
            raise ValueError(f"{os.fspath(path)!r} is not a complete report: {missing}") from None

    @property
    def formats(self) -> list:
        return [lim.name for lim in self.limits]

    def layer(self, name: str) -> Layer:
        """A layer, or any observed op site ('Net.attn:mul'), by name."""
        for layer in self.layers:
            if layer.name == name:
                return layer
        for op in self.ops:
            if op.name == name:
                return op
        raise KeyError(f"no layer or op {name!r} in the report; layers: "
                       f"{', '.join(l.name for l in self.layers)}")

    def verdict(self, layer: str, fmt: str) -> str:
        """'ok', 'loss_scale' or 'fp32' for a layer or an op site ('Net.attn:mul') and a format name."""
        self.layer(layer)
        return self.verdicts[layer][self.format_name(fmt)].verdict

    def format_name(self, fmt) -> str:
        """The name under which the report holds a watched format, given any of its names or aliases
        ('float16', 'BF16') or a Format; KeyError for a format that was not watched."""
        if isinstance(fmt, str) and fmt in self.formats:
            return fmt
        from ..formats import format as get_format

        try:
            wanted = get_format(fmt)
        except (ValueError, TypeError):
            wanted = None
        for lim in self.limits:
            if wanted is not None and lim.fmt == wanted:
                return lim.name
        raise KeyError(f"format {fmt!r} was not watched; formats: {', '.join(self.formats)}")

    # ------------------------------------------------------------------ json
    def to_dict(self) -> dict:
        from .. import __version__

        formats = []
        for lim in self.limits:
            f = lim.fmt
            formats.append({
                "name": f.name, "exp_bits": f.exp_bits, "man_bits": f.man_bits, "bias": f.bias,
                "infinities": f.infinities, "nan": f.nan, "subnormals": f.subnormals,
                "max": float(f.max), "min_normal": float(f.min_normal), "min_subnormal": float(f.min_subnormal),
                "zero_threshold_log2": lim.zero_exponent, "zero_tie_rounds_to_zero": lim.tie_to_zero,
                "overflow_threshold": _num(lim.overflow_threshold), "overflow_tie_overflows": lim.tie_overflows,
                "scaling": "per_tensor" if lim.per_tensor_scaled else "loss_scale",
            })
        lo, hi = self.settings.scale_range
        return {
            "schema": SCHEMA,
            "fpsim_version": __version__,
            "run": dict(self.run),
            "settings": {"underflow_threshold": self.settings.underflow_threshold,
                         "fp8_margin": self.settings.fp8_margin, "scale_range_log2": [lo, hi]},
            "formats": formats,
            "loss_scale": {name: ls.to_dict() for name, ls in self.loss_scale.items()},
            "gradscaler": {name: p.to_dict() for name, p in self.gradscaler.items()},
            "fp8_recipe": self.fp8,
            "shadow": self.shadow_summary(),
            "recipes": self.recipes,
            "summary": self.summary(),
            "layers": [self._entry(layer) for layer in self.layers],
            "ops": [{"name": op.name, "module": op.module, "op": op.name.rpartition(":")[2],
                     "dtypes": dict(op.dtypes), "verdicts": {f: v.verdict for f, v in self.verdicts[op.name].items()},
                     "samples": {k: t.samples for k, t in op.tensors.items()},
                     "first_nonfinite_step": op.first_nonfinite_step} for op in self.ops],
        }

    def _entry(self, layer) -> dict:
        lo, hi = self.settings.scale_range
        tensors = {}
        for kind, t in sorted(layer.tensors.items(), key=lambda kv: KINDS.index(kv[0])):
            by_scale = kind in GRADIENT_KINDS and not layer.is_op      # effects at every loss scale: modules' only
            effect_by_scale = {"log2_scales": [lo, hi]}
            entry = {
                "samples": t.samples, "values": t.hist.total, "nonzero": t.nonzero, "zeros": t.hist.zeros,
                "pos_inf": t.hist.pos_inf, "neg_inf": t.hist.neg_inf, "nan": t.hist.nan,
                "amax": _num(t.amax), "first_nonfinite_step": t.first_nonfinite_step,
                "log2_histogram": t.hist.to_dict(), "formats": {},
            }
            if t.mass is not None:     # sum |x| and x^2 per float32 exponent field: the effect numbers' source
                entry["mass_per_binade"] = t.mass.to_dict()
            tensor_scales = {lim: t.tensor_scale(lim, self.settings.fp8_margin) for lim in self.limits}
            scales = {}
            for lim, s in tensor_scales.items():
                scales[lim] = list(range(lo, hi + 1)) if by_scale and not lim.per_tensor_scaled else [0]
                if lim.per_tensor_scaled and s is not None and s not in scales[lim]:
                    scales[lim].append(s)
            effects = tensor_effects(t, scales)
            for lim in self.limits:
                s, its, effect = tensor_scales[lim], scales[lim], effects[lim]
                fe = {"underflow": t.underflow_fraction(lim), "subnormal": t.subnormal_fraction(lim),
                      "overflow": t.overflow_fraction(lim), "tensor_scale_log2": s,
                      "underflow_at_tensor_scale": None if s is None else t.underflow_fraction(lim, s)}
                if kind in GRADIENT_KINDS:
                    w = t.window(lim, self.settings)
                    fe["window_log2"] = None if w is None else list(w)
                if kind == "update":
                    fe["lost_updates"] = t.lost_update_fraction(lim)
                    fe["lost_update_count"] = (t.lost_updates or {}).get(lim.name)
                fe.update({key: values[its.index(0)] for key, values in effect.items()})
                if lim.per_tensor_scaled:
                    fe["effect_at_tensor_scale"] = None if s is None else \
                        {key: values[its.index(s)] for key, values in effect.items()}
                if len(its) > 1 and not lim.per_tensor_scaled:     # loss scales apply to loss-scaled formats
                    effect_by_scale[lim.name] = {key: values[:hi - lo + 1] for key, values in effect.items()}
                entry["formats"][lim.name] = fe
            if kind in GRADIENT_KINDS:
                entry["underflow_by_scale"] = {"log2_scales": [lo, hi], **{
                    lim.name: t.underflow_fractions(lim, range(lo, hi + 1)).tolist() for lim in self.limits}}
            if by_scale:
                entry["effect_by_scale"] = effect_by_scale
            tensors[kind] = entry
        verdicts = self.verdicts[layer.name]
        out = {"name": layer.name, "entry": "op" if layer.is_op else "module", "type": layer.type}
        if layer.is_op:
            out["module"], out["op"] = layer.module, layer.name.rpartition(":")[2]
            out["module_verdicts"] = {f: v.verdict for f, v in self.verdicts.get(layer.module, {}).items()}
        out.update({
            "dtypes": dict(layer.dtypes), "tied_with": list(layer.tied_with),
            "first_nonfinite_step": layer.first_nonfinite_step,
            "verdicts": {f: v.verdict for f, v in verdicts.items()},
            "reasons": {f: v.reason for f, v in verdicts.items()},
            "details": {f: v.to_dict() for f, v in verdicts.items()},
            "evidence": {lim.name: self._layer_evidence(layer, lim) for lim in self.limits},
            "tensors": tensors,
        })
        return out

    def _layer_evidence(self, layer, lim) -> dict:
        """Shadow-step evidence (with the value counts inside, as `counts`) where measured, else the counts."""
        counts = _evidence(layer, lim, (self.counted or {}).get("loss_scale", self.loss_scale).get(
            lim.name, self.loss_scale[lim.name]))
        measured = self.shadow_evidence.get(layer.name, {}).get(lim.name)
        if measured is None:
            return counts
        out = dict(measured)
        if self.counted is not None:
            out["counted_reason"] = self.counted["verdicts"][layer.name][lim.name].reason
        out["counts"] = counts
        return out

    def shadow_summary(self) -> dict | None:
        """How the shadow steps ran and the rule they judged by (None without shadow steps)."""
        if self.shadow is None:
            return None
        from .evidence import (FALLBACK_THRESHOLD, MARGIN, MAX_TOLERATED_ERROR, MIN_TOLERATED_ERROR,
                               SENSITIVITY_MARGIN, UNSETTLED_SE)

        keep = ("every", "scales_log2", "numerics", "formats", "shadowed_steps", "steps", "unsplit_steps", "overflow_sources")
        out = {k: self.shadow[k] for k in keep if k in self.shadow}
        out["rule"] = {"margin": MARGIN, "min_tolerated_error": MIN_TOLERATED_ERROR,
                       "max_tolerated_error": MAX_TOLERATED_ERROR, "fallback_threshold": FALLBACK_THRESHOLD,
                       "sensitivity_margin": SENSITIVITY_MARGIN, "unsettled_se": UNSETTLED_SE}
        if self.counted is not None:
            out["counted_loss_scale"] = {n: ls.to_dict() for n, ls in self.counted["loss_scale"].items()}
            out["counted_verdicts"] = {name: {f: v.verdict for f, v in by.items()}
                                       for name, by in self.counted["verdicts"].items()}
        return out

    def summary(self) -> dict:
        """Per format: counts of verdicts, the layers to keep in higher precision or to scale, and the
        share of all nonzero updates that weights stored in the format would lose (None without updates)."""
        out = {}
        lost = self.lost_updates()
        modules = [layer for layer in self.layers if not layer.is_op]
        for lim in self.limits:
            by = {"ok": [], "loss_scale": [], "fp32": []}
            for layer in modules:
                by[self.verdicts[layer.name][lim.name].verdict].append(layer.name)
            out[lim.name] = {"ok": len(by["ok"]), "loss_scale": len(by["loss_scale"]), "fp32": len(by["fp32"]),
                             "fp32_layers": by["fp32"], "loss_scale_layers": by["loss_scale"],
                             "op_findings": [op.name for op in self.findings
                                             if SEVERITY[self.verdicts[op.name][lim.name].verdict]
                                             > SEVERITY[self.verdicts.get(op.module, {}).get(
                                                 lim.name, _OK).verdict]],
                             "lost_updates": lost.get(lim.name)}
            out[lim.name]["basis"] = "value counts"
            if self.counted is not None and any(lim.name in e for e in self.shadow_evidence.values()):
                from .evidence import scale_reason

                out[lim.name]["basis"] = "shadow steps"
                out[lim.name]["loss_scale_reason"] = scale_reason(
                    lim, self.loss_scale[lim.name] if not lim.per_tensor_scaled else None,
                    {n: e[lim.name] for n, e in self.shadow_evidence.items() if lim.name in e})
                out[lim.name]["reasons"] = {n: self.verdicts[n][lim.name].reason for n in by["fp32"] + by["loss_scale"]}
        return out

    def lost_updates(self) -> dict:
        """{format: share of all nonzero updates lost if the weights were stored in it}, pooled over layers."""
        updates = [layer.tensors["update"] for layer in self.layers if "update" in layer.tensors]
        total = sum(t.nonzero for t in updates)
        if not total:
            return {}
        return {lim.name: sum(t.lost_updates.get(lim.name, 0) for t in updates) / total for lim in self.limits}

    def to_json(self) -> str:
        """report.json's text: compact (no indent lets json use its compiled encoder: a 12-layer GPT's report
        holds half a million values), strict JSON (non-finite numbers as strings, see `_strict_json`)."""
        return _strict_json(self.to_dict())

    # ------------------------------------------------------------------ text
    def summary_table(self) -> str:
        """The terminal table: one row per layer (full names), one verdict column per format, then the scales."""
        from .text import summary_table

        return summary_table(self)

    def recipe_table(self) -> str:
        """The scaling-recipe table alone (one row per layer, a column per tensor kind; '' without recipes_every)."""
        from .text import recipe_lines

        return "\n".join(recipe_lines(self.recipes)).strip("\n")

    # ----------------------------------------------------------------- files
    def to_tensorboard(self, directory, step: int | None = None) -> str:
        """Write the histograms, verdicts and loss scales as TensorBoard events at `step` (default: the run's
        optimizer steps) into `directory`; see fpsim.analyze.tensorboard. Needs tensorboard."""
        from .tensorboard import to_tensorboard

        return to_tensorboard(self, directory, step)

    def figures(self) -> dict:
        """{file name: matplotlib Figure} of every figure the report holds."""
        return {name: build() for name, build in self.figure_builders().items()}

    def figure_builders(self) -> dict:
        """{file name: a function drawing that figure}, so that each can fail alone."""
        from . import figures

        out = {}
        kinds = [k for k in FIGURE_KINDS if any(k in layer.tensors for layer in self.layers)]
        for kind in kinds:
            out[f"magnitudes_{kind}.png"] = lambda kind=kind: figures.magnitude_heatmap(self, kind)
        if any(not lim.per_tensor_scaled for lim in self.limits) and any(
                k in layer.tensors for layer in self.layers for k in GRADIENT_KINDS):
            out["loss_scale_windows.png"] = lambda: figures.loss_scale_windows(self)
        if self.gradscaler:
            out["gradscaler.png"] = lambda: figures.gradscaler_trajectory(self)
        return out

    def save(self, directory, figures: bool = True) -> dict:
        """Write report.json, then (unless figures=False) the PNG figures, then report.html into `directory`.

        The directory is created if needed; every file is written atomically,
        report.json first so that nothing later can lose it. Files an earlier
        save wrote there and this one did not (figures of another run) are
        removed; nothing else is (see `remove_stale`). A figure that
        cannot be drawn is left out with a warning (the page says so). Under
        torch.distributed only rank 0 writes. Returns {file name: path}; when
        writing fails, the exception carries `.written` (what was written).
        """
        directory = os.fspath(directory)
        if self.rank != 0:
            return {}
        paths = {}
        try:
            with _full_collections_paused():
                self._write(directory, figures, paths)
        except BaseException as err:
            err.written = dict(paths)
            raise
        return paths

    def _write(self, directory: str, figures: bool, paths: dict) -> None:
        """`save`'s files in their order, each entered in `paths` once it is on disk."""
        import warnings

        os.makedirs(directory, exist_ok=True)
        json_bytes = self.to_json().encode()
        paths["report.json"] = atomic_write(os.path.join(directory, "report.json"), json_bytes)
        pngs = {}
        if figures:
            for name, build in self.figure_builders().items():
                try:
                    buffer = io.BytesIO()
                    build().savefig(buffer, format="png", dpi=100, pil_kwargs=PNG_OPTIONS)
                    pngs[name] = buffer.getvalue()
                except Exception as err:  # a figure is not worth the report
                    warnings.warn(f"fpsim: figure {name} left out: {type(err).__name__}: {err}", RuntimeWarning)
            for name, data in pngs.items():
                paths[name] = atomic_write(os.path.join(directory, name), data)
        from .html import render_html

        html = render_html(self, pngs).encode()
        paths["report.html"] = atomic_write(os.path.join(directory, "report.html"), html)
        remove_stale(directory, {name: hashlib.sha256(content).hexdigest() for name, content in
                                 {"report.json": json_bytes, **pngs, "report.html": html}.items()})


@contextlib.contextmanager
def _full_collections_paused():
    """Python's cyclic garbage collector off for the duration, then as it was: a save allocates enough (its
    figures) to set off full collections, each of which walks every object of a training process (torch and a
    model: some 300,000) in about 0.3 s. The save's own garbage, all young, goes at the next collection of the
    youngest generation. (benchmarks/bench_report_save.py)"""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


MANIFEST = ".fpsim-manifest.json"
"""The files the last save wrote into a report folder, with their SHA-256: what a later save may remove."""


def remove_stale(directory: str, written: dict) -> None:
    """Remove the files the previous save listed in the manifest, unchanged since (same SHA-256), that this save
    did not write; then list this save's files {name: sha256}. Files fpsim did not write are never touched."""
    manifest = os.path.join(directory, MANIFEST)
    try:
        with open(manifest, encoding="utf-8") as f:
            before = json.load(f).get("files", {})
    except (OSError, ValueError, AttributeError):
        before = {}
    for name, digest in before.items() if isinstance(before, dict) else ():
        path = os.path.join(directory, name)
        if name in written or os.path.basename(name) != name or not os.path.isfile(path) or os.path.islink(path):
            continue
        with open(path, "rb") as f:
            if hashlib.sha256(f.read()).hexdigest() != digest:
                continue                        # changed since fpsim wrote it: no longer fpsim's
        os.unlink(path)
    atomic_write(manifest, json.dumps({"written_by": "fpsim Report.save", "files": written}, indent=1).encode())


def atomic_write(path: str, data: bytes) -> str:
    """Write `data` to `path` through a temporary file in the same directory and os.replace."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=os.path.basename(path), dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a report is for reading
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def _num(x: float):
    """A float for JSON: non-finite values as the strings 'inf', '-inf', 'nan'."""
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


_NON_FINITE = {"NaN": '"nan"', "Infinity": '"inf"', "-Infinity": '"-inf"'}
_STRING_OR_NON_FINITE = re.compile(r'"(?:[^"\\]|\\.)*"|(-?Infinity|NaN)')


def _strict_json(obj) -> str:
    """`obj` as strict JSON text, non-finite floats as the strings 'inf', '-inf', 'nan' (as `_jsonable` makes them).

    json's compiled encoder writes the whole tree (numpy scalars through `default`) with NaN and Infinity as
    bare tokens, which can only stand outside strings; they are then quoted. A tree the encoder refuses
    (keys that are not str, int or float) goes through `_jsonable` first.
    """
    try:
        text = json.dumps(obj, default=_json_scalar)
    except TypeError:
        return json.dumps(_jsonable(obj), allow_nan=False)
    if "NaN" not in text and "Infinity" not in text:
        return text
    return _STRING_OR_NON_FINITE.sub(lambda m: m.group(0) if m.group(1) is None else _NON_FINITE[m.group(1)], text)


def _json_scalar(obj):
    """What json cannot write itself: numpy scalars, as Python numbers."""
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        return obj.item()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def _jsonable(obj):
    kind = type(obj)
    if kind is int or kind is str or kind is bool or obj is None or (kind is float and obj - obj == 0):
        return obj                    # the most common values (a finite float among them) first, as they are
    if isinstance(obj, float):
        return _num(obj)
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        return _jsonable(obj.item())
    return obj


# ------------------------------------------------------------------- building
class _OkVerdict:
    """Stands in for the verdict of a module without a record."""

    verdict = "ok"


_OK = _OkVerdict()


def _evidence(layer, lim, choice) -> dict:
    """What a counted verdict rests on, per format: shares at scale 1 and at the recommended scale, amax."""
    out = {"basis": "value counts"}
    forward = [t for k, t in layer.tensors.items() if k in ("activation", "weight") and t.nonzero]
    grads = [t for k, t in layer.tensors.items() if k in GRADIENT_KINDS and t.nonzero]
    if forward:
        out["forward_amax"] = _num(max(t.amax for t in forward))
        out["forward_overflow"] = any(t.overflows(lim, 0) for t in forward)
        out["forward_underflow"] = max(t.underflow_fraction(lim, 0) for t in forward)
    if grads:
        out["grad_underflow_at_1"] = max(t.underflow_fraction(lim, 0) for t in grads)
        r = choice.recommended_log2
        if r is not None and not lim.per_tensor_scaled:
            out["grad_underflow_at_recommended"] = max(t.underflow_fraction(lim, r) for t in grads)
            out["grad_overflow_at_recommended"] = any(t.overflows(lim, r) for t in grads)
    return out


def build_report(snapshot, limits: list, settings: Settings, run: dict, types: dict, rank: int = 0,
                 dtypes: dict | None = None, tied: dict | None = None, hidden=frozenset(), shadow=None,
                 recipes=None) -> Report:
    """Layers, op sites, verdicts, loss scales, FP8 recipe and GradScaler replay from a store Snapshot.

    types: record name -> module class name, or "op" for an op site.
    dtypes: record name -> {dtype name: tensors} (the dtypes ops produced).
    hidden: module records kept only to compare their ops with (modules outside the selection).
    shadow: what shadow steps measured (ShadowSteps.evidence()): the module layers they measured are judged
        by it (evidence.py); the value-count verdicts and loss scales stay in Report.counted.
    recipes: (RecipeProbe.measurements(), RecipeProbe.describe()) when the recipe probe ran: judged by
        recipe_choice against each layer's threshold.
    """
    dtypes, tied = dtypes or {}, tied or {}
    entries: dict = {}
    for i, (name, kind) in enumerate(snapshot.keys):
        if snapshot.samples[i] == 0 or name not in types:
            continue
        first = int(snapshot.first_nonfinite[i])
        lost = None
        if kind == "update":
            lost = {lim.name: int(snapshot.lost[i, j]) for j, lim in enumerate(limits)}
        stats = TensorStats(name, kind, Log2Histogram.from_raw(snapshot.raw[i]), float(snapshot.amax[i]),
                            None if first >= NO_STEP else first, int(snapshot.samples[i]), lost,
                            inf_overflow_threshold(name, dtypes.get(name, {})),
                            None if kind == "update" else Mass.from_raw(snapshot.mass[i]))
        if name not in entries:
            entries[name] = Layer(name, types[name], {}, dict(dtypes.get(name, {})), list(tied.get(name, [])))
        entries[name].tensors[kind] = stats
    modules = [e for e in entries.values() if not e.is_op and e.name not in hidden]
    ops = [e for e in entries.values() if e.is_op]
    loss_scale, verdicts, gradscaler = {}, {e.name: {} for e in entries.values()}, {}
    for lim in limits:
        choice = choose_loss_scale(modules, lim, settings)
        loss_scale[lim.name] = choice
        for entry in entries.values():
            verdict = (per_tensor_verdict(entry, lim, settings) if lim.per_tensor_scaled
                       else loss_scaled_verdict(entry, lim, choice, settings))
            verdicts[entry.name][lim.name] = verdict
        if not lim.per_tensor_scaled and lim.emax < 127:  # GradScaler is for formats narrower than FP32
            prediction = simulate_gradscaler(snapshot.step_amax, snapshot.steps_per_entry, run.get("steps", 0), lim)
            if prediction is not None:
                prediction.forward_overflows = [e.name for e in entries.values() if "activation" in e.tensors
                                                and e.tensors["activation"].overflows(lim)]
                gradscaler[lim.name] = prediction
    counted, shadow_evidence = None, {}
    by_counts = verdicts           # value-count verdicts at the loss scale in force: what an op is compared with
    if shadow is not None:
        from .evidence import judge, judge_ops

        counted = {"verdicts": {n: dict(v) for n, v in verdicts.items()}, "loss_scale": dict(loss_scale)}
        by_counts = {n: dict(v) for n, v in verdicts.items()}
        for lim in limits:
            judged, choice, evidence = judge(modules, lim, shadow,
                                             {m.name: verdicts[m.name][lim.name] for m in modules},
                                             loss_scale[lim.name])
            if choice is not None:
                loss_scale[lim.name] = choice
                if not lim.per_tensor_scaled:    # the counts judged again against the scale the replays chose
                    for entry in entries.values():
                        by_counts[entry.name][lim.name] = loss_scaled_verdict(entry, lim, choice, settings)
                    for op in ops:
                        verdicts[op.name][lim.name] = by_counts[op.name][lim.name]
            if not lim.per_tensor_scaled:
                judged.update(judge_ops(ops, verdicts, judged, shadow, lim, choice))
            for name, verdict in judged.items():
                verdicts[name][lim.name] = verdict
            for name, ev in evidence.items():
                shadow_evidence.setdefault(name, {})[lim.name] = ev
    findings = [op for op in ops if _worse_than_module(op, verdicts, limits, by_counts)]
    run = {**run_metadata(types), **run}
    section = None
    if recipes is not None:
        from .recipe_choice import judge_recipes

        section = judge_recipes(recipes[0], recipes[1], {m.name: m.type for m in modules}, shadow_evidence)
    return Report(limits, settings, run, modules + findings, verdicts, loss_scale, gradscaler,
                  fp8_recipe(modules, limits, settings), rank, ops, findings, shadow, counted, shadow_evidence,
                  section)


def run_metadata(types: dict) -> dict:
    """What the report page names the run by: the model (the classes of the outermost modules recorded, which
    are named after their class), the script (sys.argv[0]), the date (UTC) and the versions of torch and Python."""
    import datetime
    import platform
    import sys

    from .. import __version__

    torch = sys.modules.get("torch")
    return {"fpsim_version": __version__, "model": ", ".join(sorted(name for name, kind in types.items() if name == kind)) or None,
            "script": sys.argv[0] if sys.argv and sys.argv[0] else None,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
            "torch_version": getattr(torch, "__version__", None), "python_version": platform.python_version()}


def _worse_than_module(op, verdicts: dict, limits, by_counts: dict) -> bool:
    """An op judges worse than its module's output in some format; an op outside every module (the loop's
    own, such as the loss) when it needs FP32. Its module's verdict is taken on the op's basis, the value
    counts (by_counts: at the loss scale in force), not from shadow steps (a Linear's addmm is its output:
    one tensor, one count); an op that the shadow steps cleared is `ok`, never worse."""
    mine, theirs = verdicts[op.name], by_counts.get(op.module)
    if theirs is None:
        return any(mine[lim.name].verdict == "fp32" for lim in limits)
    return any(SEVERITY[mine[lim.name].verdict] > SEVERITY[theirs[lim.name].verdict] for lim in limits)

