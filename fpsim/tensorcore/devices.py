"""Device facts as data: generations, products, MMA instruction shapes and block-FMA parameters.

Every fact about a GPU's tensor cores lives here, once: which input and
output formats each generation takes, which MMA instructions it runs (kind,
shape, formats), and the block-FMA parameters of each data path. The model
(`core.TensorCore`), the probes, the capture tool and tools/ read them from
here. The parameters come from the published models (Fasi et al. 2021;
Khattak and Mikaitis, ACM TACO 2025) and were checked bit for bit against real
captures (docs/tensorcore.md): the captures are the truth.
"""

from __future__ import annotations

import dataclasses
import re

from ..blocks import BLOCK_PRESETS, BlockFormat
from ..formats import format as get_format
from .blockfma import OUTPUTS, BlockFMA

GENERATIONS = ("volta", "turing", "ampere", "ada", "hopper", "blackwell")

COMPUTE_CAPABILITY = {"volta": (7, 0), "turing": (7, 5), "ampere": (8, 0), "ada": (8, 9), "hopper": (9, 0),
                      "blackwell": (10, 0)}
"""The first compute capability of each generation (sm_86 is still Ampere, sm_120 Blackwell)."""

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

INPUT_GROUPS = (("fp16",), ("bf16",), ("tf32",), ("e4m3", "e5m2"),
                ("mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4"), ("nvfp4",))
"""The input formats of the tensor cores; formats of one group may be mixed in one
instruction (A in e4m3, B in e5m2; A in MXFP8, B in MXFP4). The last two groups are
block formats (fpsim.blocks presets): elements with one scale per block along K."""
INPUT_FORMATS = tuple(name for group in INPUT_GROUPS for name in group)
FP8_INPUTS = INPUT_GROUPS[3]
BLOCK_INPUTS = INPUT_GROUPS[4] + INPUT_GROUPS[5]
"""The block input formats: their data paths are block-scaled MMA kinds (`BLOCK_KINDS`)."""
OUTPUT_FORMATS = OUTPUTS
"""Accumulator formats (C and D of an instruction), the block-FMA engine's outputs."""

PATHS = ("native", "fp16")
"""How FP8 products reach the tensor core: "native" FP8 MMAs (wgmma on Hopper,
what cuBLAS uses) or "fp16", through binary16 MMAs (FP8 mma.sync on Hopper and
Blackwell as nvcc 13.0 compiles it). Other input formats have one path, "native"."""


# ------------------------------------------------------------------ instructions
@dataclasses.dataclass(frozen=True)
class BlockScaleKind:
    """A block-scaled MMA kind of the PTX ISA ("Block Scaling for mma.sync", tables 35 and 36):
    D = (A * scale_A) (B * scale_B) + C, one scale per `block` elements of K of each row of A
    and each column of B.

    name: the .kind qualifier; scale: the scale's format (PTX .ue8m0 = E8M0, .ue4m3 = E4M3
    without its sign).
    """

    name: str
    scale: str
    block: int

    def scale_vec(self, k: int) -> str:
        """The .scale_vec qualifier for an instruction of k products: scales per row of A."""
        return f"scale_vec::{k // self.block}X"


BLOCK_KINDS = {"mxf8f6f4": BlockScaleKind("mxf8f6f4", "e8m0", 32),
               "mxf4": BlockScaleKind("mxf4", "e8m0", 32),
               "mxf4nvf4": BlockScaleKind("mxf4nvf4", "e4m3", 16)}


@dataclasses.dataclass(frozen=True)
class Instruction:
    """One MMA instruction of the PTX ISA: D (m x n) = A (m x k) B (k x n) + C.

    kind: "mma" (mma.sync, one warp) or "wgmma" (wgmma.mma_async, one warpgroup).
    outputs: the accumulator formats it takes (C = D); generations: where it runs.
    block_kind: for block formats, the PTX block-scaled kind (`BLOCK_KINDS`).
    compute_capability: the lowest compute capability that runs it when that is above its
        first generation's (mma with block scaling: sm_120a; ptxas 13.0 refuses it for
        sm_100a and sm_103a, whose block-scaled MMAs are tcgen05.mma, not modelled as an
        instruction here).
    """

    kind: str
    m: int
    n: int
    k: int
    inputs: str
    outputs: tuple[str, ...]
    generations: tuple[str, ...]
    block_kind: str | None = None
    compute_capability: tuple[int, int] | None = None

    @property
    def shape(self) -> str:
        return f"m{self.m}n{self.n}k{self.k}"

    @property
    def scaling(self) -> BlockScaleKind | None:
        return BLOCK_KINDS[self.block_kind] if self.block_kind else None

    def kernel(self, output: str) -> str:
        """The name of the capture tool's kernel for this instruction (fpsim/tensorcore/cuda/*.cu)."""
        if self.block_kind is not None:
            return f"{self.kind}_{self.shape}_{_PTX_TYPES[output]}_{self.block_kind}_{self.element}"
        return f"{self.kind}_{self.shape}_{_PTX_TYPES[output]}_{_PTX_TYPES[self.inputs]}"

    @property
    def element(self) -> str:
        """The format of A's and B's elements: the inputs, or a block format's element."""
        return block_format(self.inputs).element.name if self.block_kind is not None else self.inputs

    def ptx(self, output: str) -> str:
        """The PTX instruction, with A row-major and B column-major for mma.sync."""
        d = _PTX_TYPES[output]
        if self.block_kind is not None:
            kind, element = self.scaling, self.element
            stype = "ue8m0" if kind.scale == "e8m0" else "ue4m3"
            return (f"mma.sync.aligned.{self.shape}.row.col.kind::{kind.name}.block_scale.{kind.scale_vec(self.k)}"
                    f".{d}.{element}.{element}.{d}.{stype}")
        t = _PTX_TYPES[self.inputs]
        if self.kind == "mma":
            return f"mma.sync.aligned.{self.shape}.row.col.{d}.{t}.{t}.{d}"
        return f"wgmma.mma_async.sync.aligned.{self.shape}.{d}.{t}.{t}"


_PTX_TYPES = {"fp32": "f32", "fp16": "f16", "bf16": "bf16", "tf32": "tf32", "e4m3": "e4m3", "e5m2": "e5m2"}
_FROM = {gen: GENERATIONS[i:] for i, gen in enumerate(GENERATIONS)}  # a generation and its successors


def _instructions() -> tuple[Instruction, ...]:
    both, fp32 = OUTPUT_FORMATS, ("fp32",)
    fp8 = FP8_INPUTS
    mma = [Instruction("mma", 8, 8, 4, "fp16", both, ("volta", "turing")),
           Instruction("mma", 16, 8, 16, "fp16", both, _FROM["ampere"]),
           Instruction("mma", 16, 8, 8, "fp16", both, _FROM["turing"]),
           Instruction("mma", 16, 8, 16, "bf16", fp32, _FROM["ampere"]),
           Instruction("mma", 16, 8, 8, "bf16", fp32, _FROM["ampere"]),
           Instruction("mma", 16, 8, 8, "tf32", fp32, _FROM["ampere"]),
           Instruction("mma", 16, 8, 4, "tf32", fp32, _FROM["ampere"])]
    for name in fp8:
        mma += [Instruction("mma", 16, 8, 32, name, both, _FROM["ada"]),
                Instruction("mma", 16, 8, 16, name, fp32, _FROM["ada"])]
    wgmma = [Instruction("wgmma", 64, 8, 16, "fp16", both, ("hopper",)),
             Instruction("wgmma", 64, 8, 16, "bf16", fp32, ("hopper",)),
             Instruction("wgmma", 64, 8, 8, "tf32", fp32, ("hopper",))]
    wgmma += [Instruction("wgmma", 64, 8, 32, name, both, ("hopper",)) for name in fp8]
    sm120 = dict(generations=("blackwell",), compute_capability=(12, 0))
    # mxfp4's own kind (k = 64) before its mxf8f6f4 form: the first is the preset's instruction
    scaled = [Instruction("mma", 16, 8, 64, "mxfp4", fp32, block_kind="mxf4", **sm120),
              Instruction("mma", 16, 8, 64, "nvfp4", fp32, block_kind="mxf4nvf4", **sm120)]
    scaled += [Instruction("mma", 16, 8, 32, name, fp32, block_kind="mxf8f6f4", **sm120) for name in INPUT_GROUPS[4]]
    return tuple(mma + wgmma + scaled)


INSTRUCTIONS = _instructions()
"""The MMA instructions fpsim models (and `fpsim capture` records: one kernel each
from Ampere on)."""


# ------------------------------------------------------------- block-FMA parameters
_FP32_RZ = dict(output="fp32", rounding="toward_zero")
_FP16_RN = dict(output="fp16", rounding="nearest_even")
# On sm_90 (nvcc 13.0) an FP8 mma.sync is compiled to byte-pair conversions to
# binary16 (F2FP.UNPACK_B) and two chained binary16 MMAs from zero, with c added
# afterwards: products with k mod 4 in {0, 1} go first (seen in the SASS and the
# captures, docs/tensorcore.md).
_FP8_AS_FP16 = dict(block_size=16, extra_bits=2, instruction_k=32, k_order="pairs", c_position="last")


def _table() -> dict:
    """(generation, inputs, output, path) -> BlockFMA; instruction_k: the default instruction's k."""
    t = {}

    def put(gen, inputs, k, min32=-1024, min16=-1024, path="native", **kw):
        t[(gen, inputs, "fp32", path)] = BlockFMA(**{**_FP32_RZ, "min_align_exp": min32, "instruction_k": k, **kw})
        if inputs == "fp16" or (inputs in FP8_INPUTS and gen == "ada"):
            t[(gen, inputs, "fp16", path)] = BlockFMA(**{**_FP16_RN, "min_align_exp": min16, "instruction_k": k, **kw})

    put("volta", "fp16", 4, block_size=4, extra_bits=0, min16=-19)
    put("turing", "fp16", 4, block_size=4, extra_bits=0, min16=-19)  # as Volta (Fasi et al. 2021 measured T4 = V100)
    for gen in ("ampere", "ada"):
        put(gen, "fp16", 8, block_size=8, extra_bits=1, min32=-132, min16=-20)
        put(gen, "bf16", 8, block_size=8, extra_bits=1, min32=-132)
        put(gen, "tf32", 4, block_size=4, extra_bits=1, min32=-132)
    for inputs in FP8_INPUTS:
        put("ada", inputs, 32, block_size=16, extra_bits=-10, min32=-132, min16=-20)
    for gen in ("hopper", "blackwell"):
        put(gen, "fp16", 16, block_size=16, extra_bits=2, min32=-133, min16=-21)
        put(gen, "bf16", 16, block_size=16, extra_bits=2, min32=-133)
        put(gen, "tf32", 8, block_size=8, extra_bits=2, min32=-133)
    for inputs in FP8_INPUTS:
        put("hopper", inputs, 32, block_size=32, extra_bits=-10, min32=-133)
        t[("hopper", inputs, "fp16", "native")] = BlockFMA(**_FP16_RN, block_size=32, extra_bits=-10,
                                                           min_align_exp=-21, instruction_k=32)
        put("blackwell", inputs, 32, block_size=32, extra_bits=8, rounding="nearest_even", min32=-133)
        t[("hopper", inputs, "fp32", "fp16")] = BlockFMA(**_FP32_RZ, **_FP8_AS_FP16, min_align_exp=-133)
        for gen in ("hopper", "blackwell"):
            t[(gen, inputs, "fp16", "fp16")] = BlockFMA(**_FP16_RN, **_FP8_AS_FP16, min_align_exp=-21)
    # Block-scaled kinds: a hypothesis, the Blackwell FP8 path (B200 rows: nearest, >= 8 extra
    # bits, one block per instruction) with each product carrying its two block scales
    # (UNVALIDATED). FP4 kinds take 64 products per instruction, one block.
    for inputs in BLOCK_INPUTS:
        k = next(i.k for i in INSTRUCTIONS if i.inputs == inputs)
        put("blackwell", inputs, k, block_size=k, extra_bits=8, rounding="nearest_even", min32=-133)
    return t


PARAMETERS = _table()

UNVALIDATED = {key: ("not yet validated: no capture of a block-scaled MMA exists; the parameters are the "
                     "B200 FP8 path's, the scales' place in the product a hypothesis (docs/tensorcore.md)")
               for key in PARAMETERS if key[1] in BLOCK_INPUTS}
"""(generation, inputs, output, path) -> why its parameters are a hypothesis: data paths no
capture has checked. TensorCore.unvalidated and its repr say so."""


# ------------------------------------------------------------------------ look-ups
def _name_key(name: str) -> str:
    """A device name without case, spaces, '-', '_' or a leading "NVIDIA": "RTX 4090",
    "rtx-4090" and "NVIDIA_RTX4090" are one key."""
    key = re.sub(r"[\s_-]+", "", name.lower())
    return key.removeprefix("nvidia")


_BY_KEY = {**{_name_key(name): gen for name, gen in DEVICES.items()}, **{gen: gen for gen in GENERATIONS}}
"""Normalised product and generation names -> generation."""


def generation(device: str) -> str:
    """The generation of a product or generation name, spelt in any case, with or without spaces,
    '-' or '_' and a leading "NVIDIA" ("RTX 4090", "rtx4090", "NVIDIA H100", "Titan V")."""
    if not isinstance(device, str):
        raise TypeError(f"device must be a str (a product or generation name such as 'h100' or 'hopper'), "
                        f"got {type(device).__name__} {device!r}")
    key = _name_key(device)
    if key in _BY_KEY:
        return _BY_KEY[key]
    raise ValueError(f"unknown device {device!r}; allowed: {', '.join(sorted(DEVICES))} "
                     f"or a generation: {', '.join(GENERATIONS)}")


def generation_of(compute_capability: tuple[int, int]) -> str:
    """The generation of a compute capability such as (9, 0); ValueError before Volta."""
    older = [gen for gen in GENERATIONS if COMPUTE_CAPABILITY[gen] <= tuple(compute_capability)]
    if not older:
        raise ValueError(f"compute capability {compute_capability} has no tensor cores fpsim models "
                         f"(Volta, 7.0, is the first)")
    return older[-1]


def supported(device: str) -> list[tuple[str, str, str]]:
    """The (inputs, output, path) combinations a device's tensor cores support."""
    gen = generation(device)
    return sorted((i, o, p) for (g, i, o, p) in PARAMETERS if g == gen)


def input_formats(device: str) -> list[str]:
    """The input formats a device's tensor cores take (block formats included), in the order of
    `INPUT_FORMATS`."""
    gen = generation(device)
    taken = {i for (g, i, o, p) in PARAMETERS if g == gen}
    return [name for name in INPUT_FORMATS if name in taken]


def _what_it_takes(device: str) -> str:
    """A device's input formats, the ones it mixes and its (inputs, output, path) combinations, for
    the errors that refuse what it does not take."""
    formats = input_formats(device)
    groups = [[name for name in group if name in formats] for group in INPUT_GROUPS]
    mixable = "; ".join(" with ".join(group) for group in groups if len(group) > 1) or "none"
    combos = ", ".join(f"{i}->{o} ({p})" for i, o, p in supported(device))
    return (f"input formats: {', '.join(formats)}; mixed input formats (A and B differing): {mixable}; "
            f"supported: {combos}")


def check_inputs(device: str, inputs: str, inputs_b: str) -> None:
    """A and B formats one instruction of the device can take together: one format (whether the
    device takes it is `parameters`' to say, with the output) or two of one group of
    `INPUT_GROUPS` (FP8, MX). ValueError otherwise, with what the device takes."""
    if inputs == inputs_b or any(inputs in group and inputs_b in group for group in INPUT_GROUPS):
        return
    raise ValueError(f"{device} ({generation(device)}) tensor cores do not support {inputs} inputs with {inputs_b} "
                     f"for B; {_what_it_takes(device)}")


def instructions(device: str, inputs: str | None = None, output: str | None = None) -> list[Instruction]:
    """The MMA instructions a device runs, optionally only those for an input and an output format."""
    gen = generation(device)
    return [i for i in INSTRUCTIONS if gen in i.generations and inputs in (None, i.inputs)
            and output in (None, *i.outputs)]


def instruction(device: str, inputs: str, output: str, shape: str | None = None, k: int | None = None) -> Instruction:
    """The device's instruction of a shape ("m16n8k8") or of k products, for these formats."""
    found = [i for i in instructions(device, inputs, output) if shape in (None, i.shape) and k in (None, i.k)]
    if not found:
        have = ", ".join(f"{i.kind} {i.shape}" for i in instructions(device, inputs, output)) or "none"
        wanted = f"shape {shape}" if shape is not None else f"k = {k}"
        raise ValueError(f"{device} ({generation(device)}) has no {inputs} -> {output} MMA instruction of {wanted}; "
                         f"it has: {have}")
    return found[0]


def parameters(device: str, inputs: str, output: str, path: str | None = None, instruction_shape: str | None = None,
               **overrides) -> BlockFMA:
    """The block-FMA parameters of a device for an input format, output format and path.

    path None takes "native" where the device has it, else its only path.
    instruction_shape ("m16n8k8"): one of the device's instructions, whose k
    products make one instruction (default: the preset's).
    """
    gen = generation(device)
    if path is not None and path not in PATHS:
        raise ValueError(f"unknown path {path!r}; allowed: {', '.join(PATHS)}")
    paths = [p for (g, i, o, p) in PARAMETERS if (g, i, o) == (gen, inputs, output)]
    if not paths or (path is not None and path not in paths):
        wanted = f"{inputs} inputs with {output} output" + (f" on the {path} path" if path else "")
        raise ValueError(f"{device} ({gen}) tensor cores do not support {wanted}; {_what_it_takes(device)}")
    chosen = path or ("native" if "native" in paths else paths[0])
    params = PARAMETERS[(gen, inputs, output, chosen)]
    if instruction_shape is not None:
        overrides = {"instruction_k": instruction(device, inputs, output, shape=instruction_shape).k, **overrides}
    elif "block_size" in overrides and "instruction_k" not in overrides:
        overrides = {"instruction_k": _fitting_k(params, overrides), **overrides}
    return dataclasses.replace(params, **overrides) if overrides else params


def _fitting_k(params: BlockFMA, overrides: dict) -> int | None:
    """The preset's instruction_k, raised to the least multiple of it whose instruction holds one
    block of the overridden block_size: an override of F takes effect instead of being cut by
    the preset's instruction (which keeps a multiple of 4 for k_order 'pairs')."""
    block_size, k = overrides["block_size"], params.instruction_k
    if not isinstance(block_size, int) or block_size < 1 or k is None:
        return k  # (BlockFMA refuses a bad block_size with its own message)
    halves = 2 if overrides.get("k_order", params.k_order) == "pairs" else 1
    return k * -(-block_size * halves // k)


def is_fp8(inputs: str) -> bool:
    """FP8 inputs: the formats with a choice of path."""
    return not is_block(inputs) and get_format(inputs).bits == 8


def is_block(inputs: str) -> bool:
    """A block format among the input formats (MXFP8, MXFP6, MXFP4, NVFP4)."""
    return inputs in BLOCK_INPUTS


def block_format(inputs: str) -> BlockFormat:
    """The BlockFormat of a block input format name."""
    return BLOCK_PRESETS[inputs]


def unvalidated(device: str, inputs: str, output: str, path: str | None = None) -> str | None:
    """Why a data path's parameters are a hypothesis (no capture has checked them), else None."""
    gen = generation(device)
    return next((why for (g, i, o, p), why in UNVALIDATED.items()
                 if (g, i, o) == (gen, inputs, output) and path in (None, p)), None)
