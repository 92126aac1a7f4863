"""Numerical features read off probe results: the published test methodology, as a tool.

`measure(tags, a, b, c, d, output)` takes probe rows (see `probes`) and the
results some hardware or model returned for them, and reports what they show:

- ``window``: the largest shift s for which +2^B - 2^B + 2^(B-s) still returns
  2^(B-s): bits kept below the leading bit when terms are aligned (23 + the
  extra alignment bits);
- ``block_size``: the F for which 2^B and n half-ulp terms, cut into blocks
  of F that each round on their own, gives every result; None ("cannot tell")
  where the half-ulp terms fall outside the alignment window, no rounding mode
  explains the rows, or several F do;
- ``rounding``: the final rounding mode that explains all rounding probes;
- ``subnormal_inputs`` / ``subnormal_outputs``: kept or flushed;
- ``monotonic``: whether enlarging one term ever made the result smaller (the
  probes' pairs; `monotonicity_example` builds a pair that shows it on any
  truncating block FMA);
- ``carry``: whether K same-sign near-maximal products come out correctly rounded;
- ``signed_zero``: the sign of a sum of negative zeros.

`probe_table(device, ...)` runs the probes through fpsim's model of a device,
and `measure_capture(case)` reads the same features off real GPU rows, so the
two can be compared line by line (docs/tensorcore.md).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

import numpy as np

from .. import exact
from ..blocks import format as get_any_format
from ..formats import Format, format as get_format
from ..modes import DETERMINISTIC_MODES
from . import devices, probes
from .core import TensorCore

FEATURES = ("window", "block_size", "rounding", "subnormal_inputs", "subnormal_outputs", "monotonic",
            "carry", "signed_zero")
# the modes a block sum could be rounded with (odd and stochastic are not seen in tensor cores)
_MODES = tuple(m for m in DETERMINISTIC_MODES if m != "odd")


def _exact(a_row, b_row, c) -> Fraction:
    return sum((Fraction(float(x)) * Fraction(float(y)) for x, y in zip(a_row, b_row)), Fraction(0)) + Fraction(float(c))


def _param(tag: str, name: str):
    match = re.search(rf"{name}=([-\w.]+)", tag)
    return match.group(1) if match else None


def measure(tags, a, b, c, d, output: str = "fp32") -> dict:
    """Features (name -> readable value, None where the rows cannot tell) shown by probe rows
    and their results d."""
    tags = np.asarray(tags).astype(str)
    d = np.asarray(d, dtype=np.float64)

    def rows(prefix):
        return [i for i, t in enumerate(tags) if t.startswith(prefix)]

    def is_exact(i) -> bool:
        value = _exact(a[i], b[i], c[i])
        return math.isfinite(d[i]) and Fraction(float(d[i])) == value

    found = {}
    # window: products only, all in the first block
    shifts = sorted((int(_param(tags[i], "shift")), i) for i in rows("probe:alignment:pp:first:"))
    window = None  # the window's width where the rows show at least that much
    if shifts:
        survived = [s for s, i in shifts if is_exact(i)]
        lowest_lost = next((s for s, i in shifts if not is_exact(i)), None)
        if lowest_lost is None:
            found["window"], window = f">= {shifts[-1][0]}", shifts[-1][0]
        else:
            kept = [s for s in survived if s < lowest_lost]
            found["window"] = str(kept[-1]) if kept else f"< {shifts[0][0]}"
            window = kept[-1] if kept else None

    # rounding: which mode explains every rounding probe (no alignment loss there)
    idx = rows("probe:rounding:")
    candidates, out_fmt = _final_rounding(idx, a, b, c, d, output)
    if idx:
        names = " / ".join(candidates) if candidates else "none of " + ", ".join(_MODES)
        narrower = get_format(output).man_bits - out_fmt.man_bits
        found["rounding"] = names + (f", to {out_fmt.man_bits} fraction bits" if narrower and candidates else "")
    mode = candidates[0] if candidates else "toward_zero"

    # block size: a big term and n half-ulp terms (big first, big last, big as c), with the
    # rounding rows whose terms share the first block (their output format is the blocks')
    half = [i for i in rows("probe:blocksize:") if ":half:" in tags[i]]
    if half:
        one_block = [i for i in idx if ":first:" in tags[i]]
        found["block_size"] = _block_size(half + one_block, a, b, c, d, window,
                                          _final_rounding(one_block, a, b, c, d, output)[1])
    output = out_fmt

    for key, prefix in (("subnormal_inputs", "probe:subnormal:input:min*1:first"),
                        ("subnormal_outputs", "probe:subnormal:output")):
        idx = rows(prefix)
        if idx:
            kept = all(is_exact(i) or exact.round_value(_exact(a[i], b[i], c[i]), output, mode) == d[i]
                       for i in idx)
            found[key] = "kept" if kept else "flushed"

    pairs = {}
    for i in rows("probe:monotonicity:"):
        pairs.setdefault(tags[i].rsplit(":", 1)[0], {})[tags[i].rsplit(":", 1)[1]] = i
    if pairs:
        broken = sum(1 for p in pairs.values() if "lo" in p and "hi" in p and d[p["hi"]] < d[p["lo"]])
        found["monotonic"] = "yes" if broken == 0 else f"no ({broken} of {len(pairs)} pairs decrease)"

    idx = rows("probe:carry:+:c=zero:")
    if idx:
        last = max(idx, key=lambda i: int(_param(tags[i], "n")))
        correct = exact.round_value(_exact(a[last], b[last], c[last]), output, mode) == d[last]
        found["carry"] = "no loss" if correct else "low bits lost"

    idx = [i for i in rows("probe:special:zero:products=-0") if math.copysign(1, c[i]) < 0]
    if idx:
        found["signed_zero"] = "-0" if math.copysign(1.0, d[idx[0]]) < 0 else "+0"
    return found


def _final_rounding(idx, a, b, c, d, output: str) -> tuple[list[str], Format]:
    """The modes that explain the rounding rows idx, and the output format they round to: the
    output may keep fewer fraction bits than its format (Hopper FP8: 13). No mode: ([], output)."""
    out_fmt = get_format(output)
    sums = [_exact(a[i], b[i], c[i]) for i in idx]
    for man_bits in range(out_fmt.man_bits, 3, -1) if idx else ():
        fmt = Format(out_fmt.exp_bits, man_bits, out_fmt.bias)
        candidates = [m for m in _MODES if all(exact.round_value(v, fmt, m) == d[i] for v, i in zip(sums, idx))]
        if candidates:
            return candidates, fmt
    return [], out_fmt


def _block_size(idx, a, b, c, d, window, output: Format) -> str | None:
    """The block size F shown by the rows idx (the half-ulp block-size rows, then the one-block
    rounding rows): the one F for which blocks of F in k order, each added exactly to the last
    result (c first) and rounded in one mode, give every result. None where the probe cannot
    tell: its half-ulp terms lie beyond the alignment window (truncated whatever F is), or no F
    or several explain the rows (an order other than blocks in k order, such as 'pairs')."""
    first = idx[0]
    big, small = sorted((abs(Fraction(float(x)) * Fraction(float(y))) for x, y in zip(a[first], b[first])
                         if x * y != 0), reverse=True)[:2]
    if window is None or big > small * 2 ** window:
        return None
    k = len(a[first])
    explained = [F for F in range(1, k + 1)
                 if any(all(_chained(a[i], b[i], c[i], F, output, mode) == d[i] for i in idx) for mode in _MODES)]
    if len(explained) != 1:
        return None
    return f"> {k - 1} (one block)" if explained[0] == k else str(explained[0])


def _chained(a_row, b_row, c, F: int, output: Format, mode: str) -> float:
    """c + sum a*b as blocks of F products, each added exactly to the last result and rounded."""
    d = Fraction(float(c))
    for lo in range(0, len(a_row), F):
        d = Fraction(float(exact.round_value(d + _exact(a_row[lo:lo + F], b_row[lo:lo + F], 0.0), output, mode)))
    return float(d)


def probe_table(device: str, inputs: str, output: str, **options) -> dict:
    """Features of fpsim's model of a device, read off the standard probes: one
    instruction for most features, 64 products for the block size and carries.

    inputs: any name of one of the device's input formats (`probe_inputs`); block formats
    are refused (ValueError): their MMAs take block scales, which the probes do not set."""
    inputs, output = probe_inputs(device, inputs), get_format(output).name
    tc = TensorCore(device, inputs, output, **options)
    found = {}
    for k, keep in ((tc.params.k, None), (64, ("block_size", "carry"))):
        rows = probes.probe_rows(inputs, k, output)
        d = np.asarray(tc.dot(rows.a, rows.b, rows.c), dtype=np.float64)
        measured = measure(rows.tags, rows.a, rows.b, rows.c, d, output)
        found.update(measured if keep is None else {key: measured[key] for key in keep if key in measured})
    found["monotonic"] = monotonicity_example(device, inputs, output, **options)["verdict"]
    return found


def probe_inputs(device: str, inputs) -> str:
    """The preset name of an input format the probes can run on the device (aliases such as
    "half" resolved); ValueError otherwise, naming the formats they run there."""
    gen = devices.generation(device)
    probed = [name for name in devices.input_formats(device) if not devices.is_block(name)]
    takes = f"the probes run {', '.join(probed)} on {device} ({gen})"
    try:
        name = get_any_format(inputs).name
    except ValueError:
        name = None
    if name is None or devices.is_block(name) or len(probed) < len(devices.input_formats(device)):
        takes += "; block formats are not probed (their MMAs take block scales, which the probes do not set)"
    if name is None:
        raise ValueError(f"unknown input format {inputs!r}; {takes}")
    if devices.is_block(name):
        raise ValueError(f"cannot probe {name} inputs: {takes}")
    if name not in probed:
        raise ValueError(f"{device} ({gen}) tensor cores do not support {name} inputs; {takes}")
    return name


def monotonicity_example(device: str, inputs: str, output: str = "fp32", **options) -> dict:
    """Two dot products where every term of the second is >= the first's, yet its result is smaller.

    c grows from 2 - 2^-23 to 2 (one binary32 ulp) and lifts the largest
    exponent by one; the window (23 + extra bits below it) moves up a bit and
    the products 2^-w, which it held, now fall out of it. With enough products
    the loss exceeds c's growth.
    """
    tc = TensorCore(device, inputs, output, **options)
    window = tc.params.window_bits
    fmt = get_format(inputs)
    F = min(tc.params.block_size, 16)
    small = 2.0 ** -window
    # split 2^-w into two input-format powers of two
    ea = max(fmt.emin, -window // 2)
    a = np.zeros((2, F))
    b = np.zeros((2, F))
    a[:, :F - 1], b[:, :F - 1] = 2.0 ** ea, small / 2.0 ** ea
    c = np.array([2.0 - 2.0 ** -23, 2.0]) if output == "fp32" else np.array([2.0 - 2.0 ** -10, 2.0])
    if output != "fp32" or not all(exact.round_value(x, inputs) == x for x in (a[0, 0], b[0, 0])):
        return {"verdict": "not probed", "a": a, "b": b, "c": c, "d": None}
    d = np.asarray(tc.dot(a, b, c), dtype=np.float64)
    verdict = "no: result falls from %s to %s" % (repr(float(d[0])), repr(float(d[1]))) if d[1] < d[0] else "yes"
    return {"verdict": verdict, "a": a, "b": b, "c": c, "d": d}


def measure_capture(case) -> dict:
    """Features read off a captured case's probe rows (real hardware)."""
    meta = case.meta
    return measure(case.tags, case.a_values, case.b_values, case.c_values, case.d_values, meta["output"])


def generation_table() -> list[dict]:
    """The probe features of every modelled (generation, inputs, output, path); block formats,
    whose MMAs take scales the probes do not set, are left out."""
    table = []
    for gen, inputs, output, path in sorted(devices.PARAMETERS):
        if devices.is_block(inputs):
            continue
        row = {"generation": gen, "inputs": inputs, "output": output, "path": path}
        row.update(probe_table(gen, inputs, output, path=path))
        table.append(row)
    return table
