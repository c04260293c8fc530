"""The base of autotune's expected errors, with the exit code each ends in, and the exit codes.

An AutotuneError is a failure the user can act on (a bad file, no such run, a secret not set):
the command prints its message as click's "Error: <message>", with no traceback, and exits with
its exit_code (cli/exitcodes.py's exits()). Each domain error subclasses it and keeps its name;
a bug stays a traceback. docs/exit-codes.md is ExitCode as a table.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0  # tune/resume: a verified ceiling; sweep: every value verified; reproduce: same or better
    INPUT = 1  # bad input: unreadable file, no command to reuse, unknown run, bad --gpu, command not found
    USAGE = 2  # click's own: a bad option or argument
    FAILED = 3  # vLLM failed for a reason other than KV size (tune: see error_kind); a sweep value or
    #             reproduce's relaunch did not verify (or a preflight check refused it)
    NOT_VERIFIED = 4  # booted but not serving the asked length
    HUNG = 5  # no output for --stall-timeout seconds
    NO_CEILING = 6  # refused and no ceiling could be read or computed; or nothing fits; or --max-boots spent
    REGRESSION = 7  # reproduce: less KV, fewer tokens or a lower ceiling than recorded, beyond tolerance
    PREFLIGHT = 8  # tune: a preflight check refused the boot before it started (nothing booted)
    FRONT_DOOR = 9  # tune: the server booted but turned autotune away: an API key it wants, TLS that does not match
    UNDETERMINED = 10  # reproduce --outdated: which vLLM a recorded command starts now could not be told
    #                    (a wrapper script, a container): nothing was checked for it
    NO_BOOT = 11  # parse: a log holds no vLLM boot (empty, or no line autotune reads: a version, arguments,
    #               a KV figure, a failure)
    INTERRUPTED = 130  # SIGINT; SIGHUP 129, SIGQUIT 131, SIGTERM 143: always 128 + the signal number


class AutotuneError(Exception):
    """An expected failure, said to the user as its message; the command exits with exit_code."""

    exit_code: int = ExitCode.INPUT

    def __init__(self, message: str = "", exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code
