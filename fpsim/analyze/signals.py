"""Signals around an observed run: SIGTERM ends it as Ctrl-C does, and no signal interrupts writing the report.

`terminate_as_exception()` turns SIGTERM into a `Terminated` exception in the
main thread while a script runs, so that the watch's exit writes the report
(Python's default for SIGTERM is to die on the spot). `deferred_signals()`
holds SIGINT and SIGTERM while the report is being written and delivers them
afterwards: a second Ctrl-C cannot leave half a report. Both do nothing
outside the main thread, where Python cannot set handlers.
"""

from __future__ import annotations

import contextlib
import signal
import threading

TERMINATED_EXIT_CODE = 143
"""128 + SIGTERM, as a shell reports a process ended by SIGTERM."""


class Terminated(BaseException):
    """Raised in the main thread when SIGTERM arrives during an observed run."""


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def terminate_as_exception():
    """While the block runs, SIGTERM raises Terminated (in the main thread)."""
    if not _main_thread():
        yield
        return

    def on_term(signum, frame):
        raise Terminated("SIGTERM")

    before = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


@contextlib.contextmanager
def deferred_signals():
    """Hold SIGINT and SIGTERM until the block ends, then raise KeyboardInterrupt or Terminated."""
    if not _main_thread():
        yield
        return
    arrived = []

    def hold(signum, frame):
        arrived.append(signum)

    before = {sig: signal.signal(sig, hold) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    if signal.SIGTERM in arrived:
        raise Terminated("SIGTERM")
    if signal.SIGINT in arrived:
        raise KeyboardInterrupt
