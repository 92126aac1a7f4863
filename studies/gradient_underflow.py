"""Study 2: gradient underflow in a real model.

A small network is trained here in FP32 while the gradient-underflow analyzer
(fpsim.watch) records exact log2 histograms of every layer's activation and
weight gradients. The study draws them against the FP16, BF16, E4M3 and E5M2
ranges, before and after loss scaling, and gives the share of gradient values
each format would flush to zero, at scale 1, at the scale 8 of Micikevicius et
al. 2018 and at the analyzer's recommended scale.

The training task (data, model, loop) lives here and is shared with the
loss-scale sweep (studies/loss_scale_sweep.py).

    fpsim study gradient_underflow [--fast] [--out DIR]   # or: python studies/gradient_underflow.py
"""

from __future__ import annotations

import sys

import numpy as np

import fpsim
from fpsim import plots

TITLE = "Gradient underflow in a real model, against FP16, BF16, E4M3 and E5M2"
CLAIM = (
    "Micikevicius et al., *Mixed Precision Training* (ICLR 2018): in a Multibox SSD detector part of the "
    "activation gradients lie below FP16's smallest subnormal 2^-24 and are lost when stored in FP16; SSD "
    "trained in FP16 without loss scaling diverged, and a loss scale of 8 (shifting the gradients up 3 binades) "
    "was enough to match FP32 accuracy."
)

FORMATS = ("fp16", "bf16", "e4m3", "e5m2")
KINDS = ("activation_grad", "weight_grad")
KIND_NAMES = {"activation_grad": "activation gradients", "weight_grad": "weight gradients"}
PAPER_SCALE = 8

# ------------------------------------------------------------- the training task
DATA_SEED, INIT_SEED, BATCH_SEED = 0, 1, 2
N_SAMPLES, N_FEATURES, N_CLASSES, WIDTH, DEPTH, BATCH, LR = 4096, 16, 8, 64, 4, 256, 0.05
NOISE = 2.0  # cluster spread: the classes overlap, so the loss stays well above 0 (as in real tasks)
TASK = (f"a {DEPTH}-hidden-layer ReLU MLP ({N_FEATURES} → {WIDTH} × {DEPTH} → {N_CLASSES}, PyTorch default "
        f"initialisation, seed {INIT_SEED}) classifying a mixture of {N_CLASSES} overlapping Gaussian clusters "
        f"(centres N(0, 1), spread {NOISE}) in {N_FEATURES} dimensions ({N_SAMPLES} points generated here, seed {DATA_SEED}), mean cross-entropy, "
        f"SGD with momentum 0.9, learning rate {LR}, batches of {BATCH} (seed {BATCH_SEED})")


def analyzer_watch():
    """fpsim.watch, or a clear error when this checkout has no analyzer."""
    watch = getattr(fpsim, "watch", None)
    if watch is None:
        try:
            from fpsim.analyze import watch
        except ImportError:
            from fpsim.studies import StudyUnavailable

            raise StudyUnavailable("this study needs the gradient-underflow analyzer (fpsim.watch), "
                                   "which this checkout of fpsim lacks") from None
    return watch


def make_data():
    import torch

    g = torch.Generator().manual_seed(DATA_SEED)
    centres = torch.randn(N_CLASSES, N_FEATURES, generator=g)
    labels = torch.randint(0, N_CLASSES, (N_SAMPLES,), generator=g)
    points = centres[labels] + NOISE * torch.randn(N_SAMPLES, N_FEATURES, generator=g)
    return points, labels


def make_model():
    import torch

    torch.manual_seed(INIT_SEED)
    layers = [torch.nn.Linear(N_FEATURES, WIDTH), torch.nn.ReLU()]
    for _ in range(DEPTH - 1):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(WIDTH, N_CLASSES))
    return torch.nn.Sequential(*layers)


def train(steps: int, *, loss_scale: float | None = None, round_to: str | None = None, watch_formats=None,
          every: int = 1):
    """Train the task for `steps` steps; returns (final loss on all data, analyzer report or None, lost share).

    loss_scale / round_to: multiply the loss by S, round every activation gradient (each module's output
    gradient) and every weight gradient to `round_to` (nearest even) as it is produced, then divide the
    weight gradients by S before the update: FP16 gradient storage with a fixed loss scale, without
    GradScaler's skipping of steps. watch_formats: observe the run with fpsim.watch (FP32 only).
    """
    import contextlib

    import torch

    points, labels = make_data()
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    counts = [0, 0]  # nonzero gradient values, of those rounded to zero
    if round_to is not None:
        def rounded(grad):
            q = fpsim.quantize(grad, round_to)
            counts[0] += int(torch.count_nonzero(grad))
            counts[1] += int(torch.count_nonzero((q == 0) & (grad != 0)))
            return q

        def on_forward(module, inputs, output):
            if output.requires_grad:
                output.register_hook(rounded)

        for module in model:
            module.register_forward_hook(on_forward)
        for parameter in model.parameters():
            parameter.register_hook(rounded)
    scale = 1.0 if loss_scale is None else float(loss_scale)
    context = (analyzer_watch()(model, formats=watch_formats, every=every) if watch_formats
               else contextlib.nullcontext())
    batches = torch.Generator().manual_seed(BATCH_SEED)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a network this small only loses time to threads (and results stay reproducible)
    try:
        with context as watcher:
            for _ in range(steps):
                idx = torch.randint(0, N_SAMPLES, (BATCH,), generator=batches)
                loss = torch.nn.functional.cross_entropy(model(points[idx]), labels[idx])
                optimizer.zero_grad()
                (loss * scale).backward()
                if scale != 1.0:
                    for parameter in model.parameters():
                        parameter.grad /= scale
                optimizer.step()
        with torch.no_grad():
            final = float(torch.nn.functional.cross_entropy(model(points), labels))
    finally:
        torch.set_num_threads(threads)
    report = watcher.report() if watch_formats else None
    return final, report, (counts[1] / counts[0] if counts[0] else 0.0)


# -------------------------------------------------------------------- the study
def pooled(report_dict: dict, kind: str):
    """Histogram counts (edges, counts), nonzero count and per-format underflow-by-scale over all layers."""
    layers = [layer for layer in report_dict["layers"]
              if kind in layer["tensors"] and layer["type"] != "Sequential"]  # the whole model repeats its output
    lo_scale, hi_scale = None, None
    bins: dict[int, int] = {}
    nonzero, tiny, amax = 0, 0, 0.0
    under = {f: None for f in FORMATS}
    for layer in layers:
        t = layer["tensors"][kind]
        h = t["log2_histogram"]
        for i, c in enumerate(h["counts"]):
            bins[h["min_exponent"] + i] = bins.get(h["min_exponent"] + i, 0) + c
        tiny += h["tiny"]
        nonzero += t["nonzero"]
        amax = max(amax, t["amax"] or 0.0)
        lo_scale, hi_scale = t["underflow_by_scale"]["log2_scales"]
        for f in FORMATS:
            row = np.asarray(t["underflow_by_scale"][f]) * t["nonzero"]
            under[f] = row if under[f] is None else under[f] + row
    lo_e, hi_e = min(bins), max(bins)
    edges = np.arange(lo_e, hi_e + 2, dtype=float)
    counts = np.array([bins.get(e, 0) for e in range(lo_e, hi_e + 1)], dtype=float)
    below_2_24 = (sum(c for e, c in bins.items() if e < -24) + tiny) / nonzero
    return {"edges": edges, "counts": counts, "nonzero": nonzero, "amax": amax, "below_2_24": below_2_24,
            "scales": (lo_scale, hi_scale), "underflow": {f: under[f] / nonzero for f in FORMATS},
            "layers": len(layers)}


def underflow_at(stats: dict, fmt: str, log2_scale: int) -> float:
    lo, _ = stats["scales"]
    return float(stats["underflow"][fmt][log2_scale - lo])


def overflows_at(stats: dict, fmt: str, log2_scale: int) -> bool:
    return stats["amax"] * 2.0 ** log2_scale > float(fpsim.format(fmt).max)


def overflow_share(stats: dict, fmt: str, log2_scale: int) -> float:
    """Share of values whose whole binade lies beyond the format's max after the scale (0 if nothing overflows)."""
    if not overflows_at(stats, fmt, log2_scale):
        return 0.0
    emax = fpsim.format(fmt).emax
    beyond = stats["counts"][stats["edges"][:-1] + log2_scale > emax].sum()
    return float(beyond) / stats["nonzero"]


def _pct(x: float) -> str:
    if x == 0:
        return "0%"
    return f"{100 * x:.2g}%" if x >= 1e-4 else f"{100 * x:.1e}%"


def run(report, fast: bool) -> None:
    steps, every = (30, 5) if fast else (400, 5)
    final, analysis, _ = train(steps, watch_formats=FORMATS, every=every)
    data = analysis.to_dict()
    scales = data["loss_scale"]
    stats = {kind: pooled(data, kind) for kind in KINDS}
    fp16_rec = scales["fp16"]["recommended_log2"]
    shown = fp16_rec if fp16_rec is not None else 3  # no FP16 window: show the paper's scale 8 instead
    fp16_window = (f"2^{scales['fp16']['min_log2']} .. 2^{scales['fp16']['max_log2']}"
                   if scales["fp16"]["min_log2"] is not None else "empty (no scale serves every layer)")

    report.section("Method")
    report.text(f"""
The network: {TASK}; {steps} steps in FP32, final loss {final:.3g} nats on all {N_SAMPLES} points. The run is
observed with `fpsim.watch(model, formats={FORMATS}, every={every})`: every {every}th step, the analyzer counts
the exact binade of every activation gradient (each module's output gradient) and weight gradient, and reports
per layer and format the share of nonzero values that would round to zero after a loss scale 2^s, for every s,
and a recommended loss scale per format (`report.loss_scale`). The figures pool the {stats['activation_grad']['layers']}
modules' histograms (the whole model's own output gradient is left out: it repeats the last layer's).
""")

    lost1 = {f: (underflow_at(stats["activation_grad"], f, 0), overflow_share(stats["activation_grad"], f, 0))
             for f in FORMATS}
    hist = {f"{KIND_NAMES[k]}": (stats[k]["edges"], stats[k]["counts"]) for k in KINDS}
    report.figure(plots.log2_histogram(hist, FORMATS, lost=lost1, lost_label="act. grads lost",
                                       title="Gradients at loss scale 1"),
                  "scale-1",
                  "Share of nonzero gradient values per binade, pooled over layers and observed steps, above the "
                  "ranges of FP16, BF16, E4M3 and E5M2 (hatched: subnormal binades; dotted lines: each format's "
                  "smallest subnormal). Right: the share of activation gradients that rounds to zero (→ 0) in "
                  "each format, and the share beyond its max (Inf/NaN).")
    lost_rec = {f: (underflow_at(stats["activation_grad"], f, shown),
                    overflow_share(stats["activation_grad"], f, shown)) for f in FORMATS}
    which = "the analyzer's FP16 loss scale" if fp16_rec is not None else "the paper's loss scale"
    report.figure(plots.log2_histogram(hist, FORMATS, scale=2.0 ** shown, lost=lost_rec,
                                       lost_label="act. grads lost",
                                       title=f"Gradients after {which} 2^{shown}"),
                  "scaled",
                  f"The same gradients multiplied by {which} 2^{shown}: the histograms move {shown} binades "
                  f"right, towards FP16's normal range.")

    from fpsim.analyze import figures as analyzer_figures

    report.figure(analyzer_figures.magnitude_heatmap(analysis, "activation_grad", formats=FORMATS), "per-layer",
                  "The analyzer's own view, layer by layer (`fpsim.analyze.figures.magnitude_heatmap`): share of each "
                  "layer's activation gradients per binade, under the formats' ranges, with FP16's range as seen "
                  "from the unscaled gradients at the recommended loss scale.")

    report.section("Share of gradient values lost to zero, per format")
    rows = []
    for f in FORMATS:
        rec = scales[f]["recommended_log2"]
        window = (f"2^{scales[f]['min_log2']} .. 2^{scales[f]['max_log2']}" if scales[f]["min_log2"] is not None
                  else "none")
        cells = [f"`{f}`"]
        for kind in KINDS:
            st = stats[kind]
            cells += [_pct(underflow_at(st, f, 0)), _pct(underflow_at(st, f, 3))]
            cells.append("-" if rec is None else _pct(underflow_at(st, f, rec))
                         + (" (overflow!)" if overflows_at(st, f, rec) else ""))
        cells += [window, "-" if rec is None else f"2^{rec}"]
        rows.append(cells)
    report.table(("format", "activation grads lost, S = 1", "S = 8", "S = recommended", "weight grads lost, S = 1",
                  "S = 8", "S = recommended", "analyzer's window", "recommended S"), rows,
                 caption="Share of nonzero gradient values that round to zero when multiplied by the loss scale S "
                         "and stored in each format (nearest even), pooled over layers and observed steps. The "
                         "window is the analyzer's range of global loss scales that keeps every layer's underflow "
                         "at most 0.1% without overflow (for 8-bit formats real recipes use per-tensor scales "
                         "instead; the analyzer's report gives those too).")

    act, wgt = stats["activation_grad"], stats["weight_grad"]
    s8_in = scales["fp16"]["min_log2"] is not None and scales["fp16"]["min_log2"] <= 3 <= scales["fp16"]["max_log2"]
    report.values.update(final_loss=final, below_2_24=act["below_2_24"], fp16_lost_1=underflow_at(act, "fp16", 0),
                         fp16_lost_8=underflow_at(act, "fp16", 3), fp16_window=(scales["fp16"]["min_log2"],
                                                                                 scales["fp16"]["max_log2"]),
                         fp16_recommended=fp16_rec, bf16_lost_1=underflow_at(act, "bf16", 0),
                         e4m3_lost_1=underflow_at(act, "e4m3", 0), e5m2_lost_1=underflow_at(act, "e5m2", 0),
                         weight_fp16_lost_1=underflow_at(wgt, "fp16", 0))

    report.section("Comparison with Micikevicius et al. 2018")
    report.text(f"""
- **Part of the activation gradients lies below 2^-24: {"yes" if act["below_2_24"] > 0 else "no"}, here too.**
  {_pct(act["below_2_24"])} of the nonzero activation gradients of this network are below FP16's smallest
  subnormal 2^-24, and {_pct(underflow_at(act, "fp16", 0))} round to zero in FP16 (weight gradients:
  {_pct(underflow_at(wgt, "fp16", 0))}). BF16, with FP32's exponent range, loses
  {_pct(underflow_at(act, "bf16", 0))}; E5M2 {_pct(underflow_at(act, "e5m2", 0))} and E4M3
  {_pct(underflow_at(act, "e4m3", 0))} without a scale.
- **A loss scale of 8** brings FP16's loss of activation gradients to {_pct(underflow_at(act, "fp16", 3))};
  the analyzer's FP16 window for this network is {fp16_window} (every layer at most 0.1% lost, nothing
  overflowing), {"which holds" if s8_in else "which does not hold"} 8, and it recommends
  {"nothing" if fp16_rec is None else f"2^{fp16_rec}"}. The paper's SSD needed 8; this network's gradients sit
  {"higher" if scales["fp16"]["min_log2"] is not None and scales["fp16"]["min_log2"] < 3 else "lower"}, so the
  window is not the paper's, but the mechanism is the same: a power-of-two scale moves the tail above 2^-24
  long before the top reaches 65504.
- **Unscaled FP16 training diverged** for SSD: whether the lost values matter for this network's training is
  what the loss-scale sweep tests (`fpsim study loss_scale_sweep`).
""")
    report.finding = (
        f"{_pct(act['below_2_24'])} of this MLP's nonzero activation gradients lie below 2^-24 and "
        f"{_pct(underflow_at(act, 'fp16', 0))} round to zero in FP16 (BF16 {_pct(underflow_at(act, 'bf16', 0))}, "
        f"E5M2 {_pct(underflow_at(act, 'e5m2', 0))}, E4M3 {_pct(underflow_at(act, 'e4m3', 0))} at scale 1), as "
        f"Micikevicius et al. saw for SSD; a loss scale of 8 cuts the FP16 loss to "
        f"{_pct(underflow_at(act, 'fp16', 3))}, and the analyzer's FP16 window is {fp16_window}"
        + ("." if fp16_rec is None else f" (recommended 2^{fp16_rec}): 8 is {'inside' if s8_in else 'below'} it."))


if __name__ == "__main__":
    from fpsim.cli import main

    sys.exit(main(["study", "gradient_underflow", *sys.argv[1:]]))
