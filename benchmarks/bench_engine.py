"""fpsim's compiled kernel against its own numpy engine: what an install without a C compiler costs.

Without a compiler, `pip install` still succeeds (the extension is optional) and
quantize/encode run on the numpy engine, with the same bits (tests/test_native.py)
and a one-time RuntimeWarning that quotes this ratio. Both paths are timed here in
the same run on the same data: the engine by hiding the kernel module.

    python benchmarks/bench_engine.py [--n 1000000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import platform
import warnings

import numpy as np

from common import fastest
import fpsim
from fpsim import _native

FORMATS = ("e4m3", "e5m2", "e2m1", "bf16", "fp16")
MODES = ("nearest_even", "toward_zero", "stochastic")


def _engine(function):
    """Run `function` with the compiled kernel hidden (the numpy engine does everything)."""
    kernel, _native._fastround = _native._fastround, None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return function()
    finally:
        _native._fastround = kernel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="elements (default 1 million)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if not _native.available():
        raise SystemExit("the compiled kernel is not built here: nothing to compare")
    print(f"fpsim {fpsim.__version__}, numpy {np.__version__}, {platform.machine()}, "
          f"{args.n:,} values N(0,1)*4; times in ms; ratio = engine / kernel")
    print(f"{'input':8} {'format':6} {'mode':13} {'kernel':>8} {'engine':>9} {'ratio':>7}")
    ratios = []
    for dtype in (np.float32, np.float64):
        x = (np.random.default_rng(0).standard_normal(args.n) * 4).astype(dtype)
        for name in FORMATS:
            for rounding in MODES:
                seed = 0 if rounding == "stochastic" else None

                def call():
                    return fpsim.quantize(x, name, rounding, seed=seed)

                assert np.array_equal(call(), _engine(call), equal_nan=True)  # the same bits, or no timing
                kernel = fastest(call, args.repeats)
                engine = _engine(lambda: fastest(call, max(1, args.repeats // 2)))
                ratios.append(engine / kernel)
                print(f"{np.dtype(dtype).name:8} {name:6} {rounding:13} {kernel * 1e3:8.2f} {engine * 1e3:9.1f} "
                      f"{engine / kernel:7.1f}")
    print(f"summary: the numpy engine takes {min(ratios):.0f} to {max(ratios):.0f} times the kernel's time "
          f"(median {np.median(ratios):.0f})")


if __name__ == "__main__":
    main()
