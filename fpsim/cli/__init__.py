"""The `fpsim` command: the only place that parses arguments or prints for humans.

One module per group of commands (formats and cast, the tensor-core commands, study, the
analyzer's analyze, demo and compare), each with its `cmd_*` functions and `add_*_parser`;
this module assembles the parser and runs a command.
"""

from __future__ import annotations

import argparse
import os
import sys

from . import analyze, formats, study, tensorcore
from .common import Parser

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(prog="fpsim", description="Bit-exact floating-point format simulator.")
    parser.add_argument("--version", action="version",
                        version=f"fpsim {__version__} (distribution fpsim-mixed-precision)")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for add in (formats.add_formats_parser, formats.add_cast_parser, tensorcore.add_validate_parser,
                tensorcore.add_probes_parser, analyze.add_compare_parser, study.add_study_parser,
                tensorcore.add_capture_parser, analyze.add_demo_parser, analyze.add_analyze_parser):
        add(sub)
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
