"""`autotune fleet`: many tunes at once, from a plan, on this node's GPUs or a Ray cluster.

    fleet plan PLAN.yaml      the leaves, without booting
    fleet run PLAN.yaml       run them (--on local | --on ray), then the table
    fleet resume [FLEET]      the leaves an interrupted fleet did not finish
    fleet show [FLEET]        the table of a fleet (--json)
    fleet render PLAN --k8s   a Kubernetes Indexed Job of the same leaves
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from autotune.cli.eta import command_key
from autotune.cli.exitcodes import ExitCode, exits
from autotune.cli.options import echo_err, runs_dir_option, written_runs_dir_option
from autotune.cli.tables import echo_table
from autotune.cli.terminal import is_tty
from autotune.events import Renderer
from autotune.fleet import collect, report
from autotune.fleet import plan as plan_mod
from autotune.fleet.errors import FleetError
from autotune.store import artifact, walk

INTERRUPTED_FLEET = ("every leaf's server was stopped and its run marked interrupted; "
                     "`autotune fleet resume` (or the same `fleet run`) does the rest")


def _plan(path: Path) -> tuple[plan_mod.FleetPlan, str]:
    try:
        return plan_mod.load(path), path.read_text(encoding="utf-8")
    except plan_mod.PlanError as exc:
        raise click.ClickException(f"{exc}\nNothing was booted.") from None


@click.group("fleet")
def fleet():
    """Tune many commands at once: every GPU of this node, or every node of a Ray cluster.

    \b
    A plan (YAML) names the serve command(s), the target and a grid of flags; every
    combination is one leaf, and each leaf is today's `autotune tune`, unchanged, pinned
    to its own GPUs, with its own run folder under runs/ (see docs/fleet.md):
      autotune fleet plan plan.yaml                 the leaves, nothing boots
      autotune fleet run plan.yaml --on local       this node: one leaf per free GPU set
      autotune fleet run plan.yaml --on ray --address auto
      autotune compare runs/<fleet folder>          the leaves side by side, by GPU and node
    """


@fleet.command("plan")
@click.argument("plan_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "json_", is_flag=True, help="Print the leaves as JSON.")
def plan_cmd(plan_file, json_):
    """List the leaves of PLAN_FILE without booting anything (a bad plan: exit 1, the line and key named)."""
    plan, _ = _plan(plan_file)
    if json_:
        click.echo(json.dumps({"name": plan.name, "digest": plan.digest,
                               "leaves": [leaf.to_dict() for leaf in plan.leaves]}, indent=2))
        return
    click.echo(f"plan {plan.name}: {len(plan.leaves)} leaves", err=True)
    echo_table(report.PLAN_HEADER, report.plan_rows(plan), right={2, 3})


def backend_options(f):
    options = [
        click.option("--on", "on", type=click.Choice(["local", "ray"]), default="local", show_default=True,
                     help="local: this node, one leaf per free set of gpus_per_leaf GPUs (never two on one GPU). "
                          "ray: each leaf a Ray actor with num_gpus = gpus_per_leaf, placed by the cluster."),
        click.option("--slots", type=click.IntRange(min=1),
                     help="How many leaves at once. local: at most GPUs / gpus_per_leaf, and required without "
                          "GPUs (the replaying vLLM, vLLM's CPU backend); ray without --address: the GPU slots "
                          "the local Ray instance declares."),
        click.option("--address", help="ray: the cluster to use (auto, or ray://HOST:PORT); without it autotune "
                                       "starts a local Ray instance for the fleet."),
        click.option("--results-uri", help="Also upload every leaf's run folder here from the node that ran it, "
                                           "whatever its verdict (fsspec: file://, s3://, gs://)."),
        click.option("--json", "json_", is_flag=True, help="Print the fleet as JSON instead of the table."),
        click.option("--quiet", "-q", is_flag=True, help="No progress; only the table and errors."),
        written_runs_dir_option,
    ]
    for option in reversed(options):
        f = option(f)
    return f


@fleet.command("run")
@click.argument("plan_file", type=click.Path(dir_okay=False, path_type=Path))
@backend_options
@click.option("--fresh", is_flag=True, help="Start a new fleet even when an unfinished one of this plan exists.")
def run_cmd(plan_file, on, slots, address, results_uri, json_, quiet, runs_dir, fresh):
    """Run every leaf of PLAN_FILE, as many at once as there are slots, then print the table.

    \b
    Running the same plan again continues its unfinished fleet: leaves with a result are
    skipped (--fresh starts anew). A leaf whose worker or node dies is tried again (3 tries
    at most, 2 s and 8 s apart, on another node where there is one); a refusal, an OOM or any
    vLLM failure is the leaf's result, never retried. Ctrl-C or SIGTERM stops every leaf's
    server tree on every node and marks those leaves interrupted.

    \b
    Exit codes: 0 every leaf verified; 1 bad plan or options (nothing boots); 3 a leaf did
    not verify or failed; 130/143 interrupted.
    """
    plan, text = _plan(plan_file)
    with exits(INTERRUPTED_FLEET):
        try:
            state, continued = collect.find_or_new(plan, text, runs_dir, on, fresh=fresh)
        except artifact.ArtifactError as exc:
            raise click.ClickException(str(exc)) from None
        if continued:
            echo_err(f"continuing fleet {state.fleet_id}, the unfinished fleet of this plan "
                     f"({collect.left_text(state)}; --fresh starts a new one)", quiet=quiet)
        collect.remember_options(state, on=on, slots=slots, address=address, results_uri=results_uri)
        _drive(plan, state, on, slots, address, results_uri, json_, quiet, runs_dir)


@fleet.command("resume")
@click.argument("fleet_ref", default="latest")
@backend_options
def resume_cmd(fleet_ref, on, slots, address, results_uri, json_, quiet, runs_dir):
    """Run the leaves FLEET did not finish, from the plan it recorded (FLEET: a fleet folder,
    its id, or `latest`, the default: the newest fleet with leaves left), on the backend, slots,
    address and results URI it last ran with unless given here."""
    folder = _fleet_folder(fleet_ref, runs_dir, unfinished=True)
    state = collect.load(folder)
    on, slots, address, results_uri = _recalled(state, on=on, slots=slots, address=address, results_uri=results_uri)
    text = state.data["plan"]["text"]
    try:
        plan = plan_mod.parse(text, state.data["plan"].get("path") or folder.name)
    except plan_mod.PlanError as exc:
        raise click.ClickException(str(exc)) from None
    if not state.todo():
        raise click.ClickException(f"fleet {folder.name} has no leaf left to run")
    with exits(INTERRUPTED_FLEET):
        try:
            state = collect.carry_on(state, on)
        except artifact.ArtifactError as exc:
            raise click.ClickException(str(exc)) from None
        collect.remember_options(state, on=on, slots=slots, address=address, results_uri=results_uri)
        echo_err(f"continuing fleet {state.fleet_id} ({collect.left_text(state)}; {collect.options_text(state)})",
                 quiet=quiet)
        _drive(plan, state, on, slots, address, results_uri, json_, quiet, runs_dir)


def _recalled(state, **given) -> tuple:
    """The options of `fleet resume`: each one given on the command line (or in the environment)
    as given, the others as the fleet last ran with them (collect.recalled_options)."""
    from click.core import ParameterSource

    ctx = click.get_current_context()
    named = {name for name in given if ctx.get_parameter_source(name) not in (None, ParameterSource.DEFAULT)}
    return collect.recalled_options(state, given, named)


@fleet.command("show")
@click.argument("fleet_ref", default="latest")
@runs_dir_option
@click.option("--json", "json_", is_flag=True, help="Print the fleet as JSON.")
def show_cmd(fleet_ref, runs_dir, json_):
    """The table of a fleet (FLEET: a fleet folder, its id, or `latest`)."""
    state = collect.load(_fleet_folder(fleet_ref, runs_dir))
    _echo_result(state, json_)


def _fleet_folder(ref: str, runs_dir: Path, unfinished: bool = False) -> Path:
    """The fleet FLEET names; `latest`: the newest fleet (with leaves left, when unfinished)."""
    fleets = collect.list_fleets(runs_dir)
    if ref == "latest":
        left = [f for f in fleets if not unfinished or _has_leaves_left(f)]
        if not left:
            raise click.ClickException(f"no fleet{' with leaves left' if fleets and unfinished else ''} "
                                       f"under {runs_dir}")
        return left[0]
    for candidate in (Path(ref), Path(runs_dir) / ref):
        if (candidate / collect.FLEET_FILE).is_file():
            return candidate
    raise click.ClickException(f"no fleet {ref!r} (a fleet folder, its id under {runs_dir}, or latest)")


def _has_leaves_left(folder: Path) -> bool:
    try:
        return bool(collect.load(folder).todo())
    except artifact.ArtifactError:
        return False


def _drive(plan, state, on, slots, address, results_uri, json_, quiet, runs_dir) -> None:
    from autotune.fleet import runner

    backend = _backend(plan, state, on, slots, address, results_uri)
    printer = FleetProgress(quiet=quiet, runs_dir=runs_dir, capacity=backend.capacity)
    try:
        runner.Driver(plan, state, backend, runs_dir, printer).run()
    finally:
        printer.close()
        backend.close()
    _echo_result(state, json_)
    ok = all(e["state"] == collect.FINISHED and e.get("verdict") == "verified" for e in state.data["leaves"])
    sys.exit(ExitCode.OK if ok else ExitCode.FAILED)


def _backend(plan, state, on, slots, address, results_uri):
    try:
        if on == "ray":
            from autotune.fleet.ray_backend import RayBackend

            return RayBackend(state.fleet_id, plan.leaves, address, slots, results_uri)
        if address:
            raise FleetError("--address is for --on ray")
        from autotune.fleet.local import LocalBackend
        from autotune.host.machine import gpu_facts

        return LocalBackend(state.folder / "leaves", plan.leaves, slots, gpu_facts()[0], results_uri, state.fleet_id)
    except FleetError as exc:
        state.data.update(state=collect.INTERRUPTED, error=str(exc))
        state.save()
        raise click.ClickException(f"{exc}\nNothing was booted.") from None


def _echo_result(state, json_: bool) -> None:
    if json_:
        click.echo(json.dumps(report.to_dict(state), indent=2))
        return
    echo_table(report.TABLE_HEADER, report.table_rows(state), right=report.TABLE_RIGHT)
    s = report.summary(state)
    click.echo(f"fleet {state.fleet_id}: {s['leaves']} leaves, {s['verified']} verified, "
               f"{s['finished'] - s['verified']} other results, {s['interrupted']} interrupted, {s['failed']} failed; "
               f"compare them: autotune compare {state.folder}", err=True)


class FleetProgress(Renderer):
    """The fleet's events on stderr: a line per start, result, retry; and the status (running per
    slot, done, failed, waiting, time left), redrawn in place on a terminal, every 30 s elsewhere."""

    def __init__(self, quiet: bool, runs_dir: Path, capacity: int):
        self.quiet = quiet
        self.runs_dir = Path(runs_dir)  # where the leaves' run folders land (--runs-dir)
        self.tty = is_tty(sys.stderr)
        self.capacity = capacity
        self.eta = report.Eta(_earlier_durations(runs_dir), command_key)
        self.last_status = 0.0
        self.drawn = False

    def __call__(self, event: str, **data) -> None:
        if not self.quiet:
            Renderer.__call__(self, event, **data)

    def on_message(self, event: str, message: str, level: str) -> None:
        self.say(f"Warning: {message}" if level == "warning" else message)

    def say(self, text: str) -> None:
        self._clear()
        click.echo(f"[{time.strftime('%H:%M:%S')}] {text}", err=True)

    def _clear(self) -> None:
        if self.drawn:
            click.echo("\r\033[K", nl=False, err=True)
            self.drawn = False

    def close(self) -> None:
        self._clear()

    def on_fleet_started(self, fleet_id, where, todo, skipped, capacity) -> None:
        skipped_text = f"; {skipped} finished earlier, skipped" if skipped else ""
        self.say(f"fleet {fleet_id}: {len(todo)} leaves to run{skipped_text}; on {where}")

    def on_leaf_started(self, leaf, try_no, node, gpu) -> None:
        again = f" (try {try_no})" if try_no > 1 else ""
        self.say(f"{leaf.id} started{again} on {report.node_text(node)} {report.gpu_text(gpu)}: {leaf.label()}")

    def on_leaf_finished(self, leaf, entry) -> None:
        if entry.get("duration_s"):
            self.eta.here.append(entry["duration_s"])
        ceiling = f" {entry['ceiling']:,}" if isinstance(entry.get("ceiling"), int) else ""
        what = entry.get("verdict") or ("error: " + (entry.get("error") or "?"))
        self.say(f"{leaf.id} {what}{ceiling} after {report.duration(entry.get('duration_s'))}, "
                 f"{entry.get('boots', 0)} boot(s): {self.runs_dir / entry['run_id'] if entry.get('run_id') else '-'}")

    def on_leaf_interrupted(self, leaf, entry) -> None:
        self.say(f"{leaf.id} interrupted: its server was stopped; run {entry.get('run_id') or '-'} marked interrupted")

    def on_leaf_retry(self, leaf, try_no, reason, delay_s, node) -> None:
        self.say(f"{leaf.id} try {try_no} lost to the infrastructure ({reason}) on {report.node_text(node)}; "
                 f"trying again in {delay_s:g} s")

    def on_leaf_failed(self, leaf, entry) -> None:
        self.say(f"{leaf.id} failed: {entry.get('error')}")

    def on_fleet_stopping(self, signal, running) -> None:
        self.say(f"{signal}: stopping {len(running)} running leaves ({', '.join(running) or 'none'}) and their servers")

    def on_warning(self, text) -> None:
        self.say(f"Warning: {text}")

    def on_fleet_reaped(self, count) -> None:
        self.say(f"stopped {count} server(s) left by killed leaves")

    def on_fleet_tick(self, running, waiting, done, failed) -> None:
        now = time.time()
        if not self.tty and now - self.last_status < 30:
            return
        self.last_status = now
        slots = ", ".join(f"{report.gpu_text(e['gpu']) if e.get('gpu') else 'placing'} {e['leaf'].id}" for e in running)
        left = self.eta.left_s(waiting, [(e["leaf"].argv, _age_s(e.get("started_at"))) for e in running],
                               self.capacity)
        eta = f" · ~{report.duration(left)} left" if left is not None else ""
        text = (f"running {len(running)} ({slots or '-'}) · done {done} · failed {failed} · "
                f"waiting {len(waiting)}{eta}")
        if self.tty:
            click.echo(f"\r\033[K{text[:200]}", nl=False, err=True)
            self.drawn = True
        else:
            click.echo(f"[{time.strftime('%H:%M:%S')}] {text}", err=True)


def _age_s(iso: str | None) -> float:
    from datetime import datetime

    if not iso:
        return 0.0
    try:
        return max(0.0, time.time() - datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp())
    except ValueError:
        return 0.0


def _earlier_durations(runs_dir: Path, limit: int = 200) -> dict[tuple, list[float]]:
    """Run durations by serve command, from the newest runs under runs_dir (the ETA's basis)."""
    out: dict[tuple, list[float]] = {}
    for _, record in walk.runs(runs_dir, walk.unnoticed, limit=limit):  # an estimate: an unreadable run is left out
        took = record.duration_s
        if record.state == "finished" and isinstance(took, (int, float)) and record.command:
            out.setdefault(command_key(record.command.argv), []).append(float(took))
    return out


@fleet.command("render")
@click.argument("plan_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--k8s", is_flag=True, required=True, help="Write a Kubernetes Indexed Job (one index per leaf).")
@click.option("--results-uri", help="Where each pod uploads its run folder (s3://, gs://); else --pvc.")
@click.option("--pvc", help="A PersistentVolumeClaim to mount as the pods' runs folder.")
@click.option("--namespace", default=None, help="The Job's namespace (default: none, kubectl's current).")
@click.option("--image", default=None, help="The image of every leaf (default: vllm/vllm-openai:v<version> of the leaf's vllm entry).")
@click.option("--autotune", "autotune_from", required=True, metavar="wheel:URL|configmap:NAME|image",
              help="How each pod gets autotune (it is on no package index): wheel:URL (a wheel's URL), "
                   "configmap:NAME (a ConfigMap holding the wheel), or image (--image has it).")
def render_cmd(plan_file, k8s, results_uri, pvc, namespace, image, autotune_from):
    """Write PLAN_FILE as a Kubernetes Indexed Job on stdout: one index per leaf, each pod runs the
    same `autotune tune` a user runs by hand. Nothing is applied (kubectl apply -f does that)."""
    from autotune.fleet import k8s as k8s_mod

    plan, _ = _plan(plan_file)
    try:
        source = k8s_mod.AutotuneSource(autotune_from)
        click.echo(k8s_mod.render(plan, source, results_uri=results_uri, pvc=pvc, namespace=namespace, image=image),
                   nl=False)
        loose = k8s_mod.unpinned(plan, image)
        if loose:
            click.echo(f"Warning: {', '.join(loose)} run {k8s_mod.IMAGE}:latest (not pinned): give them a vLLM "
                       "version in the plan or --image with a tag", err=True)
    except FleetError as exc:
        raise click.ClickException(str(exc)) from None


@fleet.command("upload")
@click.argument("runs_dir", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--results-uri", required=True, help="Where to copy them (fsspec: file://, s3://, gs://).")
@click.option("--fleet", "fleet_id", default="fleet", show_default=True, help="The first folder level under the URI.")
@click.option("--leaf", "leaf_id", default="leaf", show_default=True, help="The second folder level under the URI.")
def upload_cmd(runs_dir, results_uri, fleet_id, leaf_id):
    """Copy every run folder under RUNS_DIR to <URI>/<fleet>/<leaf>/<run id>/ (what each pod of
    `fleet render --k8s` runs after its tune, whatever the verdict)."""
    folders = artifact.list_runs(runs_dir)
    if not folders:
        raise click.ClickException(f"no run folder under {runs_dir}")
    for folder in folders:
        try:
            click.echo(collect.upload(folder, results_uri, fleet_id, leaf_id))
        except Exception as exc:  # noqa: BLE001 - fsspec's and the store's errors, said plainly
            raise click.ClickException(f"cannot upload {folder} to {results_uri}: {type(exc).__name__}: {exc}") from exc


COMMANDS = [fleet]
