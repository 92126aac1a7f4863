"""The `fpsim` command: formats, cast, probes and the errors it gives."""

from __future__ import annotations

import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

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
