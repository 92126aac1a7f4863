"""Device facts: the instruction table against the PTX ISA and the captures, and instruction shapes in the model.

Sources of truth: the PTX ISA's tables of mma.sync and wgmma shapes per
element type and target (written out by hand below), NVIDIA's compute
capabilities per generation, the instructions recorded in the bundled
captures (the H200's PTX strings, the upstream rows' K), and, for an
instruction shape in the model, the composition of one-instruction dot
products chained through c.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import fpsim
from fpsim.tensorcore import devices
from fpsim.tensorcore.captures import bundled_captures, load_capture
from fpsim.tensorcore.core import TensorCore
from fpsim.tensorcore.validate import guess_device, same_bits

# (generation, inputs) -> shapes, from the PTX ISA ("Matrix shapes" of mma and wgmma): mma.sync
# m16n8k8/k16 f16 and bf16, m16n8k4/k8 tf32 from sm_80 (m16n8k8 f16 from sm_75, m8n8k4 f16 on
# sm_70), e4m3/e5m2 m16n8k16/k32 from sm_89; wgmma m64nNk16 (f16, bf16), k8 (tf32), k32 (FP8) on sm_90a.
PTX = {
    ("volta", "fp16"): {"m8n8k4"},
    ("turing", "fp16"): {"m8n8k4", "m16n8k8"},
    ("ampere", "fp16"): {"m16n8k8", "m16n8k16"}, ("ampere", "bf16"): {"m16n8k8", "m16n8k16"},
    ("ampere", "tf32"): {"m16n8k4", "m16n8k8"},
    ("hopper", "fp16"): {"m16n8k8", "m16n8k16", "m64n8k16"}, ("hopper", "tf32"): {"m16n8k4", "m16n8k8", "m64n8k8"},
    ("ada", "e4m3"): {"m16n8k16", "m16n8k32"}, ("hopper", "e5m2"): {"m16n8k16", "m16n8k32", "m64n8k32"},
    ("blackwell", "e4m3"): {"m16n8k16", "m16n8k32"}, ("blackwell", "bf16"): {"m16n8k8", "m16n8k16"},
}


@pytest.mark.parametrize("gen,inputs", sorted(PTX))
def test_instruction_shapes_are_the_ptx_isas(gen, inputs):
    assert {i.shape for i in devices.instructions(gen, inputs)} == PTX[(gen, inputs)]


def test_generations_of_compute_capabilities():
    known = {(7, 0): "volta", (7, 5): "turing", (8, 0): "ampere", (8, 6): "ampere", (8, 9): "ada",
             (9, 0): "hopper", (10, 0): "blackwell", (12, 0): "blackwell"}
    assert {cc: devices.generation_of(cc) for cc in known} == known
    with pytest.raises(ValueError, match="compute capability"):
        devices.generation_of((6, 1))


@pytest.mark.parametrize("key", sorted(devices.PARAMETERS), ids=lambda k: "-".join(k))
def test_every_preset_runs_an_instruction_of_its_generation(key):
    gen, inputs, output, _ = key
    assert devices.PARAMETERS[key].k in {i.k for i in devices.instructions(gen, inputs, output)}


def test_captured_instructions_are_in_the_table():
    """The H200 kernels' PTX strings, and the K of every upstream row, name instructions of their devices."""
    for gpu, path in bundled_captures().items():
        capture = load_capture(path, check_values=False)
        device = guess_device(capture.meta["gpu"])
        for case in capture.cases:
            meta = case.meta
            if meta["level"] != "instruction":
                continue
            op = devices.instruction(device, meta["inputs"], meta["output"], k=case.k)
            if meta["instruction"].startswith(("mma.sync", "wgmma")):
                shape = re.search(r"m\d+n\d+k\d+", meta["instruction"]).group(0)
                assert devices.instruction(device, meta["inputs"], meta["output"], shape=shape).ptx(meta["output"]) \
                    == meta["instruction"], (gpu, case.name)
            assert op.k == case.k


def test_an_instruction_shape_is_a_chain_of_one_instruction_dots():
    """instruction="m16n8k8" on Hopper (F = 16): each 8 products are one instruction whose result is
    the next one's c, as separate 8-product dot products chained through c compute it."""
    rng = np.random.default_rng(8)
    a = np.asarray(fpsim.quantize(rng.standard_normal((64, 40)) * 2.0 ** rng.integers(-9, 9, (64, 40)), "fp16"),
                   dtype=np.float64)
    b = np.asarray(fpsim.quantize(rng.standard_normal((64, 40)), "fp16"), dtype=np.float64)
    one = TensorCore("h100", "fp16", "fp32")
    d = np.zeros(64)
    for lo in range(0, 40, 8):
        d = np.asarray(one.dot(a[:, lo:lo + 8], b[:, lo:lo + 8], d), dtype=np.float64)
    got = TensorCore("h100", "fp16", "fp32", instruction="m16n8k8").dot(a, b)
    assert same_bits(got, d).all()
    assert not same_bits(one.dot(a, b), d).all()      # the default instruction (k16) adds differently


def test_unknown_instruction_shapes_and_mixes_are_refused():
    with pytest.raises(ValueError, match=r"h100 \(hopper\) has no fp16 -> fp32 MMA instruction of shape m16n8k32; "
                                         r"it has: mma m16n8k16, mma m16n8k8, wgmma m64n8k16"):
        TensorCore("h100", "fp16", "fp32", instruction="m16n8k32")
    with pytest.raises(ValueError, match=r"b200 \(blackwell\) tensor cores do not support fp16 inputs with bf16 for B; "
                                         r".*; mixed input formats \(A and B differing\): e4m3 with e5m2; mxfp8_e4m3 "
                                         r"with mxfp8_e5m2 with mxfp6_e3m2 with mxfp6_e2m3 with mxfp4; supported: "):
        TensorCore("b200", "fp16", "fp32", inputs_b="bf16")
    assert TensorCore("h100", "e4m3", "fp32", inputs_b="e5m2").inputs_b.name == "e5m2"


@pytest.mark.parametrize("name,gen", [("RTX 4090", "ada"), ("rtx4090", "ada"), ("RTX 1000 Ada", "ada"),
                                      ("RTX 3090", "ampere"), ("Titan V", "volta"), ("NVIDIA H100", "hopper"),
                                      ("nvidia_a100", "ampere"), (" Hopper ", "hopper")])
def test_product_names_as_the_docs_spell_them(name, gen):
    """docs/tensorcore.md's Presets section: RTX 4090 and RTX Ada cards are Ada, V100 (Titan V) Volta."""
    assert devices.generation(name) == gen


@pytest.mark.parametrize("device", [None, 100])
def test_a_device_that_is_not_a_string_is_a_type_error(device):
    with pytest.raises(TypeError, match="device must be a str"):
        TensorCore(device, "fp16", "fp32")
