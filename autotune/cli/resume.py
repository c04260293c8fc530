"""`autotune resume`: continue an interrupted tune, lever search or sweep."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from autotune.cli.card import echo_card
from autotune.cli.exitcodes import as_click_error, exit_code_of, exits
from autotune.cli.options import ProgressPrinter, echo_err, sayer, warn, written_runs_dir_option
from autotune.cli.sweep import run_sweep
from autotune.cli.tune import INTERRUPTED_RUN
from autotune.errors import AutotuneError
from autotune.store import artifact, latest, sweeps


@click.command()
@click.argument("run", default="latest")
@written_runs_dir_option
@click.option("--json", "json_", is_flag=True, help="Print the run (or sweep) record instead of the summary.")
@click.option("--quiet", "-q", is_flag=True, help="No progress lines; only the summary and errors.")
def resume(run, runs_dir, json_, quiet):
    """Continue an interrupted tune, lever search or sweep.

    \b
    RUN is a run folder, a run id, a sweep folder or id, or `latest` (the default:
    the newest interrupted tune, lever search or sweep, past newer runs that finished;
    a fleet's leaves are left to `autotune fleet resume`). What was finished is kept and not repeated:
      tune          finished boots are kept; the next boot is the one the strategy
                    would have chosen after them;
      lever search  (--reach) the run's own boots are done; lever runs that finished
                    are taken as they are, an interrupted one is resumed;
      sweep         finished values are kept, the interrupted value's run is resumed,
                    the values not reached yet run.
    A run that belongs to an interrupted sweep or lever search continues that sweep
    or search. A server left behind by a killed autotune
    is stopped first, and a run or sweep it left `running` becomes `interrupted`.

    \b
    Exit codes as for tune (or sweep); 1 when RUN is not interrupted (or nothing is).
    """
    from autotune.run import sweep as sweep_mod
    from autotune.run import tune as tune_mod

    cleaning = ProgressPrinter(quiet=quiet)
    try:
        tune_mod.clean_leftovers(runs_dir, cleaning)  # first, so that a SIGKILLed run reads `interrupted`
        kind, path, why = what_to_resume(run, runs_dir)
    except AutotuneError as exc:
        raise as_click_error(exc) from None
    finally:
        cleaning.close()
    if why:
        echo_err(why, quiet=quiet)
    if kind == "sweep":
        run_sweep(lambda progress: sweep_mod.resume(path, runs_dir, progress, sayer(quiet), warn),
                  path, json_, quiet)
        return
    with exits(INTERRUPTED_RUN):
        progress = ProgressPrinter(quiet=quiet)
        try:
            record = tune_mod.resume(path, progress)
        finally:
            progress.close()
    if json_:
        click.echo(json.dumps(artifact.stamped(record), indent=2))  # as run.json holds it
    else:
        # A run whose command names no model was renamed for the model vLLM serves when it finished.
        echo_card(record, run_dir=Path(path).parent / record.run_id)
    sys.exit(exit_code_of(record))


def what_to_resume(ref: str, runs_dir: Path) -> tuple[str, Path, str | None]:
    """("sweep" | "run", folder, why it is not the folder named) for a RUN argument of resume
    (`latest`: store/latest.py)."""
    if ref == latest.LATEST:
        return latest.resumable(runs_dir)
    for path in (Path(ref), Path(runs_dir) / ref):
        if (path / sweeps.SWEEP_FILE).is_file():
            return "sweep", path, None
    run_dir = artifact.resolve_run(ref, runs_dir)
    record = artifact.load(run_dir)
    if record.state != "finished":
        # A member of a sweep or lever search continues the whole of it, when that was interrupted.
        found = latest.member_of(run_dir, record)
        if found is not None:
            return found
    return "run", run_dir, None


COMMANDS = [resume]
