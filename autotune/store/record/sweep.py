"""sweep.json: the record of a gmu sweep (store/sweeps.py reads and writes it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from autotune.store.record.part import Part


@dataclass(init=False)
class SweepPoint(Part):
    """One gmu value of a sweep (sweep.json "points")."""

    gmu: float | None = None
    run_id: str | None = None
    verdict: str | None = None
    ceiling: int | None = None
    start_at: int | None = None
    start_at_reason: str | None = None
    prediction: dict | None = None
    boots: int | None = None
    boots_without_prediction: int | None = None
    saved: int | None = None
    boots_interrupted: int | None = None
    note: str | None = None


@dataclass(init=False)
class SweepRecord(Part):
    """sweep.json: a gmu sweep, its values and their member runs (run/sweep.py writes it).

    The fields are declared in the order a sweep writes its keys, so that a new sweep.json keeps
    the key order it had as a plain dict (keys read from a file keep their own order)."""

    kind: str | None = None  # sweep
    sweep_id: str | None = None
    autotune_version: str | None = None
    state: str | None = None  # running | finished | interrupted
    started_at: str | None = None
    ended_at: str | None = None
    model: str | None = None
    target: int | None = None
    serve_argv: list | None = None  # without the swept --gpu-memory-utilization
    strategy: str | None = None
    strategy_reason: str | None = None
    gmu_values: list | None = None
    options: dict | None = None  # run/sweep.py SweepOptions, as started
    owner: dict | None = None
    points: list[SweepPoint] | None = None  # one per finished value
    boots_used: int | None = None
    boots_without_predictions: int | None = None
    boots_2k: int | None = None
    boots_saved: int | None = None
    fit: dict | None = None
    plot: str | None = None
    boots_interrupted: int | None = None
    resumed_at: list | None = None
    interrupted_by: str | None = None
    schema_version: int | None = None

    NESTED: ClassVar[dict] = {"points": (SweepPoint, True)}
