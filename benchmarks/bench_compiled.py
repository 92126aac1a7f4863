"""quantize(t, fmt, compile=True) on torch tensors: the engine compiled by torch.compile, against
torch's own round trip through the format's dtype (`t.to(float8).to(float32)`) and fpsim's default
path for that device, on the same tensor in the same run.

    python benchmarks/bench_compiled.py                  # CUDA when available, else the CPU
    python benchmarks/bench_compiled.py --device cpu --n 10000000

On the CPU fpsim's default is its C kernel; on a GPU it is the eager torch engine (some fifty
elementwise kernels), which compile=True fuses into one Triton kernel. Each row first checks that
compile=True gives the same bits as the default path. The first compiled call per format compiles
(its time is printed apart). ratio = peer time / fpsim time: above 1, fpsim is faster.
"""

from __future__ import annotations

import argparse
import time

import torch

import fpsim
from fpsim.formats import PRESETS

FORMATS = ("e4m3", "e5m2", "bf16", "fp16")


def best_time(fn, device, repeats: int) -> float:
    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    fn()
    sync()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--n", type=int, default=100_000_000 if torch.cuda.is_available() else 10_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--formats", default=",".join(FORMATS))
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    x = torch.randn(args.n, generator=torch.Generator().manual_seed(0)).to(device) * 4
    name_of = torch.cuda.get_device_name(0) if device.type == "cuda" else "CPU, one thread"
    print(f"fpsim {fpsim.__version__}, torch {torch.__version__}, {name_of}; {args.n:,} float32 values N(0,1)*4; "
          f"times in ms; ratio = torch round trip / fpsim\n")
    print(f"{'format':7} {'compile s':>9} {'same bits':>9} | {'torch rt':>9} | {'default':>9} {'ratio':>6} | "
          f"{'compiled':>9} {'ratio':>6}")
    for name in args.formats.split(","):
        dtype = PRESETS[name].torch_dtype
        start = time.perf_counter()
        fused = fpsim.quantize(x, name, compile=True)
        compile_s = time.perf_counter() - start
        same = torch.equal(fused.view(torch.int32), fpsim.quantize(x, name).view(torch.int32))
        t_torch = best_time(lambda: x.to(dtype).to(torch.float32), device, args.repeats)
        t_default = best_time(lambda: fpsim.quantize(x, name), device, args.repeats)
        t_compiled = best_time(lambda: fpsim.quantize(x, name, compile=True), device, args.repeats)
        print(f"{name:7} {compile_s:9.1f} {str(same):>9} | {t_torch * 1e3:9.2f} | {t_default * 1e3:9.2f} "
              f"{t_torch / t_default:6.2f} | {t_compiled * 1e3:9.2f} {t_torch / t_compiled:6.2f}", flush=True)


if __name__ == "__main__":
    main()
