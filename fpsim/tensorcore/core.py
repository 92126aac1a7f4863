"""TensorCore: dot and matrix products as a GPU's tensor cores compute them.

    tc = fpsim.TensorCore("h100", inputs="e4m3", output="fp32")
    d = tc.dot(a, b, c)          # a, b: (..., K); c: (...)
    D = tc.matmul(A, B, C=None)  # (M, K) @ (K, N) + (M, N)

The products go through the device's instructions, each a chain of block FMAs
(`blockfma`); how the instructions' results meet over K is the schedule
(`accumulation`: sequential, split_k, promote_every, epilogue). Device facts
come from `devices`.
"""

from __future__ import annotations

import numpy as np

from .. import _arrays
from ..formats import Format, format as get_format
from ..modes import check_rounding
from ..rounding import quantize
from . import devices
from .accumulation import Schedule, accumulate
from .blockfma import BlockFMA, alignment_exponents


class TensorCore:
    """A model of one GPU's tensor cores for one input format and one output format.

    device: product or generation name ("h100", "a100", "hopper", ...).
    inputs: "fp16", "bf16", "tf32", "e4m3" or "e5m2"; output: "fp32" or "fp16".
    inputs_b: B's format when it differs from A's (FP8: e4m3 with e5m2).
    path: for FP8 on Hopper and Blackwell, "native" (wgmma, as cuBLAS; the
        default) or "fp16" (through binary16 MMAs, as FP8 mma.sync compiles).
    instruction: the MMA instruction's shape ("m16n8k8"), one the device has
        for these formats: its k products make one instruction (default: the
        preset's).
    round_inputs: None refuses inputs (and C) that are not exactly values of
        their formats; a rounding mode name rounds them first.
    split_k, promote_every, epilogue: accumulation beyond one instruction
        (`accumulation.Schedule`).
    overrides: any BlockFMA field (block_size, extra_bits, rounding, ...), to
        explore a hypothetical device.
    """

    def __init__(self, device: str = "h100", inputs: str = "fp16", output: str = "fp32", *,
                 inputs_b: str | None = None, path: str | None = None, instruction: str | None = None,
                 round_inputs: str | None = None, split_k: int = 1, promote_every: int | None = None,
                 epilogue: str | None = None, **overrides):
        self.device = device
        self.inputs: Format = get_format(inputs)
        self.inputs_b: Format = get_format(inputs_b) if inputs_b is not None else self.inputs
        devices.check_inputs(self.inputs.name, self.inputs_b.name)
        self.output: Format = get_format(output)
        self.instruction = instruction
        self.params: BlockFMA = devices.parameters(device, self.inputs.name, self.output.name, path, instruction,
                                                   **overrides)
        self.schedule = Schedule(split_k, promote_every, epilogue)
        self.schedule.check(self.params)
        self.round_inputs = check_rounding(round_inputs) if round_inputs is not None else None

    split_k = property(lambda self: self.schedule.split_k)
    promote_every = property(lambda self: self.schedule.promote_every)
    epilogue = property(lambda self: self.schedule.epilogue)

    def __repr__(self) -> str:
        return (f"TensorCore({self.device!r}, inputs={self.inputs.name!r}, output={self.output.name!r}"
                f"{self.schedule.describe()}; {self.params})")

    # ----------------------------------------------------------------- API
    def dot(self, a, b, c=None):
        """d[...] = sum_k a[..., k] * b[..., k] + c[...], computed as the tensor core does."""
        ops = _arrays.Ops(a)
        a64, b64 = self._checked(a, self.inputs, "a", ops), self._checked(b, self.inputs_b, "b", ops)
        if tuple(a64.shape) != tuple(b64.shape):
            raise ValueError(f"a and b must have the same shape, got {tuple(a64.shape)} and {tuple(b64.shape)}")
        if a64.ndim == 0:
            raise ValueError("a and b need a last axis (K)")
        c64 = self._c_values(c, tuple(a64.shape[:-1]), ops, a64)
        (aw, ea), (bw, eb), finite = self._operands(a64, b64, ops)

        def products(ks):
            return aw[..., ks] * bw[..., ks], ea[..., ks] + eb[..., ks]

        return self._result(self._accumulate(products, a64.shape[-1], c64, ops, finite), ops)

    def matmul(self, A, B, C=None):
        """D = A @ B + C for A (M, K), B (K, N), C (M, N) or None, computed as the tensor core does."""
        ops = _arrays.Ops(A)
        a64, b64 = self._checked(A, self.inputs, "A", ops), self._checked(B, self.inputs_b, "B", ops)
        if a64.ndim != 2 or b64.ndim != 2 or a64.shape[1] != b64.shape[0]:
            raise ValueError(f"matmul needs A (M, K) and B (K, N), got {tuple(a64.shape)} and {tuple(b64.shape)}")
        (M, K), N = a64.shape, b64.shape[1]
        c64 = self._c_values(C, (M, N), ops, a64)
        (aw, ea), (bw, eb), finite = self._operands(a64, b64.T, ops)
        # rows in chunks, so that one block's (rows, N, F) temporaries stay in cache
        rows = max(1, (1 << 19) // max(1, N * self.params.block_size))
        parts = []
        for r0 in range(0, M, rows):
            a_rows, e_rows = aw[r0:r0 + rows], ea[r0:r0 + rows]

            def products(ks, a_rows=a_rows, e_rows=e_rows):
                return a_rows[:, None, ks] * bw[None, :, ks], e_rows[:, None, ks] + eb[None, :, ks]

            parts.append(self._accumulate(products, K, c64[r0:r0 + rows], ops, finite))
        return self._result(ops.concat(parts), ops)

    # ------------------------------------------------------------ helpers
    def _operands(self, a64, b64, ops):
        """((values, alignment exponents) of A, the same of B, whether all are finite): values in
        the narrowest float whose products are exact, float32 for formats of at most 5 exponent
        bits (fp16, FP8), float64 otherwise (bf16, tf32)."""
        out = []
        for x, fmt in ((a64, self.inputs), (b64, self.inputs_b)):
            if not self.params.subnormal_inputs:  # a data path that flushes subnormal inputs
                x = ops.where(abs(x) < float(fmt.min_normal), x * 0, x)
            work = x if self.inputs.exp_bits > 5 else ops.astype(x, "float32")
            out.append((work, alignment_exponents(x, fmt, ops)))
        finite = all(bool((abs(work) < float("inf")).all()) for work, _ in out)
        return out[0], out[1], finite

    def _accumulate(self, products, K: int, c, ops, finite: bool):
        return accumulate(products, K, c, self.params, self.schedule, self.output, ops, finite)

    def _checked(self, x, fmt: Format, name: str, ops):
        """x as float64 values, refused (or rounded, if asked) when not exactly in `fmt`."""
        ops.check_same(x, name)
        array = ops.array(x)
        if self.round_inputs is not None:
            array = quantize(array, fmt, self.round_inputs)
        values = ops.astype(array, "float64")
        rounded = quantize(values, fmt, "nearest_even")
        same = (rounded == values) | ((rounded != rounded) & (values != values))
        if not bool(same.all()):
            bad = np.argwhere(~ops.to_host(same))[0]
            value = float(values[tuple(bad)])
            raise ValueError(f"{name}[{', '.join(map(str, bad))}] = {value!r} is not a {fmt.name} value; round the "
                             f"inputs first (fpsim.quantize) or pass round_inputs='nearest_even'")
        return values

    def _c_values(self, c, shape, ops, like):
        if c is None:
            return ops.zeros(shape, "float64")
        c64 = self._checked(c, self.output, "c", ops)
        if tuple(c64.shape) != tuple(shape):
            raise ValueError(f"c must have shape {tuple(shape)}, got {tuple(c64.shape)}")
        return c64

    def _result(self, out, ops):
        return ops.as_dtype_of(ops.array(out), self.epilogue or self.output)
