"""Operands as float64 values, never rounded on the way: integers compared as integers.

The model and the references work on float64 values, exact for every value of the formats they
take. An integer operand (numpy or torch integers, Python ints in lists or scalars, beyond int64
too) becomes a float64 only where float64 holds it exactly: one beyond 2^53 that float64 would
round (2^60 + 1 to 2^60), or beyond float64's range, is no value of any of those formats, and is
refused with the same error as any other value outside the format, naming the operand and the
element, instead of being checked after a rounding that hid it.
"""

from __future__ import annotations

import numbers
from decimal import Decimal

import numpy as np

_EXACT = 2**53  # every integer of at most this magnitude is a float64


def exact_float64(array, name: str, fmt_name: str, advice: str, ops):
    """array (numpy or torch, as `_arrays.accept` gives it) as float64; ValueError
    "{name}[i, j] = v is not a {fmt_name} value{advice}" for the first integer (row-major order)
    that float64 does not hold exactly."""
    if ops.torch:
        if not ops.is_integer(array):
            return ops.astype(array, "float64")
        if str(array.dtype) == "torch.uint64":  # (torch compares no uint64): checked on the host
            host = array.detach().cpu().numpy()
            _check_integers(host, name, fmt_name, advice)
            return ops.from_host(host.astype(np.float64))
        big = (array > _EXACT) | (array < -_EXACT)
        if bool(big.any()):
            index = [tuple(int(i) for i in row) for row in big.nonzero().tolist()] if array.dim() else [()]
            _first_inexact(index, [int(v) for v in array[big].tolist()], name, fmt_name, advice)
        return ops.astype(array, "float64")
    if array.dtype.kind in "iuO":
        _check_integers(array, name, fmt_name, advice)
    return ops.astype(array, "float64")


def _check_integers(array: np.ndarray, name: str, fmt_name: str, advice: str) -> None:
    with np.errstate(invalid="ignore"):  # (NaN among an object array's floats)
        big = np.asarray((array > _EXACT) | (array < -_EXACT), dtype=bool) if array.dtype.kind != "u" \
            else array > _EXACT
    if big.any():
        index = [tuple(int(i) for i in row) for row in np.argwhere(big)]
        _first_inexact(index, [array[i] for i in index], name, fmt_name, advice)


def _first_inexact(index, values, name: str, fmt_name: str, advice: str) -> None:
    for where, value in zip(index, values):
        if not isinstance(value, numbers.Integral):  # a float beside big integers in an object array
            continue
        value = int(value)
        text = str(value) if abs(value) < 10**40 else f"{Decimal(value):.16e}"  # (every digit below 10^40)
        try:
            inexact = int(float(value)) != value
        except OverflowError:
            inexact, text = True, f"{text} (an integer beyond float64's range)"
        if inexact:
            raise ValueError(f"{name}[{', '.join(map(str, where))}] = {text} is not a {fmt_name} value{advice}")

