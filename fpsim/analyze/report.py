"""The analyzer's report: per-layer statistics and verdicts, saved as JSON, HTML and PNG figures.

`build_report` turns the host copy of the accumulators into layers, runs the
verdicts and the GradScaler replay; `Report.save` writes every file
atomically (a temporary file in the same directory, then os.replace), so a
reader never sees half a file, even when the run is dying as it writes.
The JSON schema is documented in docs/analyzer.md; SCHEMA names its version.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import tempfile

from .gradscaler import simulate_gradscaler
from .histogram import Log2Histogram
from .store import NO_STEP
from .verdicts import (GRADIENT_KINDS, Layer, Settings, TensorStats, choose_loss_scale, fp8_recipe,
                       loss_scaled_verdict, per_tensor_verdict)

SCHEMA = "fpsim.analyze.report/1"
KIND_ORDER = ("activation", "activation_grad", "weight", "weight_grad", "update")


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

    @property
    def formats(self) -> list:
        return [lim.name for lim in self.limits]

    def layer(self, name: str) -> Layer:
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(f"no layer {name!r} in the report; layers: {', '.join(l.name for l in self.layers)}")

    def verdict(self, layer: str, fmt: str) -> str:
        """'ok', 'loss_scale' or 'fp32' for a layer and a format name."""
        self.layer(layer)
        if fmt not in self.verdicts[layer]:
            raise KeyError(f"format {fmt!r} was not watched; formats: {', '.join(self.formats)}")
        return self.verdicts[layer][fmt].verdict

    # ------------------------------------------------------------------ json
    def to_dict(self) -> dict:
        from .. import __version__

        formats = []
        for lim in self.limits:
            f = lim.fmt
            formats.append({
                "name": f.name, "exp_bits": f.exp_bits, "man_bits": f.man_bits, "bias": f.bias,
                "max": float(f.max), "min_normal": float(f.min_normal), "min_subnormal": float(f.min_subnormal),
                "zero_threshold_log2": lim.zero_exponent, "zero_tie_rounds_to_zero": lim.tie_to_zero,
                "overflow_threshold": _num(lim.overflow_threshold), "overflow_tie_overflows": lim.tie_overflows,
                "scaling": "per_tensor" if lim.per_tensor_scaled else "loss_scale",
            })
        lo, hi = self.settings.scale_range
        layers = []
        for layer in self.layers:
            tensors = {}
            for kind, t in sorted(layer.tensors.items(), key=lambda kv: KIND_ORDER.index(kv[0])):
                entry = {
                    "samples": t.samples, "values": t.hist.total, "nonzero": t.nonzero, "zeros": t.hist.zeros,
                    "pos_inf": t.hist.pos_inf, "neg_inf": t.hist.neg_inf, "nan": t.hist.nan,
                    "amax": _num(t.amax), "first_nonfinite_step": t.first_nonfinite_step,
                    "log2_histogram": t.hist.to_dict(), "formats": {},
                }
                for lim in self.limits:
                    fe = {"underflow": t.underflow_fraction(lim), "subnormal": t.subnormal_fraction(lim),
                          "overflow": t.overflow_fraction(lim)}
                    s = t.tensor_scale(lim, self.settings.fp8_margin)
                    fe["tensor_scale_log2"] = s
                    fe["underflow_at_tensor_scale"] = None if s is None else t.underflow_fraction(lim, s)
                    if kind in GRADIENT_KINDS:
                        w = t.window(lim, self.settings)
                        fe["window_log2"] = None if w is None else list(w)
                    if kind == "update":
                        fe["lost_updates"] = t.lost_update_fraction(lim)
                    entry["formats"][lim.name] = fe
                if kind in GRADIENT_KINDS:
                    entry["underflow_by_scale"] = {"log2_scales": [lo, hi], **{
                        lim.name: [t.underflow_fraction(lim, s) for s in range(lo, hi + 1)] for lim in self.limits}}
                tensors[kind] = entry
            layers.append({
                "name": layer.name, "type": layer.type, "first_nonfinite_step": layer.first_nonfinite_step,
                "verdicts": {f: v.verdict for f, v in self.verdicts[layer.name].items()},
                "reasons": {f: v.reason for f, v in self.verdicts[layer.name].items()},
                "details": {f: v.to_dict() for f, v in self.verdicts[layer.name].items()},
                "tensors": tensors,
            })
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
            "summary": self.summary(),
            "layers": layers,
        }

    def summary(self) -> dict:
        """Per format: counts of verdicts, the layers to keep in higher precision or to scale, and the
        share of all nonzero updates that weights stored in the format would lose (None without updates)."""
        out = {}
        lost = self.lost_updates()
        for lim in self.limits:
            by = {"ok": [], "loss_scale": [], "fp32": []}
            for layer in self.layers:
                by[self.verdicts[layer.name][lim.name].verdict].append(layer.name)
            out[lim.name] = {"ok": len(by["ok"]), "loss_scale": len(by["loss_scale"]), "fp32": len(by["fp32"]),
                             "fp32_layers": by["fp32"], "loss_scale_layers": by["loss_scale"],
                             "lost_updates": lost.get(lim.name)}
        return out

    def lost_updates(self) -> dict:
        """{format: share of all nonzero updates lost if the weights were stored in it}, pooled over layers."""
        updates = [layer.tensors["update"] for layer in self.layers if "update" in layer.tensors]
        total = sum(t.nonzero for t in updates)
        if not total:
            return {}
        return {lim.name: sum(t.lost_updates.get(lim.name, 0) for t in updates) / total for lim in self.limits}

    def to_json(self) -> str:
        return json.dumps(_jsonable(self.to_dict()), indent=1, allow_nan=False)

    # ------------------------------------------------------------------ text
    def summary_table(self, max_name: int = 32) -> str:
        """The terminal table: one row per layer, one verdict column per format, then the scales."""
        from .text import summary_table

        return summary_table(self, max_name)

    # ----------------------------------------------------------------- files
    def figures(self) -> dict:
        """{file name: matplotlib Figure} of every figure the report holds."""
        from . import figures

        out = {}
        kinds = [k for k in KIND_ORDER if any(k in layer.tensors for layer in self.layers)]
        for kind in kinds:
            out[f"magnitudes_{kind}.png"] = figures.magnitude_heatmap(self, kind)
        if any(not lim.per_tensor_scaled for lim in self.limits) and any(
                k in layer.tensors for layer in self.layers for k in GRADIENT_KINDS):
            out["loss_scale_windows.png"] = figures.loss_scale_windows(self)
        if self.gradscaler:
            out["gradscaler.png"] = figures.gradscaler_trajectory(self)
        return out

    def save(self, directory, figures: bool = True) -> dict:
        """Write report.json, report.html and (unless figures=False) the PNG figures into `directory`.

        The directory is created if needed; every file is written atomically.
        Under torch.distributed only rank 0 writes (the report is the same on
        every rank). Returns {file name: path}.
        """
        directory = os.fspath(directory)
        if self.rank != 0:
            return {}
        os.makedirs(directory, exist_ok=True)
        paths = {}
        pngs = {}
        for name, fig in (self.figures() if figures else {}).items():
            buffer = io.BytesIO()
            fig.savefig(buffer, format="png", dpi=110)
            pngs[name] = buffer.getvalue()
        for name, data in pngs.items():
            paths[name] = atomic_write(os.path.join(directory, name), data)
        paths["report.json"] = atomic_write(os.path.join(directory, "report.json"), self.to_json().encode())
        from .html import render_html

        paths["report.html"] = atomic_write(os.path.join(directory, "report.html"),
                                            render_html(self, pngs).encode())
        return paths


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


def _jsonable(obj):
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
def build_report(snapshot, limits: list, settings: Settings, run: dict, types: dict, rank: int = 0) -> Report:
    """Layers, verdicts, loss scales, FP8 recipe and GradScaler replay from a store Snapshot."""
    layers: dict = {}
    for i, (name, kind) in enumerate(snapshot.keys):
        if snapshot.samples[i] == 0:
            continue
        first = int(snapshot.first_nonfinite[i])
        lost = None
        if kind == "update":
            lost = {lim.name: int(snapshot.lost[i, j]) for j, lim in enumerate(limits)}
        stats = TensorStats(name, kind, Log2Histogram.from_raw(snapshot.raw[i]), float(snapshot.amax[i]),
                            None if first >= NO_STEP else first, int(snapshot.samples[i]), lost)
        if name not in layers:
            layers[name] = Layer(name, types.get(name, ""), {})
        layers[name].tensors[kind] = stats
    ordered = list(layers.values())
    loss_scale, verdicts, gradscaler = {}, {layer.name: {} for layer in ordered}, {}
    for lim in limits:
        choice = choose_loss_scale(ordered, lim, settings)
        loss_scale[lim.name] = choice
        for layer in ordered:
            verdict = (per_tensor_verdict(layer, lim, settings) if lim.per_tensor_scaled
                       else loss_scaled_verdict(layer, lim, choice, settings))
            verdicts[layer.name][lim.name] = verdict
        if not lim.per_tensor_scaled and lim.emax < 127:  # GradScaler is for formats narrower than FP32
            prediction = simulate_gradscaler(snapshot.step_amax, snapshot.steps_per_entry, run.get("steps", 0), lim)
            if prediction is not None:
                gradscaler[lim.name] = prediction
    return Report(limits, settings, dict(run), ordered, verdicts, loss_scale, gradscaler,
                  fp8_recipe(ordered, limits, settings), rank)
