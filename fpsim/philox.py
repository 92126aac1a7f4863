"""The random stream of stochastic rounding: Philox4x32-10, the same bits in the kernel, numpy and torch.

Stochastic rounding gives element i of an array (its flat, C-order index) a
uniform number U_i in [0, 1), written as an endless string of 32-bit words:

    U_i = word(i, 0) / 2^32 + word(i, 1) / 2^64 + word(i, 2) / 2^96 + ...
    word(i, j) = word (i mod 4) of Philox4x32-10(key, counter = (b mod 2^32, b div 2^32, j, 0)),
                 b = i div 4,

where Philox4x32-10 is the counter-based generator of Salmon, Moraes, Dror and
Shaw, "Parallel random numbers: as easy as 1, 2, 3" (SC'11), as in Random123
(its known-answer vectors are in tests/test_philox.py). A magnitude rounds away
from zero when U_i < f, f the exact fraction of the spacing by which it lies
beyond its lower neighbour; with ``rand_bits=r``, when U_i < f truncated to r
bits. Only the words needed to decide are computed: word(i, 0) almost always,
the next ones only when the first words equal f's leading bits (probability
2^-32 each). So element i's draw depends on the key and i alone: the same
seed gives the same bits for numpy arrays and torch tensors on any device,
through the compiled kernel or not, and whether the input is float32 or float64.

The key (64 bits: k0 the low word, k1 the high word) is the seed itself
(0 <= seed < 2^64), or 64 bits drawn from a numpy or torch generator (which
advances it), or fresh entropy when neither is given. The counter's last word
is reserved (0): a later stream of fpsim can take another value there.
"""

from __future__ import annotations

import numbers
import secrets

import numpy as np

from . import _arrays

__all__ = ["philox4x32", "key_from", "Stream", "MASK32"]

MASK32 = 0xFFFFFFFF
MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)  # Random123's PHILOX_M4x32_0, _1
WEYL = (0x9E3779B9, 0xBB67AE85)  # the key schedule's increments (golden ratio, sqrt(3) - 1)
ROUNDS = 10


def _mulhilo(x, multiplier: int):
    """(high, low) 32-bit words of x * multiplier for int64 arrays x < 2^32, without overflow:
    the multiplier is split in 16-bit halves so that every product stays below 2^49."""
    hi16, lo16 = multiplier >> 16, multiplier & 0xFFFF
    a = x * lo16
    b = x * hi16
    t = a + ((b & 0xFFFF) << 16)
    return (t >> 32) + (b >> 16), t & MASK32


def philox4x32(counter, key: tuple[int, int]):
    """Philox4x32-10 of four counter words (int64 arrays or ints in [0, 2^32)) under a two-word key.

    Works on numpy and torch int64 arrays alike (only *, +, &, ^ and shifts).
    """
    x0, x1, x2, x3 = counter
    k0, k1 = key
    for _ in range(ROUNDS):
        hi0, lo0 = _mulhilo(x0, MULTIPLIERS[0])
        hi1, lo1 = _mulhilo(x2, MULTIPLIERS[1])
        x0, x1, x2, x3 = hi1 ^ x1 ^ k0, lo1, hi0 ^ x3 ^ k1, lo0
        k0, k1 = (k0 + WEYL[0]) & MASK32, (k1 + WEYL[1]) & MASK32
    return x0, x1, x2, x3


def key_from(seed, generator, torch_input: bool) -> int:
    """The 64-bit key of a call: the seed, else 64 bits from the generator (advancing it), else fresh entropy."""
    if generator is not None:
        if seed is not None:
            raise ValueError("give either seed or generator, not both")
        return _key_from_generator(generator, torch_input)
    if seed is None:
        return secrets.randbits(64)
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, numbers.Integral) or not 0 <= seed < 2**64:
        raise ValueError(f"seed must be an int in 0..2**64-1 (the Philox key) or None, got {seed!r}")
    return int(seed)


def _key_from_generator(generator, torch_input: bool) -> int:
    low, high = _arrays.generator_words(generator, 2, torch_input)
    return low | (high << 32)


class Stream:
    """The words of U_i for one key (see the module docstring), on numpy or on torch's device of `ops`."""

    def __init__(self, key: int):
        self.key = int(key)
        self.key_words = (self.key & MASK32, self.key >> 32)

    def words(self, depth: int, index, ops):
        """word(i, depth) for the flat element indices `index` (an int64 array of ops' backend)."""
        block = index >> 2
        out = philox4x32((block & MASK32, block >> 32, ops.full_like(block, depth), ops.full_like(block, 0)),
                         self.key_words)
        lane = index & 3
        return ops.where(lane == 0, out[0], ops.where(lane == 1, out[1], ops.where(lane == 2, out[2], out[3])))

    def leading_words(self, depth: int, n: int, ops):
        """word(i, depth) for i = 0 .. n-1 as a flat int64 array: one Philox block per four elements."""
        blocks = ops.arange((n + 3) // 4)
        out = philox4x32((blocks & MASK32, blocks >> 32, ops.full_like(blocks, depth), ops.full_like(blocks, 0)),
                         self.key_words)
        return ops.stack(out, -1).reshape(-1)[:n]
