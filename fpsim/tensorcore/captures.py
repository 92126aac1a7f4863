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

Block-scaled inputs (``inputs`` a block format such as ``mxfp8_e4m3``) hold
element values in a and b and their block scales' values in ``NAME/scale_a``
(M, K / block) and ``NAME/scale_b`` (K / block, N): D = (A * scale_A)(B *
scale_B) + C, as the block-scaled GEMMs compute it.

Every value is stored as the uint32 bit pattern of its binary32 value: inputs
are exactly representable in binary32, and fp16/bf16 values (c, d) are widened
exactly. :func:`load_capture` checks all of this and says what is wrong.
"""

from __future__ import annotations

import datetime
import json
import os
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..blocks import BlockFormat, format as get_any_format
from ..codec import decode
from ..formats import PRESETS, format as get_format
from ..rounding import quantize
from . import devices

SCHEMA = "fpsim-capture/1"
KINDS = ("dot", "matmul")
LEVELS = ("instruction", "library")
VALUE_FORMATS = tuple(name for name, fmt in PRESETS.items() if PRESETS["fp32"].contains(fmt))
"""The formats c and d may be in: those binary32 holds (the file stores binary32 bit patterns)."""
CASE_KEYS = ("name", "kind", "level", "inputs", "c_format", "output", "k",
             "instruction", "flags", "notes")
META_KEYS = ("schema", "gpu", "cases")


# ---------------------------------------------------------------------------
# Values and their binary32 bit patterns
# ---------------------------------------------------------------------------

def is_representable(values, fmt) -> np.ndarray:
    """Elementwise: is each float64 value exactly a value of ``fmt`` (NaN where it has one)?"""
    x = np.asarray(values, dtype=np.float64)
    rounded = quantize(x, fmt)
    return (rounded == x) | (np.isnan(rounded) & np.isnan(x))


def f32_bits(values) -> np.ndarray:
    """uint32 binary32 bit patterns of float64 values that binary32 holds exactly."""
    x = np.asarray(values, dtype=np.float64)
    bad = ~is_representable(x, "fp32")
    if bad.any():
        raise ValueError(f"{int(bad.sum())} value(s) not exactly representable in "
                         f"binary32, first {x[bad].flat[0]!r}")
    return x.astype(np.float32).view(np.uint32)


def bits_to_f64(bits) -> np.ndarray:
    """float64 values of uint32 binary32 bit patterns (exact)."""
    return np.asarray(bits, dtype=np.uint32).view(np.float32).astype(np.float64)


def widen_to_f32_bits(codes, fmt) -> np.ndarray:
    """Codes of an IEEE-layout format that binary32 holds (fp16, bf16, fp32) -> the binary32 bit
    patterns of the same values. A NaN keeps its sign and payload (moved to the top of binary32's
    mantissa, as a hardware conversion does): the file holds what the GPU returned."""
    fmt, fp32 = get_format(fmt), PRESETS["fp32"]
    codes = np.asarray(codes).astype(np.uint32)
    bits = decode(codes, fmt).astype(np.float32).view(np.uint32)
    exponent = (codes >> np.uint32(fmt.man_bits)) & np.uint32((1 << fmt.exp_bits) - 1)
    mantissa = codes & np.uint32((1 << fmt.man_bits) - 1)
    nan = (exponent == (1 << fmt.exp_bits) - 1) & (mantissa != 0)
    sign = (codes >> np.uint32(fmt.bits - 1)) << np.uint32(31)
    payload = sign | np.uint32(((1 << fp32.exp_bits) - 1) << fp32.man_bits) | (mantissa << np.uint32(fp32.man_bits - fmt.man_bits))
    return np.where(nan, payload, bits).astype(np.uint32)


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
    scale_a: np.ndarray | None = None
    scale_b: np.ndarray | None = None

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

    @property
    def scales(self) -> dict:
        """The block scales' values as TensorCore.matmul takes them ({} for unscaled inputs)."""
        if self.scale_a is None:
            return {}
        return {"scale_a": bits_to_f64(self.scale_a), "scale_b": bits_to_f64(self.scale_b)}

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
    _check_choice(name, "inputs", meta["inputs"], devices.INPUT_FORMATS)
    if "inputs_b" in meta:
        _check_choice(name, "inputs_b", meta["inputs_b"], devices.INPUT_FORMATS)
    _check_choice(name, "c_format", meta["c_format"], VALUE_FORMATS + (None,))
    _check_choice(name, "output", meta["output"], VALUE_FORMATS)
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
        raise ValueError(f"case {case!r}: {key} value {float(bits_to_f64(bits).ravel()[i])!r} "
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
    fa, fb = (get_any_format(meta.get(key, meta["inputs"])) for key in ("inputs", "inputs_b"))
    if isinstance(fa, BlockFormat):
        _check_scale_arrays(case, fa, fb)
        fa, fb = fa.element, fb.element
    elif case.scale_a is not None or case.scale_b is not None:
        raise ValueError(f"case {name!r}: scale_a/scale_b belong to block formats; its inputs are {meta['inputs']}")
    if check_values:
        _check_values(name, "a", a, fa)
        _check_values(name, "b", b, fb)
        if c is not None and meta["c_format"] is not None:
            _check_values(name, "c", c, meta["c_format"])
        _check_values(name, "d", d, meta["output"])


def _check_scale_arrays(case: CaptureCase, fa: BlockFormat, fb: BlockFormat) -> None:
    """scale_a and scale_b of a block-scaled case: one scale per block of K, values of the scale format."""
    name, k = case.name, case.k
    for fmt in (fa, fb):
        if k % fmt.block_size:
            raise ValueError(f"case {name!r}: k={k} is not a multiple of {fmt.name}'s block of {fmt.block_size}")
    ka, kb = k // fa.block_size, k // fb.block_size
    rows = case.a.shape[0]
    if case.kind == "dot":
        shape_a, shape_b = (rows, ka), (rows, kb)
    else:
        shape_a, shape_b = (rows, ka), (kb, case.b.shape[1])
    _check_array(name, "scale_a", case.scale_a, shape_a)
    _check_array(name, "scale_b", case.scale_b, shape_b)
    _check_values(name, "scale_a", case.scale_a, fa.scale)
    _check_values(name, "scale_b", case.scale_b, fb.scale)


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
        for key in ("a", "b", "c", "d", "tags", "scale_a", "scale_b"):
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
                case = CaptureCase(dict(cmeta), src.a, src.b, src.c, get("d"), src.tags, src.scale_a, src.scale_b)
            else:
                case = CaptureCase(dict(cmeta), get("a"), get("b"), get("c"), get("d"), get("tags"),
                                   get("scale_a"), get("scale_b"))
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
