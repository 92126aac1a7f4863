"""Operands as float64 values, never rounded on the way: integers compared as integers.

The model and the references work on float64 values, exact for every value of the formats they
take. An integer operand (numpy or torch integers, Python ints in lists or scalars, beyond int64
too) becomes a float64 only where float64 holds it exactly (`_arrays.integers_as_float64`): one
that float64 would round (2^60 + 1 to 2^60), or beyond float64's range, is no value of any of those
formats, and is refused with the same error as any other value outside the format, naming the
operand and the element, instead of being checked after a rounding that hid it.
"""

from __future__ import annotations

from decimal import Decimal

from .. import _arrays


def exact_float64(array, name: str, fmt_name: str, advice: str, ops):
    """array (numpy or torch, as `_arrays.accept` gives it) as float64; ValueError
    "{name}[i, j] = v is not a {fmt_name} value{advice}" for the first integer (row-major order)
    that float64 does not hold exactly."""
    if not (ops.is_integer(array) or (not ops.torch and array.dtype.kind == "O")):
        return ops.astype(array, "float64")
    host = ops.to_host(array)                       # (integer operands are rare: checked on the host)
    values, inexact = _arrays.integers_as_float64(host)
    if inexact is not None:
        value = int(host[inexact])
        text = str(value) if abs(value) < 10**40 else f"{Decimal(value):.16e}"  # (every digit below 10^40)
        try:
            float(value)
        except OverflowError:
            text += " (an integer beyond float64's range)"
        raise ValueError(f"{name}[{', '.join(map(str, inexact))}] = {text} is not a {fmt_name} value{advice}")
    return ops.from_host(values)
