"""`autotune compare`: runs side by side, grouped, fitted, with verdicts (decisions in analysis/compare.py).

render_report is also the second half of `autotune sweep`'s output.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from autotune.analysis import compare as cmp
from autotune.analysis import node_outliers, run_groups, run_row
from autotune.cli.options import MemoryType, runs_dir_option
from autotune.cli.records import load_records
from autotune.cli.tables import echo_table, gib, on_terminal, or_dash, table
from autotune.store.outcomes import Verdict
from autotune.vllm import versions


def _short_device(device: str) -> str:
    return device.replace("NVIDIA GeForce ", "").replace("NVIDIA ", "")


def _model_name(model: str | None) -> str:
    return (model or "?").rstrip("/").split("/")[-1]


def _labels(report: cmp.Report) -> dict[str, str]:
    """Short names for the runs (#1, #2, ... in table order), so verdict lines stay readable."""
    return {r.run_id: f"#{i}" for i, r in enumerate(report.runs, 1)}


RUN_HEADER = ["", "run", "date (UTC)", "vLLM", "GPU", "model", "gmu", "max-num-seqs", "max-num-batched-tokens",
              "kv-cache-dtype", "weights GiB", "available KV GiB", "KV tokens", "verified ceiling", "group"]
RUN_RIGHT = {0, 6, 7, 8, 10, 11, 12, 13}


def render_runs_table(report: cmp.Report) -> list[str]:
    rows, notes = runs_table(report)
    return table(RUN_HEADER, rows, right=RUN_RIGHT) + notes


def runs_table(report: cmp.Report) -> tuple[list[list[str]], list[str]]:
    """The cells of the runs table, and the notes its marks (*, +) refer to."""
    group_of = {rid: g.group_id for g in report.groups for rid in g.run_ids}
    labels = _labels(report)
    notes: dict[str, str] = {}
    rows = []
    for r in report.runs:
        gmu = "?" if r.gmu is None else f"{r.gmu:g}"
        if r.gmu_source != "flag":  # one mark for every version's default, whatever the versions
            text = f"vLLM's default for the run's version ({versions.default_gmu_rule()})" if r.gmu is not None \
                else r.gmu_source
            mark = notes.setdefault(text, "*" * (sum(1 for k in notes if not k.startswith("gmu does not")) + 1))
            gmu += mark
        if not r.gmu_sets_kv:
            mark = notes.setdefault(f"gmu does not size the KV cache: {r.gmu_note}", "+" * (sum(
                1 for k in notes if k.startswith("gmu does not")) + 1))
            gmu += mark
        date = (r.started_at or "")[:16].replace("T", " ")
        rows.append([labels[r.run_id], r.run_id, date, r.vllm_version or "?", _short_device(r.device), _model_name(r.model), gmu,
                     r.max_num_seqs or "-", r.max_num_batched_tokens or "-", r.kv_cache_dtype or "-",
                     gib(r.weights_gib), gib(r.available_kv_gib), or_dash(r.kv_cache_tokens),
                     or_dash(r.ceiling) if r.ceiling is not None or r.verdict == Verdict.VERIFIED else (r.verdict or "-"), group_of.get(r.run_id, "-")])
    return rows, [f"  {mark} {text if text.startswith('gmu does not') else 'gmu not on the command line: ' + text}"
                  for text, mark in notes.items()]


def describe_group(group: run_groups.Group, rows: dict[str, run_row.Row]) -> str:
    first = rows[group.run_ids[0]]
    settings = " ".join(f"{k} {v}" if v != "true" else k for k, v in first.settings.items())
    return (f"{_model_name(first.model)} on {_short_device(first.device)}, vLLM {first.vllm_version or '?'}"
            + (f"; {settings}" if settings else ""))


def render_group(group: run_groups.Group, rows: dict[str, run_row.Row], labels: dict[str, str],
                 all_pairs: bool = False) -> list[str]:
    n = len(group.run_ids)
    members = " ".join(labels[i] for i in group.run_ids)
    lines = [f"{group.group_id} ({members}): {describe_group(group, rows)}"]
    fit = group.fit
    if fit is not None:
        lines.append(f"  fit: available KV = {fit.a_gib:.2f} x gmu - {fit.b_gib:.2f} GiB  "
                     f"(least squares over {fit.runs} runs, gmu {fit.gmu_min:g}-{fit.gmu_max:g})")
        lines.append(f"    a = {fit.a_gib:.2f} GiB: KV gained per unit of gmu, ~ the usable device memory"
                     + (f" ({fit.a_vs_device})" if fit.a_vs_device else ""))
        lines.append(f"    b = {fit.b_gib:.2f} GiB: what gmu never reaches the KV cache with, ~ weights + fixed overhead")
        if fit.exact:
            lines.append("    two runs: the line passes through both, so its residuals prove nothing; "
                         "the verdicts below use the expected change")
        residuals = ", ".join(f"{labels[rid]} {v:+.3f}".replace("-0.000", "+0.000")
                              for rid, v in fit.residuals_gib.items())
        lines.append(f"  residuals (GiB): {residuals}"
                     + (f"; spread {fit.residual_std_gib:.3f} GiB" if fit.residual_std_gib is not None else ""))
        if fit.x == "budget" and fit.device_memory_gib[0] != fit.device_memory_gib[1]:
            residuals = ", ".join(f"{labels[rid]} {v:+.3f}".replace("-0.000", "+0.000")
                                  for rid, v in fit.residuals_x_gib.items())
            lines.append(f"  the device memory moved between runs, so against the budget (device memory x gmu): "
                         f"available KV = {fit.kv_a:.2f} x budget - {fit.kv_b:.2f} GiB; residuals (GiB): {residuals}")
    elif group.gmu_sets_kv and n > 1:
        lines.append("  no fit: all runs are at one gmu value")
    lines.append(f"  expected change: {group.expectation.source}")
    if group.pairs:
        tol = group.pairs[0].tolerance
        if tol is not None:
            lines.append(f"  tolerance: {tol.text}")
        shown = group.pairs if all_pairs or len(group.pairs) <= 10 else \
            [p for p in group.pairs if p.verdict == "unexplained"]
        for p in shown:
            lines.append(f"  {labels[p.older]} (gmu {_g(p.gmu_older)}) -> {labels[p.newer]} (gmu {_g(p.gmu_newer)}): "
                         f"{p.text}")
        if len(shown) < len(group.pairs):
            lines.append(f"  ({len(group.pairs) - len(shown)} more pairs within tolerance; --json lists all)")
    return lines


def _g(value) -> str:
    return "?" if value is None else f"{value:g}"


def echo_report(report: cmp.Report) -> None:
    """The report on stdout: on a terminal its runs table drawn by rich, the rest as text."""
    if not on_terminal():
        click.echo(render_report(report))
        return
    rows, notes = runs_table(report)
    echo_table(RUN_HEADER, rows, RUN_RIGHT)
    rest = notes + render_report(report, with_runs=False).splitlines()
    if rest:
        click.echo("\n".join(rest))


def render_report(report: cmp.Report, with_runs: bool = True) -> str:
    rows = {r.run_id: r for r in report.runs}
    labels = _labels(report)
    lines = render_runs_table(report) if with_runs else []
    for group in report.groups:
        lines.append("")
        lines.extend(render_group(group, rows, labels))
    lines.extend(longest_lines(report.runs, labels))
    caches = [nc for nc in report.not_comparable if nc.get("compile_cache_only")]
    if caches:
        lines.append("")
        lines.append("Compile cache (the same settings, one group booted with a cold torch.compile cache and one "
                     "with a warm one; a cold cache has been reported to cost ~14% of KV tokens, so they are "
                     "not held against each other):")
        for nc in caches:
            (a, b), = nc["differing"].values()
            side = cmp.compile_cache_change(nc, report.groups, rows)
            lines.append(f"  {nc['groups'][0]} ({_v(a)}) vs {nc['groups'][1]} ({_v(b)})" + (f": {side}" if side else ""))
    others = [nc for nc in report.not_comparable if not nc["vllm_change_only"] and not nc.get("compile_cache_only")]
    if others:
        lines.append("")
        lines.append("Not comparable (they differ in more than gmu; no ratio is given):")
        for nc in others:
            diffs = "; ".join(f"{k} {_v(a)} vs {_v(b)}" for k, (a, b) in nc["differing"].items())
            lines.append(f"  {nc['groups'][0]} vs {nc['groups'][1]}: {diffs}")
    if report.version_changes:
        lines.append("")
        lines.append("vLLM changes (same command, another vLLM version):")
        for vc in report.version_changes:
            again = f" ({labels[vc.newer]} reproduces {labels[vc.older]})" if vc.reproduces else ""
            lines.append(f"  {labels[vc.older]} -> {labels[vc.newer]}{again}: {vc.text}")
    elif any(nc["vllm_change_only"] for nc in report.not_comparable):
        lines.append("")
        lines.append("vLLM changes: the groups differ only in the vLLM version, but no command was run on both "
                     "(`autotune reproduce RUN` runs one again)")
    return "\n".join(lines)


PROVED = {"refused_above": "a boot one step above refused", "own_pool": "its own pool holds no step more",
          "max_boots": "--max-boots ended the search"}


def longest_lines(runs: list[run_row.Row], labels: dict[str, str]) -> list[str]:
    """Each run whose pool shrank as the length grew: vLLM's own figure beside the verified maximum,
    the gap, how the top was proved, the slope and its causes, the boots (run.json result.longest)."""
    from autotune.analysis import longest

    shown = [r for r in runs if r.longest_proved_by is not None]
    if not shown:
        return []
    lines = ["", "Longest length that boots (the pool shrinks as --max-model-len grows, so vLLM's own figure "
                 "lands below it):"]
    for r in shown:
        said = (f"vLLM's {'auto fits' if r.vllm_figure_from == 'auto' else 'estimate was'} {r.vllm_figure:,}; "
                if r.vllm_figure is not None else "")
        gap = f": {r.gap_pct:+.1f} %" if r.gap_pct is not None else ""
        slope = (f"; the pool loses {r.length_slope:.3f} tokens per token of length"
                 if r.length_slope is not None else "")
        why = longest.describe_causes(r.length_slope_causes)
        plural = "" if r.longest_boots == 1 else "s"
        lines.append(f"  {labels[r.run_id]} {said}this command serves {r.ceiling:,}{gap} "
                     f"({PROVED.get(r.longest_proved_by, r.longest_proved_by)}; {r.longest_boots} boot{plural}){slope}"
                     + (f": {why}" if why else ""))
    return lines


def _v(value) -> str:
    return "(not set)" if value is None else str(value)


def _write_plot(report: cmp.Report, path: Path) -> Path:
    from autotune.analysis import plot

    try:
        return plot.write_plot(report, path)
    except plot.PlotUnavailable as exc:
        raise click.ClickException(str(exc)) from None


@click.command("compare")
@click.argument("runs", nargs=-1)
@runs_dir_option
@click.option("--json", "json_", is_flag=True, help="Print the comparison as JSON (rows, groups, fits, verdicts).")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write a PNG of available KV GiB and the ceiling against gmu (needs matplotlib).")
@click.option("--device-memory", type=MemoryType(),
              help="The memory vLLM multiplies gmu by (a GPU's total, 24GiB), for runs whose records cannot say "
                   "(no NVML where they ran); a run that recorded its own keeps it.")
def compare_cmd(runs, runs_dir, json_, plot, device_memory):
    """Compare runs honestly: settings first, then the change they do not explain.

    \b
    RUN is a run folder, a run id, `latest`, a sweep folder, or a folder of runs (all of
    them). Without RUN, every run under --runs-dir.

    \b
    Runs are grouped by what makes them comparable: same model, same GPU (model and
    memory), same vLLM version, same settings other than --gpu-memory-utilization (gmu),
    and the same torch.compile cache where the log shows one (a cold cache, which compiles,
    has been reported to cost ~14% of KV tokens against a warm one, which loads).
    Inside a group with two or more gmu values the line
        available KV GiB = a x gmu - b
    is fitted by least squares (a ~ usable device memory, b ~ weights + fixed overhead), and
    each run gets a verdict against the previous run of its group (a reproduce against the
    run it reproduces):
        explained by gmu (expected Δ X GiB, observed Δ Y GiB)
        unexplained Δ Z GiB
    The expected change is the change of the budget vLLM computes, device memory x gmu
    (the GPU's total memory, or the CPU node's memory vLLM printed, which a VM can change
    between runs, or --device-memory for runs that do not know it); without a known device
    memory, the fitted slope from 3 runs on. The tolerance is the
    larger of 0.02 GiB and 5% of the figure (vLLM boots differ by up to ~5%), or 3 robust
    standard deviations of the runs around the line when 3 or more runs show more spread.
    A group that differs in anything else is listed as not comparable with its nearest
    earlier group, with the keys named; the same command on two vLLM versions, and a
    reproduce on another vLLM, is reported as a vLLM change. Runs of a fleet (`autotune
    fleet run`) of one GPU model, vLLM, settings and gmu on several nodes are checked node
    against node: a node whose available KV differs from its peers' beyond the same
    tolerance is flagged (a sick GPU, another process holding memory). Where a run's KV pool
    shrank as --max-model-len grew (vLLM's CPU backend sized by gmu, chunked prefill off),
    "Longest length that boots" puts vLLM's own figure (its refusal's estimate, or auto's
    fit) beside the verified maximum, with the gap, how the top was proved, the slope and its
    cause, and the boots it cost. Time and memory grow linearly with the runs (10,000 runs:
    seconds).

    \b
    Examples:
      autotune compare runs/                         every run in the folder
      autotune compare latest RUN_ID --json
      autotune compare runs/<sweep> --plot kv.png
      autotune compare runs/ --device-memory 24GiB   runs recorded where NVML could not say

    \b
    A run.json that cannot be read in a folder of runs is skipped with a warning on
    stderr naming it, and the others are compared.

    \b
    Exit codes: 0 compared; 1 a run named could not be found or read, or the plot could not be written.
    """
    records = load_records(runs, runs_dir)
    report = cmp.compare(records, device_memory)
    nodes = node_outliers.check(records)  # fleet runs: a node unlike its peers of the same GPU model
    if plot:
        written = _write_plot(report, plot)
        click.echo(f"wrote {written}", err=True)
    if json_:
        click.echo(json.dumps({**report.to_dict(), **({"nodes": [c.to_dict() for c in nodes]} if nodes else {})},
                              indent=2, ensure_ascii=False))
    else:
        echo_report(report)
        if nodes:
            click.echo("\n".join(node_outliers.render(nodes)))


COMMANDS = [compare_cmd]
