"""FP8 recipes: per-tensor scales and FP8 linear layers, against examples computed by hand.

Sources of truth: TransformerEngine's scaling formulas as its documentation and kernels state
them (DelayedScaling: scale = FP8_MAX * 2^-margin / amax over the amax history, the previous
scale when amax is 0 or not finite; Float8CurrentScaling: FP8_MAX / amax of the tensor itself;
the formulas themselves are fpsim.recipes', held to them in tests/test_recipes.py: here, that
emulation's casts use them), the OCP MX specification (E8M0 scale 2^(floor(log2 amax) - 8) for
MXFP8 E4M3 blocks of 32, worked by hand below), the E4M3 and E5M2
grids of the OCP FP8 specification (3 and 2 mantissa bits, max 448 and 57344, conversion with
saturation as CUDA's SATFINITE), and the amaxes of each layer's inputs seen from outside the
emulation (forward pre-hooks). Expected FP8 values and GEMM results below are worked out by
hand in the comments; fpsim.TensorCore (held to GPU captures in tests/tensorcore) is the
reference for FP8 GEMMs on the H100 model.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

import fpsim
from emulate_helpers import TINY, emulated, gpt, twin
from framework_helpers import Checkpointed, tiny_gpt2
from fpsim.analyze.gpt import token_batches
from fpsim.emulate import BlockScaling, CurrentScaling, DelayedScaling, FP8Recipe, PerChannelScaling
from fpsim.emulate.fp8 import FP8Layer, FP8Linear, TensorScale, fp32_gemm

F32 = torch.float32


def _t(*values):
    return torch.tensor(values, dtype=F32)


def test_delayed_scales_come_from_the_amaxes_before():
    state = TensorScale(DelayedScaling("e4m3", amax_history_len=2), "activation")
    used = []
    for x in (_t(2.0, -1.0), _t(2.0, -4.0, 0.3, 1.1), _t(1.0), _t(0.5)):
        values, inverse = state.cast(x)
        used.append(state.used.item())
        assert inverse.item() == torch.reciprocal(state.used).item()
        if len(used) == 2:
            # x * 224 = 448, -896, 67.2, 246.4 -> E4M3: 448, -448 (saturated), 64 (grid step 8), 240 (step 16)
            assert values.tolist() == [448.0, -448.0, 64.0, 240.0]
    # scale 1 at first; then 448 / max of the last two amaxes: (2) -> 224, (2, 4) -> 112, (4, 1) -> 112
    assert used == [1.0, 224.0, 112.0, 112.0]
    assert state.scale == 448.0                                                   # (1, 0.5) -> 448


def test_delayed_scaling_margin_and_gradient_format_by_hand():
    state = TensorScale(DelayedScaling("e4m3", margin=1, gradient_format="e5m2"), "gradient")
    assert state.format.name == "e5m2"
    state.cast(_t(3.5, 1.0))
    assert state.scale == 8192.0                                                  # 57344 / 2 / 3.5
    values, inverse = state.cast(_t(1e-3, 0.0))
    # 1e-3 * 8192 = 8.192 -> E5M2 8 (step 2 in [8, 16)); the inverse scale 2^-13 is exact
    assert values.tolist() == [8.0, 0.0] and inverse.item() == 2.0 ** -13


def _layer(fmt="hybrid", bias=True):
    gradient = "e5m2" if fmt == "hybrid" else "e4m3"
    recipe = FP8Recipe(CurrentScaling("e4m3", gradient_format=gradient), base="fp32")
    x = torch.tensor([[1.0, 3.3]], requires_grad=True)
    w = torch.tensor([[0.5, 0.25], [0.25, 0.5]], requires_grad=True)
    b = torch.tensor([0.25, -0.5], requires_grad=True) if bias else None
    return FP8Layer(recipe, fp32_gemm), x, w, b


def test_an_fp8_linear_layer_forward_by_hand():
    layer, x, w, b = _layer()
    y = FP8Linear.apply(x, w, b, layer, F32)
    # sx = 448 / 3.3 = 135.76: x * sx = 135.76 -> 128 (E4M3 step 16), 448 -> 448; sw = 896: W * sw = 448, 224
    # accumulators: 128 * 448 + 448 * 224 = 157696, 128 * 224 + 448 * 448 = 229376; y = acc / (sx sw) + b
    sx, sw = 448 / 3.3, 896.0
    expected = [157696 / (sx * sw) + 0.25, 229376 / (sx * sw) - 0.5]
    assert y.tolist()[0] == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("shape", [(3, 2), (4, 3, 2)])
def test_an_fp8_linear_layer_output_is_not_a_view(shape):
    """As nn.Linear's output of a matrix is not (torch's own, checked here too): FSDP2 warns of a module output
    that is a view, and an in-place op on one drops the hook it puts there."""
    layer, _, w, b = _layer()
    x = torch.randn(shape, requires_grad=True)
    assert torch.nn.functional.linear(x[0] if len(shape) == 3 else x, w, b)._base is None
    y = FP8Linear.apply(x, w, b, layer, F32)
    assert y.shape == (*shape[:-1], 2) and y._base is None
    y.sum().backward()
    assert x.grad.shape == x.shape


@pytest.mark.parametrize("fmt, grad_codes, grad_scale", [("hybrid", (57344, 6144), 57344), ("e4m3", (448, 44), 448)])
def test_an_fp8_linear_layer_backward_by_hand(fmt, grad_codes, grad_scale):
    """Output gradient (1, 0.1): E5M2 (hybrid) scales it by 57344/1: 0.1 -> 5734.4 -> 6144 (E5M2 step 1024 in
    [4096, 8192)); E4M3 by 448: 0.1 -> 44.8 -> 44 (step 4). The bias gradient is the unquantised one."""
    layer, x, w, b = _layer(fmt)
    FP8Linear.apply(x, w, b, layer, F32).backward(torch.tensor([[1.0, 0.1]]))
    g0, g1 = grad_codes
    sx, sw, sg = 448 / 3.3, 896.0, float(grad_scale)
    dgrad = [(g0 * 448 + g1 * 224) / (sg * sw), (g0 * 224 + g1 * 448) / (sg * sw)]    # G8 @ W8
    wgrad = [[g0 * 128 / (sg * sx), g0 * 448 / (sg * sx)], [g1 * 128 / (sg * sx), g1 * 448 / (sg * sx)]]
    assert x.grad.tolist()[0] == pytest.approx(dgrad, rel=1e-6)
    assert w.grad.tolist() == [pytest.approx(row, rel=1e-6) for row in wgrad]
    assert b.grad.tolist() == pytest.approx([1.0, 0.1], rel=1e-7)


def test_the_hybrid_and_e4m3_recipes_differ_in_backward_only():
    cfg = TINY["bf16"]
    model = gpt(cfg)
    runs = {}
    for fmt in ("fp8", "fp8-e4m3"):
        records, _ = emulated(twin(model), cfg, 1, fmt)
        runs[fmt] = records[0]
    (loss_h, grads_h), (loss_e, grads_e) = runs["fp8"], runs["fp8-e4m3"]
    assert torch.equal(loss_h, loss_e)
    assert any(not torch.equal(grads_h[n], grads_e[n]) for n in grads_h)


class _InputAmaxes:
    """The amax of each Linear's input as the module receives it, recorded outside the emulation."""

    def __init__(self, model):
        self.amaxes = {}
        self.handles = [m.register_forward_pre_hook(self._record(n)) for n, m in model.named_modules()
                        if isinstance(m, torch.nn.Linear)]

    def _record(self, name):
        def hook(module, args):
            self.amaxes.setdefault(name, []).append(args[0].detach().abs().max().float().item())
        return hook

    def close(self):
        for h in self.handles:
            h.remove()


def test_delayed_scaling_in_a_training_loop_follows_the_inputs_amaxes():
    cfg = TINY["bf16"]
    model = gpt(cfg)
    recorder = _InputAmaxes(model)
    recipe = FP8Recipe(DelayedScaling("e4m3", amax_history_len=2, gradient_format="e5m2"))
    _, em = emulated(model, cfg, 3, recipe)
    recorder.close()
    linears = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert set(em.fp8_layers) == linears
    for name, layer in em.fp8_layers.items():
        seen = recorder.amaxes[name]
        assert layer.input.history == seen[-2:]
        assert layer.input.scale == pytest.approx(448 / max(seen[-2:]), rel=1e-7)


def test_fp8_training_follows_bf16_closely_and_keeps_kept_layers_out():
    cfg = TINY["bf16"]
    model = gpt(cfg)
    fp8, em = emulated(twin(model), cfg, 4, "fp8", keep=["lm_head"])
    bf16, _ = emulated(twin(model), cfg, 4, "bf16")
    assert "lm_head" not in em.fp8_layers and "h.0.attn.c_attn" in em.fp8_layers
    for (loss, _), (reference, _) in zip(fp8, bf16):
        assert loss != reference and abs(loss - reference) < 0.05 * reference


def test_fp8_gemms_on_the_h100_model_are_its_tensor_cores_results():
    """fprop accumulates in the tensor core (TE's fast accumulation), dgrad promotes every 128 products."""
    g = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(256, 4, bias=False)
    x = torch.randn(3, 256, generator=g, requires_grad=True)
    scaling = CurrentScaling("e4m3", gradient_format="e5m2")
    with fpsim.emulate(layer, FP8Recipe(scaling, base="fp32"), device="h100") as em:
        y = layer(x)
        y.backward(torch.ones_like(y))
    state = em.fp8_layers[""]
    x8, sx = TensorScale(scaling, "activation").cast(x)
    w8, sw = TensorScale(scaling, "weight").cast(layer.weight)
    g8, sg = TensorScale(scaling, "gradient").cast(torch.ones_like(y))
    fprop = fpsim.TensorCore("h100", "e4m3", "fp32").matmul(x8, w8.t().contiguous()) * (sx * sw)
    dgrad = fpsim.TensorCore("h100", "e5m2", "fp32", inputs_b="e4m3", promote_every=128).matmul(g8, w8) * (sg * sw)
    assert torch.equal(y, fprop) and torch.equal(x.grad, dgrad)
    assert state.grad_output.format.name == "e5m2"


def test_each_emulation_starts_with_fresh_scales():
    cfg = TINY["bf16"]
    model = gpt(cfg)
    first, _ = emulated(twin(model), cfg, 2, "fp8")
    again, _ = emulated(twin(model), cfg, 2, "fp8")
    assert [loss for loss, _ in first] == [loss for loss, _ in again]
    x, y = next(token_batches(cfg, 2, 1, seed=1))
    with fpsim.emulate(model, "fp8") as em:
        model(x, y)
    assert all(len(layer.input.history) == 1 for layer in em.fp8_layers.values())


def test_an_mxfp8_layer_multiplies_the_blocks_dequantised_values():
    """MXFP8 (OCP MX v1.0): one E8M0 scale per 32 elements, 2^(floor(log2 amax) - 8) for E4M3 (emax 8).
    Input block 0: amax 3.3 -> scale 2^(1-8) = 2^-7: 3.3 * 128 = 422.4 -> 416 (E4M3 step 32 in [256, 512)),
    so 3.25; 1.0 -> 128 stays; its 0.1s: 12.8 -> 13 (step 1), so 13/128 = 0.1015625. Block 1 (all 0.1):
    amax 0.1 -> 2^(-4-8): 409.6 -> 416 (step 32), so again 416/4096 = 0.1015625. Weights 0.5 are exact."""
    layer = torch.nn.Linear(64, 1, bias=False)
    with torch.no_grad():
        layer.weight.fill_(0.5)                                                     # a power of two: exact
    x = torch.full((1, 64), 0.1)
    x[0, 0], x[0, 1] = 3.3, 1.0
    with fpsim.emulate(layer, FP8Recipe(BlockScaling("mxfp8_e4m3", "mxfp8_e4m3", "mxfp8_e4m3"), base="fp32")):
        y = layer(x)
    first = 3.25 + 1.0 + 30 * (13 / 128)
    second = 32 * (416 / 4096)
    assert y.item() == pytest.approx(0.5 * (first + second), rel=1e-6)
    assert FP8Recipe(BlockScaling("mxfp8_e4m3", "mxfp8_e4m3", "mxfp8_e4m3")).name == "mxfp8"


def test_block_recipes_train_and_refuse_a_tensor_core_model():
    cfg = TINY["bf16"]
    model = gpt(cfg)
    for name in ("mxfp8", "fp8-block"):
        records, em = emulated(twin(model), cfg, 2, name)
        assert all(math.isfinite(loss) for loss, _ in records) and em.fp8_layers
    with pytest.raises(ValueError, match="block scaling of recipe mxfp8 runs with FP32 accumulation only"):
        fpsim.emulate(model, "mxfp8", device="h100")


def test_per_channel_scaling_scales_each_weight_row_by_its_own_amax():
    """PerChannelScaling (rows, TE's formula per row): row [0.5, 0.25] gets 448/0.5 = 896 and stays exact;
    row [3.3, 1.0] and the input [1.0, 3.3] get s = 448/3.3: 1.0 * s = 135.76 -> 128 (E4M3 step 16), so
    1.0 becomes 128/s = 0.942857; 3.3 * s = 448 stays. One scale for the whole weight (CurrentScaling)
    would round 0.5 * s = 67.9 -> 64 (step 8) instead: 0.4714."""
    layer = torch.nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[0.5, 0.25], [3.3, 1.0]]))
    x = torch.tensor([[1.0, 3.3]])
    recipe = FP8Recipe(PerChannelScaling("e4m3"), base="fp32")
    with fpsim.emulate(layer, recipe):
        y = layer(x)
    one = 128 * 3.3 / 448
    assert y.tolist()[0] == pytest.approx([one * 0.5 + 3.3 * 0.25, one * 3.3 + 3.3 * one], rel=1e-6)


def test_a_linear_under_weight_norm_runs_its_gemm_in_fp8():
    """weight_norm computes a new weight tensor at each access, and the FP8 layer took only an F.linear whose
    weight was the module's parameter itself: the layer ran in FP32 while listed among the FP8 layers (its
    scales None). Against ml_dtypes' E4M3 cast with current scaling (s = 448 / amax), by hand."""
    import ml_dtypes
    import numpy as np

    layer = torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(2, 2, bias=False))
    v = torch.tensor([[0.5, 0.25], [3.3, 1.0]])
    with torch.no_grad():
        layer.parametrizations.weight.original1.copy_(v)
        layer.parametrizations.weight.original0.copy_(v.norm(dim=1, keepdim=True))
    x = torch.tensor([[1.0, 3.3]])
    with fpsim.emulate(layer, FP8Recipe(CurrentScaling("e4m3"), base="fp32")):
        y = layer(x)

    def q(a):
        s = np.float32(448.0 / np.abs(a).max())
        return (a * s).astype(ml_dtypes.float8_e4m3fn).astype(np.float32) / s

    w = layer.weight.detach().numpy()
    assert y.detach().numpy() == pytest.approx(q(x.numpy()) @ q(w).T, rel=1e-6)
    assert not np.allclose(y.detach().numpy(), x.numpy() @ w.T, rtol=1e-3)


@pytest.mark.parametrize("recipe", ["fp8", "fp8-current", "mxfp8"])
@pytest.mark.parametrize("reentrant", [False, True])
def test_a_checkpointed_block_trains_as_the_same_model_without_checkpointing(recipe, reentrant):
    # the forward that checkpointing recomputes in backward ran its FP8 layers as plain FP32 linears: the
    # non-reentrant checkpoint raised CheckpointError (5 tensors saved in the forward, 3 in the recomputation),
    # the reentrant one silently computed the block's gradients without FP8. Recomputed, an FP8 layer casts
    # again with the scales of its forward (no amax recorded twice): the run equals the plain model's
    def train(reentrant):
        torch.manual_seed(0)
        model = Checkpointed(reentrant, inputs=16)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        g = torch.Generator().manual_seed(1)
        with fpsim.emulate(model, recipe) as em:
            for _ in range(4):
                loss = torch.nn.functional.cross_entropy(model(torch.randn(16, 16, generator=g).requires_grad_()),
                                                         torch.randint(0, 3, (16,), generator=g))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        return em.losses, [p.detach().clone() for p in model.parameters()], \
            {name: layer.input.history for name, layer in em.fp8_layers.items()}

    plain, checkpointed = train(None), train(reentrant)
    assert checkpointed[0] == plain[0] and checkpointed[2] == plain[2]
    assert all(torch.equal(a, b) for a, b in zip(plain[1], checkpointed[1]))


def test_transformers_conv1d_runs_in_fp8_as_the_same_linear_does():
    """GPT-2's projections are transformers' Conv1D (bias + x W by torch.addmm, W stored as (in, out)): the FP8
    recipes ran only nn.Linear layers in FP8, so a GPT-2 emulated in FP8 had its head alone in FP8. A Conv1D
    now trains step for step as the nn.Linear holding W^T does under the same recipe, bit for bit, and a tiny
    GPT-2's projections are FP8 layers with the scales of their tensors."""
    transformers = pytest.importorskip("transformers")

    torch.manual_seed(0)
    conv = transformers.pytorch_utils.Conv1D(6, 8)
    with torch.no_grad():
        conv.weight.normal_()
        conv.bias.normal_()
    linear = torch.nn.Linear(8, 6)
    with torch.no_grad():
        linear.weight.copy_(conv.weight.t())
        linear.bias.copy_(conv.bias)
    initial = copy.deepcopy(conv)
    g = torch.Generator().manual_seed(1)
    batches = [torch.randn(2, 5, 8, generator=g) for _ in range(3)]

    def steps(layer, recipe):
        optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
        outputs = []
        with fpsim.emulate(layer, recipe):
            for x in batches:
                y = layer(x)
                optimizer.zero_grad()
                y.float().square().mean().backward()
                optimizer.step()
                outputs.append(y.detach())
        return outputs

    from_conv, from_linear = steps(conv, "fp8"), steps(linear, "fp8")
    assert all(torch.equal(a, b) for a, b in zip(from_conv, from_linear))
    assert torch.equal(conv.weight.t(), linear.weight) and torch.equal(conv.bias, linear.bias)
    assert not torch.equal(steps(initial, "bf16")[0], from_conv[0])   # (its base format alone rounds otherwise)

    model = tiny_gpt2()
    with fpsim.emulate(model, "fp8") as em:
        model(torch.arange(16).reshape(1, 16), labels=torch.arange(16).reshape(1, 16)).loss.backward()
    layers = em.summary()["fp8_layers"]
    assert {"transformer.h.0.attn.c_attn", "transformer.h.1.mlp.c_proj", "lm_head"} <= set(layers)
    assert layers["transformer.h.0.attn.c_attn"]["weight"]["amax"] is not None
