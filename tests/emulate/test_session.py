"""fpsim.emulate on whole training steps, against real low-precision training on the CPU.

Source of truth: real torch.autocast on the CPU (bfloat16 and float16) with a real
torch.amp.GradScaler, run as an AMP loop is written (autocast around the forward pass and the
loss), and hand-written equivalents of each option (a module kept in FP32 with autocast off
and its inputs cast to float32, ...). The emulation runs the same loop unchanged inside
``fpsim.emulate(model, fmt, policy="cpu")``. On GPTs small enough that every float32 sum in
their GEMMs is exact (emulate_helpers.TINY), the CPU's low-precision kernels and the
emulation must agree bit for bit, loss and every gradient, step after step; on a larger GPT,
the per-step differences stay within what GEMM summation order explains.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import fpsim
from emulate_helpers import DTYPES, TINY, assert_same_steps, emulated, gpt, real_autocast, train, twin
from fpsim.analyze.gpt import GPTConfig, token_batches

FORMATS = ("bf16", "fp16")


@pytest.mark.parametrize("fmt", FORMATS)
def test_emulated_steps_equal_real_cpu_autocast_steps_bit_for_bit(fmt):
    cfg = TINY[fmt]
    model = gpt(cfg)
    expected = train(twin(model), cfg, 4, real_autocast(fmt))
    got, em = emulated(twin(model), cfg, 4, fmt, policy="cpu")
    assert_same_steps(got, expected)
    assert em.steps == 4 and em.losses == [loss.item() for loss, _ in expected]
    assert em.notes == []


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_larger_gpt_differs_per_step_only_as_gemm_summation_order_explains(fmt):
    """Each step from the real run's weights: loss within 1e-5 (relative), every gradient within 0.5%."""
    cfg = GPTConfig(n_layer=2, n_embd=64, n_head=4, block_size=32)
    model = gpt(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for x, y in token_batches(cfg, 4, 3, seed=1):
        real, emu = twin(model), twin(model)
        with real_autocast(fmt)():
            _, real_loss = real(x, y)
        real_loss.backward()
        with fpsim.emulate(emu, fmt, policy="cpu"):
            _, emu_loss = emu(x, y)
            emu_loss.backward()
        assert abs(emu_loss.item() - real_loss.item()) <= 1e-5 * real_loss.item()
        for (name, p), q in zip(real.named_parameters(), emu.parameters()):
            assert (q.grad - p.grad).norm() <= 5e-3 * p.grad.norm(), name
        with real_autocast(fmt)():
            _, loss = model(x, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def test_a_real_grad_scaler_in_the_loop_works_as_with_real_fp16():
    cfg = TINY["fp16"]
    model = gpt(cfg)
    expected = train(twin(model), cfg, 4, real_autocast("fp16"), scaler=torch.amp.GradScaler("cpu", init_scale=2.0 ** 12))
    got, _ = emulated(twin(model), cfg, 4, "fp16", policy="cpu", scaler=torch.amp.GradScaler("cpu", init_scale=2.0 ** 12))
    assert_same_steps(got, expected)


def test_a_fixed_loss_scale_scales_the_backward_pass_and_unscales_each_gradient():
    cfg, scale = TINY["fp16"], 2.0 ** 10
    model = gpt(cfg)
    reference, optimizer = twin(model), None
    expected = []
    optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    for x, y in token_batches(cfg, 2, 3, seed=1):
        with real_autocast("fp16")():
            _, loss = reference(x, y)
        optimizer.zero_grad()
        (loss * scale).backward()
        grads = {n: (p.grad / scale) for n, p in reference.named_parameters()}
        for p in reference.parameters():
            p.grad.div_(scale)
        optimizer.step()
        expected.append((loss.detach(), grads))
    got, em = emulated(twin(model), cfg, 3, "fp16", policy="cpu", loss_scale=scale)
    assert_same_steps(got, expected)
    assert em.loss_scale == scale


def _overflowing_gpt():
    return GPTConfig(n_layer=1, n_embd=8, n_head=2, block_size=8, vocab_size=16, logit_gain=1e8)


class _AttentionLogits(TorchDispatchMode):
    """The attention logits (q k^T times the scale: aten.mul on 4-d tensors) of a forward pass."""

    def __init__(self):
        super().__init__()
        self.logits = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.mul.Tensor and out.dim() == 4:
            self.logits.append(out.clone())
        return out


@pytest.mark.parametrize("policy", ["cpu", "cuda"])
def test_attention_logits_beyond_65504_overflow_in_emulated_fp16_as_in_real_fp16(policy):
    cfg = _overflowing_gpt()
    model = gpt(cfg)
    x, y = next(token_batches(cfg, 2, 1, seed=1))
    real = _AttentionLogits()
    with torch.autocast("cpu", dtype=torch.float16), real:
        _, real_loss = model(x, y)
    emulation = _AttentionLogits()
    with fpsim.emulate(model, "fp16", policy=policy):
        with emulation:
            _, loss = model(x, y)
    (want,), (got,) = real.logits, emulation.logits
    assert got.dtype == want.dtype == torch.float16
    assert bool(want.isinf().any()) and torch.equal(got.isinf(), want.isinf())
    assert real_loss.isnan() and loss.isnan()
    with fpsim.emulate(model, "bf16", policy=policy):
        assert torch.isfinite(model(x, y)[1])        # bf16 has FP32's range


class _SavedDtypes:
    """The dtype of every tensor autograd saves for backward."""

    def __init__(self):
        self.dtypes = []

    def __enter__(self):
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self.hooks.__exit__(*exc)

    def _pack(self, t):
        self.dtypes.append(t.dtype)
        return t


@pytest.mark.parametrize("fmt", FORMATS)
def test_no_state_of_the_fp32_run_leaks_into_the_emulated_one(fmt):
    """After FP32 steps, emulated steps equal real autocast steps from there, and autograd saves exactly
    the tensors real autocast saves, dtype for dtype: no FP32 copy stands in for a low-precision one, and
    every step casts the current master weights (no stale cast)."""
    cfg = TINY[fmt]
    model = gpt(cfg)
    train(model, cfg, 2)                                   # the FP32 run so far
    expected = train(twin(model), cfg, 3, real_autocast(fmt))
    got, _ = emulated(twin(model), cfg, 3, fmt, policy="cpu")
    assert_same_steps(got, expected)
    x, y = next(token_batches(cfg, 2, 1, seed=2))
    with real_autocast(fmt)(), _SavedDtypes() as real:
        twin(model)(x, y)
    emu_model = twin(model)
    with fpsim.emulate(emu_model, fmt, policy="cpu"), _SavedDtypes() as emu:
        emu_model(x, y)
    assert emu.dtypes == real.dtypes and DTYPES[fmt] in real.dtypes


def _global_state():
    from torch.nn.modules import module as nn_module
    from torch.optim import optimizer as optim_module
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    x = torch.randn(4, 4)
    nesting = torch.autocast_increment_nesting() - 1       # torch's own count of open autocast contexts
    torch.autocast_decrement_nesting()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cpu_policy = [torch.softmax(x, -1).dtype, torch.exp(x @ x).dtype]
    return dict(autocast=(torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")), nesting=nesting,
                cpu_policy=cpu_policy,
                modes=(len(_get_current_function_mode_stack()), len(_get_current_dispatch_mode_stack())),
                module_hooks=(len(nn_module._global_forward_pre_hooks), len(nn_module._global_forward_hooks)),
                optimizer_hooks=(len(optim_module._global_optimizer_pre_hooks),
                                 len(optim_module._global_optimizer_post_hooks)))


@pytest.mark.parametrize("recipe, options", [("fp16", {"loss_scale": 256.0, "keep": ["h.0.attn:mul"]}),
                                             ("fp8", {"keep": ["h.0.ln_1"]}), ("bf16", {"layers": ["h.0.mlp"]})])
def test_the_run_goes_on_unaltered_after_the_block(recipe, options):
    cfg = TINY["bf16"]
    model = gpt(cfg)
    before = _global_state()
    with fpsim.emulate(model, recipe, **options):
        train(model, cfg, 2)
    assert _global_state() == before
    assert all(not p._backward_hooks for p in model.parameters())
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    expected = train(twin(model), cfg, 2)
    assert_same_steps(train(twin(model), cfg, 2), expected)      # plain FP32 steps, as before


def test_the_block_cleans_up_when_the_loop_raises():
    cfg = TINY["bf16"]
    model = gpt(cfg)
    before = _global_state()
    with pytest.raises(ZeroDivisionError):
        with fpsim.emulate(model, "fp16", loss_scale=8.0, keep=["h.0.attn:mul"]):
            model(*next(token_batches(cfg, 2, 1)))
            1 / 0
    assert _global_state() == before


class _Transient(Exception):
    pass


class _FlakyAdamW(torch.optim.AdamW):
    """AdamW whose step raises (before changing anything) on the calls numbered in `fail_on`."""

    def __init__(self, params, fail_on=(0,), **kwargs):
        super().__init__(params, **kwargs)
        self.fail_on, self.calls = set(fail_on), 0

    def step(self, closure=None):
        self.calls += 1
        if self.calls - 1 in self.fail_on:
            raise _Transient("step failed")
        return super().step(closure)


def _train_through_failures(model, cfg, steps, forward_context=contextlib.nullcontext):
    """train()'s loop with a step that fails on calls 0 and 2; the loop catches it and goes on."""
    optimizer = _FlakyAdamW(model.parameters(), fail_on=(0, 2), lr=1e-2)
    records = []
    for x, y in token_batches(cfg, 2, steps, seed=1):
        with forward_context():
            _, loss = model(x, y)
        optimizer.zero_grad()
        loss.backward()
        records.append((loss.detach().clone(), {n: p.grad.clone() for n, p in model.named_parameters()}))
        try:
            optimizer.step()
        except _Transient:
            pass
    return records


@pytest.mark.parametrize("options", [{}, {"layers": ["h.1.mlp"]}])
def test_steps_after_a_step_that_raised_equal_real_autocast_steps(options):
    """Source: the same loop, the same failing steps, under real CPU autocast (the emulated layer
    written by hand as in test_emulating_only_some_layers_runs_the_rest_in_fp32)."""
    cfg = TINY["bf16"]
    model = gpt(cfg)
    reference = twin(model)
    forward_context = real_autocast("bf16")
    if "layers" in options:
        mlp = reference.h[1].mlp
        mlp_forward = mlp.forward

        def emulated_alone(x):
            with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
                return mlp_forward(x).float()
        mlp.forward, forward_context = emulated_alone, contextlib.nullcontext
    expected = _train_through_failures(reference, cfg, 5, forward_context)
    before = _global_state()
    with fpsim.emulate(emu := twin(model), "bf16", policy="cpu", **options) as em:
        got = _train_through_failures(emu, cfg, 5)
    assert_same_steps(got, expected)
    assert em.steps == 3
    assert _global_state() == before


@pytest.mark.parametrize("recipe, options", [("bf16", {}), ("fp32", {}), ("fp16", {"keep": ["h.0.attn"]}),
                                             ("bf16", {"layers": ["h.0.mlp"]})])
def test_a_step_that_raises_out_of_the_block_leaves_autocast_as_it_was(recipe, options):
    """Source: torch's own autocast state and nesting counter before the block."""
    cfg = TINY["bf16"]
    model = gpt(cfg)
    optimizer = _FlakyAdamW(model.parameters(), fail_on=(1,))
    before = _global_state()
    with pytest.raises(_Transient):
        with fpsim.emulate(model, recipe, **options):
            for x, y in token_batches(cfg, 2, 2, seed=1):
                model(x, y)[1].backward()
                optimizer.step(lambda: None)
    assert _global_state() == before


class _Interrupt(BaseException):
    """Not an Exception: torch skips a module's always-called forward hooks for it."""


def test_a_forward_interrupted_inside_a_kept_module_leaves_the_next_forward_as_before():
    """Source: the emulated forward's output dtypes before the interruption (real autocast's:
    bf16 logits, the kept module's float32 output)."""
    cfg = TINY["bf16"]
    model = gpt(cfg)
    x, y = next(token_batches(cfg, 2, 1, seed=1))
    outputs = []
    model.h[0].attn.register_forward_hook(lambda module, args, out: outputs.append(out.dtype))

    def interrupt(module, args):
        raise _Interrupt()

    before = _global_state()
    with fpsim.emulate(model, "bf16", policy="cpu", keep=["h.0.attn"]):
        logits = model(x)[0].dtype
        handle = model.h[0].attn.c_proj.register_forward_pre_hook(interrupt)
        with pytest.raises(_Interrupt):
            model(x)
        handle.remove()
        assert model(x)[0].dtype == logits == torch.bfloat16
        assert torch.is_autocast_enabled("cpu")
    assert outputs == [torch.float32, torch.float32]
    assert _global_state() == before


def test_autocast_is_off_inside_every_step_nested_ones_included():
    """A step that wraps another optimizer's step (as Lookahead does) runs both with autocast
    off, and the forward after them with it on again, as an AMP loop runs them."""
    seen = []

    class Outer(torch.optim.SGD):
        def __init__(self, params, inner):
            super().__init__(params, lr=0.1)
            self.inner = inner

        def step(self, closure=None):
            seen.append(("outer", torch.is_autocast_enabled("cpu")))
            self.inner.step()
            torch.ones(2) + 1
            seen.append(("outer after inner", torch.is_autocast_enabled("cpu")))

    class Inner(torch.optim.SGD):
        def step(self, closure=None):
            torch.ones(2) * 2
            seen.append(("inner", torch.is_autocast_enabled("cpu")))
            return super().step(closure)

    model = torch.nn.Linear(4, 4)
    optimizer = Outer(model.parameters(), Inner(model.parameters(), lr=0.1))
    with fpsim.emulate(model, "bf16") as em:
        model(torch.randn(2, 4)).float().sum().backward()
        optimizer.step()
        seen.append(("forward", torch.is_autocast_enabled("cpu"), model(torch.randn(2, 4)).dtype))
    assert seen == [("outer", False), ("inner", False), ("outer after inner", False),
                    ("forward", True, torch.bfloat16)]
    assert em.steps == 1                        # the loop called step() once


def test_emulations_do_not_nest():
    model = gpt(TINY["bf16"])
    with fpsim.emulate(model, "bf16"):
        with pytest.raises(RuntimeError, match="do not nest"):
            with fpsim.emulate(model, "fp16"):
                pass


def test_a_kept_module_runs_as_one_keeps_it_by_hand():
    cfg = TINY["bf16"]
    model = gpt(cfg)
    reference = twin(model)
    attention = reference.h[0].attn
    forward = attention.forward

    def in_fp32(x):              # how one keeps a module in FP32 by hand under autocast
        with torch.autocast("cpu", enabled=False):
            return forward(x.float())

    attention.forward = in_fp32
    expected = train(reference, cfg, 3, real_autocast("bf16"))
    got, em = emulated(twin(model), cfg, 3, "bf16", policy="cpu", keep=["h.0.attn"])
    assert_same_steps(got, expected)
    assert em.selection.kept_modules == {"h.0.attn"}


def test_a_kept_op_runs_as_one_keeps_it_by_hand():
    """keep=["h.0.attn:mul"]: the attention logits' scaling in FP32, as if written
    ``with autocast(enabled=False): att = att.float() * scale``."""
    cfg = TINY["fp16"]
    model = gpt(cfg)
    reference = twin(model)
    attention = reference.h[0].attn

    def forward(x):                      # CausalSelfAttention.forward, the mul by hand in FP32
        B, T, C = x.shape
        q, k, v = attention.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, attention.n_head, C // attention.n_head).transpose(1, 2) for t in (q, k, v))
        with torch.autocast("cpu", enabled=False):
            att = (q @ k.transpose(-2, -1)).float() * attention.scale
        att = att.masked_fill(~attention.mask[:, :, :T, :T], float("-inf"))
        att = attention.attn_dropout(torch.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return attention.c_proj(y)

    attention.forward = forward
    expected = train(reference, cfg, 3, real_autocast("fp16"))
    got, em = emulated(twin(model), cfg, 3, "fp16", policy="cpu", keep=["h.0.attn:mul"])
    assert_same_steps(got, expected)
    assert em.selection.kept_ops == {"mul": {"h.0.attn"}}


def test_emulating_only_some_layers_runs_the_rest_in_fp32():
    cfg = TINY["bf16"]
    model = gpt(cfg)
    reference = twin(model)
    mlp = reference.h[1].mlp
    forward = mlp.forward

    def emulated_alone(x):
        with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
            return forward(x).float()

    mlp.forward = emulated_alone
    expected = train(reference, cfg, 3)
    got, _ = emulated(twin(model), cfg, 3, "bf16", policy="cpu", layers=["h.1.mlp"])
    assert_same_steps(got, expected)


def _bf16_weight_steps(reference, cfg, round_weights) -> list:
    """Three real CPU autocast bf16 steps of `reference` (AdamW), its weights rounded by round_weights()
    before the first step and after each: [(loss, {name: grad})] per step."""
    round_weights()
    optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    expected = []
    for x, y in token_batches(cfg, 2, 3, seed=1):
        with real_autocast("bf16")():
            _, loss = reference(x, y)
        optimizer.zero_grad()
        loss.backward()
        expected.append((loss.detach(), {n: p.grad.clone() for n, p in reference.named_parameters()}))
        optimizer.step()
        round_weights()
    return expected


def test_without_master_weights_the_weights_are_stored_in_the_low_format():
    cfg = TINY["bf16"]
    model = gpt(cfg)
    reference = twin(model)

    def round_all():
        with torch.no_grad():
            for p in reference.parameters():
                p.copy_(p.bfloat16())

    expected = _bf16_weight_steps(reference, cfg, round_all)
    emu_model = twin(model)
    got, _ = emulated(emu_model, cfg, 3, "bf16", policy="cpu", master_weights=False)
    assert_same_steps(got, expected)
    assert all(torch.equal(p, p.bfloat16().float()) for p in emu_model.parameters())


@pytest.mark.parametrize("options, fp32_modules", [({"keep": ["1"]}, {"1", "1.0", "1.1"}),
                                                   ({"layers": ["1"]}, {"0", "2"}),
                                                   ({"layers": ["1"], "keep": ["1.0"]}, {"0", "1.0", "2"}),
                                                   ({"keep": [torch.nn.LayerNorm]}, {"1.1"})])
def test_without_master_weights_modules_run_in_fp32_keep_fp32_weights(options, fp32_modules):
    """Source: the docs' meaning of keep/layers (those modules run in FP32, their inputs cast to
    FP32) and of master_weights=False (the weights of what runs in the low format are stored in it),
    the rounding done by torch's own cast (.bfloat16())."""
    torch.manual_seed(0)
    inner = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), inner, torch.nn.Linear(4, 4))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.rand_like(p) * 1e-3)          # off the bf16 grid
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with fpsim.emulate(model, "bf16", master_weights=False, **options):
        pass
    for name, p in model.named_parameters():
        owner = name.rpartition(".")[0]
        expected = before[name] if owner in fp32_modules else before[name].bfloat16().float()
        assert torch.equal(p, expected), name


def test_without_master_weights_a_kept_module_trains_with_fp32_weights():
    """Source: real CPU autocast, the kept attention written by hand (autocast off, inputs cast to
    FP32), every other module's weights rounded to bf16 after each step by torch's cast."""
    cfg = TINY["bf16"]
    model = gpt(cfg)
    reference = twin(model)
    attention = reference.h[0].attn
    forward = attention.forward

    def in_fp32(x):
        with torch.autocast("cpu", enabled=False):
            return forward(x.float())

    attention.forward = in_fp32
    kept = {id(p) for p in attention.parameters()}

    def round_the_rest():
        with torch.no_grad():
            for p in reference.parameters():
                if id(p) not in kept:
                    p.copy_(p.bfloat16())

    expected = _bf16_weight_steps(reference, cfg, round_the_rest)
    emu_model = twin(model)
    got, _ = emulated(emu_model, cfg, 3, "bf16", policy="cpu", master_weights=False, keep=["h.0.attn"])
    assert_same_steps(got, expected)
    for (name, p), q in zip(emu_model.named_parameters(), reference.parameters()):
        assert torch.equal(p, q), name
    assert not all(torch.equal(p, p.bfloat16().float()) for p in emu_model.h[0].attn.parameters())


def test_a_gpu_device_accumulates_gemms_as_its_tensor_cores_do():
    """sum = 1 + 2^-8 + 1.5 * 2^-24: float32 rounds the last term up to one ulp (2^-23), above bf16's tie
    at 1 + 2^-8, so bf16 gives 1 + 2^-7; the H100's block FMA truncates it away (Fasi et al. 2021), the
    tie goes to even: 1. The loop is the same either way."""
    layer = torch.nn.Linear(3, 1, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, 2.0 ** -8, 1.5 * 2.0 ** -24]]))
    x = torch.ones(1, 3)
    outputs = {}
    for device in (None, "h100"):
        with fpsim.emulate(layer, "bf16", device=device):
            y = layer(x)
            y.sum().backward()
        outputs[device] = y.item()
    assert outputs == {None: 1 + 2.0 ** -7, "h100": 1.0}


def test_compare_gives_each_recipes_loss_curve_from_the_same_start():
    cfg = TINY["bf16"]

    def build():
        return gpt(cfg, seed=7)

    def loop(model):
        train(model, cfg, 3)

    runs = fpsim.emulate.compare(build, loop, {"fp32": "fp32", "bf16": "bf16", "fp16 x1024": ("fp16", {"loss_scale": 1024.0})})
    assert list(runs) == ["fp32", "bf16", "fp16 x1024"]
    assert runs["fp32"].losses == [loss.item() for loss, _ in train(build(), cfg, 3)]
    assert [run.recipe for run in runs.values()] == ["fp32", "bf16", "fp16"]
    assert all(len(run.losses) == 3 and run.steps == 3 for run in runs.values())
    assert runs["bf16"].losses[0] != runs["fp32"].losses[0]


def test_matrix_products_the_tensor_core_model_does_not_cover_are_named():
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 2))
    with fpsim.emulate(net, "bf16", device="h100") as em:
        net(torch.randn(2, 3, 8, 8)).sum().backward()
    (note,) = em.notes
    assert note.startswith("accumulated in FP32, not on the h100 tensor-core model") and "convolution" in note


def test_matrix_vector_products_and_beta_zero_follow_the_tensor_core_and_torch():
    """mv goes through the tensor-core model as the one-column mm it is: products 1, 2^-8 and 3 * 2^-25
    truncate to 1 in one H100 block (TensorCore("h100") on the same operands), while FP32 accumulation
    gives 1 + 2^-8 in bf16; addmm with beta = 0 does not read C (torch's addmm docs: its NaN does not
    propagate); addbmm, one kernel summing a batch of products, is named as not modelled."""
    k = 48
    a, b = torch.zeros(k), torch.zeros(k)
    a[0], b[0], a[1], b[1], a[2], b[2] = 1, 1, 1, 2.0**-8, 3 * 2.0**-13, 2.0**-12
    matrix = torch.stack([a, a])
    want = fpsim.TensorCore("h100", inputs="bf16", output="fp32").matmul(matrix, b[:, None])[:, 0].bfloat16()
    assert want.tolist() == [1.0, 1.0] and (matrix @ b).bfloat16().tolist() != [1.0, 1.0]
    nan = torch.full((2, 3), float("nan"), dtype=torch.bfloat16)
    x, w = torch.ones(2, 4, dtype=torch.bfloat16), torch.full((4, 3), 4.0, dtype=torch.bfloat16)
    net = torch.nn.Linear(2, 2)
    with fpsim.emulate(net, "bf16", device="h100") as em:
        got = torch.mv(matrix.bfloat16(), b.bfloat16())
        beta0 = torch.addmm(nan, x, w, beta=0)
        torch.addbmm(torch.zeros(2, 3, dtype=torch.bfloat16), x[None], w[None])
    assert torch.equal(got, want)
    assert torch.equal(beta0, torch.addmm(nan, x, w, beta=0)) and beta0.tolist() == [[16.0] * 3] * 2
    assert any("addbmm" in note for note in em.notes)


def test_the_summary_says_what_ran_how():
    import json

    cfg = TINY["bf16"]
    _, em = emulated(gpt(cfg), cfg, 2, "fp8", keep=["lm_head", "h.0.attn:mul"], loss_scale=4.0)
    summary = json.loads(json.dumps(em.summary()))
    assert summary["recipe"] == "fp8" and summary["steps"] == 2 and len(summary["losses"]) == 2
    assert summary["kept_modules"] == ["lm_head"] and summary["kept_ops"] == {"mul": ["h.0.attn"]}
    assert summary["loss_scale"] == 4.0 and summary["device"] is None and summary["policy"] == "cuda"
    layer = summary["fp8_layers"]["h.0.mlp.c_fc"]
    assert layer["grad_output"]["format"] == "e5m2"
    assert layer["input"]["scale"] == em.fp8_layers["h.0.mlp.c_fc"].input.used.item()


@pytest.mark.parametrize("recipe", ["bf16", "fp16"])
def test_a_float64_model_says_that_autocast_leaves_it_as_it_is(recipe):
    # torch.autocast casts float32 only: a float64 model ran under emulate("bf16") exactly as without it,
    # silently. It still does (as real autocast would), and now says so, with the way out
    def run(emulate):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).double()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(1)
        with fpsim.emulate(model, recipe) if emulate else contextlib.nullcontext() as em:
            for _ in range(3):
                loss = model(torch.randn(4, 8, generator=g, dtype=torch.float64)).square().mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        return [p.detach().clone() for p in model.parameters()], em

    plain, _ = run(False)
    with pytest.warns(RuntimeWarning, match="float64 parameters"):
        emulated_params, em = run(True)
    assert all(torch.equal(a, b) for a, b in zip(plain, emulated_params))
    assert len(em.notes) == 1 and em.notes[0].startswith("0, 2 hold float64 parameters") and "model.float()" in em.notes[0]


@pytest.mark.parametrize("recipe, options", [("fp16", {"keep": ["1"]}), ("fp8", {}), ("bf16", {"layers": ["0"]})])
def test_a_model_copied_or_saved_whole_inside_the_block_trains_on_and_its_copies_compute_as_it_does(recipe, options):
    # the block's module hooks held its state: copy.deepcopy(model) raised "cannot pickle
    # 'torch._C._DispatchModule' object" and torch.save(model) a RuntimeError. Copies now hold inert hooks
    import copy
    import io

    def run(copies: bool):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(1)
        saved = []
        with fpsim.emulate(model, recipe, **options) as em:
            for _ in range(3):
                loss = model(torch.randn(16, 4, generator=g)).square().mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                if copies:
                    buffer = io.BytesIO()
                    torch.save(model, buffer)
                    saved.append((copy.deepcopy(model), buffer))
        return model, em.losses, saved

    plain, plain_losses, _ = run(False)
    model, losses, saved = run(True)
    assert losses == plain_losses
    best, buffer = saved[-1]
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    x = torch.randn(5, 4)
    assert torch.equal(best(x), model(x)) and torch.equal(loaded(x), model(x))


def _closure_steps(model, cfg, steps: int, forward_context=contextlib.nullcontext):
    """`steps` AdamW steps whose forward and backward run inside optimizer.step(closure), as LBFGS and
    Lightning's automatic optimisation run them: [(loss, {name: grad})] per step, as `train` gives them."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    records = []
    for x, y in token_batches(cfg, 2, steps, seed=1):
        def closure():
            optimizer.zero_grad()
            with forward_context():
                _, loss = model(x, y)
            loss.backward()
            return loss
        loss = optimizer.step(closure)
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        records.append((loss.detach().clone(), grads))
    return records


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_closure_step_is_emulated_as_the_same_loop_without_a_closure(fmt):
    # the emulation switches autocast off inside optimizer.step(), so a forward run by the closure inside it ran in
    # FP32: emulate("fp16") around Lightning's automatic optimisation trained bit for bit as FP32. The closure now
    # runs under the block's autocast: its steps equal those of the same loop calling step() after backward,
    # step by step, and its first step equals real CPU autocast's, bit for bit
    cfg = TINY[fmt]
    model = gpt(cfg)
    emulated_model = twin(model)
    with fpsim.emulate(emulated_model, fmt, policy="cpu") as em:
        got = _closure_steps(emulated_model, cfg, 4)
    loop, _ = emulated(twin(model), cfg, 4, fmt, policy="cpu")
    assert_same_steps(got, loop)
    assert_same_steps(got[:1], _closure_steps(twin(model), cfg, 4, real_autocast(fmt))[:1])
    assert em.steps == 4 and em.losses == [loss.item() for loss, _ in got]
    fp32 = _closure_steps(twin(model), cfg, 4)
    assert [loss.item() for loss, _ in fp32] != em.losses


@pytest.mark.parametrize("fullgraph", [False, True])
def test_a_compiled_model_is_emulated_as_the_eager_one_and_fpsims_handlers_are_not_compiled(fullgraph):
    # under a torch.compile'd model Dynamo compiled the emulation's op handler anew for each op (22 frames for 3
    # steps of a 2-layer MLP, recompiling to its limit with warnings; 17 s against 4 s), and compiled with
    # fullgraph=True the first step raised (Dynamo cannot trace the handler). Compiled code now runs eagerly
    # inside the block (torch.compiler.set_stance): no more frames compiled than the plain compiled run, and the
    # steps are those of the eager model emulated, bit for bit
    import copy
    import torch._dynamo

    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(64, 16, generator=g), torch.randn(64, 4, generator=g)) for _ in range(3)]

    def steps(model):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for x, y in batches:
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
        return losses

    def frames():
        return torch._dynamo.utils.counters["frames"]["ok"]

    eager = copy.deepcopy(base)
    with fpsim.emulate(eager, "bf16"):
        want = steps(eager)
    with torch._inductor.config.patch(force_disable_caches=True):
        torch._dynamo.reset()
        before = frames()
        fp32 = steps(torch.compile(copy.deepcopy(base), fullgraph=fullgraph))
        plain_frames = frames() - before
        torch._dynamo.reset()
        before = frames()
        compiled = torch.compile(copy.deepcopy(base), fullgraph=fullgraph)
        with fpsim.emulate(compiled, "bf16"):
            got = steps(compiled)
        emulated_frames = frames() - before
    assert all(torch.equal(a, b) for a, b in zip(got, want)) and not all(map(torch.equal, got, fp32))
    assert emulated_frames <= plain_frames
