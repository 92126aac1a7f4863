"""Which scaling recipe each layer needs, from what the recipe probe measured (report.json's `recipes`).

A recipe *serves* a layer's tensor kind when the error it adds,
||q(x) - x|| / ||x|| per row of the GEMM view averaged over the rows of
the sampled tensors (effect.RowMass: each dot product counts alike), is at
most the layer's threshold: the shadow steps' threshold of that layer
(evidence.threshold of its measured noise floor: 1 x the floor, held within
0.01..0.5) when shadow steps ran and measured a floor, else
evidence.FALLBACK_THRESHOLD (0.1), the threshold shadow steps use without a
floor. The error is of the tensor, not of the gradient the floor was
measured on: the threshold says how much error the layer's gradient already
carries as noise, and an error in an operand of the layer's GEMMs reaches
its gradient at about its own relative size.

Per layer and kind the choice is the first recipe of FP8_ORDER that serves
(cost: how much scaling state and work the recipe needs; at equal cost, the
element format with more mantissa first), or None when none does (keep that
tensor in BF16/FP32); `narrowest` is the first of NARROW_ORDER (FP4, then
FP6) that serves, else None. Per kind, the model needs the costliest of its
layers' choices; the layers that need it, when others need less, are the
ones that force it.
"""

from __future__ import annotations

from .effect import loss_shares
from .evidence import FALLBACK_THRESHOLD, threshold
from .recipe_probe import CANDIDATES, RECIPE_KINDS

FP8_ORDER = tuple(c.name for c in CANDIDATES if c.width == "fp8")
"""FP8 recipes, cheapest first: delayed < current < per-channel < 128x128 < 1x128 blocks < MXFP8."""
NARROW_ORDER = tuple(c.name for c in CANDIDATES if c.width == "fp4") + \
    tuple(c.name for c in CANDIDATES if c.width == "fp6")
"""Narrower element formats, narrowest first (bits per element with scales: 4.25, 4.5, 6.25, 6.25)."""


def layer_thresholds(names, shadow_evidence: dict) -> dict:
    """{layer: (threshold, source)}: from the layer's shadow-step noise floor where measured, else the fallback."""
    out = {}
    for name in names:
        floors = [ev.get("noise_floor") for ev in shadow_evidence.get(name, {}).values()]
        floors = [f for f in floors if f is not None]
        if floors:
            out[name] = (threshold(floors[0]), f"noise floor {floors[0]:.3g} (shadow steps)")
        else:
            out[name] = (FALLBACK_THRESHOLD, "fixed (no noise floor measured)")
    return out


def _first_serving(order, loss: dict, limit: float, measured: dict):
    for name in order:
        error = loss[name]["rel_error"]
        if measured[name] and (error is None or error <= limit):    # None: nothing nonzero to lose
            return name
    return None


def _costliest(choices: list, order) -> str | None:
    """The costliest of the choices in `order` (None when some choice is None: nothing serves)."""
    if any(c is None for c in choices):
        return None
    return max(choices, key=order.index) if choices else None


def judge_recipes(measurements: dict, probe: dict, types: dict, shadow_evidence: dict) -> dict:
    """report.json's `recipes` section from RecipeProbe.measurements() and describe()."""
    names = [n for n in measurements if n in types]
    thresholds = layer_thresholds(names, shadow_evidence)
    layers = []
    for name in names:
        limit, source = thresholds[name]
        kinds = {}
        for kind in RECIPE_KINDS:
            m = measurements[name].get(kind)
            if m is None:
                continue
            loss = {c: loss_shares(s) for c, s in m["sums"].items()}
            kinds[kind] = {"tensors": m["tensors"], "values": m["values"],
                           "skipped_nonfinite": m["skipped_nonfinite"], "measured": m["measured"],
                           "needs": _first_serving(FP8_ORDER, loss, limit, m["measured"]),
                           "narrowest": _first_serving(NARROW_ORDER, loss, limit, m["measured"]), "loss": loss}
        layers.append({"name": name, "type": types[name], "threshold": limit, "threshold_source": source,
                       "kinds": kinds})
    return {**probe, "fp8_order": list(FP8_ORDER), "narrow_order": list(NARROW_ORDER),
            "fallback_threshold": FALLBACK_THRESHOLD, "layers": layers, "summary": summarize(layers)}


def summarize(layers: list) -> dict:
    """Per kind: the recipe serving every layer, the layers forcing it; the same over all kinds."""
    by_kind = {}
    for kind in RECIPE_KINDS:
        entries = [(layer["name"], layer["kinds"][kind]) for layer in layers if kind in layer["kinds"]]
        if not entries:
            continue
        needs = [e["needs"] for _, e in entries]
        recipe = _costliest(needs, FP8_ORDER)
        cheaper = [n for n in needs if n is not None and n != recipe]
        forced = [name for name, e in entries if e["needs"] == recipe] if cheaper or recipe is None else []
        by_kind[kind] = {"recipe": recipe, "forced_by": forced, "layers": len(entries),
                         "narrowest": _costliest([e["narrowest"] for _, e in entries], NARROW_ORDER)}
    choices = [entry["recipe"] for entry in by_kind.values()]
    model = _costliest(choices, FP8_ORDER)
    return {"by_kind": by_kind, "model": model,
            "model_forced_by": sorted({n for e in by_kind.values() if e["recipe"] == model for n in e["forced_by"]})}


# ----------------------------------------------------------------- text
def _cell(entry: dict | None) -> tuple:
    """(choice, its error) of one layer and kind: 'none' and the smallest FP8 error when none serves; ('-', None)
    when not measured."""
    if entry is None:
        return "-", None
    if entry["needs"] is not None:
        return entry["needs"], entry["loss"][entry["needs"]]["rel_error"]
    errors = [entry["loss"][c]["rel_error"] for c in FP8_ORDER if entry["measured"][c]]
    errors = [e for e in errors if e is not None]
    return "none", min(errors) if errors else None


def table_rows(section: dict) -> list:
    """[(layer, type, choice per kind..., narrowest, error per kind...)] for RECIPE_KINDS measured."""
    kinds = measured_kinds(section)
    rows = []
    for layer in section["layers"]:
        cells = [_cell(layer["kinds"].get(k)) for k in kinds]
        narrow = [layer["kinds"][k]["narrowest"] for k in kinds if k in layer["kinds"]]
        rows.append((layer["name"], layer["type"], *(c for c, _ in cells),
                     _costliest(narrow, NARROW_ORDER) or "none", *(e for _, e in cells)))
    return rows


def measured_kinds(section: dict) -> list:
    return [k for k in RECIPE_KINDS if any(k in layer["kinds"] for layer in section["layers"])]
