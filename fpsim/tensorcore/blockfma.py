"""The block fused multiply-add: one parametrised engine for every tensor core.

Published models (Fasi, Higham, Mikaitis, Pranesh 2021; Khattak and Mikaitis,
ACM TACO 2025) describe an NVIDIA tensor core instruction as a chain of block
FMAs. One block FMA computes d = c + sum of F exact products:

1. every product a_k * b_k is exact; its alignment exponent is e_a + e_b,
   where e_x = max(floor(log2|x|), emin of the input format), so a product's
   significand lies in [0, 4) (products are not normalised first);
2. the largest exponent among the nonzero products and c (c taken apart as a
   binary32 number, exponent at least -126) sets the window, and never less
   than `min_align_exp`;
3. every term is truncated (toward zero) to a multiple of
   2^(max_exp - 23 - extra_bits): the window keeps 23 + extra_bits bits below
   the leading bit position (extra_bits may be negative, as in Hopper FP8);
4. the truncated terms are added exactly, and the sum is rounded once to the
   output format (toward zero for binary32 output, nearest-even for binary16;
   with a negative extra_bits the binary32 result keeps only 23 + extra_bits
   fraction bits). A result beyond the output range is Inf.

Blocks are chained in k order: each block's rounded result is the next
block's c. Two more features describe FP8 instructions with a binary16
accumulator, which Hopper and Blackwell run as two binary16 MMAs (found in the
captures, see docs/tensorcore.md): within one instruction of
`instruction_k` products the order can be "pairs" (products with k mod 4 in
{0, 1} first, then those with k mod 4 in {2, 3}), and c can enter "last":
added to the instruction's result with one more rounding. The arithmetic below is exact: products of formats up to 11
significand bits are exact in float64, truncation is `trunc` of a float64
scaled by a power of two, and sums stay below 2^53.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .. import _arrays
from ..formats import Format, PRESETS
from ..rounding import quantize

_NO_EXPONENT = -100000  # alignment exponent of a zero term: never the maximum


@dataclasses.dataclass(frozen=True)
class BlockFMA:
    """Numerical features of one tensor-core data path (one GPU, input format and output format).

    block_size: products added exactly in one block (F).
    extra_bits: bits kept beyond binary32's 23 fraction bits when the terms are
        aligned (may be negative).
    output: output format name ("fp32" or "fp16"); c and d are in it.
    rounding: rounding of each block's sum into the output ("toward_zero", "nearest_even", ...).
    min_align_exp: the alignment exponent is never below this.
    subnormal_inputs: False flushes subnormal a and b to zero.
    subnormal_outputs: False flushes subnormal c and results to zero.
    reduced_output: a negative extra_bits also drops as many fraction bits of
        the binary32 result (Ada and Hopper FP8).
    instruction_k: products per MMA instruction; k_order and c_position act
        within one instruction.
    k_order: "sequential" or "pairs" (see the module doc).
    c_position: "first" (c is aligned with the first block's products) or
        "last" (added to the instruction's result, rounded once more).
    """

    block_size: int
    extra_bits: int
    output: str = "fp32"
    rounding: str = "toward_zero"
    min_align_exp: int = -1024
    subnormal_inputs: bool = True
    subnormal_outputs: bool = True
    reduced_output: bool = True
    instruction_k: int | None = None
    k_order: str = "sequential"
    c_position: str = "first"

    def __post_init__(self) -> None:
        if self.k_order not in ("sequential", "pairs"):
            raise ValueError(f"k_order must be 'sequential' or 'pairs', got {self.k_order!r}")
        if self.c_position not in ("first", "last"):
            raise ValueError(f"c_position must be 'first' or 'last', got {self.c_position!r}")
        if self.instruction_k is not None and (self.instruction_k % self.block_size or self.instruction_k % 4):
            raise ValueError(f"instruction_k must be a multiple of block_size and of 4, got {self.instruction_k!r}")
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(f"block_size must be a positive int, got {self.block_size!r}")
        if not -23 < self.extra_bits <= 24:
            raise ValueError(f"extra_bits must be in -22..24, got {self.extra_bits!r}")
        if self.output not in ("fp32", "fp16"):
            raise ValueError(f"output must be 'fp32' or 'fp16', got {self.output!r}")

    @property
    def output_format(self) -> Format:
        """The format each block result is rounded to."""
        out = PRESETS[self.output]
        if self.reduced_output and self.extra_bits < 0 and self.output == "fp32":
            return Format(out.exp_bits, out.man_bits + self.extra_bits, out.bias, name=f"fp32_{out.man_bits + self.extra_bits}m")
        return out

    def instruction_order(self, K: int) -> list:
        """Index arrays, one per block, in the order the hardware adds the products of k = 0..K-1."""
        import numpy as np

        chunk = self.instruction_k or self.block_size
        blocks = []
        for lo in range(0, K, chunk):
            ks = np.arange(lo, lo + chunk)
            if self.k_order == "pairs":
                ks = np.concatenate([ks[(ks - lo) % 4 < 2], ks[(ks - lo) % 4 >= 2]])
            for start in range(0, chunk, self.block_size):
                block = ks[start:start + self.block_size]
                block = block[block < K]
                if block.size:
                    blocks.append(block)
        return blocks

    @property
    def window_bits(self) -> int:
        """Fraction bits kept below the leading bit of the largest term."""
        return 23 + self.extra_bits


ZERO_EXPONENT = -16000
"""Alignment exponent given to zero terms (int16; a sum of two still fits): never the largest."""


def alignment_exponents(x, input_format: Format, ops):
    """max(floor(log2|x|), emin) as int16 for nonzero x, ZERO_EXPONENT for zero.

    This is where the hardware reads x's significand from: subnormal inputs keep
    the format's emin, so a product's significand lies in [0, 4).
    """
    nonzero = x != 0
    exponent = ops.floor_log2(ops.where(nonzero, x, 1.0))
    exponent = ops.clip(exponent, lo=input_format.emin)
    exponent = ops.where(nonzero, exponent, ZERO_EXPONENT)
    return exponent.to(_arrays._torch.int16) if ops.torch else exponent.astype(np.int16)


def block_step(products, exponents, c, c_exponents, params: BlockFMA, ops):
    """One block FMA on a batch.

    products (..., F): exact products (float32 when exact there, else float64);
    exponents (..., F): their alignment exponents (int16); c (...) float64 and
    c_exponents (...) its alignment exponent. Returns d (...) as float64.

    Exactness: with top the largest exponent, every term is truncated to a
    multiple of 2^(top - window_bits), i.e. trunc(term * 2^(window_bits - top)).
    A product has at most 22 significant bits, so the scaled product and its
    truncation are exact in float32 (products of tiny terms that would not fit
    the scale are smaller than the unit and truncate to zero); the sum of F + 1
    terms below 2^(window_bits + 3 + log2 F) is exact in float64.
    """
    top = exponents.max(-1) if not ops.torch else exponents.amax(-1)
    top = ops.maximum(top, c_exponents)
    # (products of the input formats have exponents >= -252: a floor of -300 changes
    # nothing but keeps 2^(window - top) finite when every term is zero)
    top = ops.maximum(top, max(params.min_align_exp, -300))
    shift = params.window_bits - top.to(_arrays._torch.int32) if ops.torch else params.window_bits - top.astype(np.int32)
    scale64 = _pow2(shift, c, ops)
    if str(products.dtype).endswith("float32"):
        scale = _pow2(ops.clip(shift, hi=127), products, ops)  # beyond: every product is 0
    else:
        scale = scale64
    terms = _sum64(ops.trunc(products * scale[..., None]), ops) + ops.trunc(c * scale64)
    return round_sum(terms / scale64, params, ops)


def _sum64(x, ops):
    if ops.torch:
        return x.sum(-1, dtype=_arrays._torch.float64)
    return x.sum(-1, dtype=np.float64)


def _pow2(exponent, like, ops):
    """Exact 2^exponent (int array) in like's float dtype."""
    if ops.torch:
        one = _arrays._torch.ones((), dtype=like.dtype, device=like.device)
        return _arrays._torch.ldexp(one, exponent.to(like.dtype))
    return np.ldexp(like.dtype.type(1), exponent.astype(np.int32))


def round_sum(total, params: BlockFMA, ops):
    """Round an exact block sum into the output format; beyond the range is Inf; 0 is +0."""
    fmt = params.output_format
    if fmt.name == "fp32" and params.rounding == "toward_zero" and params.subnormal_outputs:
        rounded = _binary32_toward_zero(total, ops)
    else:
        rounded = quantize(total, fmt, params.rounding, flush_subnormal_outputs=not params.subnormal_outputs)
    beyond = abs(total) >= 2.0 ** (fmt.emax + 1)
    rounded = ops.where(beyond, ops.where(total > 0, float("inf"), float("-inf")), rounded)
    return ops.where(total == 0, 0.0, rounded)


def _binary32_toward_zero(total, ops):
    """float64 -> binary32 toward zero: the correctly rounded cast, stepped back when it rounded away."""
    if ops.torch:
        torch = _arrays._torch
        near = total.to(torch.float32)
        away = near.abs().to(torch.float64) > total.abs()
        back = torch.nextafter(near, torch.zeros_like(near))
        return torch.where(away, back, near).to(torch.float64)
    with np.errstate(over="ignore"):
        near = total.astype(np.float32)
    away = np.abs(near.astype(np.float64)) > np.abs(total)
    return np.where(away, np.nextafter(near, np.float32(0)), near).astype(np.float64)
