"""One fit observed for a framework callback: the watch, periodic TensorBoard events, the report at the end.

A callback makes a `FitObservation` when it is created (every option is
checked then, before training), calls `start(model)` when the fit begins,
`step(global_step)` after each optimizer step and `finish(exception)` once
when the fit ends, however it ends. Like `fpsim.watch`, nothing here may
break or alter the run: a failure while writing TensorBoard events or the
report is warned about once and observation (or that export) stops.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import warnings

from ..analyze.hooks import DEFAULT_FORMATS, Watcher, run_status

_NOT_OPTIONS = ("self", "model", "formats", "out")
WATCH_OPTIONS = tuple(name for name in inspect.signature(Watcher.__init__).parameters if name not in _NOT_OPTIONS)
"""The keyword options of fpsim.watch a callback passes on."""


class FitObservation:
    """What the callbacks share: options checked at creation, one Watcher per fit, the report at its end."""

    def __init__(self, out="fpsim-report", formats=DEFAULT_FORMATS, *, tensorboard=None, tensorboard_every: int = 50,
                 **watch_options):
        if out is not None and not isinstance(out, (str, os.PathLike)):
            raise TypeError(f"out must be a folder path or None (no files), got {type(out).__name__} {out!r}")
        if tensorboard is not None and not isinstance(tensorboard, (str, os.PathLike)):
            raise TypeError(f"tensorboard must be a folder path or None, got {type(tensorboard).__name__} "
                            f"{tensorboard!r}")
        if isinstance(tensorboard_every, bool) or not isinstance(tensorboard_every, int) or tensorboard_every < 1:
            raise ValueError(f"tensorboard_every must be a positive int (optimizer steps), got {tensorboard_every!r}")
        unknown = [k for k in watch_options if k not in WATCH_OPTIONS]
        if unknown:
            raise TypeError(f"unknown option {unknown[0]!r}; the options of fpsim.watch are: {', '.join(WATCH_OPTIONS)}")
        if tensorboard is not None and importlib.util.find_spec("tensorboard") is None:
            raise ImportError("tensorboard= needs the tensorboard package: pip install tensorboard")
        Watcher(None, formats, **watch_options)     # every value checked now, not when the fit starts (a watch
                                                    # made is attached to nothing: it installs no hook)
        self.out, self.formats, self.tensorboard = out, formats, tensorboard
        self.tensorboard_every, self.watch_options = tensorboard_every, watch_options
        self.watcher = None
        self.report = None
        self.paths: dict = {}
        self._writer = None
        self._finished = True
        self._exported_step = None
        self._global_step = None                    # the framework's optimizer step last seen by `step`

    def start(self, model) -> None:
        """Attach a new watch to `model` (a fit starts)."""
        self.finish_quietly()
        self.watcher = Watcher(model, self.formats, **self.watch_options).attach()
        self.report, self.paths, self._finished, self._exported_step, self._global_step = None, {}, False, None, None
        if self.tensorboard is not None:
            from ..analyze.tensorboard import summary_writer

            self._writer = summary_writer(self.tensorboard)

    def step(self, global_step: int) -> None:
        """After a batch: TensorBoard events every `tensorboard_every` optimizer steps (once per step, also
        when gradient accumulation calls this for several batches of one step)."""
        self._global_step = global_step
        if self._writer is None or self._finished or not global_step or global_step % self.tensorboard_every \
                or global_step == self._exported_step:
            return
        try:
            report = self.watcher.report()
        except Exception as err:
            warnings.warn(f"fpsim: TensorBoard export stopped: {type(err).__name__}: {err}", RuntimeWarning)
            self._close_writer()
            return
        self._export(report, global_step, text=False)
        self._exported_step = global_step

    def finish(self, exception: BaseException | None = None) -> dict:
        """The fit ended (with `exception`, or normally): detach, write the report (and the last events) once."""
        if self._finished or self.watcher is None:
            return self.paths
        self._finished = True
        w = self.watcher
        w.close()
        w.status, w.error = run_status(None if exception is None else type(exception), exception)
        if self.out is not None:
            self.paths = w.write_report(self.out)
            self.report = w.last_report
        else:
            try:
                self.report = w.report()
            except Exception as err:
                warnings.warn(f"fpsim: could not build the report: {type(err).__name__}: {err}", RuntimeWarning)
        if self._writer is not None:
            if self.report is not None:   # at the framework's step (a resumed fit's, with several optimizers)
                steps = self._global_step if self._global_step is not None else int(self.report.run.get("steps", 0))
                self._export(self.report, steps, text=True, values=steps != self._exported_step)
            self._close_writer()
        return self.paths

    def finish_quietly(self) -> None:
        """End a fit that never said it ended (a second fit starting, the process exiting)."""
        if not self._finished:
            self.finish(RuntimeError("the fit ended without its end being signalled"))

    def _export(self, report, step: int, text: bool, values: bool = True) -> None:
        if report.rank != 0 or self._writer is None:
            return
        from ..analyze.tensorboard import write_report

        try:
            write_report(report, self._writer, step, text=text, values=values)
        except Exception as err:  # TensorBoard is not worth the run
            warnings.warn(f"fpsim: TensorBoard export stopped: {type(err).__name__}: {err}", RuntimeWarning)
            self._close_writer()

    def _close_writer(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.close()
            except Exception as err:
                warnings.warn(f"fpsim: closing the TensorBoard writer failed: {err}", RuntimeWarning)


class ObservingCallback:
    """The part of both callbacks that is not the framework's: their options, `.report` and `.paths`."""

    def __init__(self, out="fpsim-report", formats=DEFAULT_FORMATS, *, tensorboard=None,
                 tensorboard_every: int = 50, **watch_options):
        super().__init__()
        self.observation = FitObservation(out, formats, tensorboard=tensorboard, tensorboard_every=tensorboard_every,
                                          **watch_options)

    @property
    def report(self):
        return self.observation.report

    @property
    def paths(self) -> dict:
        return self.observation.paths
