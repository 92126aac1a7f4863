"""A saved report back: report.json (schema fpsim.analyze.report/2) read into a `Report`.

Everything a report computes (fractions, windows, evidence, the summary) is
computed again from the histograms in the file, so a loaded report renders,
saves and compares like the one that was saved, and `to_dict()` gives the
same JSON. The verdicts, loss scales, GradScaler replay, FP8 recipe and scaling recipes are
taken as written (they are what that run decided). Op sites outside the
findings are stored in report.json with their verdicts and sample counts
only: their loaded `TensorStats` have `hist=None` and `amax=None`.
"""

from __future__ import annotations

import json
import os

from .effect import Mass
from .gradscaler import GradScalerPrediction
from .histogram import Log2Histogram
from .verdicts import Layer, LossScale, Settings, TensorStats, Verdict

READABLE_SCHEMAS = ("fpsim.analyze.report/2",)


def read_report_json(path) -> dict:
    """The dict in report.json at `path` (a report folder or the file itself); ValueError when it is not one."""
    path = os.fspath(path)
    file = os.path.join(path, "report.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise FileNotFoundError(f"no report at {path!r}: give a report folder (holding report.json) or a "
                                f"report.json file")
    try:
        with open(file, encoding="utf-8") as f:
            data = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{file!r} is not a report: not JSON ({err})") from None
    schema = data.get("schema") if isinstance(data, dict) else None
    if schema not in READABLE_SCHEMAS:
        raise ValueError(f"{file!r} is not a report fpsim can read: schema {schema!r}; readable: "
                         f"{', '.join(READABLE_SCHEMAS)}")
    return data


def report_fields(data: dict) -> tuple:
    """The fields of `Report` (in order) from the dict report.json holds (see docs/analyzer.md for the
    schema): `Report.load` builds the report from them."""
    limits = [_limits(entry) for entry in data["formats"]]
    settings = Settings(float(data["settings"]["underflow_threshold"]), int(data["settings"]["fp8_margin"]),
                        tuple(int(v) for v in data["settings"]["scale_range_log2"]))
    verdicts, layers = {}, []
    for entry in data["layers"]:
        layers.append(_layer(entry, limits))
        verdicts[entry["name"]] = {f: _verdict(d) for f, d in entry["details"].items()}
        if entry["entry"] == "op" and entry["module"] not in verdicts and entry.get("module_verdicts"):
            verdicts[entry["module"]] = {f: Verdict(v, "") for f, v in entry["module_verdicts"].items()}
    by_name = {layer.name: layer for layer in layers}
    ops = []
    for entry in data["ops"]:
        op = by_name.get(entry["name"])
        if op is None:     # not a finding: verdicts and sample counts only
            op = Layer(entry["name"], "op", {kind: TensorStats(entry["name"], kind, None, None,
                                                               entry.get("first_nonfinite_step"), samples)
                                             for kind, samples in entry["samples"].items()},
                       dict(entry["dtypes"]))
            verdicts.setdefault(op.name, {f: Verdict(v, "") for f, v in entry["verdicts"].items()})
        ops.append(op)
    modules = [layer.name for layer in layers if not layer.is_op]
    loss_scale = {name: _loss_scale(name, d, modules) for name, d in data["loss_scale"].items()}
    gradscaler = {name: _gradscaler(name, d) for name, d in data["gradscaler"].items()}
    findings = [layer for layer in layers if layer.is_op]
    shadow, counted, shadow_evidence = _shadow(data, modules)
    return (limits, settings, dict(data["run"]), layers, verdicts, loss_scale, gradscaler,
            data["fp8_recipe"], 0, ops, findings, shadow, counted, shadow_evidence, data.get("recipes"))


def _shadow(data: dict, modules: list):
    """What shadow steps measured, as Report keeps it: the run's summary, the value-count verdicts and loss
    scales they replaced, and each layer's measured evidence (the layer evidence that holds `counts`)."""
    summary = data.get("shadow")
    if summary is None:
        return None, None, {}
    evidence, reasons = {}, {}
    for entry in data["layers"]:
        for fmt, ev in entry.get("evidence", {}).items():
            if "counts" in ev:
                evidence.setdefault(entry["name"], {})[fmt] = {k: v for k, v in ev.items()
                                                               if k not in ("counts", "counted_reason")}
                reasons.setdefault(entry["name"], {})[fmt] = ev.get("counted_reason", "")
    counted = None
    if "counted_verdicts" in summary:
        counted = {"verdicts": {name: {f: Verdict(v, reasons.get(name, {}).get(f, "")) for f, v in by.items()}
                                for name, by in summary["counted_verdicts"].items()},
                   "loss_scale": {name: _loss_scale(name, d, modules)
                                  for name, d in summary["counted_loss_scale"].items()}}
    return dict(summary), counted, evidence


def _float(value):
    """JSON's stand-ins for non-finite numbers ('inf', '-inf', 'nan') back as floats."""
    return None if value is None else float(value)


def _limits(entry: dict):
    """The FormatLimits of a saved format: the preset of that name when its layout matches, else the layout."""
    from ..formats import PRESETS, Format
    from .limits import FormatLimits

    layout = {k: entry[k] for k in ("exp_bits", "man_bits", "bias")}
    layout.update({k: entry[k] for k in ("infinities", "nan", "subnormals") if k in entry})
    preset = PRESETS.get(entry["name"])
    if preset is not None and all(getattr(preset, k) == v for k, v in layout.items()):
        return FormatLimits.of(preset)
    if not {"infinities", "nan", "subnormals"} <= set(entry):
        raise ValueError(f"format {entry['name']!r} of the report is not a preset and its layout is incomplete "
                         f"(no infinities/nan/subnormals: written by an older fpsim)")
    return FormatLimits.of(Format(**layout, name=entry["name"]))


def _layer(entry: dict, limits) -> Layer:
    from .limits import inf_overflow_threshold

    tensors = {}
    for kind, t in entry["tensors"].items():
        hist = Log2Histogram.from_dict(t["log2_histogram"])
        lost = None
        if kind == "update":
            lost = {}
            for lim in limits:
                fe = t["formats"].get(lim.name, {})
                count = fe.get("lost_update_count")
                if count is None and fe.get("lost_updates") is not None:   # older files: the fraction only
                    count = round(fe["lost_updates"] * hist.nonzero)
                if count is not None:
                    lost[lim.name] = int(count)
        mass = Mass.from_dict(t["mass_per_binade"]) if "mass_per_binade" in t else None
        tensors[kind] = TensorStats(entry["name"], kind, hist, _float(t["amax"]), t["first_nonfinite_step"],
                                    int(t["samples"]), lost, inf_overflow_threshold(entry["name"], entry["dtypes"]),
                                    mass)
    return Layer(entry["name"], entry["type"], tensors, dict(entry["dtypes"]), list(entry["tied_with"]))


def _verdict(d: dict) -> Verdict:
    window = d.get("window_log2")
    scales = d.get("tensor_scales_log2")
    return Verdict(d["verdict"], d["reason"], None if window is None else tuple(window),
                   None if scales is None else dict(scales))


def _loss_scale(name: str, d: dict, modules: list) -> LossScale:
    unserved = list(d["unserved_layers"])
    return LossScale(name, d["recommended_log2"], d["min_log2"], d["max_log2"],
                     [m for m in modules if m not in unserved], unserved, tuple(d["searched_log2"]))


def _gradscaler(name: str, d: dict) -> GradScalerPrediction:
    return GradScalerPrediction(name, d["init_scale"], d["growth_factor"], d["backoff_factor"],
                                d["growth_interval"], d["steps"], d["skipped_steps"], d["final_scale"],
                                d["min_scale"], d["max_scale"], d["first_unskipped_step"],
                                [tuple(p) for p in d["trajectory"]], d["steps_per_entry"],
                                list(d.get("forward_overflows", [])))
