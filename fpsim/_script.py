"""A training script run in this process as `python script ARGS` would run it (fpsim analyze, its --emulate),
and the folder a command writes into, checked before anything runs."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile


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


def check_out(out) -> str:
    """The report folder as an absolute path (a script that changes directory, as hydra does, still writes
    where it was checked), created and found writable now; ValueError naming the problem otherwise."""
    out = os.path.abspath(os.fspath(out))
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"--out {out!r} is an existing file, not a folder; give a folder")
    try:
        os.makedirs(out, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as err:
        raise ValueError(f"cannot write into {out!r}: {err.strerror or err}") from None
    return out
