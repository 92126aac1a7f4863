"""Library-level cases of the capture: torch.matmul, torch.mm and the scaled matmuls on CUDA.

What cuBLAS returns through PyTorch, with the flags that change its numerics
(reduced-precision reductions, TF32, FP8 fast accumulation), for K = 64, 1024
and 8192. Inputs are N(0, 1) values rounded to each format (`samples.rounded`).
The block-scaled GEMMs (MXFP8, MXFP4, NVFP4 through
``torch.nn.functional.scaled_mm``, Blackwell's tcgen05 path) take element
values and random block scales (`scaled_operands` lays them out); GPUs or
torch builds without them record a skip with torch's reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..blocks import BLOCK_PRESETS
from ..formats import format as get_format
from ..rounding import quantize
from . import scaled_operands
from .captures import CaptureCase, f32_bits, widen_to_f32_bits
from .samples import case_seed, rounded


LIBRARY_KS = (64, 1024, 8192)
LIBRARY_MN = 32
BLOCK_SCALED = {"mxfp8_e4m3": "BlockWise1x32", "mxfp8_e5m2": "BlockWise1x32", "mxfp4": "BlockWise1x32",
                "nvfp4": "BlockWise1x16"}
"""The block formats captured through scaled_mm, with their torch ScalingType (NVFP4 with its block
scales only: its FP32 tensor scale is a separate multiplier of the output)."""


def _first_line(e: BaseException, limit: int = 300) -> str:
    text = str(e).strip()
    line = text.splitlines()[0] if text else type(e).__name__
    return line if len(line) <= limit else line[:limit] + "..."


def _torch_out_bits(t, output: str) -> np.ndarray:
    """A result tensor -> binary32 bit patterns of its values (exact widening)."""
    import torch

    if output == "fp32":
        return t.float().cpu().numpy().view(np.uint32)
    return widen_to_f32_bits(t.contiguous().view(torch.int16).cpu().numpy().view(np.uint16), output)


class _Flags:
    """Set torch.backends.cuda.matmul flags for one call and restore them after."""

    def __init__(self, torch, **flags):
        self.torch, self.flags, self.old = torch, flags, {}

    def __enter__(self):
        m = self.torch.backends.cuda.matmul
        for key, value in self.flags.items():
            self.old[key] = getattr(m, key)
            setattr(m, key, value)
        return self

    def __exit__(self, *exc):
        m = self.torch.backends.cuda.matmul
        for key, value in self.old.items():
            setattr(m, key, value)


@dataclass(frozen=True)
class LibraryCall:
    """One library-level case: a torch call on inputs of given formats."""

    name: str
    fa: str             # A's format
    fb: str             # B's format
    output: str
    call: str           # what is recorded as the case's "instruction"
    flags: dict
    notes: str
    optional: bool      # an API this torch may lack: a failure is a skip, not an error


def library_calls(k: int, formats) -> list:
    """The torch calls captured for one K, in order (cases sharing inputs adjacent)."""
    calls = []
    for fmt in ("fp16", "bf16"):
        if fmt not in formats:
            continue
        flag = f"allow_{fmt}_reduced_precision_reduction"
        for reduced in (False, True):
            calls.append(LibraryCall(
                f"torch_matmul_{fmt}_rr{int(reduced)}_k{k}", fmt, fmt, fmt, "torch.matmul",
                {flag: reduced}, f"{fmt} inputs and output through cuBLAS", False))
        calls.append(LibraryCall(
            f"torch_mm_{fmt}_outfp32_k{k}", fmt, fmt, "fp32", "torch.mm(out_dtype=torch.float32)",
            {}, f"{fmt} inputs, fp32 output", True))
    if "tf32" in formats:
        calls.append(LibraryCall(
            f"torch_matmul_tf32_k{k}", "tf32", "tf32", "fp32",
            "torch.matmul (float32 tensors, TF32 on)", {"tf32": True},
            "inputs are tf32 values held in float32 tensors", False))
    for fa, fb in (("e4m3", "e4m3"), ("e5m2", "e4m3"), ("e4m3", "e5m2")):
        if fa not in formats and fb not in formats:
            continue
        for out in ("fp32", "bf16"):
            for fast in (False, True):
                calls.append(LibraryCall(
                    f"torch_scaled_mm_{fa}x{fb}_{out}_fast{int(fast)}_k{k}", fa, fb, out,
                    "torch._scaled_mm", {"use_fast_accum": fast, "scale_a": 1.0, "scale_b": 1.0},
                    "unit scales; B column-major", True))
    for fmt, recipe in BLOCK_SCALED.items():
        if fmt not in formats:
            continue
        block = BLOCK_PRESETS[fmt]
        for out in ("fp32", "bf16"):
            calls.append(LibraryCall(
                f"torch_scaled_mm_{fmt}_{out}_k{k}", fmt, fmt, out, "torch.nn.functional.scaled_mm",
                {"scale_recipe": recipe, "swizzle": "SWIZZLE_32_4_4"},
                f"{block.element.name} elements, one {block.scale.name} scale per {block.block_size} of K "
                "(random, 2^-3..2^3); B column-major", True))
    return calls


def _block_scales(rng, shape, fmt: str) -> np.ndarray:
    """Random scale values: powers of two 2^-3..2^3 (E8M0); E4M3 values in [1/8, 8] for NVFP4."""
    scale = BLOCK_PRESETS[fmt].scale
    if scale.name == "e8m0":
        return np.exp2(rng.integers(-3, 4, shape)).astype(np.float64)
    return np.asarray(quantize(np.exp2(rng.uniform(-3, 3, shape)), scale), dtype=np.float64)


def _block_inputs(rng, torch, c: LibraryCall, mn: int, k: int, dev):
    """Element values, scale values and scaled_mm's tensors of one block-scaled call."""
    block = BLOCK_PRESETS[c.fa]
    a = rounded(rng.standard_normal((mn, k)), block.element)
    b = rounded(rng.standard_normal((k, mn)), block.element)
    sa = _block_scales(rng, (mn, k // block.block_size), c.fa)
    sb = _block_scales(rng, (k // block.block_size, mn), c.fa)
    return (a, b, sa, sb), scaled_operands.operands(torch, a, b, sa, sb, block, dev)


def _run_library_call(torch, c: LibraryCall, A, B, dev, scales=None):
    """The result tensor of one call (flags set for the call only)."""
    if c.call == "torch.nn.functional.scaled_mm":
        F = torch.nn.functional
        recipe, swizzle = getattr(F.ScalingType, c.flags["scale_recipe"]), getattr(F.SwizzleType, c.flags["swizzle"])
        return F.scaled_mm(A, B, scales[0], recipe, scales[1], recipe, swizzle_a=swizzle, swizzle_b=swizzle,
                           output_dtype=get_format(c.output).torch_dtype)
    if c.call == "torch._scaled_mm":
        one = torch.ones((), device=dev, dtype=torch.float32)
        odt = get_format(c.output).torch_dtype
        return torch._scaled_mm(A, B, scale_a=one, scale_b=one, out_dtype=odt,
                                use_fast_accum=c.flags["use_fast_accum"])
    if c.call.startswith("torch.mm(out_dtype"):
        return torch.mm(A, B, out_dtype=torch.float32)
    with _Flags(torch, **_torch_flags(torch, c.flags)):
        return torch.matmul(A, B)


def _torch_flags(torch, flags: dict) -> dict:
    """Our flag names -> torch.backends.cuda.matmul attributes."""
    if flags.get("tf32"):
        m = torch.backends.cuda.matmul
        return {"fp32_precision": "tf32"} if hasattr(m, "fp32_precision") else {"allow_tf32": True}
    return flags


def library_cases(seed: int, formats, ks=LIBRARY_KS, mn=LIBRARY_MN, dev="cuda"):
    """Yield ("case", CaptureCase), ("skip", {...}) or ("fail", {...}) per torch call.

    ``dev="cpu"`` (used by --simulate) exercises the same code on torch's CPU
    kernels; such cases are not tensor-core data.
    """
    import torch

    rng = np.random.default_rng(case_seed(seed, "library"))

    def to_dev(x, fmt, column_major=False):
        x = np.ascontiguousarray(x.T if column_major else x, dtype=np.float32)
        t = torch.from_numpy(x).to(dev)
        dtype = get_format(fmt).torch_dtype      # None for tf32: its values are held in float32 tensors
        t = t if dtype is None else t.to(dtype)
        return t.t() if column_major else t

    for k in ks:
        inputs = {}                              # (fa, fb, call) -> (values, tensors, first case name)
        for c in library_calls(k, formats):
            key = (c.fa, c.fb, c.call if "scaled_mm" in c.call else "matmul")
            try:
                if key not in inputs:
                    if c.fa in BLOCK_SCALED:
                        values, tensors = _block_inputs(rng, torch, c, mn, k, dev)
                    else:
                        a = rounded(rng.standard_normal((mn, k)), c.fa)
                        b = rounded(rng.standard_normal((k, mn)), c.fb)
                        # _scaled_mm wants B column-major
                        values = (a, b, None, None)
                        tensors = (to_dev(a, c.fa), to_dev(b, c.fb, c.call == "torch._scaled_mm"))
                    inputs[key] = [values, tensors, None]
                (a, b, sa, sb), tensors, first = inputs[key]
                d = _run_library_call(torch, c, tensors[0], tensors[1], dev, tensors[2:])
                if dev == "cuda":
                    torch.cuda.synchronize()
                d_bits = _torch_out_bits(d, c.output)
            except Exception as e:  # noqa: BLE001 (an unsupported call or a failure)
                what = "skip" if c.optional else "fail"
                yield what, {"case": c.name, "reason": f"{c.call}: {_first_line(e)}"}
                continue
            meta = {"name": c.name, "kind": "matmul", "level": "library", "inputs": c.fa,
                    "c_format": None, "output": c.output, "k": int(k), "instruction": c.call,
                    "flags": dict(c.flags, **({"torch_flags": _torch_flags(torch, c.flags)}
                                             if c.flags.get("tf32") else {})),
                    "notes": f"{c.notes}; {mn}x{k} @ {k}x{mn}, d = a @ b (no c)"}
            if c.fb != c.fa:
                meta["inputs_b"] = c.fb
            if first:
                meta["same_inputs_as"] = first
            else:
                inputs[key][2] = c.name
            scales = (None, None) if sa is None else (f32_bits(sa), f32_bits(sb))
            yield "case", CaptureCase(meta, f32_bits(a), f32_bits(b), None, d_bits, None, *scales)
