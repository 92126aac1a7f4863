"""Real tensor-core outputs on disk: the ``fpsim-capture/1`` schema.

A capture file is one ``.npz`` (``numpy.savez_compressed``, readable with
``allow_pickle=False``) holding the outputs a GPU really returned for known
inputs. Key ``meta`` is a 0-d unicode array holding JSON::

    {"schema": "fpsim-capture/1", "gpu": "NVIDIA H200", "compute_capability": "9.0",
     "driver": ..., "cuda": ..., "torch": ..., "backend": "cupy" | ...,
     "created": ISO date, "seed": ..., "source": provenance, "licence": ...,
     "failures": [{"case": ..., "error": ...}], "cases": [case meta, ...]}

Each case meta is ``{"name", "kind": "dot"|"matmul", "level":
"instruction"|"library", "inputs", "c_format", "output", "k", "instruction",
"flags", "notes"}`` (optionally ``"inputs_b"`` when B's format differs from
A's, and ``"same_inputs_as"``: the name of an earlier case whose a, b and c
this case reuses, so that library runs differing only in flags store their
inputs once). The arrays of case NAME are ``NAME/a``, ``NAME/b``, ``NAME/c``,
``NAME/d`` and optionally ``NAME/tags``:

* kind ``dot``: a, b (R, K); c, d (R,); tags (R,) unicode -- row r is
  ``d[r] = sum_k a[r, k] * b[r, k] + c[r]`` as the hardware computed it;
* kind ``matmul``: a (M, K), b (K, N), c (M, N) or absent, d (M, N).

Every value is stored as the uint32 bit pattern of its binary32 value: inputs
are exactly representable in binary32, and fp16/bf16 values (c, d) are widened
exactly. :func:`load_capture` checks all of this and says what is wrong.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

SCHEMA = "fpsim-capture/1"
KINDS = ("dot", "matmul")
LEVELS = ("instruction", "library")
INPUT_FORMATS = ("fp16", "bf16", "tf32", "e4m3", "e5m2")
C_FORMATS = ("fp32", "fp16", "bf16")
OUTPUT_FORMATS = ("fp32", "fp16", "bf16")
CASE_KEYS = ("name", "kind", "level", "inputs", "c_format", "output", "k",
             "instruction", "flags", "notes")
META_KEYS = ("schema", "gpu", "cases")


# ---------------------------------------------------------------------------
# The formats a capture can hold, and exact bit conversions
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class FloatSpec:
    """Just enough about a binary format to test representability."""

    name: str
    exp_bits: int
    man_bits: int
    emin: int          # exponent of the smallest normal number
    emax: int          # exponent of the largest finite number
    max: float         # largest finite value
    has_inf: bool

    @property
    def precision(self) -> int:
        """Significand bits including the implicit one."""
        return self.man_bits + 1

    @property
    def min_normal(self) -> float:
        return math.ldexp(1.0, self.emin)

    @property
    def min_subnormal(self) -> float:
        return math.ldexp(1.0, self.emin - self.man_bits)

    @property
    def max_subnormal(self) -> float:
        return self.min_normal - self.min_subnormal


SPECS = {
    "fp32": FloatSpec("fp32", 8, 23, -126, 127, float(np.finfo(np.float32).max), True),
    "tf32": FloatSpec("tf32", 8, 10, -126, 127, (2 - 2.0**-10) * 2.0**127, True),
    "fp16": FloatSpec("fp16", 5, 10, -14, 15, 65504.0, True),
    "bf16": FloatSpec("bf16", 8, 7, -126, 127, (2 - 2.0**-7) * 2.0**127, True),
    "e4m3": FloatSpec("e4m3", 4, 3, -6, 8, 448.0, False),
    "e5m2": FloatSpec("e5m2", 5, 2, -14, 15, 57344.0, True),
}


def _ml_dtype(fmt: str):
    import ml_dtypes

    return {"fp16": np.float16, "bf16": ml_dtypes.bfloat16,
            "e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2,
            "fp32": np.float32}[fmt]


def is_representable(values, fmt: str) -> np.ndarray:
    """Elementwise: is each float64 value exactly a value of ``fmt``?

    NaN counts as representable (every format here has one); infinities only
    where the format has them (E4M3FN has none).
    """
    if fmt not in SPECS:
        raise ValueError(f"unknown format {fmt!r}; allowed: {sorted(SPECS)}")
    x = np.asarray(values, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        f32 = x.astype(np.float32)
        exact32 = (f32.astype(np.float64) == x) | np.isnan(x)
        if fmt == "fp32":
            return exact32
        if fmt == "tf32":
            low = f32.view(np.uint32) & np.uint32(0x1FFF)
            return exact32 & ((low == 0) | np.isnan(x))
        y = x.astype(_ml_dtype(fmt)).astype(np.float64)
    return (y == x) | (np.isnan(x) & np.isnan(y))


def f32_bits(values) -> np.ndarray:
    """uint32 binary32 bit patterns of float64 values that binary32 holds exactly."""
    x = np.asarray(values, dtype=np.float64)
    bad = ~is_representable(x, "fp32")
    if bad.any():
        raise ValueError(f"{int(bad.sum())} value(s) not exactly representable in "
                         f"binary32, first {x[bad].flat[0]!r}")
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(np.float32).view(np.uint32)


def bits_to_f64(bits) -> np.ndarray:
    """float64 values of uint32 binary32 bit patterns (exact)."""
    return np.asarray(bits, dtype=np.uint32).view(np.float32).astype(np.float64)


def widen_fp16_bits(h) -> np.ndarray:
    """binary16 bit patterns (uint16) -> binary32 bit patterns, exactly
    (NaN payloads move up by 13 bits)."""
    return np.asarray(h, dtype=np.uint16).view(np.float16).astype(np.float32).view(np.uint32)


def widen_bf16_bits(h) -> np.ndarray:
    """bfloat16 bit patterns (uint16) -> binary32 bit patterns, exactly."""
    return np.asarray(h, dtype=np.uint32) << np.uint32(16)


# ---------------------------------------------------------------------------
# The in-memory form
# ---------------------------------------------------------------------------

@dataclass
class CaptureCase:
    """One case: its meta and its arrays of binary32 bit patterns (uint32)."""

    meta: dict
    a: np.ndarray
    b: np.ndarray
    c: np.ndarray | None
    d: np.ndarray
    tags: np.ndarray | None = None

    @property
    def name(self) -> str:
        return self.meta["name"]

    @property
    def kind(self) -> str:
        return self.meta["kind"]

    @property
    def k(self) -> int:
        return int(self.meta["k"])

    @property
    def rows(self) -> int:
        """Number of dot-product rows (dot) or output rows M (matmul)."""
        return int(self.d.shape[0])

    @property
    def a_values(self) -> np.ndarray:
        return bits_to_f64(self.a)

    @property
    def b_values(self) -> np.ndarray:
        return bits_to_f64(self.b)

    @property
    def c_values(self) -> np.ndarray | None:
        return None if self.c is None else bits_to_f64(self.c)

    @property
    def d_values(self) -> np.ndarray:
        return bits_to_f64(self.d)

    def validate(self, check_values: bool = True) -> None:
        """Raise ValueError naming the case and the problem if it breaks the schema."""
        _validate_case(self, check_values)


@dataclass
class Capture:
    """A capture file in memory: top-level meta (without "cases") and the cases."""

    meta: dict
    cases: list = field(default_factory=list)

    @property
    def names(self) -> list:
        return [c.name for c in self.cases]

    def case(self, name: str) -> CaptureCase:
        for c in self.cases:
            if c.name == name:
                return c
        raise KeyError(f"no case {name!r}; cases: {self.names}")

    def full_meta(self) -> dict:
        """The JSON object stored under ``meta``."""
        meta = {k: v for k, v in self.meta.items() if k != "cases"}
        meta.setdefault("schema", SCHEMA)
        meta.setdefault("failures", [])
        meta["cases"] = [c.meta for c in self.cases]
        return meta

    def validate(self, check_values: bool = True) -> None:
        _validate_meta(self.full_meta())
        seen = set()
        for c in self.cases:
            if c.name in seen:
                raise ValueError(f"duplicate case name {c.name!r}")
            seen.add(c.name)
            c.validate(check_values)


def new_meta(gpu: str, **fields) -> dict:
    """A top-level meta with the schema, the date and empty failures filled in."""
    meta = {"schema": SCHEMA, "gpu": gpu, "compute_capability": None, "driver": None,
            "cuda": None, "torch": None, "backend": None,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "seed": None, "source": "", "licence": "", "failures": []}
    meta.update(fields)
    return meta


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------

def _validate_meta(meta: dict) -> None:
    if not isinstance(meta, dict):
        raise ValueError(f"capture meta must be a JSON object, got {type(meta).__name__}")
    schema = meta.get("schema")
    if schema != SCHEMA:
        raise ValueError(f"unknown capture schema {schema!r}; this fpsim reads {SCHEMA!r}")
    for key in META_KEYS:
        if key not in meta:
            raise ValueError(f"capture meta lacks {key!r}")
    if not isinstance(meta["cases"], list):
        raise ValueError("capture meta 'cases' must be a list")
    if not isinstance(meta.get("failures", []), list):
        raise ValueError("capture meta 'failures' must be a list")


def _check_choice(case: str, key: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"case {case!r}: {key} {value!r} is not one of {list(allowed)}")


def _validate_case_meta(meta: dict) -> None:
    name = meta.get("name", "<unnamed>")
    if not isinstance(name, str) or not name or "/" in name:
        raise ValueError(f"case name must be a non-empty string without '/', got {name!r}")
    for key in CASE_KEYS:
        if key not in meta:
            raise ValueError(f"case {name!r}: meta lacks {key!r}")
    _check_choice(name, "kind", meta["kind"], KINDS)
    _check_choice(name, "level", meta["level"], LEVELS)
    _check_choice(name, "inputs", meta["inputs"], INPUT_FORMATS)
    if "inputs_b" in meta:
        _check_choice(name, "inputs_b", meta["inputs_b"], INPUT_FORMATS)
    _check_choice(name, "c_format", meta["c_format"], C_FORMATS + (None,))
    _check_choice(name, "output", meta["output"], OUTPUT_FORMATS)
    if not isinstance(meta["k"], int) or meta["k"] < 1:
        raise ValueError(f"case {name!r}: k must be a positive integer, got {meta['k']!r}")
    if not isinstance(meta["flags"], dict):
        raise ValueError(f"case {name!r}: flags must be an object")


def _check_array(case: str, key: str, arr, shape) -> None:
    if arr is None:
        raise ValueError(f"case {case!r}: missing array {key!r}")
    if arr.dtype != np.uint32:
        raise ValueError(f"case {case!r}: array {key!r} has dtype {arr.dtype}, "
                         "expected uint32 binary32 bit patterns")
    if arr.shape != shape:
        raise ValueError(f"case {case!r}: array {key!r} has shape {arr.shape}, expected {shape}")


def _check_values(case: str, key: str, bits, fmt) -> None:
    ok = is_representable(bits_to_f64(bits), fmt)
    if not ok.all():
        i = int(np.flatnonzero(~ok.ravel())[0])
        raise ValueError(f"case {case!r}: {key} value {bits_to_f64(bits).ravel()[i]!r} "
                         f"(element {i}) is not representable in {fmt}")


def _validate_case(case: CaptureCase, check_values: bool) -> None:
    meta = case.meta
    _validate_case_meta(meta)
    name, k = meta["name"], meta["k"]
    a, b, c, d = case.a, case.b, case.c, case.d
    if a is None or b is None or d is None:
        missing = [n for n, x in (("a", a), ("b", b), ("d", d)) if x is None]
        raise ValueError(f"case {name!r}: missing array(s) {missing}")
    if meta["kind"] == "dot":
        if a.ndim != 2:
            raise ValueError(f"case {name!r}: dot array 'a' must be 2-D (rows, K), got shape {a.shape}")
        rows = a.shape[0]
        if a.shape[1] != k:
            raise ValueError(f"case {name!r}: K mismatch: meta k={k} but 'a' has {a.shape[1]} columns")
        _check_array(name, "a", a, (rows, k))
        _check_array(name, "b", b, (rows, k))
        _check_array(name, "c", c, (rows,))
        _check_array(name, "d", d, (rows,))
        if case.tags is not None:
            if case.tags.shape != (rows,) or case.tags.dtype.kind != "U":
                raise ValueError(f"case {name!r}: tags must be a ({rows},) unicode array, "
                                 f"got {case.tags.dtype} {case.tags.shape}")
    else:
        if a.ndim != 2 or b.ndim != 2:
            raise ValueError(f"case {name!r}: matmul arrays a, b must be 2-D")
        m, n = a.shape[0], b.shape[1] if b.ndim == 2 else -1
        if a.shape[1] != k or b.shape[0] != k:
            raise ValueError(f"case {name!r}: K mismatch: meta k={k}, a {a.shape}, b {b.shape}")
        _check_array(name, "a", a, (m, k))
        _check_array(name, "b", b, (k, n))
        if c is not None:
            _check_array(name, "c", c, (m, n))
        _check_array(name, "d", d, (m, n))
    if c is None and meta["c_format"] is not None:
        raise ValueError(f"case {name!r}: c_format is {meta['c_format']!r} but there is no 'c'")
    if check_values:
        _check_values(name, "a", a, meta["inputs"])
        _check_values(name, "b", b, meta.get("inputs_b", meta["inputs"]))
        if c is not None and meta["c_format"] is not None:
            _check_values(name, "c", c, meta["c_format"])
        _check_values(name, "d", d, meta["output"])


# ---------------------------------------------------------------------------
# Reading and writing
# ---------------------------------------------------------------------------

def save_capture(capture: Capture, path) -> Path:
    """Validate and write ``capture`` to ``path`` atomically (temp file, then rename)."""
    capture.validate(check_values=True)
    path = Path(path)
    meta = capture.full_meta()
    arrays = {"meta": np.array(json.dumps(meta, sort_keys=True))}
    for case in capture.cases:
        if case.meta.get("same_inputs_as"):
            arrays[f"{case.name}/d"] = case.d
            continue
        for key in ("a", "b", "c", "d", "tags"):
            arr = getattr(case, key)
            if arr is not None:
                arrays[f"{case.name}/{key}"] = arr
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez_compressed(f, **arrays)
        os.chmod(tmp, 0o644)            # mkstemp makes 0600; a capture is ordinary data
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def load_capture(path, check_values: bool = True) -> Capture:
    """Read and validate a capture file; ValueError says what is wrong with it."""
    path = Path(path)
    try:
        npz = np.load(path, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise ValueError(f"{path}: not a readable .npz capture file ({e})") from e
    with npz:
        if "meta" not in npz.files:
            raise ValueError(f"{path}: no 'meta' entry; not an fpsim capture file")
        try:
            meta = json.loads(str(npz["meta"][()]))
        except (json.JSONDecodeError, ValueError) as e:
            raise ValueError(f"{path}: 'meta' is not valid JSON ({e})") from e
        _validate_meta(meta)
        files = set(npz.files)
        cases, by_name = [], {}
        for cmeta in meta["cases"]:
            if not isinstance(cmeta, dict):
                raise ValueError(f"{path}: a case meta is not an object: {cmeta!r}")
            _validate_case_meta(cmeta)
            name = cmeta["name"]
            if name in by_name:
                raise ValueError(f"{path}: duplicate case name {name!r}")

            def get(key, name=name):
                k = f"{name}/{key}"
                return npz[k] if k in files else None

            source = cmeta.get("same_inputs_as")
            if source:
                if source not in by_name:
                    raise ValueError(f"{path}: case {name!r} reuses inputs of {source!r}, "
                                     "which is not an earlier case")
                src = by_name[source]
                case = CaptureCase(dict(cmeta), src.a, src.b, src.c, get("d"), src.tags)
            else:
                case = CaptureCase(dict(cmeta), get("a"), get("b"), get("c"), get("d"), get("tags"))
            try:
                case.validate(check_values)
            except ValueError as e:
                raise ValueError(f"{path}: {e}") from None
            cases.append(case)
            by_name[name] = case
    top = {k: v for k, v in meta.items() if k != "cases"}
    return Capture(top, cases)


def merge_captures(first: Capture, *others: Capture) -> Capture:
    """One capture holding the cases and failures of all; the first's meta wins."""
    meta = dict(first.meta)
    meta["failures"] = list(first.meta.get("failures", []))
    cases = list(first.cases)
    for other in others:
        meta["failures"] += other.meta.get("failures", [])
        cases += other.cases
    return Capture(meta, cases)


def bundled_captures() -> dict:
    """Packaged capture files: lower-case GPU name -> path of its .npz."""
    from importlib import resources

    root = resources.files("fpsim") / "data" / "captures"
    out = {}
    try:
        entries = list(root.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return out
    for entry in entries:
        if entry.name.endswith(".npz"):
            out[entry.name[:-4]] = Path(str(entry))
    return dict(sorted(out.items()))


# ---------------------------------------------------------------------------
# The upstream text layout (MATLAB-tensor-core model_validation data)
# ---------------------------------------------------------------------------

UPSTREAM_FORMATS = {"fp16": "fp16", "bf16": "bf16", "tf32": "tf32", "e4m3": "e4m3", "e5m2": "e5m2"}


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
    inputs = UPSTREAM_FORMATS.get(fmt.lower())
    if inputs is None:
        raise ValueError(f"{folder}: unknown input format folder {fmt!r}; "
                         f"allowed: {sorted(UPSTREAM_FORMATS)} (any case)")

    def one(pattern):
        found = sorted(folder.glob(pattern))
        if len(found) != 1:
            raise ValueError(f"{folder}: expected one file matching {pattern!r}, found {len(found)}")
        return found[0]

    a = _read_hex_rows(one("a_*.txt"), rows)
    b = _read_hex_rows(one("b_*.txt"), rows)
    c = _read_bin_rows(one("c_*.txt"), rows)
    d = {}
    for out in ("fp32", "fp16"):
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
    with np.errstate(over="ignore"):
        return bits_to_f64(c_bits).astype(np.float16).astype(np.float32).view(np.uint32)


def fp8_path_from_sass(sass: str, kernel: str) -> str | None:
    """How an FP8 kernel reached the tensor cores, read from its SASS: "fp16" when it
    converts to binary16 and runs HMMA, "native" for QMMA/QGMMA, None if not found."""
    blocks = sass.split("Function : ")
    for block in blocks[1:]:
        name, _, body = block.partition("\n")
        if name.strip() != kernel:
            continue
        if "QMMA" in body or "QGMMA" in body:
            return "native"
        if "HMMA" in body or "HGMMA" in body:
            return "fp16"
    return None


def upstream_case_rules(gpu: str, inputs: str, output: str) -> dict:
    """How an upstream case used its c file (facts checked against the data).

    Returns {"c": "fp32" | "fp16" | "zero", "c_format": ..., "why": str}.
    """
    fp8 = inputs in ("e4m3", "e5m2")
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
    if inputs not in ("e4m3", "e5m2"):
        return None
    if gpu.upper() in ("H100", "H200", "B200") and output == "fp16":
        return "fp16"
    return "native"


def load_upstream_text(folder, rows: int | None = None, gpu_name: str | None = None) -> Capture:
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
                    compute_capability=UPSTREAM_CC.get(gpu.upper()),
                    source=f"upstream text files in {folder}")
    return Capture(meta, cases)


UPSTREAM_CC = {"V100": "7.0", "A100": "8.0", "L40S": "8.9", "H100": "9.0", "B200": "10.0"}


def _upstream_instruction(inputs: str, output: str, k: int) -> str:
    if inputs in ("e4m3", "e5m2"):
        acc = "f16" if output == "fp16" else "f32"
        return f"mma.sync.aligned.m16n8k32.row.col.{acc}.{inputs}.{inputs}.{acc}"
    return f"warp-level MMA (wmma or mma.sync), K={k} per instruction as recorded"


def describe(capture: Capture) -> str:
    """A short human-readable summary (one line per case)."""
    lines = [f"{capture.meta.get('gpu')} ({capture.meta.get('backend')}), "
             f"{len(capture.cases)} case(s), {len(capture.meta.get('failures', []))} failure(s)"]
    for c in capture.cases:
        m = c.meta
        lines.append(f"  {m['name']}: {m['kind']} {m['level']} {m['inputs']}->{m['output']} "
                     f"k={m['k']} rows={c.rows}")
    return "\n".join(lines)


def _main(argv=None) -> int:
    """``python -m fpsim.tensorcore.captures FILE...``: validate and summarise."""
    import sys

    paths = sys.argv[1:] if argv is None else argv
    status = 0
    for p in paths:
        try:
            cap = load_capture(p)
        except ValueError as e:
            print(f"{p}: INVALID: {e}")
            status = 1
            continue
        print(f"{p}: {describe(cap)}")
        for f in cap.meta.get("failures", []):
            print(f"  failure {f.get('case')}: {str(f.get('error')).splitlines()[0]}")
        for s in cap.meta.get("skipped", []):
            print(f"  skipped {s.get('case')}: {s.get('reason')}")
    return status


if __name__ == "__main__":
    raise SystemExit(_main())
