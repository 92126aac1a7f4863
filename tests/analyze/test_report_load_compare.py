"""Saved reports read back (Report.load), two runs compared (fpsim compare), and the report folder kept clean.

Sources of truth: the report.json a run wrote (a loaded report must give the same JSON, and save the same
bytes again), the two reports' own verdicts and loss scales (what compare must list), the files a test puts
in the folder itself (which a save must never remove), and the module names the model really has.
"""

from __future__ import annotations

import json

import pytest
import torch

import fpsim
from fpsim.analyze import watch
from fpsim.analyze.compare import compare
from fpsim.analyze.demo import SensorNet, sensor_data, train
from fpsim.cli import main

CUSTOM = fpsim.Format(exp_bits=5, man_bits=4, bias=11, nan="fn", name="e5m4")


def observed_run(folder, seed: int, steps: int, formats, **options):
    torch.manual_seed(seed)
    model = SensorNet(hidden=16, depth=3)
    with watch(model, formats=formats, **options) as w:
        train(model, sensor_data(samples=512), steps, batch=128)
    report = w.report()
    report.save(folder)
    return report


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    torch.set_num_threads(1)
    a, b = tmp_path_factory.mktemp("run_a"), tmp_path_factory.mktemp("run_b")
    ra = observed_run(a, 0, 4, ("fp16", "bf16", "e4m3", CUSTOM))
    rb = observed_run(b, 1, 2, ("fp16", "bf16", "e5m2"))
    return (ra, a), (rb, b)


def test_a_loaded_report_gives_the_json_it_was_loaded_from(runs, tmp_path):
    (report, folder), _ = runs
    written = json.loads((folder / "report.json").read_text())
    for source in (folder, folder / "report.json", str(folder)):
        loaded = fpsim.Report.load(source)
        assert json.loads(loaded.to_json()) == written
    assert [lim.fmt for lim in loaded.limits] == [lim.fmt for lim in report.limits]   # the custom layout too
    assert loaded.summary_table() == report.summary_table()
    loaded.save(tmp_path / "again", figures=False)
    assert (tmp_path / "again" / "report.json").read_bytes() == (folder / "report.json").read_bytes()
    assert loaded.verdict("body.0", "fp16") == report.verdict("body.0", "fp16")
    op = next(o for o in report.ops if o not in report.findings)
    assert loaded.verdict(op.name, "bf16") == report.verdict(op.name, "bf16")


def test_a_loaded_shadowed_report_keeps_its_evidence(tmp_path):
    """Shadow-step evidence, the value-count verdicts it replaced and the mass per binade come back."""
    report = observed_run(tmp_path, 2, 4, ("fp16", "bf16"), shadow_every=2)
    assert report.shadow is not None and report.shadow_evidence
    written = json.loads((tmp_path / "report.json").read_text())
    loaded = fpsim.Report.load(tmp_path)
    assert json.loads(loaded.to_json()) == written
    assert any("mass_per_binade" in t for layer in written["layers"] for t in layer["tensors"].values())
    assert loaded.summary() == report.summary()


def test_load_refuses_what_is_not_a_report(tmp_path):
    with pytest.raises(FileNotFoundError, match="no report at"):
        fpsim.Report.load(tmp_path)
    (tmp_path / "report.json").write_text(json.dumps({"schema": "something/else"}))
    with pytest.raises(ValueError, match="schema 'something/else'"):
        fpsim.Report.load(tmp_path)
    (tmp_path / "report.json").write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        fpsim.Report.load(tmp_path)


@pytest.mark.parametrize("key", ["run", "settings", "formats", "loss_scale", "gradscaler", "fp8_recipe", "layers",
                                 "ops"])
def test_a_report_missing_an_entry_is_a_usage_error_naming_it_not_a_changed_verdict(runs, tmp_path, capsys, key):
    """A damaged report.json (an entry gone) raised a bare KeyError, and `fpsim compare` exited 1, the code
    that tells CI a verdict changed; now load names the entry and compare exits 2 (docs: a path that is not a
    report)."""
    (_, folder), _ = runs
    data = json.loads((folder / "report.json").read_text())
    del data[key]
    (tmp_path / "report.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=f"is not a complete report: no '{key}' entry"):
        fpsim.Report.load(tmp_path)
    assert main(["compare", str(folder), str(tmp_path)]) == 2
    assert f"no '{key}' entry" in capsys.readouterr().err


def test_verdict_takes_every_name_of_a_watched_format(runs):
    """The spellings `fpsim analyze --formats` and watch take (torch's and ml_dtypes' names, any case, a Format)
    name the same verdict; before, 'float16' and 'BF16' were 'not watched'."""
    (report, _), _ = runs
    for name, aliases in (("fp16", ["float16", "FP16", fpsim.format("fp16")]),
                          ("bf16", ["bfloat16", "BF16"]), ("e4m3", ["float8_e4m3fn", "E4M3"])):
        for alias in aliases:
            assert report.verdict("body.0", alias) == report.verdict("body.0", name)
    with pytest.raises(KeyError, match="format 'e5m2' was not watched; formats: fp16, bf16, e4m3"):
        report.verdict("body.0", "e5m2")


def test_compare_lists_what_the_two_reports_judge_differently(runs):
    (ra, a), (rb, b) = runs
    c = compare(a, b)
    assert c.formats == ["fp16", "bf16"]
    assert c.only_in["a"]["formats"] == ["e4m3", "e5m4"] and c.only_in["b"]["formats"] == ["e5m2"]
    modules = [layer.name for layer in ra.layers if not layer.is_op]
    want = [(n, f, ra.verdict(n, f), rb.verdict(n, f)) for n in modules for f in c.formats
            if ra.verdict(n, f) != rb.verdict(n, f)]
    assert [(e["layer"], e["format"], e["a"], e["b"]) for e in c.verdicts] == want
    for f in c.formats:
        assert c.loss_scale[f]["a"] == ra.loss_scale[f].recommended_log2
        assert c.loss_scale[f]["b"] == rb.loss_scale[f].recommended_log2
    grads = ra.layer("body.0").tensors["weight_grad"], rb.layer("body.0").tensors["weight_grad"]
    share = next(e for e in c.shares if (e["layer"], e["format"], e["share"]) == ("body.0", "fp16",
                                                                                  "grad_underflow_at_1"))
    lims = {lim.name: lim for lim in ra.limits}
    assert share["a"] >= grads[0].underflow_fraction(lims["fp16"]) and share["b"] >= grads[1].underflow_fraction(
        lims["fp16"])
    assert c.changed                                             # the format sets differ at least
    same = compare(a, a)
    assert not same.changed and not same.verdicts and all(e["change"] == 0 for e in same.shares)


def test_compare_command_exit_codes_json_and_html(runs, tmp_path, capsys):
    (_, a), (_, b) = runs
    assert main(["compare", str(a), str(a)]) == 0
    assert "no verdict or loss scale changed" in capsys.readouterr().out
    page = tmp_path / "compare.html"
    assert main(["compare", str(a), str(b), "--json", "--html", str(page)]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["changed"] is True and data["only_in"]["b"]["formats"] == ["e5m2"]
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>") and "http" not in html and "<script>" in html
    assert main(["compare", str(a), str(tmp_path / "missing")]) == 2
    assert "no report at" in capsys.readouterr().err


def test_a_reused_folder_loses_only_the_files_fpsim_wrote(runs, tmp_path):
    (report, _), _ = runs
    folder = tmp_path / "out"
    first = report.save(folder)
    figures = [name for name in first if name.endswith(".png")]
    assert len(figures) >= 2
    (folder / "notes.txt").write_text("mine")
    (folder / figures[0]).write_bytes(b"edited by the user")      # no longer the file fpsim wrote
    second = report.save(folder, figures=False)
    assert sorted(second) == ["report.html", "report.json"]
    left = sorted(p.name for p in folder.iterdir())
    assert "notes.txt" in left and figures[0] in left              # the user's files stay
    assert not any(name in left for name in figures[1:])          # fpsim's stale figures go


class Long(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder_with_a_rather_long_name = torch.nn.ModuleDict(
            {"attention_projection_of_the_queries": torch.nn.Linear(4, 4)})

    def forward(self, x):
        return self.encoder_with_a_rather_long_name["attention_projection_of_the_queries"](x)


def test_summary_and_page_show_full_layer_names_and_run_metadata():
    torch.manual_seed(0)
    model = Long()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch(model, formats=("fp16",)) as w:
        for _ in range(2):
            opt.zero_grad()
            model(torch.randn(8, 4)).square().mean().backward()
            opt.step()
    report = w.report()
    name = next(n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear))
    assert len(name) > 60 and name in report.summary_table()
    from fpsim.analyze.html import render_html

    page = render_html(report, {})
    assert name in page and "Long" in report.run["model"]
    assert f"torch {torch.__version__}" in page and f"fpsim {fpsim.__version__}" in page
    assert "fp16 flushed" in page and "data-v=" in page and "http" not in page
