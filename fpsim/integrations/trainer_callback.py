"""`TrainerCallback`: watch a transformers Trainer run with fpsim and save the report when it ends.

    trainer = transformers.Trainer(model=model, args=args, train_dataset=data,
                                   callbacks=[TrainerCallback(out="fpsim-report")])
    trainer.train()                     # report.json, report.html, figures in fpsim-report/

transformers has no callback event for a run that raises: when `train()`
raises and the process then exits, the report is written at exit (atexit)
with the status of the exception Python reports. In a notebook, or where the
exception is caught, call `callback.finish(err)` to write it at once.
"""

from __future__ import annotations

import atexit
import sys

import transformers

from .observation import ObservingCallback


class TrainerCallback(ObservingCallback, transformers.TrainerCallback):
    """Run fpsim's analyzer over `Trainer.train()` and write the report into `out` when training ends.

    formats and every other keyword (kinds, modules, ops, every, ...) are
    those of `fpsim.watch`. tensorboard: a folder to write TensorBoard events
    into, every `tensorboard_every` optimizer steps and at the end. After
    training, `.report` is the Report and `.paths` the files written.
    """

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is None:
            raise ValueError("fpsim TrainerCallback: the Trainer passed no model to on_train_begin")
        self.observation.start(model)
        atexit.register(self._at_exit)

    def on_step_end(self, args, state, control, **kwargs):
        self.observation.step(state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        self.finish()

    def finish(self, exception: BaseException | None = None) -> dict:
        """End the observation (normally, or with the exception training raised) and write the report."""
        atexit.unregister(self._at_exit)
        return self.observation.finish(exception)

    def _at_exit(self) -> None:
        """The process exits while training was observed: it raised (sys.last_value) or exited."""
        exception = getattr(sys, "last_value", None)
        self.observation.finish(exception if exception is not None else
                                SystemExit("the process exited before training ended"))
