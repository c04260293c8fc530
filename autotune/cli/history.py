"""Commands over recorded runs: compare, predict, sweep, reproduce (wiring and rendering only).

The decisions (grouping, fits, verdicts, predictions, exit codes) live in compare.py.
Results go to stdout; progress and warnings to stderr.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

import click

from autotune.store import artifact
from autotune.analysis import compare as cmp
from autotune.vllm import servecmd
from autotune.run import sweep as sweep_mod
from autotune.cli.main import LengthType, ProgressPrinter, _fmt, _runs_dir_option, boot_options

SWEEP_FILE = sweep_mod.SWEEP_FILE
EXIT_POINT_FAILED = 3


# ---- finding and loading runs --------------------------------------------------------------------

def _run_dirs(ref: str, runs_dir: Path) -> list[Path]:
    """The run folders a RUN argument names: a run (folder, id, latest), a sweep, or a folder of runs."""
    if ref == "latest":
        return [artifact.resolve_run(ref, runs_dir)]
    for path in (Path(ref), Path(runs_dir) / ref):
        if (path / artifact.RUN_FILE).exists():
            return [path]
        if (path / SWEEP_FILE).exists():
            sweep = sweep_mod.load(path)
            return [path.parent / p["run_id"] for p in sweep.get("points", []) if p.get("run_id")]
    path = Path(ref)
    if path.is_dir():
        found = artifact.list_runs(path)
        if not found:
            raise artifact.ArtifactError(f"{path}: no run folders (with {artifact.RUN_FILE}) in it")
        return list(reversed(found))
    raise artifact.ArtifactError(f"no run {ref!r}: not a run folder, a run id under {runs_dir}, a sweep, "
                                 f"a folder of runs, or `latest`")


def load_records(refs: tuple[str, ...], runs_dir: Path) -> list[dict]:
    try:
        dirs = [d for ref in refs for d in _run_dirs(ref, runs_dir)] if refs else list(reversed(artifact.list_runs(runs_dir)))
        if not dirs:
            raise artifact.ArtifactError(f"no runs under {runs_dir}; name runs or a folder of runs")
        return [artifact.load_run(d) for d in dirs]
    except artifact.ArtifactError as exc:
        raise click.ClickException(str(exc))


# ---- rendering -----------------------------------------------------------------------------------

def _table(header: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    out = []
    for row in [header, *rows]:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        out.append("  ".join(cells).rstrip())
    return out


def _gib(value, places: int = 2) -> str:
    return "-" if value is None else f"{value:.{places}f}"


def _n(value) -> str:
    return "-" if value is None else _fmt(value)


def _short_device(device: str) -> str:
    return device.replace("NVIDIA GeForce ", "").replace("NVIDIA ", "")


def _model_name(model: str | None) -> str:
    return (model or "?").rstrip("/").split("/")[-1]


def _labels(report: cmp.Report) -> dict[str, str]:
    """Short names for the runs (#1, #2, ... in table order), so verdict lines stay readable."""
    return {r.run_id: f"#{i}" for i, r in enumerate(report.runs, 1)}


def render_runs_table(report: cmp.Report) -> list[str]:
    group_of = {rid: g.group_id for g in report.groups for rid in g.run_ids}
    labels = _labels(report)
    notes: dict[str, str] = {}
    rows = []
    for r in report.runs:
        gmu = "?" if r.gmu is None else f"{r.gmu:g}"
        if r.gmu_source != "flag":
            mark = notes.setdefault(r.gmu_source, "*" * (len(notes) + 1))
            gmu += mark
        if not r.gmu_sets_kv:
            mark = notes.setdefault(f"gmu does not size the KV cache: {r.gmu_note}", "+" * (sum(
                1 for k in notes if k.startswith("gmu does not")) + 1))
            gmu += mark
        date = (r.started_at or "")[:16].replace("T", " ")
        rows.append([labels[r.run_id], r.run_id, date, r.vllm_version or "?", _short_device(r.device), _model_name(r.model), gmu,
                     r.max_num_seqs or "-", r.max_num_batched_tokens or "-", r.kv_cache_dtype or "-",
                     _gib(r.weights_gib), _gib(r.available_kv_gib), _n(r.kv_cache_tokens),
                     _n(r.ceiling) if r.ceiling is not None or r.verdict == "verified" else (r.verdict or "-"), group_of.get(r.run_id, "-")])
    header = ["", "run", "date (UTC)", "vLLM", "GPU", "model", "gmu", "max-num-seqs", "max-num-batched-tokens",
              "kv-cache-dtype", "weights GiB", "available KV GiB", "KV tokens", "verified ceiling", "group"]
    lines = _table(header, rows, right={0, 6, 7, 8, 10, 11, 12, 13})
    for text, mark in notes.items():
        lines.append(f"  {mark} {text if text.startswith('gmu does not') else 'gmu not on the command line: ' + text}")
    return lines


def _describe_group(group: cmp.Group, rows: dict[str, cmp.Row]) -> str:
    first = rows[group.run_ids[0]]
    settings = " ".join(f"{k} {v}" if v != "true" else k for k, v in first.settings.items())
    return (f"{_model_name(first.model)} on {_short_device(first.device)}, vLLM {first.vllm_version or '?'}"
            + (f"; {settings}" if settings else ""))


def render_group(group: cmp.Group, rows: dict[str, cmp.Row], labels: dict[str, str],
                 all_pairs: bool = False) -> list[str]:
    n = len(group.run_ids)
    members = " ".join(labels[i] for i in group.run_ids)
    lines = [f"{group.group_id} ({members}): {_describe_group(group, rows)}"]
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


def render_report(report: cmp.Report) -> str:
    rows = {r.run_id: r for r in report.runs}
    labels = _labels(report)
    lines = render_runs_table(report)
    for group in report.groups:
        lines.append("")
        lines.extend(render_group(group, rows, labels))
    others = [nc for nc in report.not_comparable if not nc["vllm_change_only"]]
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
            lines.append(f"  {labels[vc.older]} -> {labels[vc.newer]}: {vc.text}")
    elif any(nc["vllm_change_only"] for nc in report.not_comparable):
        lines.append("")
        lines.append("vLLM changes: the groups differ only in the vLLM version, but no command was run on both "
                     "(`autotune reproduce RUN` runs one again)")
    return "\n".join(lines)


def _v(value) -> str:
    return "(not set)" if value is None else str(value)


def _write_plot(report: cmp.Report, path: Path) -> Path:
    from autotune.analysis import plot

    try:
        return plot.write_plot(report, path)
    except plot.PlotUnavailable as exc:
        raise click.ClickException(str(exc))


# ---- compare -----------------------------------------------------------------------------------------

@click.command("compare")
@click.argument("runs", nargs=-1)
@_runs_dir_option
@click.option("--json", "json_", is_flag=True, help="Print the comparison as JSON (rows, groups, fits, verdicts).")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write a PNG of available KV GiB and the ceiling against gmu (needs matplotlib).")
def compare_cmd(runs, runs_dir, json_, plot):
    """Compare runs honestly: settings first, then the change they do not explain.

    \b
    RUN is a run folder, a run id, `latest`, a sweep folder, or a folder of runs (all of
    them). Without RUN, every run under --runs-dir.

    \b
    Runs are grouped by what makes them comparable: same model, same GPU (model and
    memory), same vLLM version, same settings other than --gpu-memory-utilization (gmu).
    Inside a group with two or more gmu values the line
        available KV GiB = a x gmu - b
    is fitted by least squares (a ~ usable device memory, b ~ weights + fixed overhead), and
    every pair of runs gets a verdict:
        explained by gmu (expected Δ X GiB, observed Δ Y GiB)
        unexplained Δ Z GiB
    The expected change is the change of the budget vLLM computes, device memory x gmu
    (the GPU's total memory, or the CPU node's memory vLLM printed, which a VM can change
    between runs); without a known device memory, the fitted slope from 3 runs on. The tolerance is the
    larger of 0.02 GiB and 5% of the figure (vLLM boots differ by up to ~5%), or 3 robust
    standard deviations of the runs around the line when 3 or more runs show more spread.
    Groups that differ in anything else are listed as not comparable, with the keys named;
    the same command on two vLLM versions is reported as a vLLM change.

    \b
    Examples:
      autotune compare runs/                    every run in the folder
      autotune compare latest RUN_ID --json
      autotune compare runs/<sweep> --plot kv.png

    \b
    Exit codes: 0 compared; 1 a run could not be found or read, or the plot could not be written.
    """
    records = load_records(runs, runs_dir)
    report = cmp.compare(records)
    if plot:
        written = _write_plot(report, plot)
        click.echo(f"wrote {written}", err=True)
    if json_:
        click.echo(json.dumps(report.to_json(), indent=2, ensure_ascii=False))
    else:
        click.echo(render_report(report))


# ---- predict -----------------------------------------------------------------------------------------

@click.command("predict")
@click.argument("runs", nargs=-1)
@click.option("--gmu", type=click.FloatRange(min=0, max=1, min_open=True), required=True,
              help="The --gpu-memory-utilization to predict for.")
@click.option("--max-num-seqs", type=click.IntRange(min=1),
              help="Use only runs with this --max-num-seqs (it changes the fixed overhead, so it is not "
                   "predicted across).")
@_runs_dir_option
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
        click.echo(f"{group.group_id} ({_describe_group(group, rows)}) at gmu {gmu:g}:")
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


# ---- sweep -----------------------------------------------------------------------------------------

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


@click.command("sweep", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--gmu", "gmu_values", type=GmuListType(), required=True,
              help="The --gpu-memory-utilization values, comma-separated (0.90,0.94,0.98).")
@click.option("--target", "-t", type=LengthType(), required=True,
              help="The context length to try at each value (65536, 64K = 65536, 64k = 64000).")
@click.option("--strategy", type=click.Choice(["refusal", "auto"]), default="refusal", show_default=True,
              help="refusal: boot the prediction (or the target), relaunch at vLLM's ceiling when refused; "
                   "the sweep's predictions save boots only on this path. auto: vLLM's --max-model-len auto "
                   "(one boot per value where vLLM supports it; predictions are not used).")
@boot_options("Give up on one value after this many boots.")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the PNG here (default: sweep.png in the sweep folder, when matplotlib is installed).")
@click.option("--json", "json_", is_flag=True, help="Print the sweep record and the comparison as JSON.")
@click.option("--quiet", "-q", is_flag=True, help="No progress lines; only the result and errors.")
@_runs_dir_option
@click.argument("serve_command", nargs=-1, type=click.UNPROCESSED)
def sweep_cmd(gmu_values, target, strategy, gpu, force, allow_risky_gmu, stall_timeout, max_boots, plot, json_, quiet,
              runs_dir, serve_command):
    """Tune SERVE_COMMAND at several --gpu-memory-utilization values and fit the line.

    \b
    One tune per value (its --gpu-memory-utilization replaced), one run folder each, and
    runs/<UTC time>-sweep-<model>/sweep.json linking them, then the `compare` table with
    the fit and the verdicts. Made for overnight use: a value that fails does not stop
    the others.

    \b
    Boots: on the refusal path a value costs 2 boots (the target is refused, vLLM's
    ceiling verifies). Once a value is measured, the next one's ceiling is predicted
    (from the device memory x gmu budget after one value, from the least-squares fit after
    two) and booted first: if it verifies within 1% of the KV pool, that value took one
    boot; if it is too high, vLLM refuses it and its estimate takes over (two boots, as
    without a prediction). The output says which boots were saved. The default strategy
    is refusal so that the predictions matter; --strategy auto lets vLLM fit each value.

    \b
    Example:
      autotune sweep --gmu 0.90,0.94,0.98 --target 128K -- vllm serve MODEL --max-num-seqs 1

    \b
    Exit codes: 0 every value verified; 3 one or more did not, or a preflight check refused
    one (the table says which); 1 bad input; 130/143 interrupted (the sweep record says how
    far it got; `autotune resume SWEEP` continues it without repeating finished values).
    """
    argv = list(serve_command)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise click.ClickException("no serve command: give it after `--`, e.g.\n"
                                   "  autotune sweep --gmu 0.90,0.94 --target 64K -- vllm serve MODEL")
    if servecmd.has_flag(argv, "--kv-cache-memory-bytes"):
        raise click.ClickException("the serve command fixes the KV pool with --kv-cache-memory-bytes, so "
                                   "--gpu-memory-utilization does not change it: remove that flag to sweep gmu")
    if os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        click.echo("Warning: VLLM_CPU_KVCACHE_SPACE is set: on vLLM's CPU backend it fixes the KV pool and "
                   "gmu will not change it", err=True)
    opts = sweep_mod.SweepOptions(gmu_values=gmu_values, target=target, strategy=strategy, gpu=gpu, force=force,
                                  allow_risky_gmu=allow_risky_gmu, stall_timeout_s=stall_timeout,
                                  max_boots=max_boots, plot=str(plot) if plot else None)
    try:
        sweep_dir, sweep = sweep_mod.create(runs_dir, argv, opts)
    except (OSError, artifact.ArtifactError) as exc:
        raise click.ClickException(f"cannot create the sweep folder under {runs_dir}: {exc}")
    say = sayer(quiet)
    say(f"sweep {sweep_dir}: gmu {', '.join(f'{g:g}' for g in gmu_values)}; target {target:,}; "
        f"strategy {strategy}")
    run_sweep(lambda progress: sweep_mod.run(sweep_dir, sweep, runs_dir, progress, say, warn),
              sweep_dir, json_, quiet)


def sayer(quiet: bool):
    return (lambda text: None) if quiet else (lambda text: click.echo(text, err=True))


def warn(text: str) -> None:
    click.echo(text, err=True)


def run_sweep(go, sweep_dir: Path, json_: bool, quiet: bool) -> None:
    """Run (or resume) a sweep with go(progress), print its result, exit with its code."""
    from autotune.run import tune as tune_mod

    progress = ProgressPrinter(quiet=quiet)
    try:
        sweep, records, report = go(progress)
    except tune_mod.Interrupted as exc:
        progress.close()
        sweep = sweep_mod.load(sweep_dir)
        click.echo(f"interrupted ({exc}); the server was stopped; {sweep_dir / sweep_mod.SWEEP_FILE} keeps the "
                   f"{len(sweep['points'])} finished value(s); `autotune resume {sweep_dir.name}` continues",
                   err=True)
        sys.exit(128 + exc.signum)
    except (ValueError, artifact.ArtifactError) as exc:  # a bad --gpu selector, an unwritable runs dir
        raise click.ClickException(str(exc))
    finally:
        progress.close()
    if json_:
        click.echo(json.dumps({"sweep": sweep, "compare": report.to_json()}, indent=2, ensure_ascii=False))
    else:
        click.echo(render_sweep(sweep, sweep_dir))
        if report.runs:
            click.echo("")
            click.echo(render_report(report))
    all_verified = all(p["verdict"] == "verified" for p in sweep["points"])
    sys.exit(0 if all_verified else EXIT_POINT_FAILED)


def render_sweep(sweep: dict, sweep_dir: Path) -> str:
    lines = [f"Sweep {sweep['sweep_id']}: gmu {', '.join(f'{g:g}' for g in sweep['gmu_values'])}; "
             f"target {sweep['target']:,}; strategy {sweep['strategy']}"]
    for p in sweep["points"]:
        result = f"ceiling {p['ceiling']:,}" if p.get("ceiling") else f"{p['verdict']}"
        run = f" ({p['run_id']})" if p.get("run_id") else ""
        lines.append(f"  gmu {p['gmu']:g}: {result} in {p['boots']} boot{'s' if p['boots'] != 1 else ''}"
                     f"{run}: {p['note']}")
    cut_short = f" ({sweep['boots_interrupted']} cut short by an interruption)" if sweep.get("boots_interrupted") else ""
    lines.append(f"  boots: {sweep['boots_used']} used{cut_short}; {sweep['boots_without_predictions']} without "
                 f"predictions (2K = {sweep['boots_2k']}); saved {sweep['boots_saved']}")
    if sweep.get("plot"):
        lines.append(f"  plot: {sweep['plot']}")
    lines.append(f"  record: {sweep_dir / SWEEP_FILE}")
    return "\n".join(lines)


# ---- reproduce ---------------------------------------------------------------------------------------

@click.command("reproduce")
@click.argument("run")
@_runs_dir_option
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

    try:
        old = artifact.load_run(artifact.resolve_run(run, runs_dir))
    except artifact.ArtifactError as exc:
        raise click.ClickException(str(exc))
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
    try:
        new = tune_mod.tune(opts, ProgressPrinter(quiet=quiet))
    except tune_mod.Interrupted as exc:
        click.echo(f"interrupted ({exc}); the server was stopped and the run marked interrupted", err=True)
        sys.exit(128 + exc.signum)
    except tune_mod.PreflightFailed as exc:
        click.echo("Error: not relaunched: a preflight check says the recorded configuration cannot work here now",
                   err=True)
        for problem in exc.problems:
            click.echo(problem.render(), err=True)
        sys.exit(cmp.EXIT_ERROR)
    except artifact.ArtifactError as exc:
        raise click.ClickException(str(exc))
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
        rows.append(["device memory GiB", _n(v.device_memory_gib[0]), _n(v.device_memory_gib[1]), "", "", ""])
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
            rows.append([what, _n(pair[0]), _n(pair[1]), "", "", ""])
    rows.append(["attention backend", v.attention_backend[0] or "-", v.attention_backend[1] or "-", "", "",
                 "same" if v.attention_backend[0] == v.attention_backend[1] else "changed"])
    lines.extend("  " + line for line in _table(["", "before", "after", "Δ", "expected Δ", ""], rows,
                                                right={1, 2, 3, 4}))
    if v.flags_no_longer_shown:
        lines.append(f"  no longer in vLLM's non-default args: {', '.join(v.flags_no_longer_shown)}")
    else:
        lines.append("  non-default args: every flag vLLM listed before is still listed")
    lines.append(f"  exit code {v.exit_code}")
    return "\n".join(lines)


COMMANDS = [compare_cmd, predict_cmd, sweep_cmd, reproduce_cmd]
