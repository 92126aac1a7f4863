"""Rounding speed: fpsim against ml_dtypes, torch, gfloat and pychop on the same arrays.

Run (peers are installed in the benchmark environment only):

    pip install -c constraints.txt -e . -r benchmarks/requirements.txt
    python benchmarks/bench_rounding.py            # 10 million float32 elements
    python benchmarks/bench_rounding.py --n 1000000 --formats e4m3,bf16

Everything runs single-threaded on one float32 array of N(0, 1) * 4 values.
Two kinds of output are timed, and each is compared with the peer that
produces the same kind:

* codes: fpsim.encode (float32 -> bit patterns) against ml_dtypes
  `x.astype(float8_e4m3fn)` and torch `.to(torch.float8_e4m3fn)`, which also
  produce bit patterns. ml_dtypes' nearest-even cast is the reference time of
  the target: every fpsim mode should be at least as fast.
* values: fpsim.quantize (float32 -> rounded float32) against the round trip
  ml_dtypes `x.astype(t).astype(float32)`, gfloat `round_ndarray` and pychop
  `Chop`, which all return rounded values.

A ratio is peer time / fpsim time: above 1 means fpsim is faster. Each peer
result is also compared with fpsim bit for bit ("agree"), NaN equal to NaN:
the comparison of speed is only meaningful where the functions agree.
pychop models IEEE-style formats only (its e4m3 has Inf and max 240), so it
runs on fp16, bf16, tf32 and e5m2.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # single thread, before numpy/torch load

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402

import fpsim  # noqa: E402
from fpsim import _native  # noqa: E402

MODES = ("nearest_even", "nearest_away", "toward_zero", "up", "down", "odd", "stochastic")
DETERMINISTIC = MODES[:-1]
FORMATS = ("bf16", "fp16", "tf32", "e4m3", "e5m2", "e4m3fnuz", "e5m2fnuz", "e3m2", "e2m3", "e2m1", "e8m0")

GFLOAT_FORMATS = {"bf16": "format_info_bfloat16", "fp16": "format_info_binary16", "e4m3": "format_info_ocp_e4m3",
                  "e5m2": "format_info_ocp_e5m2", "e3m2": "format_info_ocp_e3m2", "e2m3": "format_info_ocp_e2m3",
                  "e2m1": "format_info_ocp_e2m1", "e8m0": "format_info_ocp_e8m0"}
GFLOAT_MODES = {"nearest_even": "TiesToEven", "nearest_away": "TiesToAway", "toward_zero": "TowardZero",
                "up": "TowardPositive", "down": "TowardNegative"}
PYCHOP_FORMATS = {"fp16": (5, 10), "bf16": (8, 7), "tf32": (8, 10), "e5m2": (5, 2)}
PYCHOP_MODES = {"nearest_even": 1, "up": 2, "down": 3, "toward_zero": 4, "nearest_away": 8, "odd": 9}


def best_time(fn, repeats: int) -> float:
    """Best wall time of `repeats` calls (one warm-up call first) in seconds, and the last result."""
    result = fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def agreement(a, b) -> float:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    same = (a == b) & (np.signbit(a) == np.signbit(b)) | (np.isnan(a) & np.isnan(b))
    return float(same.mean())


def optional(name):
    """Import a peer if it is installed (importing a submodule loads it into the package)."""
    try:
        return __import__(name)
    except ImportError:
        return None


def version(name) -> str:
    from importlib.metadata import PackageNotFoundError, version as package_version

    try:
        return package_version(name)
    except PackageNotFoundError:
        return "missing"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000_000, help="elements (default 10 million)")
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--repeats", type=int, default=5, help="timed calls of fast functions")
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # peers warn on overflow in their own arithmetic

    torch = optional("torch")
    if torch is not None:
        torch.set_num_threads(1)
    ml_dtypes, gfloat, pychop = optional("ml_dtypes"), optional("gfloat.formats"), optional("pychop")
    versions = ", ".join(f"{peer} {version(peer)}" for peer in ("numpy", "ml_dtypes", "torch", "gfloat", "pychop"))
    print(f"fpsim {fpsim.__version__} (compiled kernel: {_native.available()}), {versions}")
    x = (np.random.default_rng(2024).standard_normal(args.n) * 4).astype(np.float32)
    print(f"input: {args.n:,} float32 values, N(0,1)*4, single thread; times in ms; ratio = peer / fpsim\n")

    header = (f"{'format':9} {'mode':13} {'encode':>8} {'quantize':>8} | {'ml_dtypes':>9} {'ratio':>6} "
              f"{'torch':>7} {'ratio':>6} | {'ml rt':>7} {'ratio':>6} {'gfloat':>8} {'ratio':>6} {'agree':>6} "
              f"{'pychop':>8} {'ratio':>6} {'agree':>6}")
    print(header)
    print("-" * len(header))
    worst_vs_ml = []
    worst_vs_gfloat = []
    for name in args.formats.split(","):
        fmt = fpsim.format(name)
        data = np.abs(x) if not fmt.signed else x
        ml_type = fmt.ml_dtype if ml_dtypes is not None else None
        torch_type = fmt.torch_dtype if torch is not None else None
        t_ml = t_ml_rt = t_torch = None
        if ml_type is not None and fmt.bits < 32:
            t_ml, _ = best_time(lambda: data.astype(ml_type), args.repeats)
            t_ml_rt, _ = best_time(lambda: data.astype(ml_type).astype(np.float32), args.repeats)
        if torch_type is not None and fmt.bits < 32:
            tensor = torch.from_numpy(data)
            t_torch, _ = best_time(lambda: tensor.to(torch_type), args.repeats)
        for mode in MODES:
            kwargs = {"seed": 0} if mode == "stochastic" else {}
            t_enc, _ = best_time(lambda: fpsim.encode(data, fmt, mode, **kwargs), args.repeats)
            t_q, q = best_time(lambda: fpsim.quantize(data, fmt, mode, **kwargs), args.repeats)
            cells = [f"{name:9} {mode:13} {t_enc * 1e3:8.1f} {t_q * 1e3:8.1f} |"]
            cells.append(_pair(t_ml, t_enc) + " " + _pair(t_torch, t_enc, width=7) + " |")
            cells.append(_pair(t_ml_rt if mode == "nearest_even" else None, t_q, width=7))
            if mode in DETERMINISTIC and t_ml is not None:
                worst_vs_ml.append((t_ml / t_enc, name, mode))
            # gfloat: values, per mode it implements
            t_g = g_agree = None
            if gfloat is not None and name in GFLOAT_FORMATS and mode in GFLOAT_MODES:
                info = getattr(gfloat.formats, GFLOAT_FORMATS[name])
                rnd = getattr(gfloat.RoundMode, GFLOAT_MODES[mode])
                # gfloat refuses sat=False for formats without Inf and NaN; saturating is
                # their natural overflow (as in fpsim), so the functions are the same
                sat = not (fmt.infinities or fmt.has_nan)
                t_g, g = best_time(lambda: gfloat.round_ndarray(info, data, rnd, sat=sat), 1)
                g_agree = agreement(q, g)
                worst_vs_gfloat.append((t_g / t_q, name, mode))
            cells.append(_pair(t_g, t_q, width=8) + f" {_pct(g_agree):>6}")
            t_p = p_agree = None
            if pychop is not None and name in PYCHOP_FORMATS and mode in PYCHOP_MODES:
                chop = pychop.Chop(*PYCHOP_FORMATS[name], rmode=PYCHOP_MODES[mode], chunk_size=args.n)
                t_p, p = best_time(lambda: chop(data), 1)
                p_agree = agreement(q, p)
            cells.append(_pair(t_p, t_q, width=8) + f" {_pct(p_agree):>6}")
            print(" ".join(cells), flush=True)
    print()
    if worst_vs_ml:
        ratio, name, mode = min(worst_vs_ml)
        print(f"slowest deterministic mode against ml_dtypes' nearest-even cast (codes): {name} {mode}, "
              f"ratio {ratio:.2f}")
    if worst_vs_gfloat:
        ratio, name, mode = min(worst_vs_gfloat)
        print(f"smallest speed-up over gfloat (values): {name} {mode}, ratio {ratio:.0f}")


def _pair(peer, ours, width=9) -> str:
    if peer is None:
        return f"{'-':>{width}} {'-':>6}"
    return f"{peer * 1e3:{width}.1f} {peer / ours:6.2f}"


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


if __name__ == "__main__" and "--blocks" not in sys.argv[1:]:
    main()


# ------------------------------------------------------------------------------------------
# Block formats (MX, NVFP4): `python benchmarks/bench_rounding.py --blocks [--n N] [--repeats R]`
#
# fpsim.quantize (dequantised values) and fpsim.encode (codes and scales) of N float32 values
# (N(0,1)*4, rows of 1024, so every peer sees whole blocks) against torchao's reference code
# (to_mx/to_dtype for MX, nvfp4_quantize/NVFP4Tensor for NVFP4) and gfloat's quantize_block
# (a Python loop per block: timed on a slice and scaled to N, marked "est."). Single thread.
# "agree" compares element and scale codes with torchao bit for bit (tests/test_blocks_peers.py
# says where torchao differs from the specs: none of these inputs reach those cases).

def bench_blocks(n: int = 10_000_000, repeats: int = 3) -> None:
    import importlib

    import torch
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.kernels import unpack_uint4
    from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx
    from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, nvfp4_quantize, per_tensor_amax_to_scale

    torch.set_num_threads(1)
    gfloat = optional("gfloat")
    rows = max(n // 1024, 1)
    x = (np.random.default_rng(2024).standard_normal((rows, 1024)) * 4).astype(np.float32)
    t = torch.from_numpy(x)
    versions = ", ".join(f"{p} {version(p)}" for p in ("numpy", "torch", "torchao", "gfloat"))
    print(f"fpsim {fpsim.__version__} (compiled kernel: {_native.available()}), {versions}")
    print(f"input: {x.size:,} float32 values ({rows} x 1024), N(0,1)*4, single thread; times in ms; "
          f"ratio = peer / fpsim\n")
    header = (f"{'format':11} {'rule':6} {'output':7} {'fpsim':>8} | {'torchao':>8} {'ratio':>6} {'agree':>7} | "
              f"{'gfloat':>10} {'ratio':>7}")
    print(header)
    print("-" * len(header))
    mx_types = {"mxfp8_e4m3": torch.float8_e4m3fn, "mxfp4": torch.float4_e2m1fn_x2}
    gfloat_infos = {"mxfp8_e4m3": "format_info_mxfp8_e4m3", "mxfp4": "format_info_mxfp4_e2m1"}
    worst = []

    def element_codes(data, name):
        data = data.contiguous().view(torch.uint8)
        return (unpack_uint4(data) if name in ("mxfp4", "nvfp4") else data).numpy().reshape(x.shape)

    def gfloat_time(name):
        if gfloat is None or name not in gfloat_infos:
            return None
        info = getattr(importlib.import_module("gfloat.formats"), gfloat_infos[name])
        blocks = x.reshape(-1, 32)[:512].astype(np.float64)
        start = time.perf_counter()
        for block in blocks:
            gfloat.quantize_block(info, block, gfloat.compute_scale_amax)
        return (time.perf_counter() - start) * x.size / blocks.size

    cases = [("mxfp8_e4m3", "floor"), ("mxfp8_e4m3", "rceil"), ("mxfp4", "floor"), ("nvfp4", "-")]
    for name, rule in cases:
        options = {} if name == "nvfp4" else {"scale_rule": rule}
        t_q, _ = best_time(lambda: fpsim.quantize(x, name, **options), repeats)
        t_e, enc = best_time(lambda: fpsim.encode(x, name, **options), repeats)
        if name == "nvfp4":
            scale = per_tensor_amax_to_scale(t.abs().max())
            t_codes, (scales, data) = best_time(lambda: nvfp4_quantize(t, 16, scale), repeats)
            t_values, _ = best_time(
                lambda: NVFP4Tensor.to_nvfp4(t, per_tensor_scale=scale).dequantize(torch.float32), repeats)
            theirs_scales = scales.view(torch.uint8).numpy()
        else:
            mode = ScaleCalculationMode(rule)
            t_codes, (scales, data) = best_time(lambda: to_mx(t, mx_types[name], 32, mode), repeats)
            t_values, _ = best_time(
                lambda: to_dtype(*reversed(to_mx(t, mx_types[name], 32, mode)), mx_types[name], 32, torch.float32),
                repeats)
            theirs_scales = scales.view(torch.uint8).numpy()
        agree = (np.mean(element_codes(data, name) == enc.codes) * enc.codes.size
                 + np.mean(theirs_scales == enc.scales) * enc.scales.size) / (enc.codes.size + enc.scales.size)
        t_g = gfloat_time(name) if rule != "rceil" else None
        for output, ours, theirs, g in (("values", t_q, t_values, t_g), ("codes", t_e, t_codes, None)):
            gcell = f"{g * 1e3:9.0f}* {g / ours:7.0f}" if g is not None else f"{'-':>10} {'-':>7}"
            print(f"{name:11} {rule:6} {output:7} {ours * 1e3:8.1f} | {theirs * 1e3:8.1f} {theirs / ours:6.2f} "
                  f"{100 * agree:6.2f}% | {gcell}", flush=True)
            faster = min(p for p in (theirs, g) if p is not None)
            worst.append((faster / ours, name, rule, output))
    print("\n* gfloat: est., timed on 512 blocks and scaled to the input size")
    ratio, name, rule, output = min(worst)
    print(f"smallest speed-up over the faster peer: {name} {rule} {output}, ratio {ratio:.2f} (target 10)")


if __name__ == "__main__" and "--blocks" in sys.argv[1:]:
    _parser = argparse.ArgumentParser(description="block formats (MX, NVFP4) against torchao and gfloat")
    _parser.add_argument("--blocks", action="store_true")
    _parser.add_argument("--n", type=int, default=10_000_000, help="elements (default 10 million)")
    _parser.add_argument("--repeats", type=int, default=3, help="timed calls")
    _args = _parser.parse_args()
    warnings.simplefilter("ignore")
    bench_blocks(_args.n, _args.repeats)
