"""Report.to_tensorboard: the events read back with TensorBoard's own reader (event_accumulator).

Sources of truth: the report.json the same run wrote (per-binade counts of every tensor kind, verdicts,
recommended loss scales), compared with what tensorboard.backend.event_processing reads from the files.
"""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from fpsim.analyze import watch  # noqa: E402
from fpsim.analyze.demo import SensorNet, sensor_data, train  # noqa: E402

SEVERITY = {"ok": 0, "loss_scale": 1, "fp32": 2}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tb")
    model = SensorNet(hidden=16, depth=2)
    with watch(model, formats=("fp16", "bf16", "e4m3")) as w:
        train(model, sensor_data(samples=512), 3, batch=128)
    report = w.report()
    report.save(folder / "report", figures=False)
    report.to_tensorboard(folder / "events")
    report.to_tensorboard(folder / "events", step=7)
    events = EventAccumulator(str(folder / "events"), size_guidance={"histograms": 0, "scalars": 0, "tensors": 0})
    events.Reload()
    return json.loads((folder / "report" / "report.json").read_text()), events


def test_histograms_hold_the_counts_of_report_json(exported):
    data, events = exported
    tags = set(events.Tags()["histograms"])
    checked = 0
    for layer in (e for e in data["layers"] if e["entry"] == "module"):
        for kind, t in layer["tensors"].items():
            h = t["log2_histogram"]
            tag = f"log2_abs/{kind}/{layer['name']}"
            if not sum(h["counts"]) and not h["tiny"]:
                assert tag not in tags
                continue
            read = events.Histograms(tag)
            assert [e.step for e in read] == [data["run"]["steps"], 7]
            value = read[0].histogram_value
            counts = [int(c) for c in value.bucket]
            want = ([h["tiny"]] if h["tiny"] else []) + h["counts"]
            assert counts[-len(h["counts"]):] == h["counts"] and sum(counts) == sum(want)
            top = h["min_exponent"] + len(h["counts"])
            assert value.bucket_limit[-1] == top and value.max == top and value.num == sum(want)
            checked += 1
    assert checked >= 6


def test_scalars_hold_the_verdicts_and_loss_scales(exported):
    data, events = exported
    for layer in (e for e in data["layers"] if e["entry"] == "module"):
        for fmt, verdict in layer["verdicts"].items():
            read = events.Scalars(f"verdict/{fmt}/{layer['name']}")
            assert [e.value for e in read] == [SEVERITY[verdict]] * 2
    for fmt, ls in data["loss_scale"].items():
        if ls["recommended_log2"] is not None:
            assert events.Scalars(f"loss_scale_log2/{fmt}")[0].value == ls["recommended_log2"]
        for verdict in SEVERITY:
            assert events.Scalars(f"layers/{fmt}/{verdict}")[0].value == data["summary"][fmt][verdict]
    assert "fpsim/summary/text_summary" in events.Tags()["tensors"]


def test_a_bad_step_is_refused(exported, tmp_path):
    from fpsim.analyze.tensorboard import write_report

    with pytest.raises(ValueError, match="step must be an int >= 0, got -1"):
        write_report(None, None, -1)
