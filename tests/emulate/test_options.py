"""fpsim.emulate's options: bad input is refused up front, and from_report applies a report exactly.

Sources of truth: the report.json schema of docs/analyzer.md, read here with the json module
from a report that fpsim.watch wrote for a real run, and the options' documented meaning
(an explicit keep/loss_scale run must equal the report-driven one).
"""

from __future__ import annotations

import fractions
import json

import numpy as np
import pytest
import torch

import fpsim
from emulate_helpers import TINY, assert_same_steps, emulated, gpt, train, twin
from fpsim.analyze.gpt import GPTConfig
from fpsim.emulate import AutocastRecipe, FP8Recipe


@pytest.fixture(scope="module")
def model():
    return gpt(TINY["bf16"])


@pytest.mark.parametrize("kwargs, error, message", [
    ({"recipe": "fp4"}, ValueError, "unknown recipe 'fp4'; known: fp32, fp16, bf16, fp8, fp8-e4m3"),
    ({"recipe": 16}, TypeError, "recipe must be a name"),
    ({"loss_scale": 0}, ValueError, "loss_scale must be a positive finite number or None, got 0"),
    ({"loss_scale": float("inf")}, ValueError, "loss_scale must be a positive finite number"),
    ({"loss_scale": True}, ValueError, "loss_scale must be a positive finite number"),
    ({"loss_scale": np.bool_(True)}, ValueError, "loss_scale must be a positive finite number"),
    ({"loss_scale": np.float32("inf")}, ValueError, "loss_scale must be a positive finite number"),
    ({"loss_scale": "1024"}, ValueError, "loss_scale must be a positive finite number"),
    ({"policy": "tpu"}, ValueError, "policy must be one of cuda, cpu, got 'tpu'"),
    ({"master_weights": "no"}, TypeError, "master_weights must be True or False"),
    ({"keep": ["h.9"]}, ValueError, "keep: 'h.9' is no module of GPT; its modules: GPT, wte"),
    ({"keep": ["h.0.attn:softmaxx"]}, ValueError, "'softmaxx' in 'h.0.attn:softmaxx' is not an aten op"),
    ({"keep": [torch.nn.Conv2d]}, ValueError, "GPT has no module of type Conv2d"),
    ({"keep": [3]}, TypeError, "keep entries must be module names, Module:op names or module types, got int 3"),
    ({"layers": ["h.0:mul"]}, ValueError, "layers takes modules, not ops: 'h.0:mul'"),
    ({"device": "v100"}, ValueError, "bf16"),
    ({"device": "h100", "recipe": "fp32"}, ValueError, "recipe fp32 has none"),
    ({"from_report": "/nonexistent/report.json"}, ValueError, "from_report: cannot read '/nonexistent/report.json'"),
])
def test_bad_options_are_refused_before_anything_runs(model, kwargs, error, message):
    kwargs = {"recipe": "bf16", **kwargs}
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        fpsim.emulate(model, **kwargs)


@pytest.mark.parametrize("scale", [np.float32(1024), np.int64(1024), np.float16(1024), fractions.Fraction(1024)])
def test_a_loss_scale_may_be_any_real_number(model, scale):
    """Source: the documented option (a positive number): numpy's scalars are numbers.Real as Python's are."""
    em = fpsim.emulate(model, "fp16", loss_scale=scale)
    assert em.loss_scale == 1024.0 and type(em.loss_scale) is float


def test_fast_accumulation_takes_one_gemm_name_as_a_string():
    """Source: the docstring (the GEMMs fprop, dgrad, wgrad); a string names one GEMM, not its letters."""
    assert FP8Recipe(fast_accumulation="wgrad").fast_accumulation == ("wgrad",)
    assert FP8Recipe(fast_accumulation="fprop") == FP8Recipe(fast_accumulation=["fprop"]) == FP8Recipe()
    assert FP8Recipe(fast_accumulation=()).fast_accumulation == ()


def test_a_model_must_be_a_module():
    with pytest.raises(TypeError, match="model must be a torch.nn.Module, got function"):
        fpsim.emulate(lambda x: x, "bf16")


@pytest.mark.parametrize("make, message", [
    (lambda: AutocastRecipe("fp8"), "AutocastRecipe format must be one of fp16, bf16, got 'fp8'"),
    (lambda: FP8Recipe(base="tf32"), "FP8Recipe base must be one of bf16, fp16, fp32, got 'tf32'"),
    (lambda: FP8Recipe(scaling="delayed"), "FP8Recipe scaling must be a scaling object"),
    (lambda: FP8Recipe(fast_accumulation=("forward",)), "fast_accumulation takes fprop, dgrad, wgrad"),
    (lambda: FP8Recipe(fast_accumulation="fprop_"),
     r"fast_accumulation takes fprop, dgrad, wgrad, got unknown \['fprop_'\]"),
    (lambda: FP8Recipe(fast_accumulation=3),
     "fast_accumulation takes a GEMM name or names (fprop, dgrad, wgrad), got 3"),
    (lambda: FP8Recipe(promote_every=0), "promote_every must be a positive int, got 0"),
])
def test_bad_recipes_are_refused(make, message):
    with pytest.raises((ValueError, TypeError), match=message.replace("(", r"\(").replace(")", r"\)")):
        make()


def test_recipe_objects_need_no_torch():
    import subprocess
    import sys

    code = ("import sys, fpsim; r = fpsim.emulate.FP8Recipe(fpsim.emulate.CurrentScaling()); "
            "print(r.name, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["fp8-current-e4m3", "False"]


def _write(path, content):
    path.write_text(content)
    return str(path)


@pytest.mark.parametrize("content, message", [
    ("not json", "is not JSON"),
    (json.dumps({"schema": "something/1"}), "is not an fpsim report (schema 'something/1'"),
    (json.dumps({"schema": "fpsim.analyze.report/2", "formats": [{"name": "e4m3"}]}),
     "the report has no verdicts for bf16; it judged e4m3"),
])
def test_unusable_reports_are_refused(model, tmp_path, content, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        fpsim.emulate(model, "bf16", from_report=_write(tmp_path / "report.json", content))


@pytest.fixture(scope="module")
def planted_report(tmp_path_factory):
    """A real report of a GPT whose attention logits overflow FP16 (fpsim.watch, docs/analyzer.md's example)."""
    cfg = GPTConfig(n_layer=1, n_embd=16, n_head=2, block_size=8, vocab_size=16, logit_gain=1e6)
    model = gpt(cfg)
    folder = tmp_path_factory.mktemp("report")
    with fpsim.watch(model, formats=("fp16", "bf16", "e4m3", "e5m2")) as w:
        train(model, cfg, 3)
    w.report().save(str(folder), figures=False)
    return cfg, str(folder)


def test_from_report_keeps_exactly_what_the_report_judges_fp32(planted_report):
    cfg, folder = planted_report
    with open(f"{folder}/report.json") as f:
        report = json.load(f)
    fp32 = [entry["name"] for entry in report["layers"] if entry["verdicts"]["fp16"] == "fp32"]
    assert any(":" in name for name in fp32)                      # the planted attention ops are among them
    model = gpt(cfg)
    em = fpsim.emulate(model, "fp16", from_report=folder)
    modules = {name for name in fp32 if ":" not in name}
    ops: dict = {}
    for name in fp32:
        if ":" in name:
            module, op = name.rsplit(":", 1)
            ops.setdefault(op, set()).add(module)
    assert em.selection.kept_modules == {"" if m == "GPT" else m for m in modules}
    assert em.selection.kept_ops == ops
    assert em.loss_scale == report["loss_scale"]["fp16"]["recommended"]
    by_report, _ = emulated(twin(model), cfg, 2, "fp16", from_report=folder)
    by_hand, _ = emulated(twin(model), cfg, 2, "fp16", keep=fp32, loss_scale=em.loss_scale)
    assert_same_steps(by_report, by_hand)


def test_from_report_with_an_explicit_loss_scale_keeps_the_users_scale(planted_report):
    cfg, folder = planted_report
    em = fpsim.emulate(gpt(cfg), "fp16", from_report=folder, loss_scale=8.0)
    assert em.loss_scale == 8.0


def test_from_report_for_fp8_keeps_layers_judged_fp32_in_e4m3_or_e5m2_out_of_fp8(planted_report):
    """A layer, or an op of a linear layer, judged fp32 in a format of the recipe: it runs in bf16, not FP8."""
    cfg, folder = planted_report
    with open(f"{folder}/report.json") as f:
        report = json.load(f)
    model = gpt(cfg)
    modules = dict(model.named_modules())
    judged = [e["name"] for e in report["layers"] if "fp32" in (e["verdicts"]["e4m3"], e["verdicts"]["e5m2"])]
    out = {n for n in judged if ":" not in n} | {n.split(":")[0] for n in judged
                                                 if ":" in n and isinstance(modules[n.split(":")[0]], torch.nn.Linear)}
    with fpsim.emulate(model, "fp8", from_report=folder) as em:
        pass
    linears = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert set(em.fp8_layers) == {n for n in linears if not any(n == o or n.startswith(o + ".") for o in out)}
