"""`report.save` of a 12-layer GPT's report: with figures, without, and figure by figure, against the
same figures drawn with matplotlib's constrained layout (the peer: what the figures would cost with
matplotlib's own automatic layout instead of the fixed margins the report uses).

    python benchmarks/bench_report_save.py [--repeats 3] [--threads 1]

The model is fpsim.analyze.gpt's GPT (12 layers, 64 wide, block 32), watched for 3 AdamW steps with
the default options (op-level observation). Times are the fastest of `repeats`, as wall-clock time and
as CPU time of this process (less disturbed by other work on a shared machine). Target: report.save
with figures <= 2 s.
"""

from __future__ import annotations

import argparse
import io
import tempfile
import time

import torch

from common import fastest, gpt_report
from fpsim.analyze.report import PNG_OPTIONS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    report = gpt_report()
    layers = len([layer for layer in report.layers if not layer.is_op])
    with tempfile.TemporaryDirectory() as folder:
        report.save(folder)   # warm: imports matplotlib, builds its font cache
        with_figures = fastest(lambda: report.save(folder), args.repeats)
        without = fastest(lambda: report.save(folder, figures=False), args.repeats)
        with_figures_cpu = fastest(lambda: report.save(folder), args.repeats, clock=time.process_time)
        without_cpu = fastest(lambda: report.save(folder, figures=False), args.repeats, clock=time.process_time)
    print(f"12-layer GPT report ({layers} layers, {len(report.findings)} op findings), fastest of {args.repeats}:")
    print(f"  report.save with figures     {with_figures:6.2f} s   cpu {with_figures_cpu:6.2f} s   (target <= 2 s)")
    print(f"  report.save, figures=False   {without:6.2f} s   cpu {without_cpu:6.2f} s")
    total_fixed = total_constrained = 0.0
    for name, build in report.figure_builders().items():
        def fixed():
            build().savefig(io.BytesIO(), format="png", dpi=100, pil_kwargs=PNG_OPTIONS)

        def constrained():
            fig = build()
            fig.set_layout_engine("constrained")
            fig.savefig(io.BytesIO(), format="png", dpi=100, pil_kwargs=PNG_OPTIONS)

        t_fixed, t_constrained = fastest(fixed, args.repeats), fastest(constrained, args.repeats)
        total_fixed += t_fixed
        total_constrained += t_constrained
        print(f"  {name:<32} {t_fixed:6.3f} s   constrained layout {t_constrained:6.3f} s")
    print(f"  all figures                  {total_fixed:6.2f} s   constrained layout {total_constrained:6.2f} s   "
          f"ratio {total_fixed / total_constrained:.2f}")


if __name__ == "__main__":
    main()
