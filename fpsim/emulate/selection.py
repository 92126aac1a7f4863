"""Which parts of a model an emulation treats how: modules and ops kept in FP32, layers emulated.

Names are those of `fpsim.watch` and its report: modules as in ``model.named_modules()``
(the model itself by its class name), ops as ``Module:op`` with the aten op that op-level
observation names (``h.0.attn:mul``, ``GPT:embedding``; ``loop:op`` outside every module).
Names from `fpsim analyze` reports, prefixed with the model's class name (``GPT.h.0.attn``),
are accepted too. A module type (``torch.nn.LayerNorm``) stands for every module of that type.

`from_report` reads a saved report.json (schema ``fpsim.analyze.report/2``, see
docs/analyzer.md) without importing fpsim.analyze: the entries whose verdict is ``fp32`` for a
format, and the recommended loss scale.
"""

from __future__ import annotations

import dataclasses
import json
import os

from ..trace import OUTSIDE

REPORT_SCHEMA = "fpsim.analyze.report/"


@dataclasses.dataclass
class Selection:
    """Module names are those of model.named_modules() ("" for the model); op keeps are keyed by
    aten op name, with the module names op-level observation gives (the model by its label)."""

    kept_modules: set = dataclasses.field(default_factory=set)
    kept_ops: dict = dataclasses.field(default_factory=dict)
    layers: set | None = None
    not_fp8: set = dataclasses.field(default_factory=set)     # modules run in the base format, not in FP8

    def runs_fp8(self, name: str) -> bool:
        """Whether an FP8 recipe runs linear layer `name` in FP8: emulated, not kept, not excluded."""
        return (self.layers is None or any(_within(name, layer) for layer in self.layers)) \
            and not any(_within(name, other) for other in self.kept_modules | self.not_fp8)

    def runs_low(self, name: str) -> bool:
        """Whether module `name` runs in the low format: as the innermost kept module or emulated
        layer around it says (kept, when a module is both), else as the model does (low unless
        `layers` is given); the forward hooks nest the same way."""
        around = [(len(outer), outer in self.kept_modules) for outer in self.kept_modules | (self.layers or set())
                  if _within(name, outer)]
        if not around:
            return self.layers is None
        innermost = max(depth for depth, _ in around)
        return not any(kept for depth, kept in around if depth == innermost)


def _within(name: str, outer: str) -> bool:
    return outer == "" or name == outer or name.startswith(outer + ".")


class Names:
    """Resolves user and report names against one model."""

    def __init__(self, model):
        self.model = model
        self.label = type(model).__name__
        self.modules = dict(model.named_modules())

    def module(self, name: str, what: str) -> str:
        """The named_modules() name of a module named `name` (watch or analyze style)."""
        if name == self.label:
            return ""
        if name.startswith(self.label + ".") and name[len(self.label) + 1:] in self.modules:
            return name[len(self.label) + 1:]
        if name in self.modules and name != "":
            return name
        known = ", ".join([self.label] + [n for n in self.modules if n][:12])
        raise ValueError(f"{what}: {name!r} is no module of {self.label}; its modules: {known}"
                         f"{', ...' if len(self.modules) > 13 else ''}")

    def is_module(self, name: str) -> bool:
        """Whether `name` names a module (watch or analyze style): such a name is the module's even where it
        holds a colon (a ModuleDict key "enc:0"), before any reading as ``Module:op``."""
        return name == self.label or (name != "" and name in self.modules) or \
            (name.startswith(self.label + ".") and name[len(self.label) + 1:] in self.modules)

    def of_type(self, cls) -> list:
        return [n for n, m in self.modules.items() if isinstance(m, cls)]

    def op_site(self, name: str, what: str) -> tuple:
        """(module name as op-level observation gives it, aten op) of ``Module:op``."""
        import torch

        module, _, op = name.rpartition(":")
        if not module or not op:
            raise ValueError(f"{what}: {name!r} is not a module name or Module:op")
        if getattr(torch.ops.aten, op, None) is None:
            raise ValueError(f"{what}: {op!r} in {name!r} is not an aten op (names as fpsim.watch reports them: "
                             f"mul, _softmax, addmm, ...)")
        if module == OUTSIDE:
            return OUTSIDE, op
        qualified = self.module(module, what)
        return (qualified or self.label), op

    def select(self, entries, what: str, selection: Selection, into: str) -> None:
        """Add `entries` (names, Module:op names, module types) to `selection` (its `into` set)."""
        if isinstance(entries, (str, type)):
            entries = [entries]
        try:
            entries = list(entries)
        except TypeError:
            raise TypeError(f"{what} must be a list of module names, Module:op names or module types, "
                            f"got {type(entries).__name__}") from None
        target = getattr(selection, into)
        for entry in entries:
            if isinstance(entry, type):
                matched = self.of_type(entry)
                if not matched:
                    raise ValueError(f"{what}: {self.label} has no module of type {entry.__name__}")
                target.update(matched)
            elif isinstance(entry, str) and ":" in entry and not self.is_module(entry):
                if into != "kept_modules":
                    raise ValueError(f"{what} takes modules, not ops: {entry!r}")
                module, op = self.op_site(entry, what)
                selection.kept_ops.setdefault(op, set()).add(module)
            elif isinstance(entry, str):
                target.add(self.module(entry, what))
            else:
                raise TypeError(f"{what} entries must be module names, Module:op names or module types, "
                                f"got {type(entry).__name__} {entry!r}")


@dataclasses.dataclass(frozen=True)
class ReportAdvice:
    """What a report recommends for one format: entries to keep in FP32, the loss scale (or None)."""

    fp32: tuple
    loss_scale: float | None


def read_report(path, fmt: str) -> ReportAdvice:
    """The fp32 entries and the recommended loss scale for `fmt` in a saved report (a report.json
    file, or the folder holding one)."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"from_report must be a path to report.json or its folder, got {type(path).__name__}")
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, "report.json")
    try:
        with open(path, encoding="utf-8") as f:
            report = json.load(f)
    except OSError as err:
        raise ValueError(f"from_report: cannot read {path!r}: {err.strerror or err}") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"from_report: {path!r} is not JSON: {err}") from None
    schema = report.get("schema", "") if isinstance(report, dict) else ""
    if not isinstance(schema, str) or not schema.startswith(REPORT_SCHEMA):
        raise ValueError(f"from_report: {path!r} is not an fpsim report (schema {schema!r}; expected "
                         f"{REPORT_SCHEMA}N)")
    formats = [f.get("name") for f in report.get("formats", [])]
    if fmt not in formats:
        raise ValueError(f"from_report: the report has no verdicts for {fmt}; it judged {', '.join(formats)}")
    fp32 = tuple(entry["name"] for entry in report.get("layers", [])
                 if entry.get("verdicts", {}).get(fmt) == "fp32")
    scale = report.get("loss_scale", {}).get(fmt, {}).get("recommended")
    return ReportAdvice(fp32, None if scale in (None, "inf", "nan") else float(scale))
