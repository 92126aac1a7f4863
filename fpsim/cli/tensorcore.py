"""`fpsim validate`, `fpsim probes` and `fpsim capture`: the tensor-core model against real GPU outputs."""

from __future__ import annotations

import os
import sys

import numpy as np

from .common import json_number, nonnegative_int, print_json


def cmd_validate(args) -> int:
    """Compare a capture (file, upstream folder or bundled name) with the model, case by case.

    Exit status 1 when an instruction-level case is not reproduced bit for bit (library calls are
    reported, not judged: the library picks its own summation order)."""
    from ..tensorcore import validate

    source = validate.capture_source(args.capture)
    capture = validate.read_capture(source)
    device = args.device or validate.guess_device(capture.meta.get("gpu", ""))
    overrides = {"path": args.path} if args.path else {}
    results = validate.validate(capture, device, **overrides)
    exact = validate.all_bit_exact(results)
    if args.json:
        print_json(_validation_facts(source, capture, device, results, exact, args.show))
        return 0 if exact else 1
    print(f"capture: {source} ({capture.meta.get('gpu', '?')}), model: {device}")
    print(f"{'case':44} {'level':11} {'formats':13} {'K':>5} {'rows':>6} {'bit-exact':>10}")
    for r in results:
        share = f"{100 * r.agreement:9.1f}%" if r.rows else "      -"
        print(f"{r.name:44} {r.level:11} {r.inputs + '->' + r.output:13} {r.k:5} {r.rows:6} {share}"
              + (f"  ({r.note})" if r.note else ""))
        if args.show and r.mismatches:
            case = capture.case(r.name)
            tags = getattr(case, "tags", None)
            for i in r.mismatches[:args.show]:
                tag = f" [{tags[i]}]" if tags is not None and case.kind == "dot" else ""
                print(f"    row {i}{tag}: GPU {float(np.ravel(case.d_values)[i])!r}")
    for level in ("instruction", "library"):
        chosen = [r for r in results if r.level == level and r.rows]
        if chosen:
            rows, matched = sum(r.rows for r in chosen), sum(r.matched for r in chosen)
            print(f"{level}: {matched}/{rows} values bit-exact ({100 * matched / rows:.2f}%) "
                  f"in {len(chosen)} case(s)")
    if exact:
        return 0
    failed = [r.name for r in results if r.level == "instruction" and not r.bit_exact]
    print(f"fpsim validate: {len(failed)} instruction-level case(s) not bit-exact: {', '.join(failed)}",
          file=sys.stderr)
    return 1


def _validation_facts(source, capture, device: str, results: list, exact: bool, show: int) -> dict:
    """`fpsim validate --json`: per case its rows and matches (the first `show` mismatching rows), and totals."""
    cases = []
    for r in results:
        case = {"name": r.name, "level": r.level, "inputs": r.inputs, "output": r.output, "k": r.k, "rows": r.rows,
                "matched": r.matched, "bit_exact": r.bit_exact, "note": r.note or None}
        if show and r.mismatches:
            values = np.ravel(capture.case(r.name).d_values)
            case["mismatches"] = [{"row": int(i), "gpu": json_number(values[i])} for i in r.mismatches[:show]]
        cases.append(case)
    totals = {}
    for level in ("instruction", "library"):
        chosen = [r for r in results if r.level == level and r.rows]
        if chosen:
            rows, matched = sum(r.rows for r in chosen), sum(r.matched for r in chosen)
            totals[level] = {"rows": rows, "matched": matched, "share": matched / rows, "cases": len(chosen)}
    return {"capture": str(source), "gpu": capture.meta.get("gpu"), "model": device, "bit_exact": exact,
            "cases": cases, "totals": totals}


def cmd_probes(args) -> int:
    """The tensor-core features the standard probes show, for a model (and a capture)."""
    from ..tensorcore import features

    table = features.probe_table(args.device, args.inputs, args.output, **({"path": args.path} if args.path else {}))
    if args.json:
        print_json({"device": args.device, "inputs": args.inputs, "output": args.output, "path": args.path,
                     "features": {key: table.get(key)
                                  for key in features.FEATURES}})
        return 0
    print(f"model {args.device}, {args.inputs} -> {args.output}")
    for key in features.FEATURES:
        value = table.get(key, "-")
        print(f"  {key:18} {'(cannot tell from these probes)' if value is None else value}")
    return 0


class _CaptureLog:
    """The capture's progress callback: timestamped lines on stdout, appended to --log FILE too."""

    def __init__(self, path):
        self.path = path
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

    def __call__(self, message: str) -> None:
        import time

        line = f"[{time.strftime('%H:%M:%S')}] {message}"
        print(line, flush=True)
        if self.path:
            with open(self.path, "a") as f:
                f.write(line + "\n")


def cmd_capture(args) -> int:
    """Record real tensor-core outputs on this machine's CUDA GPU into a capture file."""
    from ..tensorcore import gpu_capture

    options = gpu_capture.CaptureOptions(
        out=args.out, rows=args.rows, seed=args.seed, skip_library=args.skip_library, skip_wgmma=args.skip_wgmma,
        sass_dir=args.sass_dir, backend=args.backend, simulate=args.simulate, in_process=args.in_process,
        group_timeout=args.group_timeout, max_mib=args.max_mib, command=" ".join(sys.argv),
        **({"formats": tuple(args.formats.split(","))} if args.formats is not None else {}))
    log = _CaptureLog(args.log)
    try:
        run = gpu_capture.run(options, log)
    except gpu_capture.NoCudaDevice as err:
        print(f"fpsim capture: {err}", file=sys.stderr)
        return 2
    failures = run.capture.meta["failures"]
    log(f"wrote {run.path}: {len(run.capture.cases)} case(s), {len(failures)} failure(s), {run.mib:.1f} MiB, "
        f"{run.seconds:.0f} s")
    for f in failures:
        log(f"  failure {f['case']}: {f['error'].splitlines()[0]}")
    return 0 if run.capture.cases else 1


def add_validate_parser(sub) -> None:
    """The subcommand `fpsim validate CAPTURE`."""
    p = sub.add_parser("validate", help="compare real tensor-core outputs with the model, bit for bit "
                                        "(exit 1 when an instruction-level case is not bit-exact)")
    p.add_argument("capture", help="a capture file (.npz), an upstream text folder, or a bundled name "
                                   "(v100, a100, l40s, h100, h200, b200)")
    p.add_argument("--device", help="device model to use (default: the capture's GPU)")
    p.add_argument("--path", choices=["native", "fp16"], help="FP8 path for every case (default: each case's own)")
    p.add_argument("--show", type=nonnegative_int, default=0, metavar="N",
                   help="print the first N mismatching rows per case")
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout (same exit status)")
    p.set_defaults(func=cmd_validate)


def add_probes_parser(sub) -> None:
    """The subcommand `fpsim probes`."""
    p = sub.add_parser("probes", help="tensor-core features shown by the standard probes, for a device model")
    p.add_argument("--device", default="h100", help="product or generation name (default h100)")
    p.add_argument("--inputs", default="fp16", help="input format of the tensor core, one the device takes "
                                                    "(default fp16); block formats (mxfp8_e4m3, nvfp4, ...) are "
                                                    "not probed")
    p.add_argument("--output", default="fp32", help="output (accumulator) format (default fp32)")
    p.add_argument("--path", choices=["native", "fp16"],
                   help="FP8 only: native FP8 MMAs or binary16 MMAs (default: native where the device has it)")
    p.add_argument("--json", action="store_true", help="print the features as JSON on stdout")
    p.set_defaults(func=cmd_probes)


def add_capture_parser(sub) -> None:
    """The subcommand `fpsim capture --out FILE`."""
    p = sub.add_parser("capture", help="record real tensor-core outputs on this machine's CUDA GPU (docs/capture.md)",
                       description="Record real tensor-core outputs (instruction-level MMAs and cuBLAS calls) on this "
                                   "machine's CUDA GPU into a capture file; compare it with `fpsim validate FILE`.")
    p.add_argument("--out", required=True, help="capture file to write (.npz)")
    p.add_argument("--formats", help="input formats, comma-separated (default: every format the tensor cores take)")
    p.add_argument("--rows", type=nonnegative_int, default=4096,
                   help="random rows per instruction case, half wide-spread, half upstream-like "
                        "(probes come on top; default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random rows and inputs (default 0)")
    p.add_argument("--skip-library", action="store_true", help="no torch library-level cases")
    p.add_argument("--skip-wgmma", action="store_true", help="no Hopper wgmma cases")
    p.add_argument("--log", help="append progress to this file")
    p.add_argument("--sass-dir", help="write cuobjdump SASS of the kernels here")
    p.add_argument("--backend", choices=("auto", "cupy", "torch"), default="auto",
                   help="kernel launcher: CuPy if importable (auto), or torch load_inline")
    p.add_argument("--simulate", action="store_true",
                   help="no GPU: run the instruction cases through fpsim's own model (tests the host code; "
                        "not tensor-core data)")
    p.add_argument("--in-process", action="store_true", help="run the groups in this process (no isolation)")
    p.add_argument("--group-timeout", type=int, default=None, metavar="S",
                   help="seconds before a group's process is stopped (default: per group)")
    p.add_argument("--max-mib", type=float, default=15.0,
                   help="above this size, library cases go to a second file <out>-library.npz (default 15)")
    p.set_defaults(func=cmd_capture)
