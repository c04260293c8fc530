"""The command line: wiring and rendering only; decisions live in the other modules.

Results go to stdout, progress and diagnostics to stderr.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from autotune import __version__
from autotune.store import artifact
from autotune.vllm import catalog
from autotune.vllm import servecmd
from autotune.vllm.logparse import SCHEMA_KEYS, parse_file
from autotune.cli.progress import Progress, fmt_number, render_summary

# Documented exit codes (docs/exit-codes.md).
EXIT_OK = 0
EXIT_INPUT = 1  # bad input: unreadable file, no command to reuse, unknown run
EXIT_USAGE = 2  # click's own: bad option or argument
EXIT_BOOT_FAILED = 3  # vLLM failed for a reason other than KV size (see error_kind)
EXIT_NOT_VERIFIED = 4  # booted but not serving the asked length
EXIT_HUNG = 5  # no output for --stall-timeout seconds
EXIT_NO_CEILING = 6  # refused, and no ceiling could be read or computed; or nothing fits
EXIT_PREFLIGHT = 8  # a preflight check refused the boot before it started (7: reproduce's regression)
EXIT_INTERRUPTED = 130  # SIGINT / SIGTERM (128 + signal number)

VERDICT_EXIT = {
    "verified": EXIT_OK,
    "error": EXIT_BOOT_FAILED,
    "not_verified": EXIT_NOT_VERIFIED,
    "hung": EXIT_HUNG,
    "refused_no_ceiling": EXIT_NO_CEILING,
    "nothing_fits": EXIT_NO_CEILING,
    "max_boots": EXIT_NO_CEILING,
}

DEFAULT_RUNS_DIR = "runs"


class AutotuneGroup(click.Group):
    """`autotune --target N -- CMD` is short for `autotune tune --target N -- CMD`."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h", "--version"):
            args = ["tune", *args]
        return super().parse_args(ctx, args)


@click.group(cls=AutotuneGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="autotune")
def cli():
    """Find the largest context a vLLM server can really serve here, prove it, keep the proof.

    \b
    Tune (the default command): wrap your own serve command after `--`:
      autotune --target 64K -- vllm serve Qwen/Qwen3-8B --gpu-memory-utilization 0.95
    autotune boots it at the target; if vLLM refuses, it relaunches at the ceiling vLLM
    reports, waits until the server answers, checks /v1/models, and writes
    runs/<run-id>/ with run.json, the logs, command.sh and vllm-config.yaml.

    \b
    Read a boot log:        autotune parse vllm.log --json
    Rerun the last command: autotune --target 64K
    """


def _runs_dir_option(f):
    return click.option("--runs-dir", type=click.Path(file_okay=False, path_type=Path),
                        default=DEFAULT_RUNS_DIR, envvar="AUTOTUNE_RUNS_DIR", show_default=True,
                        show_envvar=True, help="Where run folders are written and read.")(f)


def boot_options(max_boots_help: str):
    """The options every command that boots vLLM takes (tune, sweep): GPU pinning, preflight
    overrides, the stall watchdog and the boot budget."""
    options = [
        click.option("--gpu", "gpu", metavar="SELECTOR",
                     help="Pin vLLM to these GPUs: an index, a full or short UUID (GPU-af7b61d8), a PCI bus id, "
                          "or a comma list for tensor parallel. Exported as CUDA_DEVICE_ORDER=PCI_BUS_ID and "
                          "CUDA_VISIBLE_DEVICES=<indices> (never UUIDs, which vLLM fails on)."),
        click.option("--force", is_flag=True, help="Boot even when a preflight check says it cannot work."),
        click.option("--allow-risky-gmu", is_flag=True, help="Allow --gpu-memory-utilization above 0.99."),
        click.option("--stall-timeout", type=click.FloatRange(min=1), default=1200, show_default=True,
                     help="Seconds without a new log line before a boot counts as hung."),
        click.option("--max-boots", type=click.IntRange(min=1), default=6, show_default=True, help=max_boots_help),
    ]

    def decorate(f):
        for option in reversed(options):
            f = option(f)
        return f

    return decorate


class LengthType(click.ParamType):
    name = "LENGTH"

    def __init__(self, allow_max: bool = False):
        self.allow_max = allow_max

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        if self.allow_max and str(value).strip().lower() == "max":
            return "max"
        try:
            return servecmd.parse_length(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--target", "-t", type=LengthType(allow_max=True), required=True,
              help="The context length you want (65536, 64K = 65536, 64k = 64000), or `max` for the "
                   "model's own maximum.")
@boot_options("Give up after this many boots.")
@click.option("--keep-serving", is_flag=True, help="Leave the verified server running instead of stopping it.")
@click.option("--strategy", type=click.Choice(["auto", "refusal"]), default="auto", show_default=True,
              help="auto: the fewest boots the installed vLLM allows (--max-model-len auto on vLLM >= 0.14, "
                   "capped at the target); refusal: boot at the target and relaunch at the ceiling vLLM "
                   "reports when it refuses (works on every version).")
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
@click.option("--json", "json_", is_flag=True, help="Print the run record (run.json) instead of the summary.")
@click.option("--quiet", "-q", is_flag=True, help="No progress; only the summary and errors.")
@click.option("--verbose", "--show-log", "show_log", is_flag=True,
              help="Also stream vLLM's own log lines (always kept in the run folder as attempt-N.log).")
@_runs_dir_option
@click.argument("serve_command", nargs=-1, type=click.UNPROCESSED)
def tune(target, gpu, force, allow_risky_gmu, keep_serving, stall_timeout, max_boots, strategy, reach, probe,
         back_off, max_gmu, allow_kv_quant, json_, quiet, show_log, runs_dir, serve_command):
    """Boot SERVE_COMMAND at --target, fall back to vLLM's ceiling, verify, record.

    \b
    SERVE_COMMAND is your own command after `--`, for example
      -- vllm serve MODEL --gpu-memory-utilization 0.95 --max-num-seqs 1
      -- python -m vllm.entrypoints.openai.api_server --model MODEL
    autotune sets --max-model-len itself (replacing yours) and picks a free local port
    unless the command names one with --port. Without SERVE_COMMAND, the command of the
    newest run in --runs-dir is reused (handy for cron).

    \b
    Exit codes: 0 verified ceiling found; 1 bad input; 2 usage error;
    3 vLLM failed for another reason (see error_kind); 4 booted but not verified;
    5 hung; 6 refused and no ceiling could be read; 8 refused by a preflight
    check (nothing booted); 130/143 interrupted by SIGINT/SIGTERM.
    """
    from autotune.run import tune as tune_mod

    argv = list(serve_command)
    if argv and argv[0] == "--":
        argv = argv[1:]
    reused_from = None
    if not argv:
        found = tune_mod.newest_command(runs_dir)
        if found is None:
            raise click.ClickException(
                f"no serve command given and no earlier run in {runs_dir} to reuse one from.\n"
                "Give it after `--`: autotune --target 64K -- vllm serve MODEL ...")
        argv, reused_from = found
        _err(f"reusing the serve command of run {reused_from}", quiet=quiet)
    target_max = target == "max"
    opts = tune_mod.TuneOptions(target=0 if target_max else target, target_max=target_max, gpu=gpu, force=force,
                                allow_risky_gmu=allow_risky_gmu, serve_argv=argv, runs_dir=runs_dir, keep_serving=keep_serving,
                                stall_timeout_s=stall_timeout, max_boots=max_boots, reused_from=reused_from,
                                strategy=strategy, reach=reach, max_gmu=max_gmu, allow_kv_quant=allow_kv_quant,
                                probe=probe, back_off=back_off)
    progress = Progress(quiet=quiet, show_log=show_log)
    try:
        record = tune_mod.tune(opts, progress)
    except tune_mod.Interrupted as exc:
        progress.close()
        _err(f"interrupted ({exc}); the server was stopped and the run marked interrupted", quiet=False)
        sys.exit(128 + exc.signum)
    except tune_mod.PreflightFailed as exc:
        click.echo("Not booting: a preflight check says this cannot work (--force boots anyway).", err=True)
        for problem in exc.problems:
            click.echo(problem.render(), err=True)
        sys.exit(EXIT_PREFLIGHT)
    except ValueError as exc:  # a bad --gpu selector
        raise click.ClickException(str(exc))
    except artifact.ArtifactError as exc:
        raise click.ClickException(str(exc))
    finally:
        progress.close()  # clears the live status line whatever happened
    if json_:
        click.echo(json.dumps(_public(record), indent=2))
    else:
        click.echo(render_summary(record, run_dir=runs_dir / record["run_id"]))
    sys.exit(_exit_code(record))


def _public(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith("_")}


def _err(message: str, quiet: bool = False) -> None:
    if not quiet:
        click.echo(message, err=True)


# Other command modules (cli_history) build their progress display with this name.
ProgressPrinter = Progress


_fmt = fmt_number  # one number format for the CLI and the progress display


@cli.command()
@click.argument("logfiles", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "json_", is_flag=True, help="One JSON object per log (a list for several).")
@click.option("--provenance/--no-provenance", default=True, show_default=True,
              help="With --json: include the line each value came from under \"provenance\".")
def parse(logfiles, json_, provenance):
    """Print what autotune reads from vLLM boot logs.

    \b
    Keys (absent when the log does not show them): vllm_version, non_default_args,
    attention_backend, weights_gib, available_kv_gib, kv_cache_tokens, max_concurrency,
    max_concurrency_tokens, gpu_blocks, cpu_blocks, max_model_len_requested, kv_needed_gib,
    refusal_available_kv_gib, estimated_max_model_len, kv_cache_max_tokens,
    outcome (ready | refused | error | incomplete), error_kind.
    Each value's source line is under "provenance" in --json output.

    \b
    Exit codes: 0 parsed; 1 a file could not be read.
    """
    results = []
    for path in logfiles:
        try:
            parser = parse_file(path)
        except OSError as exc:
            raise click.ClickException(f"cannot read {path}: {exc.strerror or exc}")
        out = parser.result()
        found = catalog.diagnosis(out)
        if found is not None:
            out["diagnosis"] = {"cause": found["cause"], "fix": found["fix"]}
        if provenance:
            out["provenance"] = parser.provenance()
        results.append((path, out))
    if json_:
        payload = [r for _, r in results]
        click.echo(json.dumps(payload[0] if len(payload) == 1 else payload, indent=2, ensure_ascii=False))
        return
    for i, (path, out) in enumerate(results):
        if i:
            click.echo("")
        click.echo(f"{path}: {out['outcome']}" + (f" ({out['error_kind']})" if out.get("error_kind") else ""))
        prov = out.get("provenance", {})
        for key in list(SCHEMA_KEYS) + sorted(k for k in out if k not in SCHEMA_KEYS):
            if key in ("outcome", "error_kind", "provenance", "diagnosis") or key not in out:
                continue
            where = f"  [line {prov[key]['line']}]" if key in prov else ""
            value = out[key]
            shown = json.dumps(value, ensure_ascii=False) if isinstance(value, (dict, list)) else _fmt(value)
            if len(shown) > 100:
                shown = shown[:97] + "..."
            click.echo(f"  {key}: {shown}{where}")
        if out.get("diagnosis"):
            click.echo(f"  cause: {out['diagnosis']['cause']}")
            click.echo(f"  fix:   {out['diagnosis']['fix']}")


@cli.command()
@_runs_dir_option
@click.option("--json", "json_", is_flag=True, help="Print what was found as JSON.")
def clean(runs_dir, json_):
    """Stop servers that a killed autotune left running.

    \b
    While a server runs, its run folder holds server.json (pid, start time). If autotune
    itself is killed (SIGKILL, OOM killer, a closed terminal), that server keeps holding
    memory. `clean` finds such servers and stops their whole process tree, but only when
    the pid still belongs to that server (same start time) and the autotune that started
    it is gone; it never kills by name. Every tune start does the same first.

    \b
    It also marks runs and sweeps that a killed autotune left `running` as
    `interrupted`, so that `autotune resume` can continue them.

    \b
    Exit codes: 0 always (what was done is printed).
    """
    from autotune.store import cleanup

    found = cleanup.clean(runs_dir, on_step=lambda step: _err(
        f"  {step['signal']} to pids {', '.join(map(str, step['pids']))}"))
    if json_:
        click.echo(json.dumps([{"run_dir": str(c.run_dir), "pid": c.pid, "action": c.action, "detail": c.detail}
                               for c in found], indent=2))
        return
    if not found:
        click.echo(f"nothing to clean under {runs_dir}")
    for c in found:
        click.echo(f"{c.run_dir.name}: pid {c.pid}: {c.action}" + (f" ({c.detail})" if c.detail else ""))


@cli.command()
@click.argument("run", default="latest")
@_runs_dir_option
@click.option("--json", "json_", is_flag=True, help="Print the run (or sweep) record instead of the summary.")
@click.option("--quiet", "-q", is_flag=True, help="No progress lines; only the summary and errors.")
def resume(run, runs_dir, json_, quiet):
    """Continue an interrupted tune, lever search or sweep.

    \b
    RUN is a run folder, a run id, a sweep folder or id, or `latest` (the newest run).
    What was finished is kept and not repeated:
      tune          finished boots are kept; the next boot is the one the strategy
                    would have chosen after them;
      lever search  (--reach) the run's own boots are done; lever runs that finished
                    are taken as they are, an interrupted one is resumed;
      sweep         finished values are kept, the interrupted value's run is resumed,
                    the values not reached yet run.
    A run that belongs to an interrupted sweep or lever search (as `latest` often
    does) continues that sweep or search. A server left behind by a killed autotune
    is stopped first, and a run or sweep it left `running` becomes `interrupted`.

    \b
    Exit codes as for tune (or sweep); 1 when RUN is not interrupted.
    """
    from autotune.run import sweep as sweep_mod
    from autotune.run import tune as tune_mod

    cleaning = Progress(quiet=quiet)
    try:
        tune_mod.clean_leftovers(runs_dir, cleaning)  # first, so that a SIGKILLed run reads `interrupted`
        kind, path, why = _what_to_resume(run, runs_dir)
    except artifact.ArtifactError as exc:
        raise click.ClickException(str(exc))
    finally:
        cleaning.close()
    if why:
        _err(why, quiet=quiet)
    if kind == "sweep":
        from autotune.cli import history as cli_history

        say = cli_history.sayer(quiet)
        cli_history.run_sweep(lambda progress: sweep_mod.resume(path, runs_dir, progress, say, cli_history.warn),
                              path, json_, quiet)
        return
    try:
        progress = Progress(quiet=quiet)
        try:
            record = tune_mod.resume(path, progress)
        finally:
            progress.close()
    except tune_mod.Interrupted as exc:
        _err(f"interrupted ({exc}); the server was stopped and the run marked interrupted")
        sys.exit(128 + exc.signum)
    except artifact.ArtifactError as exc:
        raise click.ClickException(str(exc))
    click.echo(json.dumps(_public(record), indent=2) if json_ else render_summary(record, run_dir=path))
    sys.exit(_exit_code(record))


def _what_to_resume(ref: str, runs_dir: Path) -> tuple[str, Path, str | None]:
    """("sweep" | "run", folder, why it is not the folder named) for a RUN argument of resume."""
    from autotune.run import sweep as sweep_mod

    for path in (Path(ref), Path(runs_dir) / ref):
        if (path / sweep_mod.SWEEP_FILE).is_file():
            return "sweep", path, None
    if ref == "latest":
        sweeps, runs = sweep_mod.list_sweeps(runs_dir), artifact.list_runs(runs_dir)
        if sweeps and (not runs or sweeps[0].name > runs[0].name):
            return "sweep", sweeps[0], None  # a sweep newer than every run: interrupted before its first value
    run_dir = artifact.resolve_run(ref, runs_dir)
    record = artifact.load_run(run_dir)
    links = record.get("links") or {}
    if record.get("state") != "finished" or ref == "latest":
        # A member of a sweep or lever search continues the whole of it, when that was interrupted.
        sweep_dir = Path(runs_dir) / str(links.get("sweep_id"))
        if links.get("sweep_id") and (sweep_dir / sweep_mod.SWEEP_FILE).is_file():
            if sweep_mod.load(sweep_dir).get("state") == "interrupted":
                return "sweep", sweep_dir, f"run {run_dir.name} is part of sweep {sweep_dir.name}: resuming the sweep"
        parent_dir = Path(runs_dir) / str(links.get("reach_of"))
        if links.get("reach_of") and (parent_dir / artifact.RUN_FILE).is_file():
            if artifact.load_run(parent_dir).get("state") == "interrupted":
                return "run", parent_dir, (f"run {run_dir.name} is a lever run of {parent_dir.name}: resuming its "
                                           "lever search")
    return "run", run_dir, None


def _exit_code(record: dict) -> int:
    result = record["result"]
    if result.get("error_kind") == "command_not_found":
        return EXIT_INPUT
    return VERDICT_EXIT.get(result["verdict"], EXIT_BOOT_FAILED)


# Commands that live in their own modules: each module exposes COMMANDS, a list of click commands.
# To add one, append the module name here (keep cli.py itself to the group, tune and parse).
COMMAND_MODULES: list[str] = ["history", "runs", "machine"]


def _register_commands() -> None:
    import importlib

    for name in COMMAND_MODULES:
        module = importlib.import_module(f"autotune.cli.{name}")
        for command in module.COMMANDS:
            cli.add_command(command)


_register_commands()


def main() -> None:
    cli(prog_name="autotune")


if __name__ == "__main__":
    main()
