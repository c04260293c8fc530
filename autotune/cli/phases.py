"""What the live display knows about the boot in progress (presentation state): its phases and
steps, with times. Which phase or step a vLLM log line shows is a fact about vLLM: vllm/log/phases.py.
"""

from __future__ import annotations

from autotune.vllm.log import STARTING, STARTING_STEPS, advance


class BootPhases:
    """What the live display knows about the boot in progress: its phases and steps, with times."""

    def __init__(self, index: int, max_model_len: int | None, reason: str, now: float):
        self.index = index
        self.max_model_len = max_model_len
        self.reason = reason
        self.started = now
        self.phase = STARTING
        self.phase_started = now
        self.phases: list[tuple[str, float]] = [(STARTING, now)]  # (phase, when it began)
        self.figures: dict[str, object] = {}
        self.note: str | None = None  # e.g. "stopping: SIGINT to 4 processes"
        self.step = STARTING_STEPS[0]  # within "starting"
        self.step_started = now
        self.steps: list[tuple[str, float]] = [(self.step, now)]
        self.last_line_at: float | None = None  # when vLLM last printed a line
        self.requests_out: dict[str, float] = {}  # a probe's requests in flight, by role: when sent (vLLM is quiet)

    def step_to(self, step: str | None) -> bool:
        if step is None or STARTING_STEPS.index(step) <= STARTING_STEPS.index(self.step):
            return False
        self.step = step
        return True

    def step_changed(self, now: float) -> float:
        """Seconds the previous step took; marks the new one's start."""
        took, self.step_started = now - self.step_started, now
        self.steps.append((self.step, now))
        return took

    def step_times(self, end: float) -> list[tuple[str, float]]:
        marks = self.steps + [("", end)]
        return [(marks[i][0], marks[i + 1][1] - marks[i][1]) for i in range(len(self.steps))]

    def move_to(self, phase: str | None, now: float) -> bool:
        new = advance(self.phase, phase)
        if new == self.phase:
            return False
        self.phase = new
        self.phase_started = now
        self.phases.append((new, now))
        return True

    def phase_times(self, end: float) -> list[tuple[str, float]]:
        marks = self.phases + [("", end)]
        return [(marks[i][0], marks[i + 1][1] - marks[i][1]) for i in range(len(self.phases))]
