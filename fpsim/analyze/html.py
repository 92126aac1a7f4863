"""The report (and a comparison of two runs) as one self-contained HTML page: inline CSS and script,
figures as base64 PNG, no network. Every table with a header can be sorted (click a column) and
filtered (the box above it); cells sort by their data-v value where they carry one."""

from __future__ import annotations

import base64
import html
import math

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
th.sort { cursor: pointer; user-select: none; } th.sort:after { content: ' \\2195'; color: #aaa; }
input.filter { margin: 0.6em 0 0 0; padding: 2px 6px; width: 22em; font: inherit; }
div.wide { overflow-x: auto; } table.meta td:first-child { color: #666; } td.num { text-align: right; }
"""

_SCRIPT = """
document.querySelectorAll('table.sortable').forEach(function (table) {
  var rows = function () { return Array.prototype.slice.call(table.tBodies[0].rows); };
  var box = document.createElement('input');
  box.className = 'filter'; box.placeholder = 'filter rows (text in any cell)';
  table.parentNode.insertBefore(box, table);
  box.addEventListener('input', function () {
    var q = box.value.toLowerCase();
    rows().forEach(function (r) { r.style.display = r.textContent.toLowerCase().indexOf(q) < 0 ? 'none' : ''; });
  });
  Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, col) {
    th.className += ' sort'; th.title = th.title || 'click to sort';
    th.addEventListener('click', function () {
      var up = th.dataset.dir !== 'up'; th.dataset.dir = up ? 'up' : 'down';
      var key = function (r) { var c = r.cells[col];
                               return !c ? '' : c.dataset.v !== undefined ? parseFloat(c.dataset.v) : c.textContent; };
      var sorted = rows().sort(function (a, b) {
        var x = key(a), y = key(b);
        var c = (typeof x === 'number' && typeof y === 'number') ? x - y : String(x).localeCompare(String(y));
        return up ? c : -c; });
      sorted.forEach(function (r) { table.tBodies[0].appendChild(r); });
    });
  });
});
"""

_SEVERITY = {"ok": 0, "loss_scale": 1, "fp32": 2}


def _e(text) -> str:
    return html.escape(str(text))


def _pct(x) -> str:
    return "" if x is None else f"{x * 100:.3g}%"


def _page(title: str, body: list) -> str:
    return "\n".join([f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{_e(title)}</title>"
                      f"<style>{_CSS}</style></head><body>", *body, f"<script>{_SCRIPT}</script></body></html>"])


def _table(header: list, rows: list, sortable: bool = True) -> str:
    """A table: header cells (text or (text, title)), rows of ready-made <td> strings."""
    cells = "".join(f"<th title='{_e(h[1])}'>{_e(h[0])}</th>" if isinstance(h, tuple) else f"<th>{_e(h)}</th>"
                    for h in header)
    return (f"<div class='wide'><table{' class=sortable' if sortable else ''}><thead><tr>{cells}</tr></thead>"
            "<tbody>" + "".join(f"<tr>{''.join(r)}</tr>" for r in rows) + "</tbody></table></div>")


def _td(text, value=None, cls: str = "", title: str = "") -> str:
    """A cell; `value`: the number it sorts by (None: by its text)."""
    if value is not None:
        value = float(value)
        value = value if math.isfinite(value) else ("-Infinity" if value < 0 else "Infinity")
    attrs = (f" class='{cls}'" if cls else "") + (f" title='{_e(title)}'" if title else "") + \
        ("" if value is None else f" data-v='{value}'")
    return f"<td{attrs}>{_e(text)}</td>"


def _share(x) -> str:
    return _td(_pct(x), -1 if x is None else x, "num")


def _metadata(report) -> str:
    """The run's identity: versions, date, script, model, steps, status."""
    from .. import __version__

    run = report.run
    status = str(run.get("status", "")) + (f": {run['error']}" if run.get("error") else "")
    if run.get("observation_error"):
        status += f"; observation stopped early: {run['observation_error']}"
    rows = [("model", run.get("model") or "not recorded"), ("script", run.get("script") or "-"),
            ("date", run.get("date") or "-"),
            ("steps", f"{run.get('steps', 0)} optimizer steps, {run.get('steps_observed', 0)} observed "
                      f"(every {run.get('every', 1)}), {run.get('world_size', 1)} rank(s), {run.get('seconds', 0)} s"),
            ("status", status),
            ("versions", f"fpsim {run.get('fpsim_version') or __version__} (this page: {__version__}), torch {run.get('torch_version') or '-'}, "
                         f"Python {run.get('python_version') or '-'}"),
            ("underflow tolerance", f"{report.settings.underflow_threshold:g} of nonzero values")]
    return "<table class='meta'>" + "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in rows) + \
        "</table>"


def render_html(report, pngs: dict) -> str:
    """The whole page; `pngs` maps figure file names to PNG bytes."""
    parts = ["<h1>fpsim: which layers lose their values in low precision</h1>", _metadata(report)]
    parts.append("<h2>Verdicts</h2><p class='muted'><b>ok</b>: fine in this format as is; <b>loss_scale</b>: "
                 "fine with the recommended loss scale (FP8: with per-tensor scales); <b>fp32</b>: keep this "
                 "layer in higher precision. Hover a cell for the reason; sorting a format column puts the "
                 "worst verdicts last.</p>")
    rows = []
    for layer in report.layers:
        cells = [_td(layer.name), _td(layer.type)]
        for f in report.formats:
            v = report.verdicts[layer.name][f]
            cells.append(_td(v.verdict, _SEVERITY[v.verdict], v.verdict, v.reason))
        first = layer.first_nonfinite_step
        cells.append(_td("" if first is None else first, -1 if first is None else first, "num"))
        rows.append(cells)
    parts.append(_table(["layer", "type", *report.formats, "first Inf/NaN step"], rows))
    parts.append("<h2>Loss scale</h2>")
    rows = []
    for f, ls in report.loss_scale.items():
        window = "none" if ls.min_log2 is None else f"2^{ls.min_log2} .. 2^{ls.max_log2}"
        rows.append([_td(f), _td(scale_text(ls.recommended_log2), ls.recommended_log2), _td(window),
                     _td(len(ls.served), len(ls.served), "num"), _td(", ".join(ls.unserved))])
    parts.append(_table(["format", "recommended", "usable window", "layers served", "no shared scale serves"],
                        rows, sortable=False))
    if report.gradscaler:
        parts.append("<h2>What torch.amp.GradScaler would do</h2>")
        rows = [[_td(f), _td(p.steps, p.steps, "num"), _td(p.skipped_steps, p.skipped_steps, "num"), _td(f"{p.final_scale:g}"),
                 _td(f"{p.min_scale:g} .. {p.max_scale:g}")] for f, p in report.gradscaler.items()]
        parts.append(_table(["format", "steps", "skipped", "final scale", "scale range"], rows, sortable=False))
    if report.fp8:
        names = sorted({n for e in report.fp8.values() for n in e["lost"]})
        parts.append("<h2>FP8 with per-tensor scaling</h2>")
        rows = [[_td(kind), _td(e["choice"] or "neither: keep bf16/fp32"), *(_share(e["lost"].get(n)) for n in names)]
                for kind, e in report.fp8.items()]
        parts.append(_table(["tensor kind", "choice", *(f"lost in {n}" for n in names)], rows, sortable=False))
    parts.extend(_recipes(report.recipes))
    parts.append("<h2>Reasons</h2>")
    rows = [[_td(layer.name), _td(f), _td(v.verdict, _SEVERITY[v.verdict], v.verdict), _td(v.reason)]
            for layer in report.layers for f in report.formats for v in [report.verdicts[layer.name][f]]]
    parts.append(_table(["layer", "format", "verdict", "reason"], rows))
    parts.append(_fractions(report))
    if pngs:
        parts.append("<h2>Figures</h2>")
        for name, data in pngs.items():
            b64 = base64.b64encode(data).decode("ascii")
            parts.append(f"<p class='muted'>{_e(name)}</p><img alt='{_e(name)}' src='data:image/png;base64,{b64}'>")
    parts.append("<p class='muted'>Written by fpsim. Schema and definitions: docs/analyzer.md.</p>")
    return _page("fpsim gradient-underflow report", parts)


def _recipes(section) -> list:
    """The scaling-recipe table: one row per layer, per kind the cheapest FP8 recipe that serves and its error
    (hover: every recipe's error), the narrowest FP6/FP4 format serving the layer, and the per-kind summary."""
    from .recipe_choice import FP8_ORDER, measured_kinds, table_rows

    if not section or not section["layers"]:
        return []
    kinds = measured_kinds(section)
    n = len(kinds)
    by_name = {layer["name"]: layer for layer in section["layers"]}
    rows = []
    for row in table_rows(section):
        layer = by_name[row[0]]
        cells = [_td(row[0]), _td(row[1])]
        for kind, choice, error in zip(kinds, row[2:2 + n], row[3 + n:]):
            entry = layer["kinds"].get(kind)
            hover = "" if entry is None else "; ".join(
                f"{c} {_pct(v['rel_error'])}" for c, v in entry["loss"].items() if v["rel_error"] is not None)
            order = FP8_ORDER.index(choice) if choice in FP8_ORDER else len(FP8_ORDER)
            cells.append(_td(f"{choice} {_pct(error)}".rstrip(), order, title=hover))
        cells.append(_td(row[2 + n]))
        cells.append(_td(f"{layer['threshold']:.3g}", layer["threshold"], "num", layer["threshold_source"]))
        rows.append(cells)
    parts = [f"<h2>Scaling recipes</h2><p class='muted'>Measured on {len(section['steps'])} sampled steps "
             f"(every {section['every']}): per layer and tensor kind, the cheapest FP8 recipe (order: "
             f"{_e(' < '.join(FP8_ORDER))}) whose error ||q(x)-x||/||x|| stays under the layer's threshold, "
             "with that error (hover a cell for every recipe's error); fp6/fp4: the narrowest MX/NV format that "
             "serves every kind of the layer.</p>",
             _table(["layer", "type", *kinds, "fp6/fp4", ("threshold", "from the noise floor, else fixed")], rows)]
    summary = section["summary"]
    rows = [[_td(kind), _td(e["recipe"] or "none: keep bf16/fp32"), _td(", ".join(e["forced_by"])),
             _td(e["narrowest"] or "none")] for kind, e in summary["by_kind"].items()]
    rows.append([_td("whole model"), _td(summary["model"] or "none"), _td(", ".join(summary["model_forced_by"])),
                 _td("")])
    parts.append(_table(["tensor kind", "cheapest recipe serving every layer", "forced by", "narrowest"], rows,
                        sortable=False))
    return parts


_FRACTIONS = (("flushed", "flushed to zero at scale 1", "underflow_fraction"),
              ("subnormal", "in the subnormal range (fewer significant bits)", "subnormal_fraction"),
              ("overflow", "overflowing (an upper bound)", "overflow_fraction"),
              ("updates lost", "updates lost to the weight's rounding (update tensors only)", "lost_update_fraction"))


def _fractions(report) -> str:
    """One row per layer and tensor kind, one column per format and fraction, each cell one percentage."""
    with_updates = any("update" in layer.tensors for layer in report.layers)
    shown = _FRACTIONS if with_updates else _FRACTIONS[:3]
    header = ["layer", "kind", ("values", "values counted over the observed steps"), "max |x|"]
    header += [(f"{lim.name} {word}", f"{lim.name}: share of nonzero values {what}")
               for lim in report.limits for word, what, _ in shown]
    rows = []
    for layer in report.layers:
        for kind, t in layer.tensors.items():
            cells = [_td(layer.name), _td(kind), _td(t.hist.total, t.hist.total, "num"), _td(f"{t.amax:.3g}", t.amax, "num")]
            for lim in report.limits:
                cells += [_share(getattr(t, method)(lim)) for _, _, method in shown]
            rows.append(cells)
    return ("<h2>Fractions at scale 1</h2><p class='muted'>Of the nonzero finite values of each tensor kind, summed "
            "over the observed steps; hover a column header for its meaning.</p>" + _table(header, rows))


def render_comparison_html(comparison) -> str:
    """A page of what changed between two runs (a fpsim.analyze.compare.Comparison)."""
    c = comparison
    parts = ["<h1>fpsim: what changed between two runs</h1><table class='meta'>"]
    for side in ("a", "b"):
        run = c.runs[side]
        parts.append(f"<tr><td>{side.upper()}</td><td>{_e(getattr(c, side))}: {_e(run['steps'])} steps, "
                     f"{_e(run['status'])}</td></tr>")
    parts.append("</table>")
    for side in ("a", "b"):
        for what, names in c.only_in[side].items():
            if names:
                parts.append(f"<p>{_e(what)} only in {side.upper()}: {_e(', '.join(names))}</p>")
    parts.append(f"<p><b>{'changed' if c.changed else 'no verdict or loss scale changed'}</b></p>")
    parts.append("<h2>Verdicts that changed</h2>")
    rows = [[_td(e["layer"]), _td(e["format"]), _td(e["a"], _SEVERITY[e["a"]], e["a"]),
             _td(e["b"], _SEVERITY[e["b"]], e["b"])] for e in c.verdicts + c.op_verdicts]
    parts.append(_table(["layer or op", "format", "A", "B"], rows) if rows else "<p>none</p>")
    parts.append("<h2>Recommended loss scale</h2>")
    rows = [[_td(f), _td(scale_text(e["a"]), e["a"]), _td(scale_text(e["b"]), e["b"]),
             _td("changed" if e["changed"] else "same")] for f, e in c.loss_scale.items()]
    parts.append(_table(["format", "A", "B", ""], rows, sortable=False))
    parts.append("<h2>Underflow shares</h2><p class='muted'>grad_underflow_at_1: the largest share of a layer's "
                 "nonzero gradients flushed to zero at scale 1; forward_underflow: the same for activations and "
                 "weights. Largest change first.</p>")
    rows = [[_td(e["layer"]), _td(e["format"]), _td(e["share"]), _share(e["a"]), _share(e["b"]),
             _td("" if e["change"] is None else f"{e['change'] * 100:+.3g} pp", e["change"], "num")]
            for e in c.shares]
    parts.append(_table(["layer", "format", "share", "A", "B", "change"], rows))
    return _page("fpsim: comparison of two runs", parts)
