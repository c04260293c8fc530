"""`autotune verify URL`: what a deployed vLLM server is, checked against the run that verified its settings.

For one endpoint (the CLI loops over a fleet):

1. look: GET /v1/models (the model and the length it serves), /version (vLLM's version) and
   /metrics (its KV pool: server/metrics.py), through server/client.py's door for a URL (its key from
   VLLM_API_KEY, TLS checked against the system's CAs or --ssl-ca-certs);
2. judge against the run (pure): a served length below the run's ceiling is not verified, with
   both numbers; at or above it, the run's length is probed (server/probe.py: a near-ceiling request,
   TTFT, memory growth where the server is a process on this machine, the head-of-line wait with
   --probe full). Without a run, the served length is probed;
3. what the pool could serve (analysis/could_serve.py), said whenever the server serves less;
4. a verification run is written (kind `verify`, links.verifies = the run): `runs` and `show`
   say "deployed at URL, verified DATE, vLLM X". Its verdict gives tune's exit codes.

Nothing here raises for what the server does: an unreachable server, a key it wants, TLS that
does not match become the verdict (error, front_door) with the reason.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from autotune.analysis.could_serve import Room, could_serve
from autotune.events import Emit
from autotune.model import max_len
from autotune.run import checks
from autotune.server import client as client_mod
from autotune.server import health, metrics, probe
from autotune.store import artifact, walk
from autotune.store.record import Result, RunRecord
from autotune.vllm.servecmd import model_slug

KIND = "verify"
LINK = "verifies"
CHECK_PREFIX = "check-"
SMALL_TIMEOUT_S = 10.0


@dataclass
class Seen:
    """What the server says it is."""

    model: str | None = None
    root: str | None = None  # the model's path as the server loaded it (/v1/models "root")
    served_len: int | None = None
    vllm_version: str | None = None
    metrics: metrics.ServerMetrics | None = None
    metrics_unavailable: str | None = None
    room: Room | None = None
    model_maximum: int | None = None  # the model's own maximum, where its files are on this machine

    def to_dict(self) -> dict:
        return {"model": self.model, "root": self.root, "served_max_model_len": self.served_len,
                "vllm_version": self.vllm_version, "model_maximum": self.model_maximum,
                "metrics": self.metrics.to_dict() if self.metrics else None,
                "metrics_unavailable": self.metrics_unavailable, "room": self.room.to_dict() if self.room else None}


@dataclass
class Judgement:
    """What the served length says before any request: the verdict when it is already final, the
    length to probe otherwise, and what to warn about."""

    verdict: str | None  # None: the probe decides
    reason: str
    probe_len: int | None
    warnings: list[str] = field(default_factory=list)


def vllm_version_of(door: client_mod.FrontDoor) -> str | None:
    """GET /version ({"version": "0.32.0"}); None when the server does not say."""
    try:
        status, body = health.client_of(door).request("GET", "/version", SMALL_TIMEOUT_S)
        return str(json.loads(body)["version"]) if status == 200 else None
    except (ValueError, KeyError, TypeError, OSError, httpx.HTTPError, client_mod.TlsMismatch):
        return None  # the version is a nicety: /v1/models was the check


def look(door: client_mod.FrontDoor) -> Seen:
    """What the server is. Raises health.FrontDoorRefused (a key, TLS), health.ProbeError (no
    answer, not vLLM's /v1/models)."""
    models = health.served_models(door, timeout=SMALL_TIMEOUT_S)
    if not models:
        raise health.ProbeError("GET /v1/models lists no model")
    seen = Seen(model=models[0].id, root=models[0].root, served_len=models[0].max_model_len,
                vllm_version=vllm_version_of(door))
    try:
        seen.metrics = metrics.read(door)
    except metrics.MetricsUnavailable as exc:
        seen.metrics_unavailable = str(exc)
    seen.room = could_serve(seen.metrics.cache_config if seen.metrics else None, seen.served_len, seen.vllm_version)
    # a length the pool holds is advice only up to the model's own maximum (vLLM refuses more)
    seen.model_maximum = max_len.maximum_here(seen.root) or max_len.maximum_here(seen.model)
    return seen


def judge(seen: Seen, run: RunRecord | None) -> Judgement:
    """The served length against the run's ceiling (pure)."""
    served = seen.served_len
    if served is None:
        return Judgement("not_verified", "GET /v1/models reports no max_model_len", None)
    if run is None:
        return Judgement(None, f"serves --max-model-len {served:,}", served)
    ceiling, run_id = run.result.ceiling, run.run_id
    warnings = []
    served_as = f"{seen.model}" + (f" ({seen.root})" if seen.root not in (None, seen.model) else "")
    if not same_model(run.model, seen):  # another model: its length proves nothing
        return Judgement("not_verified", f"serves model {served_as}, not the {run.model} run {run_id} verified (it "
                                         f"serves --max-model-len {served:,})", None)
    if run.model not in (seen.model, seen.root):
        warnings.append(f"it serves {served_as}; run {run_id} verified {run.model}: taken as the same model "
                        "in another folder")
    if run.vllm_version and seen.vllm_version and seen.vllm_version != run.vllm_version:
        warnings.append(f"it runs vLLM {seen.vllm_version}; run {run_id} verified vLLM {run.vllm_version}: the numbers "
                        "age with the version, tune it again there")
    if served < ceiling:
        return Judgement("not_verified", f"serves --max-model-len {served:,}, below the {ceiling:,} run {run_id} "
                                         "verified", None, warnings)
    if served > ceiling:
        warnings.append(f"it serves --max-model-len {served:,}, more than the {ceiling:,} run {run_id} verified: "
                        "requests above that are unproven")
    return Judgement(None, f"serves --max-model-len {served:,}, the {ceiling:,} run {run_id} verified"
                     + (" and more" if served > ceiling else ""), ceiling, warnings)


def same_model(model: str | None, seen: Seen) -> bool:
    """Does the server serve this model? Its name or path as /v1/models gives it, or a folder of the
    same name (a model copied elsewhere: a deployment's paths are rarely the tuning machine's)."""
    named = [n for n in (seen.model, seen.root) if n]
    return not model or not named or model in named or model_slug(model) in {model_slug(n) for n in named}


def run_model_maximum(run: RunRecord | None, seen: Seen) -> int | None:
    """The model's own maximum as the run found it (its files then, or vLLM's own words at a boot),
    where the server serves the run's model and its files are not here now."""
    if run is None or not same_model(run.model, seen):
        return None
    found = (run.preflight or {}).get("model_maximum")
    return found if isinstance(found, int) else next(
        (m for m in (checks.model_maximum(a) for a in run.attempts or []) if m), None)


def local_pid(door: client_mod.FrontDoor) -> int | None:
    """The process listening on the URL's port, when the URL is this machine (its memory can be read)."""
    if door.host not in ("127.0.0.1", "localhost", "::1", *client_mod.local_addresses()):
        return None
    try:
        for conn in psutil.net_connections(kind="inet"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == door.port and conn.pid:
                return conn.pid
    except (psutil.Error, OSError):
        return None
    return None


def check(door: client_mod.FrontDoor, run: RunRecord | None, probe_mode: str, runs_dir: Path, emit: Emit) -> RunRecord:
    """Verify one endpoint; write and return the verification run."""
    started = artifact.utc_now()
    t0 = time.monotonic()
    seen, judgement, probe_record = Seen(), None, None
    try:
        seen = look(door)
        seen.model_maximum = seen.model_maximum or run_model_maximum(run, seen)
        judgement = judge(seen, run)
        emit("deployed_seen", message=f"{door.where}: {judgement.reason}")
        if judgement.verdict is None:
            judgement, probe_record = _probe(door, run, judgement, probe_mode, emit)
    except health.FrontDoorRefused as exc:
        judgement = Judgement("front_door", str(exc), None)
        judgement.warnings.append(f"fix: {exc.fix}")
    except (health.ProbeError, OSError) as exc:
        judgement = Judgement("error", f"{door.where} did not answer as vLLM does: {exc}", None)
    return _record(door, run, seen, judgement, probe_record, started, time.monotonic() - t0, runs_dir)


def _probe(door: client_mod.FrontDoor, run: RunRecord | None, judgement: Judgement, mode: str, emit: Emit):
    if mode == "none":
        return Judgement("verified", judgement.reason + " (not probed: --probe none)", None, judgement.warnings), None
    pid = local_pid(door)
    gpus = run.gpus.indices if run is not None and run.gpus is not None and pid is not None else None
    found = probe.probe(door, judgement.probe_len, mode, pid, gpus or None, emit=emit)
    if found["ok"]:
        return Judgement("verified", judgement.reason, judgement.probe_len, judgement.warnings), found
    reason = f"{judgement.reason}; the probe at {judgement.probe_len:,} failed: {found['reason']}"
    return Judgement("not_verified", reason, judgement.probe_len, judgement.warnings), found


def _record(door, run, seen: Seen, judgement: Judgement, probe_record, started, duration: float,
            runs_dir: Path) -> RunRecord:
    # "check" in the folder's name: a verification is told from a tune at a glance in runs/
    run_dir = artifact.create_run_dir(Path(runs_dir), CHECK_PREFIX + model_slug(seen.model))
    verified = judgement.verdict == "verified"
    result = Result(verdict=judgement.verdict, ceiling=seen.served_len if verified else None, verified=verified,
                    reason=judgement.reason)
    if probe_record is not None:
        result.probe = probe_record
    deployment = {"url": door.where, "door": door.describe(), **seen.to_dict(), "warnings": judgement.warnings}
    if run is not None:
        deployment.update(verifies=run.run_id, run_ceiling=run.result.ceiling, run_vllm_version=run.vllm_version)
    record = RunRecord(run_id=run_dir.name, kind=KIND, state="finished", started_at=artifact.iso(started),
                       ended_at=artifact.iso(artifact.utc_now()), duration_s=round(duration, 2),
                       target=run.result.ceiling if run is not None else seen.served_len, model=seen.model,
                       links={LINK: run.run_id} if run is not None else {}, vllm_version=seen.vllm_version,
                       deployment=deployment, result=result)
    artifact.save_run(run_dir, record)
    return record


def verifications_of(runs_dir: Path, run_id: str) -> list[RunRecord]:
    """The verification runs of a run, newest first."""
    return [record for _, record in walk.linked(runs_dir, LINK, run_id)]


# What a verification found at its URL, by its verdict: only a vLLM that answered is "deployed" there.
_FOUND_AT = {"verified": "deployed at", "not_verified": "deployed at", "front_door": "turned autotune away at"}


def found_at(record: RunRecord) -> str:
    """"deployed at URL" where a vLLM answered; "not reached at URL" where nothing vLLM did (a
    mistyped URL, a server that is down); "turned autotune away at URL" (a key, TLS)."""
    result = record.result if isinstance(record.result, Result) else Result()
    url = (record.deployment or {}).get("url")
    return f"{_FOUND_AT.get(result.verdict or '', 'not reached at')} {url}"


def deployed_line(record: RunRecord) -> str:
    """"deployed at URL, verified DATE, vLLM X" for a verification run (what `show` and `runs` say)."""
    date = (record.ended_at or record.started_at or "")[:10]
    result = record.result if isinstance(record.result, Result) else Result()
    state = f"verified {date}" if result.verified else f"checked {date}: {result.verdict or 'unknown'}"
    answered = f", vLLM {record.vllm_version or 'unknown'}" if result.verdict in _FOUND_AT else ""
    return f"{found_at(record)}, {state}{answered} (run {record.run_id})"
