"""`autotune stop RUN`: stop the server a `tune --keep-serving` handed over to the user."""

from __future__ import annotations

import json

import click

from autotune.cli.exitcodes import ExitCode
from autotune.cli.options import echo_err, runs_dir_option
from autotune.store import artifact, latest


@click.command("stop")
@click.argument("run", default="latest")
@runs_dir_option
@click.option("--json", "json_", is_flag=True, help="Print what was stopped as JSON.")
def stop(run, runs_dir, json_):
    """Stop the server a `tune --keep-serving` left running (RUN: a run folder, a run id, or `latest`).

    \b
    A server kept by --keep-serving belongs to you: `autotune clean` and later tunes
    list it and leave it running. `stop` ends it on request: its whole process tree,
    SIGINT first (vLLM's own shutdown), SIGTERM and SIGKILL only if it does not end,
    and only when the pid still belongs to that server (same start time), never by
    name. run.json then records when it was stopped.

    \b
    Exit codes: 0 stopped; 1 no such run, or the run has no server kept serving
    (never kept, already stopped, or it ended on its own).
    """
    import sys

    from autotune.server import kept

    try:
        run_dir = latest.resolve(run, runs_dir)
        done = kept.stop(run_dir, on_step=lambda step: echo_err(
            f"  {step['signal']} to pids {', '.join(map(str, step['pids']))}"))
    except (artifact.ArtifactError, kept.NotKept) as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(ExitCode.INPUT)
    if json_:
        click.echo(json.dumps({"run_id": run_dir.name, **done}, indent=2))
        return
    left = f"; still running: {done['leftover_pids']}" if done["leftover_pids"] else ""
    click.echo(f"{run_dir.name}: stopped the server kept at {done['url']} (pid {done['pid']}){left}")


COMMANDS = [stop]
