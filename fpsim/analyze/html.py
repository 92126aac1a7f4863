"""The report as one self-contained HTML page: inline CSS, figures as base64 PNG, no network."""

from __future__ import annotations

import base64
import html

from .text import scale_text

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 2em auto; max-width: 1200px;
       color: #222; padding: 0 1em; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f5f5f5; }
td.ok { background: #e6f4ea; } td.loss_scale { background: #fff4d6; } td.fp32 { background: #fde2e1; }
.muted { color: #666; font-size: 12px; }
img { max-width: 100%; border: 1px solid #eee; margin: 0.5em 0; }
code { background: #f4f4f4; padding: 0 3px; }
"""


def _e(text) -> str:
    return html.escape(str(text))


def _pct(x) -> str:
    return "" if x is None else f"{x * 100:.3g}%"


def render_html(report, pngs: dict) -> str:
    """The whole page; `pngs` maps figure file names to PNG bytes."""
    run = report.run
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
             f"<title>fpsim gradient-underflow report</title><style>{_CSS}</style></head><body>",
             "<h1>fpsim: which layers lose their values in low precision</h1>",
             f"<p class='muted'>{_e(run.get('steps', 0))} optimizer steps, {_e(run.get('steps_observed', 0))} "
             f"observed (every {_e(run.get('every', 1))}), {_e(run.get('world_size', 1))} rank(s), "
             f"status <b>{_e(run.get('status', ''))}</b>"
             + (f": {_e(run['error'])}" if run.get("error") else "")
             + (f"; observation stopped early: {_e(run['observation_error'])}" if run.get("observation_error")
                else "")
             + f". Underflow tolerance {report.settings.underflow_threshold:g} of nonzero values.</p>"]
    # verdict table
    parts.append("<h2>Verdicts</h2><p class='muted'><b>ok</b>: fine in this format as is; <b>loss_scale</b>: "
                 "fine with the recommended loss scale (FP8: with per-tensor scales); <b>fp32</b>: keep this "
                 "layer in higher precision. Hover a cell for the reason.</p>")
    parts.append("<table><tr><th>layer</th><th>type</th>" + "".join(f"<th>{_e(f)}</th>" for f in report.formats)
                 + "<th>first Inf/NaN step</th></tr>")
    for layer in report.layers:
        cells = []
        for f in report.formats:
            v = report.verdicts[layer.name][f]
            cells.append(f"<td class='{v.verdict}' title='{_e(v.reason)}'>{v.verdict}</td>")
        first = "" if layer.first_nonfinite_step is None else layer.first_nonfinite_step
        parts.append(f"<tr><td>{_e(layer.name)}</td><td>{_e(layer.type)}</td>{''.join(cells)}<td>{first}</td></tr>")
    parts.append("</table>")
    # loss scales
    parts.append("<h2>Loss scale</h2><table><tr><th>format</th><th>recommended</th><th>usable window</th>"
                 "<th>layers served</th><th>no shared scale serves</th></tr>")
    for f, ls in report.loss_scale.items():
        window = "none" if ls.min_log2 is None else f"2^{ls.min_log2} .. 2^{ls.max_log2}"
        parts.append(f"<tr><td>{_e(f)}</td><td>{_e(scale_text(ls.recommended_log2))}</td><td>{window}</td>"
                     f"<td>{len(ls.served)}</td><td>{_e(', '.join(ls.unserved))}</td></tr>")
    parts.append("</table>")
    if report.gradscaler:
        parts.append("<h2>What torch.amp.GradScaler would do</h2><table><tr><th>format</th><th>steps</th>"
                     "<th>skipped</th><th>final scale</th><th>scale range</th></tr>")
        for f, p in report.gradscaler.items():
            parts.append(f"<tr><td>{_e(f)}</td><td>{p.steps}</td><td>{p.skipped_steps}</td>"
                         f"<td>{p.final_scale:g}</td><td>{p.min_scale:g} .. {p.max_scale:g}</td></tr>")
        parts.append("</table>")
    if report.fp8:
        names = sorted({n for e in report.fp8.values() for n in e["lost"]})
        parts.append("<h2>FP8 with per-tensor scaling</h2><table><tr><th>tensor kind</th><th>choice</th>"
                     + "".join(f"<th>lost in {_e(n)}</th>" for n in names) + "</tr>")
        for kind, e in report.fp8.items():
            parts.append(f"<tr><td>{_e(kind)}</td><td>{_e(e['choice'] or 'neither: keep bf16/fp32')}</td>"
                         + "".join(f"<td>{_pct(e['lost'].get(n))}</td>" for n in names) + "</tr>")
        parts.append("</table>")
    # reasons
    parts.append("<h2>Reasons</h2><table><tr><th>layer</th><th>format</th><th>verdict</th><th>reason</th></tr>")
    for layer in report.layers:
        for f in report.formats:
            v = report.verdicts[layer.name][f]
            parts.append(f"<tr><td>{_e(layer.name)}</td><td>{_e(f)}</td><td class='{v.verdict}'>{v.verdict}</td>"
                         f"<td>{_e(v.reason)}</td></tr>")
    parts.append("</table>")
    # fractions
    parts.append("<h2>Fractions at scale 1</h2><p class='muted'>Of the nonzero finite values of each tensor kind, "
                 "summed over observed steps: flushed to zero / in the subnormal range / overflowing "
                 "(upper bound) / for updates, lost to the weight's rounding.</p>")
    parts.append("<table><tr><th>layer</th><th>kind</th><th>values</th><th>max |x|</th>"
                 + "".join(f"<th>{_e(f)}</th>" for f in report.formats) + "</tr>")
    for layer in report.layers:
        for kind, t in layer.tensors.items():
            cells = []
            for lim in report.limits:
                text = (f"{_pct(t.underflow_fraction(lim))} / {_pct(t.subnormal_fraction(lim))} / "
                        f"{_pct(t.overflow_fraction(lim))}")
                lost = t.lost_update_fraction(lim)
                if lost is not None:
                    text += f" / {_pct(lost)}"
                cells.append(f"<td>{text}</td>")
            parts.append(f"<tr><td>{_e(layer.name)}</td><td>{_e(kind)}</td><td>{t.hist.total}</td>"
                         f"<td>{t.amax:.3g}</td>{''.join(cells)}</tr>")
    parts.append("</table>")
    if pngs:
        parts.append("<h2>Figures</h2>")
        for name, data in pngs.items():
            b64 = base64.b64encode(data).decode("ascii")
            parts.append(f"<p class='muted'>{_e(name)}</p><img alt='{_e(name)}' src='data:image/png;base64,{b64}'>")
    parts.append("<p class='muted'>Written by fpsim.watch. Schema and definitions: docs/analyzer.md.</p>"
                 "</body></html>")
    return "\n".join(parts)
