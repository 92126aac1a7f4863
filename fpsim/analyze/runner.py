"""`fpsim analyze train.py -- ARGS`: observe an unmodified training script.

The script runs in this process (runpy, with sys.argv and sys.path[0] set as
`python train.py ARGS` would), under a watch attached through torch's global
hooks: every module that runs a forward pass (named after its outermost
module: 'Net.layer1.0'), every op, and every torch.optim optimizer. Everything
fpsim can check is checked when the `ScriptRun` is made, before the script
starts (so that an error there is a usage error, never the script's); the
report is written when the script ends, however it ends (SIGTERM included);
with `steps`, the run is stopped (StopRun, raised out of optimizer.step) once
that many steps are done.
"""

from __future__ import annotations

import os
import runpy

from .._script import as_main, check_out
from .hooks import DEFAULT_FORMATS, StopRun, Watcher
from .signals import terminate_as_exception


class ScriptRun:
    """One observed run of a script: made (and checked) first, then `run()`; exceptions of run() are the script's."""

    def __init__(self, script, args=(), *, out="fpsim-report", steps: int | None = None, every: int = 1,
                 formats=DEFAULT_FORMATS, modules=None, on_step=None, **options):
        script = os.fspath(script)
        if not os.path.isfile(script):
            raise FileNotFoundError(f"no training script at {script!r}")
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
            raise ValueError(f"steps must be a positive int or None, got {steps!r}")
        self.script, self.args, self.steps, self.out = script, [str(a) for a in args], steps, check_out(out)
        self._on_step = on_step
        self.watcher = Watcher(None, formats, every=every, modules=modules, on_step=self._after_step,
                               out=self.out, **options)

    def _after_step(self, step: int) -> None:
        if self._on_step is not None:
            self._on_step(step)
        if self.steps is not None and step >= self.steps:
            raise StopRun(f"stopped after {step} steps")

    @property
    def written(self) -> dict:
        """{file name: path} of the report files written (empty when none could be)."""
        return self.watcher.saved_paths

    def run(self):
        """Run the script; (report, {file: path}). The script's exceptions (and KeyboardInterrupt, Terminated)
        propagate after the report has been written; StopRun and sys.exit(0) end the run normally."""
        try:
            with as_main(self.script, self.args), terminate_as_exception(), self.watcher:
                runpy.run_path(os.path.abspath(self.script), run_name="__main__")
        except StopRun:
            pass
        except SystemExit as exit_:
            if exit_.code not in (None, 0):
                raise
        return self.watcher.last_report, self.watcher.saved_paths


def run_script(script, args=(), **options):
    """Run `script` with `args` under observation; (report, {file: path}). Options as ScriptRun."""
    return ScriptRun(script, args, **options).run()
