"""Bit-exact results whatever the calling thread's floating-point mode.

`torch.set_flush_denormal(True)` (and code built with -ffast-math) sets the
CPU's flush-to-zero controls for the thread: numpy's and torch's arithmetic
and casts then read subnormal inputs as zero and write subnormal results as
zero, and fpsim's answers for subnormals would silently change. The public
calls of the numerics (quantize, encode, decode, the block formats, the
recipes, the tensor cores) are wrapped in `subnormals_kept`, which clears the
controls for the call and puts them back after it. The compiled kernel
reads and writes them (fpsim/_fastround.c); without it fpsim cannot, and
says so in docs/speed.md.
"""

from __future__ import annotations

import functools

try:
    from ._fastround import flush_bits, set_flush_bits
except ImportError:  # built without a compiler
    flush_bits = set_flush_bits = None


def subnormals_kept(function):
    """`function` run with the thread's flush-to-zero controls off, restored afterwards (also on error)."""
    if flush_bits is None:
        return function

    @functools.wraps(function)
    def kept(*args, **kwargs):
        flush = flush_bits()
        if not flush:
            return function(*args, **kwargs)
        set_flush_bits(0)
        try:
            return function(*args, **kwargs)
        finally:
            set_flush_bits(flush)
    return kept
