"""The signal gate: SIGINT and SIGTERM become Interrupted, except where a step must not be cut.

tune holds `interruptible()` around a run (a sweep around all its tunes, so that a signal
between two of them is caught as well); the loop wraps "start a server and record it" and
"stop after an interrupt" in `GATE.deferred()`.
"""

from __future__ import annotations

import signal
from contextlib import contextmanager


class Interrupted(Exception):
    """autotune got SIGINT or SIGTERM; the run is marked interrupted."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class SignalGate:
    """Turns SIGINT/SIGTERM into Interrupted, except inside a `deferred()` section.

    Some steps must not be cut in half: between starting a server and recording it, an
    Interrupted would orphan the server; while stopping after an interrupt, a second Ctrl-C
    must not abandon the stop half-way. Inside such a section the signal is remembered and
    raised at its end (or dropped, for the cleanup after an interrupt).
    """

    def __init__(self) -> None:
        self.depth = 0
        self.pending: int | None = None

    def handler(self, signum, frame) -> None:
        if self.depth:
            self.pending = signum
            return
        raise Interrupted(signum)

    @contextmanager
    def deferred(self, drop: bool = False):
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if self.depth == 0 and self.pending is not None:
                signum, self.pending = self.pending, None
                if not drop:
                    raise Interrupted(signum)


GATE = SignalGate()


@contextmanager
def interruptible():
    """Inside: SIGINT and SIGTERM raise Interrupted (see SignalGate)."""
    previous = _install_handlers()
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _install_handlers() -> dict:
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[sig] = signal.signal(sig, GATE.handler)
        except ValueError:  # not the main thread
            pass
    return previous
