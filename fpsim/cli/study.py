"""`fpsim study`: run the reproducible studies that regenerate figures and pages in docs/."""

from __future__ import annotations

import sys

from .._script import check_out
from .common import add_output_options, print_json


def cmd_study(args) -> int:
    """Run reproducible studies: regenerate their figures and Markdown pages."""
    from .. import studies

    names = list(studies.STUDIES) if args.names == ["all"] else args.names
    for name in names:                # (also with --list: a name it ignored was a typo said nowhere)
        if name not in studies.STUDIES:
            allowed = f"{', '.join(studies.STUDIES)}, or all alone"
            raise ValueError(f"unknown study {name!r}" + ("" if name != "all" else " beside other names")
                             + f"; allowed: {allowed}")
    if args.out is not None:
        check_out(args.out)
    if args.list or not args.names:
        if args.json:
            print_json([{"name": name, "title": title} for name, title in studies.available()])
            return 0
        for name, title in studies.available():
            print(f"{name:22} {title}")
        if not args.list:
            print("\nrun one with: fpsim study NAME [--fast] [--out DIR]  (or: fpsim study all)")
        return 0
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
        print_json(done)
    return 0


def add_study_parser(sub) -> None:
    """The subcommand `fpsim study [NAME ...]`."""
    p = sub.add_parser("study", help="run reproducible studies: regenerate their figures and pages in docs/")
    p.add_argument("names", nargs="*", metavar="NAME", help="study name(s), or all (fpsim study --list)")
    p.add_argument("--fast", action="store_true", help="quick version: fewer points and smaller sizes")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="folder for figures/studies/*.png and studies/NAME.md (default: docs/ in a source "
                        "checkout, else ./fpsim-studies/)")
    p.add_argument("--list", action="store_true", help="list the studies and exit")
    add_output_options(p)
    p.set_defaults(func=cmd_study)
