"""`autotune predict`: available KV, KV tokens and the ceiling at another gmu, from measured runs."""

from __future__ import annotations

import json
from dataclasses import asdict

import click

from autotune.analysis import compare as cmp
from autotune.cli.compare import describe_group
from autotune.cli.options import runs_dir_option
from autotune.cli.records import load_records


@click.command("predict")
@click.argument("runs", nargs=-1)
@click.option("--gmu", type=click.FloatRange(min=0, max=1, min_open=True), required=True,
              help="The --gpu-memory-utilization to predict for.")
@click.option("--max-num-seqs", type=click.IntRange(min=1),
              help="Use only runs with this --max-num-seqs (it changes the fixed overhead, so it is not "
                   "predicted across).")
@runs_dir_option
@click.option("--json", "json_", is_flag=True, help="Print the prediction(s) as JSON.")
def predict_cmd(runs, gmu, max_num_seqs, runs_dir, json_):
    """Predict available KV, KV tokens and the ceiling at another gmu, from measured runs.

    \b
    RUN as for `compare` (default: every run under --runs-dir). Per comparable group:
    two or more gmu values give the least-squares line; one gmu value is moved by the
    budget vLLM computes (device memory x gmu). The ceiling is the
    predicted KV token count minus how far below it the measured ceilings sat. A gmu
    outside the measured range is predicted with a warning (an extrapolation).

    \b
    Example:
      autotune predict runs/ --gmu 0.95 --max-num-seqs 1

    \b
    Exit codes: 0 predicted; 1 no run to predict from (or none with that --max-num-seqs).
    """
    records = load_records(runs, runs_dir)
    report = cmp.compare(records)
    rows = {r.run_id: r for r in report.runs}
    groups = report.groups
    if max_num_seqs is not None:
        groups = [g for g in groups if rows[g.run_ids[0]].max_num_seqs == str(max_num_seqs)]
        if not groups:
            seen = sorted({r.max_num_seqs or "(vLLM's default)" for r in report.runs})
            raise click.ClickException(f"no run with --max-num-seqs {max_num_seqs}; the runs have: {', '.join(seen)}")
    predictions = []
    skipped = []
    for group in groups:
        p = cmp.predict(group, [rows[i] for i in group.run_ids], gmu)
        if p is None:
            why = ("gmu does not size the KV cache in these runs" if not group.gmu_sets_kv
                   else "one gmu value and no device memory to move it by" if
                   any(rows[i].available_kv_gib is not None for i in group.run_ids) else "no run with a KV figure")
            skipped.append((group, why))
        else:
            predictions.append((group, p))
    if not predictions:
        whys = "; ".join(f"{g.group_id}: {why}" for g, why in skipped)
        raise click.ClickException(f"nothing to predict from ({whys})")
    for p in (p for _, p in predictions):
        for warning in p.warnings:
            click.echo(f"Warning: {p.group_id}: {warning}", err=True)
    if json_:
        click.echo(json.dumps([{**asdict(p), "group": asdict(g)} for g, p in predictions], indent=2,
                              ensure_ascii=False))
        return
    for i, (group, p) in enumerate(predictions):
        if i:
            click.echo("")
        click.echo(f"{group.group_id} ({describe_group(group, rows)}) at gmu {gmu:g}:")
        click.echo(f"  available KV: {p.available_kv_gib:.2f} GiB")
        if p.kv_cache_tokens is not None:
            click.echo(f"  KV tokens:    {p.kv_cache_tokens:,}")
        if p.ceiling is not None:
            bound = "at most " if p.ceiling_is_upper_bound else ""
            click.echo(f"  ceiling:      {bound}--max-model-len {p.ceiling:,}")
        click.echo(f"  from: {p.basis}")
        if group.ceiling_slack_tokens is not None:
            click.echo(f"  the measured ceilings sat {group.ceiling_slack_tokens:,} tokens under the KV token count")
    for group, why in skipped:
        click.echo(f"({group.group_id}: no prediction: {why})", err=True)


COMMANDS = [predict_cmd]
