"""The analyzer on real third-party training stacks: transformers' Trainer and Lightning's Trainer.

Tiny models built from configs with random weights (nothing is downloaded), a few steps each. Sources of
truth: the frameworks' own step counts and parameters (an unwatched run of the same seed ends with the
same weights), and the module names the frameworks' models really have.
"""

from __future__ import annotations

import pytest
import torch

import fpsim

transformers = pytest.importorskip("transformers")
lightning = pytest.importorskip("lightning")

from framework_helpers import Tokens, tiny_gpt2  # noqa: E402


def hf_train(model, folder, watched: bool, shadow_every=None, **options):
    args = transformers.TrainingArguments(output_dir=str(folder), max_steps=4, per_device_train_batch_size=4,
                                          learning_rate=1e-3, report_to=[], save_strategy="no", logging_strategy="no",
                                          use_cpu=True, dataloader_num_workers=0, seed=0, disable_tqdm=True, **options)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokens())
    if not watched:
        trainer.train()
        return None
    with fpsim.watch(model, formats=("fp16", "bf16"), shadow_every=shadow_every) as w:
        trainer.train()
    return w.report()


def test_transformers_trainer_with_a_tiny_gpt2(tmp_path):
    plain = tiny_gpt2()
    hf_train(plain, tmp_path / "a", watched=False)
    model = tiny_gpt2()
    report = hf_train(model, tmp_path / "b", watched=True)
    for a, b in zip(plain.parameters(), model.parameters()):
        assert torch.equal(a, b)                                  # observation changed nothing
    assert report.run["steps"] == 4
    names = [layer.name for layer in report.layers if not layer.is_op]
    assert "transformer.h.0.attn.c_attn" in names and "transformer.wte" in names
    ops = {op.name for op in report.ops}
    assert any(name.startswith("transformer.h.0.attn:") for name in ops)   # ops inside the attention
    tied = [note for note in report.run["notes"] if "tied weights" in note]   # lm_head is wte
    assert tied and tied[0].endswith("counted once, under transformer.wte")
    assert report.layer("transformer.wte").tensors["weight"].samples > 0     # where the counts really are
    assert report.layer("transformer.h.1.mlp.c_fc").tensors["weight_grad"].samples == 8   # weight, bias x 4


def _expected_tie_notes(model) -> set:
    """From the model's own structure: for each module that first holds a parameter other modules hold too,
    (the modules sharing its parameters, the owner)."""
    owners, shared = {}, {}
    for name, module in model.named_modules():
        for p in module.parameters(recurse=False):
            owner = owners.setdefault(id(p), name)
            if owner != name:
                shared.setdefault(owner, {owner}).add(name)
    return {(", ".join(sorted(names)), owner) for owner, names in shared.items()}


@pytest.mark.parametrize("make", ["bert", "t5"])
def test_tied_weights_get_one_note_per_module_owning_shared_parameters(make):
    # BERT's decoder shares its weight with the word embeddings and its bias with cls.predictions (2 notes); T5's
    # shared embedding is also encoder's, decoder's and lm_head's (1 note). Before, every module of a tie got
    # its own note (3 for BERT, 4 for T5), some naming an owner of none of the parameters
    if make == "bert":
        model = transformers.BertForMaskedLM(transformers.BertConfig(
            vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32))
        batch = {"input_ids": torch.randint(0, 64, (2, 8)), "labels": torch.randint(0, 64, (2, 8))}
    else:
        model = transformers.T5ForConditionalGeneration(transformers.T5Config(
            vocab_size=64, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2, decoder_start_token_id=0))
        batch = {"input_ids": torch.randint(0, 64, (2, 8)), "labels": torch.randint(0, 64, (2, 4))}
    with fpsim.watch(model, formats=("fp16",)) as w:
        model(**batch).loss.backward()
    prefix, middle = "tied weights: ", " share parameters; they are counted once, under "
    notes = {tuple(n.removeprefix(prefix).split(middle)) for n in w.report().run["notes"] if n.startswith(prefix)}
    assert notes == _expected_tie_notes(model) and len(notes) == (2 if make == "bert" else 1)


class LitRegressor(lightning.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def lightning_fit(model, precision: str):
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g))
    trainer = lightning.Trainer(max_steps=5, accelerator="cpu", devices=1, precision=precision, logger=False,
                                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=8))


def test_lightning_automatic_optimisation_is_shadowed_and_trains_unchanged():
    # the forward and backward run inside optimizer.step(closure): the step is replayed at its backward's end;
    # training_step calls self.net(x), not the LightningModule's forward: the shadow follows net from step 1 on
    torch.manual_seed(0)
    plain = LitRegressor()
    lightning_fit(plain, "32-true")
    torch.manual_seed(0)
    model = LitRegressor()
    with fpsim.watch(model, formats=("fp16", "bf16"), shadow_every=1) as w:
        lightning_fit(model, "32-true")
    for a, b in zip(plain.parameters(), model.parameters()):
        assert torch.equal(a, b)
    report = w.report()
    assert report.shadow_summary()["steps"] == [1, 2, 3, 4]
    assert report.shadow_evidence["net.0"]["fp16"]["steps"] >= 1


def test_transformers_trainer_is_shadowed_through_the_loss_its_model_computes(tmp_path):
    # GPT2LMHeadModel computes its loss inside forward (labels in the kwargs): the replays take it from there
    import warnings

    plain = tiny_gpt2()
    hf_train(plain, tmp_path / "a", watched=False)
    model = tiny_gpt2()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="fpsim")
        report = hf_train(model, tmp_path / "b", watched=True, shadow_every=1)
    for a, b in zip(plain.parameters(), model.parameters()):
        assert torch.equal(a, b)
    assert report.shadow_summary()["steps"] == [0, 1, 2, 3]      # turns: the noise floor, fp16, bf16, the floor
    evidence = report.shadow_evidence["transformer.h.0.attn.c_attn"]
    assert evidence["fp16"]["steps"] == evidence["bf16"]["steps"] == 1 and 0 < evidence["fp16"]["grad_rel_error"] < evidence["bf16"]["grad_rel_error"]


def test_a_trainer_in_bf16_is_shadowed_in_each_format_not_in_its_own(tmp_path):
    # with bf16=True accelerate wraps the model's forward in autocast: every replay, the FP32 reference
    # included, ran in bf16, and every layer's error was exactly 0 in both formats. The replays now call the
    # forward as it was before the wrapping; the run itself stays in bf16, bit for bit as unwatched
    plain = tiny_gpt2()
    hf_train(plain, tmp_path / "a", watched=False, bf16=True)
    model = tiny_gpt2()
    report = hf_train(model, tmp_path / "b", watched=True, shadow_every=1, bf16=True)
    for a, b in zip(plain.parameters(), model.parameters()):
        assert torch.equal(a, b)
    assert report.run["precision"]["autocast"] == {"cpu": "bfloat16"}
    evidence = report.shadow_evidence["transformer.h.0.attn.c_attn"]
    # a bf16 replay rounds to 8 significant bits, an fp16 one to 11: their errors differ by about 2^3
    assert 0 < evidence["fp16"]["grad_rel_error"] < evidence["bf16"]["grad_rel_error"] < 0.05
    assert not any("exactly the reference's gradients" in note for note in report.run["notes"])


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_lightning_trainer_with_automatic_optimisation(precision):
    torch.manual_seed(0)
    plain = LitRegressor()
    lightning_fit(plain, precision)
    torch.manual_seed(0)
    model = LitRegressor()
    grads = []
    model.net[0].weight.register_hook(lambda g: grads.append(g.detach().clone()))
    with fpsim.watch(model, formats=("fp16", "bf16")) as w:
        lightning_fit(model, precision)
    for a, b in zip(plain.parameters(), model.parameters()):
        assert torch.equal(a, b)
    report = w.report()
    assert report.run["steps"] == 5                               # closure-based steps: one each
    stats = report.layer("net.0").tensors["weight_grad"]
    assert stats.samples == 10                                    # weight and bias, every step from step 0
    assert len(grads) == 5 and stats.amax >= max(g.abs().max().item() for g in grads)   # step 0's included
    dtypes = report.run["precision"]["op_outputs_by_dtype"]
    if precision == "bf16-mixed":
        assert report.run["precision"]["autocast"] == {"cpu": "bfloat16"} and dtypes.get("bfloat16", 0) > 0
    else:
        assert "bfloat16" not in dtypes and report.run["precision"]["autocast"] == {}
