"""The report files: the documented JSON schema, a self-contained HTML page, PNG figures, the terminal table."""

from __future__ import annotations

import json
import re

import pytest
import torch

from fpsim.analyze import SCHEMA, watch
from fpsim.analyze.demo import SensorNet, sensor_data, train


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    torch.set_num_threads(1)
    folder = tmp_path_factory.mktemp("report")
    torch.manual_seed(0)
    model = SensorNet(hidden=16, depth=3)
    with watch(model, every=2) as w:
        train(model, sensor_data(samples=1024), 6, batch=128)
    report = w.report()
    paths = report.save(folder)
    return report, paths, folder


def test_json_schema(saved):
    report, paths, folder = saved
    data = json.loads((folder / "report.json").read_text())
    assert data["schema"] == SCHEMA == "fpsim.analyze.report/2"
    assert [f["name"] for f in data["formats"]] == ["fp16", "bf16", "e4m3", "e5m2"]
    assert {f["scaling"] for f in data["formats"]} == {"loss_scale", "per_tensor"}
    for name in ("fp16", "bf16", "e4m3", "e5m2"):
        ls = data["loss_scale"][name]
        assert {"recommended", "min", "max", "recommended_log2", "min_log2", "max_log2", "unserved_layers"} <= set(ls)
        if ls["recommended_log2"] is not None:
            assert ls["recommended"] == 2.0 ** ls["recommended_log2"]
            assert ls["min"] <= ls["recommended"] <= ls["max"]
    assert data["run"]["steps"] == 6 and data["run"]["steps_observed"] == 3 and data["run"]["every"] == 2
    names = [layer["name"] for layer in data["layers"]]
    assert names[:2] == ["pressure", "pressure_norm"] and "head" in names
    for layer in data["layers"]:
        assert set(layer["verdicts"]) == {"fp16", "bf16", "e4m3", "e5m2"}
        assert set(layer["verdicts"].values()) <= {"ok", "loss_scale", "fp32"}
        assert all(layer["reasons"][f] for f in layer["verdicts"])
        for kind, t in layer["tensors"].items():
            assert kind in ("activation", "activation_grad", "weight", "weight_grad", "optimizer_grad", "update")
            assert t["values"] == t["nonzero"] + t["zeros"] + t["pos_inf"] + t["neg_inf"] + t["nan"]
            h = t["log2_histogram"]
            assert sum(h["counts"]) + h["tiny"] + h["huge"] == t["nonzero"]
            for f, entry in t["formats"].items():
                assert 0 <= entry["underflow"] <= 1 and 0 <= entry["subnormal"] <= 1
            if kind in ("activation_grad", "weight_grad"):
                lo, hi = t["underflow_by_scale"]["log2_scales"]
                assert len(t["underflow_by_scale"]["fp16"]) == hi - lo + 1
            if kind == "update":
                assert all("lost_updates" in entry for entry in t["formats"].values())
    assert set(data["fp8_recipe"]) <= {"activation", "weight", "activation_grad", "weight_grad"}
    assert data["gradscaler"]["fp16"]["steps"] == 6
    assert data["summary"]["fp16"]["ok"] + data["summary"]["fp16"]["loss_scale"] + \
        data["summary"]["fp16"]["fp32"] == len([layer for layer in data["layers"] if layer["entry"] == "module"])


def test_json_is_strict(saved):
    _, _, folder = saved
    text = (folder / "report.json").read_text()
    assert "NaN" not in text and "Infinity" not in text    # non-finite numbers are written as strings
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))


def test_html_is_self_contained(saved):
    _, _, folder = saved
    page = (folder / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "<style>" in page
    sources = re.findall(r"""(?:src|href)\s*=\s*['"]([^'"]+)""", page)
    assert sources and all(s.startswith("data:image/png;base64,") for s in sources)
    assert "http://" not in page and "https://" not in page
    assert "pressure" in page and "loss_scale" in page


def test_figures_are_pngs(saved):
    _, paths, folder = saved
    pngs = sorted(p.name for p in folder.glob("*.png"))
    assert "magnitudes_activation_grad.png" in pngs and "loss_scale_windows.png" in pngs
    for name in pngs:
        assert (folder / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert set(paths) == set(pngs) | {"report.json", "report.html"}


def test_figure_builders_return_figures(saved):
    from matplotlib.figure import Figure

    from fpsim.analyze import figures

    report, _, _ = saved
    for fig in (figures.magnitude_heatmap(report, "weight"), figures.loss_scale_windows(report, ["fp16"]),
                figures.gradscaler_trajectory(report)):
        assert isinstance(fig, Figure)
    with pytest.raises(ValueError, match="kind 'nothing'"):
        figures.magnitude_heatmap(report, "nothing")


def test_summary_table(saved):
    report, _, _ = saved
    table = report.summary_table()
    first = table.splitlines()[0].split()
    assert first[:6] == ["layer", "type", "fp16", "bf16", "e4m3", "e5m2"]
    assert "recommended" in table and "GradScaler" in table
    for layer in report.layers:                 # blocks with the same verdicts share a row: body.{2,4}
        assert layer.name in table or layer.name.split(".")[0] + ".{" in table
    with pytest.raises(KeyError, match="no layer or op 'nope'"):
        report.verdict("nope", "fp16")
    with pytest.raises(KeyError, match="not watched"):
        report.verdict("head", "fp8")


def test_rows_of_repeated_blocks_are_merged():
    from fpsim.analyze.text import grouped

    rows = [("h.0.attn", "Linear", "ok", "1%"), ("h.1.attn", "Linear", "ok", "3%"), ("h.2.attn", "Linear", "fp32", "2%"),
            ("h.3.attn", "Linear", "ok", "2%"), ("head", "Linear", "ok", "")]
    assert grouped(rows, tail=1) == [("h.{0-1,3}.attn", "Linear", "ok", "3%"), ("h.2.attn", "Linear", "fp32", "2%"),
                                     ("head", "Linear", "ok", "")]


@pytest.mark.parametrize("collector_on", [True, False])
def test_save_leaves_the_garbage_collector_as_it_found_it(saved, tmp_path, collector_on):
    # save pauses Python's collector while it writes: after a save, and after one that fails (the folder is a
    # file), the collector is on or off as the user had it
    import gc

    report, _, _ = saved
    was = gc.isenabled()
    try:
        (gc.enable if collector_on else gc.disable)()
        report.save(tmp_path / "out", figures=False)
        assert gc.isenabled() is collector_on
        (tmp_path / "a file").write_text("")
        with pytest.raises(OSError):
            report.save(tmp_path / "a file", figures=False)
        assert gc.isenabled() is collector_on
    finally:
        (gc.enable if was else gc.disable)()
