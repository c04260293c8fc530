"""Commands that read the runs folder: `autotune show RUN` and `autotune runs` (wiring and rendering).

Results go to stdout; warnings (an unreadable run) to stderr.
"""

from __future__ import annotations

import json

import click

from autotune import export
from autotune.cli.card import echo_card
from autotune.cli.options import runs_dir_option
from autotune.cli.records import load_one
from autotune.cli.tables import echo_table, on_terminal
from autotune.cli.verify import render as render_verification
from autotune.export import skypilot, startup
from autotune.export.verified import NotEmittable
from autotune.run import deployed
from autotune.run import warnings as run_warnings
from autotune.server import kept
from autotune.store import artifact, latest, redact, walk
from autotune.store.outcomes import Verdict
from autotune.store.record import Result, RunRecord


@click.command("show")
@click.argument("run", default="latest")
@runs_dir_option
@click.option("--json", "json_", is_flag=True, help="Print the run record (run.json) as stored, its warnings included (a run "
                   "written before autotune recorded them gets those its card shows).")
@click.option("--emit", "emit_kind", type=click.Choice(list(export.KINDS)),
              help="Print one paste-ready file of the run instead: command (command.sh), "
                   "yaml (vllm-config.yaml), compose (docker-compose.yml), systemd (vllm.service); "
                   "helm (production-stack values), ray-serve (Ray Serve LLM config), rayservice "
                   "(KubeRay), kserve (InferenceService, KServe's vLLM runtime), llmisvc (KServe "
                   "LLMInferenceService), k8s (Deployment and Service), skypilot (task); report (the sizing "
                   "report, Markdown); recipe (a vllm-project/recipes hardware override for the GPU).")
@click.option("--pull-bandwidth", "pull_bandwidth", metavar="RATE",
              help="How fast a new node downloads the weights (100MB/s, 1GB/s, 10Gbit/s; a bare number is MB/s): "
                   "the Kubernetes files' startup allowance counts the download at this rate "
                   "[default: 100MB/s].")
@click.option("--infra", metavar="WHERE",
              help="Where the SkyPilot task launches (with --emit skypilot), in SkyPilot 0.14's form: "
                   "cloud[/region[/zone]] (aws, gcp/us-central1), k8s[/context], * for any.")
def show(run, runs_dir, json_, emit_kind, pull_bandwidth, infra):
    """Print one run's summary (RUN: a run folder, a run id, or `latest`, the default:
    the newest run that booted vLLM, a lever run standing for its search).

    \b
    The summary is the card `autotune tune` prints at the end: the verified ceiling
    against the target, the KV cache figures with the log line each was read from,
    the boots and their time, warnings with cause and remedy, and the files written.
    --emit prints one of the run's paste-ready files, for example
      autotune show latest --emit compose > docker-compose.yml
      autotune show latest --emit helm > values.yaml
    Each carries every setting that sized the KV pool, pins the vLLM version that
    verified it, takes secrets by reference and is stamped with the run.

    \b
    Exit codes: 0 printed; 1 no such run, an unreadable run.json, or a file this
    run cannot give (it was not verified, or its command is not plain vLLM).
    """
    if json_ and emit_kind:
        raise click.UsageError("--json and --emit print different things: choose one")
    pull_mb_s = None
    if pull_bandwidth is not None:
        try:
            pull_mb_s = startup.parse_bandwidth(pull_bandwidth)
        except startup.BadBandwidth as exc:
            raise click.BadParameter(str(exc), param_hint="--pull-bandwidth") from None
    if infra is not None:
        if emit_kind != "skypilot":
            raise click.UsageError("--infra says where SkyPilot launches: use it with --emit skypilot")
        try:
            infra = skypilot.parse_infra(infra)
        except skypilot.BadInfra as exc:
            raise click.BadParameter(str(exc), param_hint="--infra") from None
    if run == latest.LATEST:
        try:
            found, notes = latest.shown(runs_dir)  # a lever run stands for its search; newer verifications named
        except artifact.ArtifactError as exc:
            raise click.ClickException(str(exc)) from None
        for note in notes:
            click.echo(note, err=True)
        run = str(found)
    folder, run_record = load_one(run, runs_dir)
    # What is printed and rendered into the paste-ready files: a record written before autotune
    # scrubbed secrets is masked when read (redact.py); a kept server's entry says whether it
    # still runs (kept.py).
    scrubbed = redact.record_scrubber(run_record).obj(run_record.to_dict())
    shown = kept.note_serving(RunRecord.from_dict(scrubbed), folder)
    if json_:
        shown.warnings = run_warnings.of(shown)  # a run from before they were recorded: those its card shows
        click.echo(json.dumps(shown.to_dict(), indent=2, ensure_ascii=False))
        return
    if emit_kind:
        try:
            click.echo(export.render(shown, export.KINDS[emit_kind], run_dir=folder, pull_mb_s=pull_mb_s,
                                   infra=infra), nl=False)
        except NotEmittable as exc:
            raise click.ClickException(f"{export.KINDS[emit_kind]}: {exc}") from None
        return
    if run_record.kind == deployed.KIND:
        click.echo(render_verification(run_record))
        return
    echo_card(run_record, run_dir=folder)
    for check in deployed.verifications_of(folder.parent, run_record.run_id):
        click.echo(f"  {deployed.deployed_line(check)}")


# The columns of `autotune runs`: (header, key in the row, right-aligned).
RUN_COLUMNS = (("RUN", "run_id", False), ("STARTED (UTC)", "started", False), ("MODEL", "model", False),
               ("TARGET", "target", True), ("CEILING", "ceiling", True), ("VERDICT", "verdict", False),
               ("BOOTS", "boots", True), ("VLLM", "vllm_version", False))


def run_row(record: RunRecord) -> dict:
    """One line of `autotune runs` from a run record (pure)."""
    result = record.result if isinstance(record.result, Result) else Result()
    started = record.started_at or ""
    reproduces = (record.links or {}).get("reproduces")
    where = deployed.found_at(record) if record.kind == deployed.KIND else None
    return {
        "run_id": record.run_id,
        "kind": record.kind or "tune",
        "started_at": started or None,
        "started": started[:16].replace("T", " ") if started else "?",
        "model": record.model,
        "target": record.target,
        "ceiling": result.ceiling,
        "verdict": _verdict(record, result) + (f"; reproduces {reproduces}" if reproduces else "")
        + (f"; {where}" + (f", verifies {record.link('verifies')}" if record.link("verifies") else "")
           if where else ""),
        "reproduces": reproduces,
        "verifies": record.link("verifies") if record.kind == deployed.KIND else None,
        "boots": len(record.attempts or []),
        "vllm_version": record.vllm_version or record.vllm_version_detected,  # the latter: printed as it started
        "available_kv_gib": result.available_kv_gib,
        "kv_cache_tokens": result.kv_cache_tokens,
    }


def _verdict(record: RunRecord, result: Result) -> str:
    verdict = result.verdict or record.state or "?"
    if record.state == "interrupted" and record.link("tried_again_as"):
        return f"{verdict}; its fleet leaf ran again: {record.link('tried_again_as')}"
    if record.state == "interrupted" and verdict != Verdict.INTERRUPTED:
        return f"{verdict}; levers interrupted" if record.phase == "reach" else f"{verdict}; interrupted"
    if record.state == "running" and result.verdict:
        return f"{verdict}; levers running" if record.phase == "reach" else verdict
    return verdict


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def _cells(row: dict) -> list[str] | str:
    """A run's cells, or the line that says it cannot be read."""
    if "error" in row:
        return f"{row['run_id']}  (unreadable: {row['error']})"
    model = _cell(row.get("model"))
    if len(model) > 40:
        model = "…" + model[-39:]
    indent = "  " if "beside" in row else ""  # a check, indented under the run it verifies
    return [indent + _cell(row.get("run_id")), row.get("started") or "?", model] + [_cell(row.get(key))
                                                                           for _, key, _ in RUN_COLUMNS[3:]]


def render_runs(rows: list[dict]) -> str:
    """The runs table, one line a run, in the order given (pure)."""
    header = [h for h, _, _ in RUN_COLUMNS]
    table = [_cells(row) for row in rows]
    cells = [header] + [r for r in table if isinstance(r, list)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]

    def line(r: list[str]) -> str:
        return "  ".join(r[i].rjust(widths[i]) if RUN_COLUMNS[i][2] else r[i].ljust(widths[i])
                         for i in range(len(r))).rstrip()

    return "\n".join([line(header)] + [line(r) if isinstance(r, list) else r for r in table])


def checks_beside_their_runs(rows: list[dict]) -> list[dict]:
    """The rows newest first, but each verification of a listed run right under that run (marked
    beside): checks stay apart from the tunes between them (pure)."""
    runs = {row["run_id"] for row in rows if row.setdefault("verifies", None) is None}
    under: dict[str, list[dict]] = {run_id: [] for run_id in runs}
    placed = []
    for row in rows:
        if row["verifies"] in runs:
            under[row["verifies"]].append({**row, "beside": True})
        else:
            placed.append(row)
    return [r for row in placed for r in (row, *under.setdefault(row["run_id"], []))]


@click.command("runs")
@runs_dir_option
@click.option("--json", "json_", is_flag=True, help="Print the list as JSON (one object per run).")
@click.option("--limit", "-n", type=click.IntRange(min=1), help="Only the N newest runs.")
def runs(runs_dir, json_, limit):
    """List the runs in --runs-dir, newest first, one line each.

    \b
    Columns: run id, start time (UTC), model, target, verified ceiling, verdict
    (or the state of a run that has none: running, interrupted; "; serving" while
    the server --keep-serving kept runs), boots, vLLM version. A check of a deployment
    (`autotune verify`, its folder named TIME-check-MODEL) is listed indented under the
    run it verifies, whatever its date. Show one with
    `autotune show RUN`; compare several with `autotune compare`.

    \b
    Exit codes: 0 listed (also when there are none); a run.json that cannot be read is
    listed as unreadable, with the reason, and does not stop the listing.
    """
    rows = []
    listed = walk.runs(runs_dir, lambda bad: rows.append({"run_id": bad.folder.name, "path": str(bad.folder),
                                                          "error": bad.reason}), limit=limit or None)
    for folder, record in listed:  # an unreadable run is listed, in its place, as unreadable
        row = {**run_row(record), "path": str(folder)}
        serving = kept.serving(folder)  # a server --keep-serving handed over, still running
        if serving:
            row.update(verdict=f"{row['verdict']}; serving", serving=serving)
        rows.append(row)
    rows = checks_beside_their_runs(rows)
    if json_:
        click.echo(json.dumps(rows, indent=2, ensure_ascii=False))
        return
    if not rows:
        click.echo(f"no runs under {runs_dir}", err=True)
        return
    if not on_terminal():
        click.echo(render_runs(rows))
        return
    cells = [_cells(row) for row in rows]
    echo_table([h for h, _, _ in RUN_COLUMNS], [c for c in cells if isinstance(c, list)],
               {i for i, (_, _, right) in enumerate(RUN_COLUMNS) if right})
    for line in (c for c in cells if isinstance(c, str)):
        click.echo(line)


COMMANDS = [show, runs]
