"""What a person sees while autotune works: the boot phases, live progress, the summary card.

The run (run/loop.py, run/boot.py) reports what happens as events (``emit(event, **data)``);
``Progress`` is such a callable and turns them into output on stderr:

* on a terminal: ONE live status line, redrawn in place (carriage return) about once a
  second: the boot number, the --max-model-len it tries, the phase read from vLLM's log,
  the time spent in that phase and in the whole boot, an ETA from earlier runs of the same
  command, and the figures as soon as the log shows them. Finished boots leave one
  permanent line each; the live line is cleared at the end;
* anywhere else (cron, pipes, files): plain timestamped lines, one per phase change and
  per event that matters, and never a control code;
* ``quiet``: nothing but warnings and errors (the CLI prints the summary).

Which boot phase a vLLM log line starts is vllm/log/phases.py; the card printed at the end of a
run and by ``autotune show`` is cli/summary.py (both re-exported here).
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import IO

from autotune.cli.eta import typical_boot_s
from autotune.cli.formats import fmt_duration, fmt_number
from autotune.cli.phases import BootPhases
from autotune.cli.summary import render_summary  # noqa: F401  (the card: cli/summary.py)
from autotune.cli.terminal import ANSI_RE, CLEAR_LINE, COLOURS, QUIET_AFTER_S, colour_wanted, is_tty, truncate_visible  # noqa: F401
from autotune.events import Renderer
from autotune.store.record import Attempt, BootFacts, Reach
from autotune.vllm.log import (
    FAILED,
    KV_SIZED,
    LIMIT_SOURCES,
    PROFILING,
    READY,
    REFUSED,
    STARTING,
    TERMINAL_PHASES,
    clean_line,
    phase_of,
    starting_step,
)

# The figures shown as soon as the log prints them, in the order they are shown.
FIGURE_LABELS = {
    "weights_gib": lambda v: f"weights {v} GiB",
    "available_kv_gib": lambda v: f"available KV {v} GiB",
    "kv_cache_tokens": lambda v: f"KV cache {fmt_number(v)} tokens",
    "autofit_max_model_len": lambda v: f"auto-fit {fmt_number(v)}",
    "estimated_max_model_len": lambda v: f"vLLM estimates {fmt_number(v)} fit",
}
# Facts that tell the phase even when no log_line events arrive.
_PHASE_COLOUR = {READY: "green", REFUSED: "red", FAILED: "red"}
_FACT_PHASE = {"weights_gib": PROFILING, "available_kv_gib": KV_SIZED, "kv_cache_tokens": KV_SIZED,
               "autofit_max_model_len": KV_SIZED}


# ---------------------------------------------------------------------------
# The probe's requests, worded once (a tune's progress and `autotune verify` say them alike)
# ---------------------------------------------------------------------------


def probe_sent(role: str | None = None, prompt_tokens: int | None = None) -> str:
    tokens = f" ({prompt_tokens:,} prompt tokens)" if isinstance(prompt_tokens, int) else ""
    return f"probe: sending the {str(role or 'request').replace('_', ' ')} request{tokens}"


def probe_answered(role: str | None = None, ok: bool | None = None, ttft_s: float | None = None,
                   reason: str | None = None) -> str:
    """The line of a probe request's end: served (and its first token's time), or failed and why."""
    role = str(role or "request").replace("_", " ")
    if ok:
        ttft = f", first token after {fmt_duration(ttft_s)}" if isinstance(ttft_s, (int, float)) else ""
        return f"probe: {role} request served{ttft}"
    return f"probe: the {role} request failed: {reason}"


# ---------------------------------------------------------------------------
# The renderer
# ---------------------------------------------------------------------------


class Progress(Renderer):
    """An ``emit(event, **data)`` callable that shows a run's progress on ``stream`` (stderr).

    live: redraw one status line in place (default: when the stream is a terminal);
    colour: ANSI colour (default: on a terminal without NO_COLOR); quiet: only warnings and
    errors; show_log: also stream vLLM's own lines (``log_line`` events), with quiet too.
    Call ``close()`` (or use it as a context manager) if the run can end by an exception,
    so the live line is cleared.
    """

    TICK_S = 1.0

    def __init__(self, stream: IO[str] | None = None, *, quiet: bool = False, show_log: bool = False,
                 live: bool | None = None, colour: bool | None = None, clock=time.monotonic,
                 wall=datetime.now, width: int | None = None):
        self.stream = stream if stream is not None else sys.stderr
        self.quiet = quiet
        self.show_log = show_log
        tty = is_tty(self.stream)
        self.live = (tty and os.environ.get("TERM") != "dumb") if live is None else live
        self.live = self.live and not quiet  # quiet: no status line either
        self.colour = (colour_wanted(self.stream) if colour is None else colour) and self.live
        self.clock = clock
        self.wall = wall
        self._width = width
        self.boot: BootPhases | None = None
        self.eta: tuple[float, int] | None = None
        self.run_dir: str | None = None
        self._lock = threading.RLock()
        self._drawn = False
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._spin = 0

    # -- plumbing ---------------------------------------------------------------

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self) -> None:
        """Stop redrawing and clear the live line (idempotent)."""
        self._stop.set()
        ticker, self._ticker = self._ticker, None
        if ticker is not None and ticker is not threading.current_thread():
            ticker.join(timeout=2)
        with self._lock:
            self._clear()
            self.boot = None

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed pipe must not stop the run
            pass

    def _paint(self, text: str, colour: str) -> str:
        if not self.colour:
            return text
        return f"\x1b[{COLOURS[colour]}m{text}\x1b[0m"

    def _clear(self) -> None:
        if self._drawn:
            self._write(CLEAR_LINE)
            self._drawn = False

    def _line(self, text: str) -> None:
        """A permanent line: above the live line on a terminal, timestamped elsewhere."""
        with self._lock:
            if self.live:
                self._clear()
                self._write(text + "\n")
                self._draw()
            else:
                self._write(f"[{self.wall().strftime('%H:%M:%S')}] " + ANSI_RE.sub("", text) + "\n")

    def _columns(self) -> int:
        if self._width:
            return self._width
        try:
            columns = os.get_terminal_size(self.stream.fileno()).columns
        except (OSError, ValueError, AttributeError):
            columns = 0
        # A terminal that reports no size (a fresh pty, some CI runners): $COLUMNS, else 100.
        return columns or shutil.get_terminal_size((100, 24)).columns

    def _draw(self) -> None:
        if not self.live or self.boot is None:
            return
        limit = max(20, self._columns() - 1)  # never wrap: a wrapped line cannot be redrawn in place
        text = self.status_text(limit)
        if len(ANSI_RE.sub("", text)) > limit:
            text = truncate_visible(text, limit)
            if self.colour:
                text += "\x1b[0m"
        self._write(CLEAR_LINE + text)
        self._drawn = True

    def _tick(self, stop: threading.Event) -> None:
        while not stop.wait(self.TICK_S):
            with self._lock:
                if self.boot is not None:
                    self._spin += 1
                    self._draw()

    def _start_ticker(self) -> None:
        running = self._ticker is not None and self._ticker.is_alive() and not self._stop.is_set()
        if not self.live or self.quiet or running:
            return
        # A fresh stop event per ticker: a run can follow another (--reach runs one per lever).
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, args=(self._stop,), name="autotune-progress", daemon=True)
        self._ticker.start()

    # -- what the live line says --------------------------------------------------

    def status_text(self, limit: int | None = None) -> str:
        """The live status line for the boot in progress (no carriage return). With a limit,
        the least useful parts go first (the ETA, then the total time) before the rest is cut."""
        boot = self.boot
        if boot is None:
            return ""
        now = self.clock()
        spinner = "|/-\\"[self._spin % 4]
        length = f"--max-model-len {fmt_number(boot.max_model_len)}" if boot.max_model_len is not None else ""
        if boot.phase == STARTING:  # the long wait before any weights: say which process is coming up
            phase = f"{self._paint(f'starting: {boot.step}', 'cyan')} {fmt_duration(now - boot.step_started)}"
        else:
            phase = (f"{self._paint(boot.phase, _PHASE_COLOUR.get(boot.phase, 'cyan'))} "
                     f"{fmt_duration(now - boot.phase_started)}")
        total = f"{fmt_duration(now - boot.started)} in all"
        sent = min(boot.requests_out.values(), default=None)  # a probe's request: vLLM prints nothing while it prefills
        quiet = (f"no output for {fmt_duration(now - boot.last_line_at)}" if sent is None and boot.last_line_at
                 is not None and now - boot.last_line_at >= QUIET_AFTER_S else "")
        note = boot.note and (f"{boot.note}, {fmt_duration(now - sent)} so far" if sent is not None else boot.note)
        eta = ""
        if not note and self.eta is not None and boot.phase not in (READY, *TERMINAL_PHASES):
            typical, n = self.eta
            left = typical - (now - boot.started)
            eta = (f"~{fmt_duration(left)} left" if left > 0
                   else f"slower than usual ({fmt_duration(typical)} over {n} earlier boot{'s' * (n > 1)})")
        figures = [FIGURE_LABELS[k](boot.figures[k]) for k in FIGURE_LABELS if k in boot.figures]
        shown = self._paint(", ".join(figures), "yellow") if figures else ""
        head = f"{spinner} boot {boot.index}"
        for parts in ([head, length, phase, total, quiet, note or eta, shown],
                      [head, length, phase, total, quiet, note or "", shown],
                      [head, length, phase, quiet, note or "", shown]):
            text = " · ".join(p for p in parts if p)
            if limit is None or len(ANSI_RE.sub("", text)) <= limit:
                return text
        return text

    # -- events -----------------------------------------------------------------

    def __call__(self, event: str, **data) -> None:
        with self._lock:  # the ticker thread redraws too
            Renderer.__call__(self, event, **data)

    def on_message(self, event: str, message: str, level: str) -> None:
        # Events that carry a ready-made message (the margin, a prediction, a renamed run folder).
        if not self.quiet or level in ("warning", "error"):
            self._line(self._labelled(level, message))

    def _labelled(self, level: str, message: str) -> str:
        if level == "warning":
            return self._paint("Warning:", "yellow") + " " + message
        if level == "error":
            return self._paint("Error:", "red") + " " + message
        return message

    def _say(self, text: str) -> None:
        if not self.quiet:
            self._line(text)

    def on_run_started(self, **d) -> None:
        self.run_dir = d.get("run_dir")
        if self.run_dir:
            run_dir = Path(self.run_dir)
            self.eta = typical_boot_s(run_dir.parent, d.get("argv"), exclude_run=run_dir.name)
        target = d.get("target")
        text = f"run folder {self.run_dir}; target {fmt_number(target)} tokens"
        if d.get("target_max"):
            text = (f"run folder {self.run_dir}; target: the model's own maximum "
                    + (f"({fmt_number(target)} tokens)" if d.get("target_known") else "(vLLM will say it)"))
        if d.get("port") is not None:
            text += f"; port {d['port']}"
        if d.get("vllm_version"):
            text += f"; vLLM {d['vllm_version']}"
        if d.get("plan"):
            text += f"; plan: {d['plan']}"
        if self.eta is not None:
            typical, n = self.eta
            text += f"; earlier runs of this command were ready after ~{fmt_duration(typical)} (median of {n})"
        self._say(text)

    def on_run_resumed(self, **d) -> None:
        self.run_dir = d.get("run_dir")
        if d.get("phase") == "reach":
            self._say(f"resuming the lever search of run folder {self.run_dir}: its {d.get('attempts_done', 0)} "
                      f"boot(s) are kept; lever runs that finished are not repeated")
            return
        self._say(f"resuming run folder {self.run_dir}: {d.get('attempts_done', 0)} finished boot(s) kept; "
                  f"target {fmt_number(d.get('target'))} tokens; port {d.get('port')}")

    def on_cleaned(self, **d) -> None:
        pid, detail = d.get("pid"), d.get("detail") or ""
        what = {"stopped": f"stopped a server left behind by a killed autotune (pid {pid}{': ' + detail if detail else ''})",
                "already_gone": f"its server (pid {pid}) was already gone",
                "pid_reused": f"pid {pid} now belongs to another process: left alone",
                "owner_alive": f"left alone: {detail}",
                "unreadable": detail,
                "kept_serving": detail, "kept_gone": detail,  # a --keep-serving server, left running
                "marked_interrupted": f"marked interrupted: {detail}"}.get(d.get("action"), f"{d.get('action')} (pid {pid}) {detail}".rstrip())
        self._line(self._labelled("warning", f"cleanup: {Path(str(d.get('run_dir'))).name}: {what}"))

    def on_warning(self, **d) -> None:
        self._line(self._labelled("warning", str(d.get("text") or d.get("message") or "")))

    def on_recovery(self, **d) -> None:
        self._say(f"boot {d.get('index')}: recovering: {d.get('reason')}")

    def _probe_note(self, text: str) -> None:
        if self.live and self.boot is not None:
            self.boot.note = text
            self._draw()
        else:
            index = f"boot {self.boot.index}: " if self.boot is not None else ""
            self._say(f"{index}{text}")

    def on_probe_request(self, **d) -> None:
        if self.boot is not None:  # the live line counts the request's time, not vLLM's silence
            self.boot.requests_out[str(d.get("role", "request"))] = self.clock()
        self._probe_note(probe_sent(**d))

    def on_probe_request_done(self, **d) -> None:
        if self.boot is not None:
            self.boot.requests_out.pop(str(d.get("role", "request")), None)
        if d.get("ok"):
            self._probe_note(probe_answered(**d))
        else:
            self._line(self._labelled("warning", probe_answered(**d)))

    def on_autofit_read(self, **d) -> None:
        if self.boot is not None:
            self.boot.figures["autofit_max_model_len"] = d.get("value")
        self._say(f"boot {d.get('index')}: vLLM's auto-fit says {fmt_number(d.get('value'))} fits; "
                  "this vLLM would not serve the fitted length, so it is stopped and relaunched explicitly")

    def on_reach_plan(self, **d) -> None:
        for line in d.get("explanation") or []:
            self._say(f"levers: {line}")

    def on_reach_step(self, **d) -> None:
        lever = str(d.get("lever", "?")).replace("_", "-")
        value = f" {d['value']}" if d.get("value") is not None else ""
        earlier = d.get("earlier")
        if earlier == "finished":
            self._say(f"levers: {lever}{value} already ran before the interruption (run {d.get('run_id')}); "
                      "its result is kept")
        elif earlier == "interrupted":
            self._say(f"levers: resuming {lever}{value} (run {d.get('run_id')})")
        else:
            self._say(f"levers: trying {lever}{value} (a run of its own, linked to this one)")

    def on_reach_done(self, **d) -> None:
        reach = Reach.from_dict(d.get("reach") or {})  # the event carries its JSON form (redact.scrubbing masks it)
        word = "reached the target" if reach.reached else "did not reach the target"
        boots = reach.boots if reach.boots is not None else 0
        self._say(f"levers: {word} in {boots} more boot(s), {fmt_duration(reach.duration_s)}")

    def on_attempt_started(self, **d) -> None:
        self.boot = BootPhases(d.get("index", 0), d.get("max_model_len"), d.get("reason", ""), self.clock())
        length = d.get("max_model_len")
        shown = f"{length:,}" if isinstance(length, int) else str(length)
        self._say(f"boot {self.boot.index}: --max-model-len {shown} ({self.boot.reason})")
        if self.live and not self.quiet:
            self._draw()
            self._start_ticker()

    def _phase_changed(self, boot: BootPhases) -> None:
        if self.quiet:
            return
        if self.live:
            self._draw()
            return
        if boot.phase in TERMINAL_PHASES:
            return  # the refused event and the boot's last line say it, with the figures
        (previous, began), _ = boot.phases[-2], boot.phases[-1]
        now = boot.phases[-1][1]
        self._line(f"boot {boot.index}: {boot.phase} ({previous} took {fmt_duration(now - began)}; "
                   f"{fmt_duration(now - boot.started)} since launch)")

    def on_log_line(self, **d) -> None:
        boot = self.boot
        text = d.get("text", "")
        if self.show_log:  # asked for by name: --quiet silences autotune's progress, not the log asked for
            shown = clean_line(text)  # vLLM's own colour codes and \r never reach our output
            index = d.get("index", boot.index if boot else 0)
            if self.live:
                self._line(self._paint(f"  {index}:{d.get('line_no', 0):>5} │", "dim") + " " + shown)
            else:
                self._line(f"boot {index} log {d.get('line_no', 0):>5} | {shown}")
        if boot is None:
            return
        now = self.clock()
        boot.last_line_at = now
        if boot.move_to(phase_of(text), now):
            self._phase_changed(boot)
        elif boot.phase == STARTING:
            previous = boot.step
            if boot.step_to(starting_step(text)):
                took = boot.step_changed(now)
                if self.live:
                    self._draw()
                elif not self.quiet:
                    self._line(f"boot {boot.index}: starting: {boot.step} ({previous} took {fmt_duration(took)})")

    def on_fact(self, **d) -> None:
        boot = self.boot
        key, value = d.get("key"), d.get("value")
        if boot is not None:
            if key in FIGURE_LABELS:
                boot.figures[key] = value
            if boot.move_to(_FACT_PHASE.get(key), self.clock()):
                self._phase_changed(boot)
        if self.live:
            self._draw()
        elif key in FIGURE_LABELS or key in ("vllm_version", "attention_backend"):
            label = FIGURE_LABELS.get(key, {"vllm_version": lambda v: f"vLLM {v}"}.get(
                key, lambda v: f"{key.replace('_', ' ')} {v}"))(value)
            self._say(f"boot {d.get('index')}:   {label} (log line {d.get('line_no')})")

    def on_refused(self, **d) -> None:
        boot = self.boot
        if boot is not None:
            boot.move_to(REFUSED, self.clock())
        facts = BootFacts.from_dict(d.get("result") or {})  # the boot log's facts so far
        need, have = facts.kv_needed_gib, facts.refusal_available_kv_gib
        est = facts.estimated_max_model_len
        text = f"boot {d.get('index')}: " + self._paint("refused", "red")
        if need is not None and have is not None:
            text += f": needs {need} GiB of KV cache, {have} GiB available"
        if isinstance(est, int):
            text += f"; vLLM estimates {est:,} tokens fit"
        self._say(text + "; stopping it now")

    def on_stop_step(self, **d) -> None:
        pids = d.get("pids") or []
        text = f"stopping: {d.get('signal')} to {len(pids)} process{'es' * (len(pids) != 1)}"
        if self.live:
            if self.boot is not None:
                self.boot.note = text
                self._draw()
        else:
            self._say(f"  stopping server tree: {d.get('signal')} to pids {', '.join(map(str, pids))}")

    def on_healthy(self, **d) -> None:
        if self.boot is not None and self.boot.move_to(READY, self.clock()) and self.live:
            self._draw()
        word = self._paint("healthy", "green") if d.get("verified", True) else self._paint("healthy, not verified", "red")
        self._say(f"boot {d.get('index')}: {word}; {d.get('reason', '')}".rstrip("; "))

    def on_hung(self, **d) -> None:
        self._line(self._labelled("warning", f"boot {d.get('index')}: no output for "
                                             f"{fmt_duration(d.get('idle_s'))}: hung; stopping it"))

    def on_stopping(self, **d) -> None:
        self._say(str(d.get("reason", "stopping")))

    def on_attempt_ended(self, **d) -> None:
        attempt = Attempt.from_dict(d.get("attempt") or {})  # the event carries its JSON form (redact.scrubbing)
        boot, self.boot = self.boot, None
        outcome = attempt.outcome if attempt.outcome is not None else "?"
        named = LIMIT_SOURCES.get(attempt.ceiling_source)  # refused above a limit vLLM named: expected
        shown = f"above {named} ({attempt.ceiling:,})" if named else outcome
        colour = {"verified": "green", "refused": "yellow"}.get(outcome, "yellow" if named else "red")
        text = f"boot {d.get('index')}: {self._paint(shown, colour)} after {fmt_duration(attempt.duration_s)}"
        if attempt.error_kind and not named:
            text += f" ({attempt.error_kind})"
        if attempt.refusal_to_stopped_s is not None:
            text += f"; its process tree was gone {attempt.refusal_to_stopped_s:.1f} s after the refusal"
        if boot is not None and len(boot.phases) > 1:
            took = attempt.time_to_outcome_s
            end = boot.started + took if isinstance(took, (int, float)) else self.clock()
            shown = []
            for name, took in boot.phase_times(end):
                if name in (READY, *TERMINAL_PHASES):
                    continue
                text_time = f"{name} {fmt_duration(max(0.0, took))}"
                if name == STARTING and len(boot.steps) > 1:
                    phase_end = boot.phases[1][1] if len(boot.phases) > 1 else end
                    text_time += " (" + ", ".join(f"{step} {fmt_duration(max(0.0, t))}"
                                                  for step, t in boot.step_times(phase_end)) + ")"
                shown.append(text_time)
            text += "; " + ", ".join(shown)
        if outcome in ("error", "exited", "hung", "booted_not_verified") and not named:
            self._line(self._labelled("error", text))
        else:
            self._say(text)
        with self._lock:
            self._clear()

    def on_run_ended(self, **d) -> None:
        self.boot = None
        self._stop.set()
        self._clear()
