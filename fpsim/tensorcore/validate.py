"""Compare real tensor-core captures with the model, case by case, bit for bit."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from . import devices
from .captures import Capture, CaptureCase, load_capture, load_upstream_text
from .core import TensorCore


@dataclasses.dataclass
class CaseResult:
    """How many rows of one case the model reproduced bit for bit."""

    name: str
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
    """The model a case is compared with: its path, and for library calls the fp32
    accumulator with the library's output as a rounding epilogue."""
    meta = case.meta
    output = meta["output"]
    options = {"path": meta.get("path")}
    if meta.get("inputs_b", meta["inputs"]) != meta["inputs"]:
        options["inputs_b"] = meta["inputs_b"]
    if meta.get("path") == "fp16" and meta["level"] == "instruction":
        options["instruction_k"] = meta["k"]
    if meta["level"] == "library" and output != "fp32":
        options["epilogue"] = output
        output = "fp32"
    options.update(overrides)
    return TensorCore(device, inputs=meta["inputs"], output=output, **options)


def validate_case(case: CaptureCase, device: str, **overrides) -> CaseResult:
    """Run the model on a case's inputs and count bit-exact rows."""
    meta = case.meta
    tc = model_for(case, device, **overrides)
    a, b, d = case.a_values, case.b_values, case.d_values
    c = case.c_values
    if case.kind == "dot":
        model = tc.dot(a, b, c)
        flat_model, flat_d = np.ravel(model), np.ravel(d)
    else:
        model = tc.matmul(a, b, c)
        flat_model, flat_d = np.ravel(model), np.ravel(d)
    ok = same_bits(flat_model, flat_d)
    return CaseResult(meta["name"], meta["inputs"], meta["output"], case.k, ok.size, int(ok.sum()),
                      [int(i) for i in np.flatnonzero(~ok)], repr(tc.params))


def validate(capture: Capture, device: str | None = None, **overrides) -> list[CaseResult]:
    """Every case of a capture against the model of `device` (default: the capture's GPU)."""
    device = device or guess_device(capture.meta.get("gpu", ""))
    results = []
    for case in capture.cases:
        try:
            results.append(validate_case(case, device, **overrides))
        except ValueError as err:
            results.append(CaseResult(case.meta["name"], case.meta["inputs"], case.meta["output"], case.k,
                                      case.rows, 0, [], "-", note=str(err)))
    return results


def guess_device(gpu_name: str) -> str:
    """A device preset name from a GPU name such as 'NVIDIA H200' or 'A100-SXM4-80GB'."""
    lowered = gpu_name.lower()
    for name in sorted(devices.DEVICES, key=len, reverse=True):
        if name.replace("-", " ") in lowered.replace("-", " "):
            return name
    raise ValueError(f"cannot tell the device of GPU {gpu_name!r}; pass --device "
                     f"({', '.join(sorted(devices.DEVICES))})")
