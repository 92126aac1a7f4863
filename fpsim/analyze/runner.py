"""`fpsim analyze train.py -- ARGS`: observe an unmodified training script.

The script runs in this process (runpy, with sys.argv and sys.path[0] set as
`python train.py ARGS` would), under a watch attached through torch's global
hooks: every module that runs a forward pass (named after its outermost
module: 'Net.layer1.0') and every torch.optim optimizer. The report is
written when the script ends, however it ends; with `steps`, the run is
stopped (StopRun, raised out of optimizer.step) once that many steps are done.
"""

from __future__ import annotations

import os
import runpy
import sys

from .hooks import DEFAULT_FORMATS, StopRun, Watcher


def run_script(script, args=(), *, out="fpsim-report", steps: int | None = None, every: int = 1,
               formats=DEFAULT_FORMATS, modules=None, on_step=None, **options):
    """Run `script` with `args` under observation; (report, {file: path}).

    Exceptions of the script (and KeyboardInterrupt) propagate after the
    report has been written; StopRun (the `steps` limit) and sys.exit(0) end
    the run normally.
    """
    script = os.fspath(script)
    if not os.path.isfile(script):
        raise FileNotFoundError(f"no training script at {script!r}")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise ValueError(f"steps must be a positive int or None, got {steps!r}")
    args = [str(a) for a in args]

    def after_step(step: int) -> None:
        if on_step is not None:
            on_step(step)
        if steps is not None and step >= steps:
            raise StopRun(f"stopped after {step} steps")

    watcher = Watcher(None, formats, every=every, modules=modules, on_step=after_step, out=out, **options)
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        with watcher:
            runpy.run_path(script, run_name="__main__")
    except StopRun:
        pass
    except SystemExit as exit_:
        if exit_.code not in (None, 0):
            raise
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path
    return watcher.last_report, watcher.saved_paths
