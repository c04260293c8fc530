"""The exit codes of every command, and the one place exceptions become exit codes.

docs/exit-codes.md is this enum as a table (tests/test_exitcodes.py checks it).
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from enum import IntEnum
from typing import Callable, Mapping

import click

from autotune.host.gpus import GpuSelectorError
from autotune.run.errors import PreflightFailed
from autotune.run.signals import Interrupted
from autotune.run.client import FrontDoorError
from autotune.run.margin import MarginError
from autotune.store.artifact import ArtifactError
from autotune.store.record import RunRecord
from autotune.store.redact import MissingSecret


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
    INTERRUPTED = 130  # SIGINT; SIGTERM gives 143: always 128 + the signal number


# A run's verdict (result.verdict in run.json) -> the exit code of tune and resume.
VERDICT_EXIT = {
    "verified": ExitCode.OK,
    "error": ExitCode.FAILED,
    "not_verified": ExitCode.NOT_VERIFIED,
    "hung": ExitCode.HUNG,
    "refused_no_ceiling": ExitCode.NO_CEILING,
    "nothing_fits": ExitCode.NO_CEILING,
    "max_boots": ExitCode.NO_CEILING,
    "front_door": ExitCode.FRONT_DOOR,
}

# Exceptions that mean bad input: the message is printed as "Error: ..." and the exit code is 1.
INPUT_ERRORS = (ArtifactError, GpuSelectorError, FrontDoorError, MissingSecret, MarginError)

PREFLIGHT_REFUSED = "Not booting: a preflight check says this cannot work (--force boots anyway)."


def interrupted_code(signum: int) -> int:
    return 128 + signum


def exit_code_of(record: RunRecord | Mapping) -> int:
    """The exit code of tune and resume for a finished run record."""
    result = (record if isinstance(record, RunRecord) else RunRecord.from_dict(record)).result
    if result.get("error_kind") == "command_not_found":
        return ExitCode.INPUT
    return VERDICT_EXIT.get(result.verdict, ExitCode.FAILED)


@contextmanager
def exits(interrupted: str | Callable[[], str], preflight_head: str = PREFLIGHT_REFUSED,
          preflight_code: int = ExitCode.PREFLIGHT):
    """The one handler of a command's exceptions. Inside it:

    Interrupted     -> "interrupted (SIGINT); <interrupted>" on stderr, exit 128 + signal
    PreflightFailed -> preflight_head and each problem on stderr, exit preflight_code
    INPUT_ERRORS    -> click's "Error: <message>", exit 1

    `interrupted` says what became of the work (a callable is asked only when it happens).
    """
    try:
        yield
    except Interrupted as exc:
        note = interrupted() if callable(interrupted) else interrupted
        click.echo(f"interrupted ({exc}); {note}", err=True)
        sys.exit(interrupted_code(exc.signum))
    except PreflightFailed as exc:
        click.echo(preflight_head, err=True)
        for problem in exc.problems:
            click.echo(problem.render(), err=True)
        sys.exit(preflight_code)
    except INPUT_ERRORS as exc:
        raise click.ClickException(str(exc))
