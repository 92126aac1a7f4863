"""Ops that write their arguments, under the emulation: in-place view ops, out= tensors torch resizes,
foreach ops and fused optimizers on fp16/bf16 tensors.

Sources of truth, each independent of fpsim:

* in-place view ops (transpose_, squeeze_, as_strided_, set_ ...): plain torch running the same op on
  the same tensor outside the emulation; they do no arithmetic, so sizes, strides, storage and every
  bit (a NaN's payload and sign included) must be torch's own;
* out= tensors torch resizes: plain torch for the sizes and strides it gives the out tensor; for the
  values, torch computing the op in float32 on the widened inputs and rounding once (the emulation's
  promise, docs/emulate.md);
* foreach ops (torch._foreach_*_): torch computing each element's op in float32 and rounding once;
* foreach and fused optimizers, GradScaler.unscale_: plain torch running the same optimizer on the
  same fp16/bf16 parameters and gradients. Bit for bit where the hyperparameters are values of the
  low format: torch's CPU kernels round the Python scalar of an in-place op (`add_(g, alpha=-lr)`,
  `_foreach_mul_(bufs, momentum)`) to the tensor's dtype before using it, where GPU kernels and the
  emulation use it in float32, so lr=0.1 or momentum=0.9 would part the two by design;
* RNNs with batch_first (torch's own code calls transpose_): real CPU torch.autocast with the same
  op policy (policy="cpu"), outputs within one ulp of 1 (bit for bit where measured).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import fpsim
from fpsim.emulate.compute import FP32Compute
from fpsim.testing import assert_bitwise_equal

FORMAT = {torch.bfloat16: "bf16", torch.float16: "fp16"}
_NAN_BITS = {torch.bfloat16: 0xffc1 - 0x10000, torch.float16: 0xfe01 - 0x10000}
"""Negative quiet NaNs with a payload, as int16 bit patterns (a widened copy written back would lose both)."""


def _values(dtype, *shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def _with_nan(dtype):
    """A 2x3 tensor of the low format whose element 4 is a NaN with a payload and a sign."""
    t = _values(dtype, 2, 3)
    t.view(torch.int16).view(-1)[4] = _NAN_BITS[dtype]
    return t


VIEW_OPS = {
    "transpose_": lambda t, o: t.transpose_(0, 1), "t_": lambda t, o: t.t_(),
    "swapdims_": lambda t, o: t.swapdims_(0, 1), "swapaxes_": lambda t, o: t.swapaxes_(1, 0),
    "unsqueeze_": lambda t, o: t.unsqueeze_(1),
    "squeeze_ dim": lambda t, o: t.unsqueeze_(0).squeeze_(0), "squeeze_": lambda t, o: t.view(1, 6, 1).squeeze_(),
    "as_strided_": lambda t, o: t.as_strided_((3, 2), (1, 3), 0), "resize_": lambda t, o: t.resize_(4),
    "resize_as_": lambda t, o: t.resize_as_(o[:1, :2]), "set_": lambda t, o: t.set_(o),
    "detach_": lambda t, o: t.detach_(),
}


@pytest.mark.parametrize("dtype", FORMAT, ids=FORMAT.values())
def test_in_place_view_ops_change_only_the_real_tensors_sizes_and_strides(dtype):
    for name, op in VIEW_OPS.items():
        want, other = _with_nan(dtype), _values(dtype, 3, 2, seed=1)
        want_returned = op(want, other)
        got, got_other = _with_nan(dtype), other.clone()
        storage = got.untyped_storage().data_ptr()
        with FP32Compute():
            returned = op(got, got_other)
        assert returned is got if want_returned is want else returned.shape == want_returned.shape, name
        assert (got.shape, got.stride(), got.storage_offset()) == \
            (want.shape, want.stride(), want.storage_offset()), name
        if name == "set_":                     # the storage is the source's, as torch's; else the tensor's own
            storage = got_other.untyped_storage().data_ptr()
        assert got.untyped_storage().data_ptr() == storage, name
        assert_bitwise_equal(got, want, FORMAT[dtype], err_msg=name)


OUT_OPS = {   # name: (op writing out=, the same op in float32)
    "mm": (lambda a, b, out: torch.mm(a, b.t(), out=out), lambda a, b: torch.mm(a, b.t())),
    "add, transposed": (lambda a, b, out: torch.add(a.t(), b.t(), alpha=0.3, out=out),
                        lambda a, b: torch.add(a.t(), b.t(), alpha=0.3)),
    "sum": (lambda a, b, out: torch.sum(a, 1, out=out), lambda a, b: torch.sum(a, 1)),
    "exp, too large": (lambda a, b, out: torch.exp(a, out=out), lambda a, b: torch.exp(a)),
}


@pytest.mark.parametrize("dtype", FORMAT, ids=FORMAT.values())
def test_an_out_tensor_torch_resizes_is_resized_and_holds_the_rounded_result(dtype):
    a, b = _values(dtype, 4, 5), _values(dtype, 4, 5, seed=1)
    for name, (op, wide) in OUT_OPS.items():
        fresh = (lambda: torch.empty(30, dtype=dtype)) if "too large" in name else (lambda: torch.empty(0, dtype=dtype))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)     # torch's "An output with one or more elements was resized"
            want = fresh()
            op(a, b, want)
            got = fresh()
            with FP32Compute():
                returned = op(a, b, got)
        assert returned is got, name
        assert (got.shape, got.stride()) == (want.shape, want.stride()), name
        assert_bitwise_equal(got, wide(a.float(), b.float()).to(dtype), FORMAT[dtype], err_msg=name)
    want = (torch.empty(0, dtype=dtype), torch.empty(0, dtype=torch.long))
    torch.max(a, 1, out=want)
    got = (torch.empty(0, dtype=dtype), torch.empty(0, dtype=torch.long))
    with FP32Compute():
        returned = torch.max(a, 1, out=got)
    assert returned[0] is got[0] and returned[1] is got[1]
    assert got[0].shape == want[0].shape == (4,) and torch.equal(got[1], want[1])
    assert_bitwise_equal(got[0], want[0], FORMAT[dtype])


FOREACH = {   # name: (the in-place foreach op on lists [a], [b], [c], element by element in float32)
    "_foreach_add_ alpha": (lambda a, b, c: torch._foreach_add_(a, b, alpha=-0.1),
                            lambda a, b, c: torch.add(a, b, alpha=-0.1)),
    "_foreach_mul_ scalar": (lambda a, b, c: torch._foreach_mul_(a, 0.9), lambda a, b, c: a * 0.9),
    "_foreach_div_": (lambda a, b, c: torch._foreach_div_(a, c), lambda a, b, c: a / c),
    "_foreach_addcmul_": (lambda a, b, c: torch._foreach_addcmul_(a, b, c, value=0.3),
                          lambda a, b, c: torch.addcmul(a, b, c, value=0.3)),
    "_foreach_addcdiv_": (lambda a, b, c: torch._foreach_addcdiv_(a, b, c, value=-0.01),
                          lambda a, b, c: torch.addcdiv(a, b, c, value=-0.01)),
    "_foreach_lerp_": (lambda a, b, c: torch._foreach_lerp_(a, b, 0.1), lambda a, b, c: torch.lerp(a, b, 0.1)),
    "_foreach_sqrt_": (lambda a, b, c: torch._foreach_sqrt_(c), None),
    "_foreach_exp_": (lambda a, b, c: torch._foreach_exp_(a), lambda a, b, c: torch.exp(a)),
}


def _lists(dtype):
    """Three lists of two tensors of different shapes; the first list's second tensor is a strided view
    into a larger tensor (not dense). c is positive."""
    base = _values(dtype, 4, 6, seed=3)
    a = [_values(dtype, 5, seed=4), base[:, ::2]]
    b = [_values(dtype, 5, seed=5), _values(dtype, 4, 3, seed=6)]
    c = [_values(dtype, 5, seed=7).abs() + 0.5, _values(dtype, 4, 3, seed=8).abs() + 0.5]
    return a, b, c, base


@pytest.mark.parametrize("dtype", FORMAT, ids=FORMAT.values())
def test_foreach_ops_write_float32_results_rounded_once_into_every_tensor_of_the_list(dtype):
    for name, (op, each) in FOREACH.items():
        a, b, c, base = _lists(dtype)
        written = c if each is None else a
        each = each or (lambda a, b, c: torch.sqrt(c))
        want = [each(x.float(), y.float(), z.float()).to(dtype) for x, y, z in zip(a, b, c)]
        with FP32Compute():
            op(a, b, c)
        for i, (got, expected) in enumerate(zip(written, want)):
            assert got.dtype == dtype
            assert_bitwise_equal(got, expected, FORMAT[dtype], err_msg=f"{name}, tensor {i}")
        if written is a:
            assert_bitwise_equal(base[:, ::2], want[1], FORMAT[dtype], err_msg=f"{name}: the view's base")


def _model(dtype):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).to(dtype)


OPTIMIZERS = {
    "SGD(foreach=True)": lambda p: torch.optim.SGD(p, lr=0.125, momentum=0.875, foreach=True),
    "Adam(foreach=True)": lambda p: torch.optim.Adam(p, lr=0.01, foreach=True),
    "Adam(fused=True)": lambda p: torch.optim.Adam(p, lr=0.01, fused=True),
    "AdamW(fused=True)": lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.5, fused=True),
    "clip_grad_norm_(foreach=True), SGD": None,
}


@pytest.mark.parametrize("dtype", FORMAT, ids=FORMAT.values())
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_foreach_and_fused_optimizers_train_a_low_precision_model_as_torch_does(dtype, name):
    """Three real steps (forward, backward, step) under the emulation; plain torch then runs the same
    optimizer from the same initial parameters with the gradients each emulated step had."""
    make = OPTIMIZERS[name] or (lambda p: torch.optim.SGD(p, lr=0.25, foreach=True))
    clip = OPTIMIZERS[name] is None
    model, reference = _model(dtype), _model(dtype)
    start = [p.detach().clone() for p in model.parameters()]
    optimizer, plain = make(model.parameters()), make(reference.parameters())
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(16, 4, generator=g), torch.randn(16, 2, generator=g)) for _ in range(3)]
    steps = []
    with fpsim.emulate(model, FORMAT[dtype]):
        for x, y in batches:
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
            optimizer.zero_grad()
            loss.backward()
            grads = [p.grad.clone() for p in model.parameters()]
            if clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01, foreach=True)
            optimizer.step()
            steps.append((grads, [p.detach().clone() for p in model.parameters()]))
    for step, (grads, weights) in enumerate(steps):
        for p, grad in zip(reference.parameters(), grads):
            p.grad = grad.clone()
        if clip:
            torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.01, foreach=True)
        plain.step()
        for i, (p, w) in enumerate(zip(reference.parameters(), weights)):
            assert_bitwise_equal(w, p.detach(), FORMAT[dtype], err_msg=f"step {step}, parameter {i}")
    assert all(not torch.equal(p, p0) for p, p0 in zip(model.parameters(), start))
    for state, want in zip(optimizer.state.values(), plain.state.values()):
        for key, value in want.items():
            if isinstance(value, torch.Tensor) and value.dtype in FORMAT:
                assert_bitwise_equal(state[key], value, FORMAT[dtype], err_msg=key)


def test_a_grad_scaler_unscales_bf16_gradients_as_torch_does():
    """GradScaler.unscale_ (torch._amp_foreach_non_finite_check_and_unscale_ writes the gradient list)."""
    def unscaled(emulated):
        model = _model(torch.bfloat16)
        for i, p in enumerate(model.parameters()):
            p.grad = _values(torch.bfloat16, *p.shape, seed=10 + i) * 1024
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        scaler.scale(torch.ones(()))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        if emulated:
            with fpsim.emulate(model, "bf16"):
                scaler.unscale_(optimizer)
        else:
            scaler.unscale_(optimizer)
        return [p.grad for p in model.parameters()]
    for got, want in zip(unscaled(True), unscaled(False)):
        assert got.abs().max() < 64
        assert_bitwise_equal(got, want, "bf16")


RNNS = {"RNN": torch.nn.RNN, "GRU": torch.nn.GRU}
_ULP_OF_ONE = {torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10}


@pytest.mark.parametrize("dtype", FORMAT, ids=FORMAT.values())
@pytest.mark.parametrize("name", RNNS)
def test_batch_first_rnns_run_as_under_real_cpu_autocast(dtype, name):
    """torch's RNN code swaps a batch-first input's axes with transpose_. For float32 input and input
    already in the low format: real CPU autocast's shapes and dtypes, its gradients' shapes, and its
    values (an RNN in float32, as a GRU on float32 input, is the same computation: equal). Outputs in the
    low format lie in (-1, 1): within one ulp of 1 of autocast's. They were bit for bit equal when
    measured (torch 2.13, AVX2); the slack is for GEMMs summing in another float32 order on other CPUs
    (docs/emulate.md: matrix products differ only by the order of float32 summation)."""
    for input_dtype in (torch.float32, dtype):
        torch.manual_seed(0)
        real = RNNS[name](4, 6, num_layers=2, batch_first=True)
        emulated = copy.deepcopy(real)
        x = torch.randn(3, 5, 4, generator=torch.Generator().manual_seed(1)).to(input_dtype)
        with torch.autocast("cpu", dtype=dtype, cache_enabled=False):
            want, want_h = real(x)
        want.float().sum().backward()
        with fpsim.emulate(emulated, FORMAT[dtype], policy="cpu"):
            got, got_h = emulated(x)
            got.float().sum().backward()
        assert (got.shape, got.dtype, got_h.shape, got_h.dtype) == (want.shape, want.dtype, want_h.shape, want_h.dtype)
        assert got.shape == (3, 5, 6)
        if got.dtype in FORMAT:
            torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=_ULP_OF_ONE[dtype])
        else:
            assert torch.equal(got, want)
        for p, q in zip(emulated.parameters(), real.parameters()):
            assert p.grad.shape == q.grad.shape and torch.isfinite(p.grad).all()
