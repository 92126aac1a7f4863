"""How a shadow step replays a step in a format: context managers around one functional_call forward.

`FP32` is the reference (autocast off). `Autocast` runs torch.autocast in
FP16 or BF16, real low-precision arithmetic (torch's own kernels: on a CPU
without FP16/BF16 matrix units these are many times slower than FP32 ones).
`EmulatedAutocast` applies the same autocast op policy (the same casts, the
same ops in the low format, the same tensors saved for backward) and computes
every op on FP16/BF16 tensors in FP32, rounding each result once to its dtype
(`fpsim.emulate.compute.FP32Compute`, forward and backward): what a GPU
kernel does, at about FP32's cost. `FakeQuant` runs FP32 arithmetic
with the operands of every layer's matrix product (F.linear, the
convolutions, F.bilinear, a product with a parameter, wherever they are
called), and the gradient arriving at its output, fake-quantised in a
per-tensor-scaled format with a current scale (max / amax, as
fpsim.recipes.CurrentScaling) and a straight-through gradient. `Autocast`
and `FakeQuant` watch every module of the root for overflow sources (an
output non-finite from finite inputs: the innermost such module, recorded in
`found`) and run the modules in `keep` outside autocast, their floating
inputs cast to FP32.
"""

from __future__ import annotations

import contextlib
import functools
import math

from .nested import float_tensors
from .readable import real_parts


class FP32:
    """The reference: autocast off, the parameters as they are."""

    def __init__(self, device_type):
        import torch

        self._autocast = torch.autocast(device_type, enabled=False)

    def parameters(self, params: dict) -> dict:
        return params

    def arithmetic(self):
        """A context around the replay's forward and all its backwards (below autograd); none here."""
        return contextlib.nullcontext()

    def __enter__(self):
        self._autocast.__enter__()
        return self

    def __exit__(self, *exc):
        self._autocast.__exit__(*exc)
        return False


class SourceFound(Exception):
    """Raised out of a replay's forward at its first overflow source when `Replay.stop_at_source` is set: the
    rest of that forward would be redone with the source in FP32 anyway. An Exception, so that modules'
    always-called forward hooks (the watcher's module stack) still run on the way out."""


class Replay:
    """A context for one replay: watches every module of the root for overflow sources (output non-finite
    from finite inputs) and runs the modules in `keep` in FP32. stop_at_source: raise SourceFound at the
    first source found."""

    stop_at_source = False

    def __init__(self, core, module_names, keep, found):
        self.core, self.module_names, self.keep, self.found = core, module_names, keep, found
        self._handles: list = []
        self._inner: list = []

    def parameters(self, params: dict) -> dict:
        return params

    def arithmetic(self):
        """A context around the replay's forward and all its backwards (below autograd); none here."""
        return contextlib.nullcontext()

    def __enter__(self):
        from torch.nn.modules import module as nn_module

        self._enter()
        self._handles = [nn_module.register_module_forward_pre_hook(self._pre),
                         nn_module.register_module_forward_hook(self._post, always_call=True)]
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        while self._inner:
            self._inner.pop().__exit__(None, None, None)
        self._exit()
        return False

    def _enter(self):
        pass

    def _exit(self):
        pass

    def _pre(self, module, args):
        import torch

        if module in self.keep:
            ctx = torch.autocast(self.device_type, enabled=False)
            ctx.__enter__()
            self._inner.append(ctx)
            return tuple(a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
        return None

    def _post(self, module, args, output):
        if module in self.keep and self._inner:
            self._inner.pop().__exit__(None, None, None)
        qual = self.module_names.get(id(module))
        if qual is None or qual in self.found or module in self.keep:
            return None
        if not all_finite(output) and all_finite(args):
            inner = [q for q in self.found if q.startswith(qual + ".") or not qual]
            if not inner:            # the innermost module that overflowed, not its parents
                self.found[qual] = module
                if self.stop_at_source:
                    raise SourceFound(qual)
        return None


class Autocast(Replay):
    """torch.autocast in `dtype`: real FP16/BF16 arithmetic."""

    def __init__(self, core, module_names, device_type, dtype, keep, found):
        super().__init__(core, module_names, keep, found)
        self.device_type, self.dtype = device_type, dtype

    def _enter(self):
        import torch

        self._autocast = torch.autocast(self.device_type, dtype=self.dtype)
        self._autocast.__enter__()

    def _exit(self):
        self._autocast.__exit__(None, None, None)


class EmulatedAutocast(Autocast):
    """torch.autocast's op policy in `dtype`, every FP16/BF16 op computed in FP32 and rounded once (module doc).

    compute: the FP32Compute mode to use; one kept across replays keeps its per-op caches (the output dtypes
    it asks each op's meta kernel for once: the first replay of a model costs several replays' time)."""

    def __init__(self, core, module_names, device_type, dtype, keep, found, compute):
        super().__init__(core, module_names, device_type, dtype, keep, found)
        self.compute = compute

    def arithmetic(self):
        stack = contextlib.ExitStack()
        stack.enter_context(_PythonDispatch())
        stack.enter_context(self.compute)
        return stack


class _PythonDispatch:
    """Python dispatch on again for a dispatch mode of the replay's own: the watcher runs its work, the replay
    included, with it off (trace.Tracer.busy; its mode lets that work pass while busy); restored after."""

    def __enter__(self):
        import torch

        self._keys = (torch._C.DispatchKey.Python, torch._C.DispatchKey.PythonTLSSnapshot)
        self._before = [torch._C._dispatch_tls_is_dispatch_key_excluded(k) for k in self._keys]
        for key in self._keys:
            torch._C._dispatch_tls_set_dispatch_key_excluded(key, False)
        return self

    def __exit__(self, *exc):
        import torch

        for key, excluded in zip(self._keys, self._before):
            torch._C._dispatch_tls_set_dispatch_key_excluded(key, excluded)
        return False


class FakeQuant(Replay):
    """FP32 arithmetic with each matrix product of a layer taking its operands fake-quantised in `lim`'s format
    with current per-tensor scales, and the gradient of its output too (_quantized_products): F.linear, the
    convolutions and F.bilinear, and a plain product (addmm, mm, matmul) with a parameter for an operand, found
    where they are called, so that nn.Linear and nn.Conv*d, their subclasses, parametrized weights
    (weight_norm), a weight tied to another module's, transformers' Conv1D and a functional call alike take
    part; none inside a module kept in FP32."""

    def __init__(self, core, module_names, lim, keep, found):
        super().__init__(core, module_names, keep, found)
        self.lim = lim
        self.weights: set = set()
        self.products = 0             # the products fake-quantised (none: the model's run inside fused kernels)

    def parameters(self, params: dict) -> dict:
        self.weights = {id(t) for t in params.values()}      # (a plain product with one of these is a layer's)
        return params

    def arithmetic(self):
        return _quantized_products()(self)

    def is_weight(self, t) -> bool:
        """Whether `t` is one of the replay's parameters, or a view of one (a transposed weight)."""
        return id(t) in self.weights or (getattr(t, "_base", None) is not None and id(t._base) in self.weights)

    @property
    def in_kept_module(self) -> bool:
        return bool(self._inner)     # (a kept module's autocast-off context, from its pre-hook to its post-hook)


@functools.cache
def _quantized_products():
    """The TorchFunctionMode of FakeQuant (made on first use: torch loads late): a product's floating operands
    (by position or name) fake-quantised, its output's gradient too. The layers' own functions always; the
    plain matrix products (addmm, mm, matmul: transformers' Conv1D, a weight multiplied in a forward) when an
    operand is a parameter, so that attention's products of activations stay as they are (TransformerEngine's
    FP8 attention is off by default)."""
    import torch
    from torch.overrides import TorchFunctionMode

    functional = torch.nn.functional
    layers = {functional.linear: ("input", "weight"), functional.bilinear: ("input1", "input2", "weight"),
              **{conv: ("input", "weight") for conv in (functional.conv1d, functional.conv2d, functional.conv3d)}}
    products = {torch.addmm: ("mat1", "mat2"), torch.mm: ("input", "mat2"), torch.matmul: ("input", "other"),
                torch.Tensor.addmm: ("mat1", "mat2"), torch.Tensor.mm: ("self", "mat2"),
                torch.Tensor.matmul: ("self", "other"), torch.Tensor.__matmul__: ("self", "other")}
    positions = {torch.addmm: (1, 2), torch.Tensor.addmm: (1, 2)}

    def quantized(x, lim):
        return _quantize(x, lim) if isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex()) \
            else x

    def operands(replay, func, args, kwargs):
        """The names and positions of func's operands to quantise in `replay`, or None."""
        names = layers.get(func)
        if names is not None:
            return names, range(len(names))
        names = products.get(func)
        if names is None:
            return None
        places = positions.get(func, (0, 1))
        given = [args[i] if i < len(args) else kwargs.get(name) for i, name in zip(places, names)]
        return (names, places) if any(replay.is_weight(t) for t in given) else None

    class QuantizedProducts(TorchFunctionMode):
        def __init__(self, replay):
            super().__init__()
            self.replay = replay

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            found = operands(self.replay, func, args, kwargs)
            if found is None or self.replay.in_kept_module:
                return func(*args, **kwargs)
            names, places = found
            self.replay.products += 1
            lim = self.replay.lim
            args = tuple(quantized(a, lim) if i in places else a for i, a in enumerate(args))
            kwargs = {k: quantized(v, lim) if k in names else v for k, v in kwargs.items()}
            out = func(*args, **kwargs)
            return _quantize_gradient(out, lim) if isinstance(out, torch.Tensor) and out.requires_grad else out

    return QuantizedProducts


def _quantize(x, lim):
    """x fake-quantised with a current per-tensor scale (max / amax, as CurrentScaling), straight-through gradient."""
    if x.requires_grad:
        return _autograd_functions()[0].apply(x, lim)
    return _quantized_values(x, lim)


def _quantized_values(x, lim):
    """quantize(x * scale, saturate=True) / scale with scale = max / amax (1 where amax is 0, Inf or NaN):
    detached, the division in place on the quantized tensor (one temporary, no autograd nodes). A complex x:
    its real and imaginary parts, each a value of the format, under one scale."""
    import torch

    from ..rounding import quantize

    if x.is_complex():
        return torch.view_as_complex(_quantized_values(real_parts(x.detach()).contiguous(), lim))
    amax = 0.0
    x = x.detach()
    if x.numel():                    # max |x| from one min/max reduction (no |x| temporary); NaN or inf: scale 1
        lo, hi = (float(v) for v in torch.aminmax(x))
        amax = max(-lo, hi) if math.isfinite(lo) and math.isfinite(hi) else math.inf
    if not (amax > 0 and math.isfinite(amax)):
        return quantize(x, lim.fmt, saturate=True)
    scale = float(lim.fmt.max) / amax
    return quantize(x * scale, lim.fmt, saturate=True).div_(scale)


def _quantize_gradient(x, lim):
    """x unchanged forward; backward: the incoming gradient fake-quantised as `_quantize` quantises values."""
    return _autograd_functions()[1].apply(x, lim)


@functools.cache
def _autograd_functions():
    """(FakeQuantize, QuantizeGradient): the autograd Functions of `_quantize` on tensors that require grad
    (the fake-quantised values forward, the gradient unchanged backward) and of `_quantize_gradient`; made on
    first use (torch loads late)."""
    import torch

    class FakeQuantize(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, lim):
            return _quantized_values(x, lim)

        @staticmethod
        def backward(ctx, grad):
            return grad, None

    class QuantizeGradient(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, lim):
            ctx.lim = lim
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            return _quantized_values(grad, ctx.lim), None

    return FakeQuantize, QuantizeGradient


# ------------------------------------------------------------------ helpers
def all_finite(value) -> bool:
    """Whether every floating tensor in `value` is finite: its min and max both are (NaN propagates through
    both). One reduction per tensor, with Python dispatch off for plain tensors (an emulated replay's mode
    would widen each one first): the replay checks every module's output, so this is on its hot path."""
    import torch

    for t in float_tensors(value):
        if not t.numel():
            continue
        with torch._C._DisableTorchDispatch() if type(t) is torch.Tensor else contextlib.nullcontext():
            lo, hi = torch.aminmax(real_parts(t.detach()))
            if not (math.isfinite(lo.item()) and math.isfinite(hi.item())):
                return False
    return True
