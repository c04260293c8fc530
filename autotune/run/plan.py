"""What a tune derives once from its request (run/options.py's TuneOptions), before its first boot.

The request says what was asked; the plan says what boots: the target `max` resolved to, the
serve command after its secrets are resolved and --margin's gmu put in, the port, the strategy's
plan for the installed vLLM, where the first boot starts and the lever search's gmu limit.
run/tune.py derives it (prepare() for a new run, from run.json for a resumed one); the loop,
each boot and the lever search read it, and nothing changes it.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.run.options import TuneOptions


@dataclass(frozen=True)
class RunPlan:
    options: TuneOptions  # the request, as asked
    target: int  # the length aimed at; --target max: the model's maximum from its files (or checks.TARGET_MAX_UNKNOWN)
    serve_argv: tuple[str, ...]  # the command every boot starts from: secrets resolved, --margin's gmu in
    argv: tuple[str, ...]  # serve_argv with the port
    port: int
    port_chosen: bool  # autotune chose the port (the command named none)
    env: dict[str, str]  # vLLM's environment, with GPU pinning
    strategy_plan: str  # auto | auto_probe | refusal: run.json "plan" (vllm/versions.py)
    start_at: int | None  # the first boot's length, when not the target (a prediction)
    slack: int | None  # vLLM's pool minus its ceiling, where a prediction knows it (strategy.next_step)
    max_gmu: float  # --max-gmu, capped at --margin's gmu
    port_in_use: dict | None = None  # the command's --port was taken as the run began: {port, held_by} (tune.py)

    @property
    def user_port(self) -> int | None:
        """The port command.sh keeps: the one the command names (also when it was in use and the
        boots used another), or None when autotune chose it."""
        if self.port_in_use:
            return self.port_in_use["port"]
        return None if self.port_chosen else self.port

    def __post_init__(self):
        object.__setattr__(self, "serve_argv", tuple(self.serve_argv))
        object.__setattr__(self, "argv", tuple(self.argv))
