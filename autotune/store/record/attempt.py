"""One boot of a run (run.json "attempts") and the parts it records."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from autotune.store.record.boot_parts import BootFacts, BootPrediction, ProbeResult, Recovery, StopReport, Verification
from autotune.store.record.part import Part


@dataclass(init=False)
class Attempt(Part):
    """One boot (run.json "attempts")."""

    index: int | None = None  # 1, 2, ...: the log is attempt-<index>.log
    max_model_len: int | str | None = None  # a length, or "auto"
    argv: list | None = None
    log: str | None = None
    started_at: str | None = None
    pid: int | None = None
    http_retries: list | None = None  # each broken answer asked again (server/health.py: with_retries)
    stop: StopReport | None = None  # how the process tree was stopped
    probe: ProbeResult | None = None  # the near-ceiling requests (probe.py)
    metrics: dict | None = None  # the second witness: /metrics' KV pool beside the log's figures (server/witness.py)
    memory_release: dict | None = None
    outcome: str | None = None  # strategy.VERIFIED, REFUSED, ...
    exit_status: int | None = None
    time_to_outcome_s: float | None = None
    duration_s: float | None = None
    ended_at: str | None = None
    facts: BootFacts | None = None  # as `autotune parse --json` prints them
    provenance: dict | None = None
    ceiling: int | None = None
    ceiling_source: str | None = None
    error_kind: str | None = None
    refusal_to_signal_s: float | None = None
    refusal_to_stopped_s: float | None = None
    verification: Verification | None = None
    diagnosis: dict | None = None
    log_tail: list | None = None
    traceback_tail: list | None = None
    reason: str | None = None  # why this length
    basis: str | None = None  # target | ceiling | auto | start_at | room
    missing_flags: list | None = None
    disagreeing_flags: list | None = None  # [{flag, asked, used}]: vLLM's non-default args show another value
    recovery: Recovery | None = None
    no_recovery: str | None = None
    cleanup: dict | None = None  # an interrupted boot recorded from its server marker
    prediction: BootPrediction | None = None  # the model files' KV figures against vLLM's (analysis/boot_check.py)

    NESTED: ClassVar[dict] = {"stop": (StopReport, False), "probe": (ProbeResult, False), "facts": (BootFacts, False),
                              "verification": (Verification, False), "recovery": (Recovery, False),
                              "prediction": (BootPrediction, False)}

    @classmethod
    def interrupted(cls, index: int, log: str | None, argv: list | None, pid: int | None, **how: Any) -> Attempt:
        """A boot an interruption cut short (stop: how autotune stopped it; cleanup: how a later
        autotune cleaned up after a killed one)."""
        attempt = cls(index=index, outcome="interrupted", log=log, argv=argv, pid=pid, **how)
        attempt.order = ["index", "outcome", "log", "argv", "pid", *how]
        return attempt

    def fact(self, key: str, default: Any = None) -> Any:
        """A figure of the boot log, modelled or not (default: the log did not say)."""
        if self.facts is None:
            return default
        value = getattr(self.facts, key) if self.facts.has_field(key) else self.facts.other.get(key)
        return default if value is None else value
