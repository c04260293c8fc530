"""`python -m autotune.server.logkeeper LOG`: the kept server's output, scrubbed, into its log file.

A server `--keep-serving` hands over outlives autotune. Its output cannot go to autotune (a pipe
whose reader exits breaks the writer), and not straight to a file either (vLLM prints its
non-default args, an API key among them, and the log on disk never holds a secret). This small
process, in its own session, reads the server's output from its stdin until the server ends,
and appends each line, scrubbed as autotune scrubs the boots' logs (store/redact.py), to LOG.
The secrets of the command arrive in the environment variable below, never on a command line.
"""

from __future__ import annotations

import json
import os
import sys

from autotune.store import redact

SECRETS_ENV = "AUTOTUNE_LOGKEEPER_SECRETS"  # JSON {value: name}, the command's secrets


def keep(source, log_path: str) -> None:
    for value, name in json.loads(os.environ.pop(SECRETS_ENV, "{}") or "{}").items():
        redact.remember_secret(value, name)
    with open(log_path, "ab") as log:
        for line in iter(source.readline, b""):
            log.write(redact.scrub_log_line(line))
            log.flush()


if __name__ == "__main__":
    keep(sys.stdin.buffer, sys.argv[1])
