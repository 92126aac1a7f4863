"""Loss curves of a script under emulation, beside its FP32 run: `fpsim analyze --emulate` and `--confirm`.

    emulate_script(script, args, "fp16", out)     # one run: out/emulation.json, out/emulation_losses.png
    confirm(script, args, "fp16", out)            # after the analyzer wrote out/report.json: FP32, the
                                                  # recipe unprotected, the recipe as the report recommends;
                                                  # report.json gains its `emulation` section

The `emulation` section (report.json, or emulation.json on its own) is
{"recipe", "steps", "seed", "figure", "runs": [{"label", "recipe", "options", "loss_scale",
"kept_modules", "fp8_layers", "steps", "losses", "notes", "error"}]}: one loss per backward pass,
non-finite losses written "nan", "inf", "-inf" as the report writes them. Every run starts
from torch.manual_seed(seed), so a script that does not seed itself still starts each run
from the same weights.

A run whose script raises keeps the losses before the exception, its `error` says what was
raised (else null), and the other runs go on; once the section and then the figure are
written, RunsFailed carries the exceptions (the CLI prints them and exits 1).
"""

from __future__ import annotations

import io
import json
import math
import os
import tempfile

from ..formats import format as get_format
from .script import ScriptEmulation, formats_judged, recipe_name

FIGURE = "emulation_losses.png"
SEED = 0
CONFIRM_RECIPE = "fp16"
"""The recipe --confirm runs without --emulate: the one that most needs the analyzer's protection."""


class RunsFailed(Exception):
    """The script raised in some runs; `section` (written) holds every run, `errors` is [(label, exception)]."""

    def __init__(self, section: dict, errors: list):
        self.section, self.errors = section, errors
        super().__init__("; ".join(f"{label}: {type(err).__name__}: {err}" for label, err in errors))


def check_confirm(script, args, recipe, confirming: bool, formats) -> None:
    """Before anything runs: the script exists, the recipe is known and, for --confirm, the analyzer
    judges the formats whose verdicts the recommended run applies."""
    recipe = recipe or CONFIRM_RECIPE
    name = ScriptEmulation(script, args, recipe).name     # the script and the recipe checked
    if not confirming:
        return
    if os.environ.get("WORLD_SIZE", "1").strip() not in ("", "1"):
        raise ValueError("--confirm runs the script four times in one process, which a script that sets up "
                         "torch.distributed once cannot take: run it as one process (without torchrun), or "
                         "use --emulate RECIPE under torchrun")
    needed = formats_judged(recipe)
    if not needed:
        raise ValueError(f"--confirm needs a low-precision recipe to confirm, not {name}")
    judged = {get_format(f).name for f in formats}
    missing = [f for f in needed if f not in judged]
    if missing:
        raise ValueError(f"--confirm with {name} applies the report's verdicts for {', '.join(needed)}; "
                         f"--formats {','.join(formats)} lacks {', '.join(missing)}")


def emulate_script(script, args, recipe, out, *, steps=None, on_run=None) -> dict:
    """Run the script once under `recipe`; write out/emulation.json and the figure; the section."""
    return _written(*_section(script, args, [("", recipe, {})], steps, on_run), out, None)


def confirm(script, args, recipe, out, *, steps=None, on_run=None) -> dict:
    """The script in FP32, under `recipe` unprotected, and under `recipe` with from_report=out/report.json;
    the section, also written into out/report.json, with the figure beside it."""
    report = os.path.join(os.path.abspath(os.fspath(out)), "report.json")   # read from inside the script,
    # which may have changed directory
    name = recipe_name(recipe)
    runs = [("fp32", "fp32", {}), (f"{name}, unprotected", recipe, {}),
            (f"{name}, as the report recommends", recipe, {"from_report": report})]
    return _written(*_section(script, args, runs, steps, on_run), out, report)


def table(section: dict) -> str:
    """A few lines for the terminal: each run's steps, first and last loss, and non-finite losses."""
    lines = [f"{'run':40s} {'steps':>5s} {'first loss':>11s} {'last loss':>11s} {'NaN/Inf':>7s}"]
    for run in section["runs"]:
        losses = [float(x) for x in run["losses"]]
        bad = sum(not math.isfinite(x) for x in losses)
        first, last = (f"{losses[0]:11.6g}", f"{losses[-1]:11.6g}") if losses else ("-".rjust(11),) * 2
        raised = f"  raised {run['error'].split(':')[0]}" if run.get("error") else ""
        lines.append(f"{run['label'][:40]:40s} {run['steps']:5d} {first} {last} {bad:7d}{raised}")
    return "\n".join(lines)


def _section(script, args, runs, steps, on_run) -> tuple:
    """(the section, [(label, exception)] of the runs whose script raised)."""
    made = [(label, ScriptEmulation(script, args, spec, steps=steps, seed=SEED, **options), options)
            for label, spec, options in runs]                   # every option checked before the first run
    out, errors = [], []
    for label, emulation, options in made:
        label = label or emulation.name
        if on_run is not None:
            on_run(label)
        error = None
        try:
            run = emulation.run()
        except (Exception, SystemExit) as err:   # the script's own (or its exit status): its losses so far are
            # kept, and the other runs go on
            errors.append((label, err))
            run, error = emulation.result(), f"{type(err).__name__}: {err}"
        summary = emulation.emulation.summary() if emulation.emulation is not None else {}
        out.append({"label": label, "recipe": run.recipe,
                    "options": {k: os.path.basename(v) if k == "from_report" else v for k, v in options.items()},
                    "loss_scale": summary.get("loss_scale"), "kept_modules": summary.get("kept_modules", []),
                    "fp8_layers": sorted(summary.get("fp8_layers", {})), "steps": run.steps,
                    "losses": [_jsonable(x) for x in run.losses], "notes": run.notes, "error": error})
    name = made[-1][1].name
    return {"recipe": name, "steps": steps, "seed": SEED, "figure": FIGURE, "runs": out}, errors


def writes() -> bool:
    """Whether this process writes the runs' files: rank 0 alone under a launcher that starts one process per
    rank (torchrun, accelerate and DeepSpeed set RANK); every rank runs the script, its collectives need them."""
    return os.environ.get("RANK", "0").strip() in ("", "0")


def _written(section: dict, errors: list, out, report) -> dict:
    """Write the section (rank 0: `writes`); then raise RunsFailed if some run raised, else return it."""
    if writes():
        _write(section, out, report)
    if errors:
        raise RunsFailed(section, errors)
    return section


def _write(section: dict, out, report) -> None:
    """The section, into report.json (`emulation`) or emulation.json; then the figure."""
    from ..plots import loss_curves

    out = os.fspath(out)
    os.makedirs(out, exist_ok=True)
    if report is None:
        document, path = {"schema": "fpsim.emulate.runs/1", **section}, os.path.join(out, "emulation.json")
    else:
        with open(report, encoding="utf-8") as f:
            document = json.load(f)
        document["emulation"], path = section, report
    _atomic_write(path, json.dumps(document, indent=1, allow_nan=False).encode())
    figure = loss_curves({run["label"]: [float(x) for x in run["losses"]] for run in section["runs"]},
                         title=f"Loss curves under emulation: {section['recipe']}")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    _atomic_write(os.path.join(out, FIGURE), buffer.getvalue())


def _jsonable(x: float):
    """A loss for JSON: non-finite ones as the strings float() reads back."""
    return x if math.isfinite(x) else ("nan" if math.isnan(x) else ("inf" if x > 0 else "-inf"))


def _atomic_write(path: str, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
