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
# On sm_90 (nvcc 13.0) an FP8 mma.sync is compiled to byte-pair conversions to
# binary16 (F2FP.UNPACK_B) and two chained binary16 MMAs from zero, with c added
# afterwards: products with k mod 4 in {0, 1} go first (seen in the SASS and the
# captures, docs/tensorcore.md).
_FP8_AS_FP16 = dict(block_size=16, extra_bits=2, instruction_k=32, k_order="pairs", c_position="last")

PATHS = ("native", "fp16")
"""How FP8 products reach the tensor core: "native" FP8 MMAs (wgmma on Hopper,
what cuBLAS uses) or "fp16", through binary16 MMAs (FP8 mma.sync on Hopper and
Blackwell as nvcc 13.0 compiles it). Other input formats have one path, "native"."""


def _table() -> dict:
    """(generation, inputs, output, path) -> BlockFMA."""
    t = {}

    def put(gen, inputs, min32=-1024, min16=-1024, path="native", **kw):
        t[(gen, inputs, "fp32", path)] = BlockFMA(**{**_FP32_RZ, "min_align_exp": min32, **kw})
        if inputs == "fp16" or (inputs in ("e4m3", "e5m2") and gen == "ada"):
            t[(gen, inputs, "fp16", path)] = BlockFMA(**{**_FP16_RN, "min_align_exp": min16, **kw})

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
        t[("hopper", inputs, "fp16", "native")] = BlockFMA(**_FP16_RN, block_size=32, extra_bits=-10,
                                                           min_align_exp=-21)
        put("blackwell", inputs, block_size=32, extra_bits=8, rounding="nearest_even", min32=-133)
        t[("hopper", inputs, "fp32", "fp16")] = BlockFMA(**_FP32_RZ, **_FP8_AS_FP16, min_align_exp=-133)
        for gen in ("hopper", "blackwell"):
            t[(gen, inputs, "fp16", "fp16")] = BlockFMA(**_FP16_RN, **_FP8_AS_FP16, min_align_exp=-21)
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


def supported(device: str) -> list[tuple[str, str, str]]:
    """The (inputs, output, path) combinations a device's tensor cores support."""
    gen = generation(device)
    return sorted((i, o, p) for (g, i, o, p) in PARAMETERS if g == gen)


def parameters(device: str, inputs: str, output: str, path: str | None = None, **overrides) -> BlockFMA:
    """The block-FMA parameters of a device for an input format, output format and path.

    path None takes "native" where the device has it, else its only path.
    """
    gen = generation(device)
    if path is not None and path not in PATHS:
        raise ValueError(f"unknown path {path!r}; allowed: {', '.join(PATHS)}")
    paths = [p for (g, i, o, p) in PARAMETERS if (g, i, o) == (gen, inputs, output)]
    if not paths or (path is not None and path not in paths):
        combos = ", ".join(f"{i}->{o} ({p})" for i, o, p in supported(device))
        wanted = f"{inputs} inputs with {output} output" + (f" on the {path} path" if path else "")
        raise ValueError(f"{device} ({gen}) tensor cores do not support {wanted}; supported: {combos}")
    chosen = path or ("native" if "native" in paths else paths[0])
    params = PARAMETERS[(gen, inputs, output, chosen)]
    if chosen == "fp16" and "instruction_k" in overrides and "block_size" not in overrides:
        # an FP8 instruction of k products runs as two binary16 MMAs of k/2 each
        overrides = {**overrides, "block_size": overrides["instruction_k"] // 2}
    return dataclasses.replace(params, **overrides) if overrides else params
