"""fpsim.watch on tensors that are not plain real floats: complex tensors, torch.vmap, nested tensors, subclasses.

Sources of truth: torch's own values of the same tensors (torch.view_as_real of a complex tensor, the model's
layer applied to the whole batch outside vmap, a nested tensor's values buffer computed by torch), counted
by analyze_helpers.numpy_count, an independent numpy count; and the unwatched twin run, bit for bit.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from torch import nn
from torch.utils import _pytree as pytree

from fpsim.analyze import watch

from analyze_helpers import assert_same, numpy_count


def _twins(make, loop, **options):
    """(parameters of an unwatched run, the watched model, its watcher, warnings of the watched run)."""
    torch.manual_seed(0)
    plain = make()
    loop(plain)
    torch.manual_seed(0)
    model = make()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with watch(model, **options) as w:
            loop(model)
    for a, b in zip(plain.parameters(), model.parameters()):
        assert torch.equal(a, b)
    return model, w, [str(c.message) for c in caught]


class Phasor(nn.Module):
    """A complex weight, purely imaginary: 1e5j overflows FP16 as 1e5 does (complex32 stores each part in FP16)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.full((4, 3), 1e5j, dtype=torch.complex64))

    def forward(self, x):
        return x.to(torch.complex64) @ self.w


def test_a_complex_tensor_counts_its_real_and_imaginary_parts():
    # before: the real parts alone (a warning "Casting complex values to real discards the imaginary part"): a
    # weight of 1e5j was all zeros with amax 0 and FP16 ok; the complex op outputs were not counted at all
    x = torch.linspace(-1, 1, 8).reshape(2, 4)
    seen = {}

    def loop(model):
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        out = model(x)
        seen["out"] = out.detach().clone()
        opt.zero_grad()
        out.abs().mean().backward()
        seen["grad"] = model.w.grad.detach().clone()
        opt.step()

    model, w, caught = _twins(Phasor, loop, formats=("fp16",), modules="all")
    assert not [m for m in caught if "imaginary" in m]
    report = w.report()
    layer = report.layer("Phasor")
    weight = layer.tensors["weight"]
    assert_same(weight.hist, numpy_count(torch.view_as_real(model.w.detach()).numpy()))
    assert weight.amax == model.w.detach().abs().max().item() == 1e5 and weight.hist.total == 24
    assert_same(layer.tensors["activation"].hist, numpy_count(torch.view_as_real(seen["out"]).numpy()))
    assert_same(layer.tensors["weight_grad"].hist, numpy_count(torch.view_as_real(seen["grad"]).numpy()))
    mm = next(op for op in report.ops if op.name == "Phasor:mm")
    assert_same(mm.tensors["activation"].hist, numpy_count(torch.view_as_real(seen["out"]).numpy()))
    assert report.verdict("Phasor", "fp16") == "fp32"
    assert "weights overflow fp16" in report.verdicts["Phasor"]["fp16"].reason


class PhasorHead(nn.Module):
    """A complex layer (purely imaginary weight: its gradient is purely imaginary too) and a real head."""

    def __init__(self):
        super().__init__()
        self.phasor = Phasor()
        with torch.no_grad():
            self.phasor.w.copy_(1j * torch.randn(4, 3))
        self.head = nn.Linear(3, 2)

    def forward(self, x):
        return self.head(self.phasor(x).imag)


def test_shadow_steps_and_recipes_measure_complex_layers_whole():
    # before: the shadow steps kept the real part of the gradients (zero here: the complex layer had no
    # reference and no evidence) and left complex products unquantised in FP8; the recipe probe, the real parts
    def loop(model):
        opt = torch.optim.SGD(model.parameters(), lr=1e-2)
        g = torch.Generator().manual_seed(1)
        for _ in range(4):
            loss = model(torch.randn(16, 4, generator=g)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()

    _, w, caught = _twins(PhasorHead, loop, formats=("e4m3",), shadow_every=1, recipes_every=1)
    assert not [m for m in caught if "imaginary" in m or "fpsim" in m]
    report = w.report()
    evidence = report.shadow_evidence["phasor"]["e4m3"]
    assert evidence["steps"] >= 1 and evidence["grad_rel_error"] > 0
    recipes = report.to_dict()["recipes"]
    assert recipes["error"] is None and "phasor" in [layer["name"] for layer in recipes["layers"]]


class Batched(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, x):
        return torch.vmap(lambda row: torch.sin(self.lin(row)))(x)


def test_vmap_inside_forward_is_observed_with_its_whole_batch():
    # before: vmap's batched module output (no storage) stopped all observation: 0 of 3 steps, no layers
    inputs = [torch.randn(8, 6, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    outputs = []

    def loop(model):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in inputs:
            with torch.no_grad():
                outputs.append(model.lin(x))          # the layer on the whole batch, outside vmap
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()

    _, w, _ = _twins(Batched, loop, formats=("fp16",))
    report = w.report()
    assert report.run["observation_error"] is None and report.run["steps_observed"] == 3
    watched = torch.cat(outputs[3:]).numpy()                  # the watched run's outputs (the first 3: the twin's)
    assert_same(report.layer("lin").tensors["activation"].hist, numpy_count(watched))
    assert report.layer("lin").tensors["weight_grad"].samples == 6


class Jagged(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        nested = torch.nested.nested_tensor([x[:2], x[2:5]], layout=torch.jagged)
        return torch.stack([t.sum(0) for t in self.lin(nested).unbind()])


def test_a_jagged_nested_tensor_is_counted_by_its_values():
    # before: 'NestedIntNode' object has no attribute 'sym_max' stopped all observation
    inputs = [torch.randn(6, 4, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    values = []

    def loop(model):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in inputs:
            with torch.no_grad():
                values.append(model.lin(x[:5]))       # the components' rows, as torch's linear gives them
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()

    _, w, _ = _twins(Jagged, loop, formats=("fp16",))
    report = w.report()
    assert report.run["observation_error"] is None and report.run["steps_observed"] == 3
    assert_same(report.layer("lin").tensors["activation"].hist, numpy_count(torch.cat(values[3:]).numpy()))
    assert report.layer("lin").tensors["activation_grad"].samples == 3


class Boxed(torch.Tensor):
    """A wrapper subclass: no storage of its own, its values in `inner` (what quantised-tensor libraries do)."""

    @staticmethod
    def __new__(cls, inner):
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype, device=inner.device)

    def __init__(self, inner):
        self.inner = inner

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        out = func(*pytree.tree_map(lambda a: a.inner if isinstance(a, Boxed) else a, args),
                   **pytree.tree_map(lambda a: a.inner if isinstance(a, Boxed) else a, kwargs or {}))
        return pytree.tree_map(lambda t: Boxed(t) if isinstance(t, torch.Tensor) else t, out)


class SideWork(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        side = (Boxed(h.detach()) * 2).inner       # a wrapper subclass's op: its output cannot be read
        return h + side.mean() * 0


def test_unreadable_tensors_are_left_out_one_by_one_and_noted():
    # before: the wrapper subclass's output stopped all observation; now it alone is left out, and a note says
    # where and why, while everything else is counted
    inputs = [torch.randn(8, 4, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    outputs = []

    def loop(model):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in inputs:
            with torch.no_grad():
                outputs.append(model.lin(x))
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()

    _, w, _ = _twins(SideWork, loop, formats=("fp16",))
    report = w.report()
    assert report.run["observation_error"] is None and report.run["steps_observed"] == 2
    notes = [n for n in report.run["notes"] if "not counted" in n]
    assert notes == ["2 tensors of SideWork:mul not counted: Boxed, a tensor subclass whose values are in tensors "
                     "inside it (only its own operations read them)"]
    assert_same(report.layer("lin").tensors["activation"].hist, numpy_count(torch.cat(outputs[2:]).numpy()))
    mul = next(o for o in report.ops if o.name == "SideWork:mul")
    assert mul.tensors["activation"].samples == 2 and report.run["precision"]["op_outputs_by_dtype"]


def test_a_tensor_on_the_meta_device_is_left_out_and_noted():
    class ShapeWork(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            torch.empty(3, device="meta", requires_grad=True) * 2       # shape arithmetic, no values
            return self.lin(x)

    def loop(model):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(2):
            loss = model(torch.randn(8, 4, generator=torch.Generator().manual_seed(i))).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()

    _, w, _ = _twins(ShapeWork, loop, formats=("fp16",))
    report = w.report()
    assert report.run["observation_error"] is None and report.run["steps_observed"] == 2
    assert [n for n in report.run["notes"] if "not counted" in n] == [
        "2 tensors of ShapeWork:mul not counted: tensors on the meta device (no values)"]
    assert np.isfinite(report.layer("lin").tensors["activation"].amax)
