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
from .._fpmode import subnormals_kept
from ..blocks import format as get_any_format
from ..formats import Format, format as get_format
from ..modes import check_rounding
from ..rounding import quantize
from . import devices
from .accumulation import Schedule, accumulate
from .blockfma import ZERO_EXPONENT, BlockFMA, alignment_exponents
from .values import exact_float64


class TensorCore:
    """A model of one GPU's tensor cores for one input format and one output format.

    device: product or generation name ("h100", "a100", "hopper", ...).
    inputs: "fp16", "bf16", "tf32", "e4m3" or "e5m2", or a block format of the
        Blackwell block-scaled MMAs ("mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2",
        "mxfp6_e2m3", "mxfp4", "nvfp4"; NOT yet validated against a GPU: see
        `unvalidated`); output: "fp32" or "fp16".
    inputs_b: B's format when it differs from A's (FP8: e4m3 with e5m2; the MX
        formats with each other, as kind::mxf8f6f4 takes them).
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
        a_name = get_any_format(inputs).name
        b_name = get_any_format(inputs_b).name if inputs_b is not None else a_name
        devices.check_inputs(device, a_name, b_name)
        # block formats: A and B are their elements, each block of K scaled by scale_a / scale_b
        self.block_formats = ((devices.block_format(a_name), devices.block_format(b_name))
                              if devices.is_block(a_name) else None)
        self.inputs: Format = self.block_formats[0].element if self.block_formats else get_format(a_name)
        self.inputs_b: Format = self.block_formats[1].element if self.block_formats else get_format(b_name)
        self.output: Format = get_format(output)
        if self.block_formats and a_name != b_name and instruction is None:
            instruction = devices.instruction(device, a_name, self.output.name, k=32).shape  # kind::mxf8f6f4
        self.instruction = instruction
        self.params: BlockFMA = devices.parameters(device, a_name, self.output.name, path, instruction,
                                                   **overrides)
        self.unvalidated: str | None = devices.unvalidated(device, a_name, self.output.name, path)
        """Why this data path's parameters are a hypothesis (no GPU capture has checked them), else None."""
        self.schedule = Schedule(split_k, promote_every, epilogue)
        self.schedule.check(self.params)
        self.round_inputs = check_rounding(round_inputs) if round_inputs is not None else None

    split_k = property(lambda self: self.schedule.split_k)
    promote_every = property(lambda self: self.schedule.promote_every)
    epilogue = property(lambda self: self.schedule.epilogue)

    def __repr__(self) -> str:
        inputs = self.block_formats[0].name if self.block_formats else self.inputs.name
        note = f"; {self.unvalidated.upper()}" if self.unvalidated else ""
        return (f"TensorCore({self.device!r}, inputs={inputs!r}, output={self.output.name!r}"
                f"{self.schedule.describe()}; {self.params}{note})")

    # ----------------------------------------------------------------- API
    @subnormals_kept
    def dot(self, a, b, c=None, *, scale_a=None, scale_b=None):
        """d[...] = sum_k a[..., k] * b[..., k] + c[...], computed as the tensor core does.

        Block formats: a and b hold element values, scale_a and scale_b (..., K / block) the
        values of their block scales (E8M0, or E4M3 >= 0 for NVFP4): the products are
        (a[k] * scale_a[k // block]) (b[k] * scale_b[k // block]), as PTX's block_scale MMAs
        compute D = (A * scale_A)(B * scale_B) + C.

        Tensors are read detached: the result carries no gradient (requires_grad is False)."""
        ops = _arrays.Ops(a)
        a64, b64 = self._checked(a, self.inputs, "a", ops), self._checked(b, self.inputs_b, "b", ops)
        if tuple(a64.shape) != tuple(b64.shape):
            raise ValueError(f"a and b must have the same shape, got {tuple(a64.shape)} and {tuple(b64.shape)}")
        if a64.ndim == 0:
            raise ValueError("a and b need a last axis (K)")
        c64 = self._c_values(c, tuple(a64.shape[:-1]), ops, a64)
        sa, sb = self._block_scales(scale_a, scale_b, a64.shape, a64.shape, ops)
        (aw, ea), (bw, eb), finite = self._operands(a64, b64, ops, sa, sb)

        def products(ks):
            return aw[..., ks] * bw[..., ks], ea[..., ks] + eb[..., ks]

        return self._result(self._accumulate(products, a64.shape[-1], c64, ops, finite), ops)

    @subnormals_kept
    def matmul(self, A, B, C=None, *, scale_a=None, scale_b=None):
        """D = A @ B + C for A (M, K), B (K, N), C (M, N) or None, computed as the tensor core does.

        Block formats: scale_a (M, K / block) and scale_b (K / block, N), as in `dot`. Tensors are
        read detached: the result carries no gradient."""
        ops = _arrays.Ops(A)
        a64, b64 = self._checked(A, self.inputs, "A", ops), self._checked(B, self.inputs_b, "B", ops)
        if a64.ndim != 2 or b64.ndim != 2 or a64.shape[1] != b64.shape[0]:
            raise ValueError(f"matmul needs A (M, K) and B (K, N), got {tuple(a64.shape)} and {tuple(b64.shape)}")
        (M, K), N = a64.shape, b64.shape[1]
        c64 = self._c_values(C, (M, N), ops, a64)
        sa, sb = self._block_scales(scale_a, scale_b, a64.shape, (N, K), ops, b_transposed=True)
        (aw, ea), (bw, eb), finite = self._operands(a64, b64.T, ops, sa, sb)
        # rows in chunks, so that one block's (rows, N, F) temporaries stay in cache
        rows = max(1, (1 << 19) // max(1, N * self.params.block_size))
        parts = []
        for r0 in range(0, max(M, 1), rows):  # M = 0: one empty chunk, for the result's shape and dtype
            a_rows, e_rows = aw[r0:r0 + rows], ea[r0:r0 + rows]

            def products(ks, a_rows=a_rows, e_rows=e_rows):
                return a_rows[:, None, ks] * bw[None, :, ks], e_rows[:, None, ks] + eb[None, :, ks]

            parts.append(self._accumulate(products, K, c64[r0:r0 + rows], ops, finite))
        return self._result(ops.concat(parts), ops)

    # ------------------------------------------------------------ helpers
    def _operands(self, a64, b64, ops, scale_a=None, scale_b=None):
        """((values, alignment exponents) of A, the same of B, whether all are finite): values in
        the narrowest float whose products are exact, float32 for formats of at most 5 exponent
        bits (fp16, FP8), float64 otherwise (bf16, tf32) and for block formats, whose elements
        carry their block's scale (float64 values along K, or None): scaled value element * scale,
        alignment exponent the element's plus floor(log2(scale)) (a hypothesis: docs/tensorcore.md)."""
        out = []
        for x, fmt, scale in ((a64, self.inputs, scale_a), (b64, self.inputs_b, scale_b)):
            if not self.params.subnormal_inputs:  # a data path that flushes subnormal inputs
                x = ops.where(abs(x) < float(fmt.min_normal), x * 0, x)
            exponents = alignment_exponents(x, fmt, ops)
            if scale is None:
                work = x if self.inputs.exp_bits > 5 else ops.astype(x, "float32")
            else:  # exact in float64: at most 4 + 4 significant bits, exponents within +-300
                work = x * scale
                usable = (scale > 0) & (scale < float("inf"))
                shift = ops.astype(ops.floor_log2(ops.where(usable, scale, 1.0)), "int16")
                exponents = ops.where(usable & (x != 0), exponents + shift, ZERO_EXPONENT)
                exponents = ops.astype(exponents, "int16")
            out.append((work, exponents))
        finite = all(bool((abs(work) < float("inf")).all()) for work, _ in out)
        return out[0], out[1], finite

    def _block_scales(self, scale_a, scale_b, a_shape, b_shape, ops, b_transposed: bool = False):
        """scale_a and scale_b as float64 values along K (each repeated over its block), checked to be
        values of the scale format; (None, None) for other inputs, which take no scales.
        b_transposed: scale_b comes as (K / block, N) for B (K, N), as matmul takes it."""
        if self.block_formats is None:
            if scale_a is not None or scale_b is not None:
                raise ValueError(f"scale_a and scale_b belong to block formats; {self.inputs.name} inputs take none")
            return None, None
        out = []
        for scale, fmt, shape, name in ((scale_a, self.block_formats[0], a_shape, "scale_a"),
                                        (scale_b, self.block_formats[1], b_shape, "scale_b")):
            block = fmt.block_size
            if tuple(shape)[-1] % block:
                raise ValueError(f"K = {tuple(shape)[-1]} is not a multiple of {fmt.name}'s block of {block}")
            along_k = tuple(shape[:-1]) + (shape[-1] // block,)
            transposed = name == "scale_b" and b_transposed
            want = along_k[::-1] if transposed else along_k
            if scale is None:
                raise ValueError(f"{fmt.name} inputs need {name}: one {fmt.scale.name} scale per {block} elements "
                                 f"of K, shape {want}")
            values = self._checked(scale, fmt.scale, name, ops)
            if tuple(values.shape) != want:
                raise ValueError(f"{name} must have shape {want} (one scale per {block} elements of K), "
                                 f"got {tuple(values.shape)}")
            values = values.T if transposed else values
            if bool(np.signbit(ops.to_host(values)).any()):
                raise ValueError(f"{name} holds a negative scale (-0 included); block scales are unsigned "
                                 f"(PTX .ue8m0, .ue4m3)")
            out.append(ops.repeat(values, block))
        return out[0], out[1]

    def _accumulate(self, products, K: int, c, ops, finite: bool):
        return accumulate(products, K, c, self.params, self.schedule, self.output, ops, finite)

    def _checked(self, x, fmt: Format, name: str, ops):
        """x as float64 values, refused (or rounded, if asked) when not exactly in `fmt`, integers
        compared as integers (`values`); TypeError for what fpsim.quantize refuses (complex,
        strings, booleans). A tensor that requires grad is read detached: the model is not
        differentiable."""
        ops.check_same(x, name)
        try:
            array = _arrays.detached(_arrays.accept(x).array)
            _arrays.input_format(array)
        except TypeError as error:
            raise TypeError(f"{name}: {error}") from None
        advice = "; round the inputs first (fpsim.quantize) or pass round_inputs='nearest_even'"
        if self.round_inputs is not None:
            array = quantize(array, fmt, self.round_inputs)  # (integers rounded from their exact value)
        values = exact_float64(array, name, fmt.name, advice, ops)
        rounded = quantize(values, fmt, "nearest_even")
        same = (rounded == values) | ((rounded != rounded) & (values != values))
        if not bool(same.all()):
            bad = np.argwhere(~ops.to_host(same))[0]
            value = float(values[tuple(bad)])
            raise ValueError(f"{name}[{', '.join(map(str, bad))}] = {value!r} is not a {fmt.name} value{advice}")
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

