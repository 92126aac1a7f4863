#!/usr/bin/env python3
"""Convert the upstream tensor-core captures (text) into fpsim capture files.

Reads ``<src>/<GPU>/<fmt>/{a,b,c,d}_*.txt`` (the model_validation data of
north-numerical-computing/MATLAB-tensor-core, as laid out in
shared/gpu-captures) and writes one ``fpsim/data/captures/<gpu>.npz`` per GPU,
plus ``LICENCE-upstream.txt`` and a ``README.md`` with the provenance.

How c is stored follows :func:`fpsim.tensorcore.upstream.upstream_case_rules`;
this script checks each rule against the data and writes what it measured
into the case's notes, failing if the data contradict a rule.

    python3 tools/convert_upstream_captures.py [--src DIR] [--dest DIR] [--rows 2500]
"""

from __future__ import annotations

import argparse
import datetime
import math
import shutil
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fpsim.rounding import quantize  # noqa: E402
from fpsim.tensorcore.captures import bits_to_f64, save_capture  # noqa: E402
from fpsim.tensorcore.devices import is_fp8  # noqa: E402
from fpsim.tensorcore.upstream import (  # noqa: E402
    compute_capability, fp16_round_bits, load_upstream_text, read_upstream_folder)

UPSTREAM_REPO = "north-numerical-computing/MATLAB-tensor-core"
REFERENCE = ('F. A. Khattak and M. Mikaitis, "Accurate Models of NVIDIA Tensor Cores", '
             "ACM Transactions on Architecture and Code Optimization (TACO), doi:10.1145/3830409")
LICENCE = ("BSD 2-Clause, Copyright (c) 2025 Faizan A. Khattak and Mantas Mikaitis; "
           "see LICENCE-upstream.txt")


def default_src() -> Path:
    for cand in (REPO.parent / "shared" / "gpu-captures", Path("/work/shared/gpu-captures")):
        if cand.is_dir():
            return cand
    return REPO.parent / "shared" / "gpu-captures"


# ---------------------------------------------------------------------------
# Evidence: how well each hypothesis about c explains the recorded d
# ---------------------------------------------------------------------------

def exact_dots(a_bits, b_bits) -> np.ndarray:
    """sum_k a*b per row, correctly rounded to float64 (math.fsum)."""
    a, b = bits_to_f64(a_bits), bits_to_f64(b_bits)
    return np.array([math.fsum(row) for row in a * b])


def round_out(x, output: str) -> np.ndarray:
    return np.asarray(quantize(x, output), dtype=np.float64)


def c_hypotheses(c_bits) -> dict:
    return {"c as in the file (binary32)": bits_to_f64(c_bits),
            "c rounded to binary16": bits_to_f64(fp16_round_bits(c_bits)),
            "c = 0": np.zeros(len(c_bits))}


def measure(raw: dict, output: str) -> dict:
    """For each hypothesis about c: share of rows where d == RN_out(a.b + c),
    and the median relative distance |d - (a.b + c)| / |a.b + c|."""
    dots = exact_dots(raw["a"], raw["b"])
    d = bits_to_f64(raw["d"][output])
    out = {}
    with np.errstate(divide="ignore", invalid="ignore"):
        for name, c in c_hypotheses(raw["c"]).items():
            exact = np.array([math.fsum((x, y)) for x, y in zip(dots, c)])
            same = float(np.mean(round_out(exact, output) == d))
            rel = np.abs(d - exact) / np.maximum(np.abs(exact), 1e-300)
            out[name] = {"rn_match": same, "median_rel": float(np.median(rel))}
    return out


def discriminating(raw: dict, output: str) -> tuple:
    """Rows where RN_out(a.b + c32) != RN_out(a.b + RN16(c)): (n, c32 wins, c16 wins)."""
    dots = exact_dots(raw["a"], raw["b"])
    d = bits_to_f64(raw["d"][output])
    h = c_hypotheses(raw["c"])
    p32 = round_out(dots + h["c as in the file (binary32)"], output)
    p16 = round_out(dots + h["c rounded to binary16"], output)
    mask = p32 != p16
    return int(mask.sum()), int((p32 == d)[mask].sum()), int((p16 == d)[mask].sum())


def describe_evidence(stats: dict, rows: int) -> str:
    parts = [f"{name}: d == RN(a.b + c) in {100 * s['rn_match']:.1f}% of rows, median "
             f"relative distance {s['median_rel']:.2e}" for name, s in stats.items()]
    return (f"Measured on the {rows} rows (a.b by math.fsum, RN = round to nearest-even "
            "to the output format): " + "; ".join(parts) + ".")


def check_rule(gpu: str, inputs: str, output: str, stats: dict, disc: tuple) -> str:
    """Fail loudly if the data contradict the rule; return extra notes."""
    f32 = stats["c as in the file (binary32)"]
    f16 = stats["c rounded to binary16"]
    zero = stats["c = 0"]
    fp8 = is_fp8(inputs)
    n, wins32, wins16 = disc
    if output == "fp16" and not fp8:
        if f16["rn_match"] < 0.99 or f16["rn_match"] <= f32["rn_match"]:
            raise SystemExit(f"{gpu} {inputs} fp16: data do not show c rounded to binary16: {stats}")
        return ("c was rounded to binary16 (nearest-even) before the instruction: that alone "
                "makes d the correctly rounded binary16 result in "
                f"{100 * f16['rn_match']:.2f}% of rows, against {100 * f32['rn_match']:.1f}% "
                "with the binary32 c.")
    if output == "fp16" and fp8:
        if zero["rn_match"] > 0.05:
            raise SystemExit(f"{gpu} {inputs} fp16: c = 0 explains the data too well: {stats}")
        note = ("Found in the data: c was used (c = 0 explains "
                f"{100 * zero['rn_match']:.1f}% of rows). Whether it was rounded to binary16 "
                "first is not certain: d is not a single correctly rounded result in about "
                f"{100 * (1 - max(f16['rn_match'], f32['rn_match'])):.0f}% of rows under either "
                f"hypothesis; on the {n} rows where the two hypotheses predict different d, the "
                f"binary16-rounded c matches {wins16} and the binary32 c matches {wins32}. "
                "The f16 accumulator of an f16-output instruction holds a binary16 c, which "
                "also favours rounding.")
        if gpu.upper() == "H100":
            note += (" On sm_90, FP8 mma.sync with f16 output compiles (nvcc 13.0) to F2FP "
                     "fp8->f16 conversions, two chained HMMA.16816.F16 from a zero accumulator "
                     "and a separate HADD2 of c, which fits c entering as its own binary16 "
                     "addition.")
        return note
    if fp8 and gpu.upper() == "H100":
        if not zero["median_rel"] < 0.01 * f32["median_rel"]:
            raise SystemExit(f"{gpu} {inputs} fp32: data do not show c = 0: {stats}")
        return ("Checked: with c = 0 the median relative distance is "
                f"{zero['median_rel']:.1e}, with the file's c {f32['median_rel']:.1e}.")
    if not f32["median_rel"] < 0.01 * zero["median_rel"]:
        raise SystemExit(f"{gpu} {inputs} {output}: data do not show the file's c used: {stats}")
    return "Checked: the binary32 c of the file explains the data, c = 0 does not."


# ---------------------------------------------------------------------------

def convert_gpu(gpu_dir: Path, rows: int, dest: Path, created: str) -> Path:
    capture = load_upstream_text(gpu_dir, rows=rows)
    gpu = gpu_dir.name
    for case in capture.cases:
        fmt_dir = next(p for p in gpu_dir.iterdir()
                       if p.is_dir() and p.name.lower() == case.meta["inputs"])
        raw = read_upstream_folder(fmt_dir, rows)
        output = case.meta["output"]
        stats = measure(raw, output)
        disc = discriminating(raw, output)
        extra = check_rule(gpu, case.meta["inputs"], output, stats, disc)
        case.meta["notes"] = " ".join([case.meta["notes"] + ".", extra,
                                       describe_evidence(stats, case.rows)])
        case.meta["upstream_files"] = f"{gpu}/{fmt_dir.name}/"
    capture.meta.update({
        "gpu": f"NVIDIA {gpu}", "compute_capability": compute_capability(gpu),
        "backend": "upstream-text", "created": created, "seed": None,
        "source": (f"{UPSTREAM_REPO}, model_validation data (first {rows} rows of each case), "
                   f"converted by tools/convert_upstream_captures.py. Reference: {REFERENCE}."),
        "licence": LICENCE})
    out = dest / f"{gpu.lower()}.npz"
    save_capture(capture, out)
    return out


README = """# Bundled tensor-core captures

Real outputs of NVIDIA tensor-core instructions, in fpsim's capture schema
(`fpsim-capture/1`, see `fpsim/tensorcore/captures.py`); load them with
`fpsim.tensorcore.captures.load_capture(bundled_captures()["h100"])`.

## Provenance

- Source: the `model_validation/` data of the public repository
  `{repo}`, by Faizan A. Khattak and Mantas Mikaitis.
- Reference: {reference}.
- Licence: BSD 2-Clause; the notice is in `LICENCE-upstream.txt` beside this
  file and must stay with any copy of these files.
- Content: the first {rows} rows of each case (upstream has 5,000), for
  {gpus}. Converted by `tools/convert_upstream_captures.py`, which re-checks
  the facts below against the data and writes its measurements into each
  case's `notes`.

## Files

| file | GPU | compute capability | cases (name: inputs -> output, K, rows) |
| --- | --- | --- | --- |
{table}

## How the rows were produced (checked against the data)

- fp16/bf16/tf32 rows come from warp-level MMA (wmma / mma.sync); FP8 rows from
  `mma.sync.m16n8k32` kernels. K is the row length recorded upstream.
- Every upstream folder gives one case per output file: `<inputs>_fp32` and,
  where upstream recorded binary16 output, `<inputs>_fp16`.
- fp16 inputs with binary16 output: c was rounded to binary16 (nearest-even)
  before the instruction, so `c` holds that rounded value (`c_format` fp16);
  the `_fp32` case of the same folder used the binary32 c.
- H100 FP8 with binary32 output: the kernel computed d = a.b with c = 0; the
  c file was not used, so `c` holds zeros.
- L40S and B200 FP8 with binary32 output used the binary32 c.
- FP8 with binary16 output (H100, B200): c was used, rounded to binary16.
  These rows are not one block FMA: the FP8 mma.sync runs as two binary16
  MMAs (products with k mod 4 in {{0, 1}}, then the others) from zero, and c is
  added afterwards with one more rounding; every row is reproduced so (each
  case's `path` is "fp16"). The H100 FP8 rows with binary32 output match the
  native FP8 model instead (`path` "native"). See docs/tensorcore.md.

`h200.npz` is not upstream data: fpsim's own capture on an NVIDIA H200
(`fpsim capture`), described in `H200.md` beside this file.

Row i of every array of a case belongs together; the tags of upstream rows
are `upstream:random`.
"""


def write_readme(dest: Path, outputs: list, rows: int) -> None:
    from fpsim.tensorcore.captures import load_capture

    lines, gpus = [], []
    for path in outputs:
        cap = load_capture(path)
        gpus.append(cap.meta["gpu"].replace("NVIDIA ", ""))
        cases = "; ".join(f"`{c.name}`: {c.meta['inputs']} -> {c.meta['output']}, K={c.k}, {c.rows}"
                          for c in cap.cases)
        lines.append(f"| `{path.name}` | {cap.meta['gpu']} | {cap.meta['compute_capability']} "
                     f"| {cases} |")
    text = README.format(repo=UPSTREAM_REPO, reference=REFERENCE, rows=f"{rows:,}",
                         gpus=", ".join(gpus), table="\n".join(lines))
    (dest / "README.md").write_text(text)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--src", type=Path, default=default_src())
    p.add_argument("--dest", type=Path, default=REPO / "fpsim" / "data" / "captures")
    p.add_argument("--rows", type=int, default=2500)
    p.add_argument("--created", default=datetime.date.today().isoformat())
    args = p.parse_args(argv)
    if not args.src.is_dir():
        p.error(f"no upstream capture folder at {args.src}")
    args.dest.mkdir(parents=True, exist_ok=True)
    outputs = []
    for gpu_dir in sorted(d for d in args.src.iterdir() if d.is_dir()):
        out = convert_gpu(gpu_dir, args.rows, args.dest, args.created)
        print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB)")
        outputs.append(out)
    shutil.copyfile(args.src / "LICENCE-upstream.txt", args.dest / "LICENCE-upstream.txt")
    write_readme(args.dest, outputs, args.rows)
    print(f"wrote {args.dest / 'README.md'} and LICENCE-upstream.txt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
