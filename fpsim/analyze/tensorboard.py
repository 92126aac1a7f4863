"""A report as TensorBoard events: log2-magnitude histograms, verdicts and loss scales at a step.

Written through torch.utils.tensorboard's SummaryWriter (it needs the
`tensorboard` package). At step s (default: the report's optimizer steps)
each call writes, for every module entry:

- `log2_abs/<kind>/<layer>`: a histogram over log2|x| of the nonzero finite
  values counted so far, one bucket per binade [e, e+1) (float32 subnormals
  in one bucket [-149, -126)); its sum and sum of squares use the bucket
  middles, so TensorBoard's mean is that of the binades;
- `verdict/<format>/<layer>`: 0 ok, 1 loss_scale, 2 fp32;
- `grad_underflow_at_1/<format>/<layer>`: the largest share of its nonzero
  gradients that flush to zero at scale 1;

and per format `loss_scale_log2/<format>` (the recommended scale; absent
when none serves) and `layers/<format>/<verdict>` (how many modules got it),
plus the summary table as text `fpsim/summary`. Counts are cumulative: a
histogram at step s holds every value observed up to s.

It lives with the report it writes (`Report.to_tensorboard`); fpsim.integrations
re-exports `to_tensorboard` and its callbacks write through `write_report`.
"""

from __future__ import annotations

import os

from .histogram import E_LO, TINY_LOG2_RANGE
from .verdicts import GRADIENT_KINDS

VERDICT_VALUE = {"ok": 0, "loss_scale": 1, "fp32": 2}


def summary_writer(directory):
    """A torch SummaryWriter into `directory`; ImportError saying what to install when tensorboard is missing."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as err:
        raise ImportError(f"TensorBoard export needs the tensorboard package (pip install tensorboard): "
                          f"{err}") from None
    return SummaryWriter(log_dir=os.fspath(directory))


def to_tensorboard(report, directory, step: int | None = None) -> str:
    """Write `report` as TensorBoard events into `directory` at `step`; returns the directory."""
    writer = summary_writer(directory)
    try:
        write_report(report, writer, step)
    finally:
        writer.close()
    return os.fspath(directory)


def write_report(report, writer, step: int | None = None, text: bool = True, values: bool = True) -> None:
    """Add the report's histograms and scalars (`values`) and its summary table (`text`) to an open
    SummaryWriter."""
    step = int(report.run.get("steps", 0)) if step is None else step
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
    if values:
        _write_values(report, writer, step)
    if text:
        writer.add_text("fpsim/summary", "```\n" + report.summary_table() + "\n```", step)
    writer.flush()


def _write_values(report, writer, step: int) -> None:
    modules = [layer for layer in report.layers if not layer.is_op]
    for layer in modules:
        for kind, t in layer.tensors.items():
            buckets = _buckets(t.hist)
            if buckets:
                _add_histogram(writer, f"log2_abs/{kind}/{layer.name}", buckets, step)
        grads = [t for k, t in layer.tensors.items() if k in GRADIENT_KINDS and t.nonzero]
        for lim in report.limits:
            writer.add_scalar(f"verdict/{lim.name}/{layer.name}",
                              VERDICT_VALUE[report.verdicts[layer.name][lim.name].verdict], step)
            if grads:
                writer.add_scalar(f"grad_underflow_at_1/{lim.name}/{layer.name}",
                                  max(t.underflow_fraction(lim, 0) for t in grads), step)
    summary = report.summary()
    for lim in report.limits:
        recommended = report.loss_scale[lim.name].recommended_log2
        if recommended is not None:
            writer.add_scalar(f"loss_scale_log2/{lim.name}", recommended, step)
        for verdict in VERDICT_VALUE:
            writer.add_scalar(f"layers/{lim.name}/{verdict}", summary[lim.name][verdict], step)


def _buckets(hist) -> list:
    """[(left edge, right edge, count)] over log2|x| of the nonzero finite values, contiguous from the
    lowest binade holding values to the highest (TensorBoard reads each bucket from the previous limit)."""
    out = []
    if hist.tiny:
        out.append((TINY_LOG2_RANGE[0], TINY_LOG2_RANGE[1], int(hist.tiny)))
    used = [i for i, count in enumerate(hist.counts) if count]
    if used:
        first = 0 if hist.tiny else used[0]
        out += [(E_LO + i, E_LO + i + 1, int(hist.counts[i])) for i in range(first, used[-1] + 1)]
    return out


def _add_histogram(writer, tag: str, buckets: list, step: int) -> None:
    num = sum(c for _, _, c in buckets)
    middles = [((lo + hi) / 2, c) for lo, hi, c in buckets]
    writer.add_histogram_raw(tag, min=buckets[0][0], max=buckets[-1][1], num=num,
                             sum=sum(m * c for m, c in middles), sum_squares=sum(m * m * c for m, c in middles),
                             bucket_limits=[hi for _, hi, _ in buckets], bucket_counts=[c for _, _, c in buckets],
                             global_step=step)
