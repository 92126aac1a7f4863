"""Matrix products on a GPU's tensor cores (fpsim.TensorCore), for emulated training.

`TensorCoreGemm(device)` is the `gemm` of `fpsim.emulate.compute.FP32Compute`: the fp16/bf16
matrix products of a step (mm, addmm, bmm, baddbmm) go through the device's block-FMA model,
accumulating in its float32 output as cuBLAS does, and the epilogue adds alpha, beta and C in
float32; FP8 GEMMs take their cores from `core` (`fpsim.emulate.fp8`). The model is exact and
slow: K is walked block by block in torch operations (benchmarks/bench_emulate.py states the
cost).
"""

from __future__ import annotations

import torch

from ..tensorcore.core import TensorCore

_FORMAT_OF = {torch.float16: "fp16", torch.bfloat16: "bf16"}


class TensorCoreGemm:
    """fp16/bf16 GEMM ops of a step through `fpsim.TensorCore(device, inputs, "fp32")`."""

    def __init__(self, device: str):
        self.device = device
        self._cores: dict = {}

    def core(self, inputs: str, inputs_b: str | None = None, promote_every: int | None = None) -> TensorCore:
        key = (inputs, inputs_b, promote_every)
        if key not in self._cores:
            self._cores[key] = TensorCore(self.device, inputs=inputs, output="fp32", inputs_b=inputs_b,
                                          promote_every=promote_every)
        return self._cores[key]

    def __call__(self, name: str, args: tuple, kwargs: dict, dtype):
        """The float32 result of GEMM op `name` (mm, addmm, bmm, baddbmm, mv, addmv) whose operands are
        `dtype` values widened to float32."""
        core = self.core(_FORMAT_OF[dtype])
        if name in ("mm", "bmm", "mv"):
            a, b = args
            return _product(core, a, b)
        bias, a, b = args[:3]
        beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
        product = _product(core, a, b)
        # cuBLAS's epilogue: alpha * (A @ B) + beta * C in float32; beta = 0 does not read C (torch's addmm
        # docs: its NaN and Inf do not propagate)
        if beta == 0:
            return product if alpha == 1 else product * alpha
        return product + bias if (alpha, beta) == (1, 1) else product * alpha + bias * beta


def _product(core: TensorCore, a, b):
    """a @ b for (M, K) @ (K, N), (M, K) @ (K,) (a matrix-vector product: one column), or batch by batch
    for (B, M, K) @ (B, K, N)."""
    if b.dim() == 1:
        return core.matmul(a.contiguous(), b.reshape(-1, 1).contiguous()).reshape(-1)
    if a.dim() == 2:
        return core.matmul(a.contiguous(), b.contiguous())
    return torch.stack([core.matmul(a[i].contiguous(), b[i].contiguous()) for i in range(a.shape[0])])
