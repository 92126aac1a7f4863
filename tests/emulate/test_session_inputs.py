"""fpsim.emulate on the inputs and outputs real models pass between modules, on layers their owner multiplies by
itself, on parameters that start taking gradients inside the block, and on module names that hold a colon.

Sources of truth: real torch.autocast on the CPU written by hand for each option (a kept module: autocast off
and its floating inputs cast to float32; a module of `layers`: autocast around it and its floating outputs cast
back to float32), on inputs made of few bits (multiples of 1/4 and 1/8), so that every float32 sum of their
GEMMs is exact and the CPU's bf16 kernels and the emulation agree bit for bit where the GEMMs run in bf16; the
same model run without fpsim.emulate (FP32), and its FP32 gradients without a loss scale; torch's own
nn.MultiheadAttention, whose forward hands out_proj.weight to F.multi_head_attention_forward and never calls
out_proj (torch/nn/modules/activation.py); the report.json schema of docs/analyzer.md.
"""

from __future__ import annotations

import collections
import json

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence

import fpsim

BF16 = torch.bfloat16


def _autocast(enabled: bool = True):
    return torch.autocast("cpu", dtype=BF16, enabled=enabled, cache_enabled=False)


def _few_bits(module: nn.Module, step: float = 1 / 8) -> nn.Module:
    """module with every parameter rounded to a multiple of `step` (exact in bf16, few bits)."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_((p / step).round() * step)
    return module


def _twins(make):
    torch.manual_seed(0)
    first = make()
    torch.manual_seed(0)
    return first, make()


# ------------------------------------------------------------- namedtuples, PackedSequence, ModelOutput
class _Packed(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.rnn = nn.LSTM(4, 6, batch_first=True)

    def forward(self, x, lengths):
        packed = pack_padded_sequence(self.proj(x), lengths, batch_first=True, enforce_sorted=False)
        out, (h, _) = self.rnn(packed)
        return out, h


def _packed_inputs():
    g = torch.Generator().manual_seed(1)
    return torch.randint(-4, 5, (3, 5, 4), generator=g) / 4, torch.tensor([5, 2, 4])


def _packed_loss(out, h):
    return out.data.float().square().sum() + h.float().sum()


def _as_fp32(packed):
    return packed._replace(data=packed.data.float())


@pytest.mark.parametrize("option", [{"keep": [nn.LSTM]}, {"keep": ["rnn"]}, {"layers": ["rnn"]}])
def test_a_packed_sequence_reaches_and_leaves_an_lstm_as_with_real_autocast(option):
    """The LSTM kept in FP32 takes the PackedSequence with its data cast to float32, its batch sizes and
    indices as they were; run alone in bf16 (layers), its output PackedSequence comes back in float32."""
    emu, ref = _twins(lambda: _few_bits(_Packed()))
    x, lengths = _packed_inputs()
    if "keep" in option:
        with _autocast():
            packed = pack_padded_sequence(ref.proj(x), lengths, batch_first=True, enforce_sorted=False)
            with _autocast(False):
                want_out, (want_h, _) = ref.rnn(_as_fp32(packed))
    else:
        packed = pack_padded_sequence(ref.proj(x), lengths, batch_first=True, enforce_sorted=False)
        with _autocast():
            want_out, (want_h, _) = ref.rnn(packed)
        want_out, want_h = _as_fp32(want_out), want_h.float()
    _packed_loss(want_out, want_h).backward()
    with fpsim.emulate(emu, "bf16", policy="cpu", **option):
        out, h = emu(x, lengths)
        _packed_loss(out, h).backward()
    assert type(out) is PackedSequence and out.data.dtype == torch.float32 and h.dtype == torch.float32
    assert torch.equal(out.batch_sizes, want_out.batch_sizes) and torch.equal(out.unsorted_indices,
                                                                              want_out.unsorted_indices)
    assert torch.equal(out.data, want_out.data) and torch.equal(h, want_h)
    for (name, p), q in zip(emu.named_parameters(), ref.parameters()):
        # (the proj wgrad sums bf16 gradients of many bits: equal up to its FP32 summation order, 1 bf16 ulp)
        torch.testing.assert_close(p.grad, q.grad, rtol=2.0 ** -7, atol=1e-6, msg=name)


_Pair = collections.namedtuple("_Pair", "values steps")


class _Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, pair):
        return _Pair(self.lin(pair.values), pair.steps)


class _Top(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.head = _Head()

    def forward(self, x, steps):
        return self.head(_Pair(self.body(x), steps))


@pytest.mark.parametrize("option", ["keep", "layers"])
def test_a_namedtuple_in_and_out_of_a_kept_or_emulated_module_keeps_its_type(option):
    emu, ref = _twins(lambda: _few_bits(_Top()))
    x, steps = torch.arange(-8, 8).reshape(4, 4) / 4, torch.tensor([3, 1])
    if option == "keep":
        with _autocast():
            body = ref.body(x)
            with _autocast(False):
                want = ref.head(_Pair(body.float(), steps))
    else:
        with _autocast():
            want = ref.head(_Pair(ref.body(x), steps))
        want = want._replace(values=want.values.float())
    with fpsim.emulate(emu, "bf16", policy="cpu", **{option: ["head"]}):
        got = emu(x, steps)
    assert type(got) is _Pair and got.steps is steps
    assert got.values.dtype == torch.float32 and torch.equal(got.values, want.values)


class _Tagged(dict):
    """A dict subclass torch's pytree does not know."""


class _Rows(list):
    """A list subclass torch's pytree does not know."""


class _Odd(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        return _Tagged(y=y, rows=_Rows([y, 2 * y]), index=torch.tensor([1]))


def test_other_dict_and_list_subclasses_keep_their_type():
    emu, ref = _twins(lambda: _few_bits(_Odd()))
    x = torch.arange(-8, 8).reshape(4, 4) / 4
    with _autocast():
        want = ref.lin(x).float()
    with fpsim.emulate(emu, "bf16", policy="cpu", layers=["_Odd"]) as em:   # (the model itself)
        got = emu(x)
    assert em.selection.layers == {""}
    assert type(got) is _Tagged and type(got["rows"]) is _Rows and got["index"].dtype == torch.int64
    assert torch.equal(got["y"], want) and torch.equal(got["rows"][0], want) and got["rows"][1].dtype == torch.float32


def test_a_transformers_model_output_of_an_emulated_submodule_stays_a_model_output():
    """GPT-2 with only its transformer emulated: the submodule's BaseModelOutputWithPastAndCrossAttentions comes
    back as one (the LM head reads .last_hidden_state), float32, as the same code under real CPU autocast
    gives it, within the GEMMs' FP32 summation order (docs/emulate.md); much closer than FP32."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                     attn_implementation="eager")   # (no fused kernel: docs/emulate.md, limits)
    emu, ref = _twins(lambda: transformers.GPT2LMHeadModel(config))
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        fp32 = ref(input_ids=ids).logits
        with _autocast():
            hidden = ref.transformer(input_ids=ids)
        want = ref.lm_head(hidden.last_hidden_state.float())
        with fpsim.emulate(emu, "bf16", policy="cpu", layers=["transformer"]):
            out = emu.transformer(input_ids=ids)
            got = emu(input_ids=ids).logits
    assert type(out) is type(hidden) and out.last_hidden_state.dtype == torch.float32
    assert got.dtype == torch.float32
    assert (got - want).norm() <= 1e-3 * want.norm()
    assert (got - want).norm() <= 0.1 * (fp32 - want).norm()


# ------------------------------------------------------------------------------ FP8 layers that never run
def test_multihead_attentions_out_proj_is_no_fp8_layer_and_a_note_says_why():
    """F.multi_head_attention_forward multiplies by out_proj.weight itself: as with TransformerEngine's te.Linear
    in its place, that product runs in the base format (bf16), so the attention equals real CPU bf16 autocast's,
    and out_proj is not listed as an FP8 layer; linear1 and linear2 are, and ran in FP8."""
    layer, ref = _twins(lambda: nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True))
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(3))
    with _autocast():
        want, _ = ref.self_attn(x, x, x)     # (need_weights: no fused attention kernel)
    with fpsim.emulate(layer, "fp8", policy="cpu") as em:
        for _ in range(2):
            attention, _ = layer.self_attn(x, x, x)
            layer(x).float().sum().backward()
    assert set(em.fp8_layers) == {"linear1", "linear2"} == set(em.summary()["fp8_layers"])
    assert all(len(state.history) == 2 for fp8 in em.fp8_layers.values()
               for state in (fp8.input, fp8.weight, fp8.grad_output))
    (note,) = em.notes
    assert note.startswith("not FP8 layers, run in bf16: self_attn.out_proj") and "multi_head_attention" in note
    assert (attention.float() - want.float()).norm() <= 1e-3 * want.float().norm()


class _Functional(nn.Module):
    """A layer whose weight its owner multiplies itself (F.linear outside proj's forward)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(nn.functional.linear(x, self.proj.weight, self.proj.bias))


def test_fp8_layers_that_ran_no_fp8_product_are_named_in_the_notes():
    torch.manual_seed(0)
    model = _Functional()
    with fpsim.emulate(model, "fp8") as em:
        model(torch.randn(3, 4)).float().sum().backward()
    assert len(em.fp8_layers["head"].input.history) == 1 and not em.fp8_layers["proj"].input.history
    (note,) = em.notes
    assert note.startswith("FP8 layers that ran no FP8 product in the block") and note.endswith(": proj")


# --------------------------------------------------------------------- loss scale: every gradient, once
def _mlp(first=None):
    return nn.Sequential(first or nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))


def _regression():
    g = torch.Generator().manual_seed(4)
    return torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)


def _relative_distances(model, reference, factor=1.0):
    return {name: ((p.grad - factor * q.grad).norm() / (factor * q.grad).norm()).item()
            for (name, p), q in zip(model.named_parameters(), reference.parameters())}


def test_a_layer_unfrozen_inside_the_block_has_its_gradient_unscaled():
    """Progressive unfreezing: the first layer, frozen when the block starts, is unfrozen after one step; its
    gradient is then as far from the FP32 gradient (no loss scale) as the other layers' are, over two
    accumulated backward passes (each unscaled once), not 1024 times it."""
    model, reference = _twins(_mlp)
    x, y = _regression()
    nn.functional.mse_loss(reference(x), y).backward()
    model[0].requires_grad_(False)
    with fpsim.emulate(model, "fp16", loss_scale=1024.0):
        nn.functional.mse_loss(model(x), y).backward()
        assert model[0].weight.grad is None
        model[0].requires_grad_(True)
        model.zero_grad()
        for _ in range(2):
            nn.functional.mse_loss(model(x), y).backward()
    distances = _relative_distances(model, reference, factor=2.0)
    others = max(d for name, d in distances.items() if not name.startswith("0."))
    assert max(distances["0.weight"], distances["0.bias"]) <= 2 * others <= 1e-2, distances
    assert all(not p._backward_hooks for p in model.parameters())


def test_a_lazy_module_takes_a_loss_scale():
    """nn.LazyLinear's parameters are materialised by the first forward, inside the block: their gradients are
    unscaled as every other's, within fp16's rounding of the FP32 gradient without a loss scale."""
    model, reference = _twins(lambda: _mlp(nn.LazyLinear(8)))
    x, y = _regression()
    torch.manual_seed(5)                        # (for the lazy layer's initialisation, at its first forward)
    nn.functional.mse_loss(reference(x), y).backward()
    with fpsim.emulate(model, "fp16", loss_scale=1024.0):
        torch.manual_seed(5)
        nn.functional.mse_loss(model(x), y).backward()
    assert torch.equal(model[0].weight, reference[0].weight)
    distances = _relative_distances(model, reference)
    assert max(distances.values()) <= 1e-2, distances
    assert all(not p._backward_hooks for p in model.parameters())


# ------------------------------------------------------------------------------- names with a colon
def _colon_model():
    torch.manual_seed(0)
    return nn.ModuleDict({"enc:0": nn.Linear(4, 4), "dec": nn.Linear(4, 4)})


def test_a_module_named_with_a_colon_is_kept_by_name():
    """keep=["enc:0"] (a ModuleDict key) keeps that module: its output is the FP32 one, bit for bit."""
    model = _colon_model()
    x = torch.randn(2, 4)
    want = model["enc:0"](x)
    for name in ("enc:0", "ModuleDict.enc:0"):
        with fpsim.emulate(model, "bf16", keep=[name]) as em:
            got, other = model["enc:0"](x), model["dec"](x)
        assert em.selection.kept_modules == {"enc:0"} and not em.selection.kept_ops
        assert torch.equal(got, want) and other.dtype == BF16
    with fpsim.emulate(model, "bf16", keep=["enc:0:linear"]) as em:   # an op of it, by Module:op
        assert torch.equal(model["enc:0"](x), want)
    assert em.selection.kept_ops == {"linear": {"enc:0"}}


def test_a_module_named_with_a_colon_is_emulated_alone_by_name():
    model = _few_bits(_colon_model())
    x = torch.arange(-4, 4).reshape(2, 4) / 4
    with _autocast():
        want = model["enc:0"](x).float()
    with fpsim.emulate(model, "bf16", policy="cpu", layers=["enc:0"]):
        got, other = model["enc:0"](x), model["dec"](x)
    assert torch.equal(got, want) and other.dtype == torch.float32


def test_a_report_naming_a_module_with_a_colon_keeps_it(tmp_path):
    (tmp_path / "report.json").write_text(json.dumps({
        "schema": "fpsim.analyze.report/2", "formats": [{"name": f} for f in ("fp16", "bf16", "e4m3", "e5m2")],
        "layers": [{"name": "enc:0", "verdicts": {"fp16": "fp32", "bf16": "bf16", "e4m3": "fp32", "e5m2": "fp16"}}],
        "loss_scale": {}}))
    assert fpsim.emulate(_colon_model(), "fp16", from_report=tmp_path).selection.kept_modules == {"enc:0"}
    with fpsim.emulate(_colon_model(), "fp8", from_report=tmp_path) as em:
        pass
    assert list(em.fp8_layers) == ["dec"]
