"""run.json: one run of autotune (RunRecord), its command, its result and its lever search."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from autotune.store.record.attempt import Attempt
from autotune.store.record.boot_parts import ProbeResult
from autotune.store.record.part import Part
from autotune.store.record.run_parts import AimPrediction, GpuPlan, KeptOptions, Longest, Machine, Margin, RunWarning


@dataclass(init=False)
class Command(Part):
    """The serve command as the user gave it (run.json "command")."""

    argv: list | None = None  # without autotune's --max-model-len
    port: int | None = None
    port_chosen_by_autotune: bool | None = None
    port_in_use: dict | None = None  # the command's --port was taken as the run began: {port, held_by, used}
    reused_from: str | None = None  # the run whose command was reused
    cwd: str | None = None  # relative paths in the command start here


# The figures of the last boot that the result repeats, each with <key>_source.
RESULT_FIGURES = ("available_kv_gib", "kv_cache_tokens", "max_concurrency", "weights_gib", "attention_backend")


@dataclass(init=False)
class Result(Part):
    """The verdict of a run (run.json "result")."""

    verdict: str | None = None
    ceiling: int | None = None
    verified: bool | None = None
    reason: str | None = None
    target: int | None = None
    target_reached: bool | None = None
    boots: int | None = None
    limit: str | None = None  # a verified ceiling below the target: what set it (store/outcomes.py LIMITS)
    available_kv_gib: float | None = None
    available_kv_gib_source: dict | None = None
    kv_cache_tokens: int | None = None
    kv_cache_tokens_source: dict | None = None
    max_concurrency: float | None = None
    max_concurrency_source: dict | None = None
    weights_gib: float | None = None
    weights_gib_source: dict | None = None
    attention_backend: str | None = None
    attention_backend_source: dict | None = None
    error_kind: str | None = None
    diagnosis: dict | None = None
    probe: ProbeResult | None = None
    ranks: dict | None = None  # with TP/PP: available KV per rank and in total (analysis/ranks.py)
    final_argv: list | None = None
    files: list | None = None
    reached_with_levers: str | None = None
    checked: dict | None = None
    serving: dict | None = None
    longest: Longest | None = None  # the pool shrinks as the length grows: vLLM's figure, the gap, the proof

    NESTED: ClassVar[dict] = {"probe": (ProbeResult, False), "longest": (Longest, False)}

    @classmethod
    def interrupted(cls, reason: str) -> Result:
        """The result of a run an interruption ended before it had one."""
        return cls(verdict="interrupted", ceiling=None, verified=False, reason=reason)


@dataclass(init=False)
class ReachStep(Part):
    """One lever run of the lever search (run.json "reach.steps")."""

    lever: str | None = None
    value: Any = None
    run_id: str | None = None
    boots: int | None = None
    verdict: str | None = None
    ceiling: int | None = None
    available_kv_gib: float | None = None
    duration_s: float | None = None
    before_interruption: str | None = None  # finished: taken as it was; interrupted: resumed


@dataclass(init=False)
class Reach(Part):
    """The lever search of --reach (run.json "reach")."""

    steps: list[ReachStep] | None = None
    reached: bool | None = None
    before_levers: Result | None = None  # the result before the search, which a resumed search starts from
    need_gib: float | None = None
    short_gib: float | None = None
    gmu_in_force: float | None = None
    device_total_gib: float | None = None
    explanation: list | None = None
    reached_by: str | None = None
    best: dict | None = None  # the best verified configuration of the run and its lever runs (reach.py best_of)
    boots: int | None = None
    duration_s: float | None = None
    interrupted: dict | None = None  # at, by: while the search is interrupted

    NESTED: ClassVar[dict] = {"steps": (ReachStep, True), "before_levers": (Result, False)}


# A new run.json's keys in the order a person reads them (the keys after these, and those of a file read
# back, keep their own order: part.py).
RECORD_ORDER = ("run_id", "kind", "state", "started_at", "ended_at", "duration_s", "target", "target_asked", "model",
                "command", "margin", "environment", "environment_added_by_autotune", "gpus", "preflight", "options",
                "owner", "plan", "vllm_version_detected", "prediction", "links", "machine", "vllm_version", "attempts",
                "result")


@dataclass(init=False)
class RunRecord(Part):
    """run.json: one run of autotune (a tune, a sweep value, a reproduction, a lever boot)."""

    schema_version: int | None = None
    autotune_version: str | None = None
    run_id: str | None = None
    kind: str | None = None  # tune | sweep-point | reproduce | reach-step | verify
    state: str | None = None  # running | finished | interrupted
    phase: str | None = None  # reach: while the lever search runs (or was interrupted)
    started_at: str | None = None
    ended_at: str | None = None
    duration_s: float | None = None
    target: int | None = None
    target_asked: int | str | None = None
    model: str | None = None
    command: Command | None = None
    margin: Margin | None = None  # --margin: the bytes kept unused, the gmu they became, the device (run/margin.py)
    environment: dict | None = None
    environment_added_by_autotune: dict | None = None
    gpus: GpuPlan | None = None
    preflight: dict | None = None
    options: KeptOptions | None = None
    owner: dict | None = None
    plan: str | None = None  # auto | auto_probe | refusal
    vllm_version_detected: str | None = None
    prediction: AimPrediction | None = None  # the refusal path's first boot, aimed at what this machine's runs predict
    links: dict | None = None  # sweep_id, sweep_index, reproduces, reach_of, verifies, tried_again_as
    machine: Machine | None = None
    vllm_version: str | None = None
    attempts: list[Attempt] | None = None
    result: Result | None = None
    reach: Reach | None = None
    resumed_at: list | None = None
    deployment: dict | None = None  # kind verify: the endpoint, what it serves, its pool, warnings (run/deployed.py)
    fleet: dict | None = None  # a fleet's leaf: fleet id, leaf, backend, node, GPUs, tries (fleet/collect.py)
    renamed_from: list | None = None  # the ids this run had before vLLM named its model (they still resolve)
    warnings: list | None = None  # RunWarning: decided as the run ended (absent in schema 1: readers decide them)

    NESTED: ClassVar[dict] = {"command": (Command, False), "attempts": (Attempt, True),
                              "result": (Result, False), "reach": (Reach, False), "margin": (Margin, False),
                              "gpus": (GpuPlan, False), "options": (KeptOptions, False),
                              "prediction": (AimPrediction, False), "machine": (Machine, False),
                              "warnings": (RunWarning, True)}

    def link(self, key: str) -> Any:
        return self.links.get(key) if isinstance(self.links, dict) else None

    def boots_done(self) -> list:
        """The attempts that ran to an outcome (not cut short by an interruption)."""
        return [a for a in (self.attempts or []) if a.outcome != "interrupted"]

    def mark_interrupted(self, at: str, reason: str, lever_search: str) -> None:
        """The run ends `interrupted`. In the lever search (phase `reach`) the verified result
        stays and reach.interrupted says when and why (`lever_search`), so resume continues
        the search; otherwise the result becomes the interrupted one (`reason`)."""
        self.state = "interrupted"
        if self.phase == "reach" and isinstance(self.result, Result):
            if not isinstance(self.reach, Reach):
                self.reach = Reach()
            self.reach.interrupted = {"at": at, "by": lever_search}
        else:
            self.result = Result.interrupted(reason)
