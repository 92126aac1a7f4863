"""The upstream capture layout: text files of the MATLAB-tensor-core model_validation data.

Khattak and Mikaitis published real tensor-core outputs as text
(north-numerical-computing/MATLAB-tensor-core, ``model_validation/<GPU>/<fmt>/``:
``a_*.txt`` and ``b_*.txt`` rows of hexadecimal binary32 bit patterns,
``c_*.txt`` and ``d_<GPU>_<out>.txt`` one 32-digit binary string per row).
`load_upstream_text` reads such a folder into a `captures.Capture`, following
what the data show about how each case used its c (`upstream_case_rules`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..rounding import quantize
from . import devices
from .captures import Capture, CaptureCase, bits_to_f64, f32_bits, new_meta


def _read_hex_rows(path: Path, limit) -> np.ndarray:
    rows = []
    with open(path) as f:
        for line in f:
            if limit is not None and len(rows) >= limit:
                break
            if line.strip():
                rows.append([int(t, 16) for t in line.split()])
    widths = {len(r) for r in rows}
    if len(widths) != 1:
        raise ValueError(f"{path}: rows have different lengths {sorted(widths)}")
    return np.array(rows, dtype=np.uint32)


def _read_bin_rows(path: Path, limit) -> np.ndarray:
    vals = []
    with open(path) as f:
        for line in f:
            if limit is not None and len(vals) >= limit:
                break
            s = line.strip()
            if s:
                if len(s) != 32 or set(s) - {"0", "1"}:
                    raise ValueError(f"{path}: line {len(vals) + 1} is not a 32-bit binary string: {s!r}")
                vals.append(int(s, 2))
    return np.array(vals, dtype=np.uint32)


def read_upstream_folder(folder, rows: int | None = None) -> dict:
    """Raw arrays of one upstream ``<GPU>/<fmt>/`` folder.

    Returns {"gpu", "inputs", "a", "b", "c", "d": {"fp32": ..., "fp16": ...}},
    all uint32 binary32 bit patterns, cut to the first ``rows`` rows.
    """
    folder = Path(folder)
    gpu, fmt = folder.parent.name, folder.name
    inputs = fmt.lower()
    if inputs not in devices.INPUT_FORMATS:
        raise ValueError(f"{folder}: unknown input format folder {fmt!r}; "
                         f"allowed: {sorted(devices.INPUT_FORMATS)} (any case)")

    def one(pattern):
        found = sorted(folder.glob(pattern))
        if len(found) != 1:
            raise ValueError(f"{folder}: expected one file matching {pattern!r}, found {len(found)}")
        return found[0]

    a = _read_hex_rows(one("a_*.txt"), rows)
    b = _read_hex_rows(one("b_*.txt"), rows)
    c = _read_bin_rows(one("c_*.txt"), rows)
    d = {}
    for out in devices.OUTPUT_FORMATS:
        p = folder / f"d_{gpu}_{out}.txt"
        if p.exists():
            d[out] = _read_bin_rows(p, rows)
    if not d:
        raise ValueError(f"{folder}: no d_{gpu}_fp32.txt or d_{gpu}_fp16.txt")
    n = a.shape[0]
    for key, arr in [("b", b), ("c", c)] + [(f"d_{o}", v) for o, v in d.items()]:
        if arr.shape[0] != n:
            raise ValueError(f"{folder}: {key} has {arr.shape[0]} rows but a has {n}")
    if b.shape != a.shape:
        raise ValueError(f"{folder}: a is {a.shape} but b is {b.shape}")
    return {"gpu": gpu, "inputs": inputs, "a": a, "b": b, "c": c, "d": d}


def fp16_round_bits(c_bits) -> np.ndarray:
    """binary32 bits -> bits of the same values rounded to binary16 (RN-even), widened."""
    return f32_bits(quantize(bits_to_f64(c_bits), "fp16"))


def upstream_case_rules(gpu: str, inputs: str, output: str) -> dict:
    """How an upstream case used its c file (facts checked against the data).

    Returns {"c": "fp32" | "fp16" | "zero", "c_format": ..., "why": str}.
    """
    fp8 = devices.is_fp8(inputs)
    if output == "fp16" and fp8:
        return {"c": "fp16", "c_format": "fp16",
                "why": "FP8 inputs with fp16 output: c holds the file's c rounded to binary16 "
                       "(nearest-even), the better supported but not certain reading of the "
                       "data (see below)"}
    if output == "fp16":
        return {"c": "fp16", "c_format": "fp16",
                "why": "fp16 output: the accumulator is binary16, so c was rounded to binary16 "
                       "(nearest-even) before the instruction; c holds that rounded value"}
    if fp8 and gpu.upper() in ("H100", "H200"):
        return {"c": "zero", "c_format": "fp32",
                "why": f"{gpu.upper()} FP8 with fp32 output: the kernel computed d = a.b with c = 0; "
                       "the c file was not used, so c holds zeros"}
    return {"c": "fp32", "c_format": "fp32", "why": "c is the binary32 value of the c file"}


def upstream_fp8_path(gpu: str, inputs: str, output: str) -> str | None:
    """Which FP8 path the upstream rows took, as the data show: on H100 and B200 the
    fp16-output rows match binary16 MMAs (c added last), the fp32-output rows the
    native FP8 model; Ada (L40S) has native FP8 mma.sync."""
    if not devices.is_fp8(inputs):
        return None
    if gpu.upper() in ("H100", "H200", "B200") and output == "fp16":
        return "fp16"
    return "native"


def load_upstream_text(folder, rows: int | None = None) -> Capture:
    """Read the upstream text layout directly into a :class:`Capture`.

    ``folder`` is one GPU's folder (holding ``fp16/``, ``E4M3/`` ...) or one
    format folder. Each ``d_<GPU>_<out>.txt`` becomes one case named
    ``<inputs>_<out>``; c follows :func:`upstream_case_rules`.
    """
    folder = Path(folder)
    if list(folder.glob("a_*.txt")):
        subdirs, gpu = [folder], folder.parent.name
    else:
        subdirs = sorted(p for p in folder.iterdir() if p.is_dir() and list(p.glob("a_*.txt")))
        gpu = folder.name
        if not subdirs:
            raise ValueError(f"{folder}: no upstream case folders (a_*.txt) found")
    cases = []
    for sub in subdirs:
        raw = read_upstream_folder(sub, rows)
        inputs = raw["inputs"]
        k = raw["a"].shape[1]
        for out, d in raw["d"].items():
            rule = upstream_case_rules(gpu, inputs, out)
            if rule["c"] == "zero":
                c = np.zeros_like(raw["c"])
            elif rule["c"] == "fp16":
                c = fp16_round_bits(raw["c"])
            else:
                c = raw["c"].copy()
            meta = {"name": f"{inputs}_{out}", "kind": "dot", "level": "instruction",
                    "inputs": inputs, "c_format": rule["c_format"], "output": out, "k": k,
                    "instruction": _upstream_instruction(inputs, out, k),
                    "flags": {}, "notes": rule["why"]}
            path = upstream_fp8_path(gpu, inputs, out)
            if path:
                meta["path"] = path
                meta["notes"] += (f" FP8 path '{path}': which model reproduces the rows (the "
                                  f"compiler, not the PTX instruction, decides it; docs/tensorcore.md).")
            tags = np.full(raw["a"].shape[0], "upstream:random")
            cases.append(CaptureCase(meta, raw["a"], raw["b"], c, d, tags))
    meta = new_meta(f"NVIDIA {gpu}", backend="upstream-text",
                    compute_capability=compute_capability(gpu),
                    source=f"upstream text files in {folder}")
    return Capture(meta, cases)


def compute_capability(gpu: str) -> str | None:
    """The compute capability of an upstream GPU folder's name ("H100" -> "9.0"), None if unknown."""
    try:
        return ".".join(map(str, devices.COMPUTE_CAPABILITY[devices.generation(gpu)]))
    except ValueError:
        return None


def _upstream_instruction(inputs: str, output: str, k: int) -> str:
    """The upstream FP8 kernels ran mma.sync m16n8k32; the others do not say which MMA."""
    fp8 = [i for i in devices.INSTRUCTIONS if i.kind == "mma" and i.inputs == inputs and i.k == k]
    if devices.is_fp8(inputs) and fp8:
        return fp8[0].ptx(output)
    return f"warp-level MMA (wmma or mma.sync), K={k} per instruction as recorded"
