"""Runs that raise, are interrupted or diverge still leave a complete report, with the first Inf/NaN step."""

from __future__ import annotations

import json
import os

import pytest
import torch
from torch import nn

from fpsim.analyze import watch
from fpsim.analyze.demo import SensorNet, sensor_data
from fpsim.analyze.report import atomic_write


def run_steps(model, data, steps: int, fail_at=None, error=None, poison_at=None):
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(steps):
        if step == fail_at:
            raise error
        i = torch.arange(step * 32, step * 32 + 32)
        pressure = data["pressure"][i].clone()
        if step == poison_at:
            pressure[0] = 3e38      # a corrupt reading: the pressure layer's FP32 output overflows to Inf
        loss = nn.functional.cross_entropy(model(data["readings"][i], pressure), data["label"][i])
        opt.zero_grad()
        loss.backward()
        opt.step()


def model_and_data():
    torch.manual_seed(0)
    return SensorNet(hidden=16, depth=2), sensor_data(samples=1024)


def no_temporary_files(folder) -> bool:
    return not [name for name in os.listdir(folder) if name.startswith(".tmp-")]


def test_a_run_that_raises_writes_the_report_so_far(tmp_path):
    model, data = model_and_data()
    with pytest.raises(RuntimeError, match="out of memory"):
        with watch(model, out=tmp_path):
            run_steps(model, data, 10, fail_at=5, error=RuntimeError("CUDA out of memory (simulated)"))
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["run"]["status"] == "error" and "out of memory" in report["run"]["error"]
    assert report["run"]["steps"] == 5
    assert (tmp_path / "report.html").exists() and no_temporary_files(tmp_path)


def test_an_interrupted_run_writes_the_report_so_far(tmp_path):
    model, data = model_and_data()
    with pytest.raises(KeyboardInterrupt):
        with watch(model, out=tmp_path):
            run_steps(model, data, 10, fail_at=3, error=KeyboardInterrupt())
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["run"]["status"] == "interrupted" and report["run"]["steps"] == 3
    assert report["layers"]


def test_a_diverging_run_records_the_first_inf_nan_step_per_layer(tmp_path):
    model, data = model_and_data()
    with watch(model, out=tmp_path, every=2) as w:
        run_steps(model, data, 8, poison_at=4)
    report = json.loads((tmp_path / "report.json").read_text())
    first = {layer["name"]: layer["first_nonfinite_step"] for layer in report["layers"]}
    assert first["pressure"] == 4                                  # where the Inf appeared
    assert first["body.0"] == 4 and first["head"] == 4              # and the NaN that followed
    pressure = next(layer for layer in report["layers"] if layer["name"] == "pressure")
    assert pressure["tensors"]["activation"]["pos_inf"] + pressure["tensors"]["activation"]["neg_inf"] > 0
    assert report["run"]["status"] == "completed"
    assert "first Inf/NaN: pressure at step 4" in w.last_report.summary_table()
    assert report["gradscaler"]["fp16"]["skipped_steps"] >= 4       # NaN gradients: every later step skipped


def test_atomic_write_replaces_whole_files_only(tmp_path):
    target = tmp_path / "report.json"
    atomic_write(str(target), b'{"complete": true}')
    with pytest.raises(TypeError):
        atomic_write(str(target), "not bytes")                      # fails while writing
    assert json.loads(target.read_text()) == {"complete": True}    # the old file is untouched
    assert no_temporary_files(tmp_path)
