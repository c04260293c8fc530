"""`autotune parse`: print what autotune reads from vLLM boot logs (the reading is vllm/logparse.py)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from autotune.cli.options import fmt
from autotune.vllm import catalog
from autotune.vllm.logparse import SCHEMA_KEYS, parse_file


@click.command()
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
        click.echo(render_parsed(path, out))


def render_parsed(path: Path, out: dict) -> str:
    """The text form of one parsed log: outcome, each key with its line, the diagnosis."""
    lines = [f"{path}: {out['outcome']}" + (f" ({out['error_kind']})" if out.get("error_kind") else "")]
    prov = out.get("provenance", {})
    for key in list(SCHEMA_KEYS) + sorted(k for k in out if k not in SCHEMA_KEYS):
        if key in ("outcome", "error_kind", "provenance", "diagnosis") or key not in out:
            continue
        where = f"  [line {prov[key]['line']}]" if key in prov else ""
        value = out[key]
        shown = json.dumps(value, ensure_ascii=False) if isinstance(value, (dict, list)) else fmt(value)
        if len(shown) > 100:
            shown = shown[:97] + "..."
        lines.append(f"  {key}: {shown}{where}")
    if out.get("diagnosis"):
        lines.append(f"  cause: {out['diagnosis']['cause']}")
        lines.append(f"  fix:   {out['diagnosis']['fix']}")
    return "\n".join(lines)


COMMANDS = [parse]
