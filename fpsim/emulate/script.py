"""An unmodified training script under emulation (`fpsim analyze --emulate RECIPE train.py -- ARGS`).

The script runs in this process, as `python train.py ARGS` would run it (runpy, with sys.argv
and sys.path[0] set so). Its model is the first module whose forward pass runs with gradients
enabled outside any other module's forward pass: the emulation starts there (from a global
forward pre-hook, inside that first call) and ends with the script. Its submodules' hooks (keep=,
FP8 layers, from_report=) apply from that first call on; the model module's own from its
second call (torch has read the model's hooks for the call already). Other models the script
makes run under the global parts only (autocast, FP32 compute, the loss scale).

    run = ScriptEmulation("train.py", ["--lr", "0.1"], "fp16", steps=50, loss_scale=2**12).run()
    run.losses
"""

from __future__ import annotations

import os
import runpy
import sys

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from .._script import as_main
from . import recipes
from .runs import Run
from .selection import read_report
from .session import emulate


class StopScript(BaseException):
    """Raised out of an optimizer step to end an emulated script after `steps` steps (a BaseException,
    so that the script's own `except Exception` does not swallow it)."""


class ScriptEmulation:
    """One emulated run of a script: made (and its options checked) first, then `run()`."""

    def __init__(self, script, args=(), recipe="fp32", *, steps: int | None = None, seed: int | None = 0,
                 **options):
        script = os.fspath(script)
        if not os.path.isfile(script):
            raise FileNotFoundError(f"no training script at {script!r}")
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
            raise ValueError(f"steps must be a positive int or None, got {steps!r}")
        resolved = recipes.resolve(recipe)              # ValueError/TypeError now, not mid-script
        self.name = recipe_name(recipe)
        if options.get("from_report") is not None:
            _check_report(options["from_report"], resolved)
        self.script, self.args, self.steps, self.seed = script, [str(a) for a in args], steps, seed
        self.recipe, self.options = recipe, options
        self.emulation = None

    def run(self) -> Run:
        """Run the script; its losses (one per backward pass), steps and notes. The script's exceptions
        propagate once the emulation has ended; stopping after `steps` and sys.exit(0) end it normally."""
        self._depth, self._stop_hook, self.emulation = 0, None, None
        with as_main(self.script, self.args):
            hooks = (torch.nn.modules.module.register_module_forward_pre_hook(self._enter_module),
                     torch.nn.modules.module.register_module_forward_hook(self._leave_module, always_call=True))
            if self.seed is not None:
                torch.manual_seed(self.seed)
            try:
                runpy.run_path(os.path.abspath(self.script), run_name="__main__")
            except StopScript:
                pass
            except SystemExit as exit_:
                if exit_.code not in (None, 0):
                    raise
            finally:
                for handle in hooks:
                    handle.remove()
                if self._stop_hook is not None:
                    self._stop_hook.remove()
                if self.emulation is not None:
                    self.emulation.__exit__(*sys.exc_info())
        return self.result()

    def result(self) -> Run:
        """What the run produced: all of it once run() returned, what came before the exception when it raised."""
        em = self.emulation
        if em is None:
            return Run(self.name, [], 0, ["no module ran a forward pass with gradients enabled: nothing was emulated"])
        return Run(em.name, list(em.losses), em.steps, list(em.notes))

    # -------------------------------------------------------------- hooks
    def _enter_module(self, module, args):
        self._depth += 1
        if self._depth == 1 and self.emulation is None and torch.is_grad_enabled():
            self._start(module)

    def _leave_module(self, module, args, output):
        self._depth -= 1

    def _start(self, module):
        """The first outermost forward pass with gradients: start the emulation on that module."""
        emulation = emulate(module, self.recipe, **self.options)
        emulation.__enter__()
        self.emulation = emulation
        if self.steps is not None:
            self._stop_hook = register_optimizer_step_post_hook(self._after_step)

    def _after_step(self, optimizer, args, kwargs):
        if self.emulation.steps >= self.steps:
            raise StopScript(f"stopped after {self.emulation.steps} steps")


def recipe_name(recipe) -> str:
    """The name a recipe (a name or object) runs under: "fp32" for no emulation."""
    recipe = recipes.resolve(recipe)
    return "fp32" if recipe is None else recipe.name


def formats_judged(recipe) -> tuple:
    """The formats whose verdicts from_report applies for `recipe` (a name or object): its autocast
    format, and for FP8 its element formats."""
    recipe = recipes.resolve(recipe)
    if recipe is None:
        return ()
    formats = [recipe.low] if recipe.low is not None else []
    if isinstance(recipe, recipes.FP8Recipe):
        formats += list(recipe.element_formats)
    return tuple(dict.fromkeys(formats))


def _check_report(path, recipe) -> None:
    """The report must judge the formats the recipe runs in (read_report's ValueError otherwise)."""
    if recipe is None:
        raise ValueError("from_report needs a recipe other than fp32")
    for fmt in formats_judged(recipe):
        read_report(path, fmt)
