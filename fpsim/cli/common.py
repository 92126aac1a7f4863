"""What the commands share: numbers as text and JSON, tables, JSON output, argument types."""

from __future__ import annotations

import argparse
import contextlib
import decimal
import json
import math
import os
import sys
from fractions import Fraction


def to_float(value) -> float:
    """The nearest float64 to a number, and ±inf beyond float64's range (where float() of an exact
    fraction or integer raises OverflowError), as float64 arithmetic would round it."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def fmt_number(value, spec: str = ".8g") -> str:
    """A number for humans, formatted with `spec`; an exact fraction beyond float64's range keeps its
    digits (through decimal) rather than showing as inf."""
    number = to_float(value)
    if math.isinf(number) and isinstance(value, (int, Fraction)):
        exact = Fraction(value)
        number = decimal.Context(prec=60).divide(decimal.Decimal(exact.numerator), decimal.Decimal(exact.denominator))
    elif number != number or math.isinf(number):
        return str(number)
    return format(number, spec)


def json_number(value):
    """A float for JSON; Inf and NaN (which JSON lacks) as the strings "inf", "-inf", "nan", and so is a
    magnitude beyond float64's range (it rounds to an infinity)."""
    value = to_float(value)
    if value != value:
        return "nan"
    if value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    return value


def strict_json(data):
    """data with every float as json_number gives it and numpy/torch numbers and arrays as Python ones,
    so that it dumps as strict JSON (RFC 8259 has no NaN or Infinity)."""
    if isinstance(data, dict):
        return {key: strict_json(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [strict_json(value) for value in data]
    if isinstance(data, float):
        return json_number(data)
    if hasattr(data, "tolist") and not isinstance(data, (str, bytes)):  # numpy or torch numbers and arrays
        return strict_json(data.tolist())
    return data


def print_json(data) -> None:
    """Every command's --json output: strict JSON (allow_nan=False makes a non-finite float that slipped
    through an error, not an invalid token); values JSON has no type for (paths) as text."""
    print(json.dumps(strict_json(data), indent=2, allow_nan=False, default=str))


def print_table(header, rows) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))


class Parser(argparse.ArgumentParser):
    """The commands' parser: with passthrough="DEST", the arguments after the first `--` go to DEST exactly
    as typed, a later `--` included (None without a `--`), and argparse never sees them: Python versions
    differ in which `--` argparse itself drops before a REMAINDER argument (3.11 drops the first)."""

    def __init__(self, *args, passthrough: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.passthrough = passthrough

    def parse_known_args(self, args=None, namespace=None):
        if self.passthrough is None:
            return super().parse_known_args(args, namespace)
        args = list(sys.argv[1:] if args is None else args)
        cut = args.index("--") if "--" in args else len(args)
        namespace, extras = super().parse_known_args(args[:cut], namespace)
        setattr(namespace, self.passthrough, args[cut + 1:] if cut < len(args) else None)
        return namespace, extras


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_output_options(p) -> None:
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress output on stderr")


def nonnegative_int(text: str) -> int:
    """An integer >= 0, for argparse."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


@contextlib.contextmanager
def output_to_stderr(enabled: bool = True):
    """What a training script prints goes to stderr while `enabled` (--json: stdout holds the JSON alone),
    through sys.stdout and file descriptor 1 both (DataLoader workers and C code write to the descriptor)."""
    if not enabled:
        yield
        return
    sys.stdout.flush()
    try:
        saved = os.dup(1)
        os.dup2(2, 1)
    except OSError:            # no descriptor 1 (a closed or redirected stream without one): Python's alone
        saved = None
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)
