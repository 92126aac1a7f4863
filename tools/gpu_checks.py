"""Checks of fpsim's numerics on a CUDA device: the same engine on torch CUDA tensors.

Run on a machine with an NVIDIA GPU, from the repository root:

    python3 tools/gpu_checks.py OUT.json

It runs the gradient-underflow analyzer on a CUDA model under CUDA's sync
debug mode (any host synchronisation in its hooks raises), and compares, bit
for bit, fpsim on CUDA tensors with fpsim on numpy (whose
correctness the CPU test suite establishes against the exact oracle,
ml_dtypes and torch), and times quantize on the GPU against torch's own
float8 casts. Writes a JSON report and exits non-zero when any comparison
fails.
"""

from __future__ import annotations

import json
import sys
import time
import warnings

import numpy as np
import torch

import fpsim
from fpsim.formats import PRESETS
from fpsim.modes import DETERMINISTIC_MODES
from fpsim.tensorcore import devices
from fpsim.tensorcore.core import TensorCore


def edges() -> list[float]:
    """Each preset's range edges, from its Format: max, the overflow tie above it (max plus half a
    step of the top binade), min normal, min subnormal and the tie below it, with both signs."""
    values = [0.0, np.inf, np.nan]
    for fmt in PRESETS.values():
        if fmt.bits > 32:
            continue
        top_step = 2.0 ** (fmt.emax - fmt.man_bits)
        values += [float(fmt.max), float(fmt.max) + top_step / 2, float(fmt.min_normal),
                   float(fmt.min_subnormal), float(fmt.min_subnormal) / 2]
    return values + [-v for v in values]


def inputs(rng) -> np.ndarray:
    """Values of every magnitude, ties and edges included."""
    wide = rng.standard_normal(200_000) * 2.0 ** rng.integers(-140, 130, 200_000)
    halves = (rng.integers(-4000, 4000, 50_000) + 0.5) * 2.0 ** rng.integers(-30, 10, 50_000)
    return np.concatenate([wide, np.array(edges()), halves])


def bits_equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    view = np.uint64 if a.dtype == np.float64 else np.uint32
    return a.view(view) == b.view(view)


def check_quantize(report, rng) -> int:
    failures = 0
    x64 = inputs(rng)
    for dtype in (np.float32, np.float64):
        x = x64.astype(dtype)
        xc = torch.from_numpy(x).cuda()
        for name, fmt in PRESETS.items():
            for mode in DETERMINISTIC_MODES:
                for saturate in (False, True):
                    want = fpsim.quantize(x, fmt, mode, saturate)
                    got = fpsim.quantize(xc, fmt, mode, saturate)
                    assert got.is_cuda
                    same = bits_equal(np.asarray(want), got.cpu().numpy())
                    if not same.all():
                        failures += 1
                        i = int(np.flatnonzero(~same)[0])
                        report["quantize_mismatches"].append(
                            f"{np.dtype(dtype).name} {name} {mode} sat={saturate}: x={x[i]!r} numpy={want[i]!r} "
                            f"cuda={got.cpu().numpy()[i]!r} ({int((~same).sum())} elements)")
                report["quantize_cases"] += 1
    return failures


def check_codec(report, rng) -> int:
    failures = 0
    x = inputs(rng).astype(np.float32)
    xc = torch.from_numpy(x).cuda()
    for name, fmt in PRESETS.items():
        if fmt.bits > 32 or not fmt.has_nan:
            continue
        data = np.abs(x) if not fmt.signed else x
        codes = fpsim.encode(data, fmt)
        codes_cuda = fpsim.encode(torch.from_numpy(data).cuda(), fmt)
        same = codes == codes_cuda.cpu().numpy().astype(codes.dtype)
        values = fpsim.decode(codes, fmt)
        values_cuda = fpsim.decode(codes_cuda, fmt).cpu().numpy()
        same_values = bits_equal(np.asarray(values, dtype=np.float32), values_cuda.astype(np.float32))
        if not (same.all() and same_values.all()):
            failures += 1
            report["codec_mismatches"].append(name)
        report["codec_cases"] += 1
    del xc
    return failures


def check_stochastic(report) -> int:
    x = torch.full((1_000_000,), 1.0 + 2.0**-5, device="cuda")  # 1/4 of the way from 1 to 1.125 in e4m3
    g = torch.Generator(device="cuda").manual_seed(1)
    y = fpsim.quantize(x, "e4m3", "stochastic", generator=g)
    values = set(torch.unique(y).cpu().tolist())
    frequency = float((y > 1.0).float().mean())
    g2 = torch.Generator(device="cuda").manual_seed(1)
    again = fpsim.quantize(x, "e4m3", "stochastic", generator=g2)
    report["stochastic"] = {"values": sorted(values), "frequency_up": frequency, "expected": 0.25,
                            "reproducible": bool(torch.equal(y, again))}
    # 5 sigma of a binomial(1e6, 1/4): false failure below 1e-6
    ok = values <= {1.0, 1.125} and abs(frequency - 0.25) < 5 * (0.25 * 0.75 / 1e6) ** 0.5 and torch.equal(y, again)
    return 0 if ok else 1


def check_tensorcore(report, rng) -> int:
    failures = 0
    for device, inputs_fmt, output, path in sorted(devices.PARAMETERS):  # every modelled data path
        A = np.asarray(fpsim.quantize(rng.standard_normal((48, 96)) * 2.0 ** rng.integers(-6, 6, (48, 96)), inputs_fmt))
        B = np.asarray(fpsim.quantize(rng.standard_normal((96, 24)), inputs_fmt))
        C = np.asarray(fpsim.quantize(rng.standard_normal((48, 24)), output), dtype=np.float64)
        tc = TensorCore(device, inputs_fmt, output, path=path)
        want = np.asarray(tc.matmul(A, B, C), dtype=np.float32)
        got = tc.matmul(torch.from_numpy(A).cuda(), torch.from_numpy(B).cuda(), torch.from_numpy(C).cuda())
        same = bits_equal(want, got.cpu().float().numpy())
        report["tensorcore"].append({"device": device, "inputs": inputs_fmt, "output": output, "path": path,
                                     "equal": bool(same.all()), "cuda": bool(got.is_cuda)})
        failures += int(not same.all())
    return failures


def check_analyzer(report) -> int:
    """fpsim.watch on a CUDA model: no host synchronisation in its hooks (CUDA's sync debug mode
    raises on any), the same element counts as the same run on the CPU, and the step-time cost."""
    import time as _time

    def run(device, watched, steps=30, sync_check=False):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                    torch.nn.ReLU(), torch.nn.Linear(512, 10)).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        g = torch.Generator(device="cpu").manual_seed(1)
        x = torch.randn(steps, 128, 256, generator=g).to(device)
        y = torch.randint(0, 10, (steps, 128), generator=g).to(device)
        watcher = fpsim.watch(model, formats=("fp16", "bf16", "e4m3", "e5m2")) if watched else None

        def loop():
            for i in range(steps):
                optimizer.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(x[i]), y[i]) * 1e-3
                loss.backward()
                optimizer.step()

        if device == "cuda":
            torch.cuda.synchronize()
        start = _time.perf_counter()
        if watcher is not None:
            with watcher:
                if sync_check:
                    torch.cuda.set_sync_debug_mode("error")
                try:
                    loop()
                finally:
                    if sync_check:
                        torch.cuda.set_sync_debug_mode(0)
        else:
            loop()
        if device == "cuda":
            torch.cuda.synchronize()
        return watcher, _time.perf_counter() - start

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gpu_watch, _ = run("cuda", True, sync_check=True)
    cpu_watch, _ = run("cpu", True)
    gpu_report, cpu_report = gpu_watch.report(), cpu_watch.report()
    counts_equal = [layer.name for layer in gpu_report.layers] == [layer.name for layer in cpu_report.layers] and all(
        gl.tensors[k].hist.total == cl.tensors[k].hist.total
        for gl, cl in zip(gpu_report.layers, cpu_report.layers) for k in gl.tensors)
    _, t_plain = run("cuda", False, steps=200)
    _, t_watch = run("cuda", True, steps=200)
    result = {
        "hook_error": gpu_watch.observation_error, "warnings": [str(w.message)[:200] for w in caught],
        "layers": [layer.name for layer in gpu_report.layers],
        "verdicts_gpu": {n: {f: gpu_report.verdict(n, f) for f in gpu_report.formats}
                         for n in (layer.name for layer in gpu_report.layers)},
        "verdicts_cpu": {n: {f: cpu_report.verdict(n, f) for f in cpu_report.formats}
                         for n in (layer.name for layer in cpu_report.layers)},
        "element_counts_equal_to_cpu": bool(counts_equal),
        "step_time_ratio_every_step_200_steps": t_watch / t_plain,
    }
    report["analyzer_cuda"] = result
    return 0 if gpu_watch.observation_error is None and counts_equal and result["layers"] else 1


def time_gpu(report) -> None:
    """quantize on a CUDA tensor against torch's own casts, 100 million float32 elements."""
    x = torch.randn(100_000_000, device="cuda") * 4

    def timed(fn, repeats=5):
        fn()
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - start)
        return best

    for name in ("e4m3", "e5m2", "bf16"):
        dtype = PRESETS[name].torch_dtype
        t_torch = timed(lambda: x.to(dtype).to(torch.float32))
        t_fpsim = timed(lambda: fpsim.quantize(x, name))
        entry = {"torch_roundtrip": t_torch * 1e3, "fpsim_quantize": t_fpsim * 1e3,
                 "ratio_torch_over_fpsim": t_torch / t_fpsim}
        try:  # the fused kernel: the engine compiled by torch.compile (Triton), the same bits
            start = time.perf_counter()
            fused = fpsim.quantize(x, name, compile=True)
            torch.cuda.synchronize()
            entry["compile_first_call_s"] = time.perf_counter() - start
            entry["compiled_bits_equal"] = bool(torch.equal(fused.view(torch.int32),
                                                            fpsim.quantize(x, name).view(torch.int32)))
            t_compiled = timed(lambda: fpsim.quantize(x, name, compile=True))
            entry.update(fpsim_quantize_compiled=t_compiled * 1e3, ratio_torch_over_compiled=t_torch / t_compiled)
        except Exception as err:  # noqa: BLE001 - reported
            entry["compiled_error"] = repr(err)[:500]
        report["gpu_timing_ms"][name] = entry


def main() -> int:
    out = sys.argv[1] if len(sys.argv) > 1 else "gpu_checks.json"
    warnings.simplefilter("ignore")
    report = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "quantize_cases": 0,
              "quantize_mismatches": [], "codec_cases": 0, "codec_mismatches": [], "tensorcore": [],
              "gpu_timing_ms": {}}
    rng = np.random.default_rng(7)
    start = time.time()
    failures = check_quantize(report, rng)
    failures += check_codec(report, rng)
    failures += check_stochastic(report)
    failures += check_tensorcore(report, rng)
    try:
        failures += check_analyzer(report)
    except Exception as err:  # noqa: BLE001 - reported, counted as a failure
        report["analyzer_cuda_error"] = repr(err)
        failures += 1
    try:
        time_gpu(report)
    except Exception as err:  # noqa: BLE001 - timing is informative only
        report["gpu_timing_error"] = repr(err)
    report["failures"] = failures
    report["seconds"] = time.time() - start
    with open(out, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps({k: v for k, v in report.items() if k != "quantize_mismatches"}, indent=1))
    print("quantize mismatches:", report["quantize_mismatches"][:20])
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
