"""fpsim's LightningCallback on a small regression model: python docs/examples/lightning_callback.py"""

import lightning
import torch

from fpsim.integrations import LightningCallback


class Regressor(lightning.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


torch.manual_seed(0)
x = torch.randn(512, 8)
data = torch.utils.data.TensorDataset(x, 1e-3 * x.sum(dim=1, keepdim=True))   # small targets: small gradients
callback = LightningCallback(out="fpsim-report-lightning", formats=("fp16", "bf16", "e4m3"),
                             tensorboard="runs/fpsim", tensorboard_every=20)
trainer = lightning.Trainer(max_steps=100, accelerator="cpu", logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False, callbacks=[callback])
trainer.fit(Regressor(), torch.utils.data.DataLoader(data, batch_size=32, shuffle=True))
print(callback.report.summary_table())
print("files:", ", ".join(sorted(callback.paths)))
