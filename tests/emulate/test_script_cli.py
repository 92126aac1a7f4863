"""`fpsim analyze --emulate RECIPE train.py -- ARGS` and `--confirm`: an unmodified script under emulation.

Sources of truth: the script's own record of its losses (loss.item() as it trains) and plain
torch training of the same model and data in this process for FP32; for low precision, the same
loop run in this process under ``fpsim.emulate(model, recipe)`` (the context manager, held to
real CPU autocast in test_session.py) with the options the run claims to apply (from_report=
the very report.json written). The figure is checked to be a PNG file.
"""

from __future__ import annotations

import json
import runpy
import sys
import textwrap

import pytest
import torch

import fpsim
from fpsim import cli

SCRIPT = textwrap.dedent("""
    import argparse, json
    import torch
    from torch import nn


    def build():
        return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))


    def train(model, steps=50, record=None):
        g = torch.Generator().manual_seed(1)
        x, y = torch.randn(64, 8, generator=g) * 0.01, torch.randint(0, 3, (64,), generator=g)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        losses = []
        for step in range(steps):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            losses.append(loss.item())
            if record:
                json.dump(losses, open(record, "w"))
            opt.step()
        return losses


    if __name__ == "__main__":
        parser = argparse.ArgumentParser()
        parser.add_argument("--record", required=True)
        train(build(), record=parser.parse_args().record)
""")
STEPS = 4


@pytest.fixture()
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return path


def _in_process(script, recipe=None, **options):
    """The script's build() and train() run here: plain torch (recipe None) or under fpsim.emulate."""
    functions = runpy.run_path(str(script), run_name="functions")
    torch.manual_seed(0)
    model = functions["build"]()
    if recipe is None:
        return functions["train"](model, STEPS)
    with fpsim.emulate(model, recipe, **options):
        return functions["train"](model, STEPS)


def test_emulate_runs_an_unmodified_script(script, tmp_path, capsys):
    out, record = tmp_path / "out", tmp_path / "losses.json"
    argv = list(sys.argv)
    assert cli.main(["analyze", "--emulate", "bf16", "--steps", str(STEPS), "--out", str(out), str(script), "--",
                     "--record", str(record)]) == 0
    assert sys.argv == argv
    document = json.loads((out / "emulation.json").read_text())
    (run,) = document["runs"]
    assert run["recipe"] == "bf16" and run["steps"] == STEPS
    assert run["losses"] == json.loads(record.read_text())             # what the script itself saw
    assert run["losses"] == _in_process(script, "bf16")                # the context manager's run
    assert run["losses"] != _in_process(script)                        # and not FP32's
    assert (out / document["figure"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "bf16" in capsys.readouterr().out
    assert not (out / "report.json").exists()                          # nothing was observed


def test_confirm_puts_fp32_unprotected_and_recommended_runs_into_the_report(script, tmp_path):
    out, record = tmp_path / "out", tmp_path / "losses.json"
    assert cli.main(["analyze", "--confirm", "--emulate", "fp16", "--steps", str(STEPS), "--formats", "fp16,bf16",
                     "--quiet", "--out", str(out), str(script), "--", "--record", str(record)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["schema"].startswith("fpsim.analyze.report/") and report["layers"]    # the analyzer's report
    section = report["emulation"]
    fp32, unprotected, recommended = section["runs"]
    assert [r["label"] for r in section["runs"]] == ["fp32", "fp16, unprotected", "fp16, as the report recommends"]
    assert fp32["losses"] == _in_process(script)
    assert unprotected["losses"] == _in_process(script, "fp16")
    assert recommended["options"] == {"from_report": "report.json"}
    assert recommended["loss_scale"] == report["loss_scale"]["fp16"]["recommended"]
    assert recommended["losses"] == _in_process(script, "fp16", from_report=str(out / "report.json"))
    assert all(r["steps"] == STEPS and len(r["losses"]) == STEPS for r in section["runs"])
    assert (out / section["figure"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("options, message", [
    (["--emulate", "fp12"], "unknown recipe 'fp12'"),
    (["--emulate", ""], "give a recipe name"),
    (["--confirm", "--emulate", "fp32"], "--confirm needs a low-precision recipe to confirm, not fp32"),
    (["--confirm", "--emulate", "fp8", "--formats", "fp16,bf16"], "lacks e4m3, e5m2"),
    (["--demo", "--emulate", "fp16"], "--emulate and --confirm run a training script, not --demo"),
])
def test_bad_emulation_options_are_usage_errors_before_the_script_runs(script, tmp_path, capsys, options, message):
    record = tmp_path / "losses.json"
    assert cli.main(["analyze", *options, "--out", str(tmp_path / "out"), str(script), "--",
                     "--record", str(record)]) == 2
    assert message in capsys.readouterr().err
    assert not record.exists()


def test_a_script_that_raises_under_emulation_exits_1(tmp_path, capsys):
    path = tmp_path / "broken.py"
    path.write_text("import torch\nm = torch.nn.Linear(2, 1)\nm(torch.ones(1, 2)).sum().backward()\n"
                    "raise RuntimeError('the data loader broke')\n")
    assert cli.main(["analyze", "--emulate", "fp16", "--out", str(tmp_path / "out"), str(path)]) == 1
    assert "RuntimeError under emulation: the data loader broke" in capsys.readouterr().err
    assert not torch.is_autocast_enabled("cpu")                        # the emulation ended with the script
    (run,) = json.loads((tmp_path / "out" / "emulation.json").read_text())["runs"]   # written all the same
    assert run["error"] == "RuntimeError: the data loader broke" and len(run["losses"]) == 1
    path.write_text(path.read_text().replace("raise RuntimeError('the data loader broke')", "raise SystemExit(3)"))
    assert cli.main(["analyze", "--emulate", "fp16", "--out", str(tmp_path / "out3"), str(path)]) == 1
    (run,) = json.loads((tmp_path / "out3" / "emulation.json").read_text())["runs"]   # an exit status as well
    assert run["error"] == "SystemExit: 3" and len(run["losses"]) == 1


def test_confirm_keeps_every_run_when_the_script_raises_in_some(script, tmp_path, capsys):
    """The script stops itself once its logits come out in FP16 (a NaN check would, after an overflow):
    FP32's run is whole, each FP16 run keeps the losses before its exception, the report gets them all."""
    path = tmp_path / "checked.py"
    path.write_text(SCRIPT.replace("        loss = nn.functional.cross_entropy(model(x), y)\n",
                                   "        out = model(x)\n"
                                   "        if step == 2 and out.dtype == torch.float16:\n"
                                   "            raise FloatingPointError('fp16 logits')\n"
                                   "        loss = nn.functional.cross_entropy(out, y)\n"))
    out, record = tmp_path / "out", tmp_path / "losses.json"
    assert cli.main(["analyze", "--confirm", "--emulate", "fp16", "--steps", str(STEPS), "--formats", "fp16,bf16",
                     "--quiet", "--out", str(out), str(path), "--", "--record", str(record)]) == 1
    err = capsys.readouterr().err
    assert err.count("FloatingPointError under emulation: fp16 logits") == 2
    fp32, unprotected, recommended = json.loads((out / "report.json").read_text())["emulation"]["runs"]
    assert fp32["error"] is None and fp32["losses"] == _in_process(script)
    for run in (unprotected, recommended):
        assert run["error"] == "FloatingPointError: fp16 logits"
        assert run["losses"] == _in_process(script, "fp16")[:2]          # the two steps before the raise
    assert (out / "emulation_losses.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
