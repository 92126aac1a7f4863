"""FP8 training as TransformerEngine runs it: scaled FP8 GEMM inputs, high-precision rest.

Every GEMM of an FP8 linear layer (forward, and the data and weight gradients of backward)
takes its inputs in FP8. How each input is scaled is the recipe's (fpsim.recipes): for a
per-tensor recipe (DelayedScaling, CurrentScaling) the tensor is multiplied by its scale in
float32 and rounded to the FP8 format with saturation (fpsim.quantize; CUDA's SATFINITE
conversion of TE's kernels, which round x * scale to float32 first), the GEMM accumulates
the FP8 values in float32 (or on a tensor-core model), and the result is multiplied by the
two inverse scales (as cuBLASLt's A and B scale factors). For per-channel and block recipes
the tensor is the recipe's dequantised values (fpsim.recipes' quantize, along the last axis),
multiplied in float32. The gradient passes the quantisation straight through, as
TransformerEngine's FP8 Linear does; the bias gradient comes from the unquantised output
gradient.
"""

from __future__ import annotations

import torch

from ..recipes import DelayedScaling
from ..rounding import quantize
from .recipes import PER_TENSOR

_FP32 = torch.float32


class TensorScale:
    """One FP8 tensor of one layer (its input, weight or output gradient): the recipe's state for it."""

    def __init__(self, scaling, kind: str):
        self.scaling = scaling
        self.kind = kind                 # "activation", "weight" or "gradient" (fpsim.recipes.KINDS)
        self.format = scaling.format_for(kind)
        self.state = scaling.new_state() if isinstance(scaling, DelayedScaling) else None
        self.per_tensor = isinstance(scaling, PER_TENSOR)
        self.used = None                 # the scale the last cast used (per-tensor recipes)

    def cast(self, x, again: bool = False):
        """(values as float32, inverse scale or None): FP8 elements and fl32(1 / scale) for a per-tensor
        recipe; the recipe's dequantised values and None for the others. again: the same cast once more (a
        forward that activation checkpointing recomputes in backward): the scale the last cast used, and no
        amax recorded a second time."""
        x = x.detach()
        if not self.per_tensor:
            values = self.scaling.quantize(x, self.state, kind=self.kind)
            return values.to(_FP32), None
        if self.state is not None and again and self.used is not None:
            scale = self.used
        else:
            if self.state is not None:       # delayed: this cast uses the scale from earlier amaxes
                scale = self.state.scale
                self.scaling.record(self.state, x.abs().amax().float().item(), self.kind)
            else:
                scale = self.scaling.scale(x, self.kind)
            scale = self.used = torch.tensor(scale, dtype=_FP32, device=x.device)
        return quantize(x.to(_FP32) * scale, self.format, saturate=True), torch.reciprocal(scale)

    @property
    def history(self) -> list:
        """The amaxes a delayed recipe holds, oldest first (empty for the others)."""
        return [] if self.state is None else list(self.state.history)

    @property
    def scale(self):
        """The scale the next cast uses (delayed recipes), else None."""
        return None if self.state is None else float(self.state.scale)


class FP8Layer:
    """The FP8 state of one linear layer: its input, weight and output gradient, and its GEMMs."""

    def __init__(self, recipe, gemm):
        self.input = TensorScale(recipe.scaling, "activation")
        self.weight = TensorScale(recipe.scaling, "weight")
        self.grad_output = TensorScale(recipe.scaling, "gradient")
        self._gemm = gemm          # gemm(kind, a, b, format_a, format_b) -> float32 a @ b

    def matmul(self, kind: str, a, sa, b, sb, format_a, format_b):
        """(a @ b) * (sa * sb): an FP8 GEMM of values a, b with inverse scales sa, sb (None: dequantised)."""
        product = self._gemm(kind, a, b, format_a, format_b)
        return product if sa is None else product * (sa * sb)


class FP8Linear(torch.autograd.Function):
    """y = x W^T + b with FP8 GEMMs (module doc); the output in `out_dtype`."""

    @staticmethod
    def forward(ctx, x, weight, bias, layer: FP8Layer, out_dtype, again: bool = False):
        x8, sx = layer.input.cast(x, again)
        w8, sw = layer.weight.cast(weight, again)
        rows = x8.reshape(-1, x8.shape[-1])
        y = layer.matmul("fprop", rows, sx, w8.t(), sw, layer.input.format, layer.weight.format)
        if bias is not None:
            y = y + bias.detach().to(out_dtype).to(_FP32)   # the bias in the activations' dtype, added in FP32
        ctx.save_for_backward(rows, sx, w8, sw)
        ctx.layer, ctx.shape, ctx.dtypes = layer, x.shape, (x.dtype, weight.dtype, None if bias is None else bias.dtype)
        # not a view (of the 2-D product), as nn.Linear's output is not: an in-place op on a view would drop
        # the hooks FSDP2 puts on a module's output
        return torch.ops.aten._unsafe_view(y.to(out_dtype), (*x.shape[:-1], w8.shape[0]))

    @staticmethod
    def backward(ctx, grad):
        rows, sx, w8, sw = ctx.saved_tensors
        layer = ctx.layer
        x_dtype, w_dtype, b_dtype = ctx.dtypes
        grad_rows = grad.reshape(-1, grad.shape[-1])
        g8, sg = layer.grad_output.cast(grad_rows)
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = layer.matmul("dgrad", g8, sg, w8, sw, layer.grad_output.format, layer.weight.format)
            dx = dx.to(x_dtype).reshape(ctx.shape)
        if ctx.needs_input_grad[1]:
            dw = layer.matmul("wgrad", g8.t().contiguous(), sg, rows, sx, layer.grad_output.format,
                              layer.input.format).to(w_dtype)
        if b_dtype is not None and ctx.needs_input_grad[2]:
            db = grad_rows.to(_FP32).sum(0).to(b_dtype)
        return dx, dw, db, None, None, None


def fp32_gemm(kind, a, b, format_a, format_b):
    """FP8 values multiplied and accumulated in float32 (torch's own GEMM)."""
    return a @ b


class TensorCoreFP8Gemm:
    """FP8 GEMMs on a device's tensor-core model: `fast_accumulation` kinds in the tensor core's own
    accumulator, the others promoted to float32 every `promote_every` products."""

    def __init__(self, cores, fast_accumulation: tuple, promote_every: int):
        self.cores = cores                      # a fpsim.emulate.gemm.TensorCoreGemm
        self.fast = set(fast_accumulation)
        self.promote_every = promote_every

    def __call__(self, kind, a, b, format_a, format_b):
        every = None if kind in self.fast else self.promote_every
        core = self.cores.core(format_a.name, format_b.name, every)
        return core.matmul(a.contiguous(), b.contiguous())
