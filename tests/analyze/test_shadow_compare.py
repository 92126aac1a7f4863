"""The shadow steps' fast measurements held to direct computations.

Sources of truth: torch.isfinite (is every value of a module's output finite:
replay.all_finite, which answers from one min/max reduction), and, for the
comparison of a replayed gradient with the FP32 reference (gradient_error.Reference,
which joins the layers and takes one dot product per layer and measure), each
layer's float64 norms and dot product computed on its own with torch.linalg.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from fpsim.analyze import gradient_error
from fpsim.analyze.replay import all_finite
from fpsim.emulate.compute import FP32Compute

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_all_finite_agrees_with_isfinite_wherever_the_bad_value_sits(dtype):
    g = torch.Generator().manual_seed(0)
    for n in (1, 2, 7, 8, 9, 16, 31, 33, 64, 255, 1025):
        for pos in sorted({0, n // 3, n // 2, n - 1}):
            for bad in (math.nan, math.inf, -math.inf):
                x = (torch.randn(n, generator=g) * 100).to(dtype)
                x[pos] = bad
                strided = torch.randn(n, 3, generator=g).to(dtype).t()   # not contiguous
                strided[1, pos] = bad
                for t in (x, strided, x.reshape(1, n).requires_grad_(True)):
                    assert all_finite(t) is bool(torch.isfinite(t).all()) is False, (n, pos, bad)
        x = (torch.randn(n, generator=g) * 100).to(dtype)
        assert all_finite(x) is bool(torch.isfinite(x).all()) is True


def test_all_finite_looks_into_nested_outputs_and_skips_empty_and_integer_tensors():
    fine, empty = torch.ones(3), torch.empty(0)
    bad = torch.tensor([1.0, math.inf])
    assert all_finite((fine, {"a": empty, "b": [torch.arange(3)]}))
    assert not all_finite((fine, {"a": empty, "b": [bad]}))
    assert all_finite(empty) and all_finite(None) and all_finite(3.0)


def test_all_finite_is_right_inside_an_emulated_replays_dispatch_mode():
    x = torch.tensor([1.0, 60000.0], dtype=torch.float16)
    with FP32Compute():
        y = x * 2            # overflows fp16: the mode rounds the FP32 product to inf
        assert not all_finite(y) and all_finite(x)
    assert not bool(torch.isfinite(y).all())


def _direct(g, r) -> dict:
    """The measures of one layer, straight from their definitions (float64, torch.linalg)."""
    if g is None:
        return {"rel_error": 1.0, "cosine": 0.0, "zeroed_share": 1.0, "nonfinite_share": 0.0}
    g, r = g.double(), r.double()
    bad = int((~torch.isfinite(g)).sum())
    if bad:
        return {"rel_error": math.inf, "cosine": None, "zeroed_share": None, "nonfinite_share": bad / g.numel()}
    norm = torch.linalg.vector_norm
    lost = r[(g == 0) & (r != 0)]
    return {"rel_error": float(norm(g - r) / norm(r)),
            "cosine": float(torch.dot(g, r) / (norm(g) * norm(r))) if float(norm(g)) else 0.0,
            "zeroed_share": float(norm(lost) / norm(r)), "nonfinite_share": 0.0}


@pytest.mark.parametrize("chunk", [1 << 22, 50], ids=["one chunk", "many chunks"])
def test_the_joined_comparison_equals_each_layers_own(monkeypatch, chunk):
    monkeypatch.setattr(gradient_error, "COMPARE_CHUNK", chunk)
    g = torch.Generator().manual_seed(1)
    shapes = {"a.weight": (8, 5), "a.bias": (8,), "b.weight": (30,), "c.weight": (4, 4), "d.weight": (70,),
              "e.weight": (3,), "f.weight": (6,), "h.weight": (5,)}
    groups = [("a", ["a.weight", "a.bias"]), ("b", ["b.weight"]), ("c", ["c.weight"]), ("d", ["d.weight"]),
              ("e", ["e.weight"]), ("f", ["f.weight"]), ("h", ["h.weight"]), ("none", ["none.weight"])]
    ref = {n: torch.randn(s, generator=g) for n, s in shapes.items()}
    ref["e.weight"] = torch.zeros(3)                         # no reference gradient: not compared
    ref["none.weight"] = None
    low = {n: None if r is None else r + 1e-3 * torch.randn(r.shape, generator=g) for n, r in ref.items()}
    low["a.weight"][0, :3] = 0                               # lost to zeros
    low["c.weight"][1, 1] = math.nan                         # non-finite
    low["d.weight"][5] = -math.inf
    low["f.weight"] = None                                   # no gradient reached it in the replay
    low["h.weight"] = torch.zeros(5)
    measured = gradient_error.Reference(ref, groups).compare(low)
    assert sorted(measured) == ["a", "b", "c", "d", "f", "h"]
    for name, names in groups:
        if name not in measured:
            continue
        gl = None if low[names[0]] is None else torch.cat([low[n].reshape(-1) for n in names])
        expected = _direct(gl, torch.cat([ref[n].reshape(-1) for n in names]))
        for key, value in expected.items():
            assert measured[name][key] == (value if value is None else pytest.approx(value, rel=1e-12)), \
                (name, key)


def test_a_replayed_gradient_of_another_size_is_refused_by_name():
    ref = {"a.weight": torch.ones(4)}
    with pytest.raises(ValueError, match="gradient of a has 3 values, its reference 4"):
        gradient_error.Reference(ref, [("a", ["a.weight"])]).compare({"a.weight": torch.ones(3)})


@pytest.mark.parametrize("name", ["e4m3", "e5m2"])
def test_fake_quantisation_is_a_current_scaled_cast_with_a_straight_through_gradient(name):
    """replay._quantize against ml_dtypes' own FP8 casts: x * s cast to the format and divided by s, with
    s = max / amax (CurrentScaling's formula, rounded to float32 as torch multiplies a float32 tensor by a
    Python float); 1 where amax is 0; gradients pass unchanged, and the gradient quantiser applies the same
    cast to the gradient."""
    import ml_dtypes
    import numpy as np

    from fpsim.analyze.limits import resolve_formats
    from fpsim.analyze.replay import _quantize, _quantize_gradient

    lim = resolve_formats((name,))[0]
    fp8 = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}[name]
    g = torch.Generator().manual_seed(3)

    def expected(t):
        a = t.detach().numpy()
        amax = float(np.abs(a).max()) if a.size else 0.0
        s = float(lim.fmt.max) / amax if amax else 1.0
        return torch.from_numpy((a * np.float32(s)).astype(fp8).astype(np.float32) / np.float32(s))

    cases = [torch.randn(64, 33, generator=g) * 10.0 ** k for k in (-30, -3, 0, 5, 30)]
    cases += [torch.zeros(5), torch.empty(0), torch.tensor([-448.0, 1e-9, 3.0])]
    for x in cases:
        for t in (x, x.clone().requires_grad_(True)):
            q = _quantize(t, lim)
            assert torch.equal(q.detach(), expected(t)), (name, float(x.abs().max()) if x.numel() else 0)
            assert q.requires_grad is t.requires_grad
            if t.requires_grad and t.numel():
                upstream = torch.randn(t.shape, generator=g)
                q.backward(upstream)
                assert torch.equal(t.grad, upstream)
        y = x.clone().requires_grad_(True)
        upstream = torch.randn(x.shape, generator=g) * 1e-20
        _quantize_gradient(y, lim).backward(upstream)
        assert torch.equal(y.grad, expected(upstream))


class CastedLinear(nn.Linear):
    """A Linear of one's own (modded-nanoGPT's kind): a subclass whose forward calls F.linear itself."""

    def forward(self, x):
        return nn.functional.linear(x, self.weight.float())


class TwoProducts(nn.Module):
    """x -> first (a Linear) -> a second product: a Linear subclass, a Linear whose weight is an Embedding's
    (tied, as a GPT's head), a Linear under weight_norm, transformers' Conv1D (GPT-2's), or F.linear or a
    matrix product called in the forward on a parameter of the model's own."""

    def __init__(self, second: str):
        super().__init__()
        self.kind = second
        self.first = nn.Linear(8, 16, bias=False)
        if second == "subclass":
            self.second = CastedLinear(16, 4, bias=False)
        elif second == "tied":
            self.table = nn.Embedding(4, 16)
            self.second = nn.Linear(16, 4, bias=False)
            self.second.weight = self.table.weight
        elif second == "parametrized":
            self.second = nn.utils.parametrizations.weight_norm(nn.Linear(16, 4, bias=False))
        elif second == "conv1d":           # GPT-2's projections: x @ W + b by torch.addmm, W of (in, out)
            self.second = pytest.importorskip("transformers.pytorch_utils").Conv1D(4, 16)
            with torch.no_grad():
                self.second.weight.normal_(0, 0.25)
        else:
            self.weight = nn.Parameter(torch.randn(4, 16) / 4)

    def forward(self, x):
        h = self.first(x)
        if self.kind == "functional":
            return nn.functional.linear(h, self.weight)
        if self.kind == "matmul":
            return h @ self.weight.T
        return self.second(h)


@pytest.mark.parametrize("second", ["subclass", "tied", "parametrized", "conv1d", "functional", "matmul"])
def test_fp8_replays_fake_quantise_every_matrix_product_wherever_its_weight_lives(second):
    """The E4M3 shadow step's gradient errors against a computation by hand with ml_dtypes' casts (current
    scaling, straight-through): out = Q(Q(x) Q(W1)^T) Q(W2)^T with Q(G) arriving at out, so dW2 = Q(G)^T Q(h)
    and dW1 = Q(Q(G) Q(W2))^T Q(x). The replays fake-quantised the operands of Linear modules found by type
    name, with the weights taken from the parameters by the module's name: a Linear subclass and a product
    called in a forward went unquantised, a tied weight (a GPT's head) and one computed by a parametrization
    entered their products in FP32. (The parametrization's own parameters are not worked out here.)"""
    import ml_dtypes
    import numpy as np

    from fpsim.analyze import watch

    def q(a):
        s = np.float32(448.0 / np.abs(a).max())
        return (a * s).astype(ml_dtypes.float8_e4m3fn).astype(np.float32) / s

    torch.manual_seed(0)
    model = TwoProducts(second)
    g = torch.Generator().manual_seed(1)
    x, upstream = torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    with watch(model, formats=("e4m3",), shadow_every=1) as w:
        for _ in range(4):
            loss = (model(x) * upstream).sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    evidence = w.report().shadow_evidence
    second_layer = {"subclass": "second", "tied": "table", "parametrized": None, "conv1d": "second",
                    "functional": "TwoProducts", "matmul": "TwoProducts"}[second]

    xs, gs = x.numpy().astype(np.float64), upstream.numpy().astype(np.float64)
    w1 = model.first.weight.detach().numpy().astype(np.float64)
    w2 = (model.weight if second in ("functional", "matmul") else model.second.weight).detach().numpy()
    w2 = (w2.T if second == "conv1d" else w2).astype(np.float64)    # as (out, in): the error's norms are alike
    h = xs @ w1.T
    exact = {"first": (gs @ w2).T @ xs, second_layer: gs.T @ h}
    hq = q(x.numpy()).astype(np.float64) @ q(w1.astype(np.float32)).T.astype(np.float64)
    gq = q(upstream.numpy()).astype(np.float64)
    dh = gq @ q(w2.astype(np.float32)).astype(np.float64)
    fake = {"first": q(dh.astype(np.float32)).T.astype(np.float64) @ q(x.numpy()).astype(np.float64),
            second_layer: gq.T @ q(hq.astype(np.float32)).astype(np.float64)}
    if second == "conv1d":      # its bias: the gradient arriving, summed over the batch
        exact[second_layer], fake[second_layer] = (np.concatenate([exact[second_layer].ravel(), gs.sum(0)]),
                                                   np.concatenate([fake[second_layer].ravel(), gq.sum(0)]))
    for layer in ("first", second_layer) if second_layer else ("first",):
        want = np.linalg.norm(fake[layer] - exact[layer]) / np.linalg.norm(exact[layer])
        assert evidence[layer]["e4m3"]["grad_rel_error"] == pytest.approx(want, rel=1e-3), layer


def test_fp8_replays_leave_products_of_activations_as_they_are():
    """Attention's products (q @ k^T, weights @ v) multiply activations, which TransformerEngine's FP8 recipes
    leave in the base format: inside the replay's products mode a product of activations is torch's own,
    one with a parameter operand (or its transpose) is the product of the E4M3-cast operands (ml_dtypes)."""
    import ml_dtypes
    import numpy as np

    from fpsim.analyze.limits import resolve_formats
    from fpsim.analyze.replay import FakeQuant

    def q(a):
        s = np.float32(448.0 / np.abs(a).max())
        return (a * s).astype(ml_dtypes.float8_e4m3fn).astype(np.float32) / s

    g = torch.Generator().manual_seed(2)
    a, b, w = (torch.randn(*shape, generator=g) for shape in ((4, 8), (8, 3), (3, 8)))
    replay = FakeQuant(nn.Linear(1, 1), {}, resolve_formats(("e4m3",))[0], keep=(), found={})
    replay.parameters({"w": w})
    with replay.arithmetic():
        activations, weighted, method = a @ b, torch.matmul(a, w.T), a.mm(w.T)
    assert torch.equal(activations, a @ b)
    want = q(a.numpy()) @ q(w.numpy()).T
    assert weighted.numpy() == pytest.approx(want, rel=1e-6) and torch.equal(method, weighted)
