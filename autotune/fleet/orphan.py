"""`python -m autotune.fleet.orphan PARENT_PID -- ARGV...`: become ARGV, and get SIGTERM when the parent dies.

A leaf's `autotune tune` runs in its own session (so that a Ctrl-C meant for the fleet reaches it
only through the fleet, which stops it in order). Its parent is the fleet driver (--on local) or a
Ray worker (--on ray). When that parent is killed (Ray kills workers on OOM, ray#54364; a SIGKILLed
driver), nothing would stop the leaf and its vLLM tree: Linux's PR_SET_PDEATHSIG sends the leaf
SIGTERM instead, which autotune handles as always (stop the server tree, mark the run interrupted).
The setting survives exec, so this small step comes before the real program.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main(args: list[str]) -> None:
    if len(args) < 3 or args[1] != "--":
        sys.exit("usage: python -m autotune.fleet.orphan PARENT_PID -- PROGRAM [ARGS...]")
    parent, argv = int(args[0]), args[2:]
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass  # not Linux: the fleet's own reaping (fleet/leaf.py reap) is what is left
    if os.getppid() != parent:  # the parent died before the setting took: nothing to run for
        sys.exit(128 + signal.SIGTERM)
    # Ray starts its processes with SIGINT blocked, and a blocked mask survives fork and exec: the
    # tune must see the SIGINT that stops it.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    os.execv(argv[0], argv)


if __name__ == "__main__":
    main(sys.argv[1:])
