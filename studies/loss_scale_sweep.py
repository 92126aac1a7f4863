"""Study 3: loss-scale sweep with FP16 gradients, against the analyzer's predicted window.

The network of the gradient-underflow study is trained again and again with
every gradient rounded to FP16 as it is produced (scale the loss by S, round
each activation and weight gradient to FP16 with fpsim.quantize in hooks,
unscale before the update), for S = 1, 2, 4, ..., 2^24, and its final loss is
drawn against S together with the window of loss scales the analyzer
(fpsim.watch) predicts from one FP32 run.

    fpsim study loss_scale_sweep [--fast] [--out DIR]   # or: python studies/loss_scale_sweep.py
"""

from __future__ import annotations

import math
import sys

import numpy as np

from fpsim import plots, studies

TITLE = "Loss-scale sweep: final loss with FP16 gradients against the loss scale"
CLAIM = (
    "The gradient-underflow analyzer predicts, from one FP32 run, a window of loss scales 2^lo .. 2^hi for FP16 "
    "gradients: below it too many gradient values flush to zero, above it some overflow. Micikevicius et al. 2018 "
    "report both failure modes (unscaled FP16 training of SSD diverged; too large a scale overflows) and that a "
    "scale inside the window (8 for SSD) matches FP32."
)


def _task():
    return studies.load("gradient_underflow")


def run(report, fast: bool) -> None:
    task = _task()
    steps, every = (30, 5) if fast else (400, 5)
    exponents = [0, 12, 24] if fast else list(range(0, 25))

    reference, analysis, _ = task.train(steps, watch_formats=("fp16",), every=every)
    window = analysis.to_dict()["loss_scale"]["fp16"]
    lo, hi, rec = window["min_log2"], window["max_log2"], window["recommended_log2"]
    finals, lost = [], []
    for e in exponents:
        final, _, share = task.train(steps, loss_scale=2.0 ** e, round_to="fp16")
        finals.append(final)
        lost.append(share)
    finals = np.array(finals)

    report.section("Method")
    report.text(f"""
The network and data of `gradient_underflow` ({task.TASK}) are trained for {steps} steps from the same
initialisation and the same batches, once in FP32 (the reference, observed with `fpsim.watch(model,
formats=("fp16",), every={every})` to get the analyzer's FP16 window) and once per loss scale S = 2^e,
e ∈ {{{", ".join(map(str, exponents))}}}, with FP16 gradients: the loss is multiplied by S, every module's output
gradient and every weight gradient is rounded to FP16 (nearest even, `fpsim.quantize` in tensor hooks) as
backpropagation produces it, and the weight gradients are divided by S (in FP32) before the SGD step. The
scale is fixed: unlike `torch.amp.GradScaler`, nothing skips a step whose gradients overflowed, so an overflow
(Inf) turns the weights into NaN and the run diverges. The final loss is the mean cross-entropy on all
{task.N_SAMPLES} points.
""")

    ok_window = lo is not None
    report.figure(plots.loss_scale_window(2.0 ** np.array(exponents), {"FP16 gradients, fixed loss scale S": finals},
                                          window=(2.0 ** lo, 2.0 ** hi) if ok_window else None,
                                          reference=reference,
                                          window_label=f"analyzer's FP16 window 2^{lo} .. 2^{hi}" if ok_window
                                          else "analyzer's window",
                                          reference_label=f"FP32 training: {reference:.3g}",
                                          ylabel="final training loss (cross-entropy, nats)",
                                          title="Final loss against the loss scale, FP16 gradients"),
                  "sweep",
                  "Final loss of the same training run with every gradient stored in FP16 at loss scale S, "
                  "against S; crosses on the top edge: the run diverged (NaN or Inf). Green: the window the "
                  "analyzer predicted from one FP32 run; dashed: the FP32 run.")

    rows = []
    for e, final, share in zip(exponents, finals, lost):
        inside = ok_window and lo <= e <= hi
        status = "diverged (NaN/Inf)" if not math.isfinite(final) else f"{final:.4g}"
        gap = "-" if not math.isfinite(final) else f"{100 * (final - reference) / reference:+.2g}%"
        rows.append((f"2^{e}", status, gap, f"{100 * share:.3g}%", "inside" if inside else "outside"))
    report.table(("loss scale S", "final loss", "vs FP32", "gradient values flushed to zero",
                  "analyzer's window"), rows,
                 caption=f"FP32 reference: {reference:.4g}. 'Flushed': share of nonzero gradient values (activation "
                         "and weight gradients, all steps) that FP16 rounding turned into zero.")

    finite = np.isfinite(finals)
    deviation = (finals - reference) / reference
    diverged = [e for e, f in zip(exponents, finite) if not f]
    first_diverged = diverged[0] if diverged else None
    inside = np.array([lo is not None and lo <= e <= hi for e in exponents])
    below = np.array([lo is not None and e < lo for e in exponents])
    inside_ok = bool(inside.any() and finite[inside].all())
    # the scatter that rounding alone causes: the in-window runs' spread, and at least ±1%
    spread = (min(-0.01, float(deviation[inside].min())), max(0.01, float(deviation[inside].max()))) \
        if inside_ok else None
    # whether the runs below the window trained worse: their mean deviation against the in-window runs' mean,
    # beyond two standard errors of that difference (the in-window runs' standard deviation as the scatter of
    # one run; at least 1%). Not "each run inside the in-window range": one run in six of the same scatter
    # lies outside the range of twelve by chance alone, so that test flips from one rerun to the next.
    shift = margin = None
    if inside_ok and below.any() and finite[below].all():
        d_in, d_below = deviation[inside], deviation[below]
        sd = float(d_in.std(ddof=1)) if len(d_in) > 1 else 0.0
        shift = float(d_below.mean() - d_in.mean())
        margin = max(0.01, 2 * sd * math.sqrt(1 / len(d_in) + 1 / len(d_below)))
    below_ok = shift is not None and shift <= margin
    report.values.update(reference=reference, finals=finals.tolist(), exponents=exponents, window=(lo, hi),
                         recommended=rec, first_diverged=first_diverged, inside_ok=inside_ok, below_ok=below_ok,
                         spread=spread, below_shift=shift, below_margin=margin, lost=lost)

    if lo is None:
        verdict = "The analyzer found no FP16 window for this run, so there is no prediction to test."
    else:
        inside_dev = deviation[inside]
        inside_text = (f"every run inside the window 2^{lo} .. 2^{hi} trained normally (final loss "
                       f"{100 * inside_dev.min():+.2g}% .. {100 * inside_dev.max():+.2g}% from FP32: the scatter "
                       f"that rounding alone causes)" if inside_ok else
                       f"a run inside the window 2^{lo} .. 2^{hi} diverged")
        survived = [e for e, f in zip(exponents, finite) if f and (first_diverged is None or e < first_diverged)]
        last_ok = max(survived) if survived else None
        if first_diverged is None:
            upper = "no scale in the sweep diverged, so the upper edge is untested"
        elif first_diverged <= hi:
            upper = f"2^{first_diverged}, inside the window, diverged: the upper edge is too high"
        elif last_ok is not None and last_ok > hi:
            upper = (f"runs up to 2^{last_ok} survived although the window ends at 2^{hi}: the upper edge is "
                     f"conservative")
        elif first_diverged == hi + 1:
            upper = f"the first scale that diverged, 2^{first_diverged}, is the first one above the window: exact"
        else:
            upper = (f"the first tested scale above the window's top 2^{hi}, 2^{first_diverged}, diverged: "
                     f"consistent (the sweep's steps cannot place the edge more precisely)")
        if not below.any():
            lower = "the window starts at the sweep's first scale, so the lower edge is untested"
        elif below_ok:
            lower = (f"the runs below it (S < 2^{lo}, which flush up to {100 * max(np.array(lost)[below]):.2g}% of "
                     f"the gradient values) end on average {100 * shift:+.2g}% from the in-window runs' mean, within "
                     f"two standard errors of that scatter ({100 * margin:.2g}%): losing them did not measurably hurt "
                     f"this network, so the lower edge (at most 0.1% lost per layer) is conservative here")
        elif shift is None:
            lower = f"a run below it (S < 2^{lo}) diverged"
        else:
            lower = (f"the runs below it (S < 2^{lo}) end on average {100 * shift:+.2g}% from the in-window runs' "
                     f"mean, beyond two standard errors of that scatter ({100 * margin:.2g}%): losing those gradient "
                     f"values hurt")
        verdict = f"Upper edge: {upper}. Inside: {inside_text}. Lower edge: {lower}."
    report.section("Does the prediction hold?")
    report.text(verdict + f"""

The overflow side is sharp: a single Inf among the gradients poisons the weights, which is why dynamic loss
scaling (GradScaler) skips such steps and lowers S. The underflow side is gradual: values below 2^-25 · S⁻¹
vanish, and whether that hurts depends on whether the lost values carry learning (in SSD they did:
Micikevicius et al. saw divergence without scaling). Here the share of flushed gradient values at S = 1 is
{100 * lost[0]:.3g}%.
""")
    report.finding = (f"Analyzer's FP16 window from one FP32 run: 2^{lo} .. 2^{hi}. " + verdict
                      + f" FP32 loss {reference:.3g}.")


if __name__ == "__main__":
    from fpsim.cli import main

    sys.exit(main(["study", "loss_scale_sweep", *sys.argv[1:]]))
