"""`autotune sweep`: one tune per --gpu-memory-utilization value, then the compare table.

run_sweep (run or resume one, print, exit) is shared with `autotune resume`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from autotune.cli.compare import echo_report
from autotune.cli.exitcodes import ExitCode, exits
from autotune.cli.options import (
    LengthType,
    ProgressPrinter,
    boot_options,
    request_option,
    sayer,
    serve_argv,
    warn,
    written_runs_dir_option,
)
from autotune.run import sweep as sweep_mod
from autotune.store import artifact, sweeps
from autotune.store.outcomes import Verdict
from autotune.store.record import SweepRecord
from autotune.vllm import servecmd


class GmuListType(click.ParamType):
    name = "GMU,GMU,..."

    def convert(self, value, param, ctx):
        if isinstance(value, list):
            return value
        values = []
        for part in str(value).split(","):
            part = part.strip()
            try:
                number = float(part)
            except ValueError:
                self.fail(f"{part!r} is not a number; give fractions such as 0.90,0.94,0.98", param, ctx)
            if not 0 < number <= 1:
                self.fail(f"{number:g} is not a fraction in (0, 1]", param, ctx)
            if number in values:
                self.fail(f"{number:g} is given twice", param, ctx)
            values.append(number)
        return values


@click.command("sweep", context_settings={"allow_interspersed_args": False})  # unknown options: a usage error
@click.option("--gmu", "gmu_values", type=GmuListType(), required=True,
              help="The --gpu-memory-utilization values, comma-separated (0.90,0.94,0.98).")
@click.option("--target", "-t", type=LengthType(), required=True,
              help="The context length to try at each value (65536, 64K = 65536, 64k = 64000).")
@request_option("strategy",
              help="auto: vLLM's --max-model-len auto where the installed vLLM serves its fit (one boot per "
                   "value), else the refusal path. refusal: boot each value's prediction from the values "
                   "before it (or the target), relaunch at vLLM's ceiling when refused.")
@request_option("probe", default="none",  # a sweep's own default
              help="After each value's ceiling boots, prove it with real requests (see `autotune tune --help`); "
                   "none by default: a near-ceiling prefill of 100K+ tokens on a CPU takes minutes.")
@boot_options("Give up on one value after this many boots.")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the PNG here (default: sweep.png in the sweep folder, when matplotlib is installed).")
@click.option("--json", "json_", is_flag=True, help="Print the sweep record and the comparison as JSON.")
@click.option("--quiet", "-q", is_flag=True, help="No progress lines; only the result and errors.")
@written_runs_dir_option
@click.argument("serve_command", nargs=-1, type=click.UNPROCESSED)
def sweep_cmd(gmu_values, target, strategy, probe, gpu, force, allow_risky_gmu, stall_timeout_s, max_boots, plot,
              json_, quiet, runs_dir, serve_command):
    """Tune SERVE_COMMAND at several --gpu-memory-utilization values and fit the line.

    \b
    One tune per value (its --gpu-memory-utilization replaced), one run folder each, and
    runs/<UTC time>-sweep-<model>/sweep.json linking them, then the `compare` table with
    the fit and the verdicts. Made for overnight use: a value that fails does not stop
    the others.

    \b
    Boots: where the installed vLLM serves its own fit (--max-model-len auto, 0.20+),
    --strategy auto (the default) takes one boot per value where the pool does not move
    with the length; where it does (vLLM's CPU backend sized by gmu, chunked prefill off,
    n-gram decoding), each value boots on from vLLM's fit to the longest length that boots
    (3 boots a value on the CPU backend here). On the refusal path the first
    value costs 2 boots (the target is refused, vLLM's ceiling verifies) and more where the
    pool moves; then each value's
    ceiling is predicted (from the device memory x gmu budget after one value, from the
    least-squares fit after two) and booted first: the boot's own KV pool less the slack
    vLLM showed for the first value says where the ceiling is, and at it the value took
    one boot; below it, the next boot is there; above it, vLLM refuses and its estimate
    takes over (two boots, as without a prediction). A prediction only chooses where to
    start: every value's ceiling is vLLM's own, to the token, and no value is skipped for
    what a prediction says. The output says which boots were saved.

    \b
    Example:
      autotune sweep --gmu 0.90,0.94,0.98 --target 128K -- vllm serve MODEL --max-num-seqs 1

    \b
    Exit codes: 0 every value verified; 3 one or more did not, or a preflight check refused
    one (the table says which); 1 bad input; 2 usage error; 130/143 interrupted (the sweep record says how
    far it got; `autotune resume SWEEP` continues it without repeating finished values).
    """
    argv = serve_argv(serve_command)
    if not argv:
        raise click.ClickException("no serve command: give it after `--`, e.g.\n"
                                   "  autotune sweep --gmu 0.90,0.94 --target 64K -- vllm serve MODEL")
    if servecmd.has_flag(argv, "--kv-cache-memory-bytes"):
        raise click.ClickException("the serve command fixes the KV pool with --kv-cache-memory-bytes, so "
                                   "--gpu-memory-utilization does not change it: remove that flag to sweep gmu")
    if os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        click.echo("Warning: VLLM_CPU_KVCACHE_SPACE is set: on vLLM's CPU backend it fixes the KV pool and "
                   "gmu will not change it", err=True)
    opts = sweep_mod.SweepOptions(gmu_values=gmu_values, target=target, strategy=strategy, probe=probe, gpu=gpu,
                                  force=force,
                                  allow_risky_gmu=allow_risky_gmu, stall_timeout_s=stall_timeout_s,
                                  max_boots=max_boots, plot=str(plot) if plot else None)
    try:
        sweep_dir, sweep = sweep_mod.create(runs_dir, argv, opts)
    except (OSError, artifact.ArtifactError) as exc:
        raise click.ClickException(f"cannot create the sweep folder under {runs_dir}: {exc}") from None
    say = sayer(quiet)
    unset = f" (with {sweep_mod.options_of(sweep).unset_gmu:g} as vLLM's own default: the flag left unset)" \
        if sweep_mod.options_of(sweep).unset_gmu is not None else ""
    say(f"sweep {sweep_dir}: gmu {', '.join(f'{g:g}' for g in sweep.gmu_values)}{unset}; target {target:,}; "
        f"strategy {sweep.strategy}: {sweep.strategy_reason}")
    run_sweep(lambda progress: sweep_mod.run(sweep_dir, sweep, runs_dir, progress, say, warn),
              sweep_dir, json_, quiet)


def run_sweep(go, sweep_dir: Path, json_: bool, quiet: bool) -> None:
    """Run (or resume) a sweep with go(progress), print its result, exit with its code."""
    def what_was_kept() -> str:
        finished = len(sweeps.load(sweep_dir).points or [])
        return (f"the server was stopped; {sweep_dir / sweeps.SWEEP_FILE} keeps the {finished} finished "
                f"value(s); `autotune resume {sweep_dir.name}` continues")

    progress = ProgressPrinter(quiet=quiet)
    with exits(what_was_kept):  # a bad --gpu selector, an unwritable runs dir: exit 1
        try:
            sweep, records, report = go(progress)
        finally:
            progress.close()
    if json_:
        click.echo(json.dumps({"sweep": sweep.to_dict(), "compare": report.to_dict()}, indent=2, ensure_ascii=False))
    else:
        click.echo(render_sweep(sweep, sweep_dir))
        if report.runs:
            click.echo("")
            echo_report(report)
    all_verified = all(p.verdict == Verdict.VERIFIED for p in sweep.points or [])
    sys.exit(ExitCode.OK if all_verified else ExitCode.FAILED)


def render_sweep(sweep: SweepRecord, sweep_dir: Path) -> str:
    lines = [f"Sweep {sweep.sweep_id}: gmu {', '.join(f'{g:g}' for g in sweep.gmu_values)}; "
             f"target {sweep.target:,}; strategy {sweep.strategy}"]
    for p in sweep.points or []:
        result = f"ceiling {p.ceiling:,}" if p.ceiling else f"{p.verdict}"
        run = f" ({p.run_id})" if p.run_id else ""
        lines.append(f"  gmu {p.gmu:g}: {result} in {p.boots} boot{'s' if p.boots != 1 else ''}{run}: {p.note}")
    cut_short = f" ({sweep.boots_interrupted} cut short by an interruption)" if sweep.boots_interrupted else ""
    values = len(sweep.gmu_values)  # the most a sweep takes: 2 boots a value (2K), not what it would have taken
    lines.append(f"  boots: {sweep.boots_used} used{cut_short}; {sweep.boots_without_predictions} without "
                 f"predictions (at most {sweep.boots_2k}: 2 for each of {values} value{'s' * (values != 1)}); "
                 f"saved {sweep.boots_saved}")
    if sweep.plot:
        lines.append(f"  plot: {sweep.plot}")
    lines.append(f"  record: {sweep_dir / sweeps.SWEEP_FILE}")
    return "\n".join(lines)


COMMANDS = [sweep_cmd]
