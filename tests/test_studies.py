"""Studies: each runs in fast mode from one command, writes its page and PNG figures, and finds
what the full study reports (the checks use facts independent of the study code: the format
specifications, the published tensor-core parameters, the bundled real H200 outputs)."""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fpsim import cli, studies

AVAILABLE = [name for name, _ in studies.available()]
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("docs")
    found = {}
    for name in AVAILABLE:
        try:
            found[name] = studies.run(name, fast=True, out=out)
        except studies.StudyUnavailable:  # a checkout without the analyzer
            found[name] = None
    return found


def _result(results, name):
    if results.get(name) is None:
        pytest.skip(f"study {name} cannot run in this checkout")
    return results[name]


def test_registry_lists_the_scripts_present():
    assert set(AVAILABLE) <= set(studies.STUDIES)
    assert set(AVAILABLE) == set(studies.STUDIES)
    with pytest.raises(ValueError, match="unknown study"):
        studies.run("no_such_study")


@pytest.mark.parametrize("name", AVAILABLE)
def test_study_writes_its_page_and_figures(results, name):
    result = _result(results, name)
    assert result.fast and result.finding
    text = result.page.read_text(encoding="utf-8")
    assert result.page.name == f"{name}.md"
    assert "**Claim tested.**" in text and "**Finding.**" in text and f"fpsim study {name}" in text
    assert result.figures
    for path in result.figures:
        assert path.read_bytes().startswith(b"\x89PNG")
        link = f"../figures/studies/{path.name}"
        assert link in text
        assert (result.page.parent / link).resolve() == path.resolve()


def test_format_ranges_match_the_specifications(results):
    values = _result(results, "format_ranges").values
    assert values["mismatches"] == []
    # round to nearest: the error in the normal range never exceeds u / (1 + u), u = 2^-p
    for name, p in (("fp16", 11), ("bf16", 8), ("e4m3", 4), ("e5m2", 3)):
        assert values[f"worst_normal_{name}"] <= 2.0 ** -p / (1 + 2.0 ** -p)


def test_accumulation_error_grows_without_promotion_and_stays_flat_with_it(results):
    values = _result(results, "accumulation_error").values
    native, promoted = values["native_u_by_k"], values["promoted_u_by_k"]
    ks = values["ks"]
    assert all(b > a for a, b in zip(native[2:], native[3:]))              # growing with K beyond a few blocks
    assert native[-1] > 5 * promoted[-1]
    late = [e for k, e in zip(ks, promoted) if k >= 256]
    assert max(late) < 2 * min(late)                                       # flat once promotion starts
    assert values["native_u"]["share_below"] == 1.0                        # truncation: always below the exact sum
    assert values["fp16_u"]["max"] < values["native_u"]["max"] / 100


def test_tensorcore_probes_agree_with_the_real_h200(results):
    values = _result(results, "tensorcore_probes").values
    assert values["disagreements"] == []
    assert values["capture_exact"] == values["capture_rows"] > 100000
    assert values["decreasing_pairs"] == 0 < values["dominated_pairs"]
    assert values["hopper_fp8_real"]["window"] == "13"                      # the published 13-bit FP8 window
    assert all(v == "2 · 2^-23" for v in values["drops"].values())


def test_gradient_underflow_ranks_the_formats_by_range(results):
    values = _result(results, "gradient_underflow").values
    # part of the activation gradients lies below FP16's smallest subnormal, as Micikevicius et al. found
    assert values["below_2_24"] > 0
    assert 0 < values["fp16_lost_1"] <= values["below_2_24"]
    # smallest subnormals: e4m3 2^-9 > e5m2 2^-16 > fp16 2^-24 > bf16 2^-133, so losses rank the other way
    assert values["e4m3_lost_1"] > values["e5m2_lost_1"] > values["fp16_lost_1"] > values["bf16_lost_1"] == 0
    assert values["fp16_lost_8"] < values["fp16_lost_1"]
    lo, hi = values["fp16_window"]
    assert lo <= values["fp16_recommended"] <= hi


def test_loss_scale_sweep_overflows_above_the_window(results):
    values = _result(results, "loss_scale_sweep").values
    lo, hi = values["window"]
    assert values["inside_ok"]
    assert values["first_diverged"] is not None and values["first_diverged"] > hi
    finals = dict(zip(values["exponents"], values["finals"]))
    assert all(f == f for e, f in finals.items() if e <= hi)               # no NaN at or below the window's top


def test_verdict_agreement_every_row_agrees_with_real_training(results):
    """The oracle is inside the study: real CPU autocast FP16/BF16 training of each model."""
    values = _result(results, "verdict_agreement").values
    assert values["all_agree"], {k: v for k, v in values.items() if isinstance(v, dict) and not v["agrees"]}
    aux = next(v for k, v in values.items() if k.startswith("planted: aux_head"))
    assert aux["fp16"] > 2 * aux["fp32"] and aux["fp16_recommendation"][1] > 0


def test_cli_lists_and_runs_a_study(tmp_path):
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert cli.main(["study", "--list"]) == 0
    assert re.search(r"^format_ranges\s", stdout.getvalue(), re.M)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        assert cli.main(["study", "nonsense"]) == 2
    assert "unknown study" in err.getvalue()


def test_script_runs_directly_and_is_deterministic(tmp_path, results):
    """python studies/NAME.py --fast regenerates the same page as the runner."""
    subprocess.run([sys.executable, str(ROOT / "studies" / "format_ranges.py"), "--fast", "--out", str(tmp_path)],
                   check=True, capture_output=True)
    again = (tmp_path / "studies" / "format_ranges.md").read_text(encoding="utf-8")
    assert again == _result(results, "format_ranges").page.read_text(encoding="utf-8")


def test_cli_json_is_strict_json_where_a_study_value_is_nan(tmp_path):
    """loss_scale_sweep's final losses above the window are NaN (test above); RFC 8259 has no NaN token,
    so --json writes it as the string "nan", as docs/analyzer.md says for the analyzer's files."""
    def refuse(token):
        raise AssertionError(f"{token} in --json output: not JSON (RFC 8259)")

    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert cli.main(["study", "loss_scale_sweep", "--fast", "--json", "-q", "--out", str(tmp_path)]) == 0
    (row,) = json.loads(stdout.getvalue(), parse_constant=refuse)
    assert "nan" in row["values"]["finals"]
