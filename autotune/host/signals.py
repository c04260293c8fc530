"""The signal gate: the stopping signals become Interrupted, except where a step must not be cut.

The stopping signals are those a user, a terminal or a login manager sends to end a program:
SIGINT (Ctrl-C), SIGTERM (kill, systemd, a login manager), SIGHUP (the terminal closed, an SSH
session dropped: overnight runs are started that way) and SIGQUIT (Ctrl-\\). Left to Python's
defaults, SIGHUP and SIGQUIT end autotune at once and leave the server tree, in a session of its
own, running under PID 1 and the run "running"; here each stops the tree and marks the run
interrupted, as SIGINT does.

tune holds `interruptible()` around a run (a sweep around all its tunes, so that a signal
between two of them is caught as well); the loop wraps "start a server and record it" and
"stop after an interrupt" in `GATE.deferred()`.
"""

from __future__ import annotations

import signal
from contextlib import contextmanager

STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


class Interrupted(Exception):
    """autotune got one of the STOPPING_SIGNALS; the run is marked interrupted. `advice`: how to go
    on (`autotune resume RUN`), set by whoever marked the run."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.advice: str | None = None


class SignalGate:
    """Turns the STOPPING_SIGNALS into Interrupted, except inside a `deferred()` section.

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
    """Inside: the STOPPING_SIGNALS raise Interrupted (see SignalGate)."""
    previous = _install_handlers()
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _install_handlers() -> dict:
    previous = {}
    for sig in STOPPING_SIGNALS:
        try:
            previous[sig] = signal.signal(sig, GATE.handler)
        except ValueError:  # not the main thread
            pass
    return previous
