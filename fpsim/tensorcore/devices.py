"""Device presets: which block-FMA parameters each GPU uses for each input and output format.

The parameters come from the published models (Fasi et al. 2021; Khattak and
Mikaitis, ACM TACO 2025) and were checked bit for bit against real captures
(see docs/tensorcore.md): the captures are the truth.
"""

from __future__ import annotations

import dataclasses

from .blockfma import BlockFMA

GENERATIONS = ("volta", "turing", "ampere", "ada", "hopper", "blackwell")

# product name -> generation
DEVICES = {
    "v100": "volta", "titan-v": "volta",
    "t4": "turing", "rtx2080": "turing", "rtx2080ti": "turing",
    "a100": "ampere", "a30": "ampere", "a2": "ampere", "a40": "ampere", "a10": "ampere", "rtx3090": "ampere",
    "l40s": "ada", "l40": "ada", "l4": "ada", "rtx4090": "ada", "rtx6000-ada": "ada", "rtx4000-ada": "ada",
    "rtx1000-ada": "ada",
    "h100": "hopper", "h200": "hopper", "gh200": "hopper", "h800": "hopper",
    "b200": "blackwell", "b100": "blackwell", "gb200": "blackwell",
}

_FP32_RZ = dict(output="fp32", rounding="toward_zero")
_FP16_RN = dict(output="fp16", rounding="nearest_even")
# FP8 MMAs with a binary16 accumulator run as two binary16 MMAs (found in the captures)
_FP8_VIA_FP16 = dict(block_size=16, extra_bits=2, instruction_k=32, k_order="pairs", c_position="last")


def _table() -> dict:
    """(generation, inputs, output) -> BlockFMA."""
    t = {}

    def put(gen, inputs, min32=-1024, min16=-1024, **kw):
        t[(gen, inputs, "fp32")] = BlockFMA(**{**_FP32_RZ, "min_align_exp": min32, **kw})
        if inputs == "fp16" or (inputs in ("e4m3", "e5m2") and gen == "ada"):
            t[(gen, inputs, "fp16")] = BlockFMA(**{**_FP16_RN, "min_align_exp": min16, **kw})

    put("volta", "fp16", block_size=4, extra_bits=0, min16=-19)
    put("turing", "fp16", block_size=4, extra_bits=0, min16=-19)  # as Volta (Fasi et al. 2021 measured T4 = V100)
    for gen in ("ampere", "ada"):
        put(gen, "fp16", block_size=8, extra_bits=1, min32=-132, min16=-20)
        put(gen, "bf16", block_size=8, extra_bits=1, min32=-132)
        put(gen, "tf32", block_size=4, extra_bits=1, min32=-132)
    for inputs in ("e4m3", "e5m2"):
        put("ada", inputs, block_size=16, extra_bits=-10, min32=-132, min16=-20)
    for gen in ("hopper", "blackwell"):
        put(gen, "fp16", block_size=16, extra_bits=2, min32=-133, min16=-21)
        put(gen, "bf16", block_size=16, extra_bits=2, min32=-133)
        put(gen, "tf32", block_size=8, extra_bits=2, min32=-133)
    for inputs in ("e4m3", "e5m2"):
        put("hopper", inputs, block_size=32, extra_bits=-10, min32=-133)
        put("blackwell", inputs, block_size=32, extra_bits=8, rounding="nearest_even", min32=-133)
        for gen in ("hopper", "blackwell"):
            t[(gen, inputs, "fp16")] = BlockFMA(**_FP16_RN, **_FP8_VIA_FP16, min_align_exp=-21)
    return t


PARAMETERS = _table()


def generation(device: str) -> str:
    """The generation of a product or generation name (case-insensitive)."""
    key = device.strip().lower().replace(" ", "-").replace("_", "-")
    key = key.removeprefix("nvidia-")
    if key in GENERATIONS:
        return key
    if key in DEVICES:
        return DEVICES[key]
    raise ValueError(f"unknown device {device!r}; allowed: {', '.join(sorted(DEVICES))} "
                     f"or a generation: {', '.join(GENERATIONS)}")


def supported(device: str) -> list[tuple[str, str]]:
    """The (inputs, output) pairs a device's tensor cores support."""
    gen = generation(device)
    return sorted((i, o) for (g, i, o) in PARAMETERS if g == gen)


def parameters(device: str, inputs: str, output: str, **overrides) -> BlockFMA:
    """The block-FMA parameters of a device for an input and output format, with optional overrides."""
    gen = generation(device)
    key = (gen, inputs, output)
    if key not in PARAMETERS:
        pairs = ", ".join(f"{i}->{o}" for i, o in supported(device))
        raise ValueError(f"{device} ({gen}) tensor cores do not support {inputs} inputs with {output} output; "
                         f"supported: {pairs}")
    params = PARAMETERS[key]
    return dataclasses.replace(params, **overrides) if overrides else params
