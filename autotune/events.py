"""How a tune reports progress: events, emit("attempt_started", index=..., ...).

The code that runs a tune (run/, server/, fleet/) sends events; the command line alone decides
how they look (cli/progress.py, cli/fleet.py, cli/verify.py). This sits at the bottom so that any
floor can send one.

Every event is declared once here, with its fields and what it means (EVENTS), as llm declares its
hooks in hookspecs.py; tests/test_events.py checks that each event sent is declared, sends only its
fields, and is drawn by a renderer or carries a ready-made `message`. A renderer follows one
protocol (Renderer): a method on_<event>(**fields) for each event it draws; an event it does not
draw that carries a `message` goes to on_message; any other is not its business.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

Emit = Callable[..., None]


@dataclass(frozen=True)
class Event:
    """One event: its name, the fields it is sent with, and what it says happened."""

    name: str
    fields: tuple[str, ...]
    means: str

    @property
    def has_message(self) -> bool:
        """Does it carry a ready-made line (`message`), for a renderer that does not draw it?"""
        return "message" in self.fields


# The signal of a stop step and the processes it went to (host/processes.py stop_tree's step).
_STOP_STEP = ("signal", "pids", "at_s")

EVENTS: dict[str, Event] = {e.name: e for e in (
    # a run (run/tune.py, run/loop.py)
    Event("run_started", ("run_dir", "target", "target_known", "target_max", "port", "vllm_version", "plan", "argv"),
          "a run folder was made; the first boot is next"),
    Event("run_resumed", ("run_dir", "target", "attempts_done", "port", "phase"),
          "an interrupted run goes on (phase reach: its lever search)"),
    Event("run_renamed", ("run_dir", "message"), "the run folder took the model vLLM serves as its name"),
    Event("run_ended", ("record", "run_dir"), "the run has its result, written to run.json"),
    Event("cleaned", ("run_dir", "pid", "action", "detail"), "a killed autotune's leftover was dealt with"),
    Event("margin", ("message",), "--margin became a --gpu-memory-utilization"),
    Event("first_boot_predicted", ("message",), "the first boot is aimed at a prediction, not the target"),
    Event("warning", ("text",), "something the user should know; the run goes on"),
    # a boot (run/boot.py, run/checks.py)
    Event("attempt_started", ("index", "max_model_len", "reason"), "a boot was launched"),
    Event("log_line", ("index", "line_no", "text"), "the boot's server printed a line"),
    Event("fact", ("index", "key", "value", "line_no"), "a figure was read from the boot log"),
    Event("autofit_read", ("index", "value"), "vLLM's auto-fit said what fits; the boot is stopped"),
    Event("refused", ("index", "result"), "vLLM refused the length for lack of KV cache"),
    Event("healthy", ("index", "verified", "reason"), "the server answered /health; verified: it serves the length"),
    Event("hung", ("index", "idle_s"), "the server printed nothing for --stall-timeout"),
    Event("recovery", ("index", "reason"), "a mechanical fix: the next boot relaunches with it"),
    Event("stopping", ("reason",), "the server is being stopped"),
    Event("stop_step", ("pid", *_STOP_STEP), "a signal went to the server's process tree"),
    Event("attempt_ended", ("index", "attempt"), "a boot has its outcome (the attempt as run.json keeps it)"),
    # the probe (server/probe.py), in a tune and in `autotune verify`
    Event("probe_request", ("role", "prompt_tokens"), "a probe request was sent"),
    Event("probe_request_done", ("role", "ok", "ttft_s", "reason"), "a probe request was answered, or failed"),
    # the lever search (run/reach.py)
    Event("reach_plan", ("explanation",), "the lever search's plan"),
    Event("reach_step", ("lever", "value", "earlier", "run_id"), "a lever run starts (or is taken from before)"),
    Event("reach_done", ("reach",), "the lever search ended (run.json \"reach\")"),
    # --keep-serving (server/handover.py), `autotune verify` (run/deployed.py)
    Event("handing_over", ("argv", "log", "message"), "the verified command is launched to keep serving"),
    Event("deployed_seen", ("message",), "what a deployed server said about itself"),
    # a fleet (fleet/runner.py)
    Event("fleet_started", ("fleet_id", "where", "todo", "skipped", "capacity"), "a fleet's leaves start"),
    Event("fleet_tick", ("running", "waiting", "done", "failed"), "the fleet's state, every few seconds"),
    Event("leaf_started", ("leaf", "try_no", "node", "gpu"), "a leaf's tune started"),
    Event("leaf_finished", ("leaf", "entry"), "a leaf's tune ended"),
    Event("leaf_interrupted", ("leaf", "entry"), "a leaf's tune was stopped by the fleet"),
    Event("leaf_retry", ("leaf", "try_no", "reason", "delay_s", "node"), "a leaf failed for the infrastructure: again"),
    Event("leaf_failed", ("leaf", "entry"), "a leaf failed for good"),
    Event("fleet_stopping", ("signal", "running"), "the fleet got a signal and stops its leaves"),
    Event("fleet_reaped", ("count",), "the fleet stopped what its leaves left running"),
)}


class Renderer:
    """The one protocol of a renderer of the event stream: call it as an Emit; on_<event>(**fields)
    draws an event; an event with no such method that carries a `message` goes to on_message
    (level: `warning`, `error` or `info`, the event's own or guessed from its name); any other
    event is not this renderer's business."""

    def __call__(self, event: str, **data) -> None:
        handler = getattr(self, f"on_{event}", None)
        if handler is not None:
            handler(**data)
        elif isinstance(data.get("message"), str):
            self.on_message(event, data["message"], data.get("level") or ("warning" if "warn" in event else "info"))

    def on_message(self, event: str, message: str, level: str) -> None:
        """An event this renderer does not draw, with its ready-made line."""
