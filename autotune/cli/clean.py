"""`autotune clean`: stop servers a killed autotune left running; mark its runs interrupted."""

from __future__ import annotations

import json

import click

from autotune.cli.options import echo_err, runs_dir_option


@click.command()
@runs_dir_option
@click.option("--json", "json_", is_flag=True, help="Print what was found as JSON.")
def clean(runs_dir, json_):
    """Stop servers that a killed autotune left running.

    \b
    While a server runs, its run folder holds server.json (pid, start time). If autotune
    itself is killed (SIGKILL, OOM killer, a closed terminal), that server keeps holding
    memory. `clean` finds such servers and stops their whole process tree, but only when
    the pid still belongs to that server (same start time) and the autotune that started
    it is gone; it never kills by name. Every tune start does the same first.
    A server `tune --keep-serving` handed over is yours: it is listed (kept_serving)
    and left running; `autotune stop RUN` stops it.

    \b
    It also marks runs and sweeps that a killed autotune left `running` as
    `interrupted`, so that `autotune resume` can continue them.

    \b
    Exit codes: 0 always (what was done is printed).
    """
    from autotune.server import leftovers

    found = leftovers.clean(runs_dir, on_step=lambda step: echo_err(
        f"  {step['signal']} to pids {', '.join(map(str, step['pids']))}"))
    if json_:
        click.echo(json.dumps([{"run_dir": str(c.run_dir), "pid": c.pid, "action": c.action, "detail": c.detail}
                               for c in found], indent=2))
        return
    if not found:
        click.echo(f"nothing to clean under {runs_dir}")
    for c in found:
        click.echo(f"{c.run_dir.name}: pid {c.pid}: {c.action}" + (f" ({c.detail})" if c.detail else ""))


COMMANDS = [clean]
