"""Gradient-underflow analyzer: observe a real FP32 training run, tell which layers need loss scaling or FP32.

    with fpsim.watch(model, formats=("fp16", "bf16", "e4m3", "e5m2")) as w:
        ...                           # the training loop, unchanged
    report = w.report()
    report.save("out/")               # report.json, report.html, PNG figures

See docs/analyzer.md for the method, the verdict rules and the report schema.
"""

from .histogram import Log2Counter, Log2Histogram
from .hooks import DEFAULT_FORMATS, KINDS, StopRun, Watcher, watch
from .limits import FormatLimits
from .report import SCHEMA, Report
from .verdicts import VERDICTS, Settings

__all__ = ["DEFAULT_FORMATS", "KINDS", "SCHEMA", "VERDICTS", "FormatLimits", "Log2Counter", "Log2Histogram",
           "Report", "Settings", "StopRun", "Watcher", "watch"]
