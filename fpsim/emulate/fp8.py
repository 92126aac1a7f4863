"""FP8 training as TransformerEngine runs it: per-tensor scales, FP8 GEMM inputs, high-precision rest.

Every GEMM of an FP8 linear layer (forward, and the data and weight gradients of backward)
takes its inputs in FP8: each tensor is multiplied by its per-tensor scale in float32,
rounded to the FP8 format with saturation (fpsim.quantize; CUDA's SATFINITE conversion),
the GEMM accumulates the FP8 values in float32 (or on a tensor-core model), and the result is
multiplied by the two inverse scales (as cuBLASLt's A and B scale factors). The gradient
passes the quantisation straight through, as TransformerEngine's FP8 Linear does; the bias
gradient comes from the unquantised output gradient.

Each tensor's scale comes from the recipe's scaling object (`fpsim.emulate.recipes`:
`scale(history, fp8_max, previous)`, `delayed`, `history_len`).
"""

from __future__ import annotations

import torch

from ..formats import format as get_format
from ..rounding import quantize
from .recipes import FORMATS

_FP32 = torch.float32


class TensorScale:
    """One FP8 tensor's state (an input, a weight or an output gradient of one layer): amax history and scale."""

    def __init__(self, scaling, fmt: str):
        self.scaling = scaling
        self.format = get_format(fmt)
        self.fp8_max = float(self.format.max)
        self.history: list = []          # 0-dim float32 amaxes, oldest first
        self.scale = None                # the scale the next cast uses (delayed scaling)
        self.used = None                 # the scale the last cast used

    def cast(self, x):
        """(x's FP8 values as float32, the inverse scale): x * scale rounded to the format, saturating."""
        amax = x.detach().abs().amax().to(_FP32)
        if self.scale is None:
            self.scale = torch.ones((), dtype=_FP32, device=x.device)
        if self.scaling.delayed:
            scale = self.scale
        else:
            scale = self.scaling.scale(amax.reshape(1), self.fp8_max, self.scale)
        values = quantize(x.detach().to(_FP32) * scale, self.format, saturate=True)
        self.used = scale
        self.history = (self.history + [amax])[-self.scaling.history_len:]
        self.scale = self.scaling.scale(torch.stack(self.history), self.fp8_max, scale) \
            if self.scaling.delayed else scale
        return values, torch.reciprocal(scale)


class FP8Layer:
    """The FP8 state of one linear layer: scales of its input, weight and output gradient, and its GEMMs."""

    def __init__(self, recipe, gemm):
        forward, backward = FORMATS[recipe.format]
        self.input = TensorScale(recipe.scaling, forward)
        self.weight = TensorScale(recipe.scaling, forward)
        self.grad_output = TensorScale(recipe.scaling, backward)
        self._gemm = gemm          # gemm(kind, a, b, format_a, format_b) -> float32 a @ b

    def matmul(self, kind: str, a, sa, b, sb, format_a, format_b):
        """(a @ b) * (sa * sb): an FP8 GEMM of values a, b with inverse scales sa, sb."""
        return self._gemm(kind, a, b, format_a, format_b) * (sa * sb)


class FP8Linear(torch.autograd.Function):
    """y = x W^T + b with FP8 GEMMs (module doc); the output in `out_dtype`."""

    @staticmethod
    def forward(ctx, x, weight, bias, layer: FP8Layer, out_dtype):
        x8, sx = layer.input.cast(x)
        w8, sw = layer.weight.cast(weight)
        rows = x8.reshape(-1, x8.shape[-1])
        y = layer.matmul("fprop", rows, sx, w8.t(), sw, layer.input.format, layer.weight.format)
        if bias is not None:
            y = y + bias.detach().to(out_dtype).to(_FP32)   # the bias in the activations' dtype, added in FP32
        ctx.save_for_backward(rows, sx, w8, sw)
        ctx.layer, ctx.shape, ctx.dtypes = layer, x.shape, (x.dtype, weight.dtype, None if bias is None else bias.dtype)
        return y.to(out_dtype).reshape(*x.shape[:-1], w8.shape[0])

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
        return dx, dw, db, None, None


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
