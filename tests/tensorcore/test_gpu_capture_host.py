"""Host side of the GPU capture, tested without a GPU.

Sources of truth:
* fragment layouts: bijections, and spot checks written out by hand from the
  PTX ISA's fragment figures (independent of the formulas in `fragments`);
* packing: the simulated MMA (fpsim's model), fed the packed registers and
  unpacking them with the same layouts, returns the plain float64 A@B+C of
  small-integer tiles (exact in any MMA), and every designed row gives what the
  model gives on the row itself, so any bit-level packing slip shows up;
* register elements: numpy's and ml_dtypes' bit patterns of the same values;
* the driver's self-check, whose expected values are float64 sums (never the
  model), must catch a wrong layout;
* probes: representable in their formats (checked with torch/ml_dtypes casts),
  deterministic;
* the command line (`fpsim capture`): refuses cleanly without CUDA, and
  --simulate writes a valid capture, also through the group processes;
* a dry run builds every kernel source, compile command and case without CUDA;
  the CUDA sources assemble for sm_90a when nvcc is present.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from fpsim.cli import main
from fpsim.tensorcore import devices, kernels, probes, samples
from fpsim.tensorcore import fragments as fr
from fpsim.tensorcore import gpu_capture as gc
from fpsim.tensorcore.captures import load_capture
from fpsim.tensorcore.core import TensorCore
from fpsim.tensorcore.library_capture import library_cases
from fpsim.tensorcore.validate import same_bits

REPO = Path(__file__).resolve().parents[2]
SPECS = {s.kernel: s for s in gc.MMA_SPECS}


def spec_ids(s):
    return s.kernel


# --------------------------------------------------------------- layouts
@pytest.mark.parametrize("spec", gc.MMA_SPECS, ids=spec_ids)
def test_layouts_are_bijections(spec):
    ops = [spec.a, spec.c] + ([spec.b] if spec.group == "mma" else [])
    for op in ops:
        flat = (op.rows * op.shape[1] + op.cols).ravel()
        assert sorted(flat.tolist()) == list(range(op.shape[0] * op.shape[1]))
        assert op.elems * op.elem_bits % 32 == 0


def held(op, thread):
    return [(int(r), int(c)) for r, c in zip(op.rows[thread], op.cols[thread])]


def test_layout_spot_checks_from_ptx_figures():
    # m16n8k16 .f16: lane 0 holds A rows 0/8, cols 0,1 and 8,9; lane 5 (group 1, thread 1)
    a = fr.frag_a(16, 16)
    assert held(a, 0) == [(0, 0), (0, 1), (8, 0), (8, 1), (0, 8), (0, 9), (8, 8), (8, 9)]
    assert held(a, 5) == [(1, 2), (1, 3), (9, 2), (9, 3), (1, 10), (1, 11), (9, 10), (9, 11)]
    assert held(fr.frag_b(16, 16), 0) == [(0, 0), (1, 0), (8, 0), (9, 0)]
    assert held(fr.frag_b(16, 16), 6) == [(4, 1), (5, 1), (12, 1), (13, 1)]
    # m16n8k8 .f16
    assert held(fr.frag_a(8, 16), 7) == [(1, 6), (1, 7), (9, 6), (9, 7)]
    assert held(fr.frag_b(8, 16), 7) == [(6, 1), (7, 1)]
    # m16n8k8 / k4 .tf32
    assert held(fr.frag_a(8, 32), 0) == [(0, 0), (8, 0), (0, 4), (8, 4)]
    assert held(fr.frag_a(8, 32), 9) == [(2, 1), (10, 1), (2, 5), (10, 5)]
    assert held(fr.frag_b(8, 32), 9) == [(1, 2), (5, 2)]
    assert held(fr.frag_a(4, 32), 3) == [(0, 3), (8, 3)]
    assert held(fr.frag_b(4, 32), 3) == [(3, 0)]
    # m16n8k32 / k16 .e4m3
    a32 = fr.frag_a(32, 8)
    assert held(a32, 1) == ([(0, 4 + j) for j in range(4)] + [(8, 4 + j) for j in range(4)]
                            + [(0, 20 + j) for j in range(4)] + [(8, 20 + j) for j in range(4)])
    assert held(fr.frag_b(32, 8), 1) == [(4, 0), (5, 0), (6, 0), (7, 0), (20, 0), (21, 0), (22, 0), (23, 0)]
    assert held(fr.frag_a(16, 8), 4) == [(1, 0), (1, 1), (1, 2), (1, 3), (9, 0), (9, 1), (9, 2), (9, 3)]
    assert held(fr.frag_b(16, 8), 4) == [(0, 1), (1, 1), (2, 1), (3, 1)]
    # C/D 16x8, and the warpgroup version (warp w owns rows 16w..16w+15)
    assert held(fr.frag_c(32), 0) == [(0, 0), (0, 1), (8, 0), (8, 1)]
    assert held(fr.frag_c(32), 31) == [(7, 6), (7, 7), (15, 6), (15, 7)]
    assert held(fr.frag_c(32, 128), 32 * 3 + 31) == [(55, 6), (55, 7), (63, 6), (63, 7)]
    assert held(fr.frag_a(16, 16, 128), 64)[:2] == [(32, 0), (32, 1)]


def test_register_packing_order():
    # f16x2: element 0 in the low half; fp8x4: element 0 in byte 0
    op = fr.frag_a(16, 16)
    m = np.zeros((1, 16, 16), dtype=np.uint32)
    m[0, 0, 0], m[0, 0, 1] = 0x1111, 0x2222
    assert fr.pack(m, op)[0, 0, 0] == 0x22221111
    op8 = fr.frag_a(32, 8)
    m8 = np.zeros((1, 16, 32), dtype=np.uint32)
    m8[0, 0, :4] = [0x11, 0x22, 0x33, 0x44]
    assert fr.pack(m8, op8)[0, 0, 0] == 0x44332211


@pytest.mark.parametrize("spec", gc.MMA_SPECS, ids=spec_ids)
def test_pack_unpack_round_trip(spec):
    rng = np.random.default_rng(0)
    for op in [spec.a, spec.c] + ([spec.b] if spec.group == "mma" else []):
        bits = rng.integers(0, 2**op.elem_bits, (3,) + op.shape, dtype=np.uint64).astype(np.uint32)
        regs = fr.pack(bits, op)
        assert regs.shape == (3, op.threads, op.regs)
        assert np.array_equal(fr.unpack(regs, op), bits)


@pytest.mark.parametrize("fmt,bits", [("fp16", 16), ("tf32", 32), ("e5m2", 8)])
def test_wgmma_b_image(fmt, bits):
    k = {16: 16, 32: 8, 8: 32}[bits]
    off = fr.wgmma_b_offsets(k, bits)
    es = bits // 8
    assert off[0, 1] == 16                          # next n: next 16-byte row of the core matrix
    assert off[16 // es, 0] == fr.WGMMA_LBO         # first k of the second core matrix
    assert sorted(set((off[..., None] + np.arange(es)).ravel().tolist())) == list(range(256))
    rng = np.random.default_rng(1)
    b = rng.integers(0, 2**bits, (2, k, 8), dtype=np.uint64).astype(np.uint32)
    assert np.array_equal(fr.read_wgmma_b(fr.pack_wgmma_b(b, k, bits), k, bits), b)


# ------------------------------------------- the numpy MMA from the fragments
def small_int_tiles(spec, n, seed):
    rng = np.random.default_rng(seed)
    A = rng.integers(-3, 4, (n, spec.m, spec.k)).astype(np.float64)
    B = rng.integers(-3, 4, (n, spec.k, 8)).astype(np.float64)
    C = rng.integers(-8, 9, (n, spec.m, 8)).astype(np.float64)
    return A, B, C


@pytest.mark.parametrize("spec", gc.MMA_SPECS, ids=spec_ids)
def test_simulated_mma_from_packed_fragments_is_a_at_b_plus_c(spec):
    A, B, C = small_int_tiles(spec, 3, 7)
    a_regs, b_words, c_regs = gc.pack_operands(spec, A, B, C)
    assert a_regs.shape == (3, spec.threads, spec.a.regs + spec.scale_words)
    assert c_regs.shape == (3, spec.threads, spec.c.regs)
    if spec.group == "wgmma":
        assert b_words.shape == (3, 64)
    d_regs = gc.simulated_launcher(spec, a_regs, b_words, c_regs)
    D = fr.from_elements(fr.unpack(d_regs, spec.c), spec.acc)
    np.testing.assert_array_equal(D, A @ B + C)


@pytest.mark.parametrize("spec", gc.MMA_SPECS, ids=spec_ids)
def test_rows_to_tiles_returns_the_designed_rows(spec):
    rng = np.random.default_rng(3)
    rows = 21                                         # not a multiple of 8: padding
    a = rng.integers(-3, 4, (rows, spec.k)).astype(np.float64)
    b = rng.integers(-3, 4, (rows, spec.k)).astype(np.float64)
    c = rng.integers(-9, 10, rows).astype(np.float64)
    A, B, C = gc.rows_to_tiles(a, b, c, spec.m)
    assert A.shape == (3, spec.m, spec.k) and B.shape == (3, spec.k, 8)
    D_bits = gc.run_tiles(spec, A, B, C, gc.simulated_launcher)
    d = gc.tile_diagonals(fr.from_elements(D_bits, spec.acc), rows)
    np.testing.assert_array_equal(d, (a * b).sum(1) + c)


def test_instruction_case_through_the_simulator():
    spec = SPECS["mma_m16n8k16_f32_bf16"]
    case = gc.capture_instruction_case(spec, 64, 0, gc.simulated_launcher)
    case.validate()
    assert case.meta["self_check"]["passed"]
    assert case.meta["rows_random"] == 64 and case.rows == case.meta["rows_probe"] + 64
    ps = probes.concat(probes.probe_rows("bf16", 16, "fp32"),
                       samples.random_rows("bf16", 16, 64, samples.case_seed(0, spec.kernel), "fp32"))
    np.testing.assert_array_equal(case.a_values, ps.a)
    assert list(case.tags) == list(ps.tags)
    exact = ps.family_mask("exact")           # float64 sums, exact: what every MMA returns
    np.testing.assert_array_equal(case.d_values[exact], ps.exact_sum()[exact])
    # every row came through the tiles as it went in: the model on the rows themselves
    direct = TensorCore(gc.SIMULATED_DEVICE, "bf16", "fp32", instruction="m16n8k16").dot(ps.a, ps.b, ps.c)
    assert same_bits(case.d_values, direct).all()


def test_fp16_accumulator_case_widens_c_and_d():
    spec = SPECS["mma_m16n8k32_f16_e4m3"]
    case = gc.capture_instruction_case(spec, 16, 1, gc.simulated_launcher)
    case.validate()                                   # c and d are fp16 values in binary32
    assert case.meta["c_format"] == "fp16" and case.meta["output"] == "fp16"


def test_self_check_catches_a_layout_bug():
    spec = SPECS["mma_m16n8k16_f32_f16"]
    wrong_a = fr.frag_a(16, 16)
    # swap the two column halves, as a packing bug would
    swapped = fr.Operand(wrong_a.rows, wrong_a.cols ^ 8, 16, wrong_a.shape)

    def buggy_hardware(spec_, a_regs, b_words, c_regs):
        A = fr.unpack(a_regs, swapped)
        return gc.simulated_launcher(spec_, fr.pack(A, spec_.a), b_words, c_regs)

    with pytest.raises(gc.SelfCheckError, match="layout or packing bug"):
        gc.capture_instruction_case(spec, 8, 0, buggy_hardware)


def test_self_check_catches_wrong_diagonal():
    spec = SPECS["mma_m16n8k8_f32_tf32"]

    def transposed_b(spec_, a_regs, b_words, c_regs):      # B read as its transpose-ish
        B = fr.unpack(b_words, spec_.b)
        B = B[:, ::-1, :].copy()
        return gc.simulated_launcher(spec_, a_regs, fr.pack(B, spec_.b), c_regs)

    with pytest.raises(gc.SelfCheckError):
        gc.capture_instruction_case(spec, 8, 0, transposed_b)


@pytest.mark.parametrize("fmt,dtype,width", [("fp16", np.float16, 16), ("fp32", np.float32, 32),
                                              ("bf16", "bfloat16", 16), ("e4m3", "float8_e4m3fn", 8),
                                              ("e5m2", "float8_e5m2", 8)])
def test_register_elements_are_the_bit_patterns_numpy_and_ml_dtypes_give(fmt, dtype, width):
    import ml_dtypes
    dtype = getattr(ml_dtypes, dtype) if isinstance(dtype, str) else dtype
    x = np.array([0.0, -0.0, 1.0, -1.5, 0.25, 3.0, -0.125])
    want = x.astype(dtype).view(f"uint{width}").astype(np.uint32)
    assert np.array_equal(fr.to_elements(x, fmt), want)
    assert fr.element_bits(fmt) == width
    back = fr.from_elements(want, fmt)
    assert np.array_equal(back, x) and np.signbit(back[1])


def test_tf32_elements_sit_in_binary32_layout():
    """PTX holds a tf32 value in a 32-bit register as binary32 with the low 13 bits zero, and ignores them."""
    x = np.array([1.0, -1.5, 1 + 2.0**-10, 3.0 * 2.0**-130])
    assert np.array_equal(fr.to_elements(x, "tf32"), x.astype(np.float32).view(np.uint32))
    noisy = x.astype(np.float32).view(np.uint32) | np.uint32(0x1FFF)
    assert np.array_equal(fr.from_elements(noisy, "tf32"), x)


def test_elements_refuse_values_outside_the_format():
    assert np.isnan(fr.from_elements(fr.to_elements(np.array([np.nan]), "e4m3"), "e4m3")[0])
    with pytest.raises(ValueError, match="not representable in e4m3"):
        fr.to_elements(np.array([1.0625]), "e4m3")
    with pytest.raises(ValueError, match="not representable in e4m3"):
        fr.to_elements(np.array([np.inf]), "e4m3")


# ------------------------------------------------------------------ probes
FORMAT_K = [("fp16", 16), ("fp16", 8), ("bf16", 16), ("bf16", 8), ("tf32", 8), ("tf32", 4),
            ("e4m3", 32), ("e4m3", 16), ("e5m2", 32), ("e5m2", 16)]


def cast_round_trip(x, fmt):
    """Values after a round trip through torch's dtype (tf32: bit mask)."""
    import torch
    if fmt == "tf32":
        bits = x.astype(np.float32).view(np.uint32) & np.uint32(0xFFFFE000)
        return bits.view(np.float32).astype(np.float64)
    if fmt == "fp32":
        return x.astype(np.float32).astype(np.float64)
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16, "e4m3": torch.float8_e4m3fn,
          "e5m2": torch.float8_e5m2}[fmt]
    return torch.from_numpy(x).to(dt).to(torch.float64).numpy()


def assert_representable(x, fmt, what):
    y = cast_round_trip(x, fmt)
    same = (y == x) | (np.isnan(x) & np.isnan(y))
    assert same.all(), f"{what}: {x[~same][:5]} not representable in {fmt}"


@pytest.mark.parametrize("fmt,k", FORMAT_K)
@pytest.mark.parametrize("c_format", ["fp32", "fp16"])
def test_probes_representable_and_deterministic(fmt, k, c_format):
    ps = probes.probe_rows(fmt, k, c_format)
    assert ps.a.shape == ps.b.shape == (len(ps), k) and ps.c.shape == (len(ps),)
    assert_representable(ps.a, fmt, "a")
    assert_representable(ps.b, fmt, "b")
    assert_representable(ps.c, c_format, "c")
    again = probes.probe_rows(fmt, k, c_format)
    assert list(again.tags) == list(ps.tags)
    assert np.array_equal(again.a, ps.a, equal_nan=True) and np.array_equal(again.c, ps.c, equal_nan=True)
    assert len(set(ps.tags)) == len(ps), "tags name rows uniquely"
    families = {t.split(":")[1] for t in ps.tags}
    assert families == set(probes.FAMILIES) - {"random"}
    # exact rows: the exact sum is a value of the output format
    ex = ps.select(ps.family_mask("exact"))
    assert_representable(ex.exact_sum(), c_format, "exact sums")


@pytest.mark.parametrize("fmt,k", FORMAT_K[::2])
def test_random_rows(fmt, k):
    r1 = samples.random_rows(fmt, k, 200, seed=5)
    r2 = samples.random_rows(fmt, k, 200, seed=5)
    r3 = samples.random_rows(fmt, k, 200, seed=6)
    assert np.array_equal(r1.a, r2.a) and not np.array_equal(r1.a, r3.a)
    assert_representable(r1.a, fmt, "a")
    assert_representable(r1.b, fmt, "b")
    assert_representable(r1.c, "fp32", "c")
    assert (r1.tags == "random:wide").sum() == 100 and (r1.tags == "random:upstream").sum() == 100
    assert np.isfinite(r1.exact_sum()).all()
    r16 = samples.random_rows(fmt, k, 100, seed=5, c_format="fp16")
    assert_representable(r16.c, "fp16", "c")
    assert (np.abs(r16.exact_sum()) < 65504).all()


def test_probe_semantics_examples():
    ps = probes.probe_rows("fp16", 16, "fp32")
    row = ps.select(ps.tags == "probe:alignment:pp:first:shift=30")
    assert row.exact_sum()[0] == 2.0 ** (20 - 30)      # big terms cancel; the small term is left
    rnd = ps.select(ps.tags == "probe:rounding:even:+:first:eighths=3")
    ulp = 2.0 ** (3 - 23)
    assert rnd.exact_sum()[0] == 8 + 3 * ulp / 8
    with pytest.raises(ValueError, match="unknown input format"):
        probes.probe_rows("fp8", 16)
    with pytest.raises(ValueError, match="unknown c format"):
        probes.probe_rows("fp16", 16, "bf16")


# -------------------------------------------------------------- the CLI
def cuda_available():
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


@pytest.mark.skipif(cuda_available(), reason="this machine has CUDA")
def test_cli_refuses_without_cuda(tmp_path):
    res = subprocess.run([sys.executable, "-m", "fpsim", "capture", "--out", str(tmp_path / "x.npz")],
                         capture_output=True, text=True, cwd=REPO)
    assert res.returncode == 2
    assert "fpsim capture: no CUDA device" in res.stderr and "--simulate" in res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    assert not (tmp_path / "x.npz").exists()


def test_cli_rejects_unknown_format(tmp_path, capsys):
    assert main(["capture", "--out", str(tmp_path / "x.npz"), "--formats", "fp16,fp12"]) == 2
    assert "unknown format(s) ['fp12']; allowed: ['fp16'" in capsys.readouterr().err


def test_cli_help_names_the_command(capsys):
    with pytest.raises(SystemExit):
        main(["capture", "--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: fpsim capture") and "--simulate" in out


def test_cli_simulate_in_process(tmp_path, capsys):
    out = tmp_path / "sim.npz"
    rc = main(["capture", "--simulate", "--in-process", "--skip-library", "--rows", "16",
               "--formats", "fp16,e5m2", "--out", str(out), "--log", str(tmp_path / "log")])
    assert rc == 0
    capture = load_capture(out)
    want = [s.kernel for s in gc.MMA_SPECS if s.inputs in ("fp16", "e5m2")]
    assert sorted(capture.names) == sorted(want)
    assert capture.meta["backend"] == gc.simulated_launcher.backend and capture.meta["failures"] == []
    log = (tmp_path / "log").read_text()
    assert "wrote" in log and "ok   mma_m16n8k16_f32_f16" in log
    assert log.splitlines() == [line for line in capsys.readouterr().out.splitlines()]


def test_a_simulated_capture_validates_bit_exact_against_the_model_it_ran(tmp_path, capsys):
    """Plumbing end to end (tiles, registers, widening, the file, `fpsim validate`): the simulated
    capture holds the simulated model's answers, so validating it with that model finds every row."""
    out = tmp_path / "sim.npz"
    assert main(["capture", "--simulate", "--in-process", "--skip-library", "--rows", "32",
                 "--formats", "tf32,e4m3", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["validate", str(out), "--device", gc.SIMULATED_DEVICE]) == 0
    assert "instruction: " in capsys.readouterr().out


def test_cli_simulate_group_processes(tmp_path):
    """The real path: each group in a child process, its progress streamed back."""
    out = tmp_path / "sim.npz"
    res = subprocess.run([sys.executable, "-m", "fpsim", "capture", "--simulate",
                          "--skip-library", "--rows", "8", "--formats", "tf32",
                          "--out", str(out)], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    capture = load_capture(out)
    assert sorted(capture.names) == ["mma_m16n8k4_f32_tf32", "mma_m16n8k8_f32_tf32",
                                     "wgmma_m64n8k8_f32_tf32"]
    assert capture.meta["groups_done"] == 2
    assert "ok   wgmma_m64n8k8_f32_tf32" in res.stdout and "group wgmma done" in res.stdout


def test_group_failure_is_recorded(tmp_path, monkeypatch, capsys):
    def boom(group, options, progress):
        raise RuntimeError("kernel exploded")
    monkeypatch.setattr(gc, "run_group", boom)
    rc = main(["capture", "--simulate", "--in-process", "--skip-library", "--skip-wgmma",
               "--out", str(tmp_path / "x.npz")])
    assert rc == 1                                    # nothing captured
    capture = load_capture(tmp_path / "x.npz")
    assert capture.meta["failures"][0]["case"] == "group:mma"
    assert "kernel exploded" in capture.meta["failures"][0]["error"]


def test_case_failure_is_recorded_and_others_go_on(tmp_path, monkeypatch, capsys):
    real = gc.capture_instruction_case

    def flaky(spec, *a, **kw):
        if spec.kernel == "mma_m16n8k8_f32_tf32":
            raise gc.SelfCheckError(f"{spec.kernel}: self-check failed (test)")
        return real(spec, *a, **kw)
    monkeypatch.setattr(gc, "capture_instruction_case", flaky)
    main(["capture", "--simulate", "--in-process", "--skip-library", "--skip-wgmma", "--rows", "8",
          "--formats", "tf32", "--out", str(tmp_path / "x.npz")])
    capture = load_capture(tmp_path / "x.npz")
    assert capture.names == ["mma_m16n8k4_f32_tf32"]
    assert capture.meta["failures"] == [{"case": "mma_m16n8k8_f32_tf32",
                                         "error": "SelfCheckError: mma_m16n8k8_f32_tf32: "
                                                  "self-check failed (test)"}]


# ------------------------------------------------------------ CUDA sources
def kernels_in(path):
    text = path.read_text()
    return dict(re.findall(r"^FPSIM_\w+\((\w+),\s*\"([^\"]+)\"", text, flags=re.M))


def test_cuda_sources_match_specs():
    found = {}
    for group in ("mma", "wgmma"):
        found.update(kernels_in(kernels.cuda_source_path(group)))
    assert set(found) == set(SPECS)
    for name, instr in found.items():
        assert instr == SPECS[name].instruction, name
    wg = kernels.cuda_source_path("wgmma").read_text()
    assert f"#define WGMMA_LBO {fr.WGMMA_LBO}" in wg


NVCC = shutil.which("nvcc")


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("group", ["mma", "wgmma"])
def test_cuda_sources_assemble_for_sm90a(group, tmp_path):
    src = kernels.cuda_source_path(group)
    flags = kernels.compile_flags((9, 0))
    assert flags == ["-gencode=arch=compute_90a,code=sm_90a"]
    for kind, out in (("-cubin", "k.cubin"), ("--ptx", "k.ptx")):
        res = subprocess.run([NVCC, kind, *flags, "-o", str(tmp_path / out), str(src)],
                             capture_output=True, text=True)
        assert res.returncode == 0, res.stdout + res.stderr
        assert (tmp_path / out).stat().st_size > 0
    ptx = (tmp_path / "k.ptx").read_text()
    chosen, skipped = gc._specs_for(group, devices.INPUT_FORMATS, (9, 0))
    for spec in chosen:
        assert spec.instruction in ptx
    assert all("block_scale" not in spec.instruction for spec in chosen)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
def test_block_scaled_kernels_assemble_for_sm120a(tmp_path):
    """ptxas takes the block-scaled mma.sync with its scale operands for sm_120a (the syntax; what
    the instruction computes needs the GPU)."""
    flags = kernels.compile_flags((12, 0))
    assert flags == ["-gencode=arch=compute_120a,code=sm_120a", "-DFPSIM_BLOCK_SCALED"]
    for kind, out in (("-cubin", "k.cubin"), ("--ptx", "k.ptx")):
        res = subprocess.run([NVCC, kind, *flags, "-o", str(tmp_path / out), str(kernels.cuda_source_path("mma"))],
                             capture_output=True, text=True)
        assert res.returncode == 0, res.stdout + res.stderr
    ptx = (tmp_path / "k.ptx").read_text()
    scaled = [s for s in gc.MMA_SPECS if s.scaling]
    assert len(scaled) == 4
    for spec in scaled:
        assert spec.instruction in ptx and f".entry {spec.kernel}(" in ptx


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
def test_mma_source_builds_without_fp8_for_older_gpus(tmp_path):
    flags = kernels.compile_flags((8, 0))
    assert "-DFPSIM_NO_FP8" in flags
    res = subprocess.run([NVCC, "-cubin", *flags, "-o", str(tmp_path / "k.cubin"),
                          str(kernels.cuda_source_path("mma"))], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_library_cases_on_torch_cpu(tmp_path):
    """The library code path on torch's CPU kernels (no tensor cores: plumbing only)."""
    pytest.importorskip("torch")
    from fpsim.tensorcore.captures import Capture, new_meta, save_capture
    items = list(library_cases(0, ["bf16", "e4m3"], ks=(32,), mn=16, dev="cpu"))
    cases = [item for what, item in items if what == "case"]
    names = [c.name for c in cases]
    assert "torch_matmul_bf16_rr0_k32" in names and "torch_matmul_bf16_rr1_k32" in names
    rr1 = cases[names.index("torch_matmul_bf16_rr1_k32")]
    assert rr1.meta["same_inputs_as"] == "torch_matmul_bf16_rr0_k32"
    assert rr1.meta["flags"] == {"allow_bf16_reduced_precision_reduction": True}
    for c in cases:
        c.validate()
        assert c.a.shape == (16, 32) and c.b.shape == (32, 16) and c.d.shape == (16, 16)
    bf = cases[0]
    want = (bf.a_values @ bf.b_values).astype(np.float32)          # bf16 products exact in fp32
    assert np.allclose(bf.d_values, want, rtol=2**-7)
    back = load_capture(save_capture(Capture(new_meta("cpu"), cases), tmp_path / "lib.npz"))
    assert back.names == names
    assert all(what in ("case", "skip") for what, _ in items)


@pytest.mark.parametrize("cc", [(8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0), (7, 5)])
def test_dry_run_builds_every_kernel_source_and_case(cc):
    """What a GPU of compute capability cc would be given, built without CUDA: per group the kernels
    it runs and skips (the PTX ISA: FP8 MMA from sm_89, wgmma on sm_90a only, these sources need
    sm_80), the compile flags, the torch-extension source holding every kernel, and every case's
    packed registers at the shapes the kernels read."""
    wanted = {(8, 0): 8, (8, 6): 8, (8, 9): 14, (9, 0): 22, (10, 0): 14, (12, 0): 18, (7, 5): 0}[cc]
    ran = 0
    for group in ("mma", "wgmma"):
        chosen, skipped = gc._specs_for(group, devices.INPUT_FORMATS, cc)
        assert len(chosen) + len(skipped) == sum(s.group == group for s in gc.MMA_SPECS)
        assert all(item["reason"] for item in skipped)
        flags = kernels.compile_flags(cc)
        assert flags[0].startswith("-gencode=arch=compute_") and ("-DFPSIM_NO_FP8" in flags) == (cc < (8, 9))
        source = kernels.torch_launcher_source(group, [s.kernel for s in gc.MMA_SPECS if s.group == group])
        for spec in chosen:
            assert f'name == "{spec.kernel}"' in source and spec.instruction in source
            if spec.scaling:
                ps, sa, sb = gc.scaled_rows(spec, 16, 0)
            else:
                ps = probes.concat(probes.probe_rows(spec.inputs, spec.k, spec.acc),
                                   samples.random_rows(spec.inputs, spec.k, 16, 0, spec.acc))
            A, B, C = gc.rows_to_tiles(ps.a, ps.b, ps.c, spec.m)
            a_regs, b_words, c_regs = gc.pack_operands(spec, A, B, C)
            tiles = A.shape[0]
            assert a_regs.shape == (tiles, spec.threads, spec.a.regs + spec.scale_words)
            assert b_words.shape == ((tiles, spec.threads, spec.b.regs + spec.scale_words) if group == "mma"
                                     else (tiles, 64))
            assert c_regs.shape == (tiles, spec.threads, spec.c.regs)
            grid, block = kernels.launch_shape(spec.group, tiles)
            assert block == 128 and grid * (4 if group == "mma" else 1) >= tiles
        ran += len(chosen)
        if NVCC and chosen and cc not in ((8, 0), (9, 0)):   # (those two: the nvcc tests below)
            assert set(ptx_entries(group, cc)) == {s.kernel for s in chosen}
    assert ran == wanted


def ptx_entries(group, cc):
    """The kernels nvcc builds from a group's source with the capture's flags for cc."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "k.ptx"
        res = subprocess.run([NVCC, "--ptx", *kernels.compile_flags(cc), "-o", str(out),
                              str(kernels.cuda_source_path(group))], capture_output=True, text=True)
        assert res.returncode == 0, res.stdout + res.stderr
        return re.findall(r"^\.visible \.entry (\w+)\(", out.read_text(), flags=re.M)


def test_fp8_path_read_from_the_real_h200_sass():
    """The SASS nvcc 13.0 made of our kernels on the H200 (docs/captures/) gives the path the bundled
    capture records for each FP8 case: HMMA (binary16 MMAs) for mma.sync, QGMMA for wgmma."""
    h200 = load_capture(REPO / "fpsim" / "data" / "captures" / "h200.npz", check_values=False)
    for group in ("mma", "wgmma"):
        sass = (REPO / "docs" / "captures" / f"h200-{group}.sass").read_text()
        for spec in (s for s in gc.MMA_SPECS if s.group == group and devices.is_fp8(s.inputs)):
            path = kernels.fp8_path_from_sass(sass, spec.kernel)
            assert path == ("fp16" if group == "mma" else "native") == h200.case(spec.kernel).meta["path"]
    assert kernels.fp8_path_from_sass(sass, "no_such_kernel") is None
