"""How long a boot of this command usually takes, from earlier runs (the live line's ETA)."""

from __future__ import annotations

import statistics
from pathlib import Path

from autotune.store import walk
from autotune.store.outcomes import Outcome
from autotune.vllm import servecmd


def command_key(argv) -> tuple[str, ...]:
    """What makes two runs "the same command" for the ETA: the argv without the two flags
    autotune itself sets (--max-model-len and --port)."""
    argv = servecmd.without_flag(list(argv or []), servecmd.MAX_MODEL_LEN)
    return tuple(servecmd.without_flag(argv, servecmd.PORT))


def typical_boot_s(runs_dir: Path, argv, exclude_run: str | None = None, limit: int = 40) -> tuple[float, int] | None:
    """The median time from launch to a healthy server over earlier runs of the same command,
    and how many boots it is the median of (read from their run.json; unreadable ones are skipped).
    Boots that were refused or failed end early, so they count only when no boot ever got up."""
    key = command_key(argv)
    runs_dir = Path(runs_dir)
    if not runs_dir.is_dir():
        return None
    ups: list[float] = []
    others: list[float] = []
    for folder, record in walk.runs(runs_dir, walk.unnoticed, limit=limit + 1):  # a newer run.json: skipped, not misread
        if folder.name == exclude_run:
            continue
        if command_key(record.command.argv if record.command else None) != key:
            continue
        for attempt in record.attempts or []:
            took = attempt.time_to_outcome_s
            if not isinstance(took, (int, float)):
                continue
            (ups if attempt.outcome in (Outcome.VERIFIED, Outcome.NOT_VERIFIED, Outcome.QUEUED) else others).append(float(took))
    sample = ups or others
    if not sample:
        return None
    return statistics.median(sample), len(sample)
