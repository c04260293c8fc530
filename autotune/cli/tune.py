"""`autotune tune` (the default command): boot, fall back to vLLM's ceiling, verify, record."""

from __future__ import annotations

import json
import sys

import click

from autotune.cli.card import echo_card
from autotune.cli.exitcodes import exit_code_of, exits
from autotune.cli.options import (
    LengthType,
    ProgressPrinter,
    boot_options,
    echo_err,
    request_option,
    serve_argv,
    written_runs_dir_option,
)
from autotune.store import artifact, latest

INTERRUPTED_RUN = "the server was stopped and the run marked interrupted"


@click.command(context_settings={"allow_interspersed_args": False})  # unknown options: a usage error (cli/strict.py)
@click.option("--target", "-t", type=LengthType(allow_max=True), required=True,
              help="The context length you want (65536, 64K = 65536, 64k = 64000), or `max` for the "
                   "model's own maximum.")
@boot_options()
@request_option("keep_serving")
@request_option("strategy")
@request_option("reach")
@request_option("probe")
@request_option("back_off")
@request_option("max_gmu")
@request_option("allow_kv_quant")
@request_option("margin_bytes", "margin_gib")
@click.option("--json", "json_", is_flag=True, help="Print the run record (run.json) instead of the summary.")
@click.option("--quiet", "-q", is_flag=True, help="No progress; only the summary and errors.")
@click.option("--verbose", "--show-log", "show_log", is_flag=True,
              help="Also stream vLLM's own log lines (always kept in the run folder as attempt-N.log); with "
                   "--quiet, only them and the summary.")
@written_runs_dir_option
@click.argument("serve_command", nargs=-1, type=click.UNPROCESSED)
def tune(target, margin_gib, json_, quiet, show_log, runs_dir, serve_command, **asked):
    """Boot SERVE_COMMAND at --target, fall back to vLLM's ceiling, verify, record.

    \b
    SERVE_COMMAND is your own command after `--`, for example
      -- vllm serve MODEL --gpu-memory-utilization 0.95 --max-num-seqs 1
      -- python -m vllm.entrypoints.openai.api_server --model MODEL
    autotune sets --max-model-len itself (replacing yours) and picks a free local port
    unless the command names one with --port. Without SERVE_COMMAND, the command of the
    newest tune in --runs-dir is reused (handy for cron; not a lever run's, a sweep
    value's or a verification's).

    \b
    Exit codes: 0 verified ceiling found; 1 bad input; 2 usage error;
    3 vLLM failed for another reason (see error_kind); 4 booted but not verified;
    5 hung; 6 refused and no ceiling could be read, nothing fits, or --max-boots spent;
    8 refused by a preflight check (nothing booted); 9 the server turned autotune away
    (an API key it wants, TLS that does not match); 130/143/129 interrupted by SIGINT/SIGTERM/SIGHUP
    (a closed terminal too: the server is stopped, the run marked interrupted; `autotune resume`).
    """
    from autotune.run import tune as tune_mod

    argv = serve_argv(serve_command)
    reused_from = None
    if not argv:
        found = latest.command(runs_dir)
        if found is None:
            raise click.ClickException(
                f"no serve command given and no earlier run in {runs_dir} to reuse one from.\n"
                "Give it after `--`: autotune --target 64K -- vllm serve MODEL ...")
        argv, reused_from = found
        echo_err(f"reusing the serve command of run {reused_from}", quiet=quiet)
    target_max = target == "max"
    # asked: the options named as TuneOptions names them (run/options.py), as the user gave them
    opts = tune_mod.TuneOptions(target=0 if target_max else target, target_max=target_max, serve_argv=argv,
                                runs_dir=runs_dir, reused_from=reused_from,
                                margin_bytes=None if margin_gib is None else int(margin_gib * 2**30), **asked)
    progress = ProgressPrinter(quiet=quiet, show_log=show_log)
    with exits(INTERRUPTED_RUN):
        try:
            record = tune_mod.tune(opts, progress)
        finally:
            progress.close()  # clears the live status line whatever happened
    if json_:
        click.echo(json.dumps(artifact.stamped(record), indent=2))  # as run.json holds it
    else:
        echo_card(record, run_dir=runs_dir / record.run_id)
    sys.exit(exit_code_of(record))


COMMANDS = [tune]
