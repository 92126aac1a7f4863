"""The capture tool's CUDA side: compiling its kernels, launching them, and the machine's facts.

The kernels (``cuda/mma_kernels.cu``, ``cuda/wgmma_kernels.cu``) run one MMA
instruction per tile on registers the host packed (`fragments`). They are
compiled with nvcc when it is there, else with NVRTC through CuPy, and
launched through CuPy, or, without CuPy, built and launched as a torch
extension (``load_inline``). torch and CuPy are imported only here, lazily, so
that everything else runs on any machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from . import devices

CUDA_SOURCES = {"mma": ("mma_kernels.cu", "ampere"), "wgmma": ("wgmma_kernels.cu", "hopper")}
"""Kernel group -> (its source in cuda/, the first generation it compiles for)."""


def cuda_source_path(group: str) -> Path:
    """Path of the .cu file of a kernel group."""
    return Path(__file__).resolve().parent / "cuda" / CUDA_SOURCES[group][0]


def fp8_path_from_sass(sass: str, kernel: str) -> str | None:
    """How an FP8 kernel reached the tensor cores, read from its SASS: "fp16" when it
    converts to binary16 and runs HMMA, "native" for QMMA/QGMMA, None if not found."""
    for block in sass.split("Function : ")[1:]:
        name, _, body = block.partition("\n")
        if name.strip() != kernel:
            continue
        if "QMMA" in body or "QGMMA" in body:
            return "native"
        if "HMMA" in body or "HGMMA" in body:
            return "fp16"
    return None


# ------------------------------------------------------------------ compiling
def find_nvcc() -> str | None:
    for cand in (shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if cand and os.path.exists(cand):
            return cand
    return None


def _has_block_scaled(cc: tuple) -> bool:
    """Whether a GPU of compute capability cc runs the block-scaled mma.sync (sm_120a and on)."""
    return any(i.compute_capability and tuple(cc) >= i.compute_capability for i in devices.INSTRUCTIONS)


def arch_for(cc: tuple) -> str:
    """XY of sm_XY, with the 'a' suffix where our kernels need the arch-specific features: on 9.0
    (wgmma needs sm_90a) and on the GPUs with block-scaled mma.sync (sm_120a)."""
    return "%d%d" % tuple(cc) + ("a" if tuple(cc) == (9, 0) or _has_block_scaled(cc) else "")


def defines(cc: tuple) -> list[str]:
    """Preprocessor flags: the FP8 kernels are left out where the GPU has no FP8 MMA, the
    block-scaled ones kept only where it has them."""
    gen = devices.generation_of(cc)
    has_fp8 = any(devices.is_fp8(i.inputs) and gen in i.generations for i in devices.INSTRUCTIONS)
    return ([] if has_fp8 else ["-DFPSIM_NO_FP8"]) + (["-DFPSIM_BLOCK_SCALED"] if _has_block_scaled(cc) else [])


def kernel_guard(kernel: str) -> str | None:
    """The preprocessor condition under which a kernel of cuda/*.cu is compiled (None: always)."""
    op = next(i for i in devices.INSTRUCTIONS for acc in i.outputs if i.kernel(acc) == kernel)
    if op.block_kind is not None:
        return "defined(FPSIM_BLOCK_SCALED)"
    return "!defined(FPSIM_NO_FP8)" if devices.is_fp8(op.inputs) else None


def compile_flags(cc: tuple) -> list[str]:
    """nvcc flags for a GPU of compute capability cc."""
    arch = arch_for(cc)
    return [f"-gencode=arch=compute_{arch},code=sm_{arch}", *defines(cc)]


def compile_cubin(group: str, cc: tuple, workdir: Path, progress) -> tuple:
    """Compile a kernel group to a cubin: nvcc if present, else NVRTC through
    CuPy. Returns (cubin path, compiler description)."""
    src = cuda_source_path(group)
    out = workdir / f"{group}.cubin"
    nvcc = find_nvcc()
    if nvcc:
        cmd = [nvcc, "-cubin", *compile_flags(cc), "-o", str(out), str(src)]
        progress(f"compile: {' '.join(cmd)}")
        t0 = time.time()
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"nvcc failed for {src.name}:\n{res.stdout}{res.stderr}")
        version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
        progress(f"compiled {src.name} in {time.time() - t0:.1f} s")
        return out, "nvcc " + version.strip().splitlines()[-1]
    from cupy_backends.cuda.libs import nvrtc  # noqa: WPS433 (lazy)

    prog = nvrtc.createProgram(src.read_text(), src.name, [], [])
    try:
        nvrtc.compileProgram(prog, [f"--gpu-architecture=sm_{arch_for(cc)}", *defines(cc)])
    except Exception as e:  # noqa: BLE001 (report the compiler log)
        raise RuntimeError(f"NVRTC failed for {src.name}: {e}\n{nvrtc.getProgramLog(prog)}") from e
    out.write_bytes(nvrtc.getCUBIN(prog))
    return out, "nvrtc %d.%d" % nvrtc.getVersion()


def dump_sass(cubin: Path, dest: Path | None, progress) -> str | None:
    """Write cuobjdump --dump-sass of the cubin next to the capture, if possible."""
    tool = shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump"
    if dest is None or not os.path.exists(tool):
        return None
    res = subprocess.run([tool, "--dump-sass", str(cubin)], capture_output=True, text=True)
    dest.write_text(res.stdout + res.stderr)
    progress(f"SASS written to {dest}")
    return res.stdout


# ------------------------------------------------------------------ launching
def launch_shape(kind: str, tiles: int) -> tuple:
    """(grid, block): 4 warps (tiles) per block for mma, one warpgroup per block for wgmma."""
    if kind == "mma":
        return -(-tiles // 4), 128
    return tiles, 128


class CupyLauncher:
    """Runs kernels of a cubin through CuPy (RawModule)."""

    backend = "cupy"
    sass = None  # the cubin's SASS, when dumped

    def __init__(self, cubin: Path):
        import cupy

        self.cp = cupy
        self.module = cupy.RawModule(path=str(cubin))

    def __call__(self, spec, a_regs, b_words, c_regs):
        cp = self.cp
        tiles = a_regs.shape[0]
        a = cp.asarray(np.ascontiguousarray(a_regs).reshape(-1))
        b = cp.asarray(np.ascontiguousarray(b_words).reshape(-1))
        c = cp.asarray(np.ascontiguousarray(c_regs).reshape(-1))
        d = cp.zeros(tiles * spec.threads * spec.c.regs, dtype=cp.uint32)
        grid, block = launch_shape(spec.group, tiles)
        fn = self.module.get_function(spec.kernel)
        fn((grid,), (block,), (a, b, c, d, np.int32(tiles)))
        cp.cuda.runtime.deviceSynchronize()
        return cp.asnumpy(d).reshape(tiles, spec.threads, spec.c.regs)


TORCH_LAUNCH_DECL = ("void launch(std::string name, int64_t grid, int64_t block, torch::Tensor a, "
                     "torch::Tensor b, torch::Tensor c, torch::Tensor d, int64_t tiles);")


def torch_launcher_source(group: str, kernels) -> str:
    """The .cu source plus a host launcher of its kernels for torch.utils.cpp_extension.load_inline."""
    def call(kernel):
        line = (f'  if (name == "{kernel}") {{ {kernel}<<<(unsigned)grid, (unsigned)block>>>(pa, pb, pc, pd, '
                f'(int)tiles); found = true; }}')
        guard = kernel_guard(kernel)
        return f"#if {guard}\n{line}\n#endif" if guard else line

    calls = "\n".join(call(kernel) for kernel in kernels)
    return (cuda_source_path(group).read_text() + """
#include <torch/extension.h>
#include <cuda_runtime.h>
void launch(std::string name, int64_t grid, int64_t block, torch::Tensor a, torch::Tensor b,
            torch::Tensor c, torch::Tensor d, int64_t tiles) {
  const u32* pa = reinterpret_cast<const u32*>(a.data_ptr<int32_t>());
  const u32* pb = reinterpret_cast<const u32*>(b.data_ptr<int32_t>());
  const u32* pc = reinterpret_cast<const u32*>(c.data_ptr<int32_t>());
  u32* pd = reinterpret_cast<u32*>(d.data_ptr<int32_t>());
  bool found = false;
""" + calls + """
  TORCH_CHECK(found, "kernel ", name, " is not built for this GPU");
  cudaError_t err = cudaDeviceSynchronize();
  TORCH_CHECK(err == cudaSuccess, "kernel ", name, " failed: ", cudaGetErrorString(err));
}
""")


class TorchLauncher:
    """Fallback without CuPy: the kernels built as a torch extension (load_inline)."""

    backend = "torch-inline"

    def __init__(self, group: str, cc: tuple, kernels):
        import torch
        from torch.utils.cpp_extension import load_inline

        self.torch = torch
        os.environ["TORCH_CUDA_ARCH_LIST"] = "%d.%d" % tuple(cc) + ("a" if arch_for(cc).endswith("a") else "")
        self.ext = load_inline(
            name=f"fpsim_{group}_kernels", cpp_sources=TORCH_LAUNCH_DECL,
            cuda_sources=torch_launcher_source(group, kernels), functions=["launch"],
            extra_cuda_cflags=defines(cc), verbose=False)

    def __call__(self, spec, a_regs, b_words, c_regs):
        torch = self.torch
        tiles = a_regs.shape[0]

        def dev(x):
            return torch.from_numpy(np.ascontiguousarray(x).reshape(-1).view(np.int32)).cuda()

        d = torch.zeros(tiles * spec.threads * spec.c.regs, dtype=torch.int32, device="cuda")
        grid, block = launch_shape(spec.group, tiles)
        self.ext.launch(spec.kernel, grid, block, dev(a_regs), dev(b_words), dev(c_regs), d, tiles)
        return d.cpu().numpy().view(np.uint32).reshape(tiles, spec.threads, spec.c.regs)


# ------------------------------------------------------------- machine facts
def cuda_problem() -> str | None:
    """Why this machine cannot capture (None when it can)."""
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed; the capture needs torch with CUDA."
    if not torch.cuda.is_available():
        built = torch.version.cuda
        return (f"no CUDA device: torch.cuda.is_available() is False (torch {torch.__version__}, "
                f"{'built with CUDA ' + built if built else 'built without CUDA'}). "
                "Run this on a machine with an NVIDIA GPU, or pass --simulate to test the host code.")
    return None


def _run(cmd) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def environment(simulate: bool) -> dict:
    """GPU name, compute capability, driver, CUDA, torch, CuPy, nvcc versions."""
    env = {"python": sys.version.split()[0], "numpy": np.__version__}
    try:
        import ml_dtypes

        env["ml_dtypes"] = ml_dtypes.__version__
    except ImportError:
        pass
    try:
        import torch

        env["torch"] = torch.__version__
        env["cuda"] = torch.version.cuda
        if not simulate and torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name(0)
            env["compute_capability"] = "%d.%d" % torch.cuda.get_device_capability(0)
    except ImportError:
        env["torch"] = None
    try:
        import cupy

        env["cupy"] = cupy.__version__
    except Exception:  # noqa: BLE001 (cupy may fail to import in many ways)
        env["cupy"] = None
    smi = _run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
    if smi:
        env["driver"] = smi.splitlines()[0].split(",")[-1].strip()
    nvcc = find_nvcc()
    if nvcc:
        lines = _run([nvcc, "--version"]).splitlines()
        env["nvcc"] = lines[-1] if lines else None
    return env
