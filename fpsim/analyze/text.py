"""The report as plain text: the summary table the command line prints (built here, printed by cli.py)."""

from __future__ import annotations

import math


def scale_text(log2: int | None) -> str:
    """2^k written out: '2^12 (4096)', '1', 'none'."""
    if log2 is None:
        return "none"
    if log2 == 0:
        return "1"
    value = math.ldexp(1.0, log2)
    shown = f"{value:.0f}" if 0 < log2 <= 24 else f"{value:.3g}"
    return f"2^{log2} ({shown})"


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else "…" + text[-(width - 1):]


def summary_table(report, max_name: int = 32) -> str:
    """Layers x formats verdicts, then each format's loss scale, the GradScaler replay and the FP8 recipe."""
    formats = report.formats
    if not report.layers:
        return ("nothing was observed: no watched module ran a forward pass with gradients enabled "
                f"({report.run.get('steps', 0)} optimizer steps)")
    header = ["layer", "type", *formats, "worst grad underflow @1"]
    first_scaled = next((lim for lim in report.limits if not lim.per_tensor_scaled), None)
    rows = []
    for layer in report.layers:
        worst = ""
        if first_scaled is not None:
            grads = [t for k, t in layer.tensors.items() if k in ("activation_grad", "weight_grad") and t.nonzero]
            if grads:
                uf = max(t.underflow_fraction(first_scaled, 0) for t in grads)
                worst = f"{uf * 100:.3g}% ({first_scaled.name})"
        rows.append([_cut(layer.name, max_name), layer.type,
                     *(report.verdicts[layer.name][f].verdict for f in formats), worst])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip(),
             "  ".join("-" * w for w in widths)]
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    lines.append("")
    lines.append("loss scale (one global scale for the gradients; FP8 rows are for reference, their verdicts "
                 "use per-tensor scales):")
    for lim in report.limits:
        ls = report.loss_scale[lim.name]
        if ls.recommended_log2 is None:
            text = "no single scale serves any layer"
        else:
            text = (f"recommended {scale_text(ls.recommended_log2)}, usable 2^{ls.min_log2}..2^{ls.max_log2}, "
                    f"serves {len(ls.served)} of {len(report.layers)} layers")
            if ls.unserved:
                text += f" (not: {', '.join(ls.unserved[:6])}{', ...' if len(ls.unserved) > 6 else ''})"
        lines.append(f"  {lim.name:<8} {text}")
    for name, p in report.gradscaler.items():
        lines.append(f"GradScaler ({name}, init 2^16, growth every {p.growth_interval} steps): "
                     f"{p.skipped_steps} of {p.steps} steps skipped, final scale "
                     f"{scale_text(round(math.log2(p.final_scale)) if p.final_scale > 0 else None)}")
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
    run = report.run
    status = run.get("status", "")
    tail = f"{run.get('steps', 0)} steps ({run.get('steps_observed', 0)} observed, every {run.get('every', 1)})"
    if status and status != "completed":
        tail += f", run {status}" + (f": {run['error']}" if run.get("error") else "")
    if run.get("observation_error"):
        tail += f"; observation stopped early: {run['observation_error']}"
    bad = [(layer.name, layer.first_nonfinite_step) for layer in report.layers
           if layer.first_nonfinite_step is not None]
    if bad:
        bad.sort(key=lambda x: x[1])
        tail += "; first Inf/NaN: " + ", ".join(f"{n} at step {s}" for n, s in bad[:5])
    lines.append(tail)
    return "\n".join(lines)
