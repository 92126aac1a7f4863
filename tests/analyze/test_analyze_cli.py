"""`fpsim demo` and `fpsim analyze`: an unmodified script observed through torch's global hooks."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from fpsim import cli

SCRIPT = textwrap.dedent("""
    import argparse, json, sys
    import torch
    from torch import nn

    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--record", required=True)
    parser.add_argument("--fail-at", type=int, default=-1)
    args = parser.parse_args()
    json.dump(sys.argv, open(args.record, "w"))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(8, 16)
            self.act = nn.Tanh()
            self.fc2 = nn.Linear(16, 3)

        def forward(self, x):
            return self.fc2(self.act(self.fc1(x)))

    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()
    x, y = torch.randn(64, 8), torch.randint(0, 3, (64,))
    for step in range(50):
        if step == args.fail_at:
            raise RuntimeError("the data loader broke")
        loss = loss_fn(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
""")


@pytest.fixture()
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return path


def test_analyze_runs_an_unmodified_script_and_stops_after_n_steps(script, tmp_path, capsys):
    out = tmp_path / "report"
    argv_before = list(sys.argv)
    code = cli.main(["analyze", "--out", str(out), "--steps", "4", "--formats", "fp16,bf16", str(script), "--",
                     "--lr", "0.05", "--record", str(tmp_path / "argv.json")])
    assert code == 0
    assert sys.argv == argv_before
    assert json.loads((tmp_path / "argv.json").read_text()) == [str(script), "--lr", "0.05", "--record",
                                                                str(tmp_path / "argv.json")]
    report = json.loads((out / "report.json").read_text())
    assert report["run"]["status"] == "stopped" and report["run"]["steps"] == 4
    names = {layer["name"] for layer in report["layers"]}
    assert names == {"Net.fc1", "Net.fc2"}                   # the modules with parameters
    captured = capsys.readouterr()
    assert "Net.fc1" in captured.out and "report written to" in captured.out
    assert "step 4/4" in captured.err                          # the progress line


def test_options_may_follow_the_script_before_the_double_dash(script, tmp_path):
    out = tmp_path / "report"
    record = tmp_path / "argv.json"
    assert cli.main(["analyze", str(script), "--out", str(out), "--steps", "2", "--formats", "bf16", "--",
                     "--record", str(record)]) == 0
    assert json.loads(record.read_text())[1:] == ["--record", str(record)]
    report = json.loads((out / "report.json").read_text())
    assert report["run"]["steps"] == 2 and [f["name"] for f in report["formats"]] == ["bf16"]


def test_analyze_reports_a_failing_script(script, tmp_path, capsys):
    out = tmp_path / "report"
    code = cli.main(["analyze", "--out", str(out), "--formats", "fp16", str(script), "--",
                     "--record", str(tmp_path / "argv.json"), "--fail-at", "3"])
    assert code == 1
    err = capsys.readouterr().err
    assert "RuntimeError: the data loader broke" in err and str(out) in err
    report = json.loads((out / "report.json").read_text())
    assert report["run"]["status"] == "error" and report["run"]["steps"] == 3


def test_bad_arguments_fail_before_the_script_runs(script, tmp_path, capsys):
    record = tmp_path / "argv.json"
    assert cli.main(["analyze", "--formats", "fp16,fp17", str(script), "--", "--record", str(record)]) == 2
    assert "unknown format 'fp17'" in capsys.readouterr().err
    assert not record.exists()
    assert cli.main(["analyze", str(tmp_path / "missing.py")]) == 2
    assert "no training script" in capsys.readouterr().err
    assert cli.main(["analyze"]) == 2
    assert "--demo" in capsys.readouterr().err


def test_demo_command(tmp_path, capsys):
    out = tmp_path / "demo"
    assert cli.main(["analyze", "--demo", "--steps", "3", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "SensorNet on generated sensor data: 3 steps" in text and "pressure" in text
    report = json.loads((out / "report.json").read_text())
    assert report["run"]["steps"] == 3 and (out / "report.html").exists()
