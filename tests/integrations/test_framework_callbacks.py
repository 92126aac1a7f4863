"""fpsim.integrations' callbacks on real training stacks: Lightning's Trainer and transformers' Trainer.

Tiny models built from code or configs with random weights (nothing is downloaded), a few steps each.
Sources of truth: the frameworks' own step counters (trainer.global_step, state.global_step), the module
names the models really have (named_modules), an unwatched run of the same seed (same final weights),
and the exception the run raised.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

transformers = pytest.importorskip("transformers")
lightning = pytest.importorskip("lightning")

from framework_helpers import Tokens, tiny_gpt2  # noqa: E402

from fpsim.integrations import LightningCallback, TrainerCallback  # noqa: E402


def test_importing_the_integrations_loads_no_framework():
    code = ("import sys, fpsim.integrations; "
            "print([m for m in ('torch', 'lightning', 'transformers', 'tensorboard') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


class LitRegressor(lightning.LightningModule):
    def __init__(self, fail_at: int | None = None):
        super().__init__()
        self.fail_at = fail_at
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        if batch_idx == self.fail_at:
            raise RuntimeError(f"boom at batch {batch_idx}")
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def lightning_fit(model, callbacks=(), **options):
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g))
    options = {"max_steps": 5, **options}
    trainer = lightning.Trainer(accelerator="cpu", devices=1, logger=False, callbacks=list(callbacks),
                                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                                **options)
    trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=8))
    return trainer


def test_lightning_callback_writes_the_report_of_the_fit(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    torch.manual_seed(0)
    plain = LitRegressor()
    lightning_fit(plain)
    torch.manual_seed(0)
    model = LitRegressor()
    callback = LightningCallback(out=tmp_path / "report", formats=("fp16", "bf16"), tensorboard=tmp_path / "tb",
                                 tensorboard_every=2)
    trainer = lightning_fit(model, [callback])
    for a, b in zip(plain.parameters(), model.parameters()):
        assert torch.equal(a, b)                                   # observation changed nothing
    data = json.loads((tmp_path / "report" / "report.json").read_text())
    assert data["run"]["status"] == "completed" and data["run"]["steps"] == trainer.global_step == 5
    assert data["run"]["model"] == "LitRegressor"
    linear = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    entries = {e["name"]: e for e in data["layers"]}
    assert linear == {"net.0", "net.2"} and linear <= set(entries)
    assert entries["net.0"]["tensors"]["weight_grad"]["samples"] == 2 * 5      # weight and bias, every step
    assert callback.report.run["steps"] == 5 and callback.paths["report.json"].endswith("report.json")
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [e.step for e in events.Scalars("verdict/fp16/net.0")] == [2, 4, 5]   # every 2 steps, then the end


def test_tensorboard_events_come_once_per_optimizer_step_under_gradient_accumulation(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    torch.manual_seed(0)
    callback = LightningCallback(out=None, formats=("fp16",), tensorboard=tmp_path, tensorboard_every=2)
    trainer = lightning_fit(LitRegressor(), [callback], max_steps=4, accumulate_grad_batches=2)
    assert trainer.global_step == 4 and callback.report.run["steps"] == 4 and not list(tmp_path.glob("*.json"))
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert [e.step for e in events.Scalars("verdict/fp16/net.0")] == [2, 4]


def test_lightning_callback_writes_the_report_when_the_fit_raises(tmp_path):
    torch.manual_seed(0)
    callback = LightningCallback(out=tmp_path, formats=("fp16",))
    with pytest.raises(RuntimeError, match="boom at batch 3"):
        lightning_fit(LitRegressor(fail_at=3), [callback])
    run = json.loads((tmp_path / "report.json").read_text())["run"]
    assert run["status"] == "error" and "boom at batch 3" in run["error"] and run["steps"] == 3


def test_callback_options_are_checked_when_it_is_made():
    with pytest.raises(ValueError, match="fp99"):
        LightningCallback(formats=("fp99",))
    with pytest.raises(ValueError, match="tensorboard_every"):
        TrainerCallback(tensorboard="tb", tensorboard_every=0)
    with pytest.raises(TypeError, match="unknown option 'evrey'.*every"):
        LightningCallback(evrey=2)
    with pytest.raises(ValueError, match="every must be a positive int"):        # values too, as watch checks
        LightningCallback(every=0)
    with pytest.raises(ValueError, match="unknown tensor kind 'bogus'"):
        TrainerCallback(kinds=("bogus",))
    with pytest.raises(TypeError, match="ops must be True or False"):
        LightningCallback(ops="yes")


def test_tensorboard_steps_of_a_resumed_fit_are_the_trainers(tmp_path):
    # a fit resumed at Lightning's step 4 runs to 8: its events at steps 6 and 8 (the trainer's global_step,
    # as docs/integrations.md says), the last one not written again under the watch's own count (4)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    torch.manual_seed(0)
    model = LitRegressor()
    first = lightning_fit(model, max_steps=4)
    first.save_checkpoint(tmp_path / "step4.ckpt")
    callback = LightningCallback(out=None, formats=("fp16",), tensorboard=tmp_path / "tb", tensorboard_every=2)
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g))
    trainer = lightning.Trainer(accelerator="cpu", devices=1, logger=False, callbacks=[callback], max_steps=8,
                                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=8), ckpt_path=tmp_path / "step4.ckpt")
    assert trainer.global_step == 8 and callback.report.run["steps"] == 4
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [e.step for e in events.Scalars("verdict/fp16/net.0")] == [6, 8]


def training_args(folder, steps=4, **options):
    return transformers.TrainingArguments(output_dir=str(folder), max_steps=steps, per_device_train_batch_size=4,
                                          learning_rate=1e-3, report_to=[], save_strategy="no",
                                          logging_strategy="no", use_cpu=True, dataloader_num_workers=0, seed=0,
                                          disable_tqdm=True, **options)


def test_trainer_callback_writes_the_report_of_a_tiny_gpt2(tmp_path):
    model = tiny_gpt2()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    callback = TrainerCallback(out=tmp_path / "report", formats=("fp16", "bf16"), tensorboard=tmp_path / "tb",
                               tensorboard_every=2)
    trainer = transformers.Trainer(model=model, args=training_args(tmp_path / "hf"), train_dataset=Tokens(),
                                   callbacks=[callback])
    trainer.train()
    data = json.loads((tmp_path / "report" / "report.json").read_text())
    assert data["run"]["status"] == "completed" and data["run"]["steps"] == trainer.state.global_step == 4
    assert data["run"]["model"] == "GPT2LMHeadModel"
    with_params = {n for n, m in model.named_modules() if n and list(m.parameters(recurse=False))}
    names = {e["name"] for e in data["layers"] if e["entry"] == "module"}
    assert "transformer.h.0.attn.c_attn" in with_params and with_params - {"lm_head"} <= names  # lm_head is wte
    assert (tmp_path / "report" / "report.html").is_file()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [e.step for e in events.Scalars("verdict/bf16/transformer.h.0.attn.c_attn")] == [2, 4]  # 4 once
    assert [e.step for e in events.Tensors("fpsim/summary/text_summary")] == [4]


CRASHING_RUN = """
import sys, torch, transformers
sys.path[:0] = [{tests!r}, {here!r}]
from framework_helpers import Tokens, tiny_gpt2
from test_framework_callbacks import training_args
from fpsim.integrations import TrainerCallback

class Boom(transformers.TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        print("step", state.global_step, flush=True)
        if state.global_step == 2:
            raise RuntimeError("boom after step 2")

torch.set_num_threads(1)
trainer = transformers.Trainer(model=tiny_gpt2(), args=training_args({hf!r}, steps=6), train_dataset=Tokens(),
                               callbacks=[TrainerCallback(out={out!r}, formats=("fp16",)), Boom()])
trainer.train()
"""


def test_trainer_callback_writes_the_report_when_training_raises(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text(textwrap.dedent(CRASHING_RUN.format(tests=os.path.dirname(os.path.dirname(__file__)),
                                                          here=os.path.dirname(__file__), hf=str(tmp_path / "hf"),
                                                          out=str(tmp_path / "report"))))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "boom after step 2" in done.stderr
    steps = [int(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("step ")]
    run = json.loads((tmp_path / "report" / "report.json").read_text())["run"]
    assert run["status"] == "error" and "boom after step 2" in run["error"] and run["steps"] == steps[-1] == 2


def counted(report) -> dict:
    """Every layer's and op's counts and verdicts in a callback's report, and the dtypes its ops ran in."""
    data = report.to_dict()
    return {"layers": {e["name"]: json.dumps(e, sort_keys=True) for e in data["layers"]},
            "ops": {e["name"]: json.dumps(e, sort_keys=True) for e in data["ops"]},
            "precision": data["run"]["precision"]}


def hf_fit(tmp_path, callbacks, **options):
    model = tiny_gpt2()
    args = training_args(tmp_path / "hf", **options)
    transformers.Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=list(callbacks)).train()
    return model


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non_reentrant"])
def test_trainer_callback_counts_a_gradient_checkpointed_gpt2_as_the_same_run_without_checkpointing(tmp_path,
                                                                                                   reentrant):
    # transformers checkpoints each block's forward (its module hooks outside), reentrant by default: the blocks'
    # ops ran without grad and were recomputed inside the checkpoint's own backward call, and were all missing
    plain = TrainerCallback(out=None, formats=("fp16", "bf16"))
    hf_fit(tmp_path, [plain])
    callback = TrainerCallback(out=None, formats=("fp16", "bf16"))
    model = hf_fit(tmp_path, [callback], gradient_checkpointing=True,
                   gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    twin = hf_fit(tmp_path, [], gradient_checkpointing=True,
                  gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    assert counted(callback.report) == counted(plain.report)
    assert "transformer.h.1.mlp.act:pow" in counted(callback.report)["ops"]
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), twin.parameters()))


def test_two_callbacks_in_one_trainer_leave_nothing_of_fpsim_in_torch(tmp_path):
    # each trainer closes its callbacks' watches in the order they were opened; the first one's dispatch mode
    # stayed on torch's stack, and GradScaler kept the wrappers of the first one closed
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    scaler_methods = {name: torch.amp.GradScaler.__dict__[name] for name in ("scale", "unscale_", "step", "update")}
    alone = LightningCallback(out=None, formats=("fp16",))
    torch.manual_seed(0)
    lightning_fit(LitRegressor(), [alone], precision="bf16-mixed")
    first, second = LightningCallback(out=None, formats=("fp16",)), LightningCallback(out=None, formats=("fp16",))
    torch.manual_seed(0)
    lightning_fit(LitRegressor(), [first, second], precision="bf16-mixed")
    assert _get_current_dispatch_mode_stack() == []
    assert {name: torch.amp.GradScaler.__dict__[name] for name in scaler_methods} == scaler_methods
    assert counted(first.report) == counted(second.report) == counted(alone.report)

    hf_alone = TrainerCallback(out=None, formats=("fp16",))
    hf_fit(tmp_path, [hf_alone])
    hf_first, hf_second = TrainerCallback(out=None, formats=("fp16",)), TrainerCallback(out=None, formats=("fp16",))
    hf_fit(tmp_path, [hf_first, hf_second])
    assert _get_current_dispatch_mode_stack() == []
    assert {name: torch.amp.GradScaler.__dict__[name] for name in scaler_methods} == scaler_methods
    assert counted(hf_first.report) == counted(hf_second.report) == counted(hf_alone.report)
