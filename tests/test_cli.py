"""The `fpsim` command: formats, cast, probes and the errors it gives."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import fpsim
from fpsim.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_formats_table_lists_every_preset_with_ml_dtypes_ranges(capsys):
    code, out, _ = run(capsys, "formats")
    assert code == 0
    rows = {line.split()[0]: line.split() for line in out.splitlines()[2:] if line and not line.startswith(("binades", "fnuz"))}
    for name, dtype in (("e4m3", ml_dtypes.float8_e4m3fn), ("e5m2", ml_dtypes.float8_e5m2),
                        ("bf16", ml_dtypes.bfloat16), ("e2m1", ml_dtypes.float4_e2m1fn)):
        info = ml_dtypes.finfo(dtype)
        assert float(rows[name][5]) == pytest.approx(float(info.max), rel=1e-7)
        assert float(rows[name][7]) == pytest.approx(float(info.smallest_subnormal), rel=1e-7)
    assert rows["fp16"][1] == "16" and rows["e8m0"][1] == "8"


@pytest.mark.parametrize("value,fmt,dtype", [("0.1", "e4m3", ml_dtypes.float8_e4m3fn), ("-3.3", "e5m2", ml_dtypes.float8_e5m2),
                                             ("0.1", "bf16", ml_dtypes.bfloat16)])
def test_cast_shows_the_bits_ml_dtypes_gives(capsys, value, fmt, dtype):
    code, out, _ = run(capsys, "cast", value, "--to", fmt)
    assert code == 0
    width = 8 if fmt != "bf16" else 16
    want = int(np.array([float(value)]).astype(dtype).view(f"uint{width}")[0])
    assert f"(0x{want:0{width // 4}x})" in out
    assert f"result      {float(np.array([float(value)]).astype(dtype).astype(np.float64)[0]):.8g}" in out


def test_cast_rounds_the_typed_decimal_exactly(capsys):
    """-431.99999999999994 is just above the e4m3 midpoint -432: the answer is -416 (not -448)."""
    code, out, _ = run(capsys, "cast", "-431.99999999999994", "--to", "e4m3")
    assert code == 0 and "result      -416" in out


def test_cast_modes_and_saturation(capsys):
    _, out, _ = run(capsys, "cast", "1000", "--to", "e4m3")
    assert "result      nan" in out
    _, out, _ = run(capsys, "cast", "1000", "--to", "e4m3", "--saturate")
    assert "result      448" in out
    _, out, _ = run(capsys, "cast", "1/3", "--to", "fp16", "--rounding", "up")
    assert f"result      {float(np.nextafter(np.float16(1 / 3), np.float16(1))):.8g}" in out


def test_errors_name_what_is_allowed(capsys):
    code, _, err = run(capsys, "cast", "x", "--to", "e4m3")
    assert code == 2 and "cannot read 'x' as a number" in err
    code, _, err = run(capsys, "cast", "1", "--to", "e9m9")
    assert code == 2 and "unknown format 'e9m9'; allowed: fp64" in err
    code, _, err = run(capsys, "cast", "1", "--to", "e4m3", "--rounding", "nearest")
    assert code == 2 and "allowed: nearest_even" in err


def test_console_script_runs():
    out = subprocess.run([sys.executable, "-m", "fpsim", "formats"], capture_output=True, text=True, check=True).stdout
    assert out.startswith("name")


@pytest.mark.parametrize("typed,fmt,result,bits", [
    ("1e999999", "fp16", "inf", "0x7c00"), ("-1e999999", "e4m3", "nan", "0xff"),
    ("1e999999", "e4m3", "nan", "0x7f"), ("1e-30000000", "fp16", "0", "0x0000"),
    ("12.5e-30000000", "e2m1", "0", "0x0"), ("0.000e5000000", "bf16", "0", "0x0000"),
])
def test_cast_of_magnitudes_beyond_every_format(capsys, typed, fmt, result, bits):
    """Expected: IEEE 754 / OCP overflow and underflow rules (beyond max: Inf, NaN for E4M3FN;
    below half the smallest subnormal: 0)."""
    assert main(["cast", typed, "--to", fmt]) == 0
    out = capsys.readouterr().out
    assert f"result      {result}\n" in out and f"({bits})" in out
    if typed.strip("-") != "0.000e5000000":
        assert "rounded as 2^" in out  # the stand-in is said


def test_cast_up_from_a_tiny_magnitude_is_the_smallest_subnormal(capsys):
    assert main(["cast", "1e-30000000", "--to", "fp16", "--rounding", "up"]) == 0
    assert "result      5.9604645e-08\n" in capsys.readouterr().out  # 2^-24


def test_version(capsys):
    import fpsim

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"fpsim {fpsim.__version__} (distribution fpsim-mixed-precision)"


def test_formats_json_gives_every_preset_with_ml_dtypes_ranges(capsys):
    import json

    assert main(["formats", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert set(rows) >= {"fp16", "bf16", "e4m3", "e5m2", "e2m1", "e8m0", "e3m4"}
    for name, dtype in (("e4m3", ml_dtypes.float8_e4m3fn), ("bf16", ml_dtypes.bfloat16), ("e3m4", ml_dtypes.float8_e3m4)):
        info = ml_dtypes.finfo(dtype)
        assert rows[name]["max"] == float(info.max)
        assert rows[name]["min_subnormal"] == float(info.smallest_subnormal)
    assert rows["e4m3"]["exact"]["min_subnormal"] == "1/512" and "float8_e4m3fn" in rows["e4m3"]["aliases"]


def test_formats_lists_the_block_formats_as_their_specs_define_them(capsys):
    # expected: exact_blocks.SPEC_PRESETS (the oracle's restatement of OCP MX v1.0, NVIDIA's NVFP4 and
    # DeepSeek-V3) and the storage those sources state: 8.25 bits per MXFP8 element (8 + 8/32),
    # 4.5 per NVFP4 element (4 + 8/16)
    import json

    from fpsim.exact_blocks import SPEC_PRESETS

    code, out, _ = run(capsys, "formats")
    assert code == 0
    table = out[out.index("Block formats"):]
    rows = {line.split()[0]: line.split() for line in table.splitlines()[3:] if line.strip() and line[0] != " "}
    for name, (element, scale, block, rule, tensor, _floor) in SPEC_PRESETS.items():
        assert rows[name][1:6] == [element, scale, "x".join(map(str, block)), rule, tensor or "-"], name
    assert rows["mxfp8_e4m3"][6] == "8.25" and rows["nvfp4"][6] == "4.5" and rows["mxfp4"][6] == "4.25"
    assert "  rceil " in table and "cvt.rp.satfinite.ue8m0" in table

    assert main(["formats", "--json"]) == 0
    blocks = {row["name"]: row for row in json.loads(capsys.readouterr().out) if row["kind"] == "block"}
    assert set(blocks) == set(SPEC_PRESETS)
    for name, (element, scale, block, rule, tensor, _floor) in SPEC_PRESETS.items():
        row = blocks[name]
        assert (row["element"], row["scale"], tuple(row["block_size"]), row["scale_rule"], row["tensor_scale"]) == (
            element, scale, block, rule, tensor)
    assert blocks["nvfp4"]["bits_per_element"] == 4.5 and blocks["mxint8"]["element_max"] == 127 / 64
    assert blocks["fp8_block_128x128"]["bits_per_element"] == 8 + 32 / 128**2


def test_cast_json_gives_ml_dtypes_bits(capsys):
    import json

    assert main(["cast", "0.1", "-1000", "--to", "e4m3,bf16", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["input"], r["format"]) for r in rows] == [("0.1", "e4m3"), ("0.1", "bf16"), ("-1000", "e4m3"),
                                                         ("-1000", "bf16")]
    for row, dtype in zip(rows, (ml_dtypes.float8_e4m3fn, ml_dtypes.bfloat16) * 2):
        cast = np.array([float(row["input"])]).astype(dtype)
        want = int(cast.view(np.uint8 if cast.itemsize == 1 else np.uint16)[0])
        assert row["code"] == want
    assert rows[2]["result"] == "nan" and rows[0]["result"] == 0.1015625
    assert rows[0]["neighbours"] == [0.09375, 0.1015625] and rows[0]["rel_error"] == 0.015625


def test_study_list_json(capsys):
    import json

    from fpsim import studies

    assert main(["study", "--list", "--json"]) == 0
    assert [row["name"] for row in json.loads(capsys.readouterr().out)] == list(studies.STUDIES)


@pytest.mark.parametrize("argv,message", [
    (["demo", "--formats", ""], "--formats needs at least one format name"),
    (["demo", "--formats", " , "], "--formats needs at least one format name"),
    (["demo", "--steps", "0"], "--steps: must be at least 1, got 0"),
    (["demo", "--every", "-1"], "--every: must be at least 1"),
    (["analyze", "--demo", "--threads", "x"], "--threads: 'x' is not an integer"),
])
def test_demo_and_analyze_refuse_bad_options_alike(capsys, argv, message):
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    assert code == 2
    assert message in capsys.readouterr().err


def test_progress_appends_lines_to_a_log_file_and_rewrites_one_on_a_terminal():
    import io

    from fpsim.cli.analyze import _Progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    log = io.StringIO()
    progress = _Progress("demo", 1000, stream=log)
    for step in range(1, 1001):
        progress(step)
    progress.done()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and 1 <= len(lines) <= 3  # the first and the last step (and 10 s apart)
    assert lines[-1].startswith("fpsim demo: step 1000/1000")
    tty = Terminal()
    progress = _Progress("demo", 10, stream=tty)
    progress(1)
    assert tty.getvalue().startswith("\rfpsim demo: step 1/10") and "ETA" in tty.getvalue()
    quiet = io.StringIO()
    progress = _Progress("demo", 10, stream=quiet, quiet=True)
    progress(5)
    progress.done()
    assert quiet.getvalue() == ""


def _strict_json(text: str):
    """json.loads refusing NaN and Infinity, the tokens RFC 8259 lacks (json.dumps writes them by default)."""
    def refuse(token):
        raise AssertionError(f"{token} in --json output: not JSON (RFC 8259)")
    return json.loads(text, parse_constant=refuse)


def test_cast_beyond_float64_range_prints_and_writes_strict_json(capsys):
    """Expected values from fractions: the fp64 neighbours of 1.7976931348623158e308 are float max and
    2^1024 (beyond float64: "inf" in JSON, as README says; its digits in the text, from decimal);
    1e-320 rounded up in fp16 is 2^-24 (IEEE 754 roundTowardPositive), a relative error near 6e312."""
    from decimal import Decimal, localcontext

    typed = Fraction("1.7976931348623158e308")
    code, out, _ = run(capsys, "cast", "1.7976931348623158e308", "--to", "fp64")
    assert code == 0
    assert f"neighbours  {sys.float_info.max:.8g} < 1.7976931348623158e308 < {Decimal(2**1024):.8g} (beyond max)" in out
    assert f"rel. error  {float((Fraction(sys.float_info.max) - typed) / typed):+.4e}" in out
    code, out, _ = run(capsys, "cast", "1.7976931348623158e308", "--to", "fp64", "--json")
    assert code == 0 and _strict_json(out)[0]["neighbours"] == [sys.float_info.max, "inf"]

    with localcontext() as context:
        context.prec = 50
        rel_error = Decimal(2) ** -24 / Decimal("1e-320") - 1
    code, out, _ = run(capsys, "cast", "1e-320", "--to", "fp16", "--rounding", "up")
    assert code == 0 and f"result      {2**-24:.8g}" in out and f"rel. error  {rel_error:+.4e}" in out
    code, out, _ = run(capsys, "cast", "1e-320", "--to", "fp16", "--rounding", "up", "--json")
    assert code == 0 and _strict_json(out)[0]["rel_error"] == "inf"

    code, out, _ = run(capsys, "cast", "1e320", "-1e320", "--to", "fp16", "--json")
    rows = _strict_json(out)
    assert code == 0 and [row["result"] for row in rows] == ["inf", "-inf"]  # fp16 overflows to Inf
    assert rows[0]["neighbours"] == ["inf", "inf"] and rows[1]["neighbours"] == ["-inf", "-inf"]


@pytest.mark.parametrize("typed", ["-0", "-0.0", "-0.00", "-0e0", "-.0", "-0.0e-5", "-000", "0.0", "+0e3"])
def test_cast_keeps_the_sign_of_zero_as_float_reads_it(capsys, typed):
    """Expected: float(typed) cast by ml_dtypes (its sign bit is the code's)."""
    want = int(np.array([float(typed)]).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)[0])
    code, out, _ = run(capsys, "cast", "--to", "e4m3", "--json", "--", typed)
    row = _strict_json(out)[0]
    assert code == 0 and row["code"] == want
    assert math.copysign(1, row["result"]) == math.copysign(1, float(typed))


@pytest.mark.parametrize("typed", ["+infinity", "+Infinity", "-INFINITY", "infinity", "+inf", "-Inf", "iNf"])
def test_cast_reads_infinities_as_float_does(capsys, typed):
    """Expected: float(typed) cast to fp16 by numpy."""
    want = int(np.array([float(typed)], dtype=np.float16).view(np.uint16)[0])
    code, out, _ = run(capsys, "cast", "--to", "fp16", "--json", "--", typed)
    assert code == 0 and _strict_json(out)[0]["code"] == want


def test_cast_reads_a_decimal_longer_than_pythons_int_digit_limit(capsys):
    """1.00048828125 is 1 + 2^-11, the fp16 midpoint between 1 and 1 + 2^-10; a 1 in the 4413th digit puts
    the typed value just above it, so round to nearest gives 1 + 2^-10 (IEEE 754), 0x3c01 by numpy."""
    typed = "1.00048828125" + "0" * 4400 + "1"
    assert len(typed) > sys.int_info.default_max_str_digits
    code, out, _ = run(capsys, "cast", typed, "--to", "fp16")
    assert code == 0, out
    want = int(np.array([1 + 2**-10], dtype=np.float16).view(np.uint16)[0])
    assert f"result      {1 + 2**-10:.8g}" in out and f"(0x{want:04x})" in out
    code, _, err = run(capsys, "cast", "1" * 100_001, "--to", "fp16")
    assert code == 2 and "too long: numbers of at most 100000 characters are read" in err
    assert len(err) < 300  # the number is not echoed whole


@pytest.mark.parametrize("argv,script_args", [
    (["SCRIPT", "--", "a", "--", "b"], ["a", "--", "b"]),
    (["SCRIPT", "--", "--", "x"], ["--", "x"]),
    (["SCRIPT", "--steps", "3", "--", "a", "--", "b"], ["a", "--", "b"]),
    (["--steps", "3", "SCRIPT", "--", "--lr", "1"], ["--lr", "1"]),
    (["SCRIPT", "--lr", "1"], ["--lr", "1"]),
])
def test_analyze_passes_everything_after_the_first_double_dash_to_the_script(tmp_path, argv, script_args):
    """docs/analyzer.md: the script's arguments follow `--` (fpsim's options before the script or between it
    and `--`; without `--` all go to the script), and sys.argv is what `python SCRIPT ARGS` sets: python keeps
    a later `--`, which the expected lists restate."""
    script = tmp_path / "argv.py"
    record = tmp_path / "argv.json"
    script.write_text(f"import json, sys\njson.dump(sys.argv[1:], open({str(record)!r}, 'w'))\nsys.exit(0)\n")
    argv = [str(script) if arg == "SCRIPT" else arg for arg in argv]
    main(["analyze", "--out", str(tmp_path / "report"), "-q", *argv])  # exit 1: the script trains nothing
    assert json.loads(record.read_text()) == script_args
    subprocess.run([sys.executable, str(script), *script_args], check=True)
    assert json.loads(record.read_text()) == script_args


def test_cast_to_an_unsigned_format_shows_no_negative_neighbours(capsys):
    """e8m0 and e5m3fnu hold no negative value: -3 rounds to their NaN (as ml_dtypes casts it), and its
    neighbours were shown as -4 < -3 < -2 or '-3 is exactly representable'."""
    out = run(capsys, "cast", "--to", "e8m0", "--", "-3")[1]
    assert np.isnan(float(ml_dtypes.float8_e8m0fnu(-3.0)))
    assert f"bits        11111111  (0x{np.array(np.nan, dtype=ml_dtypes.float8_e8m0fnu).view(np.uint8):02x})" in out
    assert "neighbours  none: e8m0 has no negative values" in out and "-4" not in out
    facts = json.loads(run(capsys, "cast", "--json", "--to", "e5m3fnu", "--", "-3")[1])[0]
    assert facts["result"] == "nan" and facts["neighbours"] is None


def test_cast_of_nan_to_a_format_without_nan_says_there_is_none(capsys):
    """quantize refuses NaN for e2m1 (no NaN code); cast printed 'result nan' as if it were a value."""
    with pytest.raises(ValueError, match="e2m1 has no NaN"):
        fpsim.quantize(np.float32(np.nan), "e2m1")
    assert "result      none: e2m1 has no NaN" in run(capsys, "cast", "--to", "e2m1", "nan")[1]
    facts = json.loads(run(capsys, "cast", "--json", "--to", "e2m1", "nan")[1])[0]
    assert facts["result"] is None and facts["code"] is None and facts["note"] == "e2m1 has no NaN"


def test_study_refuses_bad_names_and_a_file_for_out_before_running(capsys, tmp_path):
    """A file given as --out raised NotADirectoryError mid-study (exit 1); 'all' beside other names was
    refused by a message that listed it as allowed; a bad name with --list was ignored (exit 0)."""
    target = tmp_path / "afile"
    target.write_text("")
    code, _, err = run(capsys, "study", "format_ranges", "--fast", "--out", str(target))
    assert code == 2 and "is an existing file, not a folder" in err
    code, _, err = run(capsys, "study", "all", "format_ranges")
    assert code == 2 and "unknown study 'all' beside other names" in err and "or all alone" in err
    code, _, err = run(capsys, "study", "bogus", "--list")
    assert code == 2 and "unknown study 'bogus'" in err
