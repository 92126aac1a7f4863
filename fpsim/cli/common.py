"""What the commands share: numbers as text and JSON, tables, JSON output, argument types."""

from __future__ import annotations

import argparse
import json


def fmt_number(value) -> str:
    value = float(value)
    if value != value or value in (float("inf"), float("-inf")):
        return str(value)
    return f"{value:.8g}"


def json_number(value):
    """A float for JSON; Inf and NaN (which JSON lacks) as the strings "inf", "-inf", "nan"."""
    value = float(value)
    if value != value:
        return "nan"
    if value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    return value


def print_json(data) -> None:
    print(json.dumps(data, indent=2))


def print_table(header, rows) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))


def json_default(value):
    """numpy numbers and other leftovers in study values, as JSON."""
    if hasattr(value, "item"):
        return json_number(value.item()) if isinstance(value.item(), float) else value.item()
    return str(value)


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
