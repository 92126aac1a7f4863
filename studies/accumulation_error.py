"""Study 4: accumulation error against K, per tensor-core model.

Relative error of dot products of length K = 16 .. 16384 as each modelled
tensor core computes them (fpsim.TensorCore), next to exact, binary32
sequential and binary32 pairwise summation, for two input distributions;
FP8 on Hopper with and without promotion to binary32 every 128 products.

    fpsim study accumulation_error [--fast] [--out DIR]   # or: python studies/accumulation_error.py
"""

from __future__ import annotations

import math
import sys

import numpy as np

import fpsim
from fpsim import plots
from fpsim.tensorcore.accumulation import reference_dot

TITLE = "Accumulation error against K on each GPU's tensor cores"
CLAIM = (
    "DeepSeek-AI, *DeepSeek-V3 Technical Report* (arXiv:2412.19437, 2024), section 3.3.2: the FP8 GEMM "
    "accumulation of NVIDIA H800 (Hopper) tensor cores retains only about 14 bits, so that for K = 4096 "
    "\"the limited accumulation precision in Tensor Cores results in a maximum relative error of nearly 2%\"; "
    "promoting partial results to FP32 on CUDA cores every N_C = 128 elements fixes it. The report does not "
    "say which inputs gave the 2%."
)

SEED = 20241227
DEEPSEEK = (4096, 0.02, "DeepSeek-V3: ≈2% max at K = 4096 (H800, no promotion)")

# label -> (device, inputs, TensorCore options)
MODELS = {
    "V100 fp16 → fp32": ("v100", "fp16", {}),
    "A100 fp16 → fp32": ("a100", "fp16", {}),
    "H100 fp16 → fp32": ("h100", "fp16", {}),
    "H100 e4m3 → fp32 (native)": ("h100", "e4m3", {}),
    "H100 e4m3, promote every 128": ("h100", "e4m3", {"promote_every": 128}),
    "B200 e4m3 → fp32": ("b200", "e4m3", {}),
}
REFERENCES = {
    "exact, rounded once to binary32": "exact",
    "binary32 sequential": "fp32",
    "binary32 pairwise": "pairwise",
}
REFERENCE_INPUTS = "fp16"
DISTRIBUTIONS = {"U(0,1)": "uniform", "N(0,1)": "normal"}


def _inputs(kind: str, rows: int, k: int, seed: int):
    rng = np.random.default_rng(seed)
    if kind == "uniform":
        return rng.random((rows, k)), rng.random((rows, k))
    return rng.standard_normal((rows, k)), rng.standard_normal((rows, k))


def _stats(d, s) -> dict:
    d = np.asarray(d, dtype=np.float64)
    rel = np.abs(d - s) / np.abs(s)
    return {"max": float(rel.max()), "median": float(np.median(rel)),
            "normwise": float(np.linalg.norm(d - s) / np.linalg.norm(s)),
            "signed_mean": float(np.mean((d - s) / np.abs(s))),
            "share_below": float(np.mean(d < s))}


def run(report, fast: bool) -> None:
    rows = 32 if fast else 256
    ks = [2 ** e for e in range(4, 11 if fast else 15)]
    kmax = ks[-1]
    k_table = 4096 if 4096 in ks else kmax

    results = {}  # (dist, label) -> list of stats per K
    for d_index, (dist, kind) in enumerate(DISTRIBUTIONS.items()):
        raw_a, raw_b = _inputs(kind, rows, kmax, SEED + d_index)
        rounded = {fmt: (fpsim.quantize(raw_a, fmt), fpsim.quantize(raw_b, fmt)) for fmt in ("fp16", "e4m3")}
        exact = {fmt: [np.array([math.fsum(r) for r in (a[:, :k].astype(np.float64) * b[:, :k])]) for k in ks]
                 for fmt, (a, b) in rounded.items()}
        for label, (device, inputs, options) in MODELS.items():
            tc = fpsim.TensorCore(device, inputs, "fp32", **options)
            a, b = rounded[inputs]
            results[(dist, label)] = [_stats(tc.dot(a[:, :k], b[:, :k]), s) for k, s in zip(ks, exact[inputs])]
        a, b = rounded[REFERENCE_INPUTS]
        for label, method in REFERENCES.items():
            results[(dist, label)] = [_stats(reference_dot(a[:, :k], b[:, :k], method=method), s)
                                      for k, s in zip(ks, exact[REFERENCE_INPUTS])]

    labels = list(MODELS) + list(REFERENCES)

    def panel(metric):
        return {dist: {lab: [st[metric] for st in results[(dist, lab)]] for lab in labels} for dist in DISTRIBUTIONS}

    report.section("Method")
    report.text(f"""
For each distribution, {rows} rows of {kmax} values for a and b are drawn (numpy `default_rng`, seed {SEED} and
{SEED + 1}), rounded to the input format (fp16 or e4m3, nearest even; in e4m3, N(0,1) values below 2^-10 become
0 and the largest are far inside ±448), and the dot product of the first K elements of each row is computed by
each model with c = 0 (`fpsim.TensorCore(device, inputs, "fp32", ...).dot`). s is the exact sum (`math.fsum`
of the exact products: correctly rounded binary64). The error of a row is |d − s| / |s|; the tables give the
largest and the median over the rows, and the normwise error ‖d − s‖₂ / ‖s‖₂ over all rows. The binary32
references (`fpsim.tensorcore.accumulation.reference_dot`) run on the fp16-rounded inputs. The H800 of the
DeepSeek report is a Hopper GPU, modelled by the `h100` preset (window of 13 fraction bits: 14 bits with the
leading one, the report's "around 14 bits").
""")

    headline = {"U(0,1) inputs: largest relative error over rows": panel("max")["U(0,1)"],
                "N(0,1) inputs: normwise relative error": panel("normwise")["N(0,1)"]}
    report.figure(plots.error_vs_k(ks, None, panels=headline, points=[DEEPSEEK],
                                   ylabel="relative error (dimensionless)",
                                   title="Error of a length-K dot product, per tensor-core model"),
                  "error-vs-k",
                  f"Left: largest |d − s| / |s| over {rows} rows of positive U(0,1) inputs. Right: normwise "
                  f"‖d − s‖₂ / ‖s‖₂ over {rows} rows of zero-mean N(0,1) inputs (the largest row error there is "
                  f"set by rows whose exact sum nearly cancels; see the tables). The star is the DeepSeek-V3 "
                  f"figure (a maximum relative error, inputs unstated). Missing points: error exactly 0.")
    report.figure(plots.error_vs_k(ks, None, panels={"N(0,1): largest over rows": panel("max")["N(0,1)"],
                                                     "N(0,1): median over rows": panel("median")["N(0,1)"]},
                                   ylabel="relative error |d − s| / |s|",
                                   title="Zero-mean inputs: largest and median relative error"),
                  "normal-max-median",
                  "With N(0,1) inputs the largest relative error over rows jumps around: it is set by the one row "
                  "whose exact sum is closest to zero, and grows with the number of rows. The median is stable.")

    i = ks.index(k_table)
    report.section(f"Errors at K = {k_table}")
    table_rows = []
    for lab in labels:
        u, n = results[("U(0,1)", lab)][i], results[("N(0,1)", lab)][i]
        table_rows.append((lab, f"{u['max']:.3g}", f"{u['median']:.3g}", f"{100 * u['share_below']:.0f}%",
                           f"{n['max']:.3g}", f"{n['median']:.3g}", f"{n['normwise']:.3g}"))
    report.table(("model or method", "U(0,1) max", "U(0,1) median", "U(0,1) rows with d < s", "N(0,1) max",
                  "N(0,1) median", "N(0,1) normwise"), table_rows,
                 caption=f"Relative errors at K = {k_table}, {rows} rows per distribution.")

    report.section("Growth with K (largest relative error)")
    growth_rows = []
    for lab in labels:
        growth_rows.append([lab] + [f"{results[('U(0,1)', lab)][j]['max']:.2g} / {results[('N(0,1)', lab)][j]['max']:.2g}"
                                    for j in range(len(ks))])
    report.table(["model or method"] + [f"K = {k}" for k in ks], growth_rows,
                 caption="Largest relative error, U(0,1) / N(0,1) inputs.")

    native_u = results[("U(0,1)", "H100 e4m3 → fp32 (native)")][i]
    native_n = results[("N(0,1)", "H100 e4m3 → fp32 (native)")][i]
    promoted_u = results[("U(0,1)", "H100 e4m3, promote every 128")][i]
    promoted_n = results[("N(0,1)", "H100 e4m3, promote every 128")][i]
    fp16_u = results[("U(0,1)", "H100 fp16 → fp32")][i]
    report.values.update(ks=ks, k_table=k_table, native_u=native_u, native_n=native_n, promoted_u=promoted_u,
                         promoted_n=promoted_n, fp16_u=fp16_u,
                         native_u_by_k=[st["max"] for st in results[("U(0,1)", "H100 e4m3 → fp32 (native)")]],
                         promoted_u_by_k=[st["max"] for st in results[("U(0,1)", "H100 e4m3, promote every 128")]])

    crossing = _crossing(ks, [st["max"] for st in results[("U(0,1)", "H100 e4m3 → fp32 (native)")]], 0.02)
    typical_n = max(native_n["median"], native_n["normwise"])
    if k_table != DEEPSEEK[0]:
        verdict = (f"is for K = {DEEPSEEK[0]}, beyond this fast run (K ≤ {k_table}): run the full study to "
                   f"compare")
        short = f"the fast run stops at K = {k_table}, short of the report's K = {DEEPSEEK[0]}"
    elif typical_n < DEEPSEEK[1] < native_u["max"]:
        verdict = ("lies between the model's error for zero-mean inputs and its error for positive inputs, so the "
                   "model is consistent with it; the report's inputs are not given, so it cannot say more")
        short = "DeepSeek-V3's \"nearly 2%\" (inputs unstated) lies between the two"
    else:
        verdict = "falls outside the range the model gives for these two distributions"
        short = "DeepSeek-V3's \"nearly 2%\" falls outside that range"
    reach = (f"it reaches 2% near K ≈ {crossing}" if crossing else f"it stays below 2% up to K = {ks[-1]}")
    report.values.update(crossing_2pct=crossing, typical_n=typical_n, verdict=verdict)

    report.section("Comparison with the DeepSeek-V3 report")
    report.text(f"""
At K = {k_table} the Hopper (H100/H800) FP8 model without promotion gives:

- **U(0,1) inputs: {100 * native_u['max']:.2g}% largest relative error** (median {100 * native_u['median']:.2g}%);
  with these inputs {reach};
- **N(0,1) inputs: {100 * native_n['median']:.2g}% median, {100 * native_n['normwise']:.2g}% normwise**; the
  largest over the {rows} rows, {100 * native_n['max']:.2g}%, comes from a row whose exact sum nearly cancels.

The report's "nearly 2%" {verdict}. What the model does confirm is the mechanism and the remedy:

- **Why positive inputs are worse.** Each block of 32 products is aligned to the largest term, which after a
  few blocks is the running sum, and cut to 13 fraction bits below its leading bit (14 bits with it: the
  report's "around 14 bits"). With U(0,1) inputs every product is positive, the sum grows like K/4, and every
  product loses its bits below 2^-13 of the sum, always towards zero: the error is a bias
  ({100 * native_u['share_below']:.0f}% of rows come out below the exact sum) that grows linearly with K. With
  N(0,1) inputs the products have zero mean: the sum only grows like √K, so fewer bits fall out of the window,
  and the truncations (each toward zero, so of either sign) partly cancel.
- **Promotion works as the report says.** Adding the tensor core's partial result into binary32 every 128
  products keeps the error flat in K: {100 * promoted_u['max']:.2g}% largest (U) and
  {100 * promoted_n['normwise']:.2g}% normwise (N) at K = {k_table}: the error of one 128-product chunk.
- **Other paths.** FP16 inputs on the same H100 (25-bit window) give {100 * fp16_u['max']:.2g}% at K = {k_table}
  with U(0,1); Blackwell's FP8 path (31-bit window, nearest-even) is the most accurate model here, ahead of
  binary32 sequential summation.
""")

    report.finding = (
        f"Hopper FP8 without promotion, K = {k_table}: largest relative error {100 * native_u['max']:.2g}% for "
        f"U(0,1) inputs (a downward bias growing linearly with K; {reach}), "
        f"{100 * native_n['median']:.2g}% median / {100 * native_n['normwise']:.2g}% normwise for N(0,1); "
        f"{short}. Promotion to binary32 every 128 "
        f"products keeps the error flat ({100 * promoted_u['max']:.2g}% U, {100 * promoted_n['normwise']:.2g}% N "
        f"normwise), as the report's remedy claims.")


def _crossing(ks, errors, level: float):
    """The K at which errors first reach `level`, interpolated on log-log axes (None if never)."""
    for (k0, e0), (k1, e1) in zip(zip(ks, errors), zip(ks[1:], errors[1:])):
        if e0 < level <= e1 and e0 > 0:
            t = (math.log(level) - math.log(e0)) / (math.log(e1) - math.log(e0))
            k = math.exp(math.log(k0) + t * (math.log(k1) - math.log(k0)))
            return f"{int(round(k, -2 if k > 1000 else -1))}"
    return None


if __name__ == "__main__":
    from fpsim.cli import main

    sys.exit(main(["study", "accumulation_error", *sys.argv[1:]]))
