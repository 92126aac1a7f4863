"""The rounding modes: one registry of their names, kernel ids and overflow directions.

Like `formats.py`, this is a ground-floor module: it imports nothing of fpsim.
Every other module (the engine, the compiled kernel's bridge, the codec, the
tensor-core models, the command line, tools/) takes mode facts from here. The
exact oracle (`exact.py`) takes only the names: it decides each mode, overflow
included, from IEEE 754's definitions, and the tests hold this table to it.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class RoundingMode:
    """One rounding mode.

    kernel_id: its number in the compiled kernel (the C enum in fpsim/_fastround.c
      follows this table; the bridge passes the number, never a name).
    to_infinity: (positive, negative): whether a result beyond the format's max
      becomes the format's overflow value (Inf, else NaN, else max) for a
      positive and for a negative input, rather than ±max (IEEE 754 7.4).
    """

    name: str
    kernel_id: int
    to_infinity: tuple[bool, bool]
    summary: str

    @property
    def stochastic(self) -> bool:
        return self.name == "stochastic"

    @property
    def deterministic(self) -> bool:
        return not self.stochastic

    def __str__(self) -> str:
        return self.name


MODES: dict[str, RoundingMode] = {
    m.name: m
    for m in (
        RoundingMode("nearest_even", 0, (True, True), "to nearest, ties to the even significand (IEEE default)"),
        RoundingMode("nearest_away", 1, (True, True), "to nearest, ties away from zero"),
        RoundingMode("toward_zero", 2, (False, False), "truncate the magnitude"),
        RoundingMode("up", 3, (True, False), "toward +infinity"),
        RoundingMode("down", 4, (False, True), "toward -infinity"),
        RoundingMode("odd", 5, (False, False), "truncate, then set the last bit when inexact (von Neumann)"),
        RoundingMode("stochastic", 6, (True, True),
                     "up or down at random, with probability proportional to the distance"),
    )
}

ROUNDING_MODES: tuple[str, ...] = tuple(MODES)
DETERMINISTIC_MODES: tuple[str, ...] = tuple(name for name, m in MODES.items() if m.deterministic)


def mode(name) -> RoundingMode:
    """The mode called `name` (a RoundingMode passes through); ValueError/TypeError listing the modes."""
    if isinstance(name, RoundingMode):
        return name
    if not isinstance(name, str):
        raise TypeError(f"rounding must be a mode name (str), got {type(name).__name__} {name!r}; "
                        f"allowed: {', '.join(ROUNDING_MODES)}")
    try:
        return MODES[name]
    except KeyError:
        raise ValueError(f"unknown rounding mode {name!r}; allowed: {', '.join(ROUNDING_MODES)}") from None


def check_rounding(name) -> str:
    """The name of mode `name` if it is one, else a ValueError or TypeError listing the modes."""
    return mode(name).name
