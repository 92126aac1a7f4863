"""Loss curves of one training function under several recipes, from the same start.

    runs = fpsim.emulate.compare(build, train, {"fp32": "fp32", "bf16": "bf16",
                                                "fp16, scale 2^12": ("fp16", {"loss_scale": 2**12})})
    runs["bf16"].losses

`build()` makes the model (called after seeding torch, once per recipe, so every run starts
from the same weights and data order); `train(model)` runs the user's loop and returns its
losses, or None to use the losses the emulation saw (one per backward pass).
"""

from __future__ import annotations

import dataclasses

from .session import emulate


@dataclasses.dataclass
class Run:
    """One training run under one recipe: its losses, optimizer steps and what was not emulated."""

    recipe: str
    losses: list
    steps: int
    notes: list

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def run(train, model, recipe, **options) -> Run:
    """`train(model)` under ``fpsim.emulate(model, recipe, **options)``."""
    with emulate(model, recipe, **options) as em:
        result = train(model)
    losses = em.losses if result is None else [float(x) for x in result]
    return Run(em.name, losses, em.steps, list(em.notes))


def compare(build, train, recipes: dict, seed: int = 0) -> dict:
    """{label: Run} for each of `recipes` ({label: recipe, or (recipe, options)}), each from
    ``torch.manual_seed(seed); model = build()``."""
    import torch

    if not isinstance(recipes, dict) or not recipes:
        raise TypeError(f"recipes must be a non-empty dict {{label: recipe or (recipe, options)}}, got {recipes!r}")
    runs = {}
    for label, spec in recipes.items():
        recipe, options = spec if isinstance(spec, tuple) else (spec, {})
        torch.manual_seed(seed)
        runs[label] = run(train, build(), recipe, **options)
    return runs
