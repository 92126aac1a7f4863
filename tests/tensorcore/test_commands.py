"""The tensor-core commands of `fpsim` (validate, probes): exit codes scripts can trust, and help texts.

Sources of truth: the bundled real captures (every instruction-level row of
the H100 capture is reproduced by the H100 model, so `fpsim validate h100`
must succeed; an A100 model cannot run its FP8 cases, so judging the H100
data with it must fail), and the probe features docs/tensorcore.md lists for
the H100 fp16 path (window 25 bits, F = 16, toward zero). For what the probes take:
docs/tensorcore.md's preset table (each generation's input formats; Blackwell's block
formats take block scales, which the probes do not set, so they are not probed) and
fpsim's alias table ("half" is fp16).
"""

from __future__ import annotations

import pytest

from fpsim.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_validate_succeeds_only_when_every_instruction_row_is_bit_exact(capsys):
    code, out, err = run(capsys, "validate", "h100")
    assert code == 0 and "instruction: 20000/20000 values bit-exact (100.00%)" in out and not err
    code, out, err = run(capsys, "validate", "h100", "--device", "a100")
    assert code == 1 and "do not support e4m3 inputs with fp32 output" in out
    assert "instruction-level case(s) not bit-exact: e4m3_fp32" in err


def test_validate_does_not_judge_library_calls(capsys):
    """cuBLAS picks its own summation order: below 100% under the default model, reported only."""
    code, out, _ = run(capsys, "validate", "h200")
    assert code == 0 and "library: 42050/58368 values bit-exact (72.04%)" in out


def test_validate_refuses_an_unknown_device_and_bad_options(capsys):
    code, out, err = run(capsys, "validate", "h100", "--device", "bogus")
    assert code == 2 and not out and "unknown device 'bogus'; allowed:" in err
    with pytest.raises(SystemExit) as stop:
        main(["validate", "h100", "--show", "-1"])
    assert stop.value.code == 2 and "--show: must be 0 or more, got -1" in capsys.readouterr().err


def test_probes_reads_the_documented_features(capsys):
    code, out, _ = run(capsys, "probes", "--device", "h100", "--inputs", "fp16", "--output", "fp32")
    assert code == 0
    assert "window             25" in out and "block_size         16" in out and "toward_zero" in out
    code, _, err = run(capsys, "probes", "--device", "a100", "--inputs", "e4m3")
    assert code == 2 and "a100 (ampere) tensor cores do not support e4m3 inputs; the probes run fp16, bf16, tf32 on " \
                         "a100" in err


@pytest.mark.parametrize("command,options", [("probes", ("--device", "--inputs", "--output", "--path", "--json")),
                                             ("validate", ("--device", "--path", "--show", "--json")),
                                             ("compare", ("--json", "--html", "--shares"))])
def test_every_option_has_a_help_text(capsys, command, options):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    lines = capsys.readouterr().out.splitlines()
    for option in options:
        line = next(line for line in lines if line.strip().startswith(option))
        described = line.split(option, 1)[1].split(maxsplit=1)
        helped = len(described) > 1 or lines[lines.index(line) + 1].startswith(" " * 20)
        assert helped, f"{command} {option} has no help text"


def test_validate_json_gives_the_counts_and_the_same_exit_codes(capsys):
    import json

    code, out, _ = run(capsys, "validate", "h100", "--json")
    data = json.loads(out)
    assert code == 0 and data["bit_exact"] is True and data["model"] == "h100"
    assert data["totals"]["instruction"] == {"rows": 20000, "matched": 20000, "share": 1.0, "cases": 8}
    code, out, _ = run(capsys, "validate", "h100", "--device", "a100", "--json", "--show", "2")
    data = json.loads(out)
    cases = {c["name"]: c for c in data["cases"]}
    assert code == 1 and data["bit_exact"] is False and cases["e4m3_fp32"]["matched"] == 0   # a100 has no FP8
    assert cases["bf16_fp32"]["matched"] < cases["bf16_fp32"]["rows"] and len(cases["bf16_fp32"]["mismatches"]) == 2
    code, out, err = run(capsys, "validate", "h100", "--device", "bogus", "--json")
    assert code == 2 and not out and "unknown device 'bogus'" in err


def test_probes_json_gives_the_documented_features(capsys):
    import json

    code, out, _ = run(capsys, "probes", "--device", "h100", "--inputs", "fp16", "--json")
    features = json.loads(out)["features"]
    assert code == 0 and features["window"] == "25" and features["block_size"] == "16"
    assert features["rounding"] == "toward_zero"


def test_probes_refuse_what_they_cannot_run_and_list_only_what_they_run(capsys):
    from fpsim.tensorcore import features, probes

    blackwell = "the probes run fp16, bf16, tf32, e4m3, e5m2 on b200 (blackwell); block formats are not probed"
    for name in ("mxfp4", "nvfp4", "mxfp8_e4m3"):
        code, out, err = run(capsys, "probes", "--device", "b200", "--inputs", name)
        assert code == 2 and not out and err.startswith(f"fpsim probes: error: cannot probe {name} inputs: {blackwell}")
    code, _, err = run(capsys, "probes", "--device", "b200", "--inputs", "e4m33")
    assert code == 2 and err.startswith(f"fpsim probes: error: unknown input format 'e4m33'; {blackwell}")
    code, _, err = run(capsys, "probes", "--device", "h100", "--inputs", "fp32")
    assert code == 2 and err == ("fpsim probes: error: h100 (hopper) tensor cores do not support fp32 inputs; "
                                 "the probes run fp16, bf16, tf32, e4m3, e5m2 on h100 (hopper)\n")
    for name in "fp16, bf16, tf32, e4m3, e5m2".split(", "):   # every name listed is one the probes take
        assert features.probe_inputs("b200", name) == name
        probes.check_args(name, 32, "fp32")
    code, out, _ = run(capsys, "probes", "--device", "h100", "--inputs", "half")   # an alias of fp16
    assert code == 0 and "window             25" in out and "block_size         16" in out
