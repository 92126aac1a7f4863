"""Capture real tensor-core outputs on a CUDA GPU into an fpsim capture file (`fpsim capture`).

    from fpsim.tensorcore import gpu_capture
    run = gpu_capture.run(gpu_capture.CaptureOptions(out="h200.npz"), progress=print)

Two levels are captured (see `captures` for the file):

* instruction level: small CUDA kernels (`kernels`, ``cuda/*.cu``), one per
  MMA instruction of `devices.INSTRUCTIONS` from Ampere on, each running ONE
  warp-level ``mma.sync`` or one warpgroup ``wgmma.mma_async`` per tile. Every
  recorded output is a designed row (`probes`): a tile holds 8 rows,
  A[r, :] = a_r, B[:, r] = b_r, C[r, r] = c_r for r < 8 (all else 0), and only
  D[r, r] is kept. The host packs all fragment registers (`fragments`), so the
  kernels only move 32-bit words;
* library level: ``torch.matmul``/``torch.mm``/``torch._scaled_mm`` and the
  block-scaled ``torch.nn.functional.scaled_mm`` (MXFP8, MXFP4, NVFP4) on CUDA
  (`library_capture`).

Self-check: every instruction case also runs full random small-integer tiles
and rows of the ``exact`` probe family, whose exact results (float64 sums,
independent of any model) every correct MMA returns. A difference means a
layout or packing bug: the case is recorded in ``meta["failures"]`` and left
out, and the capture goes on. Each group of cases (mma, wgmma, library) runs
in its own process, so that a kernel that crashes or hangs cannot take the
others with it; its progress comes back line by line to the `progress`
callback.

``simulate=True`` runs the instruction-level pipeline through fpsim's own
model of the Hopper tensor cores instead of a GPU (and the library calls on
torch's CPU kernels): that is how the host code is tested. Nothing simulated is
tensor-core data.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from . import devices, kernels
from .captures import Capture, CaptureCase, f32_bits, load_capture, merge_captures, new_meta, save_capture, \
    widen_to_f32_bits
from .core import TensorCore
from .fragments import (Operand, element_bits, frag_a, frag_b, frag_c, from_elements, pack, pack_scales, pack_wgmma_b,
                        read_wgmma_b, scale_cols_b, scale_rows_a, to_elements, unpack, unpack_scales)
from .library_capture import library_cases
from .probes import ProbeSet, concat, probe_rows
from .samples import case_seed, random_rows, rounded
from ..formats import format as get_format
from ..rounding import quantize

GROUPS = ("mma", "library", "wgmma")       # the riskiest group last
BACKENDS = ("auto", "cupy", "torch")
LAYOUT_TILES = 4          # full random-integer tiles per case for the self-check
# seconds before a group's process is stopped; they add up to less than the
# job's outer limit (tools/gpu_capture_job.sh), so a hang costs one group only
GROUP_TIMEOUT_S = {"mma": 120, "library": 90, "wgmma": 70}
FP8_SM90_NOTE = ("On sm_90 ptxas lowers FP8 mma.sync to F2FP conversions (fp8 -> f16) and two "
                 "chained HMMA f16 instructions started from a zero accumulator, then adds C "
                 "with a separate FADD (f32) or HADD2 (f16) (cuobjdump of nvcc 13.0 sm_90a "
                 "output); Hopper's native FP8 tensor-core path is wgmma (QGMMA).")
WGMMA_NOTE = ("A from registers, B from shared memory (K-major, no swizzle), one warpgroup per m64n8 "
              "tile; the path cuBLAS uses on Hopper")
BLOCK_NOTE = ("Block scales per row of A and column of B with selectors {byte-id, thread-id} = {0, 0}, "
              "in the register layout of fragments.scale_rows_a / scale_cols_b (from CUTLASS's SM120 traits).")


# ---------------------------------------------------------------------------
# The instructions captured: one kernel per (instruction, accumulator)
# ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class MmaSpec:
    """One kernel of cuda/*.cu: an instruction of `devices` with one accumulator format."""

    op: devices.Instruction
    acc: str            # accumulator = C = D format: "fp32" or "fp16"

    kernel = property(lambda self: self.op.kernel(self.acc))
    instruction = property(lambda self: self.op.ptx(self.acc))
    group = property(lambda self: self.op.kind)   # "mma" (one warp) or "wgmma" (one warpgroup)
    inputs = property(lambda self: self.op.inputs)
    element = property(lambda self: self.op.element)  # A's and B's elements (a block format's element)
    scaling = property(lambda self: self.op.scaling)  # the block-scaled kind, or None
    k = property(lambda self: self.op.k)
    m = property(lambda self: self.op.m)
    threads = property(lambda self: 32 if self.group == "mma" else 128)

    @property
    def scale_words(self) -> int:
        """Words per lane after A's (and B's) registers: the block scales' register."""
        return 1 if self.scaling else 0

    @property
    def blocks(self) -> int:
        """Scales per row of A (and column of B): 0 without block scaling."""
        return self.k // self.scaling.block if self.scaling else 0

    @property
    def notes(self) -> str:
        if self.group == "wgmma":
            return WGMMA_NOTE
        if self.scaling:
            return BLOCK_NOTE
        return FP8_SM90_NOTE if devices.is_fp8(self.inputs) else ""

    @property
    def a(self) -> Operand:
        return frag_a(self.k, element_bits(self.element), self.threads)

    @property
    def b(self) -> Operand:
        return frag_b(self.k, element_bits(self.element))

    @property
    def c(self) -> Operand:
        return frag_c(element_bits(self.acc), self.threads)


def _has_kernel(op: devices.Instruction) -> bool:
    first = devices.GENERATIONS.index(kernels.CUDA_SOURCES[op.kind][1]) if op.kind in kernels.CUDA_SOURCES else None
    return first is not None and any(devices.GENERATIONS.index(g) >= first for g in op.generations)


def _captured(op: devices.Instruction) -> bool:
    """Block-scaled mma.sync (sm_120a) is captured where its elements fill their register slots: MXFP8
    in kind::mxf8f6f4, FP4 packed in kind::mxf4 and mxf4nvf4. FP6 and FP4 inside mxf8f6f4's 8-bit
    slots are not: where in the byte they sit is not modelled."""
    return op.block_kind != "mxf8f6f4" or get_format(op.element).bits == 8


MMA_SPECS = tuple(MmaSpec(op, acc) for op in devices.INSTRUCTIONS if _has_kernel(op) and _captured(op)
                  for acc in op.outputs)
SIMULATED_DEVICE = next(g for g in devices.GENERATIONS
                        if all(g in s.op.generations for s in MMA_SPECS if not s.scaling))
"""The generation whose model stands in for the GPU with simulate=True: one that has every instruction
(the block-scaled ones aside: those run on their own generation's model, `simulated_generation`)."""


def simulated_generation(spec: MmaSpec) -> str:
    return SIMULATED_DEVICE if SIMULATED_DEVICE in spec.op.generations else spec.op.generations[0]


# ---------------------------------------------------------------------------
# Tiles from rows, packing, and the self-check
# ---------------------------------------------------------------------------

def rows_to_tiles(a, b, c, m: int):
    """8 rows per tile: A[t, r, :] = a_r, B[t, :, r] = b_r, C[t, r, r] = c_r."""
    a, b, c = (np.asarray(x, dtype=np.float64) for x in (a, b, c))
    rows, k = a.shape
    tiles = -(-rows // 8)
    pad = tiles * 8 - rows
    a = np.concatenate([a, np.zeros((pad, k))]).reshape(tiles, 8, k)
    b = np.concatenate([b, np.zeros((pad, k))]).reshape(tiles, 8, k)
    c = np.concatenate([c, np.zeros(pad)]).reshape(tiles, 8)
    A = np.zeros((tiles, m, k))
    A[:, :8, :] = a
    B = b.transpose(0, 2, 1).copy()
    C = np.zeros((tiles, m, 8))
    C[:, np.arange(8), np.arange(8)] = c
    return A, B, C


def tile_diagonals(D, rows: int) -> np.ndarray:
    """D[t, r, r] for r < 8, flattened back to the first ``rows`` rows."""
    return np.asarray(D)[:, np.arange(8), np.arange(8)].reshape(-1)[:rows]


def layout_tiles(spec: MmaSpec, n: int, seed: int):
    """n full tiles of small integers: every entry of D is exactly known."""
    rng = np.random.default_rng(seed)
    A = rng.integers(-3, 4, (n, spec.m, spec.k)).astype(np.float64)
    B = rng.integers(-3, 4, (n, spec.k, 8)).astype(np.float64)
    C = rng.integers(-8, 9, (n, spec.m, 8)).astype(np.float64)
    return A, B, C


def pack_operands(spec: MmaSpec, A, B, C, SA=None, SB=None):
    """Float64 tiles -> (a_regs, b_words, c_regs) as the kernel reads them. Block-scaled: SA (T, M,
    blocks) and SB (T, 8, blocks) the scale values (default 1), each operand's scale register after
    its own."""
    b_elements = to_elements(B, spec.element)
    if spec.group == "mma":
        b_words = pack(b_elements, spec.b)
    else:
        b_words = pack_wgmma_b(b_elements, spec.k, element_bits(spec.element))
    a_regs = pack(to_elements(A, spec.element), spec.a)
    if spec.scaling:
        tiles = A.shape[0]
        SA = np.ones((tiles, spec.m, spec.blocks)) if SA is None else SA
        SB = np.ones((tiles, 8, spec.blocks)) if SB is None else SB
        a_regs = np.concatenate([a_regs, pack_scales(to_elements(SA, spec.scaling.scale), scale_rows_a())], -1)
        b_words = np.concatenate([b_words, pack_scales(to_elements(SB, spec.scaling.scale), scale_cols_b())], -1)
    return a_regs, b_words, pack(to_elements(C, spec.acc), spec.c)


def simulated_launcher(spec: MmaSpec, a_regs, b_words, c_regs) -> np.ndarray:
    """Launcher stand-in for simulate=True: the registers unpacked, fpsim's model of the instruction
    (`simulated_generation`), its result packed as the D registers."""
    A = from_elements(unpack(a_regs[..., :spec.a.regs], spec.a), spec.element)
    if spec.group == "mma":
        B = from_elements(unpack(b_words[..., :spec.b.regs], spec.b), spec.element)
    else:
        B = from_elements(read_wgmma_b(b_words, spec.k, element_bits(spec.element)), spec.element)
    C = from_elements(unpack(c_regs, spec.c), spec.acc)
    tiles, m, k = A.shape
    tc = TensorCore(simulated_generation(spec), spec.inputs, spec.acc, instruction=spec.op.shape)
    shape = (tiles, m, 8, k)
    scales = {}
    if spec.scaling:
        SA = from_elements(unpack_scales(a_regs[..., spec.a.regs:], scale_rows_a(), m, spec.blocks), spec.scaling.scale)
        SB = from_elements(unpack_scales(b_words[..., spec.b.regs:], scale_cols_b(), 8, spec.blocks), spec.scaling.scale)
        scales = {"scale_a": np.broadcast_to(SA[:, :, None, :], shape[:3] + (spec.blocks,)),
                  "scale_b": np.broadcast_to(SB[:, None, :, :], shape[:3] + (spec.blocks,))}
    D = tc.dot(np.broadcast_to(A[:, :, None, :], shape), np.broadcast_to(B.transpose(0, 2, 1)[:, None], shape), C,
               **scales)
    return pack(to_elements(np.asarray(D, dtype=np.float64), spec.acc), spec.c)


simulated_launcher.backend = f"simulation (fpsim's {SIMULATED_DEVICE} model, no GPU)"


class SelfCheckError(RuntimeError):
    """The GPU did not return the exact result of rows that every MMA computes exactly."""


def run_tiles(spec: MmaSpec, A, B, C, launcher, SA=None, SB=None) -> np.ndarray:
    """Pack, launch, unpack: (T, M, 8) accumulator elements of D."""
    a_regs, b_words, c_regs = pack_operands(spec, A, B, C, SA, SB)
    d_regs = launcher(spec, a_regs, b_words, c_regs)
    d_regs = np.asarray(d_regs, dtype=np.uint32).reshape(A.shape[0], spec.threads, spec.c.regs)
    return unpack(d_regs, spec.c)


def _same_value(got, want) -> np.ndarray:
    return (got == want) | (np.isnan(got) & np.isnan(want))


def _first_mismatch(got, want) -> str:
    idx = tuple(np.argwhere(~_same_value(got, want))[0])
    return f"at {idx}: got {got[idx]!r}, expected {want[idx]!r}"


def scaled_rows(spec: MmaSpec, n_random: int, seed: int):
    """Rows of a block-scaled instruction, (ProbeSet of the element values, scale_a, scale_b), the
    scales (rows, blocks): 64 "exact" rows (integer elements -3..3, scales 1, 2, 4, integer c) whose
    exact sum every correct MMA returns, then n_random rows of N(0, 1) elements times 2^-4..2^4
    rounded to the element format, with random scales (E8M0 2^-8..2^8; E4M3 2^-6..2^6 rounded)."""
    rng = np.random.default_rng(case_seed(seed, spec.kernel))
    n_exact, k, blocks, scale = 64, spec.k, spec.blocks, spec.scaling.scale
    a, b = (rng.integers(-3, 4, (n_exact, k)).astype(np.float64) for _ in range(2))
    c = rng.integers(-8, 9, n_exact).astype(np.float64)
    sa, sb = (np.exp2(rng.integers(0, 3, (n_exact, blocks))) for _ in range(2))
    tags = ["exact:integers"] * n_exact + ["random:scaled"] * n_random
    if n_random:
        def elements():
            spread = np.exp2(rng.integers(-4, 5, (n_random, 1)))
            return rounded(rng.standard_normal((n_random, k)) * spread, spec.element)

        def scales():
            if scale == "e8m0":
                return np.exp2(rng.integers(-8, 9, (n_random, blocks))).astype(np.float64)
            return np.asarray(quantize(np.exp2(rng.uniform(-6, 6, (n_random, blocks))), scale), dtype=np.float64)

        a, b = np.concatenate([a, elements()]), np.concatenate([b, elements()])
        c = np.concatenate([c, rounded(rng.standard_normal(n_random), spec.acc)])
        sa, sb = np.concatenate([sa, scales()]), np.concatenate([sb, scales()])
    return ProbeSet(spec.element, k, spec.acc, np.array(tags, dtype=str), a, b, c), sa, sb


def _scaled(x, scales, block: int, axis: int):
    """Elements times their block's scale (scales along `axis` of x, one per block)."""
    return x * np.repeat(scales, block, axis=axis)


def scale_tiles(spec: MmaSpec, sa, sb, tiles: int, seed: int):
    """(LSA, LSB, SA, SB): random scales 1, 2, 4 of the integer tiles, (LAYOUT_TILES, M, blocks) and
    (LAYOUT_TILES, 8, blocks), and the rows' scales as tiles: A's row r and B's column r get row r's
    (rows_to_tiles), A's rows from 8 on scale 1."""
    rng = np.random.default_rng(seed)
    blocks = spec.blocks
    LSA = np.exp2(rng.integers(0, 3, (LAYOUT_TILES, spec.m, blocks)))
    LSB = np.exp2(rng.integers(0, 3, (LAYOUT_TILES, 8, blocks)))
    pad = np.ones((tiles * 8 - len(sa), blocks))
    SA = np.ones((tiles, spec.m, blocks))
    SA[:, :8] = np.concatenate([sa, pad]).reshape(tiles, 8, blocks)
    SB = np.concatenate([sb, pad]).reshape(tiles, 8, blocks)
    return LSA, LSB, SA, SB


def capture_instruction_case(spec: MmaSpec, n_random: int, seed: int, launcher,
                             probes: bool = True) -> CaptureCase:
    """Run probes and random rows through one instruction; self-check; return the case."""
    if spec.scaling:
        ps, sa, sb = scaled_rows(spec, n_random, seed)
    else:
        rows = [probe_rows(spec.inputs, spec.k, spec.acc)] if probes else []
        if n_random:
            rows.append(random_rows(spec.inputs, spec.k, n_random, case_seed(seed, spec.kernel),
                                    spec.acc, "mixed"))
        ps, sa, sb = concat(*rows), None, None

    LA, LB, LC = layout_tiles(spec, LAYOUT_TILES, case_seed(seed + 1, spec.kernel))
    A, B, C = rows_to_tiles(ps.a, ps.b, ps.c, spec.m)
    SA = SB = None
    want = np.einsum("tmk,tkn->tmn", LA, LB) + LC
    if spec.scaling:
        LSA, LSB, SA, SB = scale_tiles(spec, sa, sb, A.shape[0], case_seed(seed + 2, spec.kernel))
        block = spec.scaling.block
        want = np.einsum("tmk,tkn->tmn", _scaled(LA, LSA, block, 2), _scaled(LB, LSB.transpose(0, 2, 1), block, 1)) + LC
        SA, SB = np.concatenate([LSA, SA]), np.concatenate([LSB, SB])
    D_elements = run_tiles(spec, np.concatenate([LA, A]), np.concatenate([LB, B]), np.concatenate([LC, C]),
                           launcher, SA, SB)
    D = from_elements(D_elements, spec.acc)

    # self-check 1: whole integer tiles (every layout position)
    got = D[:LAYOUT_TILES]
    n_bad_tiles = int((~_same_value(got, want)).sum())
    # self-check 2: exact rows through the diagonal construction
    d_rows = tile_diagonals(D[LAYOUT_TILES:], len(ps))
    exact = ps.family_mask("exact")
    if spec.scaling:
        block = spec.scaling.block
        want_rows = ((_scaled(ps.a, sa, block, 1) * _scaled(ps.b, sb, block, 1)).sum(axis=1) + ps.c)[exact]
    else:
        want_rows = ps.exact_sum()[exact]
    n_bad_rows = int((~_same_value(d_rows[exact], want_rows)).sum())
    if n_bad_tiles or n_bad_rows:
        detail = []
        if n_bad_tiles:
            detail.append(f"{n_bad_tiles}/{got.size} entries of {LAYOUT_TILES} integer tiles "
                          f"wrong, first {_first_mismatch(got, want)}")
        if n_bad_rows:
            detail.append(f"{n_bad_rows}/{int(exact.sum())} exact rows wrong, first "
                          f"{_first_mismatch(d_rows[exact], want_rows)}")
        raise SelfCheckError(f"{spec.kernel}: self-check failed ({'; '.join(detail)}): "
                             "a fragment-layout or packing bug, not arithmetic; case left out")

    d_out = widen_to_f32_bits(tile_diagonals(D_elements[LAYOUT_TILES:], len(ps)), spec.acc)
    meta = {"name": spec.kernel, "kind": "dot", "level": "instruction",
            "inputs": spec.inputs, "c_format": spec.acc, "output": spec.acc, "k": spec.k,
            "instruction": spec.instruction,
            "flags": {"group": spec.group, "layout": "row.col", "threads": spec.threads,
                      "tile": f"m{spec.m}n8k{spec.k}"},
            "notes": (spec.notes + " " if spec.notes else "") +
                     "Each row is D[r,r] of a tile with A[r,:]=a, B[:,r]=b, C[r,r]=c, zeros elsewhere.",
            "rows_random": int(n_random), "rows_probe": int(len(ps) - n_random),
            "self_check": {"integer_tiles": LAYOUT_TILES, "exact_rows": int(exact.sum()),
                           "passed": True}}
    scales = (f32_bits(sa), f32_bits(sb)) if spec.scaling else (None, None)
    return CaptureCase(meta, f32_bits(ps.a), f32_bits(ps.b), f32_bits(ps.c), d_out, ps.tags.astype(str), *scales)


# ---------------------------------------------------------------------------
# Options, groups and processes
# ---------------------------------------------------------------------------

@dataclasses.dataclass
class CaptureOptions:
    """What `run` captures. out: the capture file (.npz); formats: input formats (default: all the
    tensor cores take); rows: random rows per instruction case (the probes come on top);
    sass_dir: where the kernels' SASS goes; backend: kernel launcher ("auto": CuPy if importable,
    else torch load_inline); in_process: run the groups in this process (no isolation);
    group_timeout: seconds per group process (default GROUP_TIMEOUT_S); max_mib: above this size
    the library cases go to a second file; command: the command line, recorded in the file."""

    out: Path
    formats: tuple = devices.INPUT_FORMATS
    rows: int = 4096
    seed: int = 0
    skip_library: bool = False
    skip_wgmma: bool = False
    sass_dir: Path | None = None
    backend: str = "auto"
    simulate: bool = False
    in_process: bool = False
    group_timeout: int | None = None
    max_mib: float = 15.0
    command: str = ""

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        self.sass_dir = Path(self.sass_dir) if self.sass_dir is not None else None
        self.formats = tuple(f.strip().lower() for f in self.formats if f.strip())
        unknown = sorted(set(self.formats) - set(devices.INPUT_FORMATS))
        if not self.formats:
            raise ValueError(f"formats names no format; allowed: {list(devices.INPUT_FORMATS)}")
        if unknown:
            raise ValueError(f"unknown format(s) {unknown}; allowed: {list(devices.INPUT_FORMATS)}")
        if not isinstance(self.rows, int) or self.rows < 0:
            raise ValueError(f"rows must be an integer >= 0, got {self.rows!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}; allowed: {', '.join(BACKENDS)}")

    @property
    def groups(self) -> list[str]:
        return [g for g in GROUPS if not (g == "library" and self.skip_library)
                and not (g == "wgmma" and self.skip_wgmma)]


def _specs_for(group: str, formats, cc) -> tuple:
    """The kernels of a group to run on a GPU of compute capability cc (None: all), and those skipped."""
    chosen, skipped = [], []
    gen = devices.generation_of(cc) if cc is not None else None
    source, first = kernels.CUDA_SOURCES[group]
    for s in MMA_SPECS:
        if s.group != group or s.inputs not in formats:
            continue
        if gen is not None and devices.GENERATIONS.index(gen) < devices.GENERATIONS.index(first):
            skipped.append({"case": s.kernel, "reason": f"{source} needs {first} (compute capability "
                                                        f"{devices.COMPUTE_CAPABILITY[first]}) or later"})
        elif gen is not None and gen not in s.op.generations:
            skipped.append({"case": s.kernel, "reason": f"{s.group} {s.op.shape} does not run on {gen}"})
        elif cc is not None and s.op.compute_capability and tuple(cc) < s.op.compute_capability:
            major, minor = s.op.compute_capability
            skipped.append({"case": s.kernel, "reason": f"{s.instruction} needs sm_{major}{minor}a (compute "
                            f"capability {major}.{minor}); the datacenter Blackwells scale blocks in "
                            "tcgen05.mma, captured at library level (scaled_mm)"})
        else:
            chosen.append(s)
    return chosen, skipped


def run_group(group: str, options: CaptureOptions, progress) -> Capture:
    """Run one group of cases in this process and return its capture."""
    env = kernels.environment(options.simulate)
    meta = new_meta(env.get("gpu", "simulation" if options.simulate else "unknown"),
                    compute_capability=env.get("compute_capability"), driver=env.get("driver"),
                    cuda=env.get("cuda"), torch=env.get("torch"), seed=options.seed,
                    source="fpsim.tensorcore.gpu_capture",
                    licence="captured by the fpsim project; no third-party data",
                    environment=env, command=options.command, skipped=[])
    capture = Capture(meta, [])
    if group == "library":
        dev = "cpu" if options.simulate else "cuda"
        meta["backend"] = "torch-cpu (simulation, not tensor-core data)" if options.simulate else "torch"
        for what, item in library_cases(options.seed, options.formats, dev=dev):
            if what == "skip":
                progress(f"skip {item['case']}: {item['reason']}")
                meta["skipped"].append(item)
            elif what == "fail":
                progress(f"FAIL {item['case']}: {item['reason']}")
                meta["failures"].append({"case": item["case"], "error": item["reason"]})
            else:
                try:
                    item.validate()
                except ValueError as e:
                    progress(f"FAIL {item.name}: {e}")
                    meta["failures"].append({"case": item.name, "error": f"ValueError: {e}"})
                    continue
                item.meta["backend"] = meta["backend"]
                progress(f"ok   {item.name}: {item.d.shape}")
                capture.cases.append(item)
        return capture

    cc = None if options.simulate else tuple(int(x) for x in env["compute_capability"].split("."))
    specs, skipped = _specs_for(group, options.formats, cc)
    meta["skipped"] += skipped
    launcher = simulated_launcher if options.simulate else _gpu_launcher(group, cc, options, progress, meta)
    meta["backend"] = launcher.backend
    for spec in specs:
        t0 = time.time()
        try:
            case = capture_instruction_case(spec, options.rows, options.seed, launcher)
            case.validate()
        except Exception as e:  # noqa: BLE001 (record and go on)
            msg = f"{type(e).__name__}: {e}"
            progress(f"FAIL {spec.kernel}: {msg}")
            meta["failures"].append({"case": spec.kernel, "error": msg})
            continue
        case.meta["backend"] = launcher.backend
        case.meta["compiler"] = meta.get("compiler")
        sass = getattr(launcher, "sass", None) or ""
        path = kernels.fp8_path_from_sass(sass, spec.kernel) if devices.is_fp8(spec.inputs) else None
        if path:
            case.meta["path"] = path
        capture.cases.append(case)
        progress(f"ok   {spec.kernel}: {case.rows} rows, self-check passed ({time.time() - t0:.1f} s)")
    return capture


def _gpu_launcher(group, cc, options: CaptureOptions, progress, meta):
    workdir = Path(tempfile.mkdtemp(prefix="fpsim-capture-"))
    if options.backend in ("auto", "cupy"):
        try:
            import cupy  # noqa: F401 (only: is CuPy there?)

            cubin, compiler = kernels.compile_cubin(group, cc, workdir, progress)
            meta["compiler"] = compiler
            launcher = kernels.CupyLauncher(cubin)
            if options.sass_dir:
                launcher.sass = kernels.dump_sass(cubin, options.sass_dir / f"{group}.sass", progress)
            return launcher
        except ImportError:
            if options.backend == "cupy":
                raise
            progress("CuPy not importable: building the kernels with torch load_inline")
    meta["compiler"] = "torch.utils.cpp_extension.load_inline"
    return kernels.TorchLauncher(group, cc, [s.kernel for s in MMA_SPECS if s.group == group])


def run_group_process(group: str, options: CaptureOptions, workdir: Path, progress) -> Capture:
    """Run a group in a child process (`python -m fpsim.tensorcore.gpu_capture`); its progress lines
    come to `progress` as they are printed; a crash or a hang becomes a recorded failure."""
    out = workdir / f"{group}.npz"
    spec = json.dumps({**dataclasses.asdict(options), "out": str(out), "in_process": True,
                       "sass_dir": None if options.sass_dir is None else str(options.sass_dir)})
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
           "PYTHONUNBUFFERED": "1"}
    timeout = options.group_timeout or GROUP_TIMEOUT_S[group]
    tail = collections.deque(maxlen=40)
    t0 = time.time()
    child = subprocess.Popen([sys.executable, "-m", "fpsim.tensorcore.gpu_capture", group, spec], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def forward():
        for line in child.stdout:
            tail.append(line.rstrip("\n"))
            progress(line.rstrip("\n"))

    reader = threading.Thread(target=forward, daemon=True)
    reader.start()
    try:
        rc = child.wait(timeout=timeout)
        error = None if rc == 0 and out.exists() else f"group process exited with {rc}"
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        error = f"group process timed out after {timeout} s (hang or too slow)"
    reader.join(timeout=10)
    if error is None:
        progress(f"group {group} done in {time.time() - t0:.1f} s")
        return load_capture(out)
    progress(f"FAIL group {group}: {error}")
    return Capture(new_meta("unknown", failures=[{"case": f"group:{group}",
                                                  "error": error + ":\n" + "\n".join(tail)}]), [])


def _merged(parts, options: CaptureOptions) -> Capture:
    """The capture of all groups run so far, with the run's facts in its meta."""
    with_cases = [p for p in parts if p.cases] or parts
    capture = merge_captures(with_cases[0], *[p for p in parts if p is not with_cases[0]])
    capture.meta["skipped"] = sum((p.meta.get("skipped", []) for p in parts), [])
    capture.meta["groups"] = options.groups
    capture.meta["groups_done"] = len(parts)
    capture.meta["rows_random_per_case"] = options.rows
    capture.meta["command"] = options.command
    return capture


def _split_library(capture: Capture, out: Path, progress) -> Path | None:
    """Keep a too-large file under the size limit: library cases go to <out>-library.npz."""
    lib = [c for c in capture.cases if c.meta["level"] == "library"]
    if not lib:
        return None
    other = Path(out).with_name(Path(out).stem + "-library.npz")
    save_capture(Capture(dict(capture.meta, failures=[]), lib), other)
    capture.cases = [c for c in capture.cases if c.meta["level"] != "library"]
    capture.meta["library_file"] = other.name
    save_capture(capture, out)
    progress(f"file over the size limit: library cases moved to {other}")
    return other


class NoCudaDevice(RuntimeError):
    """This machine cannot capture (no CUDA device, or no torch); the message says why."""


@dataclasses.dataclass
class CaptureRun:
    """What `run` wrote: the capture (as saved), its path, size and duration."""

    capture: Capture
    path: Path
    mib: float
    seconds: float


def run(options: CaptureOptions, progress=None) -> CaptureRun:
    """Capture every group into options.out, saved after each group (a later kill keeps what was
    done). progress(message) receives each progress line; nothing is printed here. NoCudaDevice
    when the machine cannot capture (nothing is simulated unless options.simulate)."""
    problem = None if options.simulate else kernels.cuda_problem()
    if problem:
        raise NoCudaDevice(problem)
    progress = progress or (lambda message: None)
    progress(f"capture: groups {options.groups}, formats {list(options.formats)}, rows {options.rows}, "
             f"seed {options.seed}")
    t0 = time.time()
    parts = []
    with tempfile.TemporaryDirectory(prefix="fpsim-capture-") as tmp:
        for group in options.groups:
            if options.in_process:
                try:
                    parts.append(run_group(group, options, progress))
                except Exception as e:  # noqa: BLE001 (record and go on)
                    progress(f"FAIL group {group}: {type(e).__name__}: {e}")
                    parts.append(Capture(new_meta("unknown", failures=[
                        {"case": f"group:{group}", "error": f"{type(e).__name__}: {e}"}]), []))
            else:
                parts.append(run_group_process(group, options, Path(tmp), progress))
            capture = _merged(parts, options)
            save_capture(capture, options.out)
    if os.path.getsize(options.out) > options.max_mib * 2**20:
        _split_library(capture, options.out, progress)
    return CaptureRun(capture, options.out, os.path.getsize(options.out) / 2**20, time.time() - t0)


def _group_worker(group: str, spec: str) -> int:
    """A group process (run_group_process): options as JSON, progress lines on stdout, the group's
    capture saved to options.out."""
    options = CaptureOptions(**json.loads(spec))
    save_capture(run_group(group, options, lambda message: print(message, flush=True)), options.out)
    return 0


if __name__ == "__main__":
    sys.exit(_group_worker(*sys.argv[1:]))
