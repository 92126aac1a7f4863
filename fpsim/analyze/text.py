"""The report as plain text: the summary table the command line prints (built here, printed by fpsim.cli)."""

from __future__ import annotations

import math

from .limits import LOW_PRECISION_DTYPES
from .store import GRADIENT_KINDS


def scale_text(log2: int | None) -> str:
    """2^k written out: '2^12 (4096)', '1', 'none'."""
    if log2 is None:
        return "none"
    if log2 == 0:
        return "1"
    value = math.ldexp(1.0, log2)
    shown = f"{value:.0f}" if 0 < log2 <= 24 else f"{value:.3g}"
    return f"2^{log2} ({shown})"


def _compact(numbers: list) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    numbers = sorted(set(numbers))
    parts, start = [], numbers[0]
    for a, b in zip(numbers, numbers[1:] + [None]):
        if b != a + 1:
            parts.append(str(start) if start == a else f"{start}-{a}")
            start = b
    return ",".join(parts)


def grouped(rows: list, tail: int = 0, merge=max) -> list:
    """Merge rows whose names differ only in one numeric part and whose other cells agree.

    rows: [(name, cells...)]; the last `tail` cells do not have to agree: a
    merged row gets merge() of its members' values there. A merged name writes
    the numbers it covers in braces: 'h.{0-11}.attn.c_attn'. Kept in the order
    of each group's first row.
    """
    import re

    number = r"(?<=\.)\d+(?=[.:]|$)"
    groups: dict = {}
    for row in rows:
        name, cells = row[0], tuple(row[1:len(row) - tail])
        numbers = re.findall(number, name)
        key = (re.sub(number, "#", name), *cells) if len(numbers) == 1 else (name, *cells)
        groups.setdefault(key, []).append((numbers, row))
    out = []
    for key, members in groups.items():
        if len(members) == 1:
            out.append(tuple(members[0][1]))
            continue
        numbers = [int(n[0]) for n, _ in members]
        tails = [merge(m[1][len(m[1]) - tail + i] for m in members) for i in range(tail)]
        out.append((key[0].replace("#", "{" + _compact(numbers) + "}"), *key[1:], *tails))
    return out


def aligned_table(header: list, rows: list) -> list:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip(), "  ".join("-" * w for w in widths)]
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    return lines


def _larger_share(shares) -> str:
    shares = [s for s in shares if s]
    return max(shares, key=lambda s: float(s.split("%")[0])) if shares else ""


def _worst_underflow(layer, lim) -> str:
    grads = [t for k, t in layer.tensors.items() if k in GRADIENT_KINDS and t.nonzero]
    if lim is None or not grads:
        return ""
    return f"{max(t.underflow_fraction(lim, 0) for t in grads) * 100:.3g}% ({lim.name})"


MAX_FINDING_ROWS = 16


def summary_table(report) -> str:
    """Layers x formats verdicts (blocks that agree merged into one row), the op findings, the loss
    scales, what the run itself did (autocast, GradScaler), the GradScaler replay and the FP8 recipe.
    Layer and op names are written in full (a column as wide as the longest)."""
    formats = report.formats
    modules = [layer for layer in report.layers if not layer.is_op]
    if not modules:
        return ("nothing was observed: no watched module ran a forward pass with gradients enabled "
                f"({report.run.get('steps', 0)} optimizer steps)")
    first_scaled = next((lim for lim in report.limits if not lim.per_tensor_scaled), None)
    rows = [(layer.name, layer.type, *(report.verdicts[layer.name][f].verdict for f in formats),
             _worst_underflow(layer, first_scaled)) for layer in modules]
    table_rows = [list(row) for row in grouped(rows, tail=1, merge=_larger_share)]
    lines = aligned_table(["layer", "type", *formats, "worst grad underflow @1"], table_rows)
    if report.findings:
        lines.append("")
        lines.append("ops judged worse than their module's output (every op's verdicts: report.json \"ops\"):")
        op_rows = grouped([(op.name, "/".join(sorted(op.dtypes)) or "-",
                            *(report.verdicts[op.name][f].verdict for f in formats)) for op in report.findings])
        shown = op_rows[:MAX_FINDING_ROWS]
        lines.extend("  " + line for line in aligned_table(["op", "ran in", *formats], [list(r) for r in shown]))
        if len(op_rows) > MAX_FINDING_ROWS:
            lines.append(f"  ... {len(op_rows) - MAX_FINDING_ROWS} more rows in report.json")
        reasons = _finding_reasons(report, formats)
        lines.extend(f"  {text}" for text in reasons[:6])
    lines.extend(shadow_lines(report))
    lines.extend(recipe_lines(report.recipes))
    lines.append("")
    lines.append("loss scale (one global scale for the gradients; FP8 rows are for reference, their verdicts "
                 "use per-tensor scales):")
    for lim in report.limits:
        ls = report.loss_scale[lim.name]
        if ls.recommended_log2 is None:
            text = "no single scale serves any layer"
        else:
            text = (f"recommended {scale_text(ls.recommended_log2)}, usable 2^{ls.min_log2}..2^{ls.max_log2}, "
                    f"serves {len(ls.served)} of {len(modules)} layers")
            if ls.unserved:
                text += f" (not: {', '.join(ls.unserved[:6])}{', ...' if len(ls.unserved) > 6 else ''})"
        lines.append(f"  {lim.name:<8} {text}")
    lines.extend(precision_lines(report.run.get("precision") or {}))
    for name, p in report.gradscaler.items():
        lines.append(f"GradScaler replay ({name}, init 2^16, growth every {p.growth_interval} steps, every layer in "
                     f"{name}): {p.skipped_steps} of {p.steps} steps skipped, final scale "
                     f"{scale_text(round(math.log2(p.final_scale)) if p.final_scale > 0 else None)}")
        if p.forward_overflows:
            shown = ", ".join(p.forward_overflows[:6]) + (", ..." if len(p.forward_overflows) > 6 else "")
            lines.append(f"  (with {shown} kept in FP32: their forward values overflow {name}, and the Inf they "
                         f"become in {name} can turn the loss and gradients Inf/NaN, which skips the step)")
    if report.fp8:
        parts = []
        for kind, entry in report.fp8.items():
            lost = ", ".join(f"{f} {v * 100:.2g}%" for f, v in entry["lost"].items())
            parts.append(f"  {kind:<16} {entry['choice'] or 'neither (keep bf16/fp32)':<12} lost: {lost}")
        lines.append("FP8 with per-tensor scaling, per tensor kind (format chosen, values lost to underflow):")
        lines.extend(parts)
    lost = report.lost_updates()
    if lost:
        lines.append("updates lost if the weights themselves were stored in the format (keep FP32 master weights "
                     "where this is large): " + ", ".join(f"{f} {v * 100:.3g}%" for f, v in lost.items()))
    for note in report.run.get("notes") or []:
        lines.append(f"note: {note}")
    run = report.run
    status = run.get("status", "")
    tail = f"{run.get('steps', 0)} steps ({run.get('steps_observed', 0)} observed, every {run.get('every', 1)})"
    if status and status != "completed":
        tail += f", run {status}" + (f": {run['error']}" if run.get("error") else "")
    if run.get("observation_error"):
        tail += f"; observation stopped early: {run['observation_error']}"
    bad = [(layer.name, layer.first_nonfinite_step) for layer in report.layers + report.ops
           if layer.first_nonfinite_step is not None]
    if bad:
        bad.sort(key=lambda x: x[1])
        tail += "; first Inf/NaN: " + ", ".join(f"{n} at step {s}" for n, s in bad[:5])
    lines.append(tail)
    return "\n".join(lines)


def shadow_lines(report) -> list:
    """How the verdicts were reached when shadow steps ran, and the reason of each layer that needs help."""
    shadow = report.shadow_summary()
    if not shadow:
        return []
    rule = shadow["rule"]
    sensitivity = rule.get("sensitivity_margin")      # (absent from reports saved before it was part of the rule)
    lines = ["", f"verdicts from shadow steps ({shadow['shadowed_steps']} steps replayed, every {shadow['every']}; "
                 f"{', '.join(shadow['formats'])}): a layer needs loss scaling or FP32 only when its gradient error "
                 f"exceeds {rule['margin']:g} x its noise floor (kept within {rule['min_tolerated_error']:g}.."
                 f"{rule['max_tolerated_error']:g})"
                 + ("" if sensitivity is None else f" and, where measured, {sensitivity:g} x its weight sensitivity")
                 + "; value-count verdicts: report.json"]
    cleared = {}
    for op in report.ops:
        for lim in report.limits:
            if "not borne out" in report.verdicts[op.name][lim.name].reason:
                cleared.setdefault(lim.name, []).append(op.name)
    for fmt, names in cleared.items():
        lines.append(f"  {fmt}: {len(names)} ops the value counts judged fp32 or loss_scale, such as {names[0]}, "
                     f"are ok: not borne out by the replay (each op's reason in report.json says how)")
    judged = {layer.name for layer in report.layers if layer.name in report.shadow_evidence}
    for fmt, sources in shadow.get("overflow_sources", {}).items():
        unjudged = [name for name in sources if name not in judged]
        if unjudged:
            lines.append(f"  {fmt}: the replay's output of {', '.join(unjudged[:4])}"
                         + (f" and {len(unjudged) - 4} more" if len(unjudged) > 4 else "")
                         + f" turned non-finite from finite inputs (on {max(sources[n] for n in unjudged)} of "
                         f"{shadow['shadowed_steps']} shadowed steps); no layers of the report (no parameters of their "
                         f"own), so no layer verdict: the op verdicts say which of their ops overflow")
    for lim in report.limits:
        for layer in report.layers:
            v = report.verdicts[layer.name][lim.name]
            if layer.is_op or layer.name not in report.shadow_evidence:
                continue
            # (with per-tensor scales, loss_scale is the norm: no help needed)
            needs_help = v.verdict != "ok" and not (lim.per_tensor_scaled and v.verdict == "loss_scale")
            if needs_help or "numerics_changed" in report.shadow_evidence[layer.name].get(lim.name, {}):
                lines.append(f"  {layer.name} {lim.name} {v.verdict}: {v.reason}")
    return lines[:24]


def _finding_reasons(report, formats) -> list:
    """One line per distinct (op, format, verdict) reason among the findings, fp32 first."""
    seen, out = set(), []
    for severity in ("fp32", "loss_scale"):
        for op in report.findings:
            for f in formats:
                v = report.verdicts[op.name][f]
                mod = report.verdicts.get(op.module, {}).get(f)
                if v.verdict != severity or (mod is not None and mod.verdict == severity):
                    continue
                key = (op.name.rpartition(":")[2], f, severity)
                if key in seen:
                    continue
                seen.add(key)
                out.append(f"{op.name} {f} {severity}: {v.reason}")
    return out


def precision_lines(precision: dict) -> list:
    """What the run itself computed in: autocast, dtypes of the op outputs, each real GradScaler."""
    lines = []
    autocast = precision.get("autocast") or {}
    dtypes = precision.get("op_outputs_by_dtype") or {}
    if autocast or any(d in dtypes for d in LOW_PRECISION_DTYPES):
        ran = ", ".join(f"{d} {n}" for d, n in sorted(dtypes.items(), key=lambda kv: -kv[1]))
        where = ", ".join(f"{dev} {d}" for dev, d in autocast.items()) or "none"
        lines.append(f"the run's precision: autocast {where}; op outputs by dtype: {ran}")
    for s in precision.get("grad_scalers") or []:
        scales = sorted({v for _, v in s["trajectory"]})
        shown = scale_text(round(math.log2(scales[0]))) if len(scales) == 1 and scales[0] > 0 else \
            f"{len(s['trajectory'])} values, last {scale_text(round(s['last_scale_log2']))}" \
            if s.get("last_scale_log2") is not None else "unknown"
        lines.append(f"{s['name']} (the run's own): {s['steps']} steps, {s['skipped_steps']} skipped, scale "
                     f"{shown}; gradients were divided by it before counting, so verdicts are those of FP32")
    return lines


def _percent(x) -> str:
    return "" if x is None else f"{x * 100:.2g}%"


def _largest_error(values):
    values = [v for v in values if v is not None]
    return max(values) if values else None


def recipe_lines(section: dict | None) -> list:
    """The summary's recipe table: one row per layer (repeated blocks that agree merged), a column per kind."""
    from .recipe_choice import FP8_ORDER, measured_kinds, table_rows  # (its probes need torch)

    if not section or not section["layers"]:
        return []
    kinds = measured_kinds(section)
    n = len(kinds)
    rows = grouped(table_rows(section), tail=n, merge=_largest_error)
    shown = []
    for row in rows:
        choices, narrowest, errors = row[2:2 + n], row[2 + n], row[3 + n:]
        shown.append([row[0], row[1], *(f"{c} {_percent(e)}".rstrip() for c, e in zip(choices, errors)), narrowest])
    limits = [layer["threshold"] for layer in section["layers"]]
    floors = any(layer["threshold_source"].startswith("noise floor") for layer in section["layers"])
    limit = f"{min(limits):.3g}" if min(limits) == max(limits) else f"{min(limits):.3g}..{max(limits):.3g}"
    lines = ["", f"scaling recipes measured on {len(section['steps'])} sampled steps (every {section['every']}): "
                 f"per layer and tensor kind, the cheapest FP8 recipe whose error ||q(x)-x||/||x|| stays under the "
                 f"layer's threshold ({limit}: "
                 + ("its shadow-step noise floor where measured, else " + f"{section['fallback_threshold']:g}"
                    if floors else "fixed, no noise floor measured")
                 + "), and that error; fp6/fp4: the narrowest MX/NV format serving every kind",
             "  order: " + " < ".join(FP8_ORDER)]
    lines.extend("  " + line for line in aligned_table(["layer", "type", *kinds, "fp6/fp4"], shown))
    summary = section["summary"]
    for kind, entry in summary["by_kind"].items():
        forced = entry["forced_by"]
        text = f"  {kind:<16} {entry['recipe'] or 'none (keep bf16/fp32)'}"
        if forced:
            text += f", forced by {', '.join(forced[:4])}{' ...' if len(forced) > 4 else ''}"
        text += f"; narrowest serving all: {entry['narrowest'] or 'none'}"
        lines.append(text)
    lines.append(f"  the cheapest FP8 recipe serving the whole model: {summary['model'] or 'none'}")
    if section.get("error"):
        lines.append(f"  note: the recipe measurements stopped early: {section['error']}")
    return lines
