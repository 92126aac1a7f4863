"""The analyzer's scaling-recipe judgement (fpsim.analyze.recipe_probe, recipe_choice).

Sources of truth, never the code under test:
- per-tensor and per-channel FP8: TransformerEngine's scale formula restated
  in numpy float32 arithmetic (scale = fl32(fmt_max / amax), dequantised
  element * fl32(1 / scale)) with the elements cast by ml_dtypes
  (float8_e4m3fn, float8_e5m2) from the exact float64 product;
- block formats: fpsim.exact_blocks, the fraction oracle, block by block;
- the planted tensors' answers follow from their construction (rows that
  span 40 binades cannot all fit E4M3's 18 or E5M2's 32 binades under one
  scale; a block holding 500 under MX's floor rule saturates it to 448);
- the real runs: a small GPT trained with and without the probe (bit-identical
  parameters and RNG state), and its report saved and loaded back.
"""

from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
import torch

import fpsim
from fpsim import cli, exact_blocks
from fpsim.analyze.evidence import FALLBACK_THRESHOLD, threshold
from fpsim.analyze.gpt import GPT, GPTConfig, token_batches
from fpsim.analyze.recipe_choice import FP8_ORDER, judge_recipes
from fpsim.analyze.recipe_probe import CANDIDATE_NAMES, RecipeProbe

E4M3, E5M2 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2
FP8_MAX = {E4M3: 448.0, E5M2: 57344.0}


def oracle_scaled(x: np.ndarray, dtype, axis=None) -> np.ndarray:
    """TE current scaling restated: per tensor (axis None) or per row (axis -1), elements cast by ml_dtypes."""
    amax = np.max(np.abs(x), axis=axis, keepdims=axis is not None).astype(np.float32)
    scale = np.float32(FP8_MAX[dtype]) / amax                               # float32 division: fl32
    elements = (x.astype(np.float64) * scale.astype(np.float64)).astype(dtype).astype(np.float64)
    return elements * (np.float32(1) / scale).astype(np.float64)


def oracle_row_error(x: np.ndarray, q: np.ndarray) -> float:
    """Mean over rows of ||q_r - x_r|| / ||x_r||, in plain numpy."""
    x = x.astype(np.float64)
    return float(np.mean(np.linalg.norm(q - x, axis=1) / np.linalg.norm(x, axis=1)))


def probed(x: np.ndarray, kind: str = "weight", samples: int = 2) -> dict:
    """The probe's shares per candidate for one tensor seen on `samples` sampled steps."""
    probe = RecipeProbe(1, max_elements=1 << 20)       # every value measured
    tensor = torch.from_numpy(x)
    for step in range(samples):
        probe.observe("layer", kind, tensor)
        probe.end_step(step, True)
    return judge_recipes(probe.measurements(), probe.describe(), {"layer": "Linear"}, {})


def rows_spanning_40_binades(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    exponents = np.arange(256) * 40 // 255                                  # row r: values about 2^-k, k = 0..40
    return (rng.standard_normal((256, 256)) * np.exp2(-exponents)[:, None]).astype(np.float32)


def test_rows_of_different_scales_need_per_channel_scaling():
    x = rows_spanning_40_binades()
    section = probed(x)
    entry = section["layers"][0]["kinds"]["weight"]
    loss = {name: v["rel_error"] for name, v in entry["loss"].items()}
    expected = {"current_e4m3": oracle_row_error(x, oracle_scaled(x, E4M3)),
                "current_e5m2": oracle_row_error(x, oracle_scaled(x, E5M2)),
                "per_channel_e4m3": oracle_row_error(x, oracle_scaled(x, E4M3, axis=-1)),
                "per_channel_e5m2": oracle_row_error(x, oracle_scaled(x, E5M2, axis=-1))}
    for name, value in expected.items():
        assert loss[name] == pytest.approx(value, rel=1e-12), name
    # the same tensor on both samples: delayed scaling's history holds its amax, so it scales as current does
    assert loss["delayed_e4m3"] == pytest.approx(expected["current_e4m3"], rel=1e-12)
    assert entry["measured"]["delayed_e4m3"] == 1 and entry["measured"]["current_e4m3"] == 2
    # one scale cannot hold 40 binades (E4M3 keeps about 18, E5M2 about 32): whole rows flush
    assert expected["current_e4m3"] > 0.4 and expected["current_e5m2"] > FALLBACK_THRESHOLD
    assert entry["loss"]["current_e4m3"]["mass_lost_l1"] > 0.4
    assert expected["per_channel_e4m3"] < 0.05 and entry["loss"]["per_channel_e4m3"]["mass_lost_l1"] == 0
    assert entry["needs"] == "per_channel_e4m3"
    assert section["summary"]["by_kind"]["weight"]["recipe"] == "per_channel_e4m3"
    assert section["layers"][0]["threshold"] == FALLBACK_THRESHOLD


def test_a_well_conditioned_tensor_is_served_by_delayed_per_tensor_scaling():
    x = np.random.default_rng(1).standard_normal((256, 192)).astype(np.float32)
    entry = probed(x, kind="activation")["layers"][0]["kinds"]["activation"]
    expected = oracle_row_error(x, oracle_scaled(x, E4M3))
    assert expected < 0.05                                                  # E4M3's 3 mantissa bits: about 2.6%
    assert entry["loss"]["delayed_e4m3"]["rel_error"] == pytest.approx(expected, rel=1e-12)
    assert entry["needs"] == FP8_ORDER[0] == "delayed_e4m3"


def _oracle_blocks(x: np.ndarray, element: str, scale: str, rule: str, size: int, tensor=Fraction(1)):
    """(dequantised values, element-domain magnitudes) of blocks of `size` along the rows, by exact_blocks."""
    q = np.zeros(x.shape)
    element_domain = np.zeros(x.shape)
    for r in range(x.shape[0]):
        for c in range(0, x.shape[1], size):
            block = x[r, c:c + size]
            s, _, values = exact_blocks.quantize_block(block, element, scale, rule, tensor=tensor)
            q[r, c:c + size] = values
            element_domain[r, c:c + size] = [float(abs(Fraction(float(v))) / (s * tensor)) if s else 0.0
                                             for v in block]
    return q, element_domain


@pytest.mark.parametrize("name, element, scale, rule, size", [
    ("mxfp8_e4m3", "e4m3", "e8m0", "floor", 32), ("mxfp4", "e2m1", "e8m0", "floor", 32),
    ("mxfp6_e2m3", "e2m3", "e8m0", "floor", 32), ("block_1x128", "e4m3", "fp32", "nearest", 128)])
def test_block_formats_match_the_fraction_oracle(name, element, scale, rule, size):
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((4, 256)) * np.exp2(rng.integers(-6, 6, size=(4, 256)))).astype(np.float32)
    x[0, 3] = 500.0                     # MX floor rule: scale 2^0 for E4M3, 500 saturates to 448 (clipped)
    entry = probed(x, samples=1)["layers"][0]["kinds"]["weight"]["loss"][name]
    q, element_domain = _oracle_blocks(x, element, scale, rule, size)
    assert entry["rel_error"] == pytest.approx(oracle_row_error(x, q), rel=1e-12)
    limits = fpsim.analyze.FormatLimits.of(element)
    clipped = element_domain > limits.overflow_threshold
    flushed = (q == 0) & (x != 0)
    magnitude = np.abs(x.astype(np.float64))
    expected_clipped = np.mean((magnitude * clipped).sum(axis=1) / magnitude.sum(axis=1))
    expected_lost = np.mean((magnitude * flushed).sum(axis=1) / magnitude.sum(axis=1))
    assert entry["mass_clipped_l1"] == pytest.approx(expected_clipped, rel=1e-12, abs=1e-300)
    assert entry["mass_lost_l1"] == pytest.approx(expected_lost, rel=1e-12, abs=1e-300)
    if name == "mxfp8_e4m3":
        assert expected_clipped > 0      # the planted 500 is past E4M3's threshold 464 at scale 2^0


def test_nvfp4_matches_the_fraction_oracle():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    entry = probed(x, samples=1)["layers"][0]["kinds"]["weight"]["loss"]["nvfp4"]
    tensor = exact_blocks.tensor_scale(max(abs(Fraction(float(v))) for v in x.ravel()))
    q, _ = _oracle_blocks(x, "e2m1", "e4m3", "nearest", 16, tensor=tensor)
    assert entry["rel_error"] == pytest.approx(oracle_row_error(x, q), rel=1e-12)


def test_a_saturated_block_counts_as_clipped_by_construction():
    x = np.ones((1, 32), dtype=np.float32)
    x[0, 0] = 500.0                     # amax 500: MX floor scale 2^(8 - 8) = 1, 500 > 464 saturates to 448
    loss = probed(x, samples=1)["layers"][0]["kinds"]["weight"]["loss"]
    assert loss["mxfp8_e4m3"]["mass_clipped_l1"] == pytest.approx(500 / 531)
    assert loss["mxfp8_e4m3"]["rel_error"] == pytest.approx(52 / math.sqrt(500 ** 2 + 31))
    assert loss["current_e4m3"]["mass_clipped_l1"] == 0                     # current scaling maps 500 to 448


def tiny_gpt_run(recipes_every=None, shadow_every=None, steps=4, out=None):
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=1, n_embd=32, n_head=2, block_size=16, dropout=0.1)
    model = GPT(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with fpsim.watch(model, formats=("e4m3", "e5m2"), recipes_every=recipes_every, shadow_every=shadow_every,
                     out=out) as w:
        for x, y in token_batches(cfg, 4, steps):
            _, loss = model(x, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    assert w.observation_error is None
    return model, optimizer, w


def test_the_probe_never_changes_the_run():
    plain, plain_opt, _ = tiny_gpt_run()
    plain_rng = torch.get_rng_state()
    probed_model, probed_opt, w = tiny_gpt_run(recipes_every=1)
    assert torch.equal(torch.get_rng_state(), plain_rng)
    assert w.recipes.steps == [0, 1, 2, 3] and w.recipes.error is None
    for (name, a), (_, b) in zip(plain.state_dict().items(), probed_model.state_dict().items()):
        assert torch.equal(a, b), name
    for a, b in zip(plain_opt.state_dict()["state"].values(), probed_opt.state_dict()["state"].values()):
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_real_run_gets_a_recipe_table_that_survives_save_and_load(tmp_path):
    _, _, w = tiny_gpt_run(recipes_every=2, shadow_every=2, out=tmp_path)
    report = w.last_report
    section = report.recipes
    assert section["steps"] == [0, 2] and section["every"] == 2
    by_name = {layer["name"]: layer for layer in section["layers"]}
    assert set(by_name["h.0.attn.c_attn"]["kinds"]) == {"activation", "activation_grad", "weight", "weight_grad"}
    assert set(by_name["h.0.ln_1"]["kinds"]) == {"activation", "activation_grad"}    # its 1-D scale is no operand
    for layer in section["layers"]:
        floors = [ev["noise_floor"] for ev in report.shadow_evidence.get(layer["name"], {}).values()]
        if floors and floors[0] is not None:   # tied to the shadow steps' noise floor where one was measured
            assert layer["threshold"] == threshold(floors[0])
            assert layer["threshold_source"].startswith("noise floor")
        for kind, entry in layer["kinds"].items():
            assert set(entry["loss"]) == set(CANDIDATE_NAMES)
            needs = entry["needs"]
            if needs is not None:              # the chosen recipe serves, and every cheaper one does not
                assert entry["loss"][needs]["rel_error"] <= layer["threshold"]
                for cheaper in FP8_ORDER[:FP8_ORDER.index(needs)]:
                    error = entry["loss"][cheaper]["rel_error"]
                    assert not entry["measured"][cheaper] or error > layer["threshold"]
    assert any(l["threshold_source"].startswith("noise floor") for l in section["layers"])
    text = report.summary_table()
    assert "scaling recipes measured on 2 sampled steps" in text
    assert "the cheapest FP8 recipe serving the whole model" in text
    assert "Scaling recipes" in (tmp_path / "report.html").read_text()
    loaded = fpsim.Report.load(tmp_path)
    assert loaded.recipes == report.recipes
    assert loaded.summary_table() == text
    assert loaded.to_json() == report.to_json()
    assert cli.main(["compare", str(tmp_path), str(tmp_path)]) == 0
    assert report.recipe_table() in text


def test_the_table_has_one_row_per_layer_for_repeated_blocks():
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=4, n_embd=32, n_head=2, block_size=16)
    model = GPT(cfg)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with fpsim.watch(model, formats=("e4m3",), recipes_every=1) as w:
        for x, y in token_batches(cfg, 2, 1):
            _, loss = model(x, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    text = w.report().summary_table()
    table = text[text.index("scaling recipes measured"):].splitlines()
    rows = [line for line in table[4:] if line.startswith("  ") and not line.startswith("   ")]
    layers = len(w.report().recipes["layers"])
    assert 0 < len([r for r in rows if "Linear" in r or "LayerNorm" in r or "Embedding" in r]) <= layers


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_bad_recipes_every_is_a_value_error(bad):
    with pytest.raises(ValueError, match="recipes_every"):
        fpsim.watch(torch.nn.Linear(2, 2), recipes_every=bad)


def test_pairs_beyond_the_per_step_budget_take_turns():
    probe = RecipeProbe(1, max_tensors=2)
    x = torch.from_numpy(np.random.default_rng(4).standard_normal((4, 32)).astype(np.float32))
    for step in range(4):
        for layer in "abcde":
            probe.observe(layer, "activation", x.clone())
        probe.end_step(step, True)
    tensors = {name: probe.tensors.get((name, "activation"), 0) for name in "abcde"}
    # step 0: a, b (the first two seen); then groups of two in turn: c, d; e; a, b
    assert tensors == {"a": 2, "b": 2, "c": 1, "d": 1, "e": 1}


def test_the_summary_names_the_costliest_need_and_the_layers_forcing_it():
    from fpsim.analyze.recipe_choice import summarize

    def layer(name, needs, narrowest="mxfp4"):
        return {"name": name, "kinds": {"weight": {"needs": needs, "narrowest": narrowest}}}

    summary = summarize([layer("a", "delayed_e4m3"), layer("b", "per_channel_e4m3", "nvfp4"),
                         layer("c", "delayed_e4m3")])
    assert summary["by_kind"]["weight"] == {"recipe": "per_channel_e4m3", "forced_by": ["b"], "layers": 3,
                                            "narrowest": "nvfp4"}
    assert summary["model"] == "per_channel_e4m3" and summary["model_forced_by"] == ["b"]
    alike = summarize([layer("a", "current_e4m3"), layer("b", "current_e4m3")])
    assert alike["by_kind"]["weight"]["forced_by"] == []              # nobody forces what everyone needs
    unserved = summarize([layer("a", "current_e4m3"), layer("b", None, None)])
    assert unserved["by_kind"]["weight"]["recipe"] is None and unserved["by_kind"]["weight"]["forced_by"] == ["b"]
    assert unserved["model"] is None
