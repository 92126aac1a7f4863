"""What changed between two observed runs: verdicts, loss scales and per-layer underflow shares.

`compare(a, b)` takes two Reports (or report folders / report.json files)
and lines up what both judged: formats and module entries by name. A change
is a verdict that differs (modules and op sites), a recommended loss scale
that differs, or a module or format only one run has; underflow shares
always differ a little between runs, so they are listed (largest change
first) but are not changes by themselves. `fpsim compare A B` prints it
(text, --json, --html) and exits 1 when something changed.
"""

from __future__ import annotations

import dataclasses
import math

from .text import scale_text
from .verdicts import FORWARD_KINDS, GRADIENT_KINDS

SHARES = ("grad_underflow_at_1", "forward_underflow")
"""The per-layer shares compared: the largest gradient underflow at scale 1 (activation and weight
gradients) and the largest underflow of activations and weights, as fractions of their nonzero values."""


@dataclasses.dataclass
class Comparison:
    """The differences between run `a` and run `b` (names and values as in report.json)."""

    a: str
    b: str
    runs: dict              # "a"/"b" -> {"steps", "status", "fpsim_version"}
    formats: list           # formats both runs judged
    only_in: dict           # "a"/"b" -> {"formats": [...], "layers": [...]}
    verdicts: list          # [{"layer", "format", "a", "b"}] for modules whose verdict changed
    op_verdicts: list       # the same for op sites both runs observed
    loss_scale: dict        # format -> {"a", "b" (recommended log2), "a_window", "b_window", "changed"}
    shares: list            # [{"layer", "format", "share", "a", "b", "change"}], largest |change| first

    @property
    def changed(self) -> bool:
        """Whether a verdict, a recommended loss scale, or the set of layers or formats differs."""
        return bool(self.verdicts or self.op_verdicts or any(e["changed"] for e in self.loss_scale.values())
                    or any(v for side in self.only_in.values() for v in side.values()))

    def to_dict(self) -> dict:
        return {"a": self.a, "b": self.b, "changed": self.changed, **dataclasses.asdict(self)}

    def text(self, max_shares: int = 12) -> str:
        """The comparison in words and small tables, for a terminal."""
        ra, rb = self.runs["a"], self.runs["b"]
        lines = [f"A: {self.a} ({ra['steps']} steps, {ra['status']})",
                 f"B: {self.b} ({rb['steps']} steps, {rb['status']})"]
        for side in ("a", "b"):
            for what, names in self.only_in[side].items():
                if names:
                    lines.append(f"{what} only in {side.upper()}: {', '.join(names)}")
        lines.append("")
        if self.verdicts or self.op_verdicts:
            lines.append("verdicts that changed (A -> B):")
            for e in self.verdicts + self.op_verdicts:
                lines.append(f"  {e['layer']}  {e['format']}: {e['a']} -> {e['b']}")
        else:
            lines.append(f"verdicts: none changed ({len(self.formats)} formats compared)")
        lines.append("recommended loss scale (A -> B):")
        for f, e in self.loss_scale.items():
            mark = "" if e["changed"] else "  (same)"
            lines.append(f"  {f:<8} {scale_text(e['a'])} -> {scale_text(e['b'])}{mark}")
        moved = [e for e in self.shares if e["change"] != 0]
        if moved:
            lines.append(f"largest changes of underflow shares ({min(len(moved), max_shares)} of {len(moved)} "
                         f"that changed; all in --json):")
            for e in moved[:max_shares]:
                lines.append(f"  {e['layer']}  {e['format']} {e['share']}: {_pct(e['a'])} -> {_pct(e['b'])}")
        lines.append("changed" if self.changed else "no verdict or loss scale changed")
        return "\n".join(lines)


def _pct(x) -> str:
    return "-" if x is None else f"{x * 100:.3g}%"


def compare(a, b) -> Comparison:
    """Compare two runs: Reports, or paths of report folders or report.json files."""
    from .report import Report

    names = {"a": _label(a), "b": _label(b)}
    ra, rb = (r if isinstance(r, Report) else Report.load(r) for r in (a, b))
    formats = [f for f in ra.formats if f in rb.formats]
    mods_a = {layer.name: layer for layer in ra.layers if not layer.is_op}
    mods_b = {layer.name: layer for layer in rb.layers if not layer.is_op}
    common = [n for n in mods_a if n in mods_b]
    only_in = {"a": {"formats": [f for f in ra.formats if f not in rb.formats],
                     "layers": [n for n in mods_a if n not in mods_b]},
               "b": {"formats": [f for f in rb.formats if f not in ra.formats],
                     "layers": [n for n in mods_b if n not in mods_a]}}
    verdicts = _verdict_changes(ra, rb, common, formats)
    ops_b = {op.name for op in rb.ops}
    op_verdicts = _verdict_changes(ra, rb, [op.name for op in ra.ops if op.name in ops_b], formats)
    loss_scale = {}
    for f in formats:
        la, lb = ra.loss_scale[f], rb.loss_scale[f]
        loss_scale[f] = {"a": la.recommended_log2, "b": lb.recommended_log2,
                         "a_window": _window(la), "b_window": _window(lb),
                         "changed": la.recommended_log2 != lb.recommended_log2}
    shares = []
    lims_a = {lim.name: lim for lim in ra.limits}
    lims_b = {lim.name: lim for lim in rb.limits}
    for name in common:
        for f in formats:
            sa, sb = _shares(mods_a[name], lims_a[f]), _shares(mods_b[name], lims_b[f])
            for share in SHARES:
                if sa[share] is None and sb[share] is None:
                    continue
                change = None if sa[share] is None or sb[share] is None else sb[share] - sa[share]
                shares.append({"layer": name, "format": f, "share": share, "a": sa[share], "b": sb[share],
                               "change": change})
    shares.sort(key=lambda e: -math.inf if e["change"] is None else -abs(e["change"]))
    shares.sort(key=lambda e: e["change"] is not None)   # a share only one run has comes first
    runs = {side: {"steps": r.run.get("steps", 0), "status": r.run.get("status", "")} for side, r in
            (("a", ra), ("b", rb))}
    return Comparison(names["a"], names["b"], runs, formats, only_in, verdicts, op_verdicts, loss_scale, shares)


def _label(source) -> str:
    from .report import Report

    return "report" if isinstance(source, Report) else str(source)


def _verdict_changes(ra, rb, names: list, formats: list) -> list:
    out = []
    for name in names:
        for f in formats:
            va, vb = ra.verdicts[name][f].verdict, rb.verdicts[name][f].verdict
            if va != vb:
                out.append({"layer": name, "format": f, "a": va, "b": vb})
    return out


def _window(choice):
    return None if choice.min_log2 is None else [choice.min_log2, choice.max_log2]


def _shares(layer, lim) -> dict:
    """The SHARES of one module entry in one format (None where it has no such tensors)."""
    out = {}
    for share, kinds in zip(SHARES, (GRADIENT_KINDS, FORWARD_KINDS)):
        tensors = [t for k, t in layer.tensors.items() if k in kinds and t.nonzero]
        out[share] = max(t.underflow_fraction(lim, 0) for t in tensors) if tensors else None
    return out
