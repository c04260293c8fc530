"""One boot of vLLM: launch it, watch its log and its port, stop it, record the attempt.

WatchedBoot.run() launches the server and watches it until one thing happens; each has a short
method: a refusal (_refusal: stop at once, everything after it is teardown), auto-fit's
number read (_autofit), the process exiting (_exit), a fatal error in the log (_fatal),
the server answering (_health, then _serving: verify, probe), silence for --stall-timeout
(_hang), or a server that says it listens but never answers (_not_ready). What the log
says is read by vllm/log/ (its parser); what to boot next is decided by run/strategy.py.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from autotune.events import Emit
from autotune.host import launcher, memwait, processes
from autotune.host.signals import GATE
from autotune.run import strategy
from autotune.run.plan import RunPlan
from autotune.server import client, health, marker, queue_watch, witness
from autotune.store import artifact, redact
from autotune.store.record import Attempt, Verification, given
from autotune.vllm import servecmd
from autotune.vllm.log import BootLogParser, ceiling_from, diagnosis, limit_from, stall_diagnosis, traceback_tail

# How long a fatally failed boot gets to print the rest of its traceback and exit.
ERROR_GRACE_S = 10.0
POLL_S = 0.25
# A server that answers /health before its log says it listens: how long to read the log on
# (at most; less once it has been quiet that long) before verifying.
CATCH_UP_S = 5.0
CATCH_UP_QUIET_S = 1.0

# The log facts the progress output shows as soon as they appear.
LIVE_FACTS = ("vllm_version", "attention_backend", "weights_gib", "available_kv_gib", "kv_cache_tokens",
              "estimated_max_model_len", "autofit_max_model_len")


@dataclass
class BootContext:
    """What every boot of one run shares. `current["server"]` holds the server while one runs,
    so that the loop can stop it when autotune is interrupted."""

    run_dir: Path
    plan: RunPlan
    emit: Emit
    current: dict = field(default_factory=lambda: {"server": None})
    installed: str | None = None  # the vLLM version the serve command runs (vllm/versions.py), when known


class WatchedBoot:
    """One launch (attempt `index`, this argv and port, as the strategy's step asked), watched
    to its outcome."""

    def __init__(self, ctx: BootContext, index: int, argv: list[str], port: int, step: strategy.Launch):
        # A tuning boot serves this machine only (no key, all night); the server --keep-serving hands
        # over is launched afresh with the user's own host (server/handover.py), as command.sh says.
        self.index, self.port = index, port
        self.argv = servecmd.listening_locally(argv)
        self.env, self.run_dir, self.plan, self.opts = ctx.plan.env, ctx.run_dir, ctx.plan, ctx.plan.options
        self.emit, self.current, self.installed = ctx.emit, ctx.current, ctx.installed
        self.door = client.front_door_of(self.argv, self.env, port)  # key, TLS, root path, socket: how to reach it
        self.max_model_len = step.max_model_len
        self.auto = step.max_model_len == strategy.AUTO
        self.log_name = f"attempt-{index}.log"
        self.t_start = time.monotonic()
        self.attempt = Attempt(index=index, max_model_len=step.max_model_len, argv=self.argv, log=self.log_name,
                               started_at=artifact.iso(artifact.utc_now()))
        self.parser = BootLogParser()
        self.server: launcher.ServerHandle | None = None
        self.outcome: str | None = None
        self.line_no = 0
        self.rest_of_long_line = False  # the chunks after the first MAX_LINE_BYTES of a line are skipped
        self.fatal_seen_at: float | None = None
        self.listening_at: float | None = None
        self.verification: Verification | None = None
        self.time_to_outcome: float | None = None
        self.refusal_seen_at: float | None = None
        self.kill_delay: float | None = None
        self.first_signal_at: float | None = None
        self.gpu_baseline: dict | None = None
        self.caught_up = False  # the log was read on once /health answered before it said the server listens
        self.silent_after = 0  # a hung boot: the lines it had printed when the watchdog stopped it

    # ---- the boot, start to end -----------------------------------------------------------------

    def run(self) -> Attempt:
        """Boot once, stop the server (--keep-serving relaunches the verified command: handover.py);
        return the attempt."""
        self.gpu_baseline = memwait.gpu_used_gib(visible_indices(self.env))
        if not self._launch():
            return self.attempt
        self.attempt.pid = self.server.pid
        while self.outcome is None:
            self._read_lines()
            for check in (self._refusal, self._autofit, self._note_fatal, self._exit, self._fatal, self._health,
                          self._hang, self._not_ready):
                check()
                if self.outcome is not None:
                    break
        self._release()
        self._record()
        return self.attempt

    def _launch(self) -> bool:
        with GATE.deferred():  # a signal now is raised only once the server is on record
            try:
                self.server = launcher.current().start(self.argv, self.env, self.run_dir / self.log_name,
                                                       scrub=redact.scrub_log_line)
            except processes.LaunchError as exc:
                a = self.attempt
                a.outcome, a.error_kind, a.exit_status = strategy.ERROR, "command_not_found", None
                a.diagnosis = {"cause": str(exc),
                               "fix": "check the serve command after `--`: the program must exist on PATH"}
                a.facts, a.provenance = {}, {}
                a.duration_s = round(time.monotonic() - self.t_start, 2)
                return False
            self.current["server"], self.current["parser"] = self.server, self.parser  # read if interrupted
            marker.write(self.run_dir, self.server, self.index)
        return True

    def _read_lines(self) -> None:
        for raw in self.server.lines(timeout=POLL_S):
            self._feed(raw)
            if self.parser.refused:
                break

    def _feed(self, raw: bytes) -> None:
        # The server's output is read in chunks of at most MAX_LINE_BYTES: a longer line comes as a
        # chunk without its newline (cut: a number at its end may have lost digits), then the rest,
        # which the parser skips as parse_file does (the attempt's log on disk keeps the whole line).
        if self.rest_of_long_line:
            self.rest_of_long_line = not raw.endswith(b"\n")
            return
        cut = len(raw) >= processes.MAX_LINE_BYTES and not raw.endswith(b"\n")
        self.rest_of_long_line = cut
        self.line_no += 1
        self.emit("log_line", index=self.index, line_no=self.line_no,
                  text=raw.decode("utf-8", "replace").rstrip("\r\n"))
        for fact in self.parser.feed(raw, cut=cut):
            if fact.key in LIVE_FACTS:
                self.emit("fact", index=self.index, key=fact.key, value=fact.value, line_no=fact.line_no)
            if fact.key in ("listen_url", "server_ready") and self.listening_at is None:  # it says it is up
                self.listening_at = time.monotonic()

    def _elapsed(self) -> float:
        return time.monotonic() - self.t_start

    def _stop(self, stages) -> None:
        self.attempt.stop = stop_server(self.server, stages, self.emit)

    # ---- what can happen while it boots ---------------------------------------------------------

    def _refusal(self) -> None:
        """vLLM refused the length: stop at once (everything it prints after is teardown)."""
        if not self.parser.refused:
            return
        self.time_to_outcome = self._elapsed()
        self.refusal_seen_at = time.monotonic()
        self.emit("refused", index=self.index, result=self.parser.result())
        stop_started = time.monotonic()
        self._stop(processes.STAGES_FAST)
        self.kill_delay = round(time.monotonic() - self.refusal_seen_at, 3)
        if self.attempt.stop.steps:
            self.first_signal_at = stop_started + self.attempt.stop.steps[0]["at_s"]
        self.outcome = strategy.REFUSED

    def _autofit(self) -> None:
        """vLLM 0.14-0.19 would not serve the length it fitted: read the number, stop at once."""
        probing_autofit = self.auto and self.plan.strategy_plan == "auto_probe"
        parsed = self.parser.facts  # the log's facts so far, each with its line
        fitted = parsed.get("autofit_max_model_len") if probing_autofit else None
        if fitted is None:
            return
        self.time_to_outcome = self._elapsed()
        self.emit("autofit_read", index=self.index, value=fitted.value)
        self._stop(processes.STAGES_FAST)
        self.outcome = strategy.AUTOFIT_READ

    def _note_fatal(self) -> None:
        if self.parser.fatal and self.fatal_seen_at is None:
            self.fatal_seen_at = time.monotonic()
            self.time_to_outcome = self.fatal_seen_at - self.t_start

    def _exit(self) -> None:
        if self.server.poll() is None:
            return
        drain(self.server, self._feed)
        self.parser.close()  # the log has ended: one that ends in a traceback or ERROR line is an error
        self.time_to_outcome = self.time_to_outcome or self._elapsed()
        self.outcome = strategy.REFUSED if self.parser.refused else (
            strategy.ERROR if self.parser.outcome == "error" else strategy.EXITED)
        self._stop(processes.STAGES_FAST)  # leftovers of a dead parent

    def _fatal(self) -> None:
        """A fatal error in the log, and the process still there after the grace period."""
        if self.fatal_seen_at is not None and time.monotonic() - self.fatal_seen_at > ERROR_GRACE_S:
            self.outcome = strategy.ERROR
            self._stop(processes.STAGES_FAST)

    def _health(self) -> None:
        if self.fatal_seen_at is not None:
            return
        if self.listening_at is None:
            # Our server has not said it listens: whatever holds the port now (another process, a
            # socket that never accepts) is not a broken answer of ours, only "not up yet".
            healthy = health.health_ok(self.door)
        else:
            try:
                healthy = health.with_retries(lambda: health.health(self.door), "/health", self._on_retry)
            except health.Transient as exc:
                self.time_to_outcome = self._elapsed()
                self._not_verified(f"{exc}, still after {health.HTTP_RETRIES} retries")
                return
            except health.FrontDoorRefused as exc:  # TLS that does not match: not "not serving the length"
                self.time_to_outcome = self._elapsed()
                self._stop(processes.STAGES_GRACEFUL)
                self.verification = Verification(healthy=False, verified=False, reason=str(exc),
                                                 front_door=exc.to_dict(), door=self.door.describe())
                self.outcome = strategy.FRONT_DOOR
                return
        if healthy:
            if self.listening_at is None and not self.caught_up:
                self.caught_up = True
                self._catch_up()
                return  # what the log shows now goes through the checks first (a refusal, auto-fit's length)
            self._serving()

    def _catch_up(self) -> None:
        """/health answered before the log said the server listens: the log lags the socket (a pipe's
        reader behind a fast server: "Using max model len 262144" read, the auto-fit line not yet, and
        the derived length was taken for the fitted one), and what it has yet to show (auto-fit's
        length, a refusal, the KV pool) decides the verification. Read on until the log says the
        server is up (its listen line or uvicorn's startup line), or until the log is quiet."""
        deadline = time.monotonic() + CATCH_UP_S
        while self.listening_at is None and not self.server.output_closed and time.monotonic() < deadline:
            before = self.line_no
            self._read_lines()
            if self.line_no == before and self.server.idle_s() > CATCH_UP_QUIET_S:
                break

    def _serving(self) -> None:
        """It answers /health: check /v1/models serves the length, then probe it with real requests."""
        self.time_to_outcome = self._elapsed()
        expected = self.max_model_len
        if self.auto:
            # vLLM >= 0.20 serves the fitted length; the log says which (read up to its listen line: _health).
            parsed = self.parser.facts  # the log's facts so far, each with its line
            fitted = parsed.get("autofit_max_model_len") or parsed.get("max_model_len_resolved")
            expected = fitted.value if fitted else None
        ok, reason, evidence = health.check_serving(self.door, expected, self._on_retry)
        self.verification = Verification.from_dict({"healthy": True, "verified": ok, "reason": reason, **evidence,
                                                    "door": self.door.describe()})
        self.emit("healthy", index=self.index, verified=ok, reason=reason)
        self.outcome = (strategy.VERIFIED if ok else
                        strategy.FRONT_DOOR if "front_door" in evidence else strategy.NOT_VERIFIED)
        if ok:
            self._witnesses(expected)
        if self.outcome == strategy.VERIFIED and self.opts.probe != "none":
            self._probe(expected)
        self._stop(processes.STAGES_GRACEFUL)  # --keep-serving relaunches the verified command (handover.py)

    def _witnesses(self, expected: int) -> None:
        """What else says whether the length is served: /metrics' KV pool beside the log's figures
        (the second witness), and a pool the log shows below the length (a longer request would
        wait in vLLM's queue forever: no request needs to be sent to know it)."""
        log_facts = self.parser.result()
        version = log_facts.get("vllm_version")
        self.attempt.metrics = witness.read(self.door, log_facts, self.argv, version)
        queued = queue_watch.pool_below_length(log_facts, expected, self.argv, version)
        if queued and self.verification is not None:
            self.verification.verified = False
            self.verification.reason = f"{self.verification.reason}; but {queued}"
            self.outcome = strategy.QUEUED

    def _probe(self, expected: int) -> None:
        # Booting is not yet proof: fill the context with a real request (probe.py).
        from autotune.server import probe as probe_mod

        length = min(expected, self.plan.target) if self.plan.target else expected
        # Unpinned on a GPU machine: vLLM sees every GPU, so read them all (None means the CPU backend).
        indices = visible_indices(self.env)
        if indices is None and self.gpu_baseline:
            indices = sorted(self.gpu_baseline)
        self.attempt.probe = probe_mod.probe(self.door, length, self.opts.probe, self.server.pid, indices,
                                             emit=self.emit)
        if not self.attempt.probe.ok:
            self.outcome = strategy.QUEUED if self.attempt.probe.queued else strategy.PROBE_FAILED

    def _hang(self) -> None:
        if self.server.idle_s() > self.opts.stall_timeout_s:
            self.time_to_outcome = self._elapsed()
            self.silent_after = self.line_no  # (what it prints once stopped, a KeyboardInterrupt, is not why)
            self.emit("hung", index=self.index, idle_s=round(self.server.idle_s(), 1))
            self._stop(processes.STAGES_GRACEFUL)
            self.outcome = strategy.HUNG

    def _not_ready(self) -> None:
        if self.listening_at is not None and time.monotonic() - self.listening_at > self.opts.ready_timeout_s:
            self.time_to_outcome = self._elapsed()
            self._not_verified(f"the server said it listens but /health did not answer 200 in "
                               f"{self.opts.ready_timeout_s:.0f} s")

    def _not_verified(self, reason: str) -> None:
        # Up (or saying so) but not answering as a server should: stop it; the boot is not verified.
        self._stop(processes.STAGES_GRACEFUL)
        self.verification = Verification(healthy=False, verified=False, reason=reason)
        self.outcome = strategy.NOT_VERIFIED

    def _on_retry(self, retry: dict) -> None:
        # A transient HTTP failure while the server starts (health.with_retries): kept in run.json.
        retry["boot_s"] = round(self._elapsed(), 2)
        if self.attempt.http_retries is None or not isinstance(self.attempt.http_retries, list):
            self.attempt.http_retries = []
        self.attempt.http_retries.append(retry)
        self.emit("warning", text=f"boot {self.index}: {retry['error']}; asking again in {retry['wait_s']:g} s "
                                  f"(retry {retry['try']} of {health.HTTP_RETRIES})")

    # ---- after the stop -------------------------------------------------------------------------

    def _release(self) -> None:
        """The server is stopped: read the rest of its log, drop the marker, wait for its memory."""
        self.current["server"] = None
        drain(self.server, self._feed)
        self.parser.close()  # its final traceback or ERROR line becomes the stated cause (`exception`)
        marker.remove(self.run_dir)
        if self.gpu_baseline:
            # The next boot needs the memory this one held: wait until the driver shows it free.
            t_wait = time.monotonic()
            ok, after = memwait.wait_for_release(self.gpu_baseline)
            self.attempt.memory_release = {"released": ok, "waited_s": round(time.monotonic() - t_wait, 2),
                                           "before_boot_gib": self.gpu_baseline, "after_stop_gib": after}

    def _record(self) -> None:
        """The attempt's outcome, figures, ceiling and diagnosis."""
        a, outcome = self.attempt, self.outcome
        log_facts = self.parser.result()
        ceiling, source = (None, "none")
        if outcome == strategy.REFUSED or self.auto:
            ceiling, source = ceiling_from(log_facts)
        if ceiling is None and outcome in (strategy.ERROR, strategy.NOT_VERIFIED):
            ceiling, source = limit_from(log_facts)  # refused (or lowered) for a limit that is not memory
        if self.verification is not None and a.probe is not None and (
                outcome == strategy.PROBE_FAILED or outcome == strategy.QUEUED):
            self.verification.verified = False
            self.verification.reason = f"{self.verification.reason}; but the probe failed: {a.probe.reason}"
        failed = outcome in (strategy.ERROR, strategy.EXITED, strategy.REFUSED)
        a.outcome, a.exit_status = outcome, self.server.proc.returncode
        a.time_to_outcome_s = round(self.time_to_outcome, 2) if self.time_to_outcome is not None else None
        a.duration_s = round(self._elapsed(), 2)
        a.ended_at = artifact.iso(artifact.utc_now())
        a.facts, a.provenance = log_facts, self.parser.provenance()
        a.ceiling, a.ceiling_source = ceiling, source
        a.error_kind = log_facts.get("error_kind") if failed else None
        if self.kill_delay is not None:
            # From reading the refusal line to the first signal, and to the whole tree gone.
            a.refusal_to_signal_s = (round(self.first_signal_at - self.refusal_seen_at, 3)
                                     if self.first_signal_at else None)
            a.refusal_to_stopped_s = self.kill_delay
        if self.verification is not None:
            a.verification = self.verification
        self._diagnose(log_facts)

    def _diagnose(self, log_facts: dict) -> None:
        a = self.attempt
        if a.error_kind or a.outcome == strategy.ERROR:  # no known kind: its final exception line
            if self.installed and not log_facts.get("vllm_version"):  # a fix may name the version (a flag it lacks)
                log_facts = {**log_facts, "vllm_version": self.installed}
            found = diagnosis(log_facts, a.provenance)
            if found is not None:
                a.diagnosis = {"cause": found["cause"], "fix": found["fix"]}
        if a.outcome == strategy.EXITED and not given(a.diagnosis):
            a.diagnosis = {"cause": f"the server exited (status {self.server.proc.returncode}) before it was "
                                    "ready, and its log shows no known failure",
                           "fix": f"read the end of {self.log_name} in the run folder"}
        if a.outcome == strategy.FRONT_DOOR:
            refused = self.verification.front_door if self.verification is not None else None
            if refused:
                a.diagnosis = {"cause": refused["cause"], "fix": refused["fix"]}
        if a.outcome == strategy.HUNG:  # the phase it went silent in: the cause and fix, even with no line at all
            said = head(self.run_dir / self.log_name, self.silent_after)
            a.log_tail = [line[:300] for line in said[-15:]]
            a.diagnosis = stall_diagnosis(said[-400:], self.opts.stall_timeout_s)
        if a.outcome in (strategy.ERROR, strategy.EXITED):
            a.log_tail = tail(self.run_dir / self.log_name)
            traceback = traceback_tail(tail(self.run_dir / self.log_name, 400))
            if traceback:
                a.traceback_tail = traceback


def visible_indices(env: dict[str, str]) -> list[int] | None:
    """The GPU indices vLLM will use when CUDA_VISIBLE_DEVICES pins them by index; else None (all)."""
    value = env.get("CUDA_VISIBLE_DEVICES")
    if not value:
        return None
    try:
        return [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        return None


def drain(server: launcher.ServerHandle, feed: Callable[[bytes], None], limit_s: float = 5.0) -> None:
    deadline = time.monotonic() + limit_s
    while not server.output_closed and time.monotonic() < deadline:
        for raw in server.lines(timeout=0.1):
            feed(raw)


def stop_server(server: launcher.ServerHandle, stages, emit: Emit) -> dict:
    """Stop the server's process tree; how it went, as run.json keeps it ("stop")."""
    report = server.stop(stages, on_step=lambda step: emit("stop_step", pid=server.pid, **step))
    out = {"steps": report.steps, "leftover_pids": report.leftover_pids, "duration_s": report.duration_s}
    if report.removed_shm:
        out["removed_shm"] = report.removed_shm
    return out


def head(path: Path, n: int) -> list[str]:
    """The first ``n`` lines of a log."""
    try:
        with open(path, "rb") as fh:
            return [line.decode("utf-8", "replace").rstrip("\r\n") for line in itertools.islice(fh, n)]
    except OSError:
        return []


def tail(path: Path, n: int = 15) -> list[str]:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 300 * n - 4096))
            lines = fh.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return []
    return [line.rstrip("\r")[:300] for line in lines[-n:]]
