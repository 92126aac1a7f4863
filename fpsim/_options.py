"""The options of quantize() and encode(), checked once, whatever the input's type or the engine.

Every entry point calls `check_options` before any work, so that a bad option gets the
same clear error on float16, float32, float64, integer, numpy and torch input, kernel or
no kernel. `refuse_values_without_code` is the one check of inputs that a format cannot
hold at all (NaN for a format without NaN, a negative value for an unsigned one, zero
for one without zero).
"""

from __future__ import annotations

import dataclasses
import numbers

import numpy as np

from ._arrays import Ops, is_generator
from .formats import Format
from .modes import check_rounding

GRADIENTS = ("identity", "clipped", "none")
"""What backward does through quantize() of a torch tensor that requires grad.

- ``identity``: the straight-through estimator, the gradient passes unchanged;
- ``clipped``: passes where the input lies within the format's range (|x| <= max),
  zero where it overflows or saturates (and for Inf/NaN);
- ``none``: the result is detached (no gradient).
"""

RAND_BITS_MAX = 52


@dataclasses.dataclass(frozen=True)
class RoundingOptions:
    rounding: str
    saturate: bool = False
    seed: int | None = None
    generator: object = None
    rand_bits: int | None = None
    flush_inputs: bool = False
    flush_outputs: bool = False
    grad: str = "identity"

    def engine(self) -> dict:
        """The keyword arguments of the rounding engine (`_engine.round_bits`)."""
        return dict(rounding=self.rounding, saturate=self.saturate, rand_bits=self.rand_bits,
                    flush_inputs=self.flush_inputs, flush_outputs=self.flush_outputs)


def check_options(rounding="nearest_even", saturate=False, seed=None, generator=None, rand_bits=None,
                  flush_subnormal_inputs=False, flush_subnormal_outputs=False, grad="identity") -> RoundingOptions:
    """Every option checked, each error naming the argument, its value and what is allowed."""
    rounding = check_rounding(rounding)
    flags = {"saturate": saturate, "flush_subnormal_inputs": flush_subnormal_inputs,
             "flush_subnormal_outputs": flush_subnormal_outputs}
    for name, flag in flags.items():
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"{name} must be True or False, got {type(flag).__name__} {flag!r}")
    stochastic = rounding == "stochastic"
    if rand_bits is not None:
        if isinstance(rand_bits, (bool, np.bool_)) or not isinstance(rand_bits, numbers.Integral):
            raise TypeError(f"rand_bits must be an int in 1..{RAND_BITS_MAX} or None, got "
                            f"{type(rand_bits).__name__} {rand_bits!r}")
        if not 1 <= rand_bits <= RAND_BITS_MAX:
            raise ValueError(f"rand_bits must be an int in 1..{RAND_BITS_MAX} or None, got {rand_bits!r}")
        if not stochastic:
            raise ValueError(f"rand_bits applies to rounding='stochastic' only, not {rounding!r}")
        rand_bits = int(rand_bits)
    if seed is not None:
        if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, numbers.Integral):
            raise TypeError(f"seed must be an int in 0..2**64-1 or None, got {type(seed).__name__} {seed!r}")
        if not 0 <= seed < 2**64:
            raise ValueError(f"seed must be an int in 0..2**64-1 or None, got {seed!r}")
        seed = int(seed)
    if generator is not None and not is_generator(generator):
        raise TypeError(f"generator must be a numpy.random.Generator or a torch.Generator, got "
                        f"{type(generator).__name__} {generator!r}")
    if seed is not None and generator is not None:
        raise ValueError("give either seed or generator, not both")
    if grad not in GRADIENTS:
        raise ValueError(f"grad must be one of {', '.join(GRADIENTS)}, got {grad!r}")
    return RoundingOptions(rounding, bool(saturate), seed, generator, rand_bits, bool(flush_subnormal_inputs),
                           bool(flush_subnormal_outputs), grad)


def refuse_values_without_code(array, fmt: Format, flush_inputs: bool) -> None:
    """ValueError, naming the first such element, for inputs that have no value in `fmt`.

    A format with NaN takes every input (NaN stands for what it cannot hold), so only
    formats without NaN are checked: NaN itself, negatives of an unsigned format (after
    flushing, which turns tiny negatives into -0, taken as +0), and zero where there is none.
    """
    if fmt.has_nan:
        return
    ops = Ops(array)
    floating = ops.is_floating(array)
    checks = []
    if floating:
        checks.append((ops.isnan, f"{fmt.name} has no NaN; the input holds NaN"))
    if not fmt.signed:
        def negative(v):
            below = v < 0
            if flush_inputs and fmt.zero and floating:
                with np.errstate(over="ignore", under="ignore"):  # a bound beyond v's dtype compares right
                    below &= ~(abs(v) < float(fmt.min_normal))
            return below
        checks.append((negative, f"{fmt.name} is unsigned; the input holds a negative value"))
    if not fmt.zero:
        checks.append((lambda v: v == 0, f"{fmt.name} has no zero; the input holds 0"))
    values = _object_proxy(array) if array.dtype == object else array
    for test, message in checks:
        bad = test(values)
        if bool(bad.any()):
            raise ValueError(f"{message} at index {first_index(bad)}")


def _object_proxy(array: np.ndarray) -> np.ndarray:
    """float64 stand-ins for an object array of Python numbers: same sign, zero, NaN and smallness."""
    def proxy(v):
        return float(v) if isinstance(v, float) or abs(v) < 2**1000 else (2.0**1000 if v > 0 else -2.0**1000)
    return np.array([proxy(v) for v in array.ravel()], dtype=np.float64).reshape(array.shape)


def first_index(mask) -> tuple:
    """The index of the first True element of a boolean numpy array or torch tensor."""
    return Ops(mask).first_index(mask)
