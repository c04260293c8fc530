"""`autotune predict`: available KV, KV tokens and the ceiling at another gmu, from measured runs."""

from __future__ import annotations

import json
from dataclasses import asdict

import click

from autotune.analysis import compare as cmp
from autotune.analysis import gmu_predict
from autotune.cli import predict_model
from autotune.cli.compare import describe_group
from autotune.cli.formats import json_rounded
from autotune.cli.options import LengthType, MemoryType, runs_dir_option
from autotune.cli.records import load_records
from autotune.model import max_len
from autotune.vllm import versions


class ServeCommandAfterDashes(click.Command):
    """`autotune predict [OPTIONS] [RUN...] -- vllm serve ...`: the words after `--` are the serve
    command, as tune and sweep take it (ctx.meta["serve_argv"]); the words before are RUNs."""

    def parse_args(self, ctx, args):
        if "--" in args:
            at = args.index("--")
            ctx.meta["serve_argv"], args = args[at + 1:], args[:at]
        return super().parse_args(ctx, args)


@click.command("predict", cls=ServeCommandAfterDashes)
@click.argument("runs", nargs=-1)
@click.option("--gmu", type=click.FloatRange(min=0, max=1, min_open=True),
              help="The --gpu-memory-utilization to predict for. Default: the serve command's own, else the "
                   "default of the vLLM it runs; for RUNs, the default of each group's vLLM. The output says which.")
@click.option("--model", "model_dir", metavar="DIR",
              help="Predict from this model's files (config.json, safetensors headers), no boot; runs of the same "
                   "model, device and settings calibrate the overhead.")
@click.option("--command", "serve_command", metavar="'vllm serve ...'",
              help="As --model, with the settings of this serve command (--kv-cache-dtype, -tp, -pp, "
                   "--max-model-len, --kv-cache-memory-bytes, --gpu-memory-utilization, ...).")
@click.option("--target", type=LengthType(), help="With --model/--command: the gmu that reaches this length (65536, 64K).")
@click.option("--concurrency-at", type=LengthType(), metavar="LENGTH",
              help="With --model/--command: how many sequences of LENGTH tokens fit at once.")
@click.option("--device", "device_kind", type=click.Choice(["cpu", "gpu"]),
              help="With --model/--command: the device to predict for (default: the first GPU, else the CPU node).")
@click.option("--device-memory", type=MemoryType(),
              help="With --model/--command: the memory vLLM multiplies gmu by (a GPU's total, a CPU node's; "
                   "24GiB, a bare number is GiB).")
@click.option("--max-num-seqs", type=click.IntRange(min=1),
              help="Use only runs with this --max-num-seqs (it changes the fixed overhead, so it is not "
                   "predicted across).")
@runs_dir_option
@click.option("--json", "json_", is_flag=True, help="Print the prediction(s) as JSON.")
def predict_cmd(runs, gmu, model_dir, serve_command, target, concurrency_at, device_kind, device_memory,
                max_num_seqs, runs_dir, json_):
    """Predict available KV, KV tokens and the ceiling at another gmu, from measured runs.

    \b
    RUN as for `compare` (default: every run under --runs-dir). Per comparable group:
    two or more gmu values give the least-squares line; one gmu value is moved by the
    budget vLLM computes (device memory x gmu). The ceiling is the
    predicted KV token count minus how far below it the measured ceilings sat. A gmu
    outside the measured range is predicted with a warning (an extrapolation).

    \b
    From the model's files, before any boot (-- vllm serve MODEL ..., as tune takes
    the command; or --command '...', or --model DIR):
    weights from the safetensors headers and KV bytes per token from config.json
    (full/GQA/MQA, MLA, sliding window, hybrid linear attention; --kv-cache-dtype,
    -tp, -pp) are exact ("derived"); the overhead (activations, runtime) comes from
    the verified runs under --runs-dir of the same model, device and settings
    ("estimated", with their spread as the band), else from a stated prior with a
    wide band. Out: available KV, vLLM's KV token count, the ceiling at --gmu, the
    gmu that reaches --target, and the concurrency at --concurrency-at.
    See docs/predict.md.

    \b
    Examples:
      autotune predict runs/ --gmu 0.95 --max-num-seqs 1
      autotune predict --target 64K -- vllm serve ./Qwen3-8B --kv-cache-dtype fp8 --gpu-memory-utilization 0.9
      autotune predict --model ./Llama-3.1-8B --device gpu --device-memory 24 --gmu 0.95 --json

    \b
    A run.json that cannot be read in a folder of runs is skipped with a warning on
    stderr naming it, and the others are read.

    \b
    Exit codes: 0 predicted; 1 no run to predict from (or none with that --max-num-seqs), or a
    run named could not be read.
    """
    dashed = click.get_current_context().meta.get("serve_argv")
    if model_dir or serve_command or dashed is not None:
        return predict_model.predict_from_files(runs, runs_dir, model_dir, serve_command, gmu, target,
                                                concurrency_at, device_kind, device_memory, json_, dashed)
    records = load_records(runs, runs_dir)
    report = cmp.compare(records)
    rows = {r.run_id: r for r in report.runs}
    groups = report.groups
    if max_num_seqs is not None:
        groups = [g for g in groups if rows[g.run_ids[0]].max_num_seqs == str(max_num_seqs)]
        if not groups:
            seen = sorted({r.max_num_seqs or "(vLLM's default)" for r in report.runs})
            raise click.ClickException(f"no run with --max-num-seqs {max_num_seqs}; the runs have: {', '.join(seen)}")
    predictions, skipped = _predict_groups(groups, rows, gmu)
    if gmu is None:
        for group, p in predictions:
            click.echo(f"{group.group_id}: gmu {p.gmu:g}, the default of vLLM {rows[group.run_ids[0]].vllm_version} "
                       "(these runs' version; --gmu predicts another)", err=True)
    if not predictions:
        whys = "; ".join(f"{g.group_id}: {why}" for g, why in skipped)
        raise click.ClickException(f"nothing to predict from ({whys})")
    for p in (p for _, p in predictions):
        for warning in p.warnings:
            click.echo(f"Warning: {p.group_id}: {warning}", err=True)
    if json_:
        click.echo(json.dumps(json_rounded([{**asdict(p), "group": asdict(g)} for g, p in predictions]), indent=2,
                              ensure_ascii=False))
        return
    for i, (group, p) in enumerate(predictions):
        if i:
            click.echo("")
        _echo_prediction(group, p, rows, p.gmu)
    for group, why in skipped:
        click.echo(f"({group.group_id}: no prediction: {why})", err=True)


def _predict_groups(groups, rows: dict, gmu: float | None) -> tuple[list, list]:
    """([(group, prediction)], [(group, why there is none)]) for each comparable group; at `gmu`, or
    (None) at the default of each group's vLLM."""
    predictions = []
    skipped = []
    for group in groups:
        at = gmu if gmu is not None else versions.default_gmu(rows[group.run_ids[0]].vllm_version)
        if at is None:
            skipped.append((group, "no --gmu, and these runs' vLLM version (so its default gmu) is unknown"))
            continue
        p = gmu_predict.predict(group, [rows[i] for i in group.run_ids], at,
                                model_maximum=max_len.maximum_here(group.key.get("model")))
        if p is None:
            why = ("gmu does not size the KV cache in these runs" if not group.gmu_sets_kv
                   else "one gmu value and no device memory to move it by" if
                   any(rows[i].available_kv_gib is not None for i in group.run_ids) else "no run with a KV figure")
            skipped.append((group, why))
        else:
            predictions.append((group, p))
    return predictions, skipped


def _echo_prediction(group, p, rows: dict, gmu: float) -> None:
    """One group's prediction as text."""
    click.echo(f"{group.group_id} ({describe_group(group, rows)}) at gmu {gmu:g}:")
    click.echo(f"  available KV: {p.available_kv_gib:.2f} GiB")
    if p.kv_cache_tokens is not None:
        click.echo(f"  KV tokens:    {p.kv_cache_tokens:,}")
    if p.ceiling is not None:
        bound = "at most " if p.ceiling_is_upper_bound else ""
        click.echo(f"  ceiling:      {bound}--max-model-len {p.ceiling:,}: {gmu_predict.ceiling_label(p)}")
    click.echo(f"  from: {p.basis}")
    if group.ceiling_slack_tokens is not None:
        click.echo(f"  the measured ceilings sat {group.ceiling_slack_tokens:,} tokens under the KV token count")


COMMANDS = [predict_cmd]
