"""The rounding engine compiled by torch.compile: `fpsim.quantize(t, fmt, compile=True)`.

The same engine (`_engine.round_bits`) that runs eagerly on torch tensors, traced
once per format and options into one graph and compiled by TorchInductor: one
fused kernel instead of some fifty elementwise ones, a Triton kernel on a GPU
(C++ on the CPU, where the built-in C kernel is faster still). It is the same
code, so the same bits; tests/test_compiled.py holds it to the exact oracle.
Deterministic modes only: stochastic rounding draws further random words only
where the first ones tie, a data-dependent step that one graph cannot hold.
"""

from __future__ import annotations

import functools
import types

from . import _arrays
from ._engine import round_bits as engine_round_bits
from .formats import Format


def check(array, rounding: str) -> None:
    """TypeError/ValueError for what the compiled engine does not take."""
    if not _arrays.is_torch(array):
        raise TypeError(f"compile=True applies to torch tensors (torch.compile), got {type(array).__name__}; "
                        f"numpy input already runs fpsim's compiled C kernel")
    if not array.is_floating_point():
        raise TypeError(f"compile=True takes floating-point tensors, got {array.dtype}")
    if rounding == "stochastic":
        raise ValueError("compile=True applies to the deterministic rounding modes, not 'stochastic' "
                         "(its extra random words are drawn only where needed, which one graph cannot hold)")


def round_bits(w, fmt: Format, engine_options: dict):
    """`_engine.round_bits(w, fmt, ...)` through its compiled graph (cached per format and options;
    torch.compile recompiles for a new dtype or device, and once more, with a dynamic length, for a
    second length: the graph sees w flat)."""
    return _engine(fmt, tuple(sorted(engine_options.items())))(w.reshape(-1)).reshape(w.shape)


@functools.lru_cache(maxsize=128)
def _engine(fmt: Format, options: tuple):
    kwargs = dict(options)
    for name, attribute in vars(type(fmt)).items():  # computed here: Dynamo cannot enter their lock
        if isinstance(attribute, functools.cached_property):
            getattr(fmt, name)

    def engine(w):
        return engine_round_bits(w, fmt, _arrays.Ops(w), **kwargs)

    # A code object of its own: Dynamo keeps its compiled graphs per code object (a few each), and
    # with one shared by every format it would take the formats' constants for changing inputs.
    name = f"fpsim_round_{abs(hash((fmt, options)))}"
    own = types.FunctionType(engine.__code__.replace(co_name=name), engine.__globals__, name, None,
                             engine.__closure__)
    import torch  # loaded already: compile=True takes tensors only

    return torch.compile(own, fullgraph=True)
