"""Compare real tensor-core captures with the model, case by case, bit for bit.

Instruction-level cases must be reproduced bit for bit (`all_bit_exact`).
Library-level cases are reported but not judged: a library (cuBLAS) picks its
own summation order per call, which the default model does not choose
(docs/tensorcore.md says which strategy explains which H200 call).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from . import devices
from .captures import Capture, CaptureCase, bundled_captures, load_capture
from .core import TensorCore
from .upstream import load_upstream_text


@dataclasses.dataclass
class CaseResult:
    """How many rows of one case the model reproduced bit for bit."""

    name: str
    level: str
    inputs: str
    output: str
    k: int
    rows: int
    matched: int
    mismatches: list  # row indices
    model: str
    note: str = ""

    @property
    def agreement(self) -> float:
        return self.matched / self.rows if self.rows else 1.0

    @property
    def bit_exact(self) -> bool:
        return self.rows > 0 and self.matched == self.rows and not self.note


def capture_source(name_or_path) -> Path:
    """A capture's path: a file or upstream folder as given, else a bundled capture's name (h100)."""
    path = Path(name_or_path)
    bundled = bundled_captures()
    if not path.exists() and str(name_or_path).lower() in bundled:
        return bundled[str(name_or_path).lower()]
    return path


def read_capture(path) -> Capture:
    """A capture file (.npz) or a folder of upstream text files."""
    path = Path(path)
    if path.is_dir():
        return load_upstream_text(path)
    if not path.exists():
        raise FileNotFoundError(f"no capture at {path}")
    return load_capture(path)


def same_bits(x, y) -> np.ndarray:
    """Elementwise bit equality of binary32 values (NaN equal to NaN)."""
    x = np.asarray(x, dtype=np.float32)
    y = np.asarray(y, dtype=np.float32)
    return (x.view(np.uint32) == y.view(np.uint32)) | (np.isnan(x) & np.isnan(y))


def model_for(case: CaptureCase, device: str, **overrides) -> TensorCore:
    """The model a case is compared with: for an instruction-level case, the device's instruction
    of the case's k on the case's path; for a library call, the fp32 accumulator with the
    library's output as a rounding epilogue."""
    meta = case.meta
    inputs, output = meta["inputs"], meta["output"]
    options = {"path": meta.get("path")}
    if meta.get("inputs_b", inputs) != inputs:
        options["inputs_b"] = meta["inputs_b"]
    if meta["level"] == "instruction":
        devices.parameters(device, inputs, output, meta.get("path"))  # an unsupported combination, said first
        options["instruction"] = devices.instruction(device, inputs, output, k=case.k).shape
    elif output != "fp32":
        options["epilogue"] = output
        output = "fp32"
    options.update(overrides)
    return TensorCore(device, inputs=inputs, output=output, **options)


def validate_case(case: CaptureCase, device: str, **overrides) -> CaseResult:
    """Run the model on a case's inputs and count bit-exact rows."""
    meta = case.meta
    tc = model_for(case, device, **overrides)
    run = tc.dot if case.kind == "dot" else tc.matmul
    got = run(case.a_values, case.b_values, case.c_values, **case.scales)
    ok = same_bits(np.ravel(got), np.ravel(case.d_values))
    return CaseResult(meta["name"], meta["level"], meta["inputs"], meta["output"], case.k, ok.size, int(ok.sum()),
                      [int(i) for i in np.flatnonzero(~ok)], repr(tc.params))


def validate(capture: Capture, device: str | None = None, **overrides) -> list[CaseResult]:
    """Every case of a capture against the model of `device` (default: the capture's GPU); a case the
    device's model cannot run (an unsupported format) has 0 rows matched and a note saying why."""
    device = device or guess_device(capture.meta.get("gpu", ""))
    devices.generation(device)  # an unknown device is an error, not a column of zeros
    results = []
    for case in capture.cases:
        try:
            results.append(validate_case(case, device, **overrides))
        except ValueError as err:
            results.append(CaseResult(case.meta["name"], case.meta["level"], case.meta["inputs"], case.meta["output"],
                                      case.k, case.rows, 0, [], "-", note=str(err)))
    return results


def all_bit_exact(results: list[CaseResult]) -> bool:
    """Whether every instruction-level case was reproduced bit for bit (library calls are not judged)."""
    return all(r.bit_exact for r in results if r.level == "instruction")


def guess_device(gpu_name: str) -> str:
    """A device preset name from a GPU name such as 'NVIDIA H200' or 'A100-SXM4-80GB'."""
    lowered = gpu_name.lower()
    for name in sorted(devices.DEVICES, key=len, reverse=True):
        if name.replace("-", " ") in lowered.replace("-", " "):
            return name
    raise ValueError(f"cannot tell the device of GPU {gpu_name!r}; pass --device "
                     f"({', '.join(sorted(devices.DEVICES))})")
