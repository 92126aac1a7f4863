"""The capture schema: round trips, atomic writes, clear errors, bundled data.

Expected values come from the upstream text files themselves (read here with
plain int() parsing, not with the code under test) and from numpy and
ml_dtypes casts (IEEE conversions, NaN payloads included).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fpsim.tensorcore import captures as cap
from fpsim.tensorcore.captures import (Capture, CaptureCase, bundled_captures, f32_bits,
                                       is_representable, load_capture, new_meta, save_capture,
                                       widen_to_f32_bits)
from fpsim.tensorcore.upstream import load_upstream_text

REPO = Path(__file__).resolve().parents[2]
SHARED_CANDIDATES = (REPO.parent / "shared" / "gpu-captures", Path("/work/shared/gpu-captures"))
SHARED = next((p for p in SHARED_CANDIDATES if p.is_dir()), None)
needs_shared = pytest.mark.skipif(SHARED is None, reason="shared/gpu-captures is not present")

GPUS = ("a100", "b200", "h100", "l40s", "v100")


# ------------------------------------------------------------------ helpers
def dot_case(name="dot1", rows=5, k=4, inputs="fp16", c_format="fp32", output="fp32"):
    rng = np.random.default_rng(1)
    a = rng.integers(-8, 9, (rows, k)).astype(np.float64)
    b = rng.integers(-8, 9, (rows, k)).astype(np.float64) / 4
    c = rng.integers(-8, 9, rows).astype(np.float64)
    d = (a * b).sum(1) + c
    meta = {"name": name, "kind": "dot", "level": "instruction", "inputs": inputs,
            "c_format": c_format, "output": output, "k": k,
            "instruction": "mma.sync.aligned.m16n8k4.row.col.f32.tf32.tf32.f32",
            "flags": {}, "notes": "test"}
    tags = np.array([f"probe:test:row={i}" for i in range(rows)])
    return CaptureCase(meta, f32_bits(a), f32_bits(b), f32_bits(c), f32_bits(d), tags)


def matmul_case(name="mm1", m=3, k=5, n=2, same_as=None):
    rng = np.random.default_rng(2)
    a = rng.integers(-4, 5, (m, k)).astype(np.float64)
    b = rng.integers(-4, 5, (k, n)).astype(np.float64)
    meta = {"name": name, "kind": "matmul", "level": "library", "inputs": "bf16",
            "c_format": None, "output": "bf16", "k": k, "instruction": "torch.matmul",
            "flags": {"allow_bf16_reduced_precision_reduction": True}, "notes": ""}
    if same_as:
        meta["same_inputs_as"] = same_as
    return CaptureCase(meta, f32_bits(a), f32_bits(b), None, f32_bits(a @ b))


def small_capture():
    return Capture(new_meta("NVIDIA Test", backend="test", seed=3),
                   [dot_case(), matmul_case(), matmul_case("mm2", same_as="mm1")])


def rewrite(path: Path, out: Path, meta_fn=None, drop=(), replace=None):
    """Copy a capture file, editing its meta and arrays, without the code under test."""
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(str(arrays["meta"][()]))
    if meta_fn:
        meta_fn(meta)
    arrays["meta"] = np.array(json.dumps(meta))
    for key in drop:
        del arrays[key]
    for key, value in (replace or {}).items():
        arrays[key] = value
    np.savez_compressed(out, **arrays)
    return out


# ----------------------------------------------------------- round trips
def test_round_trip(tmp_path):
    capture = small_capture()
    path = save_capture(capture, tmp_path / "x.npz")
    back = load_capture(path)
    assert back.names == ["dot1", "mm1", "mm2"]
    assert back.meta["gpu"] == "NVIDIA Test" and back.meta["schema"] == cap.SCHEMA
    for want, got in zip(capture.cases, back.cases):
        assert got.meta == want.meta
        for key in ("a", "b", "c", "d", "tags"):
            w, g = getattr(want, key), getattr(got, key)
            assert (w is None) == (g is None)
            if w is not None:
                assert np.array_equal(w, g) and g.dtype == w.dtype
    dot = back.case("dot1")
    np.testing.assert_array_equal(dot.d_values, (dot.a_values * dot.b_values).sum(1) + dot.c_values)
    assert dot.rows == 5 and dot.k == 4


def test_file_is_plain_npz_with_json_meta(tmp_path):
    path = save_capture(small_capture(), tmp_path / "x.npz")
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(str(z["meta"][()]))
        assert z["meta"].ndim == 0 and z["meta"].dtype.kind == "U"
        assert "mm2/a" not in z.files and "mm2/d" in z.files      # reused inputs stored once
        assert z["dot1/a"].dtype == np.uint32
    assert [c["name"] for c in meta["cases"]] == ["dot1", "mm1", "mm2"]
    assert meta["failures"] == []


def test_same_inputs_as_shares_arrays(tmp_path):
    back = load_capture(save_capture(small_capture(), tmp_path / "x.npz"))
    assert np.array_equal(back.case("mm2").a, back.case("mm1").a)
    assert back.case("mm2").meta["same_inputs_as"] == "mm1"


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path):
    path = tmp_path / "x.npz"
    path.write_bytes(b"old")
    save_capture(small_capture(), path)
    assert load_capture(path).names == ["dot1", "mm1", "mm2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.npz"]


def test_failed_save_keeps_old_file(tmp_path):
    path = save_capture(small_capture(), tmp_path / "x.npz")
    before = path.read_bytes()
    bad = small_capture()
    bad.cases[0].meta["k"] = 7                       # K mismatch: refused before writing
    with pytest.raises(ValueError, match="K mismatch"):
        save_capture(bad, path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.npz"]


# ------------------------------------------------------------------ errors
@pytest.fixture
def good_file(tmp_path):
    return save_capture(small_capture(), tmp_path / "good.npz")


def test_unknown_schema(good_file, tmp_path):
    bad = rewrite(good_file, tmp_path / "bad.npz", lambda m: m.update(schema="fpsim-capture/9"))
    with pytest.raises(ValueError, match="unknown capture schema 'fpsim-capture/9'"):
        load_capture(bad)


def test_missing_array(good_file, tmp_path):
    bad = rewrite(good_file, tmp_path / "bad.npz", drop=["dot1/c"])
    with pytest.raises(ValueError, match="case 'dot1': missing array 'c'"):
        load_capture(bad)


def test_wrong_dtype(good_file, tmp_path):
    with np.load(good_file) as z:
        d = z["dot1/d"].astype(np.int64)
    bad = rewrite(good_file, tmp_path / "bad.npz", replace={"dot1/d": d})
    with pytest.raises(ValueError, match="dtype int64"):
        load_capture(bad)


def test_wrong_shape(good_file, tmp_path):
    with np.load(good_file) as z:
        d = z["dot1/d"][:-1]
    bad = rewrite(good_file, tmp_path / "bad.npz", replace={"dot1/d": d})
    with pytest.raises(ValueError, match=r"'d' has shape \(4,\), expected \(5,\)"):
        load_capture(bad)


def test_k_mismatch(good_file, tmp_path):
    def edit(meta):
        meta["cases"][0]["k"] = 8
    bad = rewrite(good_file, tmp_path / "bad.npz", edit)
    with pytest.raises(ValueError, match="K mismatch: meta k=8 but 'a' has 4 columns"):
        load_capture(bad)


def test_bad_enum_names_allowed_values(good_file, tmp_path):
    def edit(meta):
        meta["cases"][0]["inputs"] = "fp12"
    bad = rewrite(good_file, tmp_path / "bad.npz", edit)
    with pytest.raises(ValueError, match="inputs 'fp12' is not one of"):
        load_capture(bad)


def test_value_not_representable(good_file, tmp_path):
    with np.load(good_file) as z:
        a = z["dot1/a"].copy()
    a[0, 0] = np.float32(1 + 2**-20).view(np.uint32)        # not an fp16 value
    bad = rewrite(good_file, tmp_path / "bad.npz", replace={"dot1/a": a})
    with pytest.raises(ValueError, match="not representable in fp16"):
        load_capture(bad)


def test_not_a_capture(tmp_path):
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"this is not a zip file")
    with pytest.raises(ValueError, match="not a readable .npz"):
        load_capture(junk)
    np.savez(tmp_path / "nometa.npz", x=np.zeros(3))
    with pytest.raises(ValueError, match="no 'meta' entry"):
        load_capture(tmp_path / "nometa.npz")


def test_duplicate_names_refused(tmp_path):
    capture = Capture(new_meta("x"), [dot_case("same"), dot_case("same")])
    with pytest.raises(ValueError, match="duplicate case name 'same'"):
        save_capture(capture, tmp_path / "x.npz")


def test_is_representable_against_casts():
    x = np.array([1.0, 1 + 2**-10, 1 + 2**-11, 65504.0, 65520.0, np.inf, np.nan, 2.0**-24, 2.0**-25,
                  448.0, 480.0, 2.0**-9, 57344.0, 1 + 2**-7, 1 + 2**-8])
    for fmt in ("fp16", "bf16", "e4m3", "e5m2"):
        import ml_dtypes
        dt = {"fp16": np.float16, "bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn,
              "e5m2": ml_dtypes.float8_e5m2}[fmt]
        with np.errstate(over="ignore"):
            y = x.astype(dt).astype(np.float64)
        want = (y == x) | (np.isnan(x) & np.isnan(y))
        assert list(is_representable(x, fmt)) == list(want), fmt
    assert not is_representable(np.array([np.inf]), "e4m3")[0]     # E4M3FN has no Inf
    tf = np.array([1 + 2**-10, 1 + 2**-11, 2.0**-136, 2.0**-137])
    assert list(is_representable(tf, "tf32")) == [True, False, True, False]


def test_widening_keeps_every_bit_as_an_ieee_conversion_does():
    """fp16 -> binary32 as numpy converts (NaN payloads move up 13 bits); bf16 is binary32's top half."""
    codes = np.arange(2**16, dtype=np.uint32)
    want16 = codes.astype(np.uint16).view(np.float16).astype(np.float32).view(np.uint32)
    assert np.array_equal(widen_to_f32_bits(codes, "fp16"), want16)
    assert np.array_equal(widen_to_f32_bits(codes, "bf16"), codes << np.uint32(16))
    bits = np.array([0x7FC00001, 0xFF800000, 0x00000001, 0x80000000], dtype=np.uint32)
    assert np.array_equal(widen_to_f32_bits(bits, "fp32"), bits)


# ----------------------------------------------------------- bundled data
def test_bundled_captures_present_and_valid():
    found = bundled_captures()
    assert set(found) == set(GPUS) | {"h200"}
    own = load_capture(found.pop("h200"))       # fpsim's own capture: see H200.md
    assert own.meta["gpu"] == "NVIDIA H200" and own.meta["compute_capability"] == "9.0"
    assert not own.meta["failures"] and len(own.cases) == 79
    for name, path in found.items():
        capture = load_capture(path)              # full validation, values included
        assert capture.meta["gpu"] == f"NVIDIA {name.upper()}"
        assert "10.1145/3830409" in capture.meta["source"]
        assert "BSD 2-Clause" in capture.meta["licence"]
        for case in capture.cases:
            assert case.rows == 2500 and case.kind == "dot"
    licence = Path(next(iter(found.values()))).parent / "LICENCE-upstream.txt"
    assert "Khattak" in licence.read_text()


EXPECTED_K = {("a100", "fp16"): 8, ("a100", "bf16"): 8, ("a100", "tf32"): 4,
              ("b200", "fp16"): 16, ("b200", "e4m3"): 32, ("h100", "bf16"): 16,
              ("h100", "tf32"): 4, ("h100", "e5m2"): 32, ("l40s", "fp16"): 8,
              ("l40s", "e4m3"): 32, ("v100", "fp16"): 4}


def test_bundled_k_per_case():
    found = bundled_captures()
    for (gpu, fmt), k in EXPECTED_K.items():
        capture = load_capture(found[gpu])
        ks = {c.k for c in capture.cases if c.meta["inputs"] == fmt}
        assert ks == {k}, (gpu, fmt, ks)


def test_bundled_c_rules():
    h100 = load_capture(bundled_captures()["h100"])
    for name in ("e4m3_fp32", "e5m2_fp32"):
        assert not h100.case(name).c.any(), "H100 FP8 fp32 cases store c = 0"
        assert "c = 0" in h100.case(name).meta["notes"]
    for name in ("fp16_fp16", "e4m3_fp16"):
        case = h100.case(name)
        assert case.meta["c_format"] == "fp16"
        assert is_representable(case.c_values, "fp16").all()
    assert "not certain" in h100.case("e4m3_fp16").meta["notes"]
    l40s = load_capture(bundled_captures()["l40s"])
    assert l40s.case("e4m3_fp32").c.any(), "L40S FP8 used c"


def _hex_rows(path):
    return np.array([[int(t, 16) for t in line.split()] for line in open(path) if line.strip()],
                    dtype=np.uint32)


def _bin_rows(path):
    return np.array([int(line.strip(), 2) for line in open(path) if line.strip()], dtype=np.uint32)


@needs_shared
def test_bundled_match_text_files():
    found = bundled_captures()
    for gpu_dir in sorted(d for d in SHARED.iterdir() if d.is_dir()):
        capture = load_capture(found[gpu_dir.name.lower()])
        for fmt_dir in sorted(d for d in gpu_dir.iterdir() if d.is_dir()):
            a = _hex_rows(next(fmt_dir.glob("a_*.txt")))
            b = _hex_rows(next(fmt_dir.glob("b_*.txt")))
            c = _bin_rows(next(fmt_dir.glob("c_*.txt")))
            for out in ("fp32", "fp16"):
                dfile = fmt_dir / f"d_{gpu_dir.name}_{out}.txt"
                if not dfile.exists():
                    continue
                case = capture.case(f"{fmt_dir.name.lower()}_{out}")
                assert case.a.shape == a.shape and case.k == a.shape[1]
                assert np.array_equal(case.a, a) and np.array_equal(case.b, b)
                assert np.array_equal(case.d, _bin_rows(dfile))
                if case.meta["c_format"] == "fp16":
                    want = c.view(np.float32).astype(np.float16).astype(np.float32).view(np.uint32)
                    assert np.array_equal(case.c, want)
                elif case.c.any():
                    assert np.array_equal(case.c, c)


@needs_shared
def test_load_upstream_text_folder():
    capture = load_upstream_text(SHARED / "V100", rows=100)
    assert capture.names == ["fp16_fp32", "fp16_fp16"]
    assert all(c.rows == 100 and c.k == 4 for c in capture.cases)
    one = load_upstream_text(SHARED / "H100" / "E4M3", rows=10)
    assert one.names == ["e4m3_fp32", "e4m3_fp16"]


def test_load_upstream_text_errors(tmp_path):
    with pytest.raises(ValueError, match="no upstream case folders"):
        load_upstream_text(tmp_path)
    d = tmp_path / "X100" / "fp16"
    d.mkdir(parents=True)
    (d / "a_X100_fp16.txt").write_text("3c000000 3c000000\n")
    (d / "b_X100_fp16.txt").write_text("3c000000 3c000000\n")
    (d / "c_X100_fp32.txt").write_text("0" * 32 + "\n")
    with pytest.raises(ValueError, match="no d_X100_fp32.txt"):
        load_upstream_text(tmp_path / "X100")
    (d / "d_X100_fp32.txt").write_text("01000000000000000000000000000000\n")
    capture = load_upstream_text(tmp_path / "X100")
    assert capture.case("fp16_fp32").d_values[0] == 2.0
    (d / "c_X100_fp32.txt").write_text("012\n")
    with pytest.raises(ValueError, match="not a 32-bit binary string"):
        load_upstream_text(tmp_path / "X100")
