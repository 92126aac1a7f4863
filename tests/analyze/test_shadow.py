"""Shadow-step verdicts held to real low-precision training, and the promise that shadowing changes nothing.

Sources of truth: real CPU torch.autocast FP16/BF16 training of the same model
from the same weights and batches (fpsim.analyze.planted.train_real: torch's
own low-precision arithmetic, a static loss scale, chosen modules outside
autocast); what that training did to the loss decides what the verdict must
be. For the no-change promise: the same run without fpsim, compared bit for bit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import copy
import json
import math

import pytest
import torch
from torch import nn

from fpsim.analyze import FormatLimits, watch
from fpsim.analyze.evidence import FALLBACK_THRESHOLD
from fpsim.analyze.planted import AuxHead, task, train_real
from fpsim.analyze.runner import run_script
from framework_helpers import Checkpointed

STEPS, SHADOW_EVERY = 20, 5
REAL_STEPS = 100


def observe(name, steps=STEPS, every=SHADOW_EVERY, formats=("fp16", "bf16"), model=None, batch=32):
    """Train a planted task in FP32 under watch(shadow_every=every); the report."""
    planted, loss_fn, batches = task(name)
    model = planted if model is None else model
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    with watch(model, formats=formats, shadow_every=every) as w:
        for x, y in batches(steps, batch):
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return w.report()


def real(name, **options):
    """Final mean loss (last 10 steps) of real training of a planted task, and the model."""
    model, loss_fn, batches = task(name)
    result = train_real(model, loss_fn, batches(REAL_STEPS), **options)
    return sum(result["losses"][-10:]) / 10, model


def aux_loss(model):
    """The auxiliary head's own loss on a batch of 256 from the task's teacher: what its training achieved."""
    _, _, batches = task("aux_head")
    x, y = next(iter(batches(1, 256)))
    with torch.no_grad():
        return float(nn.functional.mse_loss(model(x)[1], y.flip(1)))


# ------------------------------------------------------------- no change
class DropoutBatchNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 16)
        self.bn = nn.BatchNorm1d(16)
        self.drop = nn.Dropout(0.3)
        self.head = nn.Linear(16, 2)

    def forward(self, x):
        return self.head(self.drop(torch.relu(self.bn(self.fc(x)))))


def _train_bn(shadow: bool):
    torch.manual_seed(0)
    model = DropoutBatchNorm()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    w = watch(model, formats=("fp16", "bf16", "e4m3"), shadow_every=1) if shadow else None
    if w is not None:
        w.attach()
    for _ in range(4):
        x = torch.randn(16, 8, generator=g)
        loss = model(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if w is not None:
        w.close()
        assert w.shadow.record.count == 4
    return model, optimizer, torch.get_rng_state(), torch.rand(3)


def test_shadow_steps_leave_the_run_bitwise_unchanged():
    plain, shadowed = _train_bn(False), _train_bn(True)
    (m0, o0, rng0, draw0), (m1, o1, rng1, draw1) = plain, shadowed
    for (n, a), (_, b) in zip(m0.state_dict().items(), m1.state_dict().items()):   # weights and BN stats
        assert torch.equal(a, b), n
    for a, b in zip(m0.parameters(), m1.parameters()):
        assert torch.equal(a.grad, b.grad)
    for s0, s1 in zip(o0.state.values(), o1.state.values()):
        assert all(torch.equal(s0[k], s1[k]) for k in s0)
    assert torch.equal(rng0, rng1) and torch.equal(draw0, draw1)


def _counts(shadow_every):
    torch.manual_seed(0)
    model = DropoutBatchNorm()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    with watch(model, formats=("fp16", "e4m3"), shadow_every=shadow_every) as w:
        for _ in range(4):
            loss = model(torch.randn(16, 8, generator=g)).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return {(layer.name, kind): (t.hist.counts.tolist(), t.samples, t.amax)
            for layer in w.report().layers for kind, t in layer.tensors.items()}


def test_shadow_steps_leave_the_counts_as_an_unshadowed_run_makes_them():
    # the unshadowed counts are held to independent numpy counts in test_watch.py; the replays run the same
    # modules and ops again, and none of theirs may be counted
    plain, shadowed = _counts(None), _counts(1)
    assert plain.keys() == shadowed.keys() and len(plain) > 10
    for key in plain:
        assert plain[key] == shadowed[key], key


def _train_saturated(shadow: bool):
    model, loss_fn, batches = task("saturated")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    w = watch(model, formats=("bf16",), shadow_every=1).attach() if shadow else None
    for x, y in batches(4):
        loss = loss_fn(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if w is not None:
        w.close()
        assert w.shadow.record.sensitivity          # the weight-sensitivity replay ran
    return model, torch.get_rng_state()


def test_weight_sensitivity_replays_leave_the_run_bitwise_unchanged():
    (m0, rng0), (m1, rng1) = _train_saturated(False), _train_saturated(True)
    for (n, a), (_, b) in zip(m0.state_dict().items(), m1.state_dict().items()):
        assert torch.equal(a, b), n
    assert torch.equal(rng0, rng1)


class Stateful(nn.Module):
    """A forward that draws from a generator of its own, Python's and numpy's RNGs (LayerDrop-style), and keeps
    state in plain attributes: the last hidden tensor and a call counter."""

    def __init__(self):
        super().__init__()
        self.lin, self.head = nn.Linear(8, 8), nn.Linear(8, 1)
        self.generator = torch.Generator().manual_seed(5)
        self.prev, self.calls = None, 0

    def forward(self, x):
        import random

        import numpy as np

        self.calls += 1
        h = torch.tanh(self.lin(x)) * torch.rand(x.shape, generator=self.generator)
        if self.prev is not None:
            h = h + 0.5 * self.prev
        self.prev = h.detach()
        keep = random.random() < 0.7 and np.random.uniform() < 0.9
        return self.head(h if keep else h * 0)


def _seeded_stateful():
    """(Stateful model, its Adam, a batch generator), every RNG stream its forward draws from seeded."""
    import random

    import numpy as np

    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    model = Stateful()
    return model, torch.optim.Adam(model.parameters(), lr=1e-2), torch.Generator().manual_seed(1)


def _train_stateful(shadow: bool):
    import random

    import numpy as np

    model, optimizer, g = _seeded_stateful()
    losses = []
    with watch(model, formats=("fp16", "bf16", "e4m3"), shadow_every=1) if shadow else contextlib.nullcontext():
        for _ in range(6):
            loss = model(torch.randn(16, 8, generator=g)).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
    return (model, losses, model.generator.get_state(), random.random(), np.random.uniform(), torch.rand(1))


def test_shadow_steps_leave_user_rng_streams_and_module_attributes_as_the_run_left_them():
    # the replays start from the state the real forward started from and put back the run's: a generator of
    # the model's own, Python's random, numpy's, a tensor kept from the last forward, a call counter
    (m0, losses0, *draws0), (m1, losses1, *draws1) = _train_stateful(False), _train_stateful(True)
    assert all(torch.equal(a, b) for a, b in zip(losses0, losses1))
    assert all(torch.equal(a, b) for a, b in zip(m0.parameters(), m1.parameters()))
    assert torch.equal(m0.prev, m1.prev) and m0.calls == m1.calls == 6
    assert torch.equal(draws0[0], draws1[0]) and draws0[1:3] == draws1[1:3] and torch.equal(draws0[3], draws1[3])


def square_loss_steps(model, optimizer, g, steps: int, rows: int, before_each=None, shape=None):
    """`steps` steps of mean squared output on random batches of `rows` (of `shape` where given: a sequence
    model's) (before_each(): run first in each)."""
    for _ in range(steps):
        if before_each is not None:
            before_each()
        loss = model(torch.randn(*(shape or (rows, model_inputs(model))), generator=g)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def _square_loss_run(make, watched: bool, lr: float, steps: int = 4):
    """(model, watcher or None): `steps` SGD steps of square_loss_steps on make() from seed 0, under
    watch(formats=("fp16", "bf16"), shadow_every=1) or unobserved."""
    torch.manual_seed(0)
    model = make()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(1)
    with watch(model, formats=("fp16", "bf16"), shadow_every=1) if watched else contextlib.nullcontext() as w:
        square_loss_steps(model, optimizer, g, steps, 16)
    return model, w


def model_inputs(model) -> int:
    return next(m for m in model.modules() if isinstance(m, nn.Linear)).in_features


def test_an_evaluation_forward_with_gradients_on_gives_way_to_the_training_forward():
    # each step first runs the model on held-out data with gradients on (no backward), then trains: the
    # training forward, the one a gradient reaches, is replayed
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    def evaluate():
        model.eval()
        model(torch.randn(4, 8, generator=g)).mean()
        model.train()

    with watch(model, formats=("fp16",), shadow_every=1) as w:
        square_loss_steps(model, optimizer, g, 4, 16, before_each=evaluate)
    report = w.report()
    assert report.shadow_summary()["steps"] == [0, 1, 2, 3]
    assert report.shadow_evidence["0"]["fp16"]["steps"] == 2


def _train_gan(watched=None, steps: int = 6):
    """A GAN's loop: the generator's forward in the discriminator's step, its backward in its own step (the
    discriminator's optimizer steps in between). watched(G, D): the module to watch, or None (unobserved).
    The generator's parameters after training, and the watcher."""
    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8))
    D = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    opt_g, opt_d = torch.optim.Adam(G.parameters(), lr=1e-3), torch.optim.Adam(D.parameters(), lr=1e-3)
    g, bce = torch.Generator().manual_seed(1), nn.BCEWithLogitsLoss()
    w = None if watched is None else watch(watched(G, D), formats=("fp16",), shadow_every=2).attach()
    for _ in range(steps):
        real_data, z = torch.randn(16, 8, generator=g) + 2, torch.randn(16, 4, generator=g)
        fake = G(z)
        loss_d = bce(D(real_data), torch.ones(16, 1)) + bce(D(fake.detach()), torch.zeros(16, 1))
        opt_d.zero_grad()
        loss_d.backward()
        opt_d.step()
        loss_g = bce(D(fake), torch.ones(16, 1))
        opt_g.zero_grad()
        loss_g.backward()
        opt_g.step()
    if w is not None:
        w.close()
    return [p.detach().clone() for p in G.parameters()], w


@pytest.mark.parametrize("watched", [lambda G, D: G, lambda G, D: nn.ModuleDict({"G": G, "D": D})],
                         ids=["generator", "both"])
def test_a_forward_whose_gradient_comes_a_step_later_is_replayed_then(watched):
    # watching both, each optimizer's step is a step: the generator's forward runs in the discriminator's step, the
    # gradient reaches its output in the next, after the discriminator's update (which leaves the generator as it
    # was). Before, every capture was dropped when the discriminator's step ended: no step was shadowed. Watching
    # the generator alone, the discriminator is outside the watched model and its optimizer steps none of the
    # generator's parameters: the steps are the generator's (its forward and backward in one step)
    unobserved, _ = _train_gan()
    trained, w = _train_gan(watched)
    assert all(torch.equal(a, b) for a, b in zip(unobserved, trained))
    report = w.report()
    both = isinstance(w.model, nn.ModuleDict)
    assert report.run["steps"] == (12 if both else 6) and report.shadow_summary()["steps"]
    assert w.shadow._real_matches      # the replay's FP32 gradients equal those the real backward computed
    generator_layer = "0" if "0" in report.shadow_evidence else "G.0"
    assert report.shadow_evidence[generator_layer]["fp16"]["grad_rel_error"] < 0.01


def test_a_submodule_run_alone_before_the_model_does_not_take_the_shadow_from_it():
    # the script runs the body alone (with gradients on) before training the whole model: the shadow stays on
    # the model, whose own forward runs in the same step, and its head gets evidence too
    torch.manual_seed(0)
    model = nn.Sequential(nn.Sequential(nn.Linear(8, 16), nn.Tanh()), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    with watch(model, formats=("fp16",), shadow_every=1) as w:
        model[0](torch.randn(4, 8, generator=g))
        square_loss_steps(model, optimizer, g, 4, 16)
    report = w.report()
    assert w.shadow.core is model and report.shadow_summary()["steps"] == [0, 1, 2, 3]
    assert report.shadow_evidence["1"]["fp16"]["steps"] == 2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_a_model_in_low_precision_is_replayed_as_the_same_model_in_fp32(dtype):
    # model.to(bfloat16): the replays must not take the model's own dtype for the FP32 reference (BF16's error
    # was 0). A float64 model: autocast leaves float64 as it is, so every replay equalled the reference (no
    # evidence, and a note blaming an autocast inside the forward). With lr 0 the weights stay put, the loss's output gradient is 1 (exact in any dtype), so the
    # evidence must equal that of a float32 model holding the same rounded weights fed the same rounded inputs
    def run(model_dtype):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 4)).to(dtype).to(model_dtype)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        g = torch.Generator().manual_seed(1)
        with watch(model, formats=("fp16", "bf16"), shadow_every=1) as w:
            for _ in range(6):
                x = torch.randn(16, 8, generator=g).to(dtype).to(model_dtype)
                loss = model(x).float().sum()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        return w.report()

    low, fp32 = run(dtype), run(torch.float32)
    if dtype == torch.float64:   # its real float64 gradients, within 1e-6 of the FP32 reference, stand in for it
        assert {(layer, fmt): pytest.approx(e["grad_rel_error"], rel=1e-4) for layer, by in low.shadow_evidence.items()
                for fmt, e in by.items()} == {(layer, fmt): e["grad_rel_error"]
                                              for layer, by in fp32.shadow_evidence.items() for fmt, e in by.items()}
    else:
        assert low.shadow_evidence == fp32.shadow_evidence
    assert all(low.shadow_evidence[layer][fmt]["grad_rel_error"] > 0 for layer in ("0", "2") for fmt in ("fp16", "bf16"))
    assert any("replay it with parameters, inputs and buffers in FP32" in note for note in low.run["notes"])
    assert not any("in FP32 (the reference" in note for note in fp32.run["notes"])


class FrozenBF16Trunk(nn.Module):
    """A frozen BF16 trunk (its forward casts into it) under trainable FP32 layers, as when fine-tuning."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(8, 32).to(torch.bfloat16).requires_grad_(False)
        self.head = nn.Sequential(nn.Tanh(), nn.Linear(32, 4))

    def forward(self, x):
        return self.head(self.trunk(x.bfloat16()).float())


def test_a_model_mixing_bf16_and_fp32_parameters_is_replayed_in_its_own_dtypes():
    # a frozen BF16 trunk beside FP32 layers: the replays cast every parameter to FP32, the forward's own cast
    # to BF16 then met an FP32 weight ("mat1 and mat2 must have the same dtype") and the shadow steps stopped at
    # step 0. The model now replays in its own dtypes: every step shadowed, the FP32 reference replay equals
    # the real backward's gradients, training unchanged
    plain, _ = _square_loss_run(FrozenBF16Trunk, watched=False, lr=0.1)
    model, w = _square_loss_run(FrozenBF16Trunk, watched=True, lr=0.1)
    report = w.report()
    assert all(torch.equal(a, b) for a, b in zip(plain.parameters(), model.parameters()))
    assert w.shadow.error is None and report.shadow_summary()["steps"] == [0, 1, 2, 3] and w.shadow._real_matches
    assert report.shadow_evidence["head.1"]["fp16"]["grad_rel_error"] > 0
    assert any(note.startswith("the model mixes bfloat16 parameters with float32 ones") for note in report.run["notes"])


class LastState(nn.Module):
    """An LSTM read at its last time step: its products run inside torch's fused LSTM kernel."""

    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(8, 16, batch_first=True)

    def forward(self, x):
        return self.rnn(x)[0][:, -1]


def test_an_fp8_replay_that_finds_no_product_to_quantise_measures_nothing():
    # an LSTM's products run inside one fused op, which the FP8 replays do not split: its E4M3 replays equalled
    # the reference exactly, the report blamed "an autocast inside the forward" and dropped the BF16 evidence
    # too. Such a format now measures nothing (value counts decide, with a note saying why), the others go on
    torch.manual_seed(0)
    model = LastState()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    with watch(model, formats=("e4m3", "bf16"), shadow_every=1) as w:
        square_loss_steps(model, optimizer, g, 4, 8, shape=(8, 6, 8))
    report = w.report()
    assert set(report.shadow_evidence["rnn"]) == {"bf16"} and report.shadow_evidence["rnn"]["bf16"]["grad_rel_error"] > 0
    notes = report.run["notes"]
    assert any(note.startswith("no e4m3 replay found a layer's matrix product") for note in notes)
    assert not any("exactly the reference's gradients" in note for note in notes)


class CompiledBody(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.compile(nn.Sequential(nn.Linear(8, 32), nn.Tanh()))
        self.head = nn.Linear(32, 1)

    def forward(self, x):
        return self.head(self.body(x))


def test_a_compiled_submodule_is_replayed_eagerly_and_the_run_stays_compiled():
    # the replays ran into Dynamo under their own dispatch modes (AssertionError, shadow steps stopped); now they
    # run the compiled body eagerly, and the real steps, compiled, end with the parameters of an unwatched run
    import warnings

    plain, _ = _square_loss_run(CompiledBody, watched=False, lr=0.01)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="fpsim")
        model, w = _square_loss_run(CompiledBody, watched=True, lr=0.01)
    assert all(torch.equal(a, b) for a, b in zip(plain.parameters(), model.parameters()))
    report = w.report()
    assert w.shadow.error is None and report.shadow_summary()["steps"] == [0, 1, 2, 3]
    assert 0 < report.shadow_evidence["body.0"]["fp16"]["grad_rel_error"] < report.shadow_evidence["body.0"]["bf16"][
        "grad_rel_error"]
    assert not any("half a batch" in note for note in report.run["notes"])


def _train_compiled(watched: str | None):
    """Four steps of a torch.compile'd model: unobserved (None), under watch(compiled) ("wrapper"), or under
    watch(model) with the model compiled after ("model"). Its parameters, the watcher, and the frames Dynamo
    compiled."""
    import torch._dynamo

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    w = watch(model, formats=("fp16",), shadow_every=1).attach() if watched == "model" else None
    compiled = torch.compile(model)
    if watched == "wrapper":
        w = watch(compiled, formats=("fp16",), shadow_every=1).attach()
    frames = torch._dynamo.utils.counters["frames"]["ok"]
    # with no cache to hit, as on a fresh machine, the compile traces the backward through torch.autograd.grad
    with torch._inductor.config.patch(force_disable_caches=True), \
            contextlib.suppress(UserWarning) if watched else contextlib.nullcontext():
        for _ in range(4):
            loss = compiled(torch.randn(16, 8, generator=g)).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    if w is not None:
        w.close()
    return [p.detach().clone() for p in model.parameters()], w, torch._dynamo.utils.counters["frames"]["ok"] - frames


@pytest.mark.parametrize("watched", ["wrapper", "model"])
def test_a_compiled_model_is_shadowed_and_its_steps_stay_compiled(watched):
    # a torch.compile'd root was not shadowed (its own hooks do nothing inside compiled code): the capture is now
    # taken at the compiled module's call, the replays run the model eagerly, and the real steps stay as they were
    import warnings

    plain, _, plain_frames = _train_compiled(None)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*global hooks")
        trained, w, frames = _train_compiled(watched)
    assert all(torch.equal(a, b) for a, b in zip(plain, trained)) and frames == plain_frames
    report = w.report()
    # compiled after watch(model), the capture starts once the compiled module has run: from step 1
    assert report.shadow_summary()["steps"] == ([0, 1, 2, 3] if watched == "wrapper" else [1, 2, 3])
    assert w.shadow._real_matches      # the replays' FP32 gradients equal those the compiled backward computed
    assert 0 < report.shadow_evidence["0"]["fp16"]["grad_rel_error"] < 0.01
    assert not any("no step was shadowed" in note for note in report.run["notes"])
    # compiled after watch(model), the compiled module is the model under its own name, not a second root
    assert any(note.startswith("Sequential ran under torch.compile") for note in report.run["notes"])


def test_a_watched_model_can_be_copied_and_saved_whole_and_its_copies_are_not_watched():
    # copy.deepcopy(model) (an EMA model, AveragedModel, the best model so far) and torch.save(model) raised
    # "cannot pickle '_thread._local' object" while shadow steps were on: the root's hooks held fpsim's state.
    # Copies now hold an inert hook: they compute as the model does, and their forwards are not captured
    import io

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    with watch(model, formats=("fp16",), shadow_every=1) as w:
        square_loss_steps(model, optimizer, g, 1, 16)
        best = copy.deepcopy(model)
        saved = io.BytesIO()
        torch.save(model, saved)
        saved.seek(0)
        loaded = torch.load(saved, weights_only=False)
        x = torch.randn(4, 8, generator=g)
        assert torch.equal(best(x), model(x)) and torch.equal(loaded(x), model(x))
        square_loss_steps(model, optimizer, g, 2, 16, before_each=lambda: best(x).sum().backward())
    assert w.shadow.error is None and w.report().shadow_summary()["steps"] == [0, 1, 2]


class SetsItsOwnPrecision(nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.lin, self.head, self.dtype = nn.Linear(8, 32), nn.Linear(32, 1), dtype

    def forward(self, x):
        with torch.autocast("cpu", dtype=self.dtype):
            return self.head(torch.tanh(self.lin(x))).float()


@pytest.mark.parametrize("own, formats, overridden", [(torch.bfloat16, ("fp16", "bf16"), ["fp16", "bf16"]),
                                                      (torch.float16, ("bf16",), ["bf16"])])
def test_a_forward_that_sets_its_own_autocast_is_judged_by_its_counts_and_says_why(own, formats, overridden):
    # the model's own autocast wins inside every replay: the "FP32" reference runs in its dtype, and so does
    # every replay, which equals it exactly. Before, that evidence judged every layer ok; now the verdicts come
    # from the value counts, and a note says why (bf16, replayed at one scale, was not checked at first)
    torch.manual_seed(0)
    model = SetsItsOwnPrecision(own)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    with watch(model, formats=formats, shadow_every=1) as w:
        square_loss_steps(model, optimizer, g, 6, 16)
    report = w.report()
    assert w.shadow.record.count == 6 and w.shadow.overridden == overridden
    assert report.shadow_evidence == {} and report.shadow_summary() is None
    notes = [note for note in report.run["notes"] if "exactly the reference's gradients" in note]
    assert len(notes) == 1 and notes[0].startswith(f"every {' and every '.join(overridden)} replay")


@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    scale: float


@dataclasses.dataclass(frozen=True)
class Prediction:
    y: torch.Tensor


class TakesABatch(nn.Module):
    """The model of square_loss_steps, fed a dataclass (x, scale) and giving a frozen dataclass, when `wrapped`."""

    def __init__(self, wrapped: bool):
        super().__init__()
        self.lin, self.head, self.wrapped = nn.Linear(8, 32), nn.Linear(32, 1), wrapped

    def forward(self, batch):
        x = batch.x * batch.scale if self.wrapped else batch * 2.0
        y = self.head(torch.tanh(self.lin(x)))
        return Prediction(y) if self.wrapped else y


def test_inputs_and_outputs_in_dataclasses_are_copied_halved_and_hooked_as_plain_tensors_are():
    # torch's pytree takes a dataclass for a leaf: a batch passed as one was never halved (no noise floor, the
    # fallback threshold instead), and an output that is one had no tensor to hook (no step shadowed)
    def run(wrapped):
        torch.manual_seed(0)
        model = TakesABatch(wrapped)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        g = torch.Generator().manual_seed(1)
        with watch(model, formats=("fp16", "bf16"), shadow_every=1) as w:
            for _ in range(6):
                x = torch.randn(16, 8, generator=g)
                out = model(Batch(x, 2.0) if wrapped else x)
                loss = (out.y if wrapped else out).square().mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        return w.report()

    wrapped, plain = run(True), run(False)
    assert wrapped.shadow_summary()["steps"] == [0, 1, 2, 3, 4, 5] and wrapped.shadow_summary()["unsplit_steps"] == 0
    assert wrapped.shadow_evidence == plain.shadow_evidence


class RenormalisedEmbedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.head = nn.Embedding(50, 16, max_norm=1.0), nn.Linear(16, 3)

    def forward(self, ids):
        return self.head(self.emb(ids).mean(1))


def test_a_forward_that_writes_into_its_parameters_writes_into_the_replays_copies():
    # Embedding(max_norm=1) renormalises the rows it looks up in place: each replay did it to the run's own
    # weight (the replays' FP32 parameters were views of it), and training ended elsewhere than unwatched
    def run(watched):
        torch.manual_seed(0)
        model = RenormalisedEmbedding()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        g = torch.Generator().manual_seed(1)
        with watch(model, formats=("fp16", "bf16"), shadow_every=1) if watched else contextlib.nullcontext():
            for _ in range(6):
                ids = torch.randint(0, 50, (16, 6), generator=g)
                loss = nn.functional.cross_entropy(model(ids), torch.randint(0, 3, (16,), generator=g))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        return [p.detach().clone() for p in model.parameters()]

    assert all(torch.equal(a, b) for a, b in zip(run(False), run(True)))


class DoublesItsInput(nn.Module):
    def __init__(self, in_place: bool):
        super().__init__()
        self.lin, self.head, self.in_place = nn.Linear(8, 32), nn.Linear(32, 1), in_place

    def forward(self, x):
        x = x.mul_(2.0) if self.in_place else x * 2.0
        return self.head(torch.tanh(self.lin(x)))


def test_a_forward_that_writes_its_input_is_replayed_as_one_that_does_not():
    # x.mul_(2) wrote into the captured input, so each replay saw the input doubled once more (fp16's error
    # 0.23 against bf16's 0.004); each replay now gets fresh copies: the evidence equals that of x * 2
    def run(in_place):
        _, w = _square_loss_run(lambda: DoublesItsInput(in_place), watched=True, lr=0.01, steps=6)
        return w.report().shadow_evidence

    assert run(in_place=True) == run(in_place=False)


def test_state_kept_for_the_full_batch_costs_the_noise_floor_not_the_shadow_steps():
    # Stateful keeps last step's activations (16 rows): half a batch cannot be added to them from step 1 on. The
    # formats are still replayed on the whole batch, with no warning; the report says why there is no noise floor
    import warnings

    model, optimizer, g = _seeded_stateful()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with watch(model, formats=("fp16", "bf16"), shadow_every=1) as w:
            square_loss_steps(model, optimizer, g, 7, 16)
    report = w.report()
    assert report.shadow_summary()["steps"] == list(range(7))
    assert w.shadow.error is None and w.shadow.record.unsplit_steps >= 2
    assert report.shadow_evidence["lin"]["fp16"]["steps"] >= 2 and report.shadow_evidence["lin"]["bf16"]["steps"] >= 2
    assert any("half a batch failed" in note and "must match the size" in note for note in report.run["notes"])


@pytest.mark.parametrize("reentrant", [True, False])
def test_a_checkpointed_segment_is_replayed_as_the_same_model_without_checkpointing(reentrant):
    # a reentrant checkpoint refuses torch.autograd.grad (the replays' backward) when a gradient must pass
    # through it to earlier layers: the shadow steps stopped with a RuntimeError (transformers' models with
    # gradient_checkpointing_enable(use_reentrant=True)). The replays now run the segment as a plain call:
    # the evidence equals that of the model without checkpointing, and the run is unchanged
    import warnings

    def run(reentrant):
        torch.manual_seed(0)
        model = Checkpointed(reentrant)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(1)
        with watch(model, formats=("fp16", "bf16"), shadow_every=1) as w:
            square_loss_steps(model, optimizer, g, 5, 16)
        return w, [p.detach().clone() for p in model.parameters()]

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        w, params = run(reentrant)
    plain, plain_params = run(None)
    assert w.shadow.error is None and all(torch.equal(a, b) for a, b in zip(params, plain_params))
    assert set(w.report().shadow_evidence) == {"a.0", "b.0", "head"}
    assert w.report().shadow_evidence == plain.report().shadow_evidence


def _shadow_record(replay_reference: bool, decay: float = 0.0, accumulate: int = 1):
    """What shadowing every step of DropoutBatchNorm measured, and whether the real gradients stood in for the
    FP32 reference; replay_reference: never let them (the reference replayed on every step, the oracle)."""
    torch.manual_seed(0)
    model = DropoutBatchNorm()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    w = watch(model, formats=("fp16", "bf16"), shadow_every=1)
    w.attach()
    if replay_reference:
        w.shadow._real_matches = False
    for _ in range(7):
        optimizer.zero_grad()
        for _ in range(accumulate):
            loss = model(torch.randn(16, 8, generator=g)).square().mean()
            (loss + decay * sum(p.square().sum() for p in model.parameters())).backward()
        optimizer.step()
    w.close()
    return w.shadow.record.to_dict()["layers"], w.shadow._real_matches


@pytest.mark.parametrize("case", [{}, {"decay": 1e-2}, {"accumulate": 2}], ids=["plain", "regularised", "accumulated"])
def test_the_real_gradients_stand_in_for_the_reference_only_where_they_equal_it(case):
    measured, matched = _shadow_record(False, **case)
    oracle, _ = _shadow_record(True, **case)
    assert bool(matched) is (not case)   # a loss term on the weights, or a second backward: replayed
    assert measured.keys() == oracle.keys()
    for layer, entry in oracle.items():
        for fmt, by_scale in entry["formats"].items():
            for scale, m in by_scale.items():
                got = measured[layer]["formats"][fmt][scale]
                assert got["grad_rel_error"] == pytest.approx(m["grad_rel_error"], rel=1e-5, abs=1e-9), (layer, fmt)


# ------------------------------------------------------- against reality
def test_harmless_underflow_is_ok_whatever_the_counts_say():
    report = observe("harmless")
    counted = report.layer("inp").tensors["weight_grad"]              # the counts see the underflow ...
    assert counted.underflow_fraction(FormatLimits.of("fp16"), 0) > 0.5
    fp32, _ = real("harmless")
    fp16, _ = real("harmless", dtype=torch.float16)
    assert fp16 == pytest.approx(fp32, rel=1e-3)                       # ... real FP16 trains as FP32 did
    assert report.verdict("inp", "fp16") == "ok" and report.verdict("out", "fp16") == "ok"
    assert report.loss_scale["fp16"].recommended_log2 == 0


def test_vanishing_auxiliary_gradients_get_a_loss_scale():
    report = observe("aux_head")
    assert report.verdict("aux", "fp16") == "loss_scale"
    assert report.verdict("trunk", "fp16") == "ok" and report.verdict("head", "fp16") == "ok"
    scale = report.loss_scale["fp16"].recommended_log2
    assert scale > 0
    _, fp32 = real("aux_head")
    _, unscaled = real("aux_head", dtype=torch.float16)
    _, scaled = real("aux_head", dtype=torch.float16, scale_log2=scale)
    assert aux_loss(unscaled) > 2 * aux_loss(fp32)                      # real FP16 never trains the head
    assert aux_loss(scaled) == pytest.approx(aux_loss(fp32), rel=0.05)   # the recommended scale does
    _, bf16 = real("aux_head", dtype=torch.bfloat16)
    assert aux_loss(bf16) == pytest.approx(aux_loss(fp32), rel=0.05)
    assert report.verdict("aux", "bf16") == "ok" and report.loss_scale["bf16"].recommended_log2 == 0


def test_real_overflow_gets_fp32_and_the_rest_stays_ok():
    report = observe("overflow")
    fp32, _ = real("overflow")
    fp16, _ = real("overflow", dtype=torch.float16)
    kept, _ = real("overflow", dtype=torch.float16, keep_fp32=("raw",))
    assert not math.isfinite(fp16)                                      # real FP16: Inf, then NaN
    assert kept == pytest.approx(fp32, rel=1e-2)                        # with `raw` in FP32: as FP32
    assert report.verdict("raw", "fp16") == "fp32"
    assert "overflows fp16" in report.verdicts["raw"]["fp16"].reason
    assert report.verdict("norm", "fp16") == "ok" and report.verdict("out", "fp16") == "ok"
    assert report.verdict("raw", "bf16") == "ok"


class Scores(nn.Module):
    """Attention scores without parameters of their own: q @ k^T times 1e5, then softmax (beyond FP16 inside)."""

    def forward(self, q, k):
        return torch.softmax(q @ k.transpose(-1, -2) * 1e5, dim=-1)


class ScoredAttention(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k, self.v = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)
        self.scores = Scores()

    def forward(self, x):
        return self.scores(self.q(x), self.k(x)) @ self.v(x)


def test_an_overflow_inside_a_module_without_parameters_is_named_in_the_summary():
    model = ScoredAttention()
    x = torch.randn(4, 6, 8)
    with torch.autocast("cpu", dtype=torch.float16):                # real FP16: Inf scores, a NaN softmax
        assert not model(x).isfinite().all()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    with watch(model, formats=("fp16", "bf16"), shadow_every=1) as w:
        square_loss_steps(model, optimizer, g, 3, 4, shape=(4, 6, 8))
    report = w.report()
    assert report.shadow_summary()["overflow_sources"]["fp16"] == {"scores": 1}
    assert "scores" not in [layer.name for layer in report.layers]     # no layer: its ops carry the verdict
    assert report.verdict("scores:mul", "fp16") == "fp32" and "scores:mul" in [f.name for f in report.findings]
    assert "fp16: the replay's output of scores turned non-finite from finite inputs" in report.summary_table()


def test_an_op_that_is_its_modules_output_is_no_finding_when_the_replay_clears_the_module():
    # body.6's addmm output is body.6's output (a Linear on 2-D input): one tensor, one count. Its module's
    # verdict is the shadow steps' (ok), the op's the value counts' (loss_scale, like the module's own count):
    # not an op that judges worse than its module.
    from fpsim.analyze.demo import run_demo

    report, _, _ = run_demo(None, steps=100, shadow_every=5, formats=("fp16",), save=False)
    counted = report.counted["verdicts"]
    assert counted["body.6:addmm"]["fp16"].verdict == counted["body.6"]["fp16"].verdict == "loss_scale"
    assert report.verdict("body.6", "fp16") == "ok"
    assert "body.6:addmm" not in [f.name for f in report.findings]


def test_op_verdicts_are_judged_at_the_loss_scale_the_shadow_steps_choose():
    # the value counts ask FP16 for 2^17, the shadow steps for 2^8. The loss is cross-entropy plus a logit
    # penalty: the gradient of each term is 1, times the scale: 2^17 is beyond FP16's 65504, 2^8 is not. At the
    # counts' scale the op was fp32 and a finding; at the scale in force it is neither. (The loss itself, which
    # nothing consumes, has no gradient: the seed of loss.backward() is not one.)
    from fpsim.analyze.demo import DEMO_BATCH, DEMO_SEED, TRAIN_SAMPLES, SensorNet, sensor_data

    torch.manual_seed(0)
    model = SensorNet(hidden=64, depth=6)
    data = sensor_data()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(DEMO_SEED + 1)
    with watch(model, formats=("fp16",), shadow_every=10) as w:
        for _ in range(100):
            i = torch.randint(0, TRAIN_SAMPLES, (DEMO_BATCH,), generator=g)
            logits = model(data["readings"][i], data["pressure"][i])
            loss = nn.functional.cross_entropy(logits, data["label"][i]) + 1e-3 * logits.pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    report = w.report()
    counted_scale = report.counted["loss_scale"]["fp16"].recommended_log2
    scale = report.loss_scale["fp16"].recommended_log2
    assert 2.0 ** counted_scale > 65504 > 2.0 ** scale
    assert [sorted(op.tensors) for op in report.ops if op.name == "loop:add"] == [["activation"]]
    assert report.counted["verdicts"]["loop:nll_loss_forward"]["fp16"].verdict == "fp32"
    assert report.verdict("loop:nll_loss_forward", "fp16") == "ok"
    assert "loop:nll_loss_forward" not in [f.name for f in report.findings]


def test_ops_of_layers_the_recommended_scale_serves_are_cleared_and_overflows_kept():
    # 20 demo steps: the replays serve every layer but `pressure` (an overflow source) at 2^8, where the value
    # counts of body.0's addmm want 2^10 or more. Its gradient, measured at 2^8, is within its noise floor: the
    # op's count is not borne out. pressure's addmm overflows in the forward (1.5e5 > 65504), whatever the scale:
    # it stays fp32. (Real FP16 training of the demo with pressure in FP32 at 2^8 ends as FP32 does:
    # docs/verdicts.md, the study's demo row.)
    from fpsim.analyze.demo import run_demo

    report, _, _ = run_demo(None, steps=20, shadow_every=10, formats=("fp16",), save=False)
    assert report.loss_scale["fp16"].recommended_log2 == 8
    assert set(report.shadow_summary()["overflow_sources"]["fp16"]) == {"pressure"}
    evidence = report.shadow_evidence["body.0"]["fp16"]
    assert evidence["grad_rel_error_at_recommended"] < evidence["threshold"]
    reason = report.verdicts["body.0:addmm"]["fp16"].reason
    assert report.verdict("body.0:addmm", "fp16") == "ok" and "value counts: fp32" in reason
    assert "within its noise floor at the recommended scale 2^8, with pressure in FP32" in reason
    assert report.verdict("pressure:addmm", "fp16") == "fp32"
    assert report.layer("pressure:addmm").tensors["activation"].amax > 65504


class ThreeSources(nn.Module):
    """Two overflowing branches side by side (`left`, `right`), and behind them `boost`, whose FP16 output
    overflows only once both branches are finite: three sources, two found together and one after."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.left, self.right = nn.Linear(16, 16), nn.Linear(16, 16)
        self.boost = nn.Linear(32, 32)
        with torch.no_grad():
            self.left.weight.mul_(100.0)
            self.right.weight.mul_(100.0)
            self.boost.weight.mul_(1e5)
        self.norm, self.norm2 = nn.LayerNorm(32), nn.LayerNorm(32)
        self.out = nn.Linear(32, 4)

    def forward(self, x):
        h = self.norm(torch.cat([self.left(x), self.right(x)], 1))
        return self.out(self.norm2(self.boost(h)))


def test_saturated_attention_is_ok_in_bf16_as_real_bf16_training_is():
    """A one-hot softmax: BF16 rounding decides which key wins, the query/key/embedding gradients differ from
    FP32's by about 100%, above their noise-floor threshold; but moving the FP32 weights by one BF16 rounding
    unit changes them as much (the weight sensitivity), and real BF16 autocast training matches FP32."""
    report = observe("saturated")
    for layer in ("embed", "q", "k"):
        ev = report.shadow_evidence[layer]["bf16"]
        assert ev["grad_rel_error"] > 0.5 >= min(ev["noise_floor"], 0.5)      # stands out of the floor alone
        assert ev["sensitivity"] is not None and ev["grad_rel_error"] <= ev["threshold"]
        assert report.verdict(layer, "bf16") == "ok"
    assert report.shadow_evidence["v"]["bf16"]["sensitivity"] is not None
    fp32, _ = real("saturated")
    bf16, _ = real("saturated", dtype=torch.bfloat16)
    assert bf16 < fp32 * 1.02                                            # the oracle: BF16 trains as FP32 does


def test_every_overflow_source_is_found_side_by_side_and_behind_another():
    """Each replay that finds a source stops there and is repeated with it in FP32 (shadow.MAX_OVERFLOW_PASSES):
    sources found together in one forward before must all still be found, and the one behind them too."""
    _, loss_fn, batches = task("overflow")

    def real_fp16(kept):
        return train_real(ThreeSources(), loss_fn, batches(REAL_STEPS), dtype=torch.float16, keep_fp32=kept)

    fp32 = train_real(ThreeSources(), loss_fn, batches(REAL_STEPS))["losses"]
    assert not math.isfinite(real_fp16(())["losses"][0])
    assert not math.isfinite(real_fp16(("left", "right"))["losses"][0])      # boost overflows as well
    kept = real_fp16(("left", "right", "boost"))
    assert kept["skipped"] == 0 and sum(kept["losses"][-10:]) == pytest.approx(sum(fp32[-10:]), rel=1e-2)
    report = observe("overflow", model=ThreeSources(), formats=("fp16",))
    assert {name for name in ("left", "right", "boost") if report.verdict(name, "fp16") == "fp32"} == \
        {"left", "right", "boost"}
    assert all(report.verdict(name, "fp16") == "ok" for name in ("norm", "norm2", "out"))


def test_a_shadowed_step_hooks_its_capture_once_whatever_its_replays():
    """The replays run the model's forward again: they must not capture themselves (one gradient hook per
    model output and per parameter on a shadowed step, none on the others)."""
    planted, loss_fn, batches = task("aux_head")
    optimizer = torch.optim.Adam(planted.parameters(), lr=1e-2)
    counted, register = [], torch.Tensor.register_hook

    def counting(tensor, hook):
        counted[-1] += 1
        return register(tensor, hook)

    with watch(planted, formats=("fp16", "bf16", "e4m3"), every=1000, shadow_every=2) as w:
        torch.Tensor.register_hook = counting
        try:
            for x, y in batches(8):
                counted.append(0)
                loss = loss_fn(planted(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        finally:
            torch.Tensor.register_hook = register
    outputs, params = 2, len(list(planted.parameters()))
    assert w.shadow.record.count == 4
    assert counted == [outputs + params, 0] * 4


class TinyGPT2LM(nn.Module):
    """transformers' GPT-2 (2 layers, 32 wide, random init): logits from token ids. Its head is tied to the
    token embedding, and its attention adds a float32 mask holding float32's lowest value to its scores."""

    def __init__(self):
        super().__init__()
        from framework_helpers import tiny_gpt2

        self.gpt = tiny_gpt2()

    def forward(self, ids):
        return self.gpt(input_ids=ids).logits


def gpt2_batches(steps, batch=8):
    g = torch.Generator().manual_seed(3)
    for _ in range(steps):
        walk = torch.randint(-2, 3, (batch, 17), generator=g).cumsum(1) % 64      # a learnable token stream
        yield walk[:, :-1], walk[:, 1:]


def lm_loss(logits, target):
    return nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())


def test_harmless_fp16_of_a_tied_gpt2_is_ok_throughout_with_its_counted_findings_kept():
    pytest.importorskip("transformers")
    fp32 = train_real(TinyGPT2LM(), lm_loss, gpt2_batches(60), lr=3e-3)["losses"]
    fp16 = train_real(TinyGPT2LM(), lm_loss, gpt2_batches(60), lr=3e-3, dtype=torch.float16)["losses"]
    assert sum(fp16[-10:]) == pytest.approx(sum(fp32[-10:]), rel=1e-2)    # real FP16, no scale: as FP32
    model = TinyGPT2LM()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    with watch(model, formats=("fp16", "bf16"), shadow_every=5) as w:
        for x, y in gpt2_batches(20):
            loss = lm_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    report = w.report()
    for fmt in ("fp16", "bf16"):
        assert {report.verdicts[e.name][fmt].verdict for e in report.layers + report.ops} == {"ok"}, fmt
        assert report.loss_scale[fmt].recommended_log2 == 0
    head = report.shadow_evidence["gpt.lm_head"]["fp16"]     # its weight is the embedding's: judged by it
    assert head["basis"] == "shadow steps" and head["tied_to"] == "gpt.transformer.wte"
    counted = report.counted["verdicts"]
    masked = [n for n in counted if ":" in n and counted[n]["fp16"].verdict == "fp32"]
    assert masked                                  # the counts see float32's lowest value overflow FP16 ...
    assert all("not borne out" in report.verdicts[n]["fp16"].reason for n in masked)   # ... which did no harm


# ---------------------------------------------------------------- report
def test_report_json_carries_the_evidence_and_the_counts_beside():
    report = observe("aux_head", formats=("fp16", "bf16", "e4m3"))
    data = json.loads(report.to_json())
    aux = next(layer for layer in data["layers"] if layer["name"] == "aux")
    ev = aux["evidence"]["fp16"]
    # the 4 shadowed steps take turns (shadow.py): the noise floor, fp16, bf16, e4m3: fp16 gets one
    assert ev["basis"] == "shadow steps" and ev["steps"] == 1
    assert ev["grad_rel_error"] > ev["threshold"] and ev["noise_floor"] > 0 and ev["share_zeroed"] > 0.5
    assert ev["counts"]["basis"] == "value counts" and ev["counted_verdict"] in ("loss_scale", "fp32")
    assert aux["evidence"]["e4m3"]["basis"] == "shadow steps"
    summary = data["summary"]["fp16"]
    assert summary["basis"] == "shadow steps" and summary["loss_scale_layers"] == ["aux"]
    assert f"{ev['grad_rel_error']:.3g}" in summary["reasons"]["aux"]
    assert summary["loss_scale_reason"].startswith(f"scale 2^{data['loss_scale']['fp16']['recommended_log2']}")
    assert data["shadow"]["shadowed_steps"] == STEPS // SHADOW_EVERY
    assert data["shadow"]["counted_verdicts"]["aux"]["fp16"] == ev["counted_verdict"]


class DropoutAuxHead(AuxHead):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.2)

    def forward(self, x):
        h = self.drop(torch.tanh(self.trunk(x)))
        return self.head(h), self.aux(h)


def test_verdicts_stable_across_run_length_and_dropout():
    def verdicts(report):
        return ({n: report.verdicts[n]["fp16"].verdict for n in ("trunk", "head", "aux")},
                report.loss_scale["fp16"].recommended_log2)

    short = verdicts(observe("aux_head", steps=10))
    long = verdicts(observe("aux_head", steps=60, every=10))
    torch.manual_seed(0)
    dropout = verdicts(observe("aux_head", model=DropoutAuxHead()))
    assert short == long == dropout


def test_a_change_of_numerics_during_the_run_is_reported(tmp_path):
    """The auxiliary loss fades from weight 1 to 1e-6 at step 120 of 200. The premise, from torch's own FP16: a
    real CPU autocast FP16 backward of the faded loss gives the auxiliary head an all-zero weight gradient (of
    the full loss a nonzero one), and with the loss scaled by the recommended 2^8 a nonzero one again. The
    report must say that the head's FP16 numerics changed, standing out from a step after 120 on, judge it by
    those steps (`loss_scale`, where the mean over all steps, most of them before the fade, is under its
    threshold), say nothing of the other layers, whose numerics did not change; report.json keeps it."""
    model, _, batches = task("aux_head")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)

    def loss_of(out, y, weight):
        return nn.functional.mse_loss(out[0], y) + weight * nn.functional.mse_loss(out[1], y.flip(1))

    with watch(model, formats=("fp16",), shadow_every=2) as w:
        for step, (x, y) in enumerate(batches(200)):
            loss = loss_of(model(x), y, 1.0 if step < 120 else 1e-6)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    report = w.report()
    ev = report.shadow_evidence["aux"]["fp16"]
    changed = ev["numerics_changed"]
    assert changed["stands_out"] == "late" and changed["from_step"] >= 120
    assert changed["late"]["grad_rel_error"] > 0.99 and changed["early"]["grad_rel_error"] < 0.5
    assert report.shadow["layers"]["aux"]["formats"]["fp16"][0]["grad_rel_error"] < ev["threshold"]  # all steps
    assert report.verdicts["aux"]["fp16"].verdict == "loss_scale"
    scale = report.loss_scale["fp16"].recommended_log2
    assert scale == 8
    for weight, factor, vanishes in ((1.0, 1.0, False), (1e-6, 1.0, True), (1e-6, 2.0 ** scale, False)):
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            out = model(x)
        (factor * loss_of(tuple(o.float() for o in out), y, weight)).backward()
        assert bool((model.aux.weight.grad == 0).all()) == vanishes
    assert all("numerics_changed" not in report.shadow_evidence[n]["fp16"] for n in ("trunk", "head"))
    lines = [line for line in report.summary_table().splitlines() if "numerics changed during the run" in line]
    assert len(lines) == 1 and lines[0].startswith("  aux fp16 loss_scale")
    report.save(tmp_path)
    data = json.loads((tmp_path / "report.json").read_text())
    entry = next(e for e in data["layers"] if e["name"] == "aux")
    assert entry["evidence"]["fp16"]["numerics_changed"]["from_step"] == changed["from_step"]


def test_a_layer_that_stands_out_only_early_is_judged_by_those_steps():
    """The other way round: the auxiliary loss weighs 1e-6 for the first 80 of 200 steps, then 1. Its head
    stands out before the change (real FP16 gives it no gradient then: the test above), and a static scale
    must serve the whole run, its start included: `loss_scale` at 2^8, although most steps are fine unscaled."""
    model, _, batches = task("aux_head")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    with watch(model, formats=("fp16",), shadow_every=2) as w:
        for step, (x, y) in enumerate(batches(200)):
            main, aux = model(x)
            weight = 1e-6 if step < 80 else 1.0
            loss = nn.functional.mse_loss(main, y) + weight * nn.functional.mse_loss(aux, y.flip(1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    report = w.report()
    ev = report.shadow_evidence["aux"]["fp16"]
    assert ev["numerics_changed"]["stands_out"] == "early" and ev["numerics_changed"]["from_step"] <= 100
    assert report.shadow["layers"]["aux"]["formats"]["fp16"][0]["grad_rel_error"] < ev["threshold"]  # all steps
    assert report.verdicts["aux"]["fp16"].verdict == "loss_scale"
    assert report.loss_scale["fp16"].recommended_log2 == 8


def test_a_batch_of_one_uses_the_stated_fallback_threshold():
    report = observe("aux_head", steps=4, every=2, batch=1)
    ev = report.shadow_evidence["aux"]["fp16"]
    assert ev["noise_floor"] is None and ev["threshold"] == FALLBACK_THRESHOLD
    assert any("cannot be halved" in note for note in report.run["notes"])


def test_bad_shadow_options_fail_fast():
    model = nn.Linear(2, 2)
    for bad in (0, -1, 1.5, True, "10"):
        with pytest.raises(ValueError, match="shadow_every"):
            watch(model, shadow_every=bad)
    with pytest.raises(ValueError, match="shadow_scales"):
        watch(model, shadow_every=1, shadow_scales=(8, 16))
    with pytest.raises(ValueError, match="shadow_scales"):
        watch(model, shadow_every=1, shadow_scales="x")
    with pytest.raises(ValueError, match="'emulated', 'autocast', got 'fp16'"):
        watch(model, shadow_every=1, shadow_numerics="fp16")


SCRIPT = """
import torch
from fpsim.analyze.planted import task
model, loss_fn, batches = task("aux_head")
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
for x, y in batches(12):
    loss = loss_fn(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def test_a_script_run_shadows_its_model(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    report, paths = run_script(script, out=tmp_path / "out", formats=("fp16",), shadow_every=4)
    assert report.shadow["shadowed_steps"] >= 2       # the root is found at its first forward
    assert report.verdict("AuxHead.aux", "fp16") == "loss_scale"
    assert "report.json" in paths


def test_an_amp_run_is_shadowed_as_the_same_model_in_fp32():
    """Under autocast + GradScaler the captured output gradients carry the scale: they are divided back."""
    model, loss_fn, batches = task("aux_head")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu")
    with watch(model, formats=("fp16",), shadow_every=5) as w:
        for x, y in batches(STEPS):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(x)
            loss = loss_fn(tuple(o.float() for o in out), y)
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
    report = w.report()
    assert report.shadow["shadowed_steps"] == STEPS // SHADOW_EVERY
    assert report.verdict("aux", "fp16") == "loss_scale" and report.verdict("trunk", "fp16") == "ok"
    assert report.loss_scale["fp16"].recommended_log2 == observe("aux_head").loss_scale["fp16"].recommended_log2


class FailsUnderAutocast(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        if torch.is_autocast_enabled("cpu"):
            raise RuntimeError("this model refuses autocast")
        return self.fc(x)


def test_a_failing_replay_stops_shadowing_and_never_the_run():
    torch.manual_seed(0)
    model = FailsUnderAutocast()
    reference = copy.deepcopy(model)
    for m in (reference, model):
        optimizer = torch.optim.SGD(m.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(0)
        with (watch(m, formats=("fp16",), shadow_every=1) if m is model else contextlib.nullcontext()) as w:
            for _ in range(3):
                loss = m(torch.randn(8, 4, generator=g)).square().mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    assert torch.equal(model.fc.weight, reference.fc.weight)
    report = w.report()
    # step 0 measured the noise floor only (its turn); step 1's fp16 replay failed: no layer has shadow evidence
    assert not report.shadow_evidence and report.verdict("fc", "fp16") in ("ok", "loss_scale", "fp32")
    assert any("this model refuses autocast" in note for note in report.run["notes"])


def test_the_command_line_takes_shadow_every(tmp_path, capsys):
    from fpsim import cli

    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    assert cli.main(["analyze", "--shadow-every", "4", "--formats", "fp16", "--out", str(out), "-q",
                     str(script)]) == 0
    data = json.loads((out / "report.json").read_text())
    assert data["shadow"]["every"] == 4 and data["summary"]["fp16"]["loss_scale_layers"] == ["AuxHead.aux"]
    assert "verdicts from shadow steps" in capsys.readouterr().out


def test_the_command_line_and_the_demo_shadow_every_tenth_step_unless_told_otherwise(tmp_path, capsys):
    from fpsim import cli

    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    for options, every in (([], 10), (["--shadow-every", "0"], None)):
        out = tmp_path / f"out{every}"
        assert cli.main(["analyze", *options, "--formats", "fp16", "--out", str(out), "-q", str(script)]) == 0
        shadow = json.loads((out / "report.json").read_text()).get("shadow")
        assert (shadow or {}).get("every") == every
    out = tmp_path / "demo"
    assert cli.main(["demo", "--steps", "12", "--formats", "fp16", "--out", str(out), "-q"]) == 0
    assert json.loads((out / "report.json").read_text())["shadow"]["steps"] == [0, 10]
    capsys.readouterr()
    with pytest.raises(SystemExit):
        cli.main(["analyze", "--shadow-every", "-1", str(script)])
    assert "--shadow-every" in capsys.readouterr().err


def test_sparse_gradients_are_replayed_and_measured():
    # an Embedding(sparse=True) trained by SparseAdam: its sparse gradient is compared as its dense values
    import warnings

    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(50, 8, sparse=True), nn.Flatten(), nn.Linear(32, 1))
    optimizers = [torch.optim.SparseAdam(list(model[0].parameters()), lr=1e-2),
                  torch.optim.Adam(list(model[2].parameters()), lr=1e-2)]
    g = torch.Generator().manual_seed(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with watch(model, formats=("fp16", "bf16"), shadow_every=1) as w:
            for _ in range(4):
                loss = model(torch.randint(0, 50, (16, 4), generator=g)).square().mean()
                for opt in optimizers:
                    opt.zero_grad()
                loss.backward()
                for opt in optimizers:
                    opt.step()
    assert w.shadow.error is None and w.shadow.record.count >= 3
    assert "0" in w.shadow.record.to_dict()["layers"]


class NoHalf(nn.Module):
    """A layer that cannot run under FP16 autocast (as torch's CPU LSTM has no fp16 kernel)."""

    def __init__(self):
        super().__init__()
        self.lin, self.head = nn.Linear(8, 8), nn.Linear(8, 1)

    def forward(self, x):
        if torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.float16:
            raise RuntimeError("no fp16 kernel for this layer")
        return self.head(torch.tanh(self.lin(x)))


def test_a_format_whose_replay_fails_is_dropped_and_the_others_go_on():
    torch.manual_seed(0)
    model = NoHalf()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    with pytest.warns(RuntimeWarning, match="no more shadow steps for fp16 .*no fp16 kernel"):
        with watch(model, formats=("fp16", "bf16"), shadow_every=1) as w:
            for _ in range(7):
                loss = model(torch.randn(16, 8, generator=g)).square().mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    assert w.shadow.error is None and list(w.shadow.dropped_formats) == ["fp16"]
    measured = w.shadow.record.to_dict()["layers"]["lin"]
    assert "bf16" in measured["formats"] and measured["noise_floor"] is not None
    assert any("shadow steps for fp16 stopped" in note for note in w.report().run.get("notes", []))


# ------------------------------------------------------------- spread of the means
def test_the_mean_error_carries_its_standard_error_over_the_shadowed_steps():
    import statistics

    from fpsim.analyze.shadow import Sums

    errors = [0.3, 2.3, 0.4, 1.1, 0.35]
    sums = Sums()
    for e in errors:
        sums.add({"rel_error": e, "cosine": 1.0, "zeroed_share": 0.0, "nonfinite_share": 0.0})
    means = sums.means()
    assert means["grad_rel_error"] == pytest.approx(statistics.fmean(errors))
    assert means["grad_rel_error_se"] == pytest.approx(statistics.stdev(errors) / math.sqrt(len(errors)))
    one = Sums()
    one.add({"rel_error": 0.3, "cosine": 1.0, "zeroed_share": 0.0, "nonfinite_share": 0.0})
    assert one.means()["grad_rel_error_se"] is None                  # one step: no spread to tell


def test_a_verdict_whose_mean_is_within_two_standard_errors_of_its_threshold_says_so():
    from types import SimpleNamespace

    from fpsim.analyze.evidence import judge
    from fpsim.analyze.verdicts import Verdict

    def shadow(mean, se):
        means = {"steps": 5, "nonfinite_steps": 0, "grad_rel_error": mean, "grad_rel_error_se": se,
                 "cosine": 0.9, "share_zeroed": 0.0, "share_nonfinite": 0.0}
        return {"shadowed_steps": 5, "overflow_sources": {},
                "layers": {"a": {"noise_floor": 0.9, "formats": {"bf16": {0: means}}, "windows": {}}}}

    layers = [SimpleNamespace(name="a", tied_with=())]
    counted = {"a": Verdict("ok", "counts", None)}
    for mean, se, verdict, unsettled in ((0.47, 0.2, "ok", True), (0.47, 0.01, "ok", False),
                                         (0.6, 0.2, "fp32", True), (2.3, 0.2, "fp32", False)):
        verdicts, _, evidence = judge(layers, FormatLimits.of("bf16"), shadow(mean, se), counted, None)
        assert verdicts["a"].verdict == verdict and evidence["a"]["unsettled"] is unsettled
        assert ("unsettled" in verdicts["a"].reason) is unsettled


# ------------------------------------------------------- loops without optimizer.step() before the update
def _manual_sgd(watched: bool, steps: int = 12):
    """A loop that updates the parameters by hand (PyTorch's word_language_model, makemore): zero_grad,
    forward, backward, p -= lr * p.grad."""
    model, loss_fn, batches = task("aux_head")
    w = watch(model, formats=("fp16",), shadow_every=3).attach() if watched else None
    losses = []
    for x, y in batches(steps):
        model.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.05 * p.grad
        losses.append(loss.item())
    if w is not None:
        w.close()
    return model, losses, w


def test_a_loop_that_updates_by_hand_gets_its_steps_and_shadow_steps_and_trains_unchanged():
    plain, plain_losses, _ = _manual_sgd(False)
    model, losses, w = _manual_sgd(True)
    assert losses == plain_losses
    for a, b in zip(plain.parameters(), model.parameters()):
        assert torch.equal(a, b)
    report = w.report()
    assert w.step == 12 and report.run["steps"] == 12                  # the last step too, ended at close
    assert report.layer("trunk").tensors["weight_grad"].samples == 2 * 12   # weight and bias, every step
    assert report.shadow_summary()["steps"] == [3, 6, 9]              # step 0 shows the loop's kind; then every 3rd
    assert report.verdict("aux", "fp16") == "loss_scale"               # as with an optimizer (test above)


def test_a_closure_is_replayed_once_per_step_at_its_first_backward():
    def run(watched):
        model, loss_fn, batches = task("aux_head")
        optimizer = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=3)
        w = watch(model, formats=("fp16",), shadow_every=2).attach() if watched else None
        for x, y in batches(6):
            def closure():
                optimizer.zero_grad()
                loss = loss_fn(model(x), y)
                loss.backward()
                return loss
            optimizer.step(closure)
        if w is not None:
            w.close()
        return model, w

    (plain, _), (model, w) = run(False), run(True)
    for a, b in zip(plain.parameters(), model.parameters()):
        assert torch.equal(a, b)
    assert w.shadow.record.steps == [0, 2, 4]      # three closure calls per step, one replay each shadowed step
