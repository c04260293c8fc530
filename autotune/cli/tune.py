"""`autotune tune` (the default command): boot, fall back to vLLM's ceiling, verify, record."""

from __future__ import annotations

import json
import sys

import click

from autotune.cli.exitcodes import exit_code_of, exits
from autotune.cli.options import (LengthType, MemoryType, ProgressPrinter, boot_options, echo_err, runs_dir_option,
                                  serve_argv)
from autotune.cli.card import echo_card
from autotune.store import artifact
from autotune.store import latest
from autotune.store.record import RunRecord

INTERRUPTED_RUN = "the server was stopped and the run marked interrupted"


@click.command(context_settings={"allow_interspersed_args": False})  # unknown options: a usage error (cli/strict.py)
@click.option("--target", "-t", type=LengthType(allow_max=True), required=True,
              help="The context length you want (65536, 64K = 65536, 64k = 64000), or `max` for the "
                   "model's own maximum.")
@boot_options("Give up after this many boots.")
@click.option("--keep-serving", is_flag=True,
              help="Leave the verified command running (as command.sh says: the numeric length, your own host; "
                   "its output in the run's kept.log).")
@click.option("--strategy", type=click.Choice(["auto", "refusal"]), default="auto", show_default=True,
              help="auto: the fewest boots the installed vLLM allows (--max-model-len auto on vLLM >= 0.14, "
                   "capped at the target); refusal: boot at the target and relaunch at the ceiling vLLM "
                   "reports when it refuses (works on every version); where this machine's verified runs "
                   "of the same command predict the ceiling, the first boot is that prediction instead.")
@click.option("--reach", is_flag=True,
              help="When the ceiling is short of the target, try the levers in this order, each within your "
                   "limits: --max-num-seqs 1, --max-num-batched-tokens 512 with chunked prefill, "
                   "--gpu-memory-utilization up to --max-gmu, and --kv-cache-dtype fp8 (only with "
                   "--allow-kv-quant). Predictable gains are computed, the rest measured, then the "
                   "combination predicted to reach the target is booted.")
@click.option("--probe", type=click.Choice(["quick", "full", "none"]), default="quick", show_default=True,
              help="After the ceiling boots, prove it with real requests: quick = one prompt filling the "
                   "context to within a small margin (sized with the server's /tokenize), timed, with memory "
                   "read before and after; full = also a second near-ceiling request and a short one sent "
                   "during its prefill (head-of-line wait); none = skip.")
@click.option("--back-off", is_flag=True, help="When the probe fails, retry 10% lower instead of stopping.")
@click.option("--max-gmu", type=click.FloatRange(0, 1, min_open=True), default=0.95, show_default=True,
              help="With --reach: the highest --gpu-memory-utilization to use (0.99+ is a gamble on a desktop).")
@click.option("--allow-kv-quant", is_flag=True, help="With --reach: allow --kv-cache-dtype fp8 where the GPU supports it.")
@click.option("--margin", type=MemoryType(), metavar="SIZE",
              help="Keep this much device memory unused (1GiB, 512MiB; a bare number is GiB): autotune boots with the "
                   "--gpu-memory-utilization that leaves it free (of the GPU's total, or on the CPU backend "
                   "of the NUMA node's RAM), replacing the command's own, and records both.")
@click.option("--json", "json_", is_flag=True, help="Print the run record (run.json) instead of the summary.")
@click.option("--quiet", "-q", is_flag=True, help="No progress; only the summary and errors.")
@click.option("--verbose", "--show-log", "show_log", is_flag=True,
              help="Also stream vLLM's own log lines (always kept in the run folder as attempt-N.log).")
@runs_dir_option
@click.argument("serve_command", nargs=-1, type=click.UNPROCESSED)
def tune(target, gpu, force, allow_risky_gmu, keep_serving, stall_timeout, max_boots, strategy, reach, probe,
         back_off, max_gmu, allow_kv_quant, margin, json_, quiet, show_log, runs_dir, serve_command):
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
    (an API key it wants, TLS that does not match); 130/143 interrupted by SIGINT/SIGTERM.
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
    opts = tune_mod.TuneOptions(target=0 if target_max else target, target_max=target_max, gpu=gpu, force=force,
                                allow_risky_gmu=allow_risky_gmu, serve_argv=argv, runs_dir=runs_dir, keep_serving=keep_serving,
                                stall_timeout_s=stall_timeout, max_boots=max_boots, reused_from=reused_from,
                                strategy=strategy, reach=reach, max_gmu=max_gmu, allow_kv_quant=allow_kv_quant,
                                probe=probe, back_off=back_off,
                                margin_bytes=None if margin is None else int(margin * 2**30))
    progress = ProgressPrinter(quiet=quiet, show_log=show_log)
    with exits(INTERRUPTED_RUN):
        try:
            record = RunRecord.from_json(tune_mod.tune(opts, progress))  # tune's JSON form, nobody else's
        finally:
            progress.close()  # clears the live status line whatever happened
    if json_:
        click.echo(json.dumps(artifact.stamped(record), indent=2))  # as run.json holds it
    else:
        echo_card(record, run_dir=runs_dir / record.run_id)
    sys.exit(exit_code_of(record))


COMMANDS = [tune]
