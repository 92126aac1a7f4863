"""Tensor-core emulation speed: emulated multiply-accumulates per second, against numpy.

    python benchmarks/bench_tensorcore.py            # 1024 x 1024 x 1024, Hopper model
    python benchmarks/bench_tensorcore.py --n 512
    python benchmarks/bench_tensorcore.py --n 4096 --on cuda   # torch tensors on a GPU

For each input format the script emulates D = A @ B (A, B of N(0, 1) values
rounded to the format) with fpsim.TensorCore("h100", inputs, "fp32") and
times numpy's float64 matmul of the same matrices in the same run. The ratio
is numpy's time / fpsim's time (below 1: fpsim is slower, as expected of a
bit-exact emulation against a BLAS kernel). With --on DEVICE the matrices are
torch tensors on that device, and the peer is torch's float64 matmul there.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import fpsim


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1024, help="M = N = K (default 1024)")
    parser.add_argument("--device", default="h100")
    parser.add_argument("--formats", default="fp16,bf16,e4m3")
    parser.add_argument("--on", default=None, help="a torch device (cpu, cuda): torch tensors there, not numpy")
    args = parser.parse_args()
    sync = lambda: None  # noqa: E731
    if args.on is not None:
        import torch

        if args.on.startswith("cuda"):
            sync = torch.cuda.synchronize
    n = args.n
    rng = np.random.default_rng(0)
    print(f"fpsim {fpsim.__version__}, numpy {np.__version__}, {os.cpu_count()} CPUs; "
          f"D = A @ B with M = N = K = {n} ({n**3:.3g} multiply-accumulates)")
    print(f"{'inputs':7} {'model':34} {'fpsim s':>8} {'MAC/s':>9} {'peer f64 s':>11} {'ratio':>7}")
    for name in args.formats.split(","):
        A = np.asarray(fpsim.quantize(rng.standard_normal((n, n)), name), dtype=np.float64)
        B = np.asarray(fpsim.quantize(rng.standard_normal((n, n)), name), dtype=np.float64)
        if args.on is not None:
            A, B = torch.from_numpy(A).to(args.on), torch.from_numpy(B).to(args.on)
        tc = fpsim.TensorCore(args.device, inputs=name, output="fp32")
        sync()
        start = time.perf_counter()
        tc.matmul(A, B)
        sync()
        t_fpsim = time.perf_counter() - start
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            A @ B
            sync()
            best = min(best, time.perf_counter() - start)
        model = f"{args.device} F={tc.params.block_size} extra={tc.params.extra_bits}"
        print(f"{name:7} {model:34} {t_fpsim:8.2f} {n**3 / t_fpsim:9.3g} {best:11.4f} {best / t_fpsim:7.4f}",
              flush=True)


if __name__ == "__main__":
    main()
