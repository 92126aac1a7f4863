"""fpsim: a bit-exact simulator of floating-point formats for mixed-precision training.

The public API (see README.md and docs/):

    fmt = fpsim.format("e4m3")
    y = fpsim.quantize(x, "e4m3", rounding="nearest_even", saturate=False, seed=None)
    codes = fpsim.encode(x, "bf16"); values = fpsim.decode(codes, "bf16")
    fpsim.quantize(x, "mxfp8_e4m3"); enc = fpsim.encode(x, "nvfp4"); fpsim.decode(enc)
"""

from . import testing  # assertion helpers; fpsim.strategies (hypothesis) is imported explicitly
from .block_codec import BlockEncoding
from .blocks import BLOCK_PRESETS, SCALE_RULES, BlockFormat, IntFormat, format
from .codec import decode, encode
from .modes import ROUNDING_MODES
from .formats import ALIASES, PRESETS, Format
from .rounding import quantize
from .tensorcore.core import TensorCore

__version__ = "0.1.0"

__all__ = [
    "ALIASES", "BLOCK_PRESETS", "BlockEncoding", "BlockFormat", "IntFormat", "PRESETS", "ROUNDING_MODES", "Report",
    "SCALE_RULES", "Format", "TensorCore", "decode", "encode", "emulate", "format", "quantize",
    "testing", "watch", "__version__",
]

# Names whose modules need torch: imported on first use, so that `import fpsim` and the numpy
# numerics never load torch. `emulate` is the (callable) package fpsim.emulate itself.
_LAZY = {"watch": "fpsim.analyze.hooks", "Report": "fpsim.analyze.report", "emulate": "fpsim.emulate"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module = importlib.import_module(_LAZY[name])
        value = module if module.__name__ == f"{__name__}.{name}" else getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fpsim' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))

