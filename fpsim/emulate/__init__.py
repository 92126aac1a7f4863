"""Emulated mixed-precision training: ``with fpsim.emulate(model, "bf16"): ...``.

`fpsim.emulate` is this package, and calling it starts an emulation (`session.emulate`):
the package is callable so that ``fpsim.emulate(model, recipe)`` and
``fpsim.emulate.FP8Recipe`` both work, whichever is imported first. Nothing here imports
torch until an emulation starts.

    session     the context manager: what runs how while the block is entered
    recipes     the recipes (AutocastRecipe, FP8Recipe); FP8 scaling is fpsim.recipes' (re-exported here)
    policy      torch.autocast's op lists and casting rules, per device type
    autocast    applies one device type's policy on another through torch's Autocast key
    compute     fp16/bf16 ops computed in FP32 and rounded once (a dispatch mode)
    gemm        matrix products on a tensor-core model
    fp8         FP8 linear layers: per-tensor scales, FP8 GEMMs
    selection   keep=, layers=, from_report=
    runs        loss curves of a training function under several recipes
"""

from __future__ import annotations

import importlib
import sys
import types

from .recipes import AutocastRecipe, BlockScaling, CurrentScaling, DelayedScaling, FP8Recipe, PerChannelScaling

_LAZY = {"Emulation": "session", "run": "runs", "compare": "runs", "Run": "runs"}

__all__ = ["AutocastRecipe", "BlockScaling", "CurrentScaling", "DelayedScaling", "Emulation", "FP8Recipe",
           "PerChannelScaling", "Run", "compare", "emulate", "run"]


def emulate(model, recipe, **options):
    """``fpsim.emulate(model, recipe, **options)``: see `fpsim.emulate.session.emulate`."""
    from .session import emulate as start

    return start(model, recipe, **options)


def __getattr__(name):
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _CallableModule(types.ModuleType):
    def __call__(self, model, recipe, **options):
        return emulate(model, recipe, **options)


sys.modules[__name__].__class__ = _CallableModule
