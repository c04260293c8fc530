"""A gmu sweep: one tune per --gpu-memory-utilization value, linked by sweep.json; resumable.

Composition only, like run/tune.py: the predictions and the fit come from analysis/ (compare, sweep_plan), each
value's boots from run/tune.py. `autotune sweep` creates and runs one; `autotune resume`
continues an interrupted one: finished values are kept as they are, the value whose run
was interrupted has that run resumed (its finished boots are not repeated), and the values
not reached yet run as they would have.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from autotune import __version__
from autotune.analysis import compare as cmp
from autotune.analysis import gmu_predict, run_row, sweep_plan
from autotune.events import Emit
from autotune.host import launcher
from autotune.host.signals import Interrupted, interruptible
from autotune.run import strategy as strategy_mod
from autotune.run import tune as tune_mod
from autotune.run.errors import PreflightFailed
from autotune.run.options import default
from autotune.server import leftovers
from autotune.store import artifact, walk
from autotune.store.record import Result, RunRecord, SweepPoint, SweepRecord
from autotune.store.sweeps import SWEEP_FILE, load, mark_interrupted, new_dir, save
from autotune.vllm import extensible, servecmd
from autotune.vllm import versions as vllminfo

Say = Callable[[str], None]


@dataclass
class SweepOptions:
    gmu_values: list[float]
    target: int
    # The defaults of the options a tune takes too are a tune's (run/options.py).
    strategy: str = default("strategy")  # as asked; sweep.json's "strategy" is what it became (strategy.sweep_plan)
    gpu: str | None = default("gpu")
    force: bool = default("force")
    allow_risky_gmu: bool = default("allow_risky_gmu")
    stall_timeout_s: float = default("stall_timeout_s")
    max_boots: int = default("max_boots")
    plot: str | None = None  # where to write the PNG; None: sweep.png in the sweep folder
    probe: str = "none"  # each value's probe (quick | full | none): a 100K+ token prefill on a CPU takes minutes
    # vLLM 0.34+ leaves gmu unset by default (1.0 with the extensible KV cache): the sweep runs that value with
    # the flag left out, as the command's own default (None: no such point).
    unset_gmu: float | None = None


def create(runs_dir: Path, argv: list[str], opts: SweepOptions) -> tuple[Path, SweepRecord]:
    """The sweep folder and its first sweep.json (state running, no points yet)."""
    model = servecmd.model_of(argv)
    strategy, strategy_reason = strategy_mod.sweep_plan(
        opts.strategy, vllminfo.auto_fit_mode(launcher.detect_version(argv, dict(os.environ))))  # (asked once more below)
    version = launcher.detect_version(argv, dict(os.environ))
    on, _ = extensible.extensible_kv_cache(argv, version)
    if vllminfo.gmu_is_unset_by_default(version) and on:
        # 0.34: the default is no value at all; what a pod without the flag gets is a point of its own.
        opts.unset_gmu = vllminfo.default_gmu(version, True)
        if opts.unset_gmu not in opts.gmu_values:
            opts.gmu_values = [*opts.gmu_values, opts.unset_gmu]
    sweep_dir = new_dir(Path(runs_dir), model)
    sweep = SweepRecord(
        kind="sweep", sweep_id=sweep_dir.name, autotune_version=__version__, state="running",
        started_at=artifact.iso(artifact.utc_now()), ended_at=None, model=model, target=opts.target,
        serve_argv=servecmd.without_flag(argv, run_row.GMU_FLAG), strategy=strategy, strategy_reason=strategy_reason,
        gmu_values=list(opts.gmu_values), options=asdict(opts), owner=leftovers.owner_stamp(),
        points=[], boots_used=0, boots_without_predictions=None,
        boots_2k=2 * len(opts.gmu_values), boots_saved=0, fit=None, plot=None)
    save(sweep_dir, sweep)
    return sweep_dir, sweep


def options_of(sweep: SweepRecord) -> SweepOptions:
    """The options a sweep was started with (sweeps written before options were kept: the defaults)."""
    stored = sweep.options if isinstance(sweep.options, dict) else {}
    known = {k: v for k, v in stored.items() if k in SweepOptions.__dataclass_fields__}
    known.update(gmu_values=list(sweep.gmu_values), target=sweep.target,
                 strategy=sweep.strategy or known.get("strategy", "refusal"))
    return SweepOptions(**known)


def resume(sweep_dir: Path, runs_dir: Path, progress: Emit, say: Say, warn: Say):
    """Continue an interrupted sweep; see run()."""
    tune_mod.clean_leftovers(Path(runs_dir), progress)  # a SIGKILLed sweep becomes interrupted here
    sweep = load(sweep_dir)
    if sweep.state != "interrupted":
        raise artifact.ArtifactError(f"{Path(sweep_dir) / SWEEP_FILE}: state is {sweep.state!r}; only an "
                                     "interrupted sweep can be resumed")
    sweep.resumed_at = [*(sweep.resumed_at or []), artifact.iso(artifact.utc_now())]
    sweep.drop("interrupted_by")
    say(f"resuming sweep {sweep.sweep_id}: {len(sweep.points or [])} of {len(sweep.gmu_values)} value(s) "
        "finished")
    return run(Path(sweep_dir), sweep, Path(runs_dir), progress, say, warn)


def run(sweep_dir: Path, sweep: SweepRecord, runs_dir: Path, progress: Emit, say: Say, warn: Say):
    """Tune every value not finished yet; return (sweep, member run records, compare report).

    Raises Interrupted after marking the sweep interrupted (the member run is marked
    by tune itself); a value that fails or is refused by preflight does not stop the others.
    """
    opts = options_of(sweep)
    argv = list(sweep.serve_argv)
    values = opts.gmu_values
    n = len(values)
    sweep.state, sweep.ended_at, sweep.owner = "running", None, leftovers.owner_stamp()
    save(sweep_dir, sweep)
    records = _finished_records(sweep, runs_dir, warn)
    members = _members(runs_dir, sweep.sweep_id)
    try:
        with interruptible():
            for i, gmu in enumerate(values, 1):
                if i <= len(sweep.points):
                    continue  # finished before an interruption: kept as it is
                prediction = _prediction(records, gmu) if opts.strategy == "refusal" else None
                planned = sweep_plan.sweep_aim(prediction, opts.target)
                start_at, aim = planned.start_at, planned.reason
                member = members.get(i)
                try:
                    if member is not None:
                        record, start_at, aim = _continue_member(member, i, n, gmu, start_at, aim, progress, say)
                    else:
                        _say_plan(say, i, n, gmu, prediction, start_at, aim, opts.strategy)
                        record = tune_mod.tune(tune_mod.TuneOptions(
                            target=opts.target, serve_argv=argv if gmu == opts.unset_gmu else
                            servecmd.with_flag(argv, run_row.GMU_FLAG, gmu),
                            runs_dir=runs_dir, stall_timeout_s=opts.stall_timeout_s, max_boots=opts.max_boots,
                            start_at=start_at, slack=planned.slack_tokens, probe=opts.probe,
                            kind="sweep-point", strategy=opts.strategy, gpu=opts.gpu,
                            force=opts.force, allow_risky_gmu=opts.allow_risky_gmu,
                            links={"sweep_id": sweep.sweep_id, "sweep_index": i}), progress)
                except PreflightFailed as exc:
                    warn(f"sweep {i}/{n}: gmu {gmu:g}: not booted: a preflight check says it cannot work "
                         "(--force boots anyway)")
                    for problem in exc.problems:
                        warn(problem.render())
                    sweep.points.append(SweepPoint(
                        gmu=gmu, run_id=None, verdict="preflight_refused", ceiling=None, start_at=start_at,
                        start_at_reason=aim, prediction=None, boots=0, boots_without_prediction=0, saved=0,
                        note="; ".join(getattr(p, "why", str(p)) for p in exc.problems)))
                    _count_boots(sweep)
                    save(sweep_dir, sweep)
                    continue
                records.append(record)
                outcome = sweep_plan.sweep_point_outcome(record, start_at)
                result = record.result if isinstance(record.result, Result) else Result()
                point = SweepPoint(gmu=gmu, run_id=record.run_id, verdict=result.verdict or None,
                                   ceiling=result.ceiling, start_at=start_at, start_at_reason=aim,
                                   prediction=asdict(prediction) if prediction else None)
                sweep.points.append(SweepPoint.from_dict({**point.to_dict(), **outcome}))  # sweep_plan.sweep_point_outcome
                _count_boots(sweep)
                save(sweep_dir, sweep)
                say(f"sweep {i}/{n}: gmu {gmu:g}: {result.verdict or None}"
                    + (f" at {result.ceiling:,}" if result.ceiling else "")
                    + f" in {outcome['boots']} boot(s): {outcome['note']}")
    except Interrupted as exc:
        mark_interrupted(sweep_dir, sweep, f"autotune got {exc}")
        raise

    report = cmp.compare(records)
    group = max((g for g in report.groups if g.fit is not None), key=lambda g: len(g.run_ids), default=None)
    sweep.fit = asdict(group.fit) if group else None
    _plot(sweep, sweep_dir, report, opts, say, warn)
    sweep.state, sweep.ended_at = "finished", artifact.iso(artifact.utc_now())
    save(sweep_dir, sweep)
    return sweep, records, report


def _say_plan(say: Say, i: int, n: int, gmu: float, prediction, start_at, aim: str, strategy: str) -> None:
    if strategy != "refusal":
        say(f"sweep {i}/{n}: gmu {gmu:g}: --strategy {strategy}: vLLM fits the length itself, one boot")
        return
    if prediction is not None and prediction.ceiling is not None:
        say(f"sweep {i}/{n}: gmu {gmu:g}: predicted ceiling {prediction.ceiling:,} ({prediction.basis})")
    else:
        say(f"sweep {i}/{n}: gmu {gmu:g}: no prediction yet")
    say(f"sweep {i}/{n}: " + (f"booting {start_at:,} first: {aim}" if start_at else aim))


def _continue_member(member: tuple[Path, RunRecord], i: int, n: int, gmu: float, start_at, aim: str,
                     progress: Emit, say: Say):
    """The value whose run was interrupted: resume that run (or take it, if it finished just
    before the sweep could record it). Its own start_at stands: it was booted with it."""
    run_dir, record = member
    start_at = record.options.start_at if record.options else None
    aim = aim if start_at is None else f"{aim} (as booted before the interruption)"
    if record.state == "finished":
        say(f"sweep {i}/{n}: gmu {gmu:g}: run {run_dir.name} had finished; taken as it is")
        return record, start_at, aim
    say(f"sweep {i}/{n}: gmu {gmu:g}: resuming run {run_dir.name}")
    return tune_mod.resume(run_dir, progress), start_at, aim


def _members(runs_dir: Path, sweep_id: str) -> dict[int, tuple[Path, RunRecord]]:
    """Each value's newest member run that is interrupted or finished (by sweep_index)."""
    found: dict[int, tuple[Path, RunRecord]] = {}
    for run_dir, record in walk.linked(runs_dir, "sweep_id", sweep_id):
        index = record.link("sweep_index")
        if isinstance(index, int) and index not in found and record.state in ("interrupted", "finished"):
            found[index] = (run_dir, record)
    return found


def _finished_records(sweep: SweepRecord, runs_dir: Path, warn: Say) -> list[RunRecord]:
    """The run records of the points finished so far (the predictions and the fit use them)."""
    records = []
    for point in sweep.points:
        if not point.run_id:
            continue
        try:
            record = artifact.load(runs_dir / point.run_id)
        except artifact.ArtifactError as exc:
            warn(f"Warning: the run of gmu {point.gmu:g} cannot be read ({exc}); it is left out of the fit")
            continue
        records.append(record)
    return records


def _prediction(records: list[RunRecord], gmu: float) -> gmu_predict.GmuPrediction | None:
    """The prediction for the next value from the values so far that verified (analysis/next_boot.py)."""
    from autotune.analysis import device_memory, next_boot

    node = device_memory.node_memory_bytes()
    prediction, _ = next_boot.predict_next(records, None, gmu, node / 2**30 if node else None)
    return prediction


def _count_boots(sweep: SweepRecord) -> None:
    sweep.boots_used = sum(p.boots for p in sweep.points)
    sweep.boots_without_predictions = sum(p.boots_without_prediction for p in sweep.points)
    sweep.boots_saved = sum(p.saved for p in sweep.points)
    sweep.boots_interrupted = sum(p.boots_interrupted or 0 for p in sweep.points)


def _plot(sweep: SweepRecord, sweep_dir: Path, report, opts: SweepOptions, say: Say, warn: Say) -> None:
    from autotune.analysis import plot as plot_mod

    try:
        sweep.plot = str(plot_mod.write_plot(report, Path(opts.plot) if opts.plot else sweep_dir / "sweep.png"))
    except (plot_mod.PlotUnavailable, ValueError, OSError) as exc:  # the sweep's result matters more
        (warn if opts.plot else say)(f"Warning: no plot: {exc}" if opts.plot else f"(no plot: {exc})")
