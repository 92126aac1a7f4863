"""Study 1: formats at a glance.

Dynamic range (normal and subnormal binades) and precision of every preset,
checked against the values the format specifications publish, and the
relative rounding error of each format against magnitude, from a dense
log-spaced sweep rounded by fpsim.quantize.

    fpsim study format_ranges [--fast] [--out DIR]      # or: python studies/format_ranges.py
"""

from __future__ import annotations

import math
import sys
from fractions import Fraction as Q

import numpy as np

import fpsim
from fpsim import plots

TITLE = "Formats at a glance: range, precision and rounding error"
CLAIM = (
    "The format specifications give each format's largest value, smallest normal and smallest subnormal "
    "(IEEE 754-2019 for binary64/32/16; NVIDIA's A100 whitepaper for TF32; the bfloat16 definition as the top "
    "16 bits of binary32; the OCP 8-bit Floating Point specification v1.0 and Micikevicius et al. 2022 for "
    "E4M3/E5M2; the OCP Microscaling (MX) specification v1.0 for FP6, FP4 and E8M0; the FNUZ variants as "
    "ml_dtypes defines them). Round-to-nearest then guarantees a relative error of at most u = 2^-p "
    "(p significand bits) over the normal range, and no such bound below it."
)

# name -> (max, min normal, min subnormal, source), from the specifications, written out by hand
PUBLISHED = {
    "fp64": ((2 - Q(1, 2**52)) * Q(2)**1023, Q(1, 2**1022), Q(1, 2**1074), "IEEE 754 binary64"),
    "fp32": ((2 - Q(1, 2**23)) * Q(2)**127, Q(1, 2**126), Q(1, 2**149), "IEEE 754 binary32"),
    "tf32": ((2 - Q(1, 2**10)) * Q(2)**127, Q(1, 2**126), Q(1, 2**136), "NVIDIA A100 whitepaper (8e, 10m)"),
    "fp16": (Q(65504), Q(1, 2**14), Q(1, 2**24), "IEEE 754 binary16"),
    "bf16": ((2 - Q(1, 2**7)) * Q(2)**127, Q(1, 2**126), Q(1, 2**133), "bfloat16 (binary32's top 16 bits)"),
    "e4m3": (Q(448), Q(1, 2**6), Q(1, 2**9), "OCP OFP8 v1.0 E4M3"),
    "e5m2": (Q(57344), Q(1, 2**14), Q(1, 2**16), "OCP OFP8 v1.0 E5M2"),
    "e4m3fnuz": (Q(240), Q(1, 2**7), Q(1, 2**10), "ml_dtypes float8_e4m3fnuz"),
    "e5m2fnuz": (Q(57344), Q(1, 2**15), Q(1, 2**17), "ml_dtypes float8_e5m2fnuz"),
    "e3m2": (Q(28), Q(1, 4), Q(1, 16), "OCP MX v1.0 FP6 E3M2"),
    "e2m3": (Q(15, 2), Q(1), Q(1, 8), "OCP MX v1.0 FP6 E2M3"),
    "e2m1": (Q(6), Q(1), Q(1, 2), "OCP MX v1.0 FP4 E2M1"),
    "e8m0": (Q(2)**127, Q(1, 2**127), Q(1, 2**127), "OCP MX v1.0 E8M0 scale"),
    "e3m4": (Q(31, 2), Q(1, 4), Q(1, 64), "ml_dtypes float8_e3m4"),
    "e4m3ieee": (Q(240), Q(1, 2**6), Q(1, 2**9), "ml_dtypes float8_e4m3 (IEEE-like)"),
    "e4m3b11fnuz": (Q(30), Q(1, 2**10), Q(1, 2**13), "ml_dtypes float8_e4m3b11fnuz"),
    "e5m3fnu": (Q(114688), Q(1, 2**14), Q(1, 2**17), "ml_dtypes float8_e5m3fnu (unsigned)"),
}

WIDE = ("fp32", "tf32", "bf16", "fp16")
NARROW = ("fp16", "e5m2", "e4m3", "e5m2fnuz", "e4m3fnuz", "e3m2", "e2m3", "e2m1")


def _pow2(value: Q) -> str:
    """A power of two as 2^e, else a short decimal."""
    if value > 0 and value.numerator & (value.numerator - 1) == 0 and value.denominator & (value.denominator - 1) == 0:
        return f"2^{value.numerator.bit_length() - value.denominator.bit_length()}"
    return f"{float(value):.6g}"


def _log2(value: Q) -> float:
    return math.log2(value.numerator) - math.log2(value.denominator)


def run(report, fast: bool) -> None:
    presets = list(fpsim.PRESETS.values())

    # ---------------------------------------------------------------- table
    report.section("Range and precision of every preset")
    rows, mismatches = [], []
    for f in presets:
        pub_max, pub_norm, pub_sub, source = PUBLISHED[f.name]
        same = (f.max, f.min_normal, f.min_subnormal) == (pub_max, pub_norm, pub_sub)
        if not same:
            mismatches.append(f.name)
        rows.append((f"`{f.name}`", f.bits, f.exp_bits, f.man_bits, f.bias, f"{float(f.max):.6g}", _pow2(f.min_normal),
                     _pow2(f.min_subnormal), f"2^-{f.precision}", f"{f.precision * math.log10(2):.2f}",
                     f.normal_binades, f.subnormal_binades, f"{_log2(f.max) - _log2(f.min_subnormal):.1f}",
                     source, "yes" if same else "**NO**"))
    report.table(("format", "bits", "E", "M", "bias", "max", "min normal", "min subnormal", "u = 2^-p",
                  "decimal digits", "normal binades", "subnormal binades", "log2(max / min subnormal)",
                  "published by", "matches"), rows,
                 caption="p = M + 1 significand bits; u is the unit roundoff of round-to-nearest; decimal digits = "
                         "p log10 2. 'matches': max, min normal and min subnormal equal the published values "
                         "exactly (compared as fractions).")
    report.values["mismatches"] = mismatches
    report.text("`bf16` keeps binary32's subnormals here (its definition as the top half of binary32); "
                "many accelerators flush them (`flush_subnormal_outputs=True` in `fpsim.quantize`). "
                "`e8m0` is unsigned, has no zero and no mantissa: it is a scale, not a number format.")

    report.figure(plots.format_ranges([f.name for f in presets if f.name != "fp64"]), "ranges",
                  "Dynamic range of every preset except fp64 (log2 axis; hatched: subnormal binades, solid: normal "
                  "binades), with its significand bits p and epsilon.")
    report.figure(plots.format_ranges(NARROW, xlim=(-28, 32), title="Range of FP16 and the 8-, 6- and 4-bit formats"),
                  "ranges-narrow",
                  "The 8-, 6- and 4-bit formats next to FP16: E5M2 has FP16's exponent range with 2 mantissa bits; "
                  "E4M3 trades 14 binades of range (32 to 18) for one more bit; the MX FP6/FP4 elements span about 4 "
                  "to 9 binades "
                  "and rely on a shared E8M0 scale.")

    # ------------------------------------------------------ rounding error
    report.section("Relative rounding error against magnitude")
    per_binade = 64 if fast else 1024
    sweep_rows = []
    for name in dict.fromkeys(WIDE + NARROW):
        f = fpsim.format(name)
        lo, hi = _log2(f.min_normal), _log2(f.max)
        x = np.exp2(np.linspace(lo, hi, max(2, int((hi - lo) * per_binade))))
        q = np.asarray(fpsim.quantize(x, f), dtype=np.float64)
        worst_normal = float(np.max(np.abs(q - x) / x))
        # the subnormal range: error grows as the spacing stays fixed
        sub_lo = _log2(f.min_subnormal)
        xs = np.exp2(np.linspace(sub_lo - 1, lo, max(2, int((lo - sub_lo + 1) * per_binade)), endpoint=False))
        qs = np.asarray(fpsim.quantize(xs, f), dtype=np.float64)
        lost = qs == 0
        smallest_kept = float(xs[~lost].min()) if (~lost).any() else float("nan")
        half_sub = float(f.min_subnormal) / 2
        rel_at_sub = float(np.max(np.abs(qs[~lost] - xs[~lost]) / xs[~lost])) if (~lost).any() else float("nan")
        u = 2.0 ** -f.precision
        sweep_rows.append((f"`{name}`", f"{worst_normal:.4g}", f"{u / (1 + u):.4g}",
                           "yes" if worst_normal <= u / (1 + u) else "**NO**",
                           f"{rel_at_sub:.3g}", f"{smallest_kept:.4g} (> {half_sub:.4g})"))
        report.values[f"worst_normal_{name}"] = worst_normal
    report.table(("format", "largest relative error, normal range (measured)", "bound u / (1 + u)", "within bound",
                  "largest relative error, subnormal range", "smallest |x| kept (> min subnormal / 2)"), sweep_rows,
                 caption=f"Sweep of {per_binade} log-spaced points per binade, round to nearest even. In the "
                         "subnormal range the spacing stops shrinking, so the relative error grows towards 1 just "
                         "above min subnormal / 2 (which rounds up to min subnormal); below it values round to zero.")
    ppb = 64 if fast else 256
    report.figure(plots.rounding_error(WIDE, points_per_binade=ppb,
                                       title="Relative rounding error: FP32, TF32, BF16, FP16"),
                  "error-wide",
                  "Largest relative error in each binade: flat at u = 2^-p over the normal range, rising through "
                  "the subnormal binades, 1 where values are lost (to zero on the left, to Inf on the right).")
    report.figure(plots.rounding_error(NARROW[:3] + NARROW[5:], log2_range=(-27, 18), points_per_binade=ppb,
                                       title="Relative rounding error: FP16 and the 8-, 6- and 4-bit formats"),
                  "error-narrow",
                  "The same for FP16, FP8 and MX FP6/FP4: over its normal binades E4M3 keeps the error within "
                  "u/(1+u) = 5.9% (15 binades), E5M2 11.1% (30), FP4 E2M1 20% (3). The 6-bit and 4-bit formats "
                  "have no Inf: beyond max they saturate, and the error climbs smoothly towards 1.")

    fp16, bf16, e4m3, e5m2 = (fpsim.format(n) for n in ("fp16", "bf16", "e4m3", "e5m2"))
    ok = "match" if not mismatches else f"DO NOT match for {', '.join(mismatches)}"
    report.finding = (
        f"All {len(presets)} presets' max, min normal and min subnormal {ok} the published specifications, and the "
        f"measured relative error stays within the round-to-nearest bound u/(1+u), u = 2^-p, over every normal range. Range: FP16 "
        f"{fp16.normal_binades}+{fp16.subnormal_binades} binades (normal+subnormal), BF16 "
        f"{bf16.normal_binades}+{bf16.subnormal_binades}, E5M2 {e5m2.normal_binades}+{e5m2.subnormal_binades}, "
        f"E4M3 {e4m3.normal_binades}+{e4m3.subnormal_binades}; precision: u = 2^-11 (FP16), 2^-8 (BF16), "
        f"2^-4 (E4M3), 2^-3 (E5M2).")


if __name__ == "__main__":
    from fpsim.cli import main

    sys.exit(main(["study", "format_ranges", *sys.argv[1:]]))
