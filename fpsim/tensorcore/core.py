"""TensorCore: dot and matrix products as a GPU's tensor cores compute them.

    tc = fpsim.TensorCore("h100", inputs="e4m3", output="fp32")
    d = tc.dot(a, b, c)          # a, b: (..., K); c: (...)
    D = tc.matmul(A, B, C=None)  # (M, K) @ (K, N) + (M, N)

The products are chained through block FMAs (see `blockfma`), in k order.
Beyond one instruction, libraries choose how partial sums meet; these are
parameters too:

* ``split_k=S``: K is cut into S contiguous slices, each accumulated by the
  tensor core from zero (the first from C), and the S partial results are
  added in binary32 (round to nearest) at the end, as split-K GEMMs do;
* ``promote_every=N``: every N products the tensor core's partial result is
  added into a binary32 accumulator on the CUDA cores (round to nearest):
  the FP8 remedy of DeepSeek-V3 (N = 128) and CUTLASS.
"""

from __future__ import annotations

import numpy as np

from .. import _arrays
from ..formats import PRESETS, Format, format as get_format
from ..rounding import quantize
from . import devices
from .blockfma import ZERO_EXPONENT, BlockFMA, alignment_exponents, block_step

_FP32 = PRESETS["fp32"]


class TensorCore:
    """A model of one GPU's tensor cores for one input format and one output format.

    device: product or generation name ("h100", "a100", "hopper", ...).
    inputs: "fp16", "bf16", "tf32", "e4m3" or "e5m2"; output: "fp32" or "fp16".
    inputs_b: B's format when it differs from A's (FP8: e4m3 with e5m2).
    path: for FP8 on Hopper and Blackwell, "native" (wgmma, as cuBLAS; the
        default) or "fp16" (through binary16 MMAs, as FP8 mma.sync compiles).
    round_inputs: None refuses inputs (and C) that are not exactly values of
        their formats; a rounding mode name rounds them first.
    split_k, promote_every: accumulation beyond one instruction (module doc).
    epilogue: a format the final result is rounded to (nearest even), as a
        GEMM writing fp16 or bf16 from an fp32 accumulator does.
    overrides: any BlockFMA field (block_size, extra_bits, rounding, ...), to
        explore a hypothetical device.
    """

    def __init__(self, device: str = "h100", inputs: str = "fp16", output: str = "fp32", *,
                 inputs_b: str | None = None, path: str | None = None, round_inputs: str | None = None,
                 split_k: int = 1,
                 promote_every: int | None = None, epilogue: str | None = None, **overrides):
        self.device = device
        self.inputs: Format = get_format(inputs)
        self.inputs_b: Format = get_format(inputs_b) if inputs_b is not None else self.inputs
        fp8 = ("e4m3", "e5m2")
        if self.inputs_b != self.inputs and not (self.inputs.name in fp8 and self.inputs_b.name in fp8):
            raise ValueError(f"mixed input formats are FP8 only (e4m3 with e5m2); got {inputs} and {inputs_b}")
        self.output: Format = get_format(output)
        self.params: BlockFMA = devices.parameters(device, self.inputs.name, self.output.name, path, **overrides)
        self.epilogue: Format | None = get_format(epilogue) if epilogue is not None else None
        if round_inputs is not None:
            from ..modes import check_rounding

            check_rounding(round_inputs)
        self.round_inputs = round_inputs
        if not isinstance(split_k, int) or split_k < 1:
            raise ValueError(f"split_k must be a positive int, got {split_k!r}")
        if promote_every is not None and (not isinstance(promote_every, int) or promote_every < 1
                                          or promote_every % self.params.block_size):
            raise ValueError(f"promote_every must be a positive multiple of the block size "
                             f"{self.params.block_size}, got {promote_every!r}")
        if promote_every is not None and split_k > 1:
            raise ValueError("choose split_k or promote_every, not both")
        self.split_k = split_k
        self.promote_every = promote_every

    def __repr__(self) -> str:
        extra = ""
        if self.split_k > 1:
            extra += f", split_k={self.split_k}"
        if self.promote_every:
            extra += f", promote_every={self.promote_every}"
        return (f"TensorCore({self.device!r}, inputs={self.inputs.name!r}, output={self.output.name!r}{extra}; "
                f"{self.params})")

    # ----------------------------------------------------------------- API
    def dot(self, a, b, c=None):
        """d[...] = sum_k a[..., k] * b[..., k] + c[...], computed as the tensor core does."""
        ops = _arrays.Ops(a)
        a64 = self._flushed(self._checked(a, self.inputs, "a", ops), self.inputs, ops)
        b64 = self._flushed(self._checked(b, self.inputs_b, "b", ops), self.inputs_b, ops)
        if tuple(a64.shape) != tuple(b64.shape):
            raise ValueError(f"a and b must have the same shape, got {tuple(a64.shape)} and {tuple(b64.shape)}")
        if a64.ndim == 0:
            raise ValueError("a and b need a last axis (K)")
        c64 = self._c_values(c, tuple(a64.shape[:-1]), ops, a64)
        aw, bw = self._work(a64, ops), self._work(b64, ops)
        ea, eb = self._exponents(a64, self.inputs, ops), self._exponents(b64, self.inputs_b, ops)
        finite = _all_finite(aw, ops) and _all_finite(bw, ops)

        def products(ks):
            return aw[..., ks] * bw[..., ks], ea[..., ks] + eb[..., ks]

        return self._result(self._accumulate(products, a64.shape[-1], c64, ops, finite), ops)

    def matmul(self, A, B, C=None):
        """D = A @ B + C for A (M, K), B (K, N), C (M, N) or None, computed as the tensor core does."""
        ops = _arrays.Ops(A)
        a64 = self._flushed(self._checked(A, self.inputs, "A", ops), self.inputs, ops)
        b64 = self._flushed(self._checked(B, self.inputs_b, "B", ops), self.inputs_b, ops)
        if a64.ndim != 2 or b64.ndim != 2 or a64.shape[1] != b64.shape[0]:
            raise ValueError(f"matmul needs A (M, K) and B (K, N), got {tuple(a64.shape)} and {tuple(b64.shape)}")
        M, K = a64.shape
        N = b64.shape[1]
        c64 = self._c_values(C, (M, N), ops, a64)
        aw, bw = self._work(a64, ops), self._work(b64.T, ops)
        ea, eb = self._exponents(a64, self.inputs, ops), self._exponents(b64.T, self.inputs_b, ops)
        finite = _all_finite(aw, ops) and _all_finite(bw, ops)
        # rows in chunks, so that one block's (rows, N, F) temporaries stay in cache
        rows = max(1, (1 << 19) // max(1, N * self.params.block_size))
        parts = []
        for r0 in range(0, M, rows):
            a_rows, e_rows = aw[r0:r0 + rows], ea[r0:r0 + rows]

            def products(ks, a_rows=a_rows, e_rows=e_rows):
                return (a_rows[:, None, ks] * bw[None, :, ks], e_rows[:, None, ks] + eb[None, :, ks])

            parts.append(self._accumulate(products, K, c64[r0:r0 + rows], ops, finite))
        out = _arrays._torch.cat(parts) if ops.torch else np.concatenate(parts)
        return self._result(out, ops)

    # ------------------------------------------------------------ helpers
    def _checked(self, x, fmt: Format, name: str, ops):
        """x as float64 values, refused (or rounded, if asked) when not exactly in `fmt`."""
        if ops.torch != _arrays.is_torch(x):
            raise TypeError(f"{name} must be the same array type as the first operand (numpy or torch)")
        array = x if ops.torch else np.asarray(x)
        if self.round_inputs is not None:
            array = quantize(array, fmt, self.round_inputs)
        values = array.to(_arrays._torch.float64) if ops.torch else np.asarray(array, dtype=np.float64)
        rounded = quantize(values, fmt, "nearest_even")
        same = (rounded == values) | ((rounded != rounded) & (values != values))
        if not bool(same.all()):
            bad = np.argwhere(~(same.cpu().numpy() if ops.torch else same))[0]
            value = float(values[tuple(bad)])
            raise ValueError(f"{name}[{', '.join(map(str, bad))}] = {value!r} is not a {fmt.name} value; round the "
                             f"inputs first (fpsim.quantize) or pass round_inputs='nearest_even'")
        return values

    def _c_values(self, c, shape, ops, like):
        if c is None:
            if ops.torch:
                return _arrays._torch.zeros(shape, dtype=_arrays._torch.float64, device=like.device)
            return np.zeros(shape, dtype=np.float64)
        c64 = self._checked(c, self.output, "c", ops)
        if tuple(c64.shape) != tuple(shape):
            raise ValueError(f"c must have shape {tuple(shape)}, got {tuple(c64.shape)}")
        return c64

    def _exponents(self, x, fmt: Format, ops):
        return alignment_exponents(x, fmt, ops)

    def _flushed(self, x, fmt: Format, ops):
        """Subnormal inputs as zeros, for a data path that does not take them."""
        if self.params.subnormal_inputs:
            return x
        return ops.where(abs(x) < float(fmt.min_normal), x * 0, x)

    def _work(self, x, ops):
        """Inputs in the narrowest float whose products are exact: float32 for formats of
        at most 5 exponent bits (fp16, FP8), float64 otherwise (bf16, tf32)."""
        if self.inputs.exp_bits > 5:
            return x
        return x.to(_arrays._torch.float32) if ops.torch else x.astype(np.float32)

    def _accumulate(self, products, K: int, c, ops, finite: bool = True):
        """All K products with the configured strategy; products(ks) gives those of index array ks."""
        with np.errstate(invalid="ignore", over="ignore"):  # Inf * 0 lanes are settled by _specials
            return self._accumulate_all(products, K, c, ops, finite)

    def _accumulate_all(self, products, K: int, c, ops, finite: bool):
        if self.promote_every:
            slices = [(lo, min(K, lo + self.promote_every)) for lo in range(0, K, self.promote_every)]
            total = c
            for lo, hi in slices:
                total = _fp32_add(total, self._chain(products, lo, hi, _zeros_like(c, ops), ops, finite), ops)
            return self._round_to_output(total, ops)
        if self.split_k > 1:
            chunk = self.params.instruction_k or self.params.block_size
            per = -(-(-(-K // chunk)) // self.split_k) * chunk
            partials = [self._chain(products, lo, min(K, lo + per), c if lo == 0 else _zeros_like(c, ops), ops, finite)
                        for lo in range(0, K, per)]
            total = partials[0]
            for partial in partials[1:]:
                total = _fp32_add(total, partial, ops)
            return self._round_to_output(total, ops)
        return self._chain(products, 0, K, c, ops, finite)

    def _chain(self, products, lo: int, hi: int, c, ops, finite: bool = True):
        """Products lo..hi-1 through the instructions' blocks, starting from c."""
        params = self.params
        chunk = params.instruction_k or params.block_size
        d = c
        for start in range(lo, hi, chunk):
            blocks = params.instruction_order(min(chunk, hi - start))
            before = d
            if params.c_position == "last":
                d = _zeros_like(d, ops)
            for ks in blocks:
                p, exponents = products(ks + start)
                d = self._step(p, exponents, d, ops, finite)
            if params.c_position == "last":
                d = quantize(d + before, params.output_format, "nearest_even")
        return d

    def _step(self, p, exponents, c, ops, finite_products: bool):
        """One block, with the IEEE special cases (NaN, Inf) settled first."""
        c_finite = _isfinite(c, ops)
        if finite_products and bool(c_finite.all()):
            return block_step(p, exponents, c, alignment_exponents(c, _FP32, ops), self.params, ops)
        p_ok = _isfinite(p, ops)
        p_clean = ops.where(p_ok, p, ops.constant(0.0, p))
        e_clean = ops.where(p_ok, exponents, ops.constant(ZERO_EXPONENT, exponents))
        c_clean = ops.where(c_finite, c, 0.0)
        d = block_step(p_clean, e_clean, c_clean, alignment_exponents(c_clean, _FP32, ops), self.params, ops)
        return _specials(p, c, d, ops)

    def _round_to_output(self, total, ops):
        return quantize(total, self.output, "nearest_even") if self.output.name != "fp32" else total

    def _result(self, out, ops):
        fmt = self.output
        if self.epilogue is not None:
            out, fmt = quantize(out, self.epilogue, "nearest_even"), self.epilogue
        if ops.torch:
            return out.to(fmt.torch_dtype)
        return np.asarray(out).astype(fmt.ml_dtype)


def _zeros_like(x, ops):
    return _arrays._torch.zeros_like(x) if ops.torch else np.zeros_like(x)


def _isfinite(x, ops):
    return _arrays._torch.isfinite(x) if ops.torch else np.isfinite(x)


def _all_finite(x, ops) -> bool:
    return bool(_isfinite(x, ops).all())


def _specials(p, c, d, ops):
    """IEEE rules for a block with NaN or Inf among its products or c."""
    isnan = (p != p).any(-1) | (c != c)
    pos = (p == float("inf")).any(-1) | (c == float("inf"))
    neg = (p == float("-inf")).any(-1) | (c == float("-inf"))
    d = ops.where(pos, float("inf"), d)
    d = ops.where(neg, float("-inf"), d)
    return ops.where(isnan | (pos & neg), float("nan"), d)


def _fp32_add(x, y, ops):
    """x + y rounded to binary32 (nearest even), from float64 holding binary32 values (exact sum)."""
    return quantize(x + y, _FP32, "nearest_even")
