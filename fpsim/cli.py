"""The `fpsim` command: the only place that parses arguments or prints for humans."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from fractions import Fraction

import numpy as np

from . import exact, modes
from .blocks import BLOCK_PRESETS, SCALE_RULES, BlockFormat
from .formats import ALIASES, PRESETS, Format, format as get_format


def _fmt_number(value) -> str:
    value = float(value)
    if value != value or value in (float("inf"), float("-inf")):
        return str(value)
    return f"{value:.8g}"


def _json_number(value):
    """A float for JSON; Inf and NaN (which JSON lacks) as the strings "inf", "-inf", "nan"."""
    value = float(value)
    if value != value:
        return "nan"
    if value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    return value


def _print_json(data) -> None:
    print(json.dumps(data, indent=2))


def _format_facts(fmt: Format) -> dict:
    """A format's layout and exact values (floats hold them exactly; fractions as text too)."""
    values = {key: getattr(fmt, key) for key in ("max", "min_normal", "min_subnormal", "eps")}
    return {"name": fmt.name, "bits": fmt.bits, "exp_bits": fmt.exp_bits, "man_bits": fmt.man_bits,
            "bias": fmt.bias, "signed": fmt.signed, "infinities": fmt.infinities, "nan": fmt.nan,
            "subnormals": fmt.subnormals, "zero": fmt.zero,
            **{key: float(v) for key, v in values.items()},
            "exact": {key: str(v) for key, v in values.items()},
            "normal_binades": fmt.normal_binades, "subnormal_binades": fmt.subnormal_binades,
            "aliases": sorted(alias for alias, target in ALIASES.items() if target == fmt.name)}


def _bits_per_element(fmt: BlockFormat) -> Fraction:
    """Storage per element: the element's bits and its share of one scale (a tensor scale is left out)."""
    element_bits = fmt.element.bits
    return element_bits + Fraction(fmt.scale.bits, math.prod(fmt.block_shape))


def _block_facts(fmt: BlockFormat) -> dict:
    """A block format's parts (the element and scale formats are rows of their own)."""
    return {"name": fmt.name, "kind": "block", "element": str(fmt.element), "scale": fmt.scale.name,
            "block_size": list(fmt.block_shape), "scale_rule": fmt.scale_rule,
            "scale_rule_source": fmt.rule.source,
            "tensor_scale": fmt.tensor_scale.name if fmt.tensor_scale is not None else None,
            "amax_floor": fmt.amax_floor, "element_max": float(fmt.element_max),
            "bits_per_element": float(_bits_per_element(fmt))}


def _print_table(header, rows) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))


def cmd_formats(args) -> int:
    """Print every preset with its range and precision, then the block formats."""
    if args.json:
        _print_json([{**_format_facts(fmt), "kind": "format"} for fmt in PRESETS.values()]
                    + [_block_facts(fmt) for fmt in BLOCK_PRESETS.values()])
        return 0
    header = ("name", "bits", "E", "M", "bias", "max", "min normal", "min subnormal", "epsilon",
              "binades", "Inf", "NaN")
    rows = []
    for fmt in PRESETS.values():
        rows.append((fmt.name, str(fmt.bits), str(fmt.exp_bits), str(fmt.man_bits), str(fmt.bias),
                     _fmt_number(fmt.max), _fmt_number(fmt.min_normal), _fmt_number(fmt.min_subnormal),
                     _fmt_number(fmt.eps), f"{fmt.normal_binades}+{fmt.subnormal_binades}",
                     "yes" if fmt.infinities else "no", fmt.nan))
    _print_table(header, rows)
    print("\nbinades: normal+subnormal. NaN encodings: ieee (all-ones exponent), fn (all-ones code),")
    print("fnuz (the negative-zero code), none. Aliases: " + ", ".join(sorted(ALIASES)))
    print("\nBlock formats (fpsim.quantize(x, name, axis=...); docs/blocks.md):\n")
    header = ("name", "element", "scale", "block", "scale rule", "tensor scale", "bits/element", "element max")
    rows = [(fmt.name, str(fmt.element), fmt.scale.name, "x".join(map(str, fmt.block_shape)), fmt.scale_rule,
             fmt.tensor_scale.name if fmt.tensor_scale is not None else "-", f"{float(_bits_per_element(fmt)):g}",
             _fmt_number(fmt.element_max)) for fmt in BLOCK_PRESETS.values()]
    _print_table(header, rows)
    print("\nscale rules (per block, from its amax):")
    for rule in SCALE_RULES.values():
        print(f"  {rule.name:8} {rule.summary}")
    return 0


_DECIMAL = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?$")
# Every format's values lie within [2^-1074, 2^1024): a typed magnitude beyond these bounds rounds
# as the bound does in every format and mode, and the bound keeps the exact arithmetic small.
_HUGE, _TINY = Fraction(2) ** 1100, Fraction(1, 2**1200)


def _parse_value(text: str):
    """The exact value a user typed (a decimal or fraction string, or inf/nan), and a note when a
    magnitude beyond every format's range stands in for it (1e999999, 1e-30000000)."""
    lowered = text.strip().lower()
    if lowered in ("inf", "+inf", "infinity", "-inf", "-infinity", "nan", "-nan", "+nan"):
        return float(lowered), None
    if lowered in ("-0", "-0.0"):
        return -0.0, None
    match = _DECIMAL.match(lowered)
    if match:
        digits = match.group(1).replace(".", "")
        if digits.strip("0"):
            exponent = int(match.group(2)[1:]) if match.group(2) else 0
            point = match.group(1).find(".")
            whole = len(match.group(1)) if point < 0 else point
            first = len(digits) - len(digits.lstrip("0"))  # leading zeros of the digit string
            log10 = exponent + whole - first  # 10^(log10 - 1) <= |value| < 10^log10
            sign = -1 if lowered.startswith("-") else 1
            if log10 > 340:
                return sign * _HUGE, "beyond every format's range: rounded as 2^1100"
            if log10 < -340:
                return sign * _TINY, "below every format's smallest value: rounded as 2^-1200"
    try:
        return Fraction(text.strip()), None
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"cannot read {text!r} as a number (decimal like 0.1 or 1e-5, a fraction "
                         f"like 1/3, inf or nan)") from None


def _bits_string(code: int, fmt: Format) -> str:
    text = format(code, f"0{fmt.bits}b")
    parts = []
    if fmt.signed:
        parts.append(text[0])
        text = text[1:]
    parts.append(text[:fmt.exp_bits])
    if fmt.man_bits:
        parts.append(text[fmt.exp_bits:])
    return " ".join(parts) + f"  (0x{code:0{(fmt.bits + 3) // 4}x})"


def cmd_cast(args) -> int:
    """Round typed values into formats and show the result, its bits and its neighbours."""
    formats = [get_format(name) for name in args.to.split(",")]
    modes.check_rounding(args.rounding)
    results = []
    for text in args.values:
        value, stand_in = _parse_value(text)
        for fmt in formats:
            result = exact.round_value(value, fmt, args.rounding, args.saturate,
                                       random_fraction=Fraction(1, 2) if args.rounding == "stochastic" else None)
            if args.json:
                results.append(_cast_facts(text, value, stand_in, fmt, result, args))
                continue
            print(f"input       {text}" + (f" ({stand_in})" if stand_in else ""))
            print(f"format      {fmt.name} ({fmt.bits} bits: {int(fmt.signed)} sign, {fmt.exp_bits} exponent, "
                  f"{fmt.man_bits} mantissa, bias {fmt.bias})")
            print(f"rounding    {args.rounding}{', saturating' if args.saturate else ''}"
                  + (" (one draw, u = 1/2)" if args.rounding == "stochastic" else ""))
            print(f"result      {_fmt_number(result) if result == result else 'nan'}")
            if result != result:  # the engine's NaN keeps the input's sign (where the format's NaN has one)
                negative = value < 0 if isinstance(value, Fraction) else math.copysign(1.0, value) < 0
                result = -math.nan if negative else math.nan
            try:
                print(f"bits        {_bits_string(exact.encode_value(result, fmt), fmt)}")
            except ValueError as err:
                print(f"bits        none: {err}")
            if isinstance(value, Fraction) and value != 0 and not stand_in:
                low, high = exact.neighbours(fmt, abs(value))
                if value < 0:
                    low, high = -high, -low
                if low == high:
                    print(f"neighbours  {_fmt_number(low)} is exactly representable")
                else:
                    shown_high = _fmt_number(high) if abs(high) <= fmt.max else f"{_fmt_number(high)} (beyond max)"
                    print(f"neighbours  {_fmt_number(low)} < {text} < {shown_high}")
                if result == result and abs(result) != float("inf"):
                    error = (Fraction(result) - value) / value
                    print(f"rel. error  {float(error):+.4e}")
            print()
    if args.json:
        _print_json(results)
    return 0


def _cast_facts(text: str, value, stand_in, fmt: Format, result: float, args) -> dict:
    """One cast as data: what `fpsim cast` prints, for scripts."""
    if result != result:  # the engine's NaN keeps the input's sign (where the format's NaN has one)
        negative = value < 0 if isinstance(value, Fraction) else math.copysign(1.0, value) < 0
        result = -math.nan if negative else math.nan
    try:
        code = exact.encode_value(result, fmt)
    except ValueError:
        code = None
    facts = {"input": text, "format": fmt.name, "rounding": args.rounding, "saturate": args.saturate,
             "result": _json_number(result), "code": code,
             "bits": _bits_string(code, fmt).split("  (")[0] if code is not None else None, "note": stand_in}
    if isinstance(value, Fraction) and value != 0 and not stand_in:
        low, high = exact.neighbours(fmt, abs(value))
        low, high = (-high, -low) if value < 0 else (low, high)
        facts["neighbours"] = [float(low), float(high)]
        if result == result and abs(result) != float("inf"):
            facts["rel_error"] = float((Fraction(result) - value) / value)
    return facts


def cmd_validate(args) -> int:
    """Compare a capture (file, upstream folder or bundled name) with the model, case by case.

    Exit status 1 when an instruction-level case is not reproduced bit for bit (library calls are
    reported, not judged: the library picks its own summation order)."""
    from .tensorcore import validate

    source = validate.capture_source(args.capture)
    capture = validate.read_capture(source)
    device = args.device or validate.guess_device(capture.meta.get("gpu", ""))
    overrides = {"path": args.path} if args.path else {}
    results = validate.validate(capture, device, **overrides)
    exact = validate.all_bit_exact(results)
    if args.json:
        _print_json(_validation_facts(source, capture, device, results, exact, args.show))
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
            case["mismatches"] = [{"row": int(i), "gpu": _json_number(values[i])} for i in r.mismatches[:show]]
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
    from .tensorcore import features

    table = features.probe_table(args.device, args.inputs, args.output, **({"path": args.path} if args.path else {}))
    if args.json:
        _print_json({"device": args.device, "inputs": args.inputs, "output": args.output, "path": args.path,
                     "features": {key: _json_default(table[key]) if key in table else None
                                  for key in features.FEATURES}})
        return 0
    print(f"model {args.device}, {args.inputs} -> {args.output}")
    for key in features.FEATURES:
        print(f"  {key:18} {table.get(key, '-')}")
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
    from .tensorcore import gpu_capture

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


def cmd_study(args) -> int:
    """Run reproducible studies: regenerate their figures and Markdown pages."""
    from . import studies

    if args.list or not args.names:
        if args.json:
            _print_json([{"name": name, "title": title} for name, title in studies.available()])
            return 0
        for name, title in studies.available():
            print(f"{name:22} {title}")
        if not args.list:
            print("\nrun one with: fpsim study NAME [--fast] [--out DIR]  (or: fpsim study all)")
        return 0
    names = list(studies.STUDIES) if args.names == ["all"] else args.names
    for name in names:
        if name not in studies.STUDIES:
            raise ValueError(f"unknown study {name!r}; allowed: {', '.join(studies.STUDIES)} or all")
    done = []
    for name in names:
        if not args.quiet:
            print(f"study {name}{' (fast)' if args.fast else ''} ...", file=sys.stderr, flush=True)
        try:
            result = studies.run(name, fast=args.fast, out=args.out)
        except studies.StudyUnavailable as err:
            print(f"fpsim study: {name}: {err}", file=sys.stderr)
            return 2
        if args.json:
            done.append({"name": name, "finding": result.finding, "page": str(result.page),
                         "figures": [str(f) for f in result.figures], "seconds": round(result.seconds, 2),
                         "values": result.values})
            continue
        print(f"{name}: {result.finding}")
        print(f"  page    {result.page}")
        for path in result.figures:
            print(f"  figure  {path}")
        print(f"  {result.seconds:.1f} s")
    if args.json:
        print(json.dumps(done, indent=2, default=_json_default))
    return 0


def cmd_compare(args) -> int:
    """What changed between two saved reports; exit 1 when a verdict or a loss scale did."""
    from .analyze.compare import compare

    comparison = compare(args.a, args.b)
    if args.html:
        from .analyze.html import render_comparison_html
        from .analyze.report import atomic_write

        folder = os.path.dirname(os.path.abspath(args.html))
        if not os.path.isdir(folder):
            raise ValueError(f"--html {args.html!r}: no folder {folder!r} to write it into")
        atomic_write(args.html, render_comparison_html(comparison).encode())
    if args.json:
        print(json.dumps(comparison.to_dict(), indent=2, default=_json_default))
    else:
        print(comparison.text(max_shares=args.shares))
        if args.html:
            print(f"\ncomparison written to {args.html}")
    return 1 if comparison.changed else 0


def _json_default(value):
    """numpy numbers and other leftovers in study values, as JSON."""
    if hasattr(value, "item"):
        return _json_number(value.item()) if isinstance(value.item(), float) else value.item()
    return str(value)


# ------------------------------------------------------------- analyzer (demo, analyze)
class _Progress:
    """Steps done, the rate and the time left, on stderr (stdlib only).

    On a terminal one line is rewritten in place (at most 5 times a second); in
    a log file (not a tty) a line is appended at most every 10 seconds and at
    the end, so logs stay short. quiet: nothing at all.
    """

    def __init__(self, what: str, total=None, stream=None, quiet: bool = False):
        import time

        self.what, self.total, self.stream, self.quiet = what, total, stream or sys.stderr, quiet
        self.time = time.perf_counter
        self.start = self._last = self.time()
        self.shown, self.step = False, 0
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()

    def __call__(self, step: int) -> None:
        self.step = step
        if self.quiet:
            return
        now = self.time()
        interval = 0.2 if self.tty else 10.0
        if self.shown and step != self.total and now - self._last < interval:
            return
        self._last, self.shown = now, True
        self.stream.write(("\r" if self.tty else "") + self._line(step, now) + ("" if self.tty else "\n"))
        self.stream.flush()

    def _line(self, step: int, now: float) -> str:
        elapsed = now - self.start
        rate = step / max(elapsed, 1e-9)
        text = f"fpsim {self.what}: step {step}" + (f"/{self.total}" if self.total else "")
        text += f"  {rate:.1f} steps/s  {elapsed:.0f} s"
        if self.total and 0 < step < self.total:
            text += f"  ETA {(self.total - step) / max(rate, 1e-9):.0f} s"
        return text + " "

    def done(self) -> None:
        if self.shown and self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _analyzer_formats(text: str):
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if not names:
        raise ValueError(f"--formats needs at least one format name, got {text!r}; allowed: {', '.join(PRESETS)}")
    return names


def _print_report(report, paths: dict, out, as_json: bool = False) -> None:
    if as_json:  # the report's summary and where its files are
        print(json.dumps({"summary": report.summary(), "files": {k: str(v) for k, v in paths.items()}},
                         indent=2, default=str))
        return
    print(report.summary_table())
    _print_written(paths, out)


def _print_written(paths: dict, out, error=None, stream=None) -> None:
    """Say where the report is, only when report.json was really written."""
    stream = stream or sys.stdout
    if paths.get("report.json"):
        print(f"\nreport written to {out}/: " + ", ".join(sorted(os.path.basename(p) for p in paths.values())),
              file=stream)
    else:
        print(f"\nno report was written to {out}/" + (f": {error}" if error else ""), file=stream)


def cmd_demo(args) -> int:
    """Train the bundled demo model on generated data, observe it, write and summarise the report."""
    from .analyze.demo import DEMO_STEPS, run_demo
    from .analyze.runner import check_out

    if args.steps is None:
        args.steps = DEMO_STEPS
    check_out(args.out)
    progress = _Progress("demo", args.steps, quiet=args.quiet)
    try:
        report, paths, facts = run_demo(args.out, steps=args.steps, every=args.every, shadow_every=args.shadow_every,
                                        recipes_every=args.recipes_every,
                                        formats=_analyzer_formats(args.formats), threads=args.threads,
                                        on_step=progress)
    finally:
        progress.done()
    if not args.json:
        print(f"SensorNet on generated sensor data: {args.steps} steps, loss {facts['first_loss']:.3f} -> "
              f"{facts['last_loss']:.3f}, test accuracy {facts['test_accuracy']:.1%}, {facts['seconds']:.1f} s\n")
    _print_report(report, paths, args.out, args.json)
    return 0


def cmd_analyze(args) -> int:
    """Observe an unmodified training script (or the demo) and write the report.

    Exit codes: 0 done; 2 a usage error (found before the script starts); 1 the
    script raised (its traceback is printed); 130 Ctrl-C; 143 SIGTERM. In every
    case but 2 the report so far is written, and its location said.
    """
    import traceback

    from .analyze.signals import TERMINATED_EXIT_CODE, Terminated

    if args.demo and (args.emulate or args.confirm):
        raise ValueError("--emulate and --confirm run a training script, not --demo")
    if args.demo:
        return cmd_demo(args)
    if not args.script:
        raise ValueError("give a training script (fpsim analyze train.py -- ARGS) or --demo")
    from .analyze.runner import ScriptRun

    script_args = list(args.script_args)
    if "--" in script_args:  # fpsim's options may also sit between the script and `--`
        cut = script_args.index("--")
        options, script_args = script_args[:cut], script_args[cut + 1:]
        if options:
            parser = argparse.ArgumentParser(prog="fpsim analyze SCRIPT", add_help=False)
            _add_analyzer_options(parser, with_modules=True)
            parser.parse_args(options, namespace=args)
    if args.emulate or args.confirm:
        from .emulate.confirm import check_confirm

        check_confirm(args.script, script_args, args.emulate, args.confirm, _analyzer_formats(args.formats))
        if not args.confirm:
            return _emulated(args, script_args)
    progress = _Progress("analyze", args.steps, quiet=args.quiet)
    run = ScriptRun(args.script, script_args, out=args.out, steps=args.steps, every=args.every,
                    shadow_every=args.shadow_every, recipes_every=args.recipes_every,
                    formats=_analyzer_formats(args.formats), modules=args.modules, on_step=progress)
    try:
        report, paths = run.run()
    except KeyboardInterrupt:
        progress.done()
        print("fpsim analyze: interrupted", file=sys.stderr)
        _print_written(run.written, args.out, run.watcher.save_error, sys.stderr)
        return 130
    except Terminated:
        progress.done()
        print("fpsim analyze: terminated (SIGTERM)", file=sys.stderr)
        _print_written(run.written, args.out, run.watcher.save_error, sys.stderr)
        return TERMINATED_EXIT_CODE
    except SystemExit as exit_:           # the script's own sys.exit(N): its code, no traceback
        progress.done()
        print(f"fpsim analyze: the training script exited with {exit_.code!r}", file=sys.stderr)
        _print_written(run.written, args.out, run.watcher.save_error, sys.stderr)
        return exit_.code if isinstance(exit_.code, int) else 1
    except BaseException as err:
        progress.done()
        traceback.print_exception(type(err), err, err.__traceback__, file=sys.stderr)
        print(f"fpsim analyze: the training script raised {type(err).__name__}: {err}", file=sys.stderr)
        _print_written(run.written, args.out, run.watcher.save_error, sys.stderr)
        return 1
    progress.done()
    if report is None or not report.layers:
        print("fpsim analyze: nothing was observed (no module ran a forward pass with gradients enabled)",
              file=sys.stderr)
        _print_written(paths, args.out, run.watcher.save_error, sys.stderr)
        return 1
    _print_report(report, paths, args.out, args.json)
    if not paths.get("report.json"):
        return 1
    return _emulated(args, script_args) if args.confirm else 0


def _emulated(args, script_args) -> int:
    """`--emulate RECIPE` alone: the script under emulation; with `--confirm`: FP32, unprotected and
    recommended runs into the report (fpsim.emulate.confirm). Exit codes as cmd_analyze's."""
    import json
    import traceback

    from .emulate import confirm

    recipe = args.emulate or confirm.CONFIRM_RECIPE
    say = (lambda label: None) if args.quiet else (lambda label: print(f"fpsim analyze: emulating {label}",
                                                                      file=sys.stderr))
    run = confirm.confirm if args.confirm else confirm.emulate_script
    try:
        section = run(args.script, script_args, recipe, args.out, steps=args.steps, on_run=say)
    except KeyboardInterrupt:
        print("fpsim analyze: interrupted", file=sys.stderr)
        return 130
    except BaseException as err:
        traceback.print_exception(type(err), err, err.__traceback__, file=sys.stderr)
        print(f"fpsim analyze: the training script raised {type(err).__name__} under emulation: {err}",
              file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(section, indent=2))
    else:
        where = "report.json" if args.confirm else "emulation.json"
        print(f"\n{confirm.table(section)}\n\nlosses written to {args.out}/: {where}, {section['figure']}")
    return 0


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _add_output_options(p) -> None:
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress output on stderr")


def _add_analyzer_options(p, with_modules: bool = False) -> None:
    p.add_argument("--out", default="fpsim-report", metavar="DIR", help="report folder (default fpsim-report)")
    p.add_argument("--steps", type=_positive_int, default=None, metavar="N",
                   help="stop after N optimizer steps (the demo: train N steps, default 400)")
    p.add_argument("--every", type=_positive_int, default=1, metavar="N", help="observe every N-th step (default 1)")
    p.add_argument("--shadow-every", type=_positive_int, default=None, metavar="N",
                   help="replay every N-th step in each format and judge layers by the measured gradient error "
                        "against their noise floor (default: value counts only)")
    p.add_argument("--recipes-every", type=_positive_int, default=None, metavar="N",
                   help="on every N-th observed step, measure what each FP8/FP6/FP4 scaling recipe loses per layer "
                        "and tensor kind (docs/recipes.md; default: not measured)")
    p.add_argument("--formats", default="fp16,bf16,e4m3,e5m2", help="formats to judge, comma-separated")
    p.add_argument("--threads", type=_positive_int, default=1, help="torch threads for the demo (default 1)")
    _add_output_options(p)
    if with_modules:
        p.add_argument("--modules", default=None, choices=["params", "leaves", "all"],
                       help="which modules to record (default params: modules holding parameters)")
        p.add_argument("--emulate", default=None, metavar="RECIPE",
                       help="run the script under an emulated recipe (fp16, bf16, fp8, mxfp8, ...: docs/emulate.md) "
                            "instead of observing it; writes emulation.json and a loss figure")
        p.add_argument("--confirm", action="store_true",
                       help="after observing, run the script in FP32, under the recipe (--emulate, default fp16) "
                            "unprotected and as the report recommends: the loss curves go into report.json")


def _count(text: str) -> int:
    """An integer >= 0, for argparse."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(prog="fpsim", description="Bit-exact floating-point format simulator.")
    parser.add_argument("--version", action="version",
                        version=f"fpsim {__version__} (distribution fpsim-mixed-precision)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("formats", help="table of every preset format, block formats included")
    p.add_argument("--json", action="store_true", help="print the formats as JSON on stdout")
    p.set_defaults(func=cmd_formats)

    p = sub.add_parser("cast", help="round values into formats and show bits and neighbours")
    p.add_argument("values", nargs="+", help="numbers as typed: 0.1, -3e-5, 1/3, inf, nan")
    p.add_argument("--to", required=True, help="format name(s), comma-separated (e.g. e4m3,bf16)")
    p.add_argument("--rounding", default="nearest_even", help=f"one of {', '.join(modes.ROUNDING_MODES)}")
    p.add_argument("--saturate", action="store_true", help="clamp overflow to ±max")
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    # negative values as typed (-3e-5, -1/3, -inf) are values, not options (argparse knows only -3 and -.5)
    p._negative_number_matcher = re.compile(r"^-(\d+\.?\d*(e[+-]?\d+)?|\.\d+(e[+-]?\d+)?|\d+/\d+|inf|infinity|nan|0)$",
                                            re.IGNORECASE)
    p.set_defaults(func=cmd_cast)

    p = sub.add_parser("validate", help="compare real tensor-core outputs with the model, bit for bit "
                                        "(exit 1 when an instruction-level case is not bit-exact)")
    p.add_argument("capture", help="a capture file (.npz), an upstream text folder, or a bundled name "
                                   "(v100, a100, l40s, h100, h200, b200)")
    p.add_argument("--device", help="device model to use (default: the capture's GPU)")
    p.add_argument("--path", choices=["native", "fp16"], help="FP8 path for every case (default: each case's own)")
    p.add_argument("--show", type=_count, default=0, metavar="N", help="print the first N mismatching rows per case")
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout (same exit status)")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("probes", help="tensor-core features shown by the standard probes, for a device model")
    p.add_argument("--device", default="h100", help="product or generation name (default h100)")
    p.add_argument("--inputs", default="fp16", help="input format of the tensor core (default fp16)")
    p.add_argument("--output", default="fp32", help="output (accumulator) format (default fp32)")
    p.add_argument("--path", choices=["native", "fp16"],
                   help="FP8 only: native FP8 MMAs or binary16 MMAs (default: native where the device has it)")
    p.add_argument("--json", action="store_true", help="print the features as JSON on stdout")
    p.set_defaults(func=cmd_probes)

    p = sub.add_parser("compare", help="what changed between two analyzer runs: verdicts, loss scales, underflow "
                                       "shares (exit 1 when a verdict or loss scale changed)",
                       description="Compare two saved analyzer reports (folders or report.json files). Exit "
                                   "status: 0 nothing changed, 1 a verdict, a recommended loss scale, a layer or "
                                   "a format changed, 2 a usage error (a path that is not a report).")
    p.add_argument("a", help="the first run: a report folder or its report.json")
    p.add_argument("b", help="the second run")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON on stdout")
    p.add_argument("--html", metavar="FILE", help="also write the comparison as a self-contained HTML page")
    p.add_argument("--shares", type=_count, default=12, metavar="N",
                   help="underflow shares listed in the text (largest change first; default 12)")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("study", help="run reproducible studies: regenerate their figures and pages in docs/")
    p.add_argument("names", nargs="*", metavar="NAME", help="study name(s), or all (fpsim study --list)")
    p.add_argument("--fast", action="store_true", help="quick version: fewer points and smaller sizes")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="folder for figures/studies/*.png and studies/NAME.md (default: docs/ in a source "
                        "checkout, else ./fpsim-studies/)")
    p.add_argument("--list", action="store_true", help="list the studies and exit")
    _add_output_options(p)
    p.set_defaults(func=cmd_study)

    p = sub.add_parser("capture", help="record real tensor-core outputs on this machine's CUDA GPU (docs/capture.md)",
                       description="Record real tensor-core outputs (instruction-level MMAs and cuBLAS calls) on this "
                                   "machine's CUDA GPU into a capture file; compare it with `fpsim validate FILE`.")
    p.add_argument("--out", required=True, help="capture file to write (.npz)")
    p.add_argument("--formats", help="input formats, comma-separated (default: every format the tensor cores take)")
    p.add_argument("--rows", type=_count, default=4096,
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
    p = sub.add_parser("demo", help="train a small model on generated data, observe it, write a gradient-"
                                    "underflow report (fpsim-report/)")
    _add_analyzer_options(p)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("analyze", help="observe a training script: which layers need loss scaling or FP32 "
                                       "(fpsim analyze train.py -- ARGS)")
    p.add_argument("script", nargs="?", help="the training script, run as `python SCRIPT ARGS` would")
    p.add_argument("script_args", nargs=argparse.REMAINDER,
                   help="fpsim options, then -- and the script's arguments (without --, all go to the script)")
    _add_analyzer_options(p, with_modules=True)
    p.add_argument("--demo", action="store_true", help="run the demo instead of a script (as fpsim demo)")
    p.set_defaults(func=cmd_analyze)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError, FileNotFoundError) as err:
        print(f"fpsim {args.command}: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (fpsim formats | head): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0


if __name__ == "__main__":
    sys.exit(main())
