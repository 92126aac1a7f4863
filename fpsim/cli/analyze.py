"""`fpsim analyze`, `fpsim demo` and `fpsim compare`: the training-run analyzer from the command line."""

from __future__ import annotations

import argparse
import os
import sys

from ..analyze.shadow import COMMAND_LINE_EVERY
from ..formats import PRESETS
from .common import add_output_options, nonnegative_int, output_to_stderr, positive_int, print_json


def cmd_compare(args) -> int:
    """What changed between two saved reports; exit 1 when a verdict or a loss scale did."""
    from ..analyze.compare import compare

    comparison = compare(args.a, args.b)
    if args.html:
        from ..analyze.html import render_comparison_html
        from ..analyze.report import atomic_write

        folder = os.path.dirname(os.path.abspath(args.html))
        if not os.path.isdir(folder):
            raise ValueError(f"--html {args.html!r}: no folder {folder!r} to write it into")
        atomic_write(args.html, render_comparison_html(comparison).encode())
    if args.json:
        print_json(comparison.to_dict())
    else:
        print(comparison.text(max_shares=args.shares))
        if args.html:
            print(f"\ncomparison written to {args.html}")
    return 1 if comparison.changed else 0


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


def _report_json(report, paths: dict) -> dict:
    """--json's document: the report's summary and where its files are."""
    return {"summary": report.summary(), "files": {k: str(v) for k, v in paths.items()}}


def _print_report(report, paths: dict, out, as_json: bool = False) -> None:
    if as_json:
        print_json(_report_json(report, paths))
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
    from ..analyze.demo import DEMO_STEPS, run_demo
    from .._script import check_out

    if args.steps is None:
        args.steps = DEMO_STEPS
    check_out(args.out)
    progress = _Progress("demo", args.steps, quiet=args.quiet)
    try:
        report, paths, facts = run_demo(args.out, steps=args.steps, every=args.every,
                                        shadow_every=args.shadow_every or None, recipes_every=args.recipes_every,
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

    from ..analyze.signals import TERMINATED_EXIT_CODE, Terminated

    if args.demo and (args.emulate or args.confirm):
        raise ValueError("--emulate and --confirm run a training script, not --demo")
    if args.demo:
        return cmd_demo(args)
    if not args.script:
        raise ValueError("give a training script (fpsim analyze train.py -- ARGS) or --demo")
    from ..analyze.runner import ScriptRun

    script_args = list(args.script_args)  # without `--`: everything after the script
    if args.after_dashes is not None:  # with `--`: its arguments; what sits between the script and it: ours
        if script_args:
            parser = argparse.ArgumentParser(prog="fpsim analyze SCRIPT", add_help=False)
            _add_analyzer_options(parser, with_modules=True)
            parser.parse_args(script_args, namespace=args)
        script_args = args.after_dashes
    if args.emulate is not None and not args.emulate.strip():   # (empty: not the same as no --emulate)
        raise ValueError("--emulate: give a recipe name (fp16, bf16, fp8, mxfp8, ...: docs/emulate.md)")
    if args.emulate or args.confirm:
        from ..emulate.confirm import check_confirm

        check_confirm(args.script, script_args, args.emulate, args.confirm, _analyzer_formats(args.formats))
        if not args.confirm:
            return _emulated(args, script_args)
    progress = _Progress("analyze", args.steps, quiet=args.quiet)
    run = ScriptRun(args.script, script_args, out=args.out, steps=args.steps, every=args.every,
                    shadow_every=args.shadow_every or None, recipes_every=args.recipes_every,
                    formats=_analyzer_formats(args.formats), modules=args.modules, on_step=progress)
    try:
        with output_to_stderr(args.json):
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
    if report is not None and report.rank != 0:   # under torchrun: rank 0 writes and summarises the report
        return 0
    if report is None or not report.layers:
        print("fpsim analyze: nothing was observed (no module ran a forward pass with gradients enabled)",
              file=sys.stderr)
        _print_written(paths, args.out, run.watcher.save_error, sys.stderr)
        return 1
    if args.confirm and args.json:      # one JSON document: the report's, with the emulated runs in it
        if not paths.get("report.json"):
            print_json(_report_json(report, paths))
            return 1
        return _emulated(args, script_args, _report_json(report, paths))
    _print_report(report, paths, args.out, args.json)
    if not paths.get("report.json"):
        return 1
    return _emulated(args, script_args) if args.confirm else 0


def _emulated(args, script_args, report_json: dict | None = None) -> int:
    """`--emulate RECIPE` alone: the script under emulation; with `--confirm`: FP32, unprotected and
    recommended runs into the report (fpsim.emulate.confirm). Exit codes as cmd_analyze's. report_json: with
    --json after the analyzer's run, its document, printed with the runs as its "emulation"."""
    import traceback

    from ..emulate import confirm

    recipe = args.emulate or confirm.CONFIRM_RECIPE
    say = (lambda label: None) if args.quiet else (lambda label: print(f"fpsim analyze: emulating {label}",
                                                                      file=sys.stderr))
    run = confirm.confirm if args.confirm else confirm.emulate_script
    code = 0
    try:
        with output_to_stderr(args.json):
            section = run(args.script, script_args, recipe, args.out, steps=args.steps, on_run=say)
    except KeyboardInterrupt:
        print("fpsim analyze: interrupted", file=sys.stderr)
        return 130
    except confirm.RunsFailed as failed:      # written: every run, with what the script raised in some
        section, code = failed.section, 1
        for label, err in failed.errors:
            traceback.print_exception(type(err), err, err.__traceback__, file=sys.stderr)
            print(f"fpsim analyze: the training script raised {type(err).__name__} under emulation: {err} "
                  f"(run: {label}; its losses before it are kept)", file=sys.stderr)
    except BaseException as err:
        traceback.print_exception(type(err), err, err.__traceback__, file=sys.stderr)
        print(f"fpsim analyze: the training script raised {type(err).__name__} under emulation: {err}",
              file=sys.stderr)
        if report_json is not None:
            print_json(report_json)
        return 1
    if not confirm.writes():                   # under torchrun: rank 0 writes and prints
        return code
    if args.json:
        print_json(section if report_json is None else {**report_json, "emulation": section})
    else:
        where = "report.json" if args.confirm else "emulation.json"
        print(f"\n{confirm.table(section)}\n\nlosses written to {args.out}/: {where}, {section['figure']}")
    return code


def _add_analyzer_options(p, with_modules: bool = False) -> None:
    p.add_argument("--out", default="fpsim-report", metavar="DIR", help="report folder (default fpsim-report)")
    p.add_argument("--steps", type=positive_int, default=None, metavar="N",
                   help="stop after N optimizer steps (the demo: train N steps, default 400)")
    p.add_argument("--every", type=positive_int, default=1, metavar="N", help="observe every N-th step (default 1)")
    p.add_argument("--shadow-every", type=nonnegative_int, default=COMMAND_LINE_EVERY, metavar="N",
                   help="replay every N-th step in each format and judge layers by the measured gradient error "
                        f"against their noise floor (default {COMMAND_LINE_EVERY}; 0: by value counts only)")
    p.add_argument("--recipes-every", type=positive_int, default=None, metavar="N",
                   help="on every N-th observed step, measure what each FP8/FP6/FP4 scaling recipe loses per layer "
                        "and tensor kind (docs/recipes.md; default: not measured)")
    p.add_argument("--formats", default="fp16,bf16,e4m3,e5m2", help="formats to judge, comma-separated")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads for the demo (default 1)")
    add_output_options(p)
    if with_modules:
        p.add_argument("--modules", default=None, choices=["params", "leaves", "all"],
                       help="which modules to record (default params: modules holding parameters)")
        p.add_argument("--emulate", default=None, metavar="RECIPE",
                       help="run the script under an emulated recipe (fp16, bf16, fp8, mxfp8, ...: docs/emulate.md) "
                            "instead of observing it; writes emulation.json and a loss figure")
        p.add_argument("--confirm", action="store_true",
                       help="after observing, run the script in FP32, under the recipe (--emulate, default fp16) "
                            "unprotected and as the report recommends: the loss curves go into report.json")


def add_compare_parser(sub) -> None:
    """The subcommand `fpsim compare A B`."""
    p = sub.add_parser("compare", help="what changed between two analyzer runs: verdicts, loss scales, underflow "
                                       "shares (exit 1 when a verdict or loss scale changed)",
                       description="Compare two saved analyzer reports (folders or report.json files). Exit "
                                   "status: 0 nothing changed, 1 a verdict, a recommended loss scale, a layer or "
                                   "a format changed, 2 a usage error (a path that is not a report).")
    p.add_argument("a", help="the first run: a report folder or its report.json")
    p.add_argument("b", help="the second run")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON on stdout")
    p.add_argument("--html", metavar="FILE", help="also write the comparison as a self-contained HTML page")
    p.add_argument("--shares", type=nonnegative_int, default=12, metavar="N",
                   help="underflow shares listed in the text (largest change first; default 12)")
    p.set_defaults(func=cmd_compare)


def add_demo_parser(sub) -> None:
    """The subcommand `fpsim demo`."""
    p = sub.add_parser("demo", help="train a small model on generated data, observe it, write a gradient-"
                                    "underflow report (fpsim-report/)")
    _add_analyzer_options(p)
    p.set_defaults(func=cmd_demo)


def add_analyze_parser(sub) -> None:
    """The subcommand `fpsim analyze SCRIPT -- ARGS`; its options, shared with demo: _add_analyzer_options."""
    p = sub.add_parser("analyze", help="observe a training script: which layers need loss scaling or FP32 "
                                       "(fpsim analyze train.py -- ARGS)", passthrough="after_dashes")
    p.add_argument("script", nargs="?", help="the training script, run as `python SCRIPT ARGS` would")
    p.add_argument("script_args", nargs=argparse.REMAINDER,
                   help="fpsim options, then -- and the script's arguments (without --, all go to the script)")
    _add_analyzer_options(p, with_modules=True)
    p.add_argument("--demo", action="store_true", help="run the demo instead of a script (as fpsim demo)")
    p.set_defaults(func=cmd_analyze)
