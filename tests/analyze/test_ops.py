"""Op-level observation (fpsim.trace) on real runs, in the precision the run really uses.

Sources of truth: torch itself (real CPU autocast FP16 turns the planted products into Inf/NaN; a real
torch.amp.GradScaler's scale and skipped steps; an unwatched run's parameters and RNG state, bit for bit),
an independent numpy count of the same tensors (analyze_helpers.numpy_count), and the FP32 run of the same
model for the AMP run's verdicts.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from torch import nn

import fpsim
from fpsim.analyze.gpt import GPT, GPTConfig, token_batches
from fpsim.trace import Site, Tracer

from analyze_helpers import assert_same, numpy_count


class Scaled(nn.Module):
    """A module whose own forward multiplies a Linear's output by 3e5: beyond FP16 inside, fine at its output."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return torch.tanh(self.lin(x) * 3e5)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = Scaled()
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.attn(x))


def sgd_steps(model, steps: int, amp: bool = False, seed: int = 0):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x, y = torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)
        with torch.autocast("cpu", dtype=torch.float16, enabled=amp):
            loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return loss


def test_an_op_inside_a_module_that_overflows_fp16_is_a_finding():
    torch.manual_seed(0)
    model = Net()
    with torch.autocast("cpu", dtype=torch.float16):                     # real FP16: the product overflows
        product = model.attn.lin(torch.randn(16, 8)) * 3e5
    assert torch.isinf(product).any()
    with fpsim.watch(model, formats=("fp16", "bf16")) as w:
        sgd_steps(model, 3)
    report = w.report()
    assert report.verdict("attn.lin", "fp16") == "ok"                   # no module output overflows ...
    assert report.verdict("attn:mul", "fp16") == "fp32"                 # ... the op inside does
    assert report.verdict("attn:mul", "bf16") == "ok"
    assert "overflow" in report.verdicts["attn:mul"]["fp16"].reason
    assert "attn:mul" in [layer.name for layer in report.findings]
    data = report.to_dict()
    entry = next(e for e in data["layers"] if e["name"] == "attn:mul")
    assert entry["entry"] == "op" and entry["module"] == "attn" and entry["verdicts"]["fp16"] == "fp32"
    assert "attn:mul" in data["summary"]["fp16"]["op_findings"]
    assert "attn:mul" in report.summary_table()
    # the GradScaler replay, of the gradients, says that it holds with the overflowing op kept in FP32
    assert "attn:mul" in report.gradscaler["fp16"].forward_overflows
    assert "attn:mul" in data["gradscaler"]["fp16"]["forward_overflows"]
    assert "attn.lin" not in report.gradscaler["fp16"].forward_overflows  # its module's output does not overflow
    assert "kept in FP32: their forward values overflow fp16" in report.summary_table()


class Encoder(nn.Module):
    """A TransformerEncoderLayer (CPU flash attention) whose queries and keys are scaled up 300 times."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Linear(8, 32)
        self.enc = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.head = nn.Linear(32, 3)
        with torch.no_grad():
            self.enc.self_attn.in_proj_weight[:64] *= 300

    def forward(self, x):
        return self.head(self.enc(self.emb(x)).mean(1))


def test_a_fused_kernels_float32_statistics_are_not_judged_as_fp16_activations():
    # CPU flash attention returns its output and a float32 log-sum-exp of the logits (here beyond 65504):
    # real FP16 autocast keeps that statistic in FP32 and trains with finite values, so the op is not
    # judged fp32 for FP16; its output is counted (amax below the statistic's)
    torch.manual_seed(0)
    model = Encoder()
    x, y = torch.randn(16, 11, 8), torch.randint(0, 3, (16,))
    with torch.no_grad():
        attn = model.enc.self_attn
        qkv = nn.functional.linear(model.emb(x), attn.in_proj_weight, attn.in_proj_bias)
        q, k = (t.reshape(16, 11, 4, 8).transpose(1, 2) for t in qkv.split(32, dim=-1)[:2])
        assert (q @ k.transpose(-1, -2) / 8 ** 0.5).logsumexp(-1).abs().max() > 65504
    with torch.autocast("cpu", dtype=torch.float16):
        loss = nn.functional.cross_entropy(model(x), y)
        q = torch.randn(2, 4, 11, 8, dtype=torch.float16)
        out, logsumexp = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, q, q)[:2]
    assert out.dtype == torch.float16 and logsumexp.dtype == torch.float32
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters())
    model.zero_grad()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with fpsim.watch(model, formats=("fp16", "bf16")) as w:
        for _ in range(2):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    report = w.report()
    site = "enc.self_attn:_scaled_dot_product_flash_attention_for_cpu"
    assert report.verdict(site, "fp16") != "fp32"
    assert report.layer(site).tensors["activation"].amax < 65504


class MaskedAttention(nn.Module):
    """Causal attention masked as transformers masks it: scores filled with torch.finfo(their dtype).min."""

    def __init__(self, gain: float):
        super().__init__()
        self.q, self.k, self.v, self.head = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 3)
        self.gain = gain

    def forward(self, x):
        scores = self.q(x) @ self.k(x).transpose(-1, -2) * self.gain
        future = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).triu(1)
        scores = scores.masked_fill(future, torch.finfo(scores.dtype).min)
        return self.head((scores.softmax(-1) @ self.v(x)).mean(1))


def masked_attention_run(gain: float, amp: bool):
    """(losses, report or None) of 4 SGD steps; watched in FP32, or trained for real under CPU FP16 autocast."""
    torch.manual_seed(0)
    model = MaskedAttention(gain)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    losses = []
    with fpsim.watch(model, formats=("fp16",)) if not amp else contextlib.nullcontext() as w:
        for _ in range(4):
            x, y = torch.randn(16, 6, 8, generator=g), torch.randint(0, 3, (16,), generator=g)
            with torch.autocast("cpu", dtype=torch.float16, enabled=amp):
                loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses, None if amp else w.report()


def test_a_mask_of_float32s_min_is_no_fp16_overflow_and_a_real_one_still_is():
    # real FP16 autocast: with gain 1 the masked scores train finite (and as FP32 does); with gain 3e4 the
    # scores overflow and the loss is NaN. The FP32 run's masks hold -3.4e38 (finfo(float32).min), which is
    # no overflow; the scores beyond 65504 are
    fp16_losses, _ = masked_attention_run(1.0, amp=True)
    fp32_losses, report = masked_attention_run(1.0, amp=False)
    assert all(np.isfinite(fp16_losses)) and np.allclose(fp16_losses, fp32_losses, rtol=1e-2)
    assert report.layer("MaskedAttention:masked_fill").tensors["activation"].amax == float(torch.finfo().max)
    assert report.verdict("MaskedAttention:masked_fill", "fp16") == "ok"
    assert not report.findings
    fp16_losses, _ = masked_attention_run(3e4, amp=True)
    _, report = masked_attention_run(3e4, amp=False)
    assert not all(np.isfinite(fp16_losses))
    assert report.verdict("MaskedAttention:masked_fill", "fp16") == "fp32"
    assert "MaskedAttention:masked_fill" in [op.name for op in report.findings]


def test_op_outputs_are_counted_exactly_forward_and_backward():
    torch.manual_seed(0)
    model = Net()
    kept = {"out": [], "grad": []}

    class Keep(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten.mul.Tensor and torch._C._current_autograd_node() is None:
                kept["out"].append(out.detach().clone())
            return out

    with fpsim.watch(model, formats=("fp16",)) as w:
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))
        with Keep():
            out = model(x)
        out.grad_fn.register_prehook(lambda g: None)
        loss = nn.functional.cross_entropy(out, y)
        loss.backward()
        opt.step()
    stats = w.report().layer("attn:mul").tensors
    assert_same(stats["activation"].hist, numpy_count(torch.cat([k.reshape(-1) for k in kept["out"]]).numpy()))
    assert stats["activation_grad"].samples == 1


class Projections(nn.Module):
    """A Linear on 3-D input (addmm, then a view that alone consumes addmm's output), an in-place ReLU on a
    counted op output, and an op on data that needs no gradient (it makes no autograd node)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.act = nn.ReLU(inplace=True)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        h = self.lin(x)
        self.h = h
        noise = torch.randn(h.shape, generator=torch.Generator().manual_seed(1)).exp()  # (no autograd node)
        hidden = self.act(h * 1.0)
        return self.head(hidden * noise).mean(1)


def test_views_in_place_ops_and_ops_without_a_node_are_counted_exactly():
    # against the tensors themselves, read by hooks of the test: the gradient of the Linear's output reaches
    # addmm through the view (a transformer's every projection); ReLU(inplace=True) counts its own output,
    # not the counts of the product it overwrote; randn and exp, which make no autograd node, get no gradient
    torch.manual_seed(0)
    model = Projections()
    kept = {"h_grad": [], "relu": []}
    model.act.register_forward_hook(lambda m, i, out: kept["relu"].append(out.detach().clone()))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(0)
    with fpsim.watch(model, formats=("fp16",)) as w:
        for _ in range(2):
            x, y = torch.randn(4, 5, 8, generator=g), torch.randint(0, 3, (4,), generator=g)
            out = model(x)
            model.h.register_hook(lambda grad: kept["h_grad"].append(grad.detach().clone()))
            loss = nn.functional.cross_entropy(out, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    report = w.report()
    addmm = report.layer("lin:addmm").tensors["activation_grad"]
    assert addmm.samples == 2
    assert_same(addmm.hist, numpy_count(torch.cat([k.reshape(-1) for k in kept["h_grad"]]).numpy()))
    relu = report.layer("act:relu_").tensors["activation"]
    assert relu.hist.zeros > 0
    assert_same(relu.hist, numpy_count(torch.cat([k.reshape(-1) for k in kept["relu"]]).numpy()))
    for no_node in ("Projections:randn", "Projections:exp"):      # (after the view's node: no longer taken for theirs)
        assert "activation_grad" not in report.layer(no_node).tensors


def test_the_tracer_hands_every_op_to_its_client_with_its_module():
    seen = []

    class Client:
        def forward_op(self, site, outputs):
            seen.append(("forward", site.name, outputs[0].dtype))

        def backward_op(self, site, outputs):
            seen.append(("backward", site.name))

        def module_output(self, name, module, output):
            seen.append(("module", name))

    torch.manual_seed(0)
    model = Net()
    tracer = Tracer(Client())
    tracer.names.add_root(model, "Net")
    tracer.attach()
    tracer.intercept(True)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(torch.randn(4, 8)).float().sum().backward()
    finally:
        tracer.close()
    forward = [s for s in seen if s[0] == "forward"]
    assert ("forward", "Net.attn:mul", torch.bfloat16) in forward       # the dtype autocast ran it in
    assert ("forward", "Net.attn.lin:addmm", torch.bfloat16) in forward
    assert ("backward", "Net.attn:tanh") in seen                          # tanh's backward, by its forward site
    assert ("module", "Net.attn") in seen
    assert Site("Net", "mul").name == "Net:mul"
    n = len(seen)
    model(torch.randn(4, 8)).sum().backward()                             # closed: nothing more arrives
    assert len(seen) == n


def test_an_amp_run_is_judged_as_the_same_model_in_fp32():
    cfg = GPTConfig(n_layer=1, n_embd=32, n_head=2, block_size=16)

    def run(amp: bool):
        torch.manual_seed(0)
        model = GPT(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        scaler = torch.amp.GradScaler("cpu", enabled=amp)
        skipped_by_torch = 0
        with fpsim.watch(model, formats=("fp16", "bf16")) as w:
            for x, y in token_batches(cfg, 4, 6):
                with torch.autocast("cpu", dtype=torch.float16, enabled=amp):
                    _, loss = model(x, y)
                opt.zero_grad()
                scaler.scale(loss).backward()
                before = scaler.get_scale() if amp else None
                scaler.step(opt)
                scaler.update()
                skipped_by_torch += int(amp and scaler.get_scale() < before)
        return w.report(), skipped_by_torch

    fp32, _ = run(False)
    amp, skipped = run(True)
    modules = [layer.name for layer in fp32.layers if not layer.is_op]
    assert modules == [layer.name for layer in amp.layers if not layer.is_op]
    for name in modules:
        assert amp.verdicts[name]["fp16"].verdict == fp32.verdicts[name]["fp16"].verdict, name
    # the gradients were divided by the real scaler's 2^16: their magnitudes are FP32's, not 2^16 larger
    g32, g16 = (r.layer("h.0.mlp.c_fc").tensors["activation_grad"].amax for r in (fp32, amp))
    assert abs(np.log2(g16 / g32)) < 0.1
    precision = amp.run["precision"]
    assert precision["autocast"] == {"cpu": "float16"} and precision["op_outputs_by_dtype"]["float16"] > 0
    scaler = precision["grad_scalers"][0]
    assert scaler["steps"] == 6 and scaler["skipped_steps"] == skipped and scaler["trajectory"][0] == [0, 65536.0]
    assert amp.run["steps"] == fp32.run["steps"] == 6
    assert "float16" in amp.layer("h.0.attn:mul").dtypes
    assert "GradScaler (the run's own): 6 steps" in amp.summary_table()
    assert fp32.run["precision"]["grad_scalers"] == [] and fp32.run["precision"]["autocast"] == {}


def test_steps_the_real_scaler_skips_are_steps_and_are_recorded():
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**40)             # overflows FP16 gradients at first
    scales = []
    with fpsim.watch(model, formats=("fp16",)) as w:
        for _ in range(5):
            with torch.autocast("cpu", dtype=torch.float16):
                loss = nn.functional.cross_entropy(model(torch.randn(16, 8)), torch.randint(0, 3, (16,)))
            opt.zero_grad()
            scales.append(scaler.get_scale())
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    record = w.report().run["precision"]["grad_scalers"][0]
    torch_skipped = sum(1 for a, b in zip(scales, scales[1:] + [scaler.get_scale()]) if b < a)
    assert torch_skipped > 0 and record["skipped_steps"] == torch_skipped
    assert w.step == 5
    assert [s for _, s in record["trajectory"]] == sorted(set(scales), reverse=True)


def state(model):
    return [p.detach().clone() for p in model.parameters()], torch.get_rng_state()


@pytest.mark.parametrize("amp", [False, True])
def test_watching_changes_nothing_with_dropout_and_autocast(amp):
    cfg = GPTConfig(n_layer=1, n_embd=32, n_head=2, block_size=16, dropout=0.1)

    def run(watched: bool):
        torch.manual_seed(0)
        model = GPT(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        scaler = torch.amp.GradScaler("cpu", enabled=amp)

        def loop():
            for x, y in token_batches(cfg, 4, 4):
                with torch.autocast("cpu", dtype=torch.float16, enabled=amp):
                    _, loss = model(x, y)
                opt.zero_grad()
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
        if watched:
            with fpsim.watch(model):
                loop()
        else:
            loop()
        return state(model)

    (plain, rng_plain), (watched, rng_watched) = run(False), run(True)
    assert all(torch.equal(a, b) for a, b in zip(plain, watched))
    assert torch.equal(rng_plain, rng_watched)


def test_compiled_model_is_observed_without_changing_it():
    def run(watched: bool):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))
        compiled = torch.compile(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(0)

        def loop():
            for _ in range(3):
                loss = compiled(torch.randn(8, 8, generator=g)).square().mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
        if watched:
            with pytest.warns(UserWarning, match="global hooks"), fpsim.watch(compiled) as w:
                loop()
            return state(model)[0], w.report()
        loop()
        return state(model)[0], None

    (plain, _), (watched, report) = run(False), run(True)
    assert all(torch.equal(a, b) for a, b in zip(plain, watched))   # compiled code stays compiled, bit for bit
    assert report.run["steps"] == 3
    assert report.layer("0").tensors["weight"].samples == 3          # parameters through the optimizer
    assert any("torch.compile" in note for note in report.run["notes"])


def test_torchscript_submodule_gets_a_note_and_no_hooks():
    torch.manual_seed(0)
    model = nn.Sequential(torch.jit.script(nn.Sequential(nn.Linear(8, 8), nn.ReLU())), nn.Linear(8, 3))
    with fpsim.watch(model) as w:
        sgd = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            loss = model(torch.randn(4, 8)).square().mean()
            sgd.zero_grad()
            loss.backward()
            sgd.step()
    report = w.report()
    assert any("TorchScript" in note and "0" in note for note in report.run["notes"])
    assert "0:addmm" in [op.name for op in report.ops]                  # its ops, under the scripted module
    assert not torch.nn.modules.module._global_forward_hooks           # nothing left behind
    scripted = torch.jit.script(nn.Linear(4, 2))
    with fpsim.watch(scripted) as w:                                  # watching a scripted model itself works
        scripted(torch.randn(2, 4)).sum().backward()
        w.advance()
    assert w.report().run["steps"] == 1


def test_closure_optimizers_record_the_current_steps_gradients():
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    used = []
    opt.register_step_post_hook(lambda o, a, k: used.append(model.weight.grad.detach().clone()))
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(8, 4, generator=g) * 10 ** i, torch.randn(8, 1, generator=g)) for i in range(3)]
    with fpsim.watch(model, formats=("fp16",)) as w:
        for x, y in batches:
            def closure():
                opt.zero_grad()
                loss = (model(x) - y).square().mean()
                loss.backward()
                return loss
            opt.step(closure)
    stats = w.report().layer("Linear").tensors
    assert w.step == 3 and stats["weight_grad"].samples == 6          # weight and bias, 3 steps
    grads = np.concatenate([u.numpy().ravel() for u in used])
    # the last step's gradients (inputs x100) are in the counts: read after the closure ran, not before
    assert stats["weight_grad"].amax >= np.abs(grads).max()
    assert stats["optimizer_grad"].samples == 6 and stats["optimizer_grad"].amax >= np.abs(grads).max()


def test_clipping_and_unscaling_come_after_the_weight_gradients_backward_produced():
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    raw = []
    model.weight.register_hook(lambda g: raw.append(g.detach().clone()))
    with fpsim.watch(model, formats=("fp16",)) as w:
        for _ in range(2):
            loss = model(torch.randn(8, 4) * 100).square().mean()
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
            opt.step()
    stats = w.report().layer("Linear").tensors
    assert stats["weight_grad"].amax >= max(g.abs().max().item() for g in raw)       # before clipping
    assert stats["optimizer_grad"].amax <= 1e-3                                     # as the optimizer used them


class ReturnsItsParameter(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(4))

    def forward(self):
        return self.scale


def test_a_module_returning_its_parameter_gets_no_hook_on_it():
    module = ReturnsItsParameter()
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    with fpsim.watch(module, modules="all") as w:
        for _ in range(50):
            loss = (module() * torch.arange(4.0)).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
        hooks = len(module.scale._backward_hooks or {})
    assert hooks <= 1                                     # the one weight-gradient hook, not one per step
    assert not module.scale._backward_hooks               # removed at close
    assert w.report().layer("ReturnsItsParameter").tensors["weight_grad"].samples == 50


class Table(nn.Module):
    """Returns the same non-leaf tensor every step: a table computed once from its parameter."""

    def __init__(self):
        super().__init__()
        self.p = nn.Parameter(torch.randn(4, 4))
        self.cache = None

    def forward(self):
        if self.cache is None:
            self.cache = self.p * 2
        return self.cache


@pytest.mark.parametrize("shadow_every", [None, 2])
def test_a_module_output_returned_every_step_gets_one_hook_and_none_after(shadow_every):
    # one gradient per backward (torch's own count: 10 backward passes; a shadow replay's backwards through the
    # kept tensor are not the run's), one hook on the tensor whatever the steps, none left after the block
    torch.manual_seed(0)
    model = Table()
    model()                                     # the table exists before the watch
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with fpsim.watch(model, formats=("fp16",), shadow_every=shadow_every) as w:
        for _ in range(10):
            loss = model().sum()
            opt.zero_grad()
            loss.backward(retain_graph=True)
            opt.step()
            assert len(model.cache._backward_hooks or {}) <= 1
    assert not model.cache._backward_hooks
    assert w.report().layer("Table").tensors["activation_grad"].samples == 10


def test_a_loss_module_made_every_step_is_one_root():
    from fpsim.analyze.hooks import Watcher

    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Watcher(None, ("fp16",)) as w:
        for _ in range(30):
            loss = nn.CrossEntropyLoss()(model(torch.randn(8, 4)), torch.randint(0, 3, (8,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
    report = w.report()
    roots = {op.module.split(".")[0].split(":")[0] for op in report.ops}
    assert roots == {"Linear", "CrossEntropyLoss"}
    assert len(w._store.keys) < 20                         # records do not grow with the steps


def test_five_hundred_small_layers_cost_linear_time():
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(500)])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with fpsim.watch(model, formats=("fp16",)) as w:
        for _ in range(2):
            loss = model(torch.randn(2, 4)).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
    report = w.report()
    assert len([layer for layer in report.layers if not layer.is_op]) == 500
    assert report.layer("499").tensors["activation"].samples == 2
    assert w._store.raw.shape[0] < 2 * len(w._store.keys) + 16   # tables grow by doubling, not a cat per record


AMP_SCRIPT = """
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0**{init})
used = []
for _ in range(6):
    with torch.autocast("cpu", dtype=torch.float16):
        loss = nn.functional.cross_entropy(model(torch.randn(16, 8)), torch.randint(0, 3, (16,)))
    opt.zero_grad()
    used.append(scaler.get_scale())
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
"""


@pytest.mark.parametrize("init", [16, 40])     # 2^40: the real scaler skips its first steps
def test_a_run_stopped_after_n_steps_records_the_scalers_last_step(tmp_path, init):
    from fpsim.analyze.runner import run_script

    script = tmp_path / "amp.py"
    script.write_text(AMP_SCRIPT.format(init=init))
    unobserved = {}
    exec(compile(AMP_SCRIPT.format(init=init).replace("range(6)", "range(3)"), "amp", "exec"), unobserved)
    used = unobserved["used"] + [unobserved["scaler"].get_scale()]         # the scale of each step, and after
    torch_skipped = [step for step in range(3) if used[step + 1] < used[step]]
    report, _ = run_script(script, steps=3, out=tmp_path / "out", formats=("fp16",))
    record = report.run["precision"]["grad_scalers"][0]
    assert report.run["steps"] == 3
    assert record["steps"] == 3 and record["skipped"] == torch_skipped
    assert [s for _, s in record["trajectory"]] == sorted(set(used[:3]), reverse=True)


class ViewThenWrite(nn.Module):
    """A Linear whose output is written in place (through a view) after it was counted, then handed on by a
    block: the counts of a tensor seen again are reused only while its values are unchanged."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.block = nn.Identity()

    def forward(self, x):
        h = self.lin(x)                     # addmm on (16 * 2, 8), viewed as (16, 2, 8)
        flat = h.reshape(-1)
        flat.mul_(3.0)                      # written through a view: h's values change after addmm was counted
        return self.block(h) + 0.0


def test_a_tensor_seen_again_reuses_its_counts_only_while_its_values_are_unchanged():
    torch.manual_seed(0)
    model = ViewThenWrite()
    x = torch.randn(16, 2, 8) * 1e-3
    with torch.no_grad():
        h = model.lin(x)
    with fpsim.watch(model, formats=("fp16",), modules="all") as w:
        model(x).sum().backward()
    report = w.report()
    addmm = report.layer("lin:addmm").tensors["activation"]
    assert_same(addmm.hist, numpy_count(h.numpy()))                     # counted before the write
    block = report.layer("block").tensors["activation"]
    assert_same(block.hist, numpy_count((h * 3.0).numpy()))              # after it: counted again, not reused
    lin = report.layer("lin").tensors["activation"]
    assert_same(lin.hist, numpy_count(h.numpy()))                        # the Linear's output, before the write


class ViewOut(nn.Module):
    """A Linear on 3-D input (its output a view of addmm's), then an in-place add on that output."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        self.seen = y.detach().clone()
        return y.add_(0.5)


def test_a_view_over_a_counted_op_output_is_counted_once_and_exactly(monkeypatch):
    """The Linear's record gets its output's exact counts from addmm's pass over the same memory (no second
    pass); after an in-place write through the view, the model's output is counted afresh."""
    from fpsim.analyze.store import Store

    passes = []
    count_into = Store.count_into

    def counting(self, row, address, n, *args):
        passes.append((row, address))
        return count_into(self, row, address, n, *args)

    monkeypatch.setattr(Store, "count_into", counting)
    torch.manual_seed(0)
    model = ViewOut()
    x = torch.randn(4, 5, 8)
    with fpsim.watch(model, formats=("fp16",), modules="all") as w:
        out = model(x)
        out.sum().backward()
    report = w.report()
    lin, root = report.layer("lin").tensors["activation"], report.layer("ViewOut").tensors["activation"]
    assert_same(lin.hist, numpy_count(model.seen.numpy()))
    assert_same(root.hist, numpy_count(out.detach().numpy()))
    assert_same(report.layer("lin:addmm").tensors["activation"].hist, numpy_count(model.seen.numpy()))
    rows = {w._store.index["activation"][name]: name for name in ("lin", "lin:addmm", "ViewOut")}
    read = [rows[row] for row, _ in passes if row in rows]
    assert read.count("lin:addmm") == 1 and "lin" not in read and read.count("ViewOut") == 1


def test_an_op_outside_the_shared_window_says_on_which_side_of_the_recommended_scale():
    # attention logits planted 1e6 times too large: the mul's gradients need a larger loss scale than the one
    # the layers share; the reason states where, and the numbers it quotes must say so
    import re

    from fpsim.analyze.gpt import GPT, GPTConfig, token_batches

    cfg = GPTConfig(n_layer=1, n_embd=16, n_head=2, block_size=8, vocab_size=16, logit_gain=1e6)
    torch.manual_seed(0)
    model = GPT(cfg)
    batches = token_batches(cfg, 4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with fpsim.watch(model, formats=("fp16",)) as w:
        for _ in range(3):
            x, y = next(batches)
            loss = nn.functional.cross_entropy(model(x).reshape(-1, cfg.vocab_size), y.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
    report = w.report()
    reason = report.verdicts["h.0.attn:mul"]["fp16"].reason
    found = re.search(r"needs a loss scale in 2\^(-?\d+)\.\.2\^(-?\d+), above the recommended 2\^(-?\d+)", reason)
    assert found, reason
    low, high, recommended = map(int, found.groups())
    assert recommended < low <= high and recommended == report.loss_scale["fp16"].recommended_log2
