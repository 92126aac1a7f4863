"""A training script run in this process as `python script ARGS` would run it (fpsim analyze, its --emulate)."""

from __future__ import annotations

import contextlib
import os
import sys


@contextlib.contextmanager
def as_main(script: str, args):
    """sys.argv, sys.path[0] and the working directory as `python script ARGS` has them, put back after (the
    script's __file__ is absolute when run_path is given the absolute path, as python makes it; a script that
    changes directory leaves fpsim, and the next run of --confirm, where they started)."""
    saved_argv, saved_path, saved_cwd = sys.argv, list(sys.path), os.getcwd()
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        yield
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path
        with contextlib.suppress(OSError):
            os.chdir(saved_cwd)
