"""The exit codes of every command (the ExitCode enum, autotune/errors.py), and the one place
exceptions become exit codes.

docs/exit-codes.md is the enum as a table (tests/cli/test_exitcodes.py checks it).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import contextmanager

import click

from autotune.errors import AutotuneError, ExitCode
from autotune.host.signals import Interrupted
from autotune.run.errors import PreflightFailed
from autotune.store.outcomes import Verdict
from autotune.store.record import Result, RunRecord

# A run's verdict (result.verdict in run.json) -> the exit code of tune and resume.
VERDICT_EXIT = {
    Verdict.VERIFIED: ExitCode.OK,
    Verdict.ERROR: ExitCode.FAILED,
    Verdict.NOT_VERIFIED: ExitCode.NOT_VERIFIED,
    Verdict.HUNG: ExitCode.HUNG,
    Verdict.REFUSED_NO_CEILING: ExitCode.NO_CEILING,
    Verdict.NOTHING_FITS: ExitCode.NO_CEILING,
    Verdict.MAX_BOOTS: ExitCode.NO_CEILING,
    Verdict.FRONT_DOOR: ExitCode.FRONT_DOOR,
}

PREFLIGHT_REFUSED = "Not booting: a preflight check says this cannot work (--force boots anyway)."


def interrupted_code(signum: int) -> int:
    return 128 + signum


def exit_code_of(record: RunRecord) -> int:
    """The exit code of tune and resume for a finished run record."""
    result = record.result if isinstance(record.result, Result) else Result()
    if result.error_kind == "command_not_found":
        return ExitCode.INPUT
    return VERDICT_EXIT.get(result.verdict, ExitCode.FAILED)


@contextmanager
def exits(interrupted: str | Callable[[], str], preflight_head: str = PREFLIGHT_REFUSED,
          preflight_code: int = ExitCode.PREFLIGHT):
    """The one handler of a command's exceptions. Inside it:

    Interrupted     -> "interrupted (SIGINT); <interrupted>[; <its advice>]" on stderr, exit 128 + signal
    PreflightFailed -> preflight_head and each problem on stderr, exit preflight_code
    AutotuneError   -> click's "Error: <message>", exit its exit_code (1: bad input)

    `interrupted` says what became of the work (a callable is asked only when it happens).
    """
    try:
        yield
    except Interrupted as exc:
        note = interrupted() if callable(interrupted) else interrupted
        try:  # after SIGHUP the terminal may be gone (EIO); the run record says the same
            click.echo(f"interrupted ({exc}); {note}" + (f"; {exc.advice}" if exc.advice else ""), err=True)
        except OSError:
            pass
        sys.exit(interrupted_code(exc.signum))
    except PreflightFailed as exc:
        click.echo(preflight_head, err=True)
        for problem in exc.problems:
            click.echo(problem.render(), err=True)
        sys.exit(preflight_code)
    except AutotuneError as exc:
        raise as_click_error(exc) from None


def as_click_error(exc: AutotuneError) -> click.ClickException:
    """click's "Error: <message>" on stderr, exiting with the error's own code."""
    error = click.ClickException(str(exc))
    error.exit_code = exc.exit_code
    return error
