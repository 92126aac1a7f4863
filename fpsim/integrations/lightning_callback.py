"""`LightningCallback`: watch a Lightning fit with fpsim and save the report when it ends, also by an exception.

    trainer = lightning.Trainer(callbacks=[LightningCallback(out="fpsim-report")])
    trainer.fit(model)                  # report.json, report.html, figures in fpsim-report/

Works with the `lightning` package (lightning.pytorch) and, without it, with
`pytorch_lightning`. The watch attaches to the LightningModule when the fit
starts, so layer names are those of `model.named_modules()`.
"""

from __future__ import annotations

from .observation import ObservingCallback

try:
    from lightning.pytorch import Callback
except ImportError:  # the older standalone package
    from pytorch_lightning import Callback


class LightningCallback(ObservingCallback, Callback):
    """Run fpsim's analyzer over `trainer.fit` and write the report into `out` when the fit ends.

    formats and every other keyword (kinds, modules, ops, every, ...) are
    those of `fpsim.watch`. tensorboard: a folder to write TensorBoard events
    into, every `tensorboard_every` optimizer steps and at the end. After the
    fit, `.report` is the Report and `.paths` the files written.
    """

    def on_fit_start(self, trainer, pl_module) -> None:
        self.observation.start(pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.observation.step(trainer.global_step)

    def on_fit_end(self, trainer, pl_module) -> None:
        self.observation.finish()

    def on_exception(self, trainer, pl_module, exception) -> None:
        self.observation.finish(exception)
