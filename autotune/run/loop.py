"""The boot loop of one run: ask the strategy for the next launch, boot it, record it, repeat.

Where is the next launch decided? strategy.next_step (run/strategy.py), from the attempts
so far. One boot is run/boot.py; the checks after it run/checks.py; the result when the
strategy says stop run/result.py. run.json is saved after every attempt.
"""

from __future__ import annotations

import time
from pathlib import Path

from autotune.analysis import boot_check
from autotune.events import Emit
from autotune.export import verified
from autotune.host import processes
from autotune.host.signals import GATE, Interrupted
from autotune.run import checks, strategy
from autotune.run import result as results
from autotune.run import warnings as run_warnings
from autotune.run.boot import BootContext, WatchedBoot, stop_server
from autotune.run.plan import RunPlan
from autotune.server import marker
from autotune.store import artifact
from autotune.store.record import Attempt, RunRecord
from autotune.vllm import servecmd


class Loop:
    """The boots of one run (a new one, or the rest of a resumed one)."""

    def __init__(self, record: RunRecord, run_dir: Path, plan: RunPlan, emit: Emit):
        self.record, self.run_dir, self.plan, self.opts, self.emit = record, run_dir, plan, plan.options, emit
        # What a recovery changes for the boots after it (_apply); the plan stays as derived.
        self.argv, self.port = list(plan.argv), plan.port
        self.summaries = checks.current_summaries(record.attempts)
        self.target = record.target  # --target max: the model's maximum once vLLM names it (_boot)
        self.user_port = plan.user_port
        self.kept = None  # the server --keep-serving handed over (server/handover.py), once verified
        self.t0 = time.monotonic()
        self.previous_duration = record.duration_s or 0.0
        self.boots = BootContext(run_dir, plan, emit, installed=record.vllm_version_detected)
        self.current = self.boots.current  # the server while one runs (WatchedBoot keeps it here)

    def run(self) -> RunRecord:
        opts, plan = self.opts, self.plan
        try:
            while True:
                step = strategy.next_step(self.target, self.summaries, opts.max_boots, plan.strategy_plan,
                                          plan.start_at, opts.back_off, plan.slack)
                if isinstance(step, strategy.Stop):
                    break
                self._boot(step)
        except Interrupted as exc:
            with GATE.deferred(drop=True):  # a second Ctrl-C must not abandon the stop half-way
                self._interrupted(exc)
            raise
        self._named_for_model()
        if opts.keep_serving and step.verdict == "verified" and isinstance(step.ceiling, int):
            self.kept = self._hand_over(step.ceiling)
        results.assemble(self.record, step, self.target, self.argv, self.user_port, self.run_dir, self.kept,
                         self.port)
        self.record.state = "finished"
        self._finish()
        return self.record

    def _boot(self, step: strategy.Launch) -> None:
        record, emit = self.record, self.emit
        index = len(record.attempts) + 1
        attempt_argv = servecmd.with_max_model_len(self.argv, step.max_model_len)
        reason = step.reason
        if self.opts.target_max and step.max_model_len == checks.TARGET_MAX_UNKNOWN:
            reason = "--target max: more than any model has, so that vLLM names this one's maximum"
        emit("attempt_started", index=index, max_model_len=step.max_model_len, reason=reason)
        attempt = WatchedBoot(self.boots, index, attempt_argv, self.port, step).run()
        attempt.reason = reason
        attempt.basis = step.basis
        record.attempts.append(attempt)
        record.vllm_version = record.vllm_version or attempt.fact("vllm_version")
        record.model = record.model or attempt.fact("model")  # vLLM's default when the command names none
        checks.check_flags(attempt, attempt_argv, emit)
        boot_check.attach(attempt, attempt_argv, emit)  # vLLM's KV figures against the model's files
        maximum = checks.model_maximum(attempt)
        if self.opts.target_max and maximum and maximum != self.target:
            self.target = record.target = maximum  # --target max: the model's own maximum, now that vLLM said it
        fix = checks.recovery(attempt, attempt_argv, record, emit)
        if fix is not None:
            self._apply(fix)  # this attempt does not count for the strategy
        self.summaries = checks.current_summaries(record.attempts)
        artifact.save_run(self.run_dir, record)
        emit("attempt_ended", index=index, attempt=attempt.to_dict())

    def _named_for_model(self) -> None:
        """The run folder and id of a command that names no model take the model vLLM said it serves."""
        named = artifact.named_for_model(self.run_dir, self.record.model)
        if named != self.run_dir:
            # The old id was printed (and, for an interrupted run, `autotune resume ID`): it stays
            # good (artifact.resolve_run finds the run by it).
            self.record.renamed_from = [*(self.record.renamed_from or []), self.run_dir.name]
            self.run_dir = self.boots.run_dir = named
            self.record.run_id = named.name
            self.emit("run_renamed", run_dir=str(named),
                      message=f"run folder {named}: vLLM serves {self.record.model} (the command names no model)")

    def _hand_over(self, ceiling: int):
        """--keep-serving: the verified command, launched to serve on after autotune (None: it did not
        serve; the run's result stands, the warning says why)."""
        from autotune.server import handover

        # On this machine only, as the tuning boots were, unless the command says where it listens:
        # a kept server has no key and may run for days (command.sh keeps the command's own host).
        argv = servecmd.listening_locally(served_as_the_files_say(servecmd.with_max_model_len(self.argv, ceiling)))
        try:
            return handover.relaunch(self.run_dir, argv, self.plan.env, self.port, ceiling,
                                     self.opts.stall_timeout_s, self.emit)
        except handover.HandOverFailed as exc:
            self.emit("warning", text=f"--keep-serving: nothing kept: {exc}")
            return None

    def _apply(self, fix) -> None:
        """A mechanical fix (recovery.py): the next boot relaunches with it."""
        if fix.new_argv:
            self.argv = servecmd.with_flag(fix.new_argv, servecmd.PORT, self.port)
        if fix.new_port:
            self.port = processes.free_port()
            self.argv = servecmd.with_flag(self.argv, servecmd.PORT, self.port)

    def _interrupted(self, exc: Interrupted) -> None:
        """Stop the server that runs (recorded as an interrupted attempt); the run ends interrupted."""
        record = self.record
        server = self.current.get("server")
        self._read_before_interruption()
        if server is not None:
            self.emit("stopping", reason=f"autotune got {exc}")
            stop = stop_server(server, processes.STAGES_GRACEFUL, self.emit)
            marker.remove(self.run_dir)
            record.attempts.append(Attempt.interrupted(len(record.attempts) + 1, server.log_path.name, server.argv,
                                                       server.pid, stop=stop))
        reason, lever_search = results.interrupted_reason(exc, record.run_id)
        exc.advice = f"`autotune resume {record.run_id}` continues it"
        record.mark_interrupted(artifact.iso(artifact.utc_now()), reason, lever_search)
        self._finish()

    def _read_before_interruption(self) -> None:
        """What the boot cut short had printed (its vLLM version, the model it loads): a run interrupted
        in its first boot still says which vLLM and model it ran (`runs`, `show`)."""
        parser = self.current.get("parser")
        if self.current.get("server") is None or parser is None:
            return
        seen = parser.result()
        self.record.vllm_version = self.record.vllm_version or seen.get("vllm_version")
        self.record.model = self.record.model or seen.get("model")

    def _finish(self) -> None:
        self.record.ended_at = artifact.iso(artifact.utc_now())
        self.record.duration_s = round(self.previous_duration + time.monotonic() - self.t0, 2)
        run_warnings.record_them(self.record)  # as the run ended: run.json, --json and the card carry them
        artifact.save_run(self.run_dir, self.record)
        self.emit("run_ended", record=self.record.to_dict(), run_dir=str(self.run_dir))


def served_as_the_files_say(argv: list[str]) -> list[str]:
    """The kept server answers to the name command.sh and every other paste-ready file serve
    (export/verified.py served_name: a local model folder's base name, as its path differs where the
    files run), so a client of the kept server works against any deployment of the run."""
    cmd = servecmd.parse_vllm_command(argv, strict=False)
    if cmd.model is None:
        return argv
    name, add = verified.served_name(cmd)
    return [*argv, "--served-model-name", name] if add else argv
