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


def alignment_powers(x, input_format: Format, ops):
    """2^(max(floor(log2|x|), emin)) for nonzero x, 0 for zero: where x's significand is read from."""
    nonzero = x != 0
    exponent = ops.floor_log2(ops.where(nonzero, x, 1.0))
    exponent = ops.clip(exponent, lo=input_format.emin)
    return ops.where(nonzero, _pow2(exponent, x, ops), 0.0)


def _pow2(exponent, like, ops):
    """Exact powers of two as floats of like's dtype (float64)."""
    if ops.torch:
        return _arrays._torch.ldexp(_arrays._torch.ones_like(like), exponent)
    return np.ldexp(1.0, exponent)


def block_step(products, powers, c, c_powers, params: BlockFMA, ops):
    """One block FMA on a batch: products (..., F) exact, powers their alignment powers, c (...).

    c_powers: 2^(alignment exponent of c), 0 where c is 0. Returns d (...), float64.
    """
    top = powers.max(-1) if not ops.torch else powers.amax(-1)
    top = ops.maximum(top, c_powers)
    top = ops.maximum(top, 2.0 ** params.min_align_exp)
    scale = (2.0 ** params.window_bits) / top  # exact: a power of two
    terms = ops.trunc(products * scale[..., None]).sum(-1) + ops.trunc(c * scale)
    total = terms / scale
    return round_sum(total, params, ops)


def round_sum(total, params: BlockFMA, ops):
    """Round an exact block sum into the output format; beyond the range is Inf; 0 is +0."""
    fmt = params.output_format
    rounded = quantize(total, fmt, params.rounding, flush_subnormal_outputs=not params.subnormal_outputs)
    beyond = abs(total) >= 2.0 ** (fmt.emax + 1)
    rounded = ops.where(beyond, ops.where(total > 0, float("inf"), float("-inf")), rounded)
    return ops.where(total == 0, 0.0, rounded)
