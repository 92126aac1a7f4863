"""Features read off the probes against the model's own parameters.

Source of truth: the presets' documented parameters (docs/tensorcore.md's preset table: F per data
path) and its probe table, which says where the block-size probe cannot tell (Volta fp16 -> fp32:
its half-ulp terms fall outside a 23-bit window).
"""

from __future__ import annotations

import pytest

from fpsim.tensorcore import features

# (device, inputs, output) -> the block size the docs give (F), or None where the probe cannot tell
CASES = {("v100", "fp16", "fp32"): None, ("h100", "e4m3", "fp16"): "32", ("ada", "e4m3", "fp32"): None,
         ("hopper", "e4m3", "fp32"): None, ("h100", "fp16", "fp32"): "16", ("a100", "tf32", "fp32"): "4",
         ("b200", "e4m3", "fp32"): "32"}


@pytest.mark.parametrize("key", CASES, ids=["-".join(k) for k in CASES])
def test_the_block_size_probe_reads_f_or_cannot_tell(key):
    assert features.probe_table(*key).get("block_size", "absent") == CASES[key]


def test_an_order_other_than_blocks_in_k_order_cannot_be_told():
    """Hopper FP8 through binary16 MMAs adds products in 'pairs' order, c last: no F in k order fits."""
    assert features.probe_table("h100", "e4m3", "fp32", path="fp16")["block_size"] is None
