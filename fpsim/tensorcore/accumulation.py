"""How partial sums meet over K: the tensor core's own chain, library schedules, and references.

Schedules (`Schedule`, used by `TensorCore`), on numpy arrays and torch tensors alike:

* sequential (the default): every instruction chained in k order, each one's
  result the next one's accumulator, as one long MMA chain;
* ``split_k=S``: K cut into S contiguous slices (whole instructions), each
  accumulated by the tensor core from zero (the first from C), the partial
  results added in binary32 (round to nearest) at the end, as split-K GEMMs do;
* ``promote_every=N``: every N products the tensor core's partial result is
  added into a binary32 accumulator on the CUDA cores (round to nearest): the
  FP8 remedy of DeepSeek-V3 (N = 128) and CUTLASS;
* ``epilogue``: the result rounded once more (nearest even) to the format a
  library writes, as a GEMM writing fp16 or bf16 from an fp32 accumulator.

References to compare tensor cores with (`reference_dot`, on binary32 inputs):
products formed exactly (float64 holds the product of two binary32 values), then

* ``exact``: the exact value of sum(a*b) + c, rounded once to binary32 (nearest
  even): math.fsum gives the float64 nearest the exact sum, a second fsum gives
  the sign of what it left out, and that sign decides the rounding to binary32
  exactly (the double rounding is then innocuous). It runs on the host;
* ``fp32``: recursive summation in binary32, s = fl(s + fl(a_k b_k)), from s = c;
* ``pairwise``: binary32 pairwise summation of fl(a_k b_k) (halves summed
  recursively), then + c;
* ``kahan``: binary32 Kahan compensated summation, from s = c.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .. import _arrays
from ..formats import PRESETS, Format, format as get_format
from ..rounding import quantize
from . import blockfma
from .blockfma import BlockFMA
from .values import exact_float64

_FP32 = PRESETS["fp32"]
METHODS = ("exact", "fp32", "pairwise", "kahan")


@dataclasses.dataclass(frozen=True)
class Schedule:
    """How a product beyond one instruction is accumulated (module doc)."""

    split_k: int = 1
    promote_every: int | None = None
    epilogue: Format | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.split_k, int) or self.split_k < 1:
            raise ValueError(f"split_k must be a positive int, got {self.split_k!r}")
        if self.promote_every is not None and self.split_k > 1:
            raise ValueError("choose split_k or promote_every, not both")
        if self.epilogue is not None:
            object.__setattr__(self, "epilogue", get_format(self.epilogue))

    def check(self, params: BlockFMA) -> None:
        """Refuse a promotion interval that is not a whole number of blocks."""
        every = self.promote_every
        if every is not None and (not isinstance(every, int) or every < 1 or every % params.block_size):
            raise ValueError(f"promote_every must be a positive multiple of the block size "
                             f"{params.block_size}, got {self.promote_every!r}")

    def describe(self) -> str:
        parts = [f"split_k={self.split_k}"] if self.split_k > 1 else []
        parts += [f"promote_every={self.promote_every}"] if self.promote_every else []
        return "".join(f", {p}" for p in parts)


def accumulate(products, K: int, c, params: BlockFMA, schedule: Schedule, output: Format, ops, finite: bool):
    """All K products added to c (float64 values of `output`) by the schedule; float64 values
    of the epilogue's format (else of `output`). products(ks) gives the products of index slice
    or array ks and their alignment exponents; finite: no product is Inf or NaN. K = 0 gives c
    under every schedule (-0 included)."""
    with np.errstate(invalid="ignore", over="ignore"):  # Inf * 0 lanes are settled by blockfma
        if schedule.promote_every:
            slices = _slices(K, schedule.promote_every)
            total = c
            for lo, hi in slices:
                total = _fp32_add(total, sequential(products, lo, hi, ops.constant(0.0, c), params, ops, finite))
            out = _round_to(total, output)
        elif schedule.split_k > 1 and K:  # (K = 0 has no slice: c, as sequential gives it)
            per = -(-(-(-K // params.k)) // schedule.split_k) * params.k
            partials = [sequential(products, lo, hi, c if lo == 0 else ops.constant(0.0, c), params, ops, finite)
                        for lo, hi in _slices(K, per)]
            total = partials[0]
            for partial in partials[1:]:
                total = _fp32_add(total, partial)
            out = _round_to(total, output)
        else:
            out = sequential(products, 0, K, c, params, ops, finite)
    return quantize(out, schedule.epilogue, "nearest_even") if schedule.epilogue is not None else out


def sequential(products, lo: int, hi: int, c, params: BlockFMA, ops, finite: bool):
    """Products lo..hi-1 through the tensor core's instructions in k order, starting from c."""
    d = c
    for start in range(lo, hi, params.k):
        d = blockfma.instruction(products, start, min(params.k, hi - start), d, params, ops, finite)
    return d


def _slices(K: int, size: int) -> list[tuple[int, int]]:
    return [(lo, min(K, lo + size)) for lo in range(0, K, size)]


def _fp32_add(x, y):
    """x + y rounded to binary32 (nearest even), from float64 holding binary32 values (exact sum)."""
    return quantize(x + y, _FP32, "nearest_even")


def _round_to(total, output: Format):
    return total if output == _FP32 else quantize(total, output, "nearest_even")


# ------------------------------------------------------------------- references
def reference_dot(a, b, c=None, method: str = "exact"):
    """sum_k a[..., k] * b[..., k] + c[...] by a reference method; binary32 result of shape
    a.shape[:-1], whatever the method and K: a numpy float32 array (0-d for 1-d a, as
    TensorCore.dot gives), or a torch float32 tensor on a's device.

    a, b and c must hold binary32 values (ValueError otherwise: the products are exact only
    then; integers are compared as integers). K = 0 gives c, -0 included (+0 without c); NaN,
    Inf and the sign of a zero follow IEEE addition (Inf - Inf is NaN; an exact zero sum is -0
    only when every term is -0, as x + y rounded to nearest gives it)."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; allowed: {', '.join(METHODS)}")
    ops = _arrays.Ops(a)
    for operand, name in ((b, "b"), (c, "c")):
        if operand is not None:
            ops.check_same(operand, name)
    a, b = _binary32_values(a, "a", ops), _binary32_values(b, "b", ops)
    if tuple(a.shape) != tuple(b.shape) or a.ndim == 0:
        raise ValueError(f"a and b need the same shape with a last axis (K), got {tuple(a.shape)} "
                         f"and {tuple(b.shape)}")
    c = ops.zeros(a.shape[:-1], "float64") if c is None else _binary32_values(c, "c", ops)
    if tuple(c.shape) != tuple(a.shape[:-1]):
        raise ValueError(f"c must have shape {tuple(a.shape[:-1])}, got {tuple(c.shape)}")
    products = a * b
    if method == "exact":
        return ops.array(_exact(products, c, ops))
    p32, s = ops.astype(products, "float32"), ops.astype(c, "float32")
    if method == "pairwise":
        return ops.array(_pairwise(p32) + s if p32.shape[-1] else s)
    compensation = ops.zeros_like(s)
    for k in range(p32.shape[-1]):
        if method == "fp32":
            s = s + p32[..., k]
            continue
        y = p32[..., k] - compensation
        t = s + y
        # (once the sum is Inf or NaN, no compensation: Inf - Inf would turn an infinite sum into NaN)
        compensation = ops.where(ops.isnan(t - t), ops.zeros_like(t), (t - s) - y)
        s = t
    return ops.array(s)  # (numpy: a float32 array, not the scalar that 0-d arithmetic gives)


def _binary32_values(x, name: str, ops):
    """x as float64, refused unless every value is a binary32 value (NaN and Inf included): the
    references are exact only where float64 holds every product of two inputs exactly."""
    advice = "; reference_dot takes binary32 inputs (float32, or float64 holding float32 values)"
    x64 = exact_float64(_arrays.accept(x).array, name, "binary32", advice, ops)
    with np.errstate(over="ignore"):  # beyond binary32's range: Inf, refused below
        back = ops.astype(ops.astype(x64, "float32"), "float64")
    same = ops.to_host((back == x64) | (x64 != x64))
    if not same.all():
        bad = tuple(int(i) for i in np.argwhere(~same)[0])
        raise ValueError(f"{name}{list(bad)} = {float(ops.to_host(x64)[bad])!r} is not a binary32 value{advice}")
    return x64


def _exact(products, c, ops):
    host_p, host_c = ops.to_host(products), ops.to_host(c)
    flat_p, flat_c = host_p.reshape(host_c.size, host_p.shape[-1]), host_c.reshape(-1)
    nearest = np.empty(flat_c.shape)
    for i in range(flat_c.size):
        terms = list(flat_p[i]) + [float(flat_c[i])]
        if not all(map(math.isfinite, terms)):  # NaN or Inf: IEEE addition says what (Inf - Inf is NaN)
            nearest[i] = sum(map(float, terms))
            continue
        hi = math.fsum(terms)
        rest = math.fsum(terms + [-hi]) if math.isfinite(hi) else 0.0
        if hi == 0 and rest == 0:  # an exact zero (fsum gives +0): -0 only when every term is -0
            hi = -0.0 if all(math.copysign(1.0, t) < 0 for t in terms) else 0.0
        # hi is the float64 nearest the exact sum; nudging it one float64 step towards
        # the remainder keeps it strictly on the exact sum's side of every binary32
        # rounding boundary, so rounding it once more is exact.
        nearest[i] = hi if rest == 0 else math.nextafter(hi, math.copysign(math.inf, rest))
    result = np.asarray(quantize(nearest.reshape(host_c.shape), _FP32), dtype=np.float32)
    return ops.from_host(result)


def _pairwise(p32):
    """Neighbours summed level by level; an odd one out is added to +0 (the zero padding to a
    power of two)."""
    while p32.shape[-1] > 1:
        pairs = p32[..., 0:p32.shape[-1] - 1:2] + p32[..., 1::2]
        p32 = _arrays.Ops(p32).concat([pairs, p32[..., -1:] + 0.0], -1) if p32.shape[-1] % 2 else pairs
    return p32[..., 0]
