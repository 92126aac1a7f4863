"""Rounding speed: fpsim against ml_dtypes, torch, gfloat and pychop on the same arrays.

Run (peers are installed in the benchmark environment only):

    pip install -c constraints.txt -e . -r benchmarks/requirements.txt
    python benchmarks/bench_rounding.py            # 10 million elements
    python benchmarks/bench_rounding.py --n 1000000 --formats e4m3,bf16 --sections float32

Everything runs single-threaded on N(0, 1) * 4 values. Each section prints a
table and ends with one summary line per target; the summaries are printed
again together at the end.

* float32: one float32 array. Codes: fpsim.encode (float32 -> bit patterns)
  against ml_dtypes `x.astype(float8_e4m3fn)` and torch `.to(torch.float8_e4m3fn)`,
  which also produce bit patterns. ml_dtypes' nearest-even cast is the
  reference time of the targets: every deterministic fpsim mode at least as
  fast, stochastic rounding at least as fast for the 8-, 6- and 4-bit formats
  and at least half as fast for BF16/FP16. Values: fpsim.quantize (float32 ->
  rounded float32) against the round trip ml_dtypes `x.astype(t).astype(float32)`,
  gfloat `round_ndarray` and pychop `Chop`, which all return rounded values.
* blocks: MX and NVFP4 quantisation (fpsim.quantize and fpsim.encode of block formats) against
  torchao's MX/NVFP4 reference code and gfloat's quantize_block; target: at least 10 times the
  faster of them (`--blocks` runs this section alone).
* small: fpsim's time per call on 256, 4,096 and 65,536 float32 values (e4m3, bf16), where the Python
  around the kernel counts: quantize against ml_dtypes' and torch's round trips, encode against
  ml_dtypes' cast (reported, no target).
* float64: the same values as float64. fpsim.encode against ml_dtypes' cast of
  the float64 array (which ml_dtypes >= 0.7 rounds once, as fpsim does; numpy's
  own astype for fp32), and fpsim's float64 time per element against its own
  float32 time (target: at most 1.5 times), for encode and quantize, beside the
  same ratio for numpy moving the same bytes (the memory floor: an integer cast
  of the input's bits to the codes' width, a copy), and the two divided; then
  the memory fpsim allocates beyond the output it returns (target: at most the
  output's size).

A ratio is peer time / fpsim time: above 1 means fpsim is faster. Each peer
result is also compared with fpsim bit for bit ("agree"), NaN equal to NaN:
the comparison of speed is only meaningful where the functions agree.
pychop models IEEE-style formats only (its e4m3 has Inf and max 240), so it
runs on fp16, bf16, tf32 and e5m2. Times are the best of `--repeats` calls,
fpsim's and its peer's taken in turn so that a busy machine slows both alike.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # single thread, before numpy/torch load

import argparse  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402

import fpsim  # noqa: E402
from fpsim import _native  # noqa: E402
from fpsim.formats import PRESETS  # noqa: E402
from fpsim.modes import DETERMINISTIC_MODES as DETERMINISTIC, ROUNDING_MODES as MODES  # noqa: E402

FORMATS = ("bf16", "fp16", "tf32", "e4m3", "e5m2", "e4m3fnuz", "e5m2fnuz", "e3m2", "e2m3", "e2m1", "e8m0")
SMALL_FORMATS = tuple(name for name in FORMATS if PRESETS[name].bits <= 8)  # 8, 6 and 4 bits
FLOAT64_FORMATS = ("bf16", "fp16", "tf32", "fp32", "e4m3", "e5m2", "e2m1")

GFLOAT_FORMATS = {"bf16": "format_info_bfloat16", "fp16": "format_info_binary16", "e4m3": "format_info_ocp_e4m3",
                  "e5m2": "format_info_ocp_e5m2", "e3m2": "format_info_ocp_e3m2", "e2m3": "format_info_ocp_e2m3",
                  "e2m1": "format_info_ocp_e2m1", "e8m0": "format_info_ocp_e8m0"}
GFLOAT_MODES = {"nearest_even": "TiesToEven", "nearest_away": "TiesToAway", "toward_zero": "TowardZero",
                "up": "TowardPositive", "down": "TowardNegative"}
PYCHOP_FORMATS = {"fp16": (5, 10), "bf16": (8, 7), "tf32": (8, 10), "e5m2": (5, 2)}
PYCHOP_MODES = {"nearest_even": 1, "up": 2, "down": 3, "toward_zero": 4, "nearest_away": 8, "odd": 9}


# ------------------------------------------------------------------ tools
def best_times(*fns, repeats: int):
    """Best wall time in seconds of each function over `repeats` rounds that call them in turn
    (one warm-up round first), and each one's last result."""
    results = [fn() for fn in fns]
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            results[i] = fn()
            best[i] = min(best[i], time.perf_counter() - start)
    return best, results


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


def kwargs_for(mode: str) -> dict:
    return {"seed": 0} if mode == "stochastic" else {}


def data_for(fmt, x: np.ndarray) -> np.ndarray:
    return np.abs(x) if not fmt.signed else x


def pair(peer, ours, width=9) -> str:
    if peer is None:
        return f"{'-':>{width}} {'-':>6}"
    return f"{peer * 1e3:{width}.1f} {peer / ours:6.2f}"


def pct(value) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def worst(entries, describe) -> str:
    """The entry with the smallest ratio, described; '-' when there is none."""
    if not entries:
        return "-"
    ratio, *what = min(entries)
    return describe(ratio, *what)


class Env:
    """What every section shares: arguments, data and peers."""

    def __init__(self, args):
        self.args = args
        self.formats = [f for f in args.formats.split(",") if f]
        self.x = (np.random.default_rng(2024).standard_normal(args.n) * 4).astype(np.float32)
        self.torch = optional("torch")
        if self.torch is not None:
            self.torch.set_num_threads(1)
        self.ml_dtypes = optional("ml_dtypes")
        self.gfloat = optional("gfloat.formats")
        self.pychop = optional("pychop")


# ------------------------------------------------------------------ float32
def float32_section(env: Env) -> list[str]:
    args, torch, ml_dtypes, gfloat, pychop = env.args, env.torch, env.ml_dtypes, env.gfloat, env.pychop
    print(f"float32: {args.n:,} float32 values, N(0,1)*4, single thread; times in ms; ratio = peer / fpsim\n")
    header = (f"{'format':9} {'mode':13} {'encode':>8} {'quantize':>8} | {'ml_dtypes':>9} {'ratio':>6} "
              f"{'torch':>7} {'ratio':>6} | {'ml rt':>7} {'ratio':>6} {'gfloat':>8} {'ratio':>6} {'agree':>6} "
              f"{'pychop':>8} {'ratio':>6} {'agree':>6}")
    print(header)
    print("-" * len(header))
    deterministic, stochastic_small, stochastic_16, against_gfloat = [], [], [], []
    for name in env.formats:
        fmt = fpsim.format(name)
        data = data_for(fmt, env.x)
        ml_type = fmt.ml_dtype if ml_dtypes is not None and fmt.bits < 32 else None
        torch_type = fmt.torch_dtype if torch is not None and fmt.bits < 32 else None
        tensor = torch.from_numpy(data) if torch_type is not None else None
        for mode in MODES:
            kwargs = kwargs_for(mode)
            fns = [lambda: fpsim.encode(data, fmt, mode, **kwargs), lambda: fpsim.quantize(data, fmt, mode, **kwargs)]
            if ml_type is not None:
                fns.append(lambda: data.astype(ml_type))
                if mode == "nearest_even":
                    fns.append(lambda: data.astype(ml_type).astype(np.float32))
            times, results = best_times(*fns, repeats=args.repeats)
            t_enc, t_q = times[:2]
            q = results[1]
            t_ml = times[2] if ml_type is not None else None
            t_ml_rt = times[3] if ml_type is not None and mode == "nearest_even" else None
            t_torch = best_times(lambda: tensor.to(torch_type), repeats=args.repeats)[0][0] if tensor is not None else None
            cells = [f"{name:9} {mode:13} {t_enc * 1e3:8.1f} {t_q * 1e3:8.1f} |"]
            cells.append(pair(t_ml, t_enc) + " " + pair(t_torch, t_enc, width=7) + " |")
            cells.append(pair(t_ml_rt, t_q, width=7))
            if t_ml is not None:
                ratio = t_ml / t_enc
                if mode in DETERMINISTIC:
                    deterministic.append((ratio, name, mode))
                elif name in ("bf16", "fp16"):
                    stochastic_16.append((ratio, name, mode))
                elif name in SMALL_FORMATS:
                    stochastic_small.append((ratio, name, mode))
            # gfloat: values, per mode it implements
            t_g = g_agree = None
            if gfloat is not None and name in GFLOAT_FORMATS and mode in GFLOAT_MODES:
                info = getattr(gfloat.formats, GFLOAT_FORMATS[name])
                rnd = getattr(gfloat.RoundMode, GFLOAT_MODES[mode])
                # gfloat refuses sat=False for formats without Inf and NaN; saturating is
                # their natural overflow (as in fpsim), so the functions are the same
                sat = not (fmt.infinities or fmt.has_nan)
                (t_g,), (g,) = best_times(lambda: gfloat.round_ndarray(info, data, rnd, sat=sat), repeats=1)
                g_agree = agreement(q, g)
                against_gfloat.append((t_g / t_q, name, mode))
            cells.append(pair(t_g, t_q, width=8) + f" {pct(g_agree):>6}")
            t_p = p_agree = None
            if pychop is not None and name in PYCHOP_FORMATS and mode in PYCHOP_MODES:
                chop = pychop.Chop(*PYCHOP_FORMATS[name], rmode=PYCHOP_MODES[mode], chunk_size=args.n)
                (t_p,), (p,) = best_times(lambda: chop(data), repeats=1)
                p_agree = agreement(q, p)
            cells.append(pair(t_p, t_q, width=8) + f" {pct(p_agree):>6}")
            print(" ".join(cells), flush=True)
    print()
    summary = [
        "float32, deterministic modes against ml_dtypes' nearest-even cast (codes), slowest: "
        + worst(deterministic, lambda r, n, m: f"{n} {m}, ratio {r:.2f} (target >= 1.0)"),
        "float32, stochastic against ml_dtypes' nearest-even cast, 8-, 6- and 4-bit formats, slowest: "
        + worst(stochastic_small, lambda r, n, m: f"{n}, ratio {r:.2f} (target >= 1.0)"),
        "float32, stochastic against ml_dtypes' nearest-even cast, BF16/FP16, slowest: "
        + worst(stochastic_16, lambda r, n, m: f"{n}, ratio {r:.2f} (target >= 0.5)"),
        "float32, smallest speed-up over gfloat (values): "
        + worst(against_gfloat, lambda r, n, m: f"{n} {m}, ratio {r:.0f}"),
    ]
    print("\n".join(summary) + "\n")
    return summary


# ------------------------------------------------------------------ float64
def extra_bytes_per_element(fn, n: int, output_bytes: int) -> float:
    """Peak memory allocated during fn() beyond the output it returns, per element (tracemalloc sees
    numpy's allocations)."""
    tracemalloc.start()
    try:
        result = fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del result
    return (peak - output_bytes) / n


def memory_floors(data64: np.ndarray, data32: np.ndarray, fmt, repeats: int) -> tuple[float, float]:
    """What float64 input costs numpy per element against float32 input when it moves the same bytes as
    fpsim: for encode, an integer cast of the input's bits to the codes' width (reads the input, writes
    the codes); for quantize, a copy (reads and writes the input's width). A float64/float32 ratio at
    this floor is memory traffic and page faults, which no float64 kernel avoids."""
    codes = np.dtype(f"uint{max(8, 1 << (fmt.bits - 1).bit_length())}")
    bits64, bits32 = data64.view(np.uint64), data32.view(np.uint32)
    (enc64, enc32, copy64, copy32), _ = best_times(lambda: bits64.astype(codes), lambda: bits32.astype(codes),
                                                   data64.copy, data32.copy, repeats=repeats)
    return enc64 / enc32, copy64 / copy32


def float64_section(env: Env) -> list[str]:
    args, ml_dtypes = env.args, env.ml_dtypes
    print(f"float64: the same {args.n:,} values as float64; times in ms; ratio = peer / fpsim; "
          f"per element = fpsim on float64 / fpsim on float32, timed in turn (above 1: float64 is slower); "
          f"floor = the same ratio for numpy moving the same bytes (see memory_floors)\n")
    header = (f"{'format':9} {'mode':13} {'encode':>8} {'quantize':>8} | {'peer':>9} {'ratio':>6} {'agree':>6} | "
              f"{'encode/f32':>10} {'floor':>5} {'quantize/f32':>12} {'floor':>5}")
    print(header)
    print("-" * len(header))
    against_peer, per_element_encode, per_element_quantize, memory = [], [], [], []
    beyond_floor_encode, beyond_floor_quantize = [], []
    names = [n for n in FLOAT64_FORMATS if n in env.formats or n == "fp32"]
    for name in names:
        fmt = fpsim.format(name)
        data32 = data_for(fmt, env.x)
        data = data32.astype(np.float64)
        if name == "fp32":
            peer = lambda: data.astype(np.float32)  # noqa: E731  numpy's correctly rounded cast
        elif ml_dtypes is not None and fmt.ml_dtype is not None:
            peer = lambda: data.astype(fmt.ml_dtype)  # noqa: E731
        else:
            peer = None
        floor_encode, floor_quantize = memory_floors(data, data32, fmt, args.repeats)
        for mode in MODES:
            kwargs = kwargs_for(mode)
            fns = [lambda: fpsim.encode(data, fmt, mode, **kwargs), lambda: fpsim.quantize(data, fmt, mode, **kwargs),
                   lambda: fpsim.encode(data32, fmt, mode, **kwargs),
                   lambda: fpsim.quantize(data32, fmt, mode, **kwargs)]
            if peer is not None and mode == "nearest_even":
                fns.append(peer)
            times, results = best_times(*fns, repeats=args.repeats)
            t_enc, t_q, t_enc32, t_q32 = times[:4]
            t_peer = peer_agree = None
            if len(times) == 5:
                t_peer = times[4]
                peer_agree = agreement(results[1], results[4].astype(np.float64))
                against_peer.append((t_peer / t_enc, name, mode))
            per_element_encode.append((t_enc32 / t_enc, name, mode))
            per_element_quantize.append((t_q32 / t_q, name, mode))
            beyond_floor_encode.append((floor_encode * t_enc32 / t_enc, name, mode))
            beyond_floor_quantize.append((floor_quantize * t_q32 / t_q, name, mode))
            print(f"{name:9} {mode:13} {t_enc * 1e3:8.1f} {t_q * 1e3:8.1f} | {pair(t_peer, t_enc)} "
                  f"{pct(peer_agree):>6} | {t_enc / t_enc32:10.2f} {floor_encode:5.2f} {t_q / t_q32:12.2f} "
                  f"{floor_quantize:5.2f}", flush=True)
            if mode in ("nearest_even", "stochastic"):
                extra = extra_bytes_per_element(lambda: fpsim.quantize(data, fmt, mode, **kwargs), args.n, data.nbytes)
                memory.append((-extra, name, mode))
    print()
    summary = [
        "float64, against the peer's cast of the same float64 array (codes), slowest: "
        + worst(against_peer, lambda r, n, m: f"{n} {m}, ratio {r:.2f}"),
        "float64, time per element against fpsim's float32 path, encode, slowest: "
        + worst(per_element_encode, lambda r, n, m: f"{n} {m}, {1 / r:.2f} times (target <= 1.5)"),
        "float64, time per element against fpsim's float32 path, quantize, slowest: "
        + worst(per_element_quantize, lambda r, n, m: f"{n} {m}, {1 / r:.2f} times (target <= 1.5)"),
        "float64, the same beyond the memory floor (per element / floor), encode, slowest: "
        + worst(beyond_floor_encode, lambda r, n, m: f"{n} {m}, {1 / r:.2f} times"),
        "float64, the same beyond the memory floor (per element / floor), quantize, slowest: "
        + worst(beyond_floor_quantize, lambda r, n, m: f"{n} {m}, {1 / r:.2f} times"),
        "float64, quantize's memory beyond its 8-byte output, most: "
        + worst(memory, lambda r, n, m: f"{n} {m}, {-r:.2f} bytes per element (target <= 8)"),
    ]
    print("\n".join(summary) + "\n")
    return summary


# ------------------------------------------------------------------ blocks
BLOCK_CASES = (("mxfp8_e4m3", "floor"), ("mxfp8_e4m3", "rceil"), ("mxfp8_e5m2", "floor"), ("mxfp4", "floor"),
               ("nvfp4", "-"))
GFLOAT_BLOCK_FORMATS = {"mxfp8_e4m3": "format_info_mxfp8_e4m3", "mxfp8_e5m2": "format_info_mxfp8_e5m2",
                        "mxfp4": "format_info_mxfp4_e2m1"}


def blocks_section(env: Env) -> list[str]:
    """MX and NVFP4 quantisation of the float32 array (rows of 1024, so every peer sees whole
    blocks): fpsim.quantize (dequantised values) and fpsim.encode (element codes and scale
    codes) against torchao's reference code (to_mx + to_dtype for MX, NVFP4Tensor.to_nvfp4 +
    dequantize and nvfp4_quantize for NVFP4), timed in turn, and gfloat's quantize_block (a
    Python loop per block: timed on 512 blocks and scaled to the input size, marked *). "agree"
    compares element and scale codes with torchao's bit for bit (tests/test_blocks_peers.py says
    where torchao differs from the specs: none of these inputs reach those cases)."""
    import importlib

    torch = env.torch
    try:
        from torchao.prototype.mx_formats.config import ScaleCalculationMode
        from torchao.prototype.mx_formats.kernels import unpack_uint4
        from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx
        from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, nvfp4_quantize, per_tensor_amax_to_scale
    except ImportError:
        print("blocks: torchao is not installed (pip install -r benchmarks/requirements.txt)\n")
        return ["blocks: skipped (no torchao)"]
    gfloat = optional("gfloat")
    repeats = env.args.repeats
    cols = 1024 if env.x.size >= 1024 else 32
    x = env.x[: env.x.size // cols * cols].reshape(-1, cols)
    t = torch.from_numpy(x)
    print(f"blocks: {x.size:,} float32 values ({x.shape[0]} x {cols}), N(0,1)*4; times in ms; ratio = peer / fpsim")
    header = (f"{'format':11} {'rule':6} {'output':7} {'fpsim':>8} | {'torchao':>8} {'ratio':>6} {'agree':>7} | "
              f"{'gfloat':>10} {'ratio':>7}")
    print(header + "\n" + "-" * len(header))
    mx_types = {"mxfp8_e4m3": torch.float8_e4m3fn, "mxfp8_e5m2": torch.float8_e5m2, "mxfp4": torch.float4_e2m1fn_x2}
    against_faster = []

    def element_codes(data, name):
        data = data.contiguous().view(torch.uint8)
        return (unpack_uint4(data) if name in ("mxfp4", "nvfp4") else data).numpy().reshape(x.shape)

    def gfloat_time(name):
        if gfloat is None or name not in GFLOAT_BLOCK_FORMATS:
            return None
        info = getattr(importlib.import_module("gfloat.formats"), GFLOAT_BLOCK_FORMATS[name])
        blocks = x.reshape(-1, 32)[:512].astype(np.float64)
        start = time.perf_counter()
        for block in blocks:
            gfloat.quantize_block(info, block, gfloat.compute_scale_amax)
        return (time.perf_counter() - start) * x.size / blocks.size

    for name, rule in BLOCK_CASES:
        options = {} if name == "nvfp4" else {"scale_rule": rule}
        if name == "nvfp4":
            scale = per_tensor_amax_to_scale(t.abs().max())
            peer_codes = lambda: nvfp4_quantize(t, 16, scale)  # noqa: E731
            peer_values = lambda: NVFP4Tensor.to_nvfp4(t, per_tensor_scale=scale).dequantize(torch.float32)  # noqa: E731
        else:
            mode, dtype = ScaleCalculationMode(rule), mx_types[name]
            peer_codes = lambda: to_mx(t, dtype, 32, mode)  # noqa: E731
            peer_values = lambda: to_dtype(*reversed(to_mx(t, dtype, 32, mode)), dtype, 32, torch.float32)  # noqa: E731
        (t_q, t_values), _ = best_times(lambda: fpsim.quantize(x, name, **options), peer_values, repeats=repeats)
        (t_e, t_codes), (enc, (scales, data)) = best_times(lambda: fpsim.encode(x, name, **options), peer_codes,
                                                            repeats=repeats)
        theirs_scales = scales.view(torch.uint8).numpy()
        agree = (np.mean(element_codes(data, name) == enc.codes) * enc.codes.size
                 + np.mean(theirs_scales == enc.scales) * enc.scales.size) / (enc.codes.size + enc.scales.size)
        t_g = gfloat_time(name) if rule != "rceil" else None
        for output, ours, theirs, g in (("values", t_q, t_values, t_g), ("codes", t_e, t_codes, None)):
            gcell = f"{g * 1e3:9.0f}* {g / ours:7.0f}" if g is not None else f"{'-':>10} {'-':>7}"
            print(f"{name:11} {rule:6} {output:7} {ours * 1e3:8.1f} | {theirs * 1e3:8.1f} {theirs / ours:6.2f} "
                  f"{100 * agree:6.2f}% | {gcell}", flush=True)
            against_faster.append((min(p for p in (theirs, g) if p is not None) / ours, name, rule, output))
    print("* gfloat: est., timed on 512 blocks and scaled to the input size\n")
    return ["blocks, smallest speed-up over the faster of torchao and gfloat (target 10): "
            + worst(against_faster, lambda r, n, rule, o: f"{n} {rule} {o}, ratio {r:.2f}")]


# ------------------------------------------------------------------ small arrays
SMALL_SIZES = (256, 4096, 65536)
SMALL_FORMATS_PER_CALL = ("e4m3", "bf16")


def per_call(*fns, calls: int, repeats: int) -> list[float]:
    """Best seconds per call of each function over `repeats` rounds of `calls` calls each, in turn."""
    def batch(fn):
        def run():
            for _ in range(calls):
                fn()
        return run
    best, _ = best_times(*(batch(fn) for fn in fns), repeats=repeats)
    return [b / calls for b in best]


def small_section(env: Env) -> list[str]:
    """Per-call time on small arrays, where fpsim's Python around the kernel counts: quantize (values) of
    numpy arrays against ml_dtypes' round trip, of torch tensors against torch's round trip, and encode
    (codes) against ml_dtypes' cast; nearest-even."""
    args, torch, ml_dtypes = env.args, env.torch, env.ml_dtypes
    print("small arrays: float32 values, nearest-even; microseconds per call; ratio = peer / fpsim\n")
    header = (f"{'format':7} {'size':>6} | {'quantize':>8} {'ml rt':>7} {'ratio':>6} | {'tensor':>8} {'torch rt':>8} "
              f"{'ratio':>6} | {'encode':>8} {'ml_dtypes':>9} {'ratio':>6}")
    print(header)
    print("-" * len(header))
    ratios = []
    for name in SMALL_FORMATS_PER_CALL:
        fmt = fpsim.format(name)
        for n in SMALL_SIZES:
            data = env.x[:n].copy()
            calls = max(20, 200_000 // n)
            fns = [lambda: fpsim.quantize(data, fmt), lambda: fpsim.encode(data, fmt)]
            if ml_dtypes is not None:
                ml_type = fmt.ml_dtype
                fns += [lambda: data.astype(ml_type).astype(np.float32), lambda: data.astype(ml_type)]
            if torch is not None:
                tensor, torch_type = torch.from_numpy(data), fmt.torch_dtype
                fns += [lambda: fpsim.quantize(tensor, fmt), lambda: tensor.to(torch_type).float()]
            times = iter(per_call(*fns, calls=calls, repeats=args.repeats))
            t_q, t_enc = next(times), next(times)
            t_ml_rt, t_ml = (next(times), next(times)) if ml_dtypes is not None else (None, None)
            t_tq, t_trt = (next(times), next(times)) if torch is not None else (None, None)
            cells = [f"{name:7} {n:6d} | {t_q * 1e6:8.1f}"]
            cells.append(f"{'-':>7} {'-':>6} |" if t_ml_rt is None else
                         f"{t_ml_rt * 1e6:7.1f} {t_ml_rt / t_q:6.2f} |")
            cells.append(f"{'-':>8} {'-':>8} {'-':>6} |" if t_tq is None else
                         f"{t_tq * 1e6:8.1f} {t_trt * 1e6:8.1f} {t_trt / t_tq:6.2f} |")
            cells.append(f"{t_enc * 1e6:8.1f}" + ("" if t_ml is None else f" {t_ml * 1e6:9.1f} {t_ml / t_enc:6.2f}"))
            print(" ".join(cells), flush=True)
            if t_ml_rt is not None:
                ratios.append((t_ml_rt / t_q, name, n, "ml_dtypes"))
            if t_tq is not None:
                ratios.append((t_trt / t_tq, name, n, "torch"))
    print()
    summary = ["small arrays, quantize per call against the peers' round trips, smallest ratio: "
               + worst(ratios, lambda r, name, n, peer: f"{name} {n} values against {peer}, {r:.2f}")]
    print("\n".join(summary) + "\n")
    return summary


SECTIONS = {"float32": float32_section, "float64": float64_section, "blocks": blocks_section,
            "small": small_section}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000_000, help="elements (default 10 million)")
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--repeats", type=int, default=5, help="timed calls of fast functions")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"any of {', '.join(SECTIONS)}")
    parser.add_argument("--blocks", action="store_true", help="the blocks section only (--sections blocks)")
    args = parser.parse_args()
    if args.blocks:
        args.sections = "blocks"
    warnings.simplefilter("ignore")  # peers warn on overflow in their own arithmetic

    env = Env(args)
    versions = ", ".join(f"{peer} {version(peer)}"
                         for peer in ("numpy", "ml_dtypes", "torch", "gfloat", "pychop", "torchao"))
    kernel = f"compiled kernel: {_native.isa()} loops" if _native.available() else "no compiled kernel"
    print(f"fpsim {fpsim.__version__} ({kernel}), {versions}\n")
    summaries = []
    for name in args.sections.split(","):
        summaries += SECTIONS[name](env)
    print("summary\n" + "\n".join(summaries))


if __name__ == "__main__":
    main()
