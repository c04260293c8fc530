"""The run record as types: RunRecord (run.json) and its parts, and the sweep record (sweep.json).

Each class has from_dict / to_dict (from_json: from_dict without the copy, for JSON just parsed
that nothing else holds), and the round trip is exact: a key absent from the file
stays absent (the field holds ABSENT), a key this autotune does not model is kept in `other`,
and keys come back in the order they were read. So a record written by another autotune
version is rewritten (marked interrupted, resumed) without losing or reordering anything.
docs/artifact.md describes these fields (tests/test_record.py checks that it names each one).

Loading goes through store/artifact.py (load, with the version check and migrations); the
sweep record through store/sweeps.py.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields
from typing import Any, Callable, ClassVar, Mapping, TypeVar


class _Absent:
    """A key the record file does not have (distinct from a key holding null)."""

    def __repr__(self) -> str:
        return "ABSENT"

    def __bool__(self) -> bool:
        return False

    def __deepcopy__(self, memo) -> "_Absent":
        return self


ABSENT: Any = _Absent()

P = TypeVar("P", bound="Part")


def given(value) -> bool:
    """Is this field set to something (not absent, not null)?"""
    return value is not ABSENT and value is not None


@dataclass
class Part:
    """Base of every record class: the exact dict round trip."""

    other: dict = field(default_factory=dict, repr=False)  # keys not modelled here, kept as read
    order: list = field(default_factory=list, repr=False, compare=False)  # key order as read

    # field name -> (class, is a list of them) for the nested parts
    NESTED: ClassVar[dict[str, tuple[type, bool]]] = {}

    @classmethod
    def from_dict(cls: type[P], data: Mapping) -> P:
        """The part of a dict the caller keeps: every value is copied, so the part shares nothing with it."""
        return cls._typed(data, copy_json)

    @classmethod
    def from_json(cls: type[P], data: Mapping) -> P:
        """The part of JSON that nothing else holds (just parsed from a file): its lists and dicts
        become the part's, not copied, so the caller must not use `data` afterwards. Loading
        10,000 runs copied each one for nothing (copying was most of the load time)."""
        return cls._typed(data, _as_is)

    @classmethod
    def _typed(cls: type[P], data: Mapping, take: Callable[[Any], Any]) -> P:
        """The part of data, each value passed through `take` (a copy or the value itself)."""
        names = _name_set(cls)
        values, other = {}, {}
        for key, value in data.items():
            if key not in names:
                other[key] = take(value)
                continue
            nested = cls.NESTED.get(key)
            if nested is not None and value is not None:
                kind, many = nested
                if many and isinstance(value, list):
                    value = [kind._typed(v, take) if isinstance(v, Mapping) else take(v) for v in value]
                elif not many and isinstance(value, Mapping):
                    value = kind._typed(value, take)
                else:
                    value = take(value)
            else:
                value = take(value)
            values[key] = value
        part = cls(**values)
        part.other = other
        part.order = list(data)
        return part

    def to_dict(self) -> dict:
        """The JSON form, a copy: changing it changes nothing in the part."""
        out = {}
        for key in _field_names(type(self)):
            value = getattr(self, key)
            if value is not ABSENT:
                out[key] = _plain(value)
        for key, value in self.other.items():
            out[key] = copy_json(value)
        return _in_order(out, self.order)

    def get(self, key: str, default=None):
        """A field or an unmodelled key by its JSON name; default when absent or null."""
        value = getattr(self, key, ABSENT) if key in _name_set(type(self)) else self.other.get(key, ABSENT)
        return default if value is ABSENT or value is None else value

    def drop(self, key: str) -> None:
        """Remove a key (it will be absent from the file)."""
        if key in _name_set(type(self)):
            setattr(self, key, ABSENT)
        else:
            self.other.pop(key, None)


def _field_names(cls) -> tuple[str, ...]:
    cached = cls.__dict__.get("_names")
    if cached is None:
        cached = tuple(f.name for f in fields(cls) if f.name not in ("other", "order"))
        cls._names = cached
    return cached


def _name_set(cls) -> frozenset[str]:
    cached = cls.__dict__.get("_name_set")
    if cached is None:
        cached = frozenset(_field_names(cls))
        cls._name_set = cached
    return cached


# JSON's scalars: immutable, so a copy can be the value itself.
_SCALARS = frozenset((str, int, float, bool, type(None)))


def copy_json(value):
    """A deep copy of a JSON value, several times quicker than copy.deepcopy on one (no memo);
    what is not plain JSON (a dict subclass, a tuple, a part) goes through copy.deepcopy."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is dict:
        return {k: copy_json(v) for k, v in value.items()}
    if kind is list:
        return [copy_json(v) for v in value]
    return copy.deepcopy(value)


def _as_is(value):
    return value


def _in_order(out: dict, order: list) -> dict:
    """out's keys in `order` (the keys as read, each once), then the rest as they are."""
    if not order:
        return out
    ordered = {key: out[key] for key in order if key in out}
    ordered.update(out)  # adds the keys order does not name, after it (a key already there keeps its place)
    return ordered


def _plain(value):
    """A field's JSON form, a copy (parts as their dicts)."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is dict:
        return {k: _plain(v) for k, v in value.items()}
    if kind is list:
        return [_plain(v) for v in value]
    if isinstance(value, Part):
        return value.to_dict()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return copy.deepcopy(value)


# ---- run.json -----------------------------------------------------------------------------------

@dataclass
class Command(Part):
    """The serve command as the user gave it (run.json "command")."""

    argv: list = ABSENT  # without autotune's --max-model-len
    port: int | None = ABSENT
    port_chosen_by_autotune: bool = ABSENT
    reused_from: str | None = ABSENT  # the run whose command was reused
    cwd: str = ABSENT  # relative paths in the command start here


@dataclass
class Attempt(Part):
    """One boot (run.json "attempts")."""

    index: int = ABSENT  # 1, 2, ...: the log is attempt-<index>.log
    max_model_len: int | str | None = ABSENT  # a length, or "auto"
    argv: list = ABSENT
    log: str | None = ABSENT
    started_at: str = ABSENT
    pid: int | None = ABSENT
    http_retries: list = ABSENT  # each broken answer asked again (server/health.py: with_retries)
    stop: dict = ABSENT  # how the process tree was stopped
    probe: dict = ABSENT  # the near-ceiling requests (probe.py)
    metrics: dict = ABSENT  # the second witness: /metrics' KV pool beside the log's figures (server/witness.py)
    memory_release: dict = ABSENT
    outcome: str | None = ABSENT  # strategy.VERIFIED, REFUSED, ...
    exit_status: int | None = ABSENT
    time_to_outcome_s: float | None = ABSENT
    duration_s: float | None = ABSENT
    ended_at: str = ABSENT
    facts: dict = ABSENT  # as `autotune parse --json` prints them
    provenance: dict = ABSENT
    ceiling: int | None = ABSENT
    ceiling_source: str = ABSENT
    error_kind: str | None = ABSENT
    refusal_to_signal_s: float | None = ABSENT
    refusal_to_stopped_s: float = ABSENT
    verification: dict = ABSENT
    diagnosis: dict | None = ABSENT
    log_tail: list = ABSENT
    traceback_tail: list = ABSENT
    reason: str = ABSENT  # why this length
    basis: str = ABSENT  # target | ceiling | auto | start_at | room
    missing_flags: list = ABSENT
    disagreeing_flags: list = ABSENT  # [{flag, asked, used}]: vLLM's non-default args show another value
    recovery: dict = ABSENT
    no_recovery: str = ABSENT
    cleanup: dict = ABSENT  # an interrupted boot recorded from its server marker
    prediction: dict = ABSENT  # the model files' KV figures against vLLM's (analysis/boot_check.py)

    @classmethod
    def interrupted(cls, index: int, log: str | None, argv, pid, **how) -> "Attempt":
        """A boot an interruption cut short (stop: how autotune stopped it; cleanup: how a later
        autotune cleaned up after a killed one)."""
        attempt = cls(index=index, outcome="interrupted", log=log, argv=argv, pid=pid, **how)
        attempt.order = ["index", "outcome", "log", "argv", "pid", *how]
        return attempt

    def fact(self, key: str, default=None):
        return (self.facts or {}).get(key, default) if given(self.facts) else default


# The figures of the last boot that the result repeats, each with <key>_source.
RESULT_FIGURES = ("available_kv_gib", "kv_cache_tokens", "max_concurrency", "weights_gib", "attention_backend")


@dataclass
class Result(Part):
    """The verdict of a run (run.json "result")."""

    verdict: str = ABSENT
    ceiling: int | None = ABSENT
    verified: bool = ABSENT
    reason: str = ABSENT
    target: int = ABSENT
    target_reached: bool = ABSENT
    boots: int = ABSENT
    limit: str = ABSENT  # a verified ceiling below the target: what set it (store/outcomes.py LIMITS)
    available_kv_gib: float = ABSENT
    available_kv_gib_source: dict = ABSENT
    kv_cache_tokens: int = ABSENT
    kv_cache_tokens_source: dict = ABSENT
    max_concurrency: float = ABSENT
    max_concurrency_source: dict = ABSENT
    weights_gib: float = ABSENT
    weights_gib_source: dict = ABSENT
    attention_backend: str = ABSENT
    attention_backend_source: dict = ABSENT
    error_kind: str = ABSENT
    diagnosis: dict | None = ABSENT
    probe: dict = ABSENT
    ranks: dict = ABSENT  # with TP/PP: available KV per rank and in total (analysis/ranks.py)
    final_argv: list = ABSENT
    files: list = ABSENT
    reached_with_levers: str = ABSENT
    checked: dict = ABSENT
    serving: dict = ABSENT

    @classmethod
    def interrupted(cls, reason: str) -> "Result":
        """The result of a run an interruption ended before it had one."""
        return cls(verdict="interrupted", ceiling=None, verified=False, reason=reason)


@dataclass
class ReachStep(Part):
    """One lever run of the lever search (run.json "reach.steps")."""

    lever: str = ABSENT
    value: Any = ABSENT
    run_id: str = ABSENT
    boots: int = ABSENT
    verdict: str = ABSENT
    ceiling: int | None = ABSENT
    available_kv_gib: float | None = ABSENT
    duration_s: float | None = ABSENT
    before_interruption: str = ABSENT  # finished: taken as it was; interrupted: resumed


@dataclass
class Reach(Part):
    """The lever search of --reach (run.json "reach")."""

    steps: list = ABSENT  # ReachStep
    reached: bool = ABSENT
    before_levers: Result = ABSENT  # the result before the search, which a resumed search starts from
    need_gib: float = ABSENT
    short_gib: float = ABSENT
    gmu_in_force: float | None = ABSENT
    device_total_gib: float | None = ABSENT
    explanation: list = ABSENT
    reached_by: str = ABSENT
    best: dict = ABSENT  # the best verified configuration of the run and its lever runs (reach.py best_of)
    boots: int = ABSENT
    duration_s: float = ABSENT
    interrupted: dict = ABSENT  # at, by: while the search is interrupted

    NESTED: ClassVar[dict] = {"steps": (ReachStep, True), "before_levers": (Result, False)}


@dataclass
class RunRecord(Part):
    """run.json: one run of autotune (a tune, a sweep value, a reproduction, a lever boot)."""

    schema_version: int = ABSENT
    autotune_version: str = ABSENT
    run_id: str = ABSENT
    kind: str = ABSENT  # tune | sweep-point | reproduce | reach-step | verify
    state: str = ABSENT  # running | finished | interrupted
    phase: str = ABSENT  # reach: while the lever search runs (or was interrupted)
    started_at: str = ABSENT
    ended_at: str | None = ABSENT
    duration_s: float | None = ABSENT
    target: int = ABSENT
    target_asked: int | str = ABSENT
    model: str | None = ABSENT
    command: Command = ABSENT
    margin: dict = ABSENT  # --margin: the bytes kept unused, the gmu they became, the device (run/margin.py)
    environment: dict = ABSENT
    environment_added_by_autotune: dict = ABSENT
    gpus: dict = ABSENT
    preflight: dict = ABSENT
    options: dict = ABSENT
    owner: dict = ABSENT
    plan: str = ABSENT  # auto | auto_probe | refusal
    vllm_version_detected: str | None = ABSENT
    prediction: dict = ABSENT  # the refusal path's first boot, aimed at what this machine's runs predict
    links: dict = ABSENT  # sweep_id, sweep_index, reproduces, reach_of, verifies, tried_again_as
    machine: dict = ABSENT
    vllm_version: str | None = ABSENT
    attempts: list = ABSENT  # Attempt
    result: Result | None = ABSENT
    reach: Reach = ABSENT
    resumed_at: list = ABSENT
    deployment: dict = ABSENT  # kind verify: the endpoint, what it serves, its pool, warnings (run/deployed.py)
    fleet: dict = ABSENT  # a fleet's leaf: fleet id, leaf, backend, node, GPUs, tries (fleet/collect.py)

    NESTED: ClassVar[dict] = {"command": (Command, False), "attempts": (Attempt, True),
                              "result": (Result, False), "reach": (Reach, False)}

    def link(self, key: str):
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


# ---- sweep.json ---------------------------------------------------------------------------------

@dataclass
class SweepPoint(Part):
    """One gmu value of a sweep (sweep.json "points")."""

    gmu: float = ABSENT
    run_id: str | None = ABSENT
    verdict: str | None = ABSENT
    ceiling: int | None = ABSENT
    start_at: int | None = ABSENT
    start_at_reason: str = ABSENT
    prediction: dict | None = ABSENT
    boots: int = ABSENT
    boots_without_prediction: int = ABSENT
    saved: int = ABSENT
    boots_interrupted: int = ABSENT
    note: str = ABSENT


RECORD_CLASSES = (RunRecord, Command, Attempt, Result, Reach, ReachStep, SweepPoint)
