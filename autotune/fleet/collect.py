"""Where a fleet is written: fleet.json in runs/<UTC time>-fleet-<plan name>/, and each leaf's run
folder moved into runs/ with a `fleet` section in its run.json (node, GPU, tries).

    FleetState     fleet.json: the plan's text, each leaf's state, run and tries
    find_or_new    the fleet of this plan to continue (same plan text, not finished), or a new one
    carry_on       continue a fleet (the one named by `fleet resume`)
    land           a try's run folder (a path, or the packed bytes a Ray worker sent) into runs/
    pack / unpack  a run folder as gzip'd tar bytes (small: logs and JSON)
    upload         a run folder to --results-uri (fsspec: file://, s3://, gs://)
"""

from __future__ import annotations

import io
import shutil
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from autotune.analysis.run_row import used_gpus
from autotune.fleet.leaf import LOG_NAME, LeafOutcome
from autotune.fleet.plan import FleetPlan
from autotune.server import leftovers
from autotune.store import artifact

FLEET_FILE = "fleet.json"
SCHEMA_VERSION = 1
# A leaf's state in fleet.json. finished: it has a result (any verdict, a vLLM failure included).
WAITING, RUNNING, FINISHED, INTERRUPTED, FAILED = "waiting", "running", "finished", "interrupted", "failed"


@dataclass
class FleetState:
    folder: Path
    data: dict = field(default_factory=dict)

    @property
    def fleet_id(self) -> str:
        return self.folder.name

    def leaf(self, key: str) -> dict:
        return next(entry for entry in self.data["leaves"] if entry["key"] == key)

    def todo(self) -> list[str]:
        """The keys of the leaves without a result, in plan order."""
        return [e["key"] for e in self.data["leaves"] if e["state"] != FINISHED]

    def save(self) -> None:
        self.data["schema_version"] = SCHEMA_VERSION
        artifact.write_json(self.folder / FLEET_FILE, self.data)


def list_fleets(runs_dir: Path) -> list[Path]:
    """Fleet folders under runs_dir, newest first."""
    if not Path(runs_dir).is_dir():
        return []
    return sorted((p for p in Path(runs_dir).iterdir() if (p / FLEET_FILE).is_file()), key=lambda p: p.name,
                  reverse=True)


def load(folder: Path) -> FleetState:
    path = Path(folder) / FLEET_FILE
    data = artifact.read_json(path)
    artifact.schema_version_of(data, str(path), SCHEMA_VERSION, "fleet")
    return FleetState(Path(folder), data)


def find_or_new(plan: FleetPlan, plan_text: str, runs_dir: Path, backend: str, fresh: bool = False) -> tuple[FleetState, bool]:
    """The newest fleet of this very plan that has leaves left (continued: its finished leaves are
    skipped), else a new one; (state, continued). A fleet whose driver still runs is refused."""
    if not fresh:
        for folder in list_fleets(runs_dir):
            state = load(folder)
            if state.data.get("plan", {}).get("digest") == plan.digest and state.todo():
                return carry_on(state, backend), True
    folder = artifact.create_run_dir(runs_dir, f"fleet-{plan.name}")  # <UTC time>-fleet-<plan name>, made unique
    state = FleetState(folder, {
        "fleet_id": folder.name, "plan": {"name": plan.name, "path": plan.path, "digest": plan.digest,
                                          "text": plan_text},
        "started_at": artifact.iso(artifact.utc_now()), "runs": [],
        "leaves": [{"id": leaf.id, "key": leaf.key, "label": leaf.label(), "state": WAITING, "run_id": None,
                    "tries": []} for leaf in plan.leaves]})
    return _begin(state, backend), False


def carry_on(state: FleetState, backend: str) -> FleetState:
    """This fleet, continued: refused while its driver still runs; a leaf a killed driver left
    running did not finish."""
    owner = state.data.get("owner") or {}
    if state.data.get("state") == RUNNING and leftovers.owner_alive(owner.get("pid"), owner.get("create_time")):
        raise artifact.ArtifactError(f"fleet {state.fleet_id} is running (autotune pid {owner.get('pid')}); "
                                     "wait for it, or stop it with Ctrl-C")
    for entry in state.data["leaves"]:
        if entry["state"] == RUNNING:  # its driver was killed: the leaf did not finish
            entry["state"] = INTERRUPTED
    return _begin(state, backend)


def left_text(state: FleetState) -> str:
    """"2 of 4 leaves left", for the line that names the fleet continued."""
    return f"{len(state.todo())} of {len(state.data['leaves'])} leaves left"


# The options of `fleet run` that fleet.json keeps ("options") and `fleet resume` runs with unless given again.
RECALLED_OPTIONS = ("on", "slots", "address", "results_uri")


def remember_options(state: FleetState, **options) -> None:
    """fleet.json keeps how the fleet runs (RECALLED_OPTIONS), for `fleet resume`."""
    state.data["options"] = {name: options[name] for name in RECALLED_OPTIONS}
    state.save()


def recalled_options(state: FleetState, given: dict, named: set[str]) -> tuple:
    """RECALLED_OPTIONS for a resume: those `named` on its command line as `given`, the others as the
    fleet last ran with them (a fleet.json of before "options" kept only its backend)."""
    kept = state.data.get("options") or {"on": state.data.get("backend")}
    return tuple(given[name] if name in named or kept.get(name) is None else kept[name]
                 for name in RECALLED_OPTIONS)


def options_text(state: FleetState) -> str:
    """How the fleet runs, as the options that say it: `--on local --slots 2`."""
    kept = state.data.get("options") or {}
    return " ".join(f"--{name.replace('_', '-')} {kept[name]}" for name in RECALLED_OPTIONS
                    if kept.get(name) is not None)


def _begin(state: FleetState, backend: str) -> FleetState:
    state.data.update(state=RUNNING, backend=backend, owner=leftovers.owner_stamp(), ended_at=None)
    state.data["runs"] = [*state.data.get("runs", []), {"started_at": artifact.iso(artifact.utc_now()),
                                                        "backend": backend}]
    state.save()
    return state


def land(outcome: LeafOutcome, runs_dir: Path, fleet_id: str, leaf_id: str, backend: str, tries: list[dict],
         replaces: str | None = None) -> str | None:
    """Move the try's run folder into runs_dir (its name made unique there) and write the `fleet`
    section into its run.json; the run id, or None when the try left no run folder. `replaces`:
    the leaf's run an earlier try left interrupted, now marked as tried again in this one."""
    if outcome.folder is not None:
        source = Path(unpack(outcome.folder, runs_dir / f".incoming-{fleet_id}-{leaf_id}"))
    elif outcome.run_dir is not None:
        source = Path(outcome.run_dir)
    else:
        return None
    log = source.parent.parent / LOG_NAME  # the leaf's autotune output beside its runs/
    if log.is_file() and not (source / LOG_NAME).exists():
        shutil.copy2(log, source / LOG_NAME)
    target = _free_name(runs_dir, source.name)
    shutil.move(str(source), str(target))
    if outcome.folder is not None:
        shutil.rmtree(runs_dir / f".incoming-{fleet_id}-{leaf_id}", ignore_errors=True)
    record = artifact.load(target)
    if not outcome.gpu.get("names"):  # what the leaf's tune saw of its GPUs (NVML, or the replaying vLLM's)
        outcome.gpu["names"] = [g.get("name") for g in used_gpus(record)]
    record.fleet = {"fleet_id": fleet_id, "leaf": leaf_id, "backend": backend, "node": outcome.node,
                             "gpu": outcome.gpu, "try": outcome.try_no, "tries": tries,
                             **({"run_id_on_node": record.run_id} if record.run_id != target.name else {}),
                             **({"uploaded_to": outcome.uploaded_to} if outcome.uploaded_to else {}),
                             **({"upload_error": outcome.upload_error} if outcome.upload_error else {})}
    record.run_id = target.name
    if record.state == "interrupted" and record.phase != "reach":
        # The leaf's tune said `autotune resume RUN`; a leaf is continued by its fleet, as a new try.
        record.result.reason = (f"the fleet was interrupted and stopped the server; `autotune fleet resume "
                                f"{fleet_id}` runs leaf {leaf_id} again")
    artifact.save_run(target, record)
    if replaces and replaces != target.name:
        _mark_tried_again(runs_dir / replaces, target.name)
    return target.name


def _mark_tried_again(run_dir: Path, run_id: str) -> None:
    """An interrupted leaf run whose leaf ran again: `runs` says where, `resume` no longer names its fleet."""
    try:
        record = artifact.load(run_dir)
    except artifact.ArtifactError:
        return  # gone or unreadable: nothing to mark
    if record.state != "interrupted":
        return
    record.links = {**(record.links if isinstance(record.links, dict) else {}), "tried_again_as": run_id}
    artifact.save_run(run_dir, record)


def _free_name(runs_dir: Path, name: str) -> Path:
    runs_dir.mkdir(parents=True, exist_ok=True)
    for n in range(1000):
        path = runs_dir / (name if n == 0 else f"{name}-{n}")
        if not path.exists():
            return path
    raise artifact.ArtifactError(f"cannot find a free run folder name for {name} under {runs_dir}")


def pack(run_dir: Path, extra: Path | None = None) -> bytes:
    """The run folder as gzip'd tar bytes (and `extra`, the leaf's autotune.log, inside it)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(str(run_dir), arcname=run_dir.name)
        if extra is not None and extra.is_file():
            tar.add(str(extra), arcname=f"{run_dir.name}/{extra.name}")
    return buffer.getvalue()


def unpack(data: bytes, into: Path) -> Path:
    """The run folder packed by pack(), unpacked under `into`; its path."""
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(into, filter="data")
        top = {Path(m.name).parts[0] for m in tar.getmembers()}
    if len(top) != 1:
        raise artifact.ArtifactError(f"a leaf sent {len(top)} folders, not one run folder")
    return into / top.pop()


def upload(run_dir: Path, uri: str, fleet_id: str, leaf_id: str) -> str:
    """Copy the run folder to <uri>/<fleet id>/<leaf id>/<run id>/ with fsspec; the address."""
    import fsspec

    dest = f"{uri.rstrip('/')}/{fleet_id}/{leaf_id}/{run_dir.name}"
    fs, root = fsspec.core.url_to_fs(dest)
    for path in sorted(Path(run_dir).rglob("*")):
        if path.is_file():
            target = f"{root}/{path.relative_to(run_dir).as_posix()}"
            fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
            fs.put_file(str(path), target)
    return dest
