"""Gradients through quantize(): the straight-through estimator for torch tensors that require grad.

Rounding is piecewise constant, so its true derivative is zero almost everywhere; fake
quantisation (quantisation-aware training, FP8 emulation, the analyzer's shadow steps)
instead passes the gradient through unchanged (Bengio et al. 2013, "Estimating or
propagating gradients through stochastic neurons"), or only inside the format's range.
This module is imported only when such a tensor arrives, so torch is loaded by then.
"""

from __future__ import annotations

import torch

from .formats import Format


class _StraightThrough(torch.autograd.Function):
    """Forward: `rounded` (computed without autograd). Backward: the incoming gradient in the
    input's dtype, times `mask` where one is given (the clipped variant)."""

    @staticmethod
    def forward(ctx, x, rounded, mask):
        ctx.input_dtype = x.dtype
        ctx.save_for_backward(mask)
        return rounded

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        grad = grad.to(ctx.input_dtype)
        if mask is not None:
            grad = torch.where(mask, grad, torch.zeros((), dtype=grad.dtype, device=grad.device))
        return grad, None, None


def straight_through(x, rounded, fmt: Format, how: str):
    """`rounded` (the values of quantize(x.detach())) attached to x's graph as `how` says."""
    mask = None
    if how == "clipped":
        mask = x.detach().double().abs() <= float(fmt.max)  # in float64, which holds every max: False for Inf and NaN
    return _StraightThrough.apply(x, rounded, mask)
