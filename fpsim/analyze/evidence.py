"""Verdicts from measured effect: shadow-step gradient errors against the FP32 gradient's own noise floor.

A layer's low-precision gradient error *stands out* when it exceeds its
threshold: MARGIN times its noise floor, held within [MIN_TOLERATED_ERROR,
MAX_TOLERATED_ERROR] (an error below 1% never matters next to SGD's noise; a
layer that loses more than half of its gradient always does), or
FALLBACK_THRESHOLD when no floor could be measured (batches of one sample); and at
least SENSITIVITY_MARGIN times its weight sensitivity where that was measured
(shadow.py: how much the FP32 gradient itself changes when the weights move by
one rounding unit of the format; uncapped: an ill-conditioned layer's error of
that size is no fault of the format).
The errors and floors are means over the shadowed steps (shadow.py), so that
verdicts do not drift with run length; where a layer's steps before some step
and from it on clearly differ (`change`), its numerics changed: it is judged by
the side where it stands out (a verdict that serves the whole run), and its
evidence says so. For a format with one global loss scale:

- `fp32` for an overflow source (its output turned non-finite from finite
  inputs in the replay), and for a layer that stands out at every candidate;
- the recommended scale is the smallest candidate at which no served layer
  stands out and no gradient is non-finite (the layers served by the most
  candidates otherwise); a format with FP32's exponent range (bf16) is only
  replayed at scale 1;
- `ok` when the layer does not stand out at scale 1, whatever its value
  counts say; `loss_scale` when it stands out at 1 and not at the
  recommended scale.

Per-tensor-scaled formats (FP8) are replayed with current per-tensor scales:
`fp32` when the layer stands out, else the counted verdict (`ok`: fits
unscaled, `loss_scale`: needs its per-tensor scales), `loss_scale` where the
counts said fp32 but the scaled replay shows no effect.
"""

from __future__ import annotations

import dataclasses
import math

from ..trace import OUTSIDE
from .verdicts import FORWARD_KINDS, LossScale, Verdict

MARGIN = 1.0
MIN_TOLERATED_ERROR = 0.01
MAX_TOLERATED_ERROR = 0.5
FALLBACK_THRESHOLD = 0.1
SENSITIVITY_MARGIN = 2.0
"""A layer is within its weight sensitivity when its error is at most this many times it: the sensitivity moves
the weights alone by up to one rounding unit, while the low-precision step also rounds the inputs and output of
every op on the way (measured on planted.Saturated in BF16: error / sensitivity 0.90 to 1.07)."""
UNSETTLED_SE = 2.0
"""A layer's mean error within this many standard errors (over its shadowed steps) of its threshold is reported as
unsettled: the verdict stands, and its reason says that more shadowed steps would settle it."""
CLEAR_CHANGE = 1.5
"""A layer's numerics changed during the run when its shadowed steps before some step and those from it on
(ShadowRecord.windows) differ so: one window's error above its threshold by this factor, the other's below it by
this factor. A layer near its threshold, whose windows straddle it by noise, is not reported."""


def threshold(floor, sensitivity=None) -> float:
    """The gradient error above which a layer stands out, from its noise floor (None: not measured) and its
    weight sensitivity at the format's precision (None: not measured): at least SENSITIVITY_MARGIN times the
    sensitivity, which no cap holds (an error of that size is what the FP32 step itself does to weights the
    format cannot tell apart)."""
    limit = FALLBACK_THRESHOLD if floor is None else min(max(MARGIN * floor, MIN_TOLERATED_ERROR),
                                                           MAX_TOLERATED_ERROR)
    return limit if sensitivity is None else max(limit, SENSITIVITY_MARGIN * sensitivity)


def _passes(m: dict | None, limit: float) -> bool:
    return m is not None and m["nonfinite_steps"] == 0 and m["grad_rel_error"] <= limit


def _over(m: dict, limit: float) -> float:
    """A window's error over the layer's threshold (inf where a step was non-finite)."""
    return math.inf if m["nonfinite_steps"] else m["grad_rel_error"] / limit


def change(windows: list, limit: float):
    """How a layer's numerics changed during the run: of its windows (ShadowRecord.windows), the one whose
    early and late steps differ most where one stands out by CLEAR_CHANGE over the layer's threshold and the
    other is under it by that factor. (evidence, the standing-out side's means by scale): evidence
    {"from_step", "stands_out": "early" or "late", "early", "late", "threshold"}; None when no window changes
    clearly (a layer near its threshold straddles it by noise). limit: the layer's threshold."""
    best = None
    for w in windows:
        early, late = _over(w["early"], limit), _over(w["late"], limit)
        for high, low, which in ((late, early, "late"), (early, late, "early")):
            if high > CLEAR_CHANGE and low < 1 / CLEAR_CHANGE:
                key = high / max(low, 1e-12)
                if best is None or key > best[0]:
                    best = key, {"from_step": w["from_step"], "stands_out": which, "threshold": limit,
                                 **{k: {"steps": w[k]["steps"], "grad_rel_error": w[k]["grad_rel_error"],
                                        "nonfinite_steps": w[k]["nonfinite_steps"]} for k in ("early", "late")}}, \
                        w["by_scale"][which]
    return None if best is None else best[1:]


def change_reason(fmt: str, changed: dict) -> str:
    """The summary's sentence for a layer whose numerics changed during the run."""
    e, l, step = changed["early"], changed["late"], changed["from_step"]
    when = f"from step {step} on" if changed["stands_out"] == "late" else f"before step {step}"
    return (f"{fmt} numerics changed during the run: gradient error {_num(e['grad_rel_error'])} before step {step} "
            f"({e['steps']} shadowed steps), {_num(l['grad_rel_error'])} from step {step} on ({l['steps']}), "
            f"threshold {_num(changed['threshold'])}: it stands out {when}, and the verdict is from those steps")


def _num(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return "non-finite"
    return f"{x:.3g}"


def judge(layers: list, lim, shadow: dict, counted: dict, counted_choice: LossScale):
    """Shadow-step verdicts for one format.

    layers: the report's module layers; shadow: ShadowRecord.to_dict();
    counted: {layer name: counted Verdict}. Returns ({layer: Verdict},
    LossScale or None when no layer has evidence, {layer: evidence dict}).
    A layer whose parameters are all tied to another's (a GPT head sharing the embedding) is judged by the
    shared parameters' gradient, measured under the layer the shadow steps found them in. Layers without
    shadow evidence (no gradient reached them) keep their counted verdict.
    """
    fmt = lim.name
    sources = shadow.get("overflow_sources", {}).get(fmt, {})
    steps = shadow.get("shadowed_steps", 0)
    measured, changes = {}, {}
    for layer in layers:
        entry = shadow["layers"].get(layer.name)
        if entry is not None and fmt in entry["formats"]:
            by_scale, floor = entry["formats"][fmt], entry["noise_floor"]
            sensitivity = entry.get("sensitivity", {}).get(fmt)
            found = change(entry.get("windows", {}).get(fmt, []), threshold(floor, sensitivity))
            if found is not None:            # judged where it stands out: a verdict that serves the whole run
                changes[layer.name], by_scale = found
            measured[layer.name] = (by_scale, floor, sensitivity)
    tied_to = {}
    for layer in layers:
        owner = next((t for t in layer.tied_with if t in measured), None)
        if layer.name not in measured and owner is not None:
            measured[layer.name], tied_to[layer.name] = measured[owner], owner
    if not measured and not sources:
        return {}, None, {}
    scales = sorted({s for by_scale, *_ in measured.values() for s in by_scale})
    limits = {name: threshold(floor, sensitivity) for name, (_, floor, sensitivity) in measured.items()}
    judged = [name for name in measured if name not in sources]

    def passing(s):
        return [n for n in judged if _passes(measured[n][0].get(s), limits[n])]

    recommended = None
    if not lim.per_tensor_scaled and scales:
        best = max(scales, key=lambda s: (len(passing(s)), -s))
        recommended = next((s for s in scales if len(passing(s)) == len(judged)), best)
    choice = None
    if recommended is not None:
        served = passing(recommended)
        top = recommended
        for s in scales[scales.index(recommended) + 1:]:
            if set(served) - set(passing(s)):
                break
            top = s
        names = [layer.name for layer in layers]
        choice = LossScale(fmt, recommended, recommended, top, [n for n in names if n in served],
                           [n for n in names if n not in served and n in measured],
                           (scales[0], scales[-1]))
    verdicts, evidence = {}, {}
    for name, (by_scale, floor, sensitivity) in measured.items():
        limit = limits[name]
        at1 = by_scale.get(0)
        by_sensitivity = limit > threshold(floor)
        ev = {"basis": "shadow steps", "steps": at1["steps"] if at1 else 0, "noise_floor": floor,
              "sensitivity": sensitivity, "threshold": limit, "margin": MARGIN,
              "grad_rel_error": at1["grad_rel_error"] if at1 else None,
              "grad_rel_error_se": at1.get("grad_rel_error_se") if at1 else None,
              "cosine": at1["cosine"] if at1 else None,
              "share_zeroed": at1["share_zeroed"] if at1 else None,
              "share_nonfinite": at1["share_nonfinite"] if at1 else None,
              "stands_out": not _passes(at1, limit), "overflow_source_steps": sources.get(name, 0),
              "by_scale_log2": {str(s): m for s, m in sorted(by_scale.items())}}
        shares = ""
        if name in tied_to:
            ev["tied_to"] = tied_to[name]
            shares = f", the parameters it shares with {tied_to[name]}"
        quote = (f"{fmt} shadow steps ({ev['steps']}{shares}): gradient error {_num(ev['grad_rel_error'])} at scale 1, "
                 f"noise floor {_num(floor)}"
                 + (f", weight sensitivity {_num(sensitivity)}" if by_sensitivity else "")
                 + f" (threshold {_num(limit)})")
        if at1 is not None and at1["share_zeroed"]:
            quote += f", {at1['share_zeroed']:.2%} of its norm lost to zeros"
        if at1 is not None and at1["nonfinite_steps"]:
            quote += f", non-finite on {at1['nonfinite_steps']} of {at1['steps']} steps"
        if recommended is not None:
            ev["recommended_scale_log2"] = recommended
            ev["grad_rel_error_at_recommended"] = by_scale.get(recommended, {}).get("grad_rel_error")
        if name in sources:
            verdicts[name] = Verdict("fp32", f"its output overflows {fmt} in the replay (non-finite from finite "
                                     f"inputs) on {sources[name]} of {steps} shadowed steps; {quote}", None)
        elif not ev["stands_out"]:
            verdicts[name] = Verdict("ok", quote + (f": within what moving its weights by one {fmt} rounding unit "
                                                    f"does to the FP32 gradient" if by_sensitivity else
                                                    ": within the noise the FP32 gradient already carries"),
                                     tensor_scales=counted[name].tensor_scales)
            if lim.per_tensor_scaled and counted[name].verdict != "ok":
                verdicts[name] = Verdict("loss_scale", quote + ": within the noise with per-tensor scales",
                                         tensor_scales=counted[name].tensor_scales)
        elif lim.per_tensor_scaled:
            verdicts[name] = Verdict("fp32", quote + ": stands out even with per-tensor scales",
                                     tensor_scales=counted[name].tensor_scales)
        elif recommended and _passes(by_scale.get(recommended), limit):
            verdicts[name] = Verdict("loss_scale", f"{quote}; at the recommended scale 2^{recommended} the error "
                                     f"is {_num(ev['grad_rel_error_at_recommended'])}")
        else:
            tried = ", ".join(f"2^{s}: {_num(m['grad_rel_error'])}" for s, m in sorted(by_scale.items()))
            verdicts[name] = Verdict("fp32", f"{quote}; no candidate scale brings it under its threshold ({tried})",
                                     None)
        se, error = ev["grad_rel_error_se"], ev["grad_rel_error"]
        ev["unsettled"] = bool(name not in sources and se and math.isfinite(error)
                               and abs(error - limit) < UNSETTLED_SE * se)
        if ev["unsettled"]:
            v = verdicts[name]
            verdicts[name] = dataclasses.replace(v, reason=f"{v.reason}; unsettled: the mean error is within "
                                                 f"{UNSETTLED_SE:g} standard errors ({_num(se)}) of the threshold "
                                                 f"over its {ev['steps']} shadowed steps, more would settle it")
        if name in changes:
            ev["numerics_changed"] = changes[name]
            v = verdicts[name]
            verdicts[name] = dataclasses.replace(v, reason=f"{v.reason}; {change_reason(fmt, changes[name])}")
        ev["counted_verdict"] = counted[name].verdict
        evidence[name] = ev
    for name, n in sources.items():      # an overflow source whose own gradient was not measured
        if name not in verdicts and name in counted:
            verdicts[name] = Verdict("fp32", f"its output overflows {fmt} in the replay (non-finite from finite "
                                     f"inputs) on {n} of {steps} shadowed steps", None)
            evidence[name] = {"basis": "shadow steps", "overflow_source_steps": n,
                              "counted_verdict": counted[name].verdict}
    return verdicts, choice, evidence


def scale_reason(lim, choice: LossScale | None, evidence: dict) -> str | None:
    """The summary's sentence for a format's recommended scale, quoting the worst layer it serves."""
    if choice is None:
        return None
    r = choice.recommended_log2
    served = [(evidence[n].get("by_scale_log2", {}).get(str(r), {}).get("grad_rel_error"), n) for n in choice.served
              if n in evidence]
    served = [(e, n) for e, n in served if e is not None]
    text = f"scale 2^{r}: the smallest candidate at which no served layer stands out of its noise floor"
    if served:
        e, n = max(served, key=lambda x: x[0] / evidence[x[1]]["threshold"])
        text += f" (closest: {n}, error {_num(e)} vs threshold {_num(evidence[n]['threshold'])})"
    if choice.unserved:
        text += f"; not served: {', '.join(choice.unserved[:6])}"
    return text


def judge_ops(ops: list, verdicts: dict, judged: dict, shadow: dict, lim, choice: LossScale | None) -> dict:
    """Op verdicts for a format the shadow steps replay whole (fp16, bf16), as {op name: Verdict}.

    An op inside the model acts on training only through the gradients the replay measured. Where the
    replay of this format was clean (no overflow source, every measured layer `ok`), an op's counted finding
    showed in no gradient: `ok`, its counts quoted. Where every layer but the overflow sources was served at
    the recommended scale (choice), so is every op whose forward values fit the format, outside the sources'
    modules: `ok` too. Otherwise the counted op verdicts stand: they locate the cause. Ops outside every module
    (the loop's own, such as a loss) are not replayed, nor are forward overflows on steps the replay did not
    sample: an op whose forward values overflow keeps its counted verdict unless the replay was clean.
    """
    fmt = lim.name
    sources = shadow.get("overflow_sources", {}).get(fmt, {})
    if not judged:
        return {}
    clean = not sources and all(v.verdict == "ok" for v in judged.values())
    served = choice is not None and all(v.verdict != "fp32" for n, v in judged.items() if n not in sources)
    if not clean and not served:
        return {}
    if clean:
        why = "no overflow showed in the model and no layer's gradient stood out of its noise floor"
    else:
        why = (f"every layer's gradient was within its noise floor at the recommended scale "
               f"2^{choice.recommended_log2}" + (f", with {', '.join(sources)} in FP32" if sources else ""))
    out = {}
    for op in ops:
        counted = verdicts[op.name][fmt]
        if op.module == OUTSIDE or counted.verdict == "ok":
            continue
        if not clean and (any(op.module == s or op.module.startswith(s + ".") for s in sources)
                          or any(t.overflows(lim, 0) for k, t in op.tensors.items() if k in FORWARD_KINDS)):
            continue
        out[op.name] = Verdict("ok", f"value counts: {counted.verdict} ({counted.reason}); not borne out: in the "
                               f"{fmt} shadow steps {why}", tensor_scales=counted.tensor_scales)
    return out
