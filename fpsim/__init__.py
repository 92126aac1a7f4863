"""fpsim: a bit-exact simulator of floating-point formats for mixed-precision training.

The public API (see README.md and docs/):

    fmt = fpsim.format("e4m3")
    y = fpsim.quantize(x, "e4m3", rounding="nearest_even", saturate=False, seed=None)
    codes = fpsim.encode(x, "bf16"); values = fpsim.decode(codes, "bf16")
    fpsim.quantize(x, "mxfp8_e4m3"); enc = fpsim.encode(x, "nvfp4"); fpsim.decode(enc)
"""

from . import testing  # assertion helpers; fpsim.strategies (hypothesis) is imported explicitly
from .analyze.hooks import watch
from .block_codec import BlockEncoding
from .blocks import BLOCK_PRESETS, SCALE_RULES, BlockFormat, IntFormat, format
from .codec import decode, encode
from .modes import ROUNDING_MODES
from .formats import ALIASES, PRESETS, Format
from .rounding import quantize
from .tensorcore.core import TensorCore

__version__ = "0.1.0"

__all__ = [
    "ALIASES", "BLOCK_PRESETS", "BlockEncoding", "BlockFormat", "IntFormat", "PRESETS", "ROUNDING_MODES",
    "SCALE_RULES", "Format", "TensorCore", "decode", "encode", "format", "quantize",
    "testing", "watch", "__version__",
]
