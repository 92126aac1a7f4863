"""`fpsim formats` and `fpsim cast`: the format table, and typed values rounded with their bits."""

from __future__ import annotations

import math
import re
from fractions import Fraction

from .. import exact, modes
from ..blocks import BLOCK_PRESETS, SCALE_RULES, BlockFormat
from ..formats import ALIASES, PRESETS, Format, format as get_format
from .common import fmt_number, json_number, print_json, print_table


def _format_facts(fmt: Format) -> dict:
    """A format's layout and exact values (floats hold them exactly; fractions as text too)."""
    values = {key: getattr(fmt, key) for key in ("max", "min_normal", "min_subnormal", "eps")}
    return {"name": fmt.name, "bits": fmt.bits, "exp_bits": fmt.exp_bits, "man_bits": fmt.man_bits,
            "bias": fmt.bias, "signed": fmt.signed, "infinities": fmt.infinities, "nan": fmt.nan,
            "subnormals": fmt.subnormals, "zero": fmt.zero,
            **{key: float(v) for key, v in values.items()},
            "exact": {key: str(v) for key, v in values.items()},
            "normal_binades": fmt.normal_binades, "subnormal_binades": fmt.subnormal_binades,
            "aliases": sorted(alias for alias, target in ALIASES.items() if target == fmt.name)}


def _bits_per_element(fmt: BlockFormat) -> Fraction:
    """Storage per element: the element's bits and its share of one scale (a tensor scale is left out)."""
    element_bits = fmt.element.bits
    return element_bits + Fraction(fmt.scale.bits, math.prod(fmt.block_shape))


def _block_facts(fmt: BlockFormat) -> dict:
    """A block format's parts (the element and scale formats are rows of their own)."""
    return {"name": fmt.name, "kind": "block", "element": str(fmt.element), "scale": fmt.scale.name,
            "block_size": list(fmt.block_shape), "scale_rule": fmt.scale_rule,
            "scale_rule_source": fmt.rule.source,
            "tensor_scale": fmt.tensor_scale.name if fmt.tensor_scale is not None else None,
            "amax_floor": fmt.amax_floor, "element_max": float(fmt.element_max),
            "bits_per_element": float(_bits_per_element(fmt))}


def cmd_formats(args) -> int:
    """Print every preset with its range and precision, then the block formats."""
    if args.json:
        print_json([{**_format_facts(fmt), "kind": "format"} for fmt in PRESETS.values()]
                    + [_block_facts(fmt) for fmt in BLOCK_PRESETS.values()])
        return 0
    header = ("name", "bits", "E", "M", "bias", "max", "min normal", "min subnormal", "epsilon",
              "binades", "Inf", "NaN")
    rows = []
    for fmt in PRESETS.values():
        rows.append((fmt.name, str(fmt.bits), str(fmt.exp_bits), str(fmt.man_bits), str(fmt.bias),
                     fmt_number(fmt.max), fmt_number(fmt.min_normal), fmt_number(fmt.min_subnormal),
                     fmt_number(fmt.eps), f"{fmt.normal_binades}+{fmt.subnormal_binades}",
                     "yes" if fmt.infinities else "no", fmt.nan))
    print_table(header, rows)
    print("\nbinades: normal+subnormal. NaN encodings: ieee (all-ones exponent), fn (all-ones code),")
    print("fnuz (the negative-zero code), none. Aliases: " + ", ".join(sorted(ALIASES)))
    print("\nBlock formats (fpsim.quantize(x, name, axis=...); docs/blocks.md):\n")
    header = ("name", "element", "scale", "block", "scale rule", "tensor scale", "bits/element", "element max")
    rows = [(fmt.name, str(fmt.element), fmt.scale.name, "x".join(map(str, fmt.block_shape)), fmt.scale_rule,
             fmt.tensor_scale.name if fmt.tensor_scale is not None else "-", f"{float(_bits_per_element(fmt)):g}",
             fmt_number(fmt.element_max)) for fmt in BLOCK_PRESETS.values()]
    print_table(header, rows)
    print("\nscale rules (per block, from its amax):")
    for rule in SCALE_RULES.values():
        print(f"  {rule.name:8} {rule.summary}")
    return 0


_SPECIAL = re.compile(r"[+-]?(inf|infinity|nan)")  # as Python's float() reads them, in any case
_DIGITS = r"\d+(?:_\d+)*"  # underscores between digits, as Python's float() and Fraction() allow
_DECIMAL = re.compile(rf"[+-]?({_DIGITS}(?:\.(?:{_DIGITS})?)?|\.{_DIGITS})(?:e([+-]?{_DIGITS}))?")  # one parse only
_RATIO = re.compile(rf"[+-]?({_DIGITS})/({_DIGITS})")
_MAX_LENGTH = 100_000
"""The longest number read (Python itself refuses integers of more than 4300 digits as text)."""
# Every format's values lie within [2^-1074, 2^1024): a typed magnitude beyond these bounds rounds
# as the bound does in every format and mode, and the bound keeps the exact arithmetic small.
_HUGE, _TINY = Fraction(2) ** 1100, Fraction(1, 2**1200)
_HUGE_NOTE = "beyond every format's range: rounded as 2^1100"
_TINY_NOTE = "below every format's smallest value: rounded as 2^-1200"


def _parse_value(text: str):
    """The exact value a user typed (a decimal or fraction string, or inf/nan), and a note when a
    magnitude beyond every format's range stands in for it (1e999999, 1e-30000000). A zero typed with
    a minus sign is -0.0, as float() reads it."""
    lowered = text.strip().lower()
    if _SPECIAL.fullmatch(lowered):
        return float(lowered), None
    if len(lowered) > _MAX_LENGTH:
        raise ValueError(f"{_shown(text)} is too long: numbers of at most {_MAX_LENGTH} characters are read")
    decimal, ratio = _DECIMAL.fullmatch(lowered), _RATIO.fullmatch(lowered)
    if decimal:
        value, stand_in = _decimal_value(*decimal.groups())
    elif ratio and _integer(ratio.group(2)):
        value, stand_in = _bounded(Fraction(_integer(ratio.group(1)), _integer(ratio.group(2))))
    else:
        raise ValueError(f"cannot read {_shown(text)} as a number (decimal like 0.1 or 1e-5, a fraction "
                         f"like 1/3, inf or nan)")
    if lowered.startswith("-"):
        return (-value if value else -0.0), stand_in
    return value, stand_in


def _shown(text: str) -> str:
    """The text in an error message, cut short when it is long."""
    return repr(text) if len(text) <= 60 else repr(text[:40]) + f"... ({len(text)} characters)"


def _decimal_value(mantissa: str, exponent: str | None):
    """The magnitude of a decimal (its sign is the caller's), or the bound that stands in for it."""
    whole, _, decimals = mantissa.replace("_", "").partition(".")
    digits = (whole + decimals).lstrip("0")
    if not digits:
        return Fraction(0), None
    scale = (_integer(exponent) if exponent else 0) - len(decimals)  # |value| = digits * 10^scale
    log10 = scale + len(digits)  # 10^(log10 - 1) <= |value| < 10^log10
    if log10 > 340:  # 10^340 > _HUGE: the decimal's digits need not be read
        return _HUGE, _HUGE_NOTE
    if log10 < -340:
        return _TINY, _TINY_NOTE
    return _bounded(_integer(digits) * Fraction(10) ** scale)


def _bounded(magnitude: Fraction):
    """A magnitude, or the bound that stands in for it beyond every format's range, with its note."""
    if magnitude > _HUGE:
        return _HUGE, _HUGE_NOTE
    if 0 < magnitude < _TINY:
        return _TINY, _TINY_NOTE
    return magnitude, None


def _integer(text: str) -> int:
    """int(text) for any number of digits: int() refuses more than sys.get_int_max_str_digits() (4300)
    at once, so the digits are read in chunks below that limit."""
    sign, digits = (-1, text[1:]) if text.startswith("-") else (1, text.lstrip("+"))
    digits = digits.replace("_", "")
    value = 0
    for start in range(0, len(digits), 4000):
        chunk = digits[start:start + 4000]
        value = value * 10 ** len(chunk) + int(chunk)
    return sign * value


def _bits_string(code: int, fmt: Format) -> str:
    text = format(code, f"0{fmt.bits}b")
    parts = []
    if fmt.signed:
        parts.append(text[0])
        text = text[1:]
    parts.append(text[:fmt.exp_bits])
    if fmt.man_bits:
        parts.append(text[fmt.exp_bits:])
    return " ".join(parts) + f"  (0x{code:0{(fmt.bits + 3) // 4}x})"


def cmd_cast(args) -> int:
    """Round typed values into formats and show the result, its bits and its neighbours."""
    formats = [get_format(name) for name in args.to.split(",")]
    modes.check_rounding(args.rounding)
    results = []
    for text in args.values:
        value, stand_in = _parse_value(text)
        for fmt in formats:
            result = exact.round_value(value, fmt, args.rounding, args.saturate,
                                       random_fraction=Fraction(1, 2) if args.rounding == "stochastic" else None)
            if args.json:
                results.append(_cast_facts(text, value, stand_in, fmt, result, args))
                continue
            print(f"input       {text}" + (f" ({stand_in})" if stand_in else ""))
            print(f"format      {fmt.name} ({fmt.bits} bits: {int(fmt.signed)} sign, {fmt.exp_bits} exponent, "
                  f"{fmt.man_bits} mantissa, bias {fmt.bias})")
            print(f"rounding    {args.rounding}{', saturating' if args.saturate else ''}"
                  + (" (one draw, u = 1/2)" if args.rounding == "stochastic" else ""))
            if result != result:  # the engine's NaN keeps the input's sign (where the format's NaN has one)
                negative = value < 0 if isinstance(value, Fraction) else math.copysign(1.0, value) < 0
                result = -math.nan if negative else math.nan
            code, missing = _code(result, fmt)
            if missing:       # (NaN in a format without one: fpsim.quantize refuses it too)
                print(f"result      none: {missing}")
            else:
                print(f"result      {fmt_number(result) if result == result else 'nan'}")
                print(f"bits        {_bits_string(code, fmt)}")
            if isinstance(value, Fraction) and value != 0 and not stand_in:
                if value < 0 and not fmt.signed:
                    print(f"neighbours  none: {fmt.name} has no negative values")
                    print()
                    continue
                low, high = exact.neighbours(fmt, abs(value))
                if value < 0:
                    low, high = -high, -low
                if low == high:
                    print(f"neighbours  {fmt_number(low)} is exactly representable")
                else:
                    shown_high = fmt_number(high) if abs(high) <= fmt.max else f"{fmt_number(high)} (beyond max)"
                    print(f"neighbours  {fmt_number(low)} < {text} < {shown_high}")
                if result == result and abs(result) != float("inf"):
                    error = (Fraction(result) - value) / value
                    print(f"rel. error  {fmt_number(error, '+.4e')}")
            print()
    if args.json:
        print_json(results)
    return 0


def _code(result: float, fmt: Format) -> tuple:
    """(the code of a rounded result, None) or (None, why the format holds no such value)."""
    try:
        return exact.encode_value(result, fmt), None
    except ValueError as err:
        return None, str(err)


def _cast_facts(text: str, value, stand_in, fmt: Format, result: float, args) -> dict:
    """One cast as data: what `fpsim cast` prints, for scripts."""
    if result != result:  # the engine's NaN keeps the input's sign (where the format's NaN has one)
        negative = value < 0 if isinstance(value, Fraction) else math.copysign(1.0, value) < 0
        result = -math.nan if negative else math.nan
    code, missing = _code(result, fmt)
    note = "; ".join(n for n in (stand_in, missing) if n) or None
    facts = {"input": text, "format": fmt.name, "rounding": args.rounding, "saturate": args.saturate,
             "result": None if missing else json_number(result), "code": code,
             "bits": _bits_string(code, fmt).split("  (")[0] if code is not None else None, "note": note}
    if isinstance(value, Fraction) and value != 0 and not stand_in:
        if value < 0 and not fmt.signed:
            facts["neighbours"] = None          # no negative values at all
            return facts
        low, high = exact.neighbours(fmt, abs(value))
        low, high = (-high, -low) if value < 0 else (low, high)
        facts["neighbours"] = [json_number(low), json_number(high)]
        if result == result and abs(result) != float("inf"):
            facts["rel_error"] = json_number((Fraction(result) - value) / value)
    return facts


def add_formats_parser(sub) -> None:
    """The subcommand `fpsim formats`."""
    p = sub.add_parser("formats", help="table of every preset format, block formats included")
    p.add_argument("--json", action="store_true", help="print the formats as JSON on stdout")
    p.set_defaults(func=cmd_formats)


def add_cast_parser(sub) -> None:
    """The subcommand `fpsim cast VALUES --to FORMATS`."""
    p = sub.add_parser("cast", help="round values into formats and show bits and neighbours")
    p.add_argument("values", nargs="+", help="numbers as typed: 0.1, -3e-5, 1/3, inf, nan")
    p.add_argument("--to", required=True, help="format name(s), comma-separated (e.g. e4m3,bf16)")
    p.add_argument("--rounding", default="nearest_even", help=f"one of {', '.join(modes.ROUNDING_MODES)}")
    p.add_argument("--saturate", action="store_true", help="clamp overflow to ±max")
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    # negative values as typed (-3e-5, -1/3, -inf) are values, not options (argparse knows only -3 and -.5)
    p._negative_number_matcher = re.compile(r"^-(\d+\.?\d*(e[+-]?\d+)?|\.\d+(e[+-]?\d+)?|\d+/\d+|inf|infinity|nan|0)$",
                                            re.IGNORECASE)
    p.set_defaults(func=cmd_cast)
