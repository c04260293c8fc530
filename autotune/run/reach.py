"""The lever search of --reach: when the verified ceiling is short of the target, try the
levers (run/levers.py decides which and how far) with as few boots as the measurements allow.

Each lever boot is a tune of its own (a run folder linked to this one by links.reach_of), so
its evidence is kept the same way; this run's result moves to the lever run that reached the
target. Resumable by replay: the plan is a pure function of the measurements, so a resumed
search walks the same steps; a step whose lever run finished before the interruption is taken
from that run, an interrupted one is resumed, and only the rest boot.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from autotune.events import Emit
from autotune.export import write_all as write_paste_ready
from autotune.host.signals import GATE, Interrupted
from autotune.run import levers, margin, strategy
from autotune.run import warnings as run_warnings
from autotune.run.options import TuneOptions
from autotune.run.plan import RunPlan
from autotune.store import artifact, walk
from autotune.store.record import BootFacts, GpuPlan, Machine, Reach, ReachStep, Result, RunRecord
from autotune.vllm import servecmd
from autotune.vllm import versions as vllminfo

# How the search starts a lever run, and resumes an interrupted one (run/tune.py gives them).
StartRun = Callable[[TuneOptions, Emit], RunRecord]
ResumeRun = Callable[[Path, Emit, "dict[str, str] | None"], RunRecord]


def run_phase(record: RunRecord, run_dir: Path, plan: RunPlan, emit: Emit, start: StartRun,
              resume: ResumeRun) -> None:
    """The lever search, with the run `running` in phase `reach` until it ends, so that an
    interruption leaves it `interrupted` and resumable (the verified result stays)."""
    record.state = "running"
    record.phase = "reach"
    artifact.save_run(run_dir, record)
    try:
        LeverSearch(record, run_dir, plan, emit, start, resume).run()
    except Interrupted as exc:
        with GATE.deferred(drop=True):
            reason = f"autotune got {exc}; `autotune resume {record.run_id}` continues the lever search"
            record.mark_interrupted(artifact.iso(artifact.utc_now()), reason, reason)
            run_warnings.record_them(record)
            artifact.save_run(run_dir, record)
        raise
    record.state = "finished"
    record.drop("phase")
    run_warnings.record_them(record)  # the lever search changed the result: its warnings with it
    artifact.save_run(run_dir, record)


class LeverSearch:
    def __init__(self, record: RunRecord, run_dir: Path, plan: RunPlan, emit: Emit, start: StartRun,
                 resume: ResumeRun):
        self.record, self.run_dir, self.plan, self.opts, self.emit = record, run_dir, plan, plan.options, emit
        self.start, self.resume = start, resume
        self.target, self.max_gmu = plan.target, plan.max_gmu
        # The command the run booted (--margin's gmu in it): the levers change it.
        self.booted_argv = booted_argv(record)
        earlier = record.reach if isinstance(record.reach, Reach) else Reach()
        if isinstance(earlier.before_levers, Result):
            record.result = Result.from_dict(earlier.before_levers.to_dict())  # as the search first saw it
        self.result: Result = record.result
        # The lever runs an interrupted search already started, by command (the newest wins).
        self.runs_before = {tuple(r.command.argv): (d, r)
                            for d, r in reversed(walk.linked(plan.options.runs_dir, "reach_of",
                                                                      record.run_id))}
        self.reach = Reach(steps=[], reached=False, before_levers=Result.from_dict(self.result.to_dict()))
        record.reach = self.reach
        self.children: list[RunRecord] = []  # the lever runs, in order

    def run(self) -> None:
        record, reach = self.record, self.reach
        base, limits, gmu = self._baseline()
        if base is None:
            reach.explanation = ["the boot log showed no available KV memory to scale from; levers not tried"]
            artifact.save_run(self.run_dir, record)
            return
        plan = levers.plan_levers(self.target, servecmd.with_config(self.booted_argv, record.command.cwd), base, limits)
        reach.need_gib, reach.short_gib, reach.gmu_in_force = plan.need_gib, plan.short_gib, gmu
        reach.device_total_gib, reach.explanation = base.device_total_gib, list(plan.explanation)
        self.emit("reach_plan", explanation=plan.explanation)
        argv = self._walk(plan, base, limits)
        if not reach.reached:
            self._fp8(argv, limits, gmu)
        if not reach.reached:
            self._best_within_limits(argv, gmu)
        reach.best = best_of(self.record, self.children)
        if not reach.reached and reach.best["run_id"] != record.run_id:
            self._adopt(self._child(reach.best["run_id"]), f"stopped at {reach.best['ceiling']:,}, the best within "
                                                          f"your limits (lever run {reach.best['run_id']})", reached=False)
        elif not reach.reached:
            reach.explanation.append(f"stopped at {reach.best['ceiling']:,}")
        reach.boots = sum(step.boots for step in reach.steps)
        reach.duration_s = round(sum(step.duration_s or 0 for step in reach.steps), 2)
        record.duration_s = round((record.duration_s or 0) + reach.duration_s, 2)
        artifact.save_run(self.run_dir, record)
        self.emit("reach_done", reach=reach.to_dict())

    def _baseline(self):
        """(levers.Baseline or None when the log showed no available KV, limits, gmu in force)."""
        record = self.record
        last = [a for a in record.attempts if a.outcome == strategy.VERIFIED][-1]
        facts = last.facts if last.facts is not None else BootFacts()
        version_default = vllminfo.default_gmu(record.vllm_version) or vllminfo.LOWEST_DEFAULT_GMU
        if facts.cpu_worker_requested_gib and facts.cpu_node_total_gib:
            # The CPU backend prints what it reserved: that ratio is the gmu in force.
            version_default = round(facts.cpu_worker_requested_gib / facts.cpu_node_total_gib, 3)
        argv = servecmd.with_config(self.booted_argv, record.command.cwd)  # --config's values count
        gmu = levers.effective_gmu(argv, self.plan.env, version_default)
        gpus = (record.machine or Machine()).gpus or []
        total = gpus[0]["memory_total_gib"] if gpus else facts.cpu_node_total_gib
        pinned = (record.gpus or GpuPlan()).indices or [g["index"] for g in gpus]
        limits = levers.Limits(max_gmu=self.max_gmu, allow_kv_quant=self.opts.allow_kv_quant,
                               fp8_supported=levers.fp8_supported([g for g in gpus if g["index"] in pinned]))
        available = self.result.available_kv_gib
        if available is None:
            return None, limits, gmu
        printed = [a.facts.kv_needed_gib for a in record.attempts if a.max_model_len == self.target
                   and a.facts is not None and isinstance(a.facts.kv_needed_gib, (int, float))]
        found = self.result.longest  # where the pool shrinks as the length grows (analysis/longest.py)
        return (levers.Baseline(ceiling=self.result.ceiling, available_kv_gib=available, gmu=gmu,
                                device_total_gib=total, target_needed_gib=printed[-1] if printed else None,
                                slope=found.slope if found else None,
                                slope_causes=tuple(found.slope_causes or ()) if found else ()),
                limits, gmu)

    def _walk(self, plan, base, limits) -> list[str]:
        """The gmu the plan computed, or the levers it measures one by one; the argv reached."""
        target, reach = self.target, self.reach
        argv = list(self.booted_argv)
        if plan.gmu_needed is not None:
            child = self._try(levers.apply(argv, "gmu", plan.gmu_needed), "gmu", plan.gmu_needed)
            if child.result.target_reached:
                self._adopt(child, f"gpu-memory-utilization {plan.gmu_needed} reaches {target:,} tokens")
            else:
                reach.explanation.append(f"gpu-memory-utilization {plan.gmu_needed} was predicted to reach the "
                                         f"target but gave {child.result.ceiling}")
            if reach.reached or not plan.measure:  # levers that act on the slope are measured still
                return argv
        gained = 0.0
        for lever in plan.measure:
            argv = levers.apply(argv, lever)
            child = self._try(argv, lever)
            r = child.result
            if r.target_reached:
                self._adopt(child, f"{lever.replace('_', '-')} reaches {target:,} tokens")
                break
            if r.available_kv_gib is not None:
                gained = r.available_kv_gib - base.available_kv_gib
                reach.explanation.append(f"{lever.replace('_', '-')} changed available KV by {gained:+.2f} GiB "
                                         f"(measured)")
            needed = levers.after_measurement(target, base, gained, limits)
            if needed is not None:
                child = self._try(levers.apply(argv, "gmu", needed), "gmu", needed)
                if child.result.target_reached:
                    self._adopt(child, f"{', '.join(plan.measure[:plan.measure.index(lever) + 1])} and "
                                       f"gpu-memory-utilization {needed} reach {target:,} tokens")
                break
        return argv

    def _fp8(self, argv: list[str], limits, gmu) -> None:
        """The last lever: an fp8 KV cache, only where the GPU supports it and the user allowed it."""
        allowed, why = levers.fp8_kv_decision(
            servecmd.with_config(self.booted_argv, self.record.command.cwd), limits)
        self.reach.explanation.append(why)
        if allowed:
            best = levers.apply(argv, "gmu", self.max_gmu) if gmu is not None else argv
            child = self._try(levers.apply(best, "kv_fp8"), "kv_fp8", "fp8")
            if child.result.target_reached:
                self._adopt(child, f"an fp8 KV cache reaches {self.target:,} tokens")

    def _best_within_limits(self, argv: list[str], gmu: float | None) -> None:
        """Short of the target: boot every lever that helped together with gmu at --max-gmu (where gmu
        sizes the pool), unless a lever run already booted exactly that; the most this command can serve
        within the user's limits, which the search's headline and files then are."""
        if gmu is None or gmu >= self.max_gmu:
            return
        best = levers.apply(argv, "gmu", self.max_gmu)
        if any(list(c.command.argv) == best for c in self.children):
            return
        self.reach.explanation.append(f"booting the levers together at gpu-memory-utilization {self.max_gmu} "
                                      "(--max-gmu): the most within your limits")
        self._try(best, "gmu", self.max_gmu)

    def _child(self, run_id: str) -> RunRecord:
        return next(c for c in self.children if c.run_id == run_id)

    def _try(self, argv: list[str], lever: str, value=None) -> RunRecord:
        """One lever run: taken as it was, resumed, or started; recorded as a step."""
        opts = self.opts
        before = self.runs_before.get(tuple(argv))
        earlier_state = before[1].state if before else None
        if earlier_state == "finished":
            self.emit("reach_step", lever=lever, value=value, earlier="finished", run_id=before[1].run_id)
            child = before[1]
        elif earlier_state == "interrupted":
            self.emit("reach_step", lever=lever, value=value, earlier="interrupted", run_id=before[1].run_id)
            child = self.resume(before[0], self.emit, opts.env)
        else:
            self.emit("reach_step", lever=lever, value=value)
            child = self.start(TuneOptions(
                target=self.target, serve_argv=argv, runs_dir=opts.runs_dir, stall_timeout_s=opts.stall_timeout_s,
                max_boots=opts.max_boots, env=opts.env, extra_env=opts.extra_env, kind="reach-step",
                strategy=opts.strategy, probe=opts.probe, back_off=opts.back_off,
                links={"reach_of": self.record.run_id}), self.emit)
        r = child.result
        step = ReachStep(lever=lever, value=value, run_id=child.run_id, boots=len(child.attempts),
                         verdict=r.verdict, ceiling=r.ceiling, available_kv_gib=r.available_kv_gib,
                         duration_s=child.duration_s)
        if earlier_state:
            step.before_interruption = earlier_state  # finished: taken as it was; interrupted: resumed
        self.reach.steps.append(step)
        self.children.append(child)
        artifact.save_run(self.run_dir, self.record)
        return child

    def _adopt(self, child: RunRecord, how: str, reached: bool = True) -> None:
        """The lever run that reached the target (or, short of it, the best one) becomes this run's result."""
        r, result, reach = child.result, self.result, self.reach
        if reached:
            reach.reached = True
            reach.reached_by = child.run_id
        reach.explanation.append(how)
        result.ceiling, result.target_reached, result.reached_with_levers = r.ceiling, reached, child.run_id
        result.final_argv, result.reason = r.final_argv, f"{how} (run {child.run_id})"
        for key in ("available_kv_gib", "kv_cache_tokens", "max_concurrency"):
            if r.has(key):
                setattr(result, key, getattr(r, key))
                setattr(result, f"{key}_source", {**(getattr(r, f"{key}_source") or {}), "run": child.run_id})
        if r.ranks:  # the per-rank figures of the boot that reached it, not of the one before the levers
            result.ranks = r.ranks
        verified = [a for a in child.attempts if a.outcome == strategy.VERIFIED]
        if verified and verified[-1].verification is not None and verified[-1].verification.reason:
            result.checked = {"run": child.run_id, "reason": verified[-1].verification.reason}
        result.drop("probe")  # a probe at the lower length says nothing of this one
        if r.probe:
            result.probe = r.probe
        result.files = write_paste_ready(self.run_dir, self.record)


def booted_argv(record: RunRecord) -> list[str]:
    """The run's serve command as it booted: the user's, with --margin's gmu (run/margin.py)."""
    return margin.applied(list(record.command.argv), record.margin)


def best_of(record: RunRecord, children: list[RunRecord]) -> dict:
    """The best verified configuration of a lever search: the highest ceiling among the run (its
    result before the levers) and its lever runs; the run itself on a tie. Its command, what the
    levers changed in it, and its paste-ready files."""
    before = record.reach.before_levers if isinstance(record.reach.before_levers, Result) else record.result
    mine = {"run_id": record.run_id, "ceiling": before.ceiling, "argv": before.final_argv,
            "files": list(before.files or [])}
    best = mine
    for child in children:
        r = child.result
        if r.verified and isinstance(r.ceiling, int) and r.ceiling > (best.get("ceiling") or 0):
            best = {"run_id": child.run_id, "ceiling": r.ceiling, "argv": r.final_argv,
                    "files": list(r.files or [])}
    user = servecmd.with_config(booted_argv(record), record.command.cwd)
    best["changed"] = levers.changed_flags(user, best.get("argv") or user)
    return best
