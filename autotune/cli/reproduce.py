"""`autotune reproduce`: relaunch a recorded run's verified configuration with the vLLM installed now."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

import click

from autotune.analysis import reproduce as rep_mod
from autotune.cli.exitcodes import ExitCode, exits
from autotune.cli.options import ProgressPrinter, request_option, written_runs_dir_option
from autotune.cli.records import load_one
from autotune.cli.tables import or_dash, table
from autotune.cli.tune import INTERRUPTED_RUN
from autotune.store.record import RunRecord


@click.command("reproduce")
@click.argument("run", required=False)
@written_runs_dir_option
@click.option("--outdated", is_flag=True,
              help="Reproduce every verified configuration recorded on another vLLM version than the one its "
                   "command starts now (the newest run of each; sweep points are left out).")
@request_option("probe", default=None, show_default=False,
                help="The probe after the ceiling boots. Default: the one the original run ran.")
@request_option("stall_timeout_s", "stall_timeout")
@click.option("--json", "json_", is_flag=True, help="Print the before/after comparison as JSON.")
@click.option("--quiet", "-q", is_flag=True, help="No progress lines; only the result and errors.")
def reproduce_cmd(run, runs_dir, outdated, probe, stall_timeout, json_, quiet):
    """Tune a recorded run again on the vLLM installed now, and say what changed.

    \b
    RUN is a run folder, a run id, or `latest`. The re-tune aims at the run's original
    target (so an upgrade that gives more context shows), with its recorded command and
    environment (variables that change vLLM: VLLM_*, CUDA_* with the GPU pinning, HF_*, ...;
    secrets, never recorded, come from your environment now), the fewest boots the
    installed vLLM allows, and the probe the original run ran (--probe overrides). A new run
    is written, linked to the old one ("links": {"reproduces": RUN}); `show`, `runs` and
    `compare` use that link.

    \b
    Reported old vs new: vLLM version, device memory, available KV GiB, KV tokens, the
    ceiling (better / same / worse), TTFT and prefill tokens/s of the probe, the attention
    backend, the flags vLLM no longer lists in its `non-default args`, and the new run's
    paste-ready files. Tolerances: the larger of 0.02 GiB and 5% for the KV figure, 5% for
    tokens and the ceiling (identical vLLM boots differ by up to ~5%); a factor of 1.5 for
    TTFT and prefill tokens/s, and at least 0.5 s of the request's time (a 40 ms TTFT
    that doubles is noise), compared only when both probes had prompts within 5% in
    length. If the memory vLLM budgets from moved (a CPU node's in a VM can), the change of
    budget (memory x gmu) is expected and not held against vLLM.

    \b
    After `pip install -U vllm`, in an upgrade script:
      autotune reproduce --outdated || echo "the upgrade changed what this machine serves"

    \b
    Exit codes (for gating an upgrade in a script; --outdated: the worst of its runs):
      0 same or better (or, with --outdated, nothing recorded on another vLLM)
     10 --outdated: for some run, which vLLM its command starts now could not be told
        (a wrapper script, a container): it was not checked (`reproduce RUN` re-tunes it)
      0 also where the figures moved with what the upgrade changed in sizing ("Changed by the upgrade": vLLM
        0.34's unset gmu of 1.0, its pool measured after CUDA-graph capture, its 64-token blocks)
      7 regression beyond tolerance (less KV, fewer tokens, a lower ceiling, a failed probe,
        or a probe 1.5x slower)
      3 the re-tune failed (did not boot, hung, not verified)
      1 bad input (no such run, or the run has no verified configuration to reproduce)
      130/143 interrupted
    """
    if outdated and run:
        raise click.UsageError("name a RUN or give --outdated, not both")
    if not outdated and not run:
        raise click.UsageError("name the RUN to reproduce (a run folder, a run id, or `latest`), or give --outdated "
                               "for every configuration measured on another vLLM")
    env_now = dict(os.environ)
    if outdated:
        _reproduce_outdated(runs_dir, env_now, stall_timeout, probe, json_, quiet)
    old = load_one(run, runs_dir)[1]
    verdict = _reproduce_one(old, runs_dir, env_now, stall_timeout, probe, quiet)
    if json_:
        click.echo(json.dumps(asdict(verdict), indent=2, ensure_ascii=False))
    else:
        click.echo(render_reproduction(verdict))
    sys.exit(verdict.exit_code)


def _reproduce_outdated(runs_dir, env_now: dict, stall_timeout: float, probe: str | None, json_: bool,
                        quiet: bool) -> None:
    """--outdated: every configuration recorded on another vLLM than its command starts now; exits."""
    from autotune.cli.records import load_records
    from autotune.run import reproduce as reproduce_mod

    records = _all_records(load_records, runs_dir)
    installed = reproduce_mod.installed_version_finder(env_now)
    todo = rep_mod.outdated(records, installed)
    unknown = rep_mod.undetermined(records, installed)
    if not todo:
        click.echo(f"nothing to reproduce under {runs_dir}: {rep_mod.nothing_outdated(records, installed)}", err=True)
    elif not quiet:
        click.echo(f"{len(todo)} configuration(s) measured on another vLLM: "
                   + ", ".join(f"{r.run_id} ({r.vllm_version or '?'} -> {now})" for r, now in todo),
                   err=True)
    verdicts = [_reproduce_one(old, runs_dir, env_now, stall_timeout, probe, quiet) for old, _ in todo]
    if json_:
        click.echo(json.dumps([asdict(v) for v in verdicts], indent=2, ensure_ascii=False))
    elif verdicts:
        click.echo("\n\n".join(render_reproduction(v) for v in verdicts))
    for run_id in unknown:
        click.echo(f"Warning: not checked: {run_id}: which vLLM its command starts now could not be told (autotune "
                   "asks a Python or a `vllm` script; a wrapper script or a container says nothing); "
                   f"`autotune reproduce {run_id}` re-tunes it whatever it runs", err=True)
    sys.exit(rep_mod.worst_exit([v.exit_code for v in verdicts] + [ExitCode.UNDETERMINED] * bool(unknown)))


def _all_records(load_records, runs_dir) -> list:
    try:
        return load_records((), runs_dir)
    except click.ClickException:
        return []  # no runs at all: nothing is outdated


def _reproduce_one(old: RunRecord, runs_dir, env_now: dict, stall_timeout: float, probe: str | None, quiet: bool):
    from autotune.run import reproduce as reproduce_mod

    try:
        plan = reproduce_mod.plan_reproduction(old, runs_dir, env_now, stall_timeout, probe)
    except reproduce_mod.NotReproducible as exc:
        raise click.ClickException(str(exc)) from None
    for name in plan.missing_secrets:
        click.echo(f"Warning: {name} was set for run {old.run_id} (its value was not recorded) and is not set now",
                   err=True)
    if not quiet:
        click.echo(f"reproducing {old.run_id} (vLLM {old.vllm_version or '?'}, ceiling "
                   f"{old.result.ceiling:,} of the target {plan.options.target:,}): tuning toward the target "
                   f"on the vLLM installed now; probe {plan.options.probe} ({plan.probe_source})", err=True)
    with exits(INTERRUPTED_RUN, preflight_code=ExitCode.FAILED,
               preflight_head="Error: not relaunched: a preflight check says the recorded configuration cannot "
                              "work here now"):
        _, verdict = reproduce_mod.reproduce(old, plan, ProgressPrinter(quiet=quiet))
    return verdict


def render_reproduction(v: rep_mod.Reproduction) -> str:
    head = {"same": "Same: " + v.reason + ".", "better": "Better: " + v.reason + ".",
            "changed": "Changed by the upgrade: " + v.reason + ".",
            "regression": "Regression: " + v.reason + ".", "error": "Error: " + v.reason + "."}[v.verdict]
    lines = [head, f"  run {v.old_run} -> {v.new_run} (reproduces {v.old_run}"
             + (f"; both tuned toward the target {v.target:,})" if v.target else ")")]
    rows = [["vLLM version", v.vllm_version[0] or "?", v.vllm_version[1] or "?", "", "", ""]]
    if v.device_memory_gib[0] is not None or v.device_memory_gib[1] is not None:
        rows.append(["device memory GiB", or_dash(v.device_memory_gib[0]), or_dash(v.device_memory_gib[1]), "", "", ""])
    for c in v.changes:
        rows.append(_change_row(c))
    shown = {c["what"] for c in v.changes}
    for what, pair in (("available KV GiB", v.available_kv_gib), ("KV tokens", v.kv_cache_tokens),
                       ("ceiling", v.ceiling)):
        if what not in shown:
            rows.append([what, or_dash(pair[0]), or_dash(pair[1]), "", "", ""])
    rows.append(["attention backend", v.attention_backend[0] or "-", v.attention_backend[1] or "-", "", "",
                 "same" if v.attention_backend[0] == v.attention_backend[1] else "changed"])
    if v.probe.ok and v.probe.ok != [None, None]:
        ok = ["-" if x is None else ("ok" if x else "failed") for x in v.probe.ok]
        rows.append([f"probe ({v.probe.mode or '?'})", ok[0], ok[1], "", "", ""])
    lines.extend("  " + line for line in table(["", "before", "after", "Δ", "expected Δ", ""], rows,
                                                right={1, 2, 3, 4}))
    if v.probe.note:
        lines.append(f"  probe: {v.probe.note}")
    if v.flags_no_longer_shown:
        lines.append(f"  no longer in vLLM's non-default args: {', '.join(v.flags_no_longer_shown)}")
    else:
        lines.append("  non-default args: every flag vLLM listed before is still listed")
    if v.new_files:
        folders = {str(Path(path).parent) for path in v.new_files.values()}
        names = ", ".join(Path(path).name for path in v.new_files.values())
        lines.append(f"  new files: {names}" + (f"\n             in {folders.pop()}/" if len(folders) == 1 else ""))
    lines.append(f"  exit code {v.exit_code}")
    return "\n".join(lines)


def _change_row(c: dict) -> list[str]:
    if c["what"].endswith(" s") or c["what"].endswith("/s"):
        fmt = (lambda x: f"{x:,.2f}") if c["what"].endswith(" s") else (lambda x: f"{x:,.0f}")
        sign = (lambda x: f"{x:+,.2f}") if c["what"].endswith(" s") else (lambda x: f"{x:+,.0f}")
        return [c["what"], fmt(c["before"]), fmt(c["after"]), sign(c["delta"]), "",
                f"{c['status']} (tolerance {c.get('tolerance_text') or fmt(c['tolerance'])})"]
    gib = c["what"].endswith("GiB")
    fmt = (lambda x: f"{x:.2f}") if gib else (lambda x: f"{x:,}")
    sign = (lambda x: f"{x:+.2f}") if gib else (lambda x: f"{x:+,.0f}")
    tol = f"{c['tolerance']:.2f}" if gib else f"{c['tolerance']:,.0f}"
    return [c["what"], fmt(c["before"]), fmt(c["after"]), sign(c["delta"]),
            sign(c["expected"]) if c["expected"] else "", f"{c['status']} (tolerance {tol})"]


COMMANDS = [reproduce_cmd]
