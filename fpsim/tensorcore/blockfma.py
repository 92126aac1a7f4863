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

An instruction takes `instruction_k` products: its blocks are chained, each
block's rounded result being the next block's c. Two more features describe
FP8 instructions with a binary16 accumulator, which Hopper and Blackwell run as
two binary16 MMAs (found in the captures, see docs/tensorcore.md): the order
can be "pairs" (the products with k mod 4 in {0, 1} form the first half of the
instruction, the others the second; each half is cut into blocks), and c can
enter "last": added to the instruction's result with one more rounding.

The arithmetic is exact: products of formats up to 11 significand bits are
exact in float32 or float64, truncation is `trunc` of a product scaled by a
power of two, and sums stay below 2^53 (`BlockFMA.sum_bound`: parameters that
could pass it are refused). A block-scaled MMA (a scale 2^s per
block of K, as MX formats have) fits the same step: s adds to the block's
alignment exponents and to the power of two its products are scaled by.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..formats import PRESETS, Format
from ..modes import check_rounding
from ..rounding import quantize

OUTPUTS = ("fp32", "fp16")
"""The accumulator formats the engine aligns to (its window counts binary32 fraction bits)."""

ZERO_EXPONENT = -16000
"""Alignment exponent given to zero terms (int16; a sum of two still fits): never the largest."""


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
    subnormal_outputs: False flushes subnormal results (each block's rounded sum) to
        zero; c enters the sum as it is (no device on record flushes, so nothing
        says a flushing one would drop c: docs/tensorcore.md).
    reduced_output: a negative extra_bits also drops as many fraction bits of
        the binary32 result (Ada and Hopper FP8).
    instruction_k: products per MMA instruction (None: one block); k_order and
        c_position act within one instruction.
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
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(f"block_size must be a positive int, got {self.block_size!r}")
        if not -23 < self.extra_bits <= 24:
            raise ValueError(f"extra_bits must be in -22..24, got {self.extra_bits!r}")
        if self.sum_bound > 2**53:
            raise ValueError(f"block_size={self.block_size} with extra_bits={self.extra_bits} is beyond the exact "
                             f"block sum: its scaled sum can reach 2^{self.sum_bound.bit_length() - 1}, float64 "
                             f"holds integers exactly up to 2^53; lower block_size or extra_bits")
        if self.output not in OUTPUTS:
            raise ValueError(f"output must be one of {', '.join(OUTPUTS)}, got {self.output!r}")
        check_rounding(self.rounding)
        if self.k_order not in ("sequential", "pairs"):
            raise ValueError(f"k_order must be 'sequential' or 'pairs', got {self.k_order!r}")
        if self.c_position not in ("first", "last"):
            raise ValueError(f"c_position must be 'first' or 'last', got {self.c_position!r}")
        k = self.instruction_k
        if k is not None and (not isinstance(k, int) or k < 1 or (self.k_order == "pairs" and k % 4)):
            raise ValueError(f"instruction_k must be a positive int (a multiple of 4 with k_order 'pairs'), got {k!r}")

    @property
    def k(self) -> int:
        """Products per instruction."""
        return self.instruction_k or self.block_size

    @property
    def output_format(self) -> Format:
        """The format each block result is rounded to."""
        out = PRESETS[self.output]
        if self.reduced_output and self.extra_bits < 0 and self.output == "fp32":
            return Format(out.exp_bits, out.man_bits + self.extra_bits, out.bias, name=f"fp32_{out.man_bits + self.extra_bits}m")
        return out

    @property
    def window_bits(self) -> int:
        """Fraction bits kept below the leading bit of the largest term."""
        return 23 + self.extra_bits

    @property
    def sum_bound(self) -> int:
        """A bound on a block's scaled sum: F products below 4 * 2^window_bits (significands in
        [0, 4)) and c below 2 * 2^window_bits. At most 2^53, every partial sum of the block's
        integer terms is exact in float64, which `block_step` needs."""
        return (4 * self.block_size + 2) << self.window_bits

    def blocks(self, start: int, k: int) -> list:
        """The blocks of one instruction of products start..start+k-1 (k <= self.k), in the order the
        hardware adds them: slices where a block is contiguous, index arrays otherwise."""
        F = self.block_size
        if self.k_order == "sequential":
            return [slice(lo, min(lo + F, start + k)) for lo in range(start, start + k, F)]
        ks = np.arange(start, start + k)
        halves = (ks[(ks - start) % 4 < 2], ks[(ks - start) % 4 >= 2])
        return [half[lo:lo + F] for half in halves for lo in range(0, half.size, F)]


def instruction(products, start: int, k: int, c, params: BlockFMA, ops, finite: bool):
    """One MMA instruction: products start..start+k-1 added to c (float64, in the output format).

    products(ks) returns the products of index slice or array ks and their
    alignment exponents; finite: no product is Inf or NaN.
    """
    d = ops.constant(0.0, c) if params.c_position == "last" else c
    for ks in params.blocks(start, k):
        p, exponents = products(ks)
        d = block(p, exponents, d, params, ops, finite)
    if params.c_position == "last":
        d = quantize(d + c, params.output_format, "nearest_even")
    return d


def block(p, exponents, c, params: BlockFMA, ops, finite_products: bool):
    """One block FMA, with the IEEE special cases (NaN, Inf) settled first."""
    c_finite = abs(c) < float("inf")
    if finite_products and bool(c_finite.all()):
        return block_step(p, exponents, c, alignment_exponents(c, PRESETS["fp32"], ops), params, ops)
    p_ok = abs(p) < float("inf")
    p_clean = ops.where(p_ok, p, ops.constant(0.0, p))
    e_clean = ops.where(p_ok, exponents, ops.constant(ZERO_EXPONENT, exponents))
    c_clean = ops.where(c_finite, c, 0.0)
    d = block_step(p_clean, e_clean, c_clean, alignment_exponents(c_clean, PRESETS["fp32"], ops), params, ops)
    return _specials(p, c, d, ops)


def _specials(p, c, d, ops):
    """IEEE rules for a block with NaN or Inf among its products or c."""
    isnan = (p != p).any(-1) | (c != c)
    pos = (p == float("inf")).any(-1) | (c == float("inf"))
    neg = (p == float("-inf")).any(-1) | (c == float("-inf"))
    d = ops.where(pos, float("inf"), d)
    d = ops.where(neg, float("-inf"), d)
    return ops.where(isnan | (pos & neg), float("nan"), d)


def alignment_exponents(x, input_format: Format, ops):
    """max(floor(log2|x|), emin) as int16 for nonzero x, ZERO_EXPONENT for zero.

    This is where the hardware reads x's significand from: subnormal inputs keep
    the format's emin, so a product's significand lies in [0, 4).
    """
    exponent = ops.clip(ops.floor_log2(x), lo=input_format.emin)  # (frexp reads 0 as 0.5 * 2^0: no warning)
    return ops.astype(ops.where(x != 0, exponent, ZERO_EXPONENT), "int16")


def block_step(products, exponents, c, c_exponents, params: BlockFMA, ops):
    """One block FMA on a batch of finite terms.

    products (..., F): exact products (float32 when exact there, else float64);
    exponents (..., F): their alignment exponents (int16); c (...) float64 and
    c_exponents (...) its alignment exponent. Returns d (...) as float64.

    Exactness: with top the largest exponent, every term is truncated to a
    multiple of 2^(top - window_bits), i.e. trunc(term * 2^(window_bits - top)).
    A product has at most 22 significant bits, so the scaled product and its
    truncation are exact in float32 (products of tiny terms that would not fit
    the scale are smaller than the unit and truncate to zero); the sum of the F + 1
    integer terms, below `params.sum_bound` <= 2^53, is exact in float64.
    """
    top = ops.maximum(ops.amax(exponents), c_exponents)
    # (products of the input formats have exponents >= -252: a floor of -300 changes
    # nothing but keeps 2^(window - top) finite when every term is zero)
    top = ops.maximum(top, max(params.min_align_exp, -300))
    shift = params.window_bits - ops.astype(top, "int32")
    scale64 = ops.pow2(shift, c)
    if str(products.dtype).endswith("float32"):
        scale = ops.pow2(ops.clip(shift, hi=PRESETS["fp32"].emax), products)  # beyond: every product is 0
    else:
        scale = scale64
    products *= scale[..., None]  # in place: products(ks) made this array for this block
    terms = ops.sum(ops.trunc_(products), dtype="float64") + ops.trunc(c * scale64)
    return round_sum(terms / scale64, params, ops)


def round_sum(total, params: BlockFMA, ops):
    """Round an exact block sum into the output format; beyond the range is Inf; 0 is +0."""
    fmt = params.output_format
    # + 0.0 turns a -0 sum into +0 and leaves every other value as it is
    if fmt.name == "fp32" and params.rounding == "toward_zero" and params.subnormal_outputs:
        rounded = _binary32_toward_zero(total + 0.0, ops)
    else:
        rounded = quantize(total + 0.0, fmt, params.rounding, flush_subnormal_outputs=not params.subnormal_outputs)
    beyond = abs(total) >= 2.0 ** (fmt.emax + 1)
    if not bool(beyond.any()):
        return rounded
    return ops.where(beyond, ops.where(total > 0, float("inf"), float("-inf")), rounded)


def _binary32_toward_zero(total, ops):
    """float64 -> binary32 toward zero: the correctly rounded cast, stepped back when it rounded away."""
    with np.errstate(over="ignore"):
        near = ops.astype(total, "float32")
    away = abs(ops.astype(near, "float64")) > abs(total)
    return ops.astype(ops.where(away, ops.nextafter(near, 0.0), near), "float64")
