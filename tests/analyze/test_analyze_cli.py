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


# ----------------------------------------------------- the report is never lost; exit codes
SLOW_SCRIPT = textwrap.dedent("""
    import pathlib, sys, time
    import torch
    from torch import nn

    marker = pathlib.Path(sys.argv[1])
    net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for step in range(10000):
        loss = net(torch.randn(32, 8)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == 2:
            marker.write_text("running")
        time.sleep(0.01)
""")


def _interruptible():
    """In the child: SIGINT to its default, which Python turns into KeyboardInterrupt. A suite started in
    the background of a non-interactive shell inherits SIGINT ignored, and Python then keeps it ignored."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_slow_script(tmp_path):
    import os
    import subprocess

    script, marker, out = tmp_path / "slow.py", tmp_path / "marker", tmp_path / "report"
    script.write_text(SLOW_SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "fpsim", "analyze", "--out", str(out), "--formats", "fp16",
                             str(script), "--", str(marker)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, preexec_fn=_interruptible)
    import time

    deadline = time.time() + 120
    while not marker.exists():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.05)
    return proc, out


def test_sigterm_writes_the_report_and_exits_143(tmp_path):
    import signal

    proc, out = start_slow_script(tmp_path)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr
    report = json.loads((out / "report.json").read_text())
    assert report["run"]["status"] == "terminated" and report["run"]["steps"] >= 3
    assert (out / "report.html").exists() and f"report written to {out}/" in stderr


def test_a_second_ctrl_c_does_not_lose_the_report(tmp_path):
    import signal
    import time

    proc, out = start_slow_script(tmp_path)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    report = json.loads((out / "report.json").read_text())
    assert report["run"]["status"] == "interrupted" and report["layers"]
    assert (out / "report.html").exists() and not list(out.glob(".tmp-*"))


def test_the_scripts_own_exception_exits_1_with_its_traceback(script, tmp_path, capsys):
    bad = tmp_path / "bad.py"
    bad.write_text(SCRIPT.replace('raise RuntimeError("the data loader broke")',
                                  'raise ValueError("a bad batch")'))
    out = tmp_path / "report"
    code = cli.main(["analyze", "--out", str(out), str(bad), "--", "--record", str(tmp_path / "a.json"),
                     "--fail-at", "2"])
    err = capsys.readouterr().err
    assert code == 1                                      # the script's ValueError is not a usage error
    assert "Traceback (most recent call last)" in err and str(bad) in err and "ValueError: a bad batch" in err
    assert f"report written to {out}/" in err
    assert json.loads((out / "report.json").read_text())["run"]["steps"] == 2


def test_ctrl_c_in_the_script_exits_130(script, tmp_path, capsys):
    stop = tmp_path / "stop.py"
    stop.write_text(SCRIPT.replace('raise RuntimeError("the data loader broke")', "raise KeyboardInterrupt"))
    out = tmp_path / "report"
    assert cli.main(["analyze", "--out", str(out), str(stop), "--", "--record", str(tmp_path / "a.json"),
                     "--fail-at", "2"]) == 130
    assert "report written" in capsys.readouterr().err
    assert json.loads((out / "report.json").read_text())["run"]["status"] == "interrupted"


def test_a_bad_out_is_a_usage_error_before_the_script_starts(script, tmp_path, capsys):
    record = tmp_path / "argv.json"
    a_file = tmp_path / "taken"
    a_file.write_text("not a folder")
    for out in (a_file, a_file / "below"):
        assert cli.main(["analyze", "--out", str(out), str(script), "--", "--record", str(record)]) == 2
        err = capsys.readouterr().err
        assert str(out) in err and "error" in err
        assert not record.exists()                        # the script never ran


FRAGILE_SCRIPT = textwrap.dedent("""
    import torch
    from torch import nn

    class Fragile(torch.Tensor):
        @property
        def _local_tensor(self):
            raise NotImplementedError("Fragile tensors do not give their local part")

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            return self.fc(x).as_subclass(Fragile)

    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for step in range(200):
        loss = net(torch.randn(8, 4)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    raise SystemExit("ran all 200 steps")
""")


def test_steps_holds_after_a_hook_failure(tmp_path, capsys):
    script = tmp_path / "fragile.py"
    script.write_text(FRAGILE_SCRIPT)
    out = tmp_path / "report"
    with pytest.warns(RuntimeWarning, match="observation stopped"):
        assert cli.main(["analyze", "--out", str(out), "--steps", "3", str(script)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["run"]["status"] == "stopped" and report["run"]["steps"] == 3
    assert report["run"]["observation_error"].startswith("NotImplementedError")


def test_names_of_any_characters_and_report_json_first(tmp_path):
    import torch
    from torch import nn

    import fpsim

    model = nn.Sequential()
    model.add_module("cost$ per_unit {x}", nn.Linear(4, 4))
    model.add_module("ünïcode\tname", nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with fpsim.watch(model, out=tmp_path) as w:
        for _ in range(2):
            loss = model(torch.randn(8, 4)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert set(w.saved_paths) >= {"report.json", "report.html", "magnitudes_activation.png"}
    names = [layer["name"] for layer in json.loads((tmp_path / "report.json").read_text())["layers"]]
    assert "cost$ per_unit {x}" in names and "ünïcode\tname" in names


CHDIR_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import torch
    from torch import nn

    json.dump(__file__, open(sys.argv[1], "w"))
    os.makedirs(sys.argv[2], exist_ok=True)
    os.chdir(sys.argv[2])                      # as hydra does: the run's own folder
    torch.manual_seed(0)
    net = nn.Linear(4, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(3):
        loss = net(torch.randn(8, 4)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
""")


@pytest.mark.parametrize("mode", [[], ["--emulate", "bf16"], ["--emulate", "fp16", "--confirm"]])
def test_a_script_that_changes_directory_gets_its_report_where_out_was_checked(tmp_path, monkeypatch, capsys,
                                                                                mode):
    """The report (and --emulate's losses) land in --out as given from where fpsim started, not under the
    folder the script moved to (before, the folder that was checked and announced stayed empty); the script
    sees __file__ absolute, as python gives it; every run of --confirm starts where fpsim did."""
    import subprocess

    (tmp_path / "train.py").write_text(CHDIR_SCRIPT)
    monkeypatch.chdir(tmp_path)
    if "--confirm" in mode:   # --confirm needs the analyzer's report first
        assert cli.main(["analyze", "-q", "--out", "rep", "--shadow-every", "0", "train.py", "--",
                         str(tmp_path / "file.json"), "elsewhere"]) == 0
    code = cli.main(["analyze", "-q", "--out", "rep", *mode, "train.py", "--", str(tmp_path / "file.json"),
                     "elsewhere"])
    assert code == 0 and tmp_path.samefile(".")
    written = "emulation.json" if mode and "--confirm" not in mode else "report.json"
    assert (tmp_path / "rep" / written).is_file() and not (tmp_path / "elsewhere" / "rep").exists()
    seen = json.loads((tmp_path / "file.json").read_text())
    subprocess.run([sys.executable, "train.py", str(tmp_path / "file.json"), "elsewhere"], check=True)
    assert seen == json.loads((tmp_path / "file.json").read_text()) == str(tmp_path / "train.py")


PRINTING_SCRIPT = textwrap.dedent("""
    import os, sys
    import torch
    from torch import nn

    print("the script's own line")
    os.write(1, b"a line written to descriptor 1\\n")       # as C code and DataLoader workers write
    net = nn.Linear(4, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(int(sys.argv[1])):
        loss = net(torch.randn(8, 4)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
""")


@pytest.mark.parametrize("mode", [[], ["--confirm", "--emulate", "fp16"]])
def test_json_holds_stdout_alone_whatever_the_script_prints(tmp_path, mode):
    """`--json` promises machine-readable output on stdout (README): before, the script's prints came first
    and json.loads failed, and --confirm printed two documents. Now the script's lines go to stderr and
    stdout is one JSON document."""
    import subprocess

    (tmp_path / "train.py").write_text(PRINTING_SCRIPT)
    done = subprocess.run([sys.executable, "-m", "fpsim", "analyze", "--json", "-q", "--shadow-every", "0", *mode,
                           "--out", str(tmp_path / "rep"), str(tmp_path / "train.py"), "--", "4"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert set(document) == ({"summary", "files", "emulation"} if mode else {"summary", "files"})
    assert "the script's own line" in done.stderr and "a line written to descriptor 1" in done.stderr
