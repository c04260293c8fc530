"""`autotune reproduce`: relaunch a recorded run's verified configuration with the vLLM installed now."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict

import click

from autotune.analysis import compare as cmp
from autotune.cli.exitcodes import ExitCode, exits
from autotune.cli.options import ProgressPrinter, runs_dir_option
from autotune.cli.records import load_one
from autotune.cli.tables import or_dash, table
from autotune.cli.tune import INTERRUPTED_RUN


@click.command("reproduce")
@click.argument("run")
@runs_dir_option
@click.option("--stall-timeout", type=click.FloatRange(min=1), default=1200, show_default=True,
              help="Seconds without a new log line before a boot counts as hung.")
@click.option("--json", "json_", is_flag=True, help="Print the before/after comparison as JSON.")
@click.option("--quiet", "-q", is_flag=True, help="No progress lines; only the result and errors.")
def reproduce_cmd(run, runs_dir, stall_timeout, json_, quiet):
    """Relaunch a recorded run's verified configuration with the vLLM installed now.

    \b
    RUN is a run folder, a run id, or `latest`. The recorded final command (with its
    --max-model-len), its environment (variables that change vLLM: VLLM_*, CUDA_* with the
    GPU pinning, HF_*, ...; secrets, never recorded, come from your environment now) and
    the recorded ceiling as the target. A new run is written, linked to the old one
    ("links": {"reproduces": RUN}). If the recorded length no longer fits, vLLM refuses it
    and the refusal path finds the new ceiling.

    \b
    Reported before/after: vLLM version, device memory, available KV GiB, KV tokens,
    ceiling, attention backend, and the flags vLLM no longer lists in its `non-default
    args`. A change counts when it is beyond the tolerance: the larger of 0.02 GiB and 5%
    for the KV figure, 5% for tokens and the ceiling (identical vLLM boots differ by up to
    ~5%). If the memory vLLM budgets from moved (a CPU node's in a VM can), the change of
    budget (memory x gmu) is expected and not held against vLLM; the figures are shown as
    measured, with the expected change beside them.

    \b
    Exit codes (for gating an upgrade in a script):
      0 same or better
      7 regression beyond tolerance (less KV, fewer tokens, or a lower ceiling)
      3 the relaunch failed (did not boot, hung, not verified)
      1 bad input (no such run, or the run has no verified configuration to relaunch)
      130/143 interrupted
    """
    from autotune.run import tune as tune_mod
    from autotune.store.redact import MASK

    old = load_one(run, runs_dir)[1].to_dict()  # compare.py reads the JSON form
    result = old.get("result") or {}
    final_argv = result.get("final_argv")
    if not result.get("verified") or not final_argv or not result.get("ceiling"):
        raise click.ClickException(f"run {old['run_id']} has no verified configuration to reproduce "
                                   f"(its verdict: {result.get('verdict')})")
    env, missing = cmp.reproduction_env(old.get("environment") or {}, dict(os.environ),
                                        tune_mod.RELEVANT_ENV_PREFIXES, MASK)
    for name in missing:
        click.echo(f"Warning: {name} was set for run {old['run_id']} (its value was not recorded) and is not set now",
                   err=True)
    # The refusal path boots the recorded length itself, as it was recorded.
    opts = tune_mod.TuneOptions(target=int(result["ceiling"]), serve_argv=list(final_argv), runs_dir=runs_dir,
                                env=env, stall_timeout_s=stall_timeout, kind="reproduce", strategy="refusal",
                                links={"reproduces": old["run_id"]})
    if not quiet:
        click.echo(f"reproducing {old['run_id']} (vLLM {old.get('vllm_version') or '?'}, ceiling "
                   f"{result['ceiling']:,})", err=True)
    with exits(INTERRUPTED_RUN, preflight_code=ExitCode.FAILED,
               preflight_head="Error: not relaunched: a preflight check says the recorded configuration cannot "
                              "work here now"):
        new = tune_mod.tune(opts, ProgressPrinter(quiet=quiet))
    verdict = cmp.reproduce_verdict(old, new)
    if json_:
        click.echo(json.dumps(asdict(verdict), indent=2, ensure_ascii=False))
    else:
        click.echo(render_reproduction(verdict))
    sys.exit(verdict.exit_code)


def render_reproduction(v: cmp.Reproduction) -> str:
    head = {"same": "Same: " + v.reason + ".", "better": "Better: " + v.reason + ".",
            "regression": "Regression: " + v.reason + ".", "error": "Error: " + v.reason + "."}[v.verdict]
    lines = [head, f"  run {v.old_run} -> {v.new_run}"]
    rows = [["vLLM version", v.vllm_version[0] or "?", v.vllm_version[1] or "?", "", "", ""]]
    if v.device_memory_gib[0] is not None or v.device_memory_gib[1] is not None:
        rows.append(["device memory GiB", or_dash(v.device_memory_gib[0]), or_dash(v.device_memory_gib[1]), "", "", ""])
    for c in v.changes:
        gib = c["what"].endswith("GiB")
        fmt = (lambda x: f"{x:.2f}") if gib else (lambda x: f"{x:,}")
        sign = (lambda x: f"{x:+.2f}") if gib else (lambda x: f"{x:+,.0f}")
        tol = f"{c['tolerance']:.2f}" if gib else f"{c['tolerance']:,.0f}"
        rows.append([c["what"], fmt(c["before"]), fmt(c["after"]), sign(c["delta"]),
                     sign(c["expected"]) if c["expected"] else "", f"{c['status']} (tolerance {tol})"])
    shown = {c["what"] for c in v.changes}
    for what, pair in (("available KV GiB", v.available_kv_gib), ("KV tokens", v.kv_cache_tokens),
                       ("ceiling", v.ceiling)):
        if what not in shown:
            rows.append([what, or_dash(pair[0]), or_dash(pair[1]), "", "", ""])
    rows.append(["attention backend", v.attention_backend[0] or "-", v.attention_backend[1] or "-", "", "",
                 "same" if v.attention_backend[0] == v.attention_backend[1] else "changed"])
    lines.extend("  " + line for line in table(["", "before", "after", "Δ", "expected Δ", ""], rows,
                                                right={1, 2, 3, 4}))
    if v.flags_no_longer_shown:
        lines.append(f"  no longer in vLLM's non-default args: {', '.join(v.flags_no_longer_shown)}")
    else:
        lines.append("  non-default args: every flag vLLM listed before is still listed")
    lines.append(f"  exit code {v.exit_code}")
    return "\n".join(lines)


COMMANDS = [reproduce_cmd]
