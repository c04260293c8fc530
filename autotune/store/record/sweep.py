"""sweep.json: the record of a gmu sweep (store/sweeps.py reads and writes it)."""

from __future__ import annotations

from dataclasses import dataclass

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
