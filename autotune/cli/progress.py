"""What a person sees while autotune works: the boot phases, live progress, the summary card.

tune.py reports what happens as events (``emit(event, **data)``); ``Progress`` is such a
callable and turns them into output on stderr:

* on a terminal: ONE live status line, redrawn in place (carriage return) about once a
  second: the boot number, the --max-model-len it tries, the phase read from vLLM's log,
  the time spent in that phase and in the whole boot, an ETA from earlier runs of the same
  command, and the figures as soon as the log shows them. Finished boots leave one
  permanent line each; the live line is cleared at the end;
* anywhere else (cron, pipes, files): plain timestamped lines, one per phase change and
  per event that matters, and never a control code;
* ``quiet``: nothing but warnings and errors (the CLI prints the summary).

``phase_of`` (pure) says which boot phase a vLLM log line starts, and ``render_summary``
(pure) is the card printed at the end of a run and by ``autotune show``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import IO

from autotune.vllm import catalog
from autotune.vllm import servecmd
from autotune.vllm.logparse import clean_line

# ---------------------------------------------------------------------------
# Boot phases (pure)
# ---------------------------------------------------------------------------

STARTING = "starting"
LOADING = "loading weights"
PROFILING = "profiling/compiling"
KV_SIZED = "KV cache sized"
GRAPHS = "capturing graphs"
READY = "ready"
REFUSED = "refused"
FAILED = "failed"

# A boot goes through these in order; REFUSED and FAILED end it.
PHASE_ORDER = (STARTING, LOADING, PROFILING, KV_SIZED, GRAPHS, READY)
TERMINAL_PHASES = (REFUSED, FAILED)

_REFUSAL_KINDS = ("kv_cache_insufficient", "kv_cache_insufficient_legacy")

# Long configuration dumps that name every feature ("cudagraph_capture_sizes", "torch.compile"
# options): they say only that the engine is starting, whatever words they contain.
# vLLM 0.6-0.14 "vLLM API server version X"; 0.15+ logo "... version 0.32.0" or, with
# VLLM_DISABLE_LOG_LOGO=1, "vLLM server version X, serving model M"; 0.9+ "non-default args: {...}";
# <=0.8.5 "args: Namespace(...)"; V0 "Initializing an LLM engine (v0.6.1)", V1 "Initializing a V1 LLM engine".
_STARTING_RE = re.compile(
    r"vLLM (?:API )?server version \S|non-default args: \{|\bargs: Namespace\("
    r"|Initializing an? (?:V[01] )?LLM engine|[█▄▀].*\bversion\s+\S+\s*$"
)

# Checked in this order on the cleaned line; the first match wins. Versions from
# docs/log-formats.md (sections 3, 5, 8, 9) and our own vLLM 0.32 CPU boots.
_PHASE_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    # 0.7.3+ "Starting vLLM API server on http://..." / 0.9.1+ "Starting vLLM API server 0 on ..." /
    # 0.18+ "Starting vLLM server on ..."; uvicorn "Uvicorn running on" (<=0.7.2) and
    # "Application startup complete." (all versions).
    (READY, re.compile(r"Starting vLLM (?:API )?server(?: \d+)? on \S|Uvicorn running on \S"
                       r"|Application startup complete")),
    # V1 tqdm bars "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 40%|..." (0.10+),
    # older "Capturing CUDA graph shapes", V0 "Capturing cudagraphs for decoding" and
    # "Capturing the model for CUDA graphs"; then "Graph capturing finished in N secs, took X GiB"
    # and 0.20+ "CUDA graph pool memory: X GiB (actual)".
    (GRAPHS, re.compile(r"Capturing (?:CUDA graph|cudagraph|the model for CUDA graphs)"
                        r"|Graph capturing finished|CUDA graph pool memory|CUDA graphs can take additional")),
    # The KV pool is known: V1 0.9.1+ "Available KV cache memory: X GiB" (also before a refusal),
    # V1 0.8+ "GPU KV cache size: N tokens" (CPU "CPU KV cache size" after 0.21), V0 "# GPU blocks: N" /
    # "# CUDA blocks: N" / "# cuda blocks: N", V0 0.6.5-0.10 "the rest of the memory reserved for KV
    # Cache is X GiB", V0 0.6.4 "kv_cache_size=X GiB", CPU 0.20+ "Auto set (X/Y) GiB for KV cache" /
    # "Explicitly set (X/Y) GiB for KV cache", 0.14+ "Auto-fit max_model_len: reduced from A to B",
    # 0.10.2+ "reserved X GiB memory for KV Cache as specified by kv_cache_memory_bytes".
    (KV_SIZED, re.compile(r"KV cache size: [\d,]+ tokens|Available KV cache memory"
                          r"|(?:Auto|Explicitly) set \([\d.]+/[\d.]+\) GiB for KV cache|# \w+ blocks: \d"
                          r"|memory reserved for KV Cache is|\bkv_cache_size=[\d.]+ ?GiB"
                          r"|Auto-fit max_model_len: (?:reduced|full)|memory for KV Cache as specified")),
    # Weights are in; profiling / torch.compile / warm-up run until the KV pool is sized:
    # 0.8+ "Model loading took X GiB", <=0.7.3 "Loading model weights took X GB", 0.8+ loader
    # "Loading weights took N seconds", V0 "Memory profiling takes", torch.compile lines
    # ("Dynamo bytecode transform time", "Compiling a graph for dynamic shape", "torch.compile takes
    # N s in total", "Using cache directory: ... for vLLM's torch.compile"; not 0.32's config-time
    # "Enforce eager set, disabling torch.compile"), CPU "Warming up model for the
    # compilation", "Initial profiling/warmup run took", 0.18+ "Profiling CUDA graph memory",
    # "Estimated CUDA graph memory", "CUDA graph memory profiling is enabled".
    (PROFILING, re.compile(r"Model loading took|Loading model weights took|Loading weights took"
                           r"|Memory profiling|torch\.compile takes|for vLLM's torch\.compile|Dynamo bytecode transform|Compiling a graph"
                           r"|Warming up model|profiling/warmup run|Profiling CUDA graph memory"
                           r"|Estimated CUDA graph memory|CUDA graph memory profiling|saved AOT compiled")),
    # Weights being read: "Starting to load model M..." (V1 GPU and CPU runners), the tqdm bars
    # "Loading safetensors checkpoint shards: 40% Completed", "Loading pt checkpoint shards",
    # 0.32 "Filesystem type for checkpoints", downloads from the Hub.
    (LOADING, re.compile(r"Starting to load model|Loading (?:safetensors|pt|gguf) checkpoint shards"
                         r"|Loading weights (?:on|from)|Filesystem type for checkpoints|Initializing model took"
                         r"|Downloading (?:model|weights|shards)|No model\.safetensors\.index\.json")),
)


def phase_of(line: str) -> str | None:
    """The boot phase a vLLM log line starts, or None when the line says nothing about it.

    Phases, in boot order: "starting", "loading weights", "profiling/compiling",
    "KV cache sized", "capturing graphs", "ready"; a boot ends "refused" (vLLM's KV-cache
    refusal, V1 or V0 wording) or "failed" (any other fatal entry of the failure catalog).
    The line may carry any prefix, ANSI colour and a trailing carriage return.
    """
    text = clean_line(line)
    if not text.strip():
        return None
    if _STARTING_RE.search(text):
        return STARTING
    found = catalog.search(text)
    if found is not None:
        kind = found[0]
        if kind.kind in _REFUSAL_KINDS:
            return REFUSED
        if kind.fatal:
            return FAILED
    for phase, pattern in _PHASE_RULES:
        if pattern.search(text):
            return phase
    return None


def advance(current: str, new: str | None) -> str:
    """The phase after seeing ``new`` while in ``current``: phases only move forward (worker
    processes interleave their lines), a refusal beats a generic failure (vLLM logs
    "EngineCore failed to start" before the refusal's own line), and nothing leaves refused."""
    if new is None or new == current:
        return current
    if current == REFUSED:
        return current
    if new in TERMINAL_PHASES:
        return new
    if current == FAILED:
        return current
    if PHASE_ORDER.index(new) > PHASE_ORDER.index(current):
        return new
    return current


# What the long "starting" phase is waiting for, in order: vLLM's API server process logs its
# banner and arguments, spawns the engine core ("Initializing a V1 LLM engine", V0 "Initializing
# an LLM engine"), which spawns the workers ("world_size=1 rank=0", "(Worker pid=N)",
# "(Worker_TP0 pid=N)", "(VllmWorker rank=0 pid=N)"). On a busy machine each step costs seconds
# of Python imports with no output.
STARTING_STEPS = ("importing vLLM", "API server", "engine core", "workers")
_STARTING_STEP_RULES = (
    ("workers", re.compile(r"\bworld_size=\d+ rank=\d+|\((?:Vllm)?Worker[\w -]*pid=\d+\)")),
    ("engine core", re.compile(r"Initializing an? (?:V[01] )?LLM engine|\(EngineCore[\w]* pid=\d+\)")),
    ("API server", re.compile(r"vLLM (?:API )?server version|non-default args: |\bargs: Namespace\(|\(APIServer pid=\d+\)"
                              r"|[█▄▀].*\bversion\s+\S+\s*$")),
)


def starting_step(line: str) -> str | None:
    """Which step of the "starting" phase a log line shows (see STARTING_STEPS), or None."""
    text = clean_line(line)
    for step, pattern in _STARTING_STEP_RULES:
        if pattern.search(text):
            return step
    return None


# ---------------------------------------------------------------------------
# Small formatting helpers (pure)
# ---------------------------------------------------------------------------

def fmt_number(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


# The figures shown as soon as the log prints them, in the order they are shown.
FIGURE_LABELS = {
    "weights_gib": lambda v: f"weights {v} GiB",
    "available_kv_gib": lambda v: f"available KV {v} GiB",
    "kv_cache_tokens": lambda v: f"KV cache {fmt_number(v)} tokens",
    "autofit_max_model_len": lambda v: f"auto-fit {fmt_number(v)}",
    "estimated_max_model_len": lambda v: f"vLLM estimates {fmt_number(v)} fit",
}
# Facts that tell the phase even when no log_line events arrive.
_FACT_PHASE = {"weights_gib": PROFILING, "available_kv_gib": KV_SIZED, "kv_cache_tokens": KV_SIZED,
               "autofit_max_model_len": KV_SIZED}


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
    folders = sorted((p for p in runs_dir.iterdir() if p.is_dir() and p.name != exclude_run), reverse=True)
    for folder in folders[:limit]:
        try:
            record = json.loads((folder / "run.json").read_text(encoding="utf-8"))
            if command_key((record.get("command") or {}).get("argv")) != key:
                continue
            for attempt in record.get("attempts") or []:
                took = attempt.get("time_to_outcome_s")
                if not isinstance(took, (int, float)):
                    continue
                (ups if attempt.get("outcome") in ("verified", "booted_not_verified") else others).append(float(took))
        except (OSError, ValueError, AttributeError, TypeError):
            continue
    sample = ups or others
    if not sample:
        return None
    return statistics.median(sample), len(sample)


# ---------------------------------------------------------------------------
# The renderer
# ---------------------------------------------------------------------------

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
QUIET_AFTER_S = 15.0  # the live line says how long vLLM has been silent after this
_COLOURS = {"dim": "2", "red": "31", "green": "32", "yellow": "33", "cyan": "36"}
_PHASE_COLOUR = {READY: "green", REFUSED: "red", FAILED: "red"}
CLEAR_LINE = "\r\x1b[2K"


def colour_wanted(stream: IO[str], env=None) -> bool:
    """Colour only on a terminal, and never with NO_COLOR set (https://no-color.org) or TERM=dumb."""
    env = os.environ if env is None else env
    return _is_tty(stream) and not env.get("NO_COLOR") and env.get("TERM") != "dumb"


def _is_tty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


class _Boot:
    """What the renderer knows about the boot in progress."""

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


class Progress:
    """An ``emit(event, **data)`` callable that shows a run's progress on ``stream`` (stderr).

    live: redraw one status line in place (default: when the stream is a terminal);
    colour: ANSI colour (default: on a terminal without NO_COLOR); quiet: only warnings and
    errors; show_log: also stream vLLM's own lines (``log_line`` events).
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
        tty = _is_tty(self.stream)
        self.live = (tty and os.environ.get("TERM") != "dumb") if live is None else live
        self.live = self.live and not quiet  # quiet: no status line either
        self.colour = (colour_wanted(self.stream) if colour is None else colour) and self.live
        self.clock = clock
        self.wall = wall
        self._width = width
        self.boot: _Boot | None = None
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
        return f"\x1b[{_COLOURS[colour]}m{text}\x1b[0m"

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
                self._write(f"[{self.wall().strftime('%H:%M:%S')}] " + _ANSI_RE.sub("", text) + "\n")

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
        if len(_ANSI_RE.sub("", text)) > limit:
            text = _truncate_visible(text, limit)
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
        quiet = (f"no output for {fmt_duration(now - boot.last_line_at)}"
                 if boot.last_line_at is not None and now - boot.last_line_at >= QUIET_AFTER_S else "")
        eta = ""
        if not boot.note and self.eta is not None and boot.phase not in (READY, *TERMINAL_PHASES):
            typical, n = self.eta
            left = typical - (now - boot.started)
            eta = (f"~{fmt_duration(left)} left" if left > 0
                   else f"slower than usual ({fmt_duration(typical)} over {n} earlier boot{'s' * (n > 1)})")
        figures = [FIGURE_LABELS[k](boot.figures[k]) for k in FIGURE_LABELS if k in boot.figures]
        shown = self._paint(", ".join(figures), "yellow") if figures else ""
        head = f"{spinner} boot {boot.index}"
        for parts in ([head, length, phase, total, quiet, boot.note or eta, shown],
                      [head, length, phase, total, quiet, boot.note or "", shown],
                      [head, length, phase, quiet, boot.note or "", shown]):
            text = " · ".join(p for p in parts if p)
            if limit is None or len(_ANSI_RE.sub("", text)) <= limit:
                return text
        return text

    # -- events -----------------------------------------------------------------

    def __call__(self, event: str, **data) -> None:
        handler = getattr(self, f"_on_{event}", None)
        with self._lock:
            if handler is not None:
                handler(data)
            elif isinstance(data.get("message"), str):
                # Events added later (preflight, probes, sweeps) that carry a ready-made message.
                level = data.get("level") or ("warning" if "warn" in event else "info")
                if not self.quiet or level in ("warning", "error"):
                    self._line(self._labelled(level, data["message"]))

    def _labelled(self, level: str, message: str) -> str:
        if level == "warning":
            return self._paint("Warning:", "yellow") + " " + message
        if level == "error":
            return self._paint("Error:", "red") + " " + message
        return message

    def _say(self, text: str) -> None:
        if not self.quiet:
            self._line(text)

    def _on_run_started(self, d: dict) -> None:
        self.run_dir = d.get("run_dir")
        if self.run_dir:
            run_dir = Path(self.run_dir)
            self.eta = typical_boot_s(run_dir.parent, d.get("argv"), exclude_run=run_dir.name)
        target = d.get("target")
        text = f"run folder {self.run_dir}; target {fmt_number(target)} tokens"
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

    def _on_run_resumed(self, d: dict) -> None:
        self.run_dir = d.get("run_dir")
        if d.get("phase") == "reach":
            self._say(f"resuming the lever search of run folder {self.run_dir}: its {d.get('attempts_done', 0)} "
                      f"boot(s) are kept; lever runs that finished are not repeated")
            return
        self._say(f"resuming run folder {self.run_dir}: {d.get('attempts_done', 0)} finished boot(s) kept; "
                  f"target {fmt_number(d.get('target'))} tokens; port {d.get('port')}")

    def _on_cleaned(self, d: dict) -> None:
        pid, detail = d.get("pid"), d.get("detail") or ""
        what = {"stopped": f"stopped a server left behind by a killed autotune (pid {pid}{': ' + detail if detail else ''})",
                "already_gone": f"its server (pid {pid}) was already gone",
                "pid_reused": f"pid {pid} now belongs to another process: left alone",
                "owner_alive": f"left alone: {detail}",
                "unreadable": detail,
                "marked_interrupted": f"marked interrupted: {detail}"}.get(d.get("action"), f"{d.get('action')} (pid {pid}) {detail}".rstrip())
        self._line(self._labelled("warning", f"cleanup: {Path(str(d.get('run_dir'))).name}: {what}"))

    def _on_warning(self, d: dict) -> None:
        self._line(self._labelled("warning", str(d.get("text") or d.get("message") or "")))

    def _on_recovery(self, d: dict) -> None:
        self._say(f"boot {d.get('index')}: recovering: {d.get('reason')}")

    def _probe_note(self, text: str) -> None:
        if self.live and self.boot is not None:
            self.boot.note = text
            self._draw()
        else:
            index = f"boot {self.boot.index}: " if self.boot is not None else ""
            self._say(f"{index}{text}")

    def _on_probe_request(self, d: dict) -> None:
        role = str(d.get("role", "request")).replace("_", " ")
        tokens = f" ({d['prompt_tokens']:,} prompt tokens)" if isinstance(d.get("prompt_tokens"), int) else ""
        self._probe_note(f"probe: sending the {role} request{tokens}")

    def _on_probe_request_done(self, d: dict) -> None:
        role = str(d.get("role", "request")).replace("_", " ")
        if d.get("ok"):
            ttft = f", first token after {fmt_duration(d['ttft_s'])}" if isinstance(d.get("ttft_s"), (int, float)) else ""
            self._probe_note(f"probe: {role} request served{ttft}")
        else:
            self._line(self._labelled("warning", f"probe: the {role} request failed: {d.get('reason')}"))

    def _on_autofit_read(self, d: dict) -> None:
        if self.boot is not None:
            self.boot.figures["autofit_max_model_len"] = d.get("value")
        self._say(f"boot {d.get('index')}: vLLM's auto-fit says {fmt_number(d.get('value'))} fits; "
                  "this vLLM would not serve the fitted length, so it is stopped and relaunched explicitly")

    def _on_reach_plan(self, d: dict) -> None:
        for line in d.get("explanation") or []:
            self._say(f"levers: {line}")

    def _on_reach_step(self, d: dict) -> None:
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

    def _on_reach_done(self, d: dict) -> None:
        reach = d.get("reach") or {}
        word = "reached the target" if reach.get("reached") else "did not reach the target"
        self._say(f"levers: {word} in {reach.get('boots', 0)} more boot(s), {fmt_duration(reach.get('duration_s'))}")

    def _on_attempt_started(self, d: dict) -> None:
        self.boot = _Boot(d.get("index", 0), d.get("max_model_len"), d.get("reason", ""), self.clock())
        length = d.get("max_model_len")
        shown = f"{length:,}" if isinstance(length, int) else str(length)
        self._say(f"boot {self.boot.index}: --max-model-len {shown} ({self.boot.reason})")
        if self.live and not self.quiet:
            self._draw()
            self._start_ticker()

    def _phase_changed(self, boot: _Boot) -> None:
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

    def _on_log_line(self, d: dict) -> None:
        boot = self.boot
        text = d.get("text", "")
        if self.show_log and not self.quiet:
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

    def _on_fact(self, d: dict) -> None:
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

    def _on_refused(self, d: dict) -> None:
        boot = self.boot
        if boot is not None:
            boot.move_to(REFUSED, self.clock())
        r = d.get("result") or {}
        need, have = r.get("kv_needed_gib"), r.get("refusal_available_kv_gib")
        est = r.get("estimated_max_model_len")
        text = f"boot {d.get('index')}: " + self._paint("refused", "red")
        if need is not None and have is not None:
            text += f": needs {need} GiB of KV cache, {have} GiB available"
        if isinstance(est, int):
            text += f"; vLLM estimates {est:,} tokens fit"
        self._say(text + "; stopping it now")

    def _on_stop_step(self, d: dict) -> None:
        pids = d.get("pids") or []
        text = f"stopping: {d.get('signal')} to {len(pids)} process{'es' * (len(pids) != 1)}"
        if self.live:
            if self.boot is not None:
                self.boot.note = text
                self._draw()
        else:
            self._say(f"  stopping server tree: {d.get('signal')} to pids {', '.join(map(str, pids))}")

    def _on_healthy(self, d: dict) -> None:
        if self.boot is not None and self.boot.move_to(READY, self.clock()) and self.live:
            self._draw()
        word = self._paint("healthy", "green") if d.get("verified", True) else self._paint("healthy, not verified", "red")
        self._say(f"boot {d.get('index')}: {word}; {d.get('reason', '')}".rstrip("; "))

    def _on_hung(self, d: dict) -> None:
        self._line(self._labelled("warning", f"boot {d.get('index')}: no output for "
                                             f"{fmt_duration(d.get('idle_s'))}: hung; stopping it"))

    def _on_stopping(self, d: dict) -> None:
        self._say(str(d.get("reason", "stopping")))

    def _on_attempt_ended(self, d: dict) -> None:
        attempt = d.get("attempt") or {}
        boot, self.boot = self.boot, None
        outcome = attempt.get("outcome", "?")
        colour = {"verified": "green", "refused": "yellow"}.get(outcome, "red")
        text = f"boot {d.get('index')}: {self._paint(outcome, colour)} after {fmt_duration(attempt.get('duration_s'))}"
        if attempt.get("error_kind"):
            text += f" ({attempt['error_kind']})"
        if attempt.get("refusal_to_stopped_s") is not None:
            text += f"; its process tree was gone {attempt['refusal_to_stopped_s']:.1f} s after the refusal"
        if boot is not None and len(boot.phases) > 1:
            end = boot.started + attempt["time_to_outcome_s"] if isinstance(
                attempt.get("time_to_outcome_s"), (int, float)) else self.clock()
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
        if outcome in ("error", "exited", "hung", "booted_not_verified"):
            self._line(self._labelled("error", text))
        else:
            self._say(text)
        with self._lock:
            self._clear()

    def _on_run_ended(self, d: dict) -> None:
        self.boot = None
        self._stop.set()
        self._clear()


def _truncate_visible(text: str, limit: int) -> str:
    """Cut text to `limit` visible characters, keeping ANSI sequences intact."""
    out, visible, i = [], 0, 0
    while i < len(text) and visible < limit - 1:
        found = _ANSI_RE.match(text, i)
        if found:
            out.append(found.group())
            i = found.end()
            continue
        out.append(text[i])
        visible += 1
        i += 1
    return "".join(out) + "…"


# ---------------------------------------------------------------------------
# The summary card (pure)
# ---------------------------------------------------------------------------

def _where(source: dict | None) -> str:
    if not source or not source.get("line"):
        return ""
    run = f"run {source['run']} " if source.get("run") else ""  # read in a lever run (--reach)
    return f"{run}attempt-{source.get('attempt')}.log line {source['line']}"


def _boot_list(attempts: list[dict]) -> str:
    parts = []
    for a in attempts:
        length = a.get("max_model_len")
        shown = f"{length:,} " if isinstance(length, int) else f"{length} " if length else ""
        fitted = (a.get("facts") or {}).get("autofit_max_model_len")
        if not isinstance(length, int) and isinstance(fitted, int):
            shown += f"(fitted {fitted:,}) "
        took = f" ({fmt_duration(a['duration_s'])})" if isinstance(a.get("duration_s"), (int, float)) else ""
        parts.append(f"{shown}{a.get('outcome', '?')}{took}")
    return ", ".join(parts)


def summary_warnings(record: dict) -> list[dict]:
    """Warnings about a finished run, each with a cause and a remedy (pure)."""
    result = record.get("result") or {}
    attempts = record.get("attempts") or []
    warnings: list[dict] = []
    for item in record.get("warnings") or []:  # recorded by other steps (preflight, probes)
        if isinstance(item, dict):
            warnings.append({"message": item.get("message") or item.get("kind", "warning"),
                             "cause": item.get("cause"), "remedy": item.get("fix") or item.get("remedy")})
        else:
            warnings.append({"message": str(item), "cause": None, "remedy": None})
    leftovers = sorted({pid for a in attempts for pid in ((a.get("stop") or {}).get("leftover_pids") or [])})
    if leftovers:
        warnings.append({
            "message": f"processes still alive after a boot was stopped: pids {', '.join(map(str, leftovers))}",
            "cause": "they ignored SIGINT, SIGTERM and SIGKILL within the stop's time limits",
            "remedy": "check them with `ps -o pid,stat,cmd -p PID` and stop them before the next boot; "
                      "they may still hold device memory"})
    refusals = [a for a in attempts if a.get("outcome") == "refused"]
    if len(refusals) > 1 and result.get("verdict") == "verified":
        warnings.append({
            "message": f"vLLM refused {len(refusals)} lengths before one booted",
            "cause": "its estimate is tight: re-profiling at a new length moved the available memory a little",
            "remedy": "nothing to do; keep some headroom if other processes share the device"})
    if result.get("verdict") == "verified" and isinstance(result.get("ceiling"), int) and \
            isinstance(record.get("target"), int) and result["ceiling"] < record["target"]:
        warnings.append({
            "message": f"the ceiling is {record['target'] - result['ceiling']:,} tokens short of the target",
            "cause": "the KV cache left after weights and activations holds fewer tokens than the target needs",
            "remedy": _levers(record)})
    return warnings


def _levers(record: dict) -> str:
    """What could still raise the ceiling, given the options this run already used."""
    argv = (record.get("result") or {}).get("final_argv") or (record.get("command") or {}).get("argv") or []
    gpus = (record.get("machine") or {}).get("gpus") or []
    levers = []
    seqs = servecmd.flag_value(argv, "--max-num-seqs")
    if seqs != "1":
        levers.append(f"lower --max-num-seqs (now {seqs or 'the default'}) toward 1")
    kv_bytes = servecmd.flag_value(argv, "--kv-cache-memory-bytes")
    if kv_bytes is not None:
        levers.append(f"raise --kv-cache-memory-bytes (now {kv_bytes}; it fixes the KV pool and "
                      "--gpu-memory-utilization is then ignored)")
    else:
        gmu = servecmd.flag_value(argv, "--gpu-memory-utilization")
        where = "of the NUMA node's RAM on the CPU backend" if not gpus else "of the GPU's memory"
        levers.append(f"raise --gpu-memory-utilization (now {gmu or 'the default'}; the share {where})")
    if gpus and servecmd.flag_value(argv, "--kv-cache-dtype") in (None, "auto"):
        levers.append("use --kv-cache-dtype fp8 where the GPU supports it (compute capability 8.9+)")
    return "; ".join(levers)


def _probe_lines(result: dict, attempts: list[dict]) -> list[str]:
    lines = []
    final = attempts[-1] if attempts else {}
    verification = final.get("verification") or {}
    checked = result.get("checked") if isinstance(result.get("checked"), dict) else None
    if checked:  # the ceiling was reached in a lever run (--reach): its check is the one that counts
        lines.append(f"  checked:  {checked.get('reason')} (run {checked.get('run')})")
    elif verification.get("reason"):
        lines.append(f"  checked:  {verification['reason']}")
    probe = result.get("probe") or final.get("probe") or verification.get("probe")
    if isinstance(probe, dict):
        mode = f"{probe['mode']} " if probe.get("mode") else ""
        head = f"  probe:    {mode}{'passed' if probe.get('ok') else 'FAILED'}"
        figures = []
        if isinstance(probe.get("prompt_tokens"), int):
            figures.append(f"{probe['prompt_tokens']:,} prompt tokens")
        if isinstance(probe.get("ttft_s"), (int, float)):
            figures.append(f"time to first token {fmt_duration(probe['ttft_s'])}")
        if isinstance(probe.get("prefill_tokens_per_s"), (int, float)):
            figures.append(f"prefill {probe['prefill_tokens_per_s']:,.0f} tokens/s")
        if isinstance(probe.get("growth_gib"), (int, float)):
            flagged = " (more than expected: vLLM preallocates the KV pool)" if probe.get("growth_flagged") else ""
            figures.append(f"memory growth {probe['growth_gib']} GiB{flagged}")
        lines.append(head + (": " + ", ".join(figures) if figures else ""))
        hol = probe.get("head_of_line") or {}
        if isinstance(hol.get("short_wait_s"), (int, float)):
            lines.append(f"            a short request sent during the long prefill waited {fmt_duration(hol['short_wait_s'])}")
        if not probe.get("ok") and probe.get("reason"):
            lines.append(f"            {probe['reason']}")
    return lines


def render_summary(record: dict, run_dir: str | Path | None = None) -> str:
    """The card printed at the end of a run (stdout) and by `autotune show`.

    ceiling vs target, the KV figures with the log line each was read from, boots and time,
    what verification showed, warnings with cause and remedy, and the files written.
    run_dir: where the run lives, for the file paths (default: the record's `_dir`).
    """
    r = record.get("result") or {}
    attempts = record.get("attempts") or []
    target = record.get("target")
    verdict = r.get("verdict")
    lines: list[str] = []
    ceiling = r.get("ceiling")
    if verdict == "verified" and isinstance(ceiling, int):
        if isinstance(target, int) and ceiling >= target:
            lines.append(f"Verified: --max-model-len {ceiling:,} (the target) boots and serves.")
        elif isinstance(target, int):
            lines.append(f"Verified ceiling: --max-model-len {ceiling:,} ({ceiling / target:.0%} of the target "
                         f"{target:,}; {target - ceiling:,} tokens short).")
        else:
            lines.append(f"Verified ceiling: --max-model-len {ceiling:,}.")
    elif verdict is None:
        lines.append(f"No result yet: the run is {record.get('state', 'unknown')}.")
    else:
        kind = f" ({r['error_kind']})" if r.get("error_kind") else ""
        lines.append(f"No verified ceiling: {verdict}{kind}. {r.get('reason', '')}".rstrip())
    if "available_kv_gib" in r:
        where = _where(r.get("available_kv_gib_source"))
        lines.append(f"  KV cache: {r['available_kv_gib']} GiB available" + (f"  ({where})" if where else ""))
    if "kv_cache_tokens" in r:
        where = _where(r.get("kv_cache_tokens_source"))
        pad = "  KV cache: " if "available_kv_gib" not in r else "            "
        lines.append(f"{pad}{r['kv_cache_tokens']:,} tokens" + (f"  ({where})" if where else ""))
    if r.get("diagnosis"):
        lines.append(f"  cause:    {r['diagnosis'].get('cause')}")
        lines.append(f"  fix:      {r['diagnosis'].get('fix')}")
    duration = record.get("duration_s")
    took = f" in {fmt_duration(duration)}" if isinstance(duration, (int, float)) else ""
    reach = record.get("reach") if isinstance(record.get("reach"), dict) else {}
    more = f" (+ {reach['boots']} in lever runs)" if reach.get("boots") else ""
    lines.append(f"  boots:    {len(attempts)}{took}: {_boot_list(attempts)}{more}" if attempts else "  boots:    none")
    lines.extend(_probe_lines(r, attempts))
    if reach.get("explanation"):
        for i, text in enumerate(reach["explanation"]):
            lines.append(("  levers:   " if i == 0 else "            ") + str(text))
    if isinstance(reach.get("interrupted"), dict):
        lines.append(f"  levers:   interrupted: {reach['interrupted'].get('by')}")
    for a in attempts:
        retries = a.get("http_retries") or []
        if retries:
            endpoints = ", ".join(sorted({str(x.get("endpoint")) for x in retries}))
            lines.append(f"  retries:  boot {a.get('index')}: {len(retries)} broken answer(s) from {endpoints} "
                         f"asked again (first: {retries[0].get('error')})")
    if record.get("vllm_version"):
        lines.append(f"  vLLM:     {record['vllm_version']}")
    if r.get("serving"):
        lines.append(f"  serving:  {r['serving'].get('url')} (pid {r['serving'].get('pid')}); "
                     "stop it with Ctrl-C in its terminal or `kill -INT PID`")
    for w in summary_warnings(record):
        lines.append(f"  Warning: {w['message']}")
        if w.get("cause"):
            lines.append(f"    cause:  {w['cause']}")
        if w.get("remedy"):
            lines.append(f"    remedy: {w['remedy']}")
    folder = run_dir if run_dir is not None else record.get("_dir")
    lines.append(f"  run:      {folder if folder else record.get('run_id')}")
    for i, name in enumerate(r.get("files") or []):
        lines.append(("  files:    " if i == 0 else "            ") + (str(Path(folder) / name) if folder else name))
    return "\n".join(lines)
