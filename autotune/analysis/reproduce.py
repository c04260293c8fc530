"""`autotune reproduce` (pure): an old run and its re-tune in, what changed and the exit code out.

A reproduce tunes again toward the old run's *target* with its recorded command, on the vLLM
installed now, and runs the old run's probe. So an upgrade that gives more context shows as a
better ceiling, one that gives less as a worse one, and one that breaks long prompts as a
failed probe; TTFT and prefill tokens/s are compared where both runs probed the same length.

Tolerances (stated in every report): available KV, KV tokens and the ceiling, the larger of
0.02 GiB and 5% (identical vLLM boots differ by up to ~5%, vllm#54383); TTFT and prefill
tokens/s, a factor of 1.5 either way AND half a second of the request's time (one request each,
on a machine whose load moves timings by more than that; a 40 ms TTFT that doubles is noise). When
the memory vLLM budgets from moved (a CPU node's in a VM can), that change is expected and
only the rest counts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from autotune.analysis import upgrade
from autotune.analysis.compare import EXIT_ERROR, EXIT_REGRESSION, EXIT_SAME_OR_BETTER, EXIT_UNDETERMINED
from autotune.analysis.run_groups import TOLERANCE_FRACTION, tolerance_for
from autotune.analysis.run_row import run_row
from autotune.store.record import BootFacts, Command, ProbeResult, Result, RunRecord
from autotune.vllm import servecmd

TIMING_FACTOR = 1.5  # TTFT and prefill tokens/s: a change counts when 1.5x slower or faster
# ... and when it moves the request's time by at least this much: a 40 ms TTFT becoming 80 ms is 2x,
# and a scheduler's hiccup on a loaded machine, not vLLM (one request each side).
TIMING_FLOOR_S = 0.5
# installed_version(run record): the vLLM its command starts now (None: cannot be told)
InstalledVersion = Callable[[RunRecord], "str | None"]
SAME_LENGTH = 0.05  # two probes are timed alike when their prompts are within 5% in length


def reproduction_env(recorded: dict[str, str], current: dict[str, str], relevant_prefixes: tuple[str, ...],
                     mask: str) -> tuple[dict[str, str], list[str]]:
    """The environment to relaunch a recorded run in, and the recorded secrets missing now.

    Variables that change what vLLM does are taken from the record exactly: recorded ones are
    set, others of those kinds are removed. Secrets were never recorded (they read `mask`):
    their current values are used. Everything else (PATH, HOME, ...) stays as it is now.
    """
    env = {k: v for k, v in current.items() if not k.startswith(relevant_prefixes)}
    missing = []
    for name, value in recorded.items():
        if value == mask:
            if name in current:
                env[name] = current[name]
            else:
                missing.append(name)
        else:
            env[name] = value
    return env, missing


@dataclass
class ProbeComparison:
    """The old run's probe beside the new one's (each pair: [old, new])."""

    mode: str | None = None
    ok: list = field(default_factory=lambda: [None, None])  # None: that run ran no probe
    prompt_tokens: list = field(default_factory=lambda: [None, None])
    reason_new: str | None = None  # why the new run's probe failed
    note: str | None = None  # what was compared, or why the timings were not


@dataclass
class Reproduction:
    old_run: str
    new_run: str
    vllm_version: list[str | None]
    device_memory_gib: list[float | None]  # what vLLM budgets from (a CPU node's can move in a VM)
    available_kv_gib: list[float | None]
    kv_cache_tokens: list[int | None]
    ceiling: list[int | None]
    attention_backend: list[str | None]
    flags_no_longer_shown: list[str]  # in the old boot's non-default args, not in the new one's
    changes: list[dict]  # {"what", "before", "after", "delta", "expected", "unexplained", "tolerance", "status"}
    verdict: str  # same | better | changed (by what the upgrade changed in sizing: `causes`) | regression | error
    reason: str
    exit_code: int
    target: int | None = None  # the old run's target, which the reproduce tuned toward
    probe: ProbeComparison = field(default_factory=ProbeComparison)
    new_files: dict = field(default_factory=dict)  # the new run's paste-ready files: name -> path (runs dir/run/name)
    causes: list = field(default_factory=list)  # what the upgrade changed in sizing (analysis/upgrade.py)

    def __post_init__(self) -> None:
        if isinstance(self.probe, dict):  # a reproduction read back from its --json form
            self.probe = ProbeComparison(**self.probe)


def reproduce_verdict(old: RunRecord, new: RunRecord) -> Reproduction:
    """Old run vs its re-tune: what changed beyond what the machine explains, and the exit code.

    The command and gmu are the same, but the memory vLLM budgets from may not be (a CPU
    node's memory in a VM with hot-plugged memory): that change of budget is expected, and
    only the rest counts for the verdict. The figures themselves are reported as measured.
    """
    old_run, new_run = old, new
    o, n = run_row(old_run), run_row(new_run)
    o_facts, n_facts = _final_facts(old_run), _final_facts(new_run)
    o_args = o_facts.non_default_args or {}
    n_args = n_facts.non_default_args or {}
    gone = sorted(k for k in o_args if k not in n_args) if n_args else []
    budget_moved = (n.budget_gib - o.budget_gib) if o.budget_gib is not None and n.budget_gib is not None else 0.0
    tpg = o.tokens_per_gib or n.tokens_per_gib
    target = old.target
    changes = []
    if o.available_kv_gib is not None and n.available_kv_gib is not None:
        tol = tolerance_for(o.available_kv_gib, n.available_kv_gib, None)
        changes.append(_change("available KV GiB", o.available_kv_gib, n.available_kv_gib, budget_moved, tol.gib))
    if o.kv_cache_tokens is not None and n.kv_cache_tokens is not None:
        changes.append(_change("KV tokens", o.kv_cache_tokens, n.kv_cache_tokens,
                               budget_moved * tpg if tpg else 0.0,
                               TOLERANCE_FRACTION * max(o.kv_cache_tokens, n.kv_cache_tokens)))
    if o.ceiling is not None and n.ceiling is not None:
        # Both tuned toward the same target: neither can show more than it.
        expected = budget_moved * tpg if tpg else 0.0
        if target:
            expected = min(o.ceiling + expected, target) - o.ceiling
        changes.append(_change("ceiling", o.ceiling, n.ceiling, expected, TOLERANCE_FRACTION * o.ceiling))
    probe, timing = probe_changes(old_run, new_run)
    changes.extend(timing)
    verdict, reason = _verdict(new, changes, probe)
    why = upgrade.causes(o, n, o_facts.extensible_kv_cache, n_facts.extensible_kv_cache)
    moved = [c for c in changes if c["delta"]]
    if why and verdict in ("better", "regression", "same") and (verdict != "same" or budget_moved or moved) \
            and probe.ok[1] is not False:
        # The figures moved with what the upgrade changed in sizing: name that, not "better" or "regression".
        figures = "; ".join(f"{c['what']} {_num(c['before'])} -> {_num(c['after'])}" for c in moved) or reason
        verdict, reason = "changed", f"{figures}, as the upgrade changed sizing: " + "; ".join(why)
    if budget_moved and verdict != "error" and o.gmu != n.gmu:
        reason += (f"; the budget moved {budget_moved:+.2f} GiB with the gmu in force ({o.gmu:g} -> {n.gmu:g}), "
                   "which is not held against vLLM")
    elif budget_moved and verdict != "error":
        reason += (f"; the memory vLLM budgets from moved {o.device_memory_gib} -> {n.device_memory_gib} GiB "
                   f"({budget_moved:+.2f} GiB at gmu {o.gmu:g}), which is not held against vLLM")
    code = {"same": EXIT_SAME_OR_BETTER, "better": EXIT_SAME_OR_BETTER, "changed": EXIT_SAME_OR_BETTER,
            "regression": EXIT_REGRESSION,
            "error": EXIT_ERROR}[verdict]
    return Reproduction(
        old_run=o.run_id, new_run=n.run_id, vllm_version=[o.vllm_version, n.vllm_version],
        device_memory_gib=[o.device_memory_gib, n.device_memory_gib],
        available_kv_gib=[o.available_kv_gib, n.available_kv_gib],
        kv_cache_tokens=[o.kv_cache_tokens, n.kv_cache_tokens], ceiling=[o.ceiling, n.ceiling],
        attention_backend=[o_facts.attention_backend, n_facts.attention_backend],
        flags_no_longer_shown=gone, changes=changes, verdict=verdict, reason=reason, exit_code=code,
        target=target, probe=probe,
        new_files={name: f"{n.run_id}/{name}" for name in (new.result or Result()).files or []}, causes=why)


def _verdict(new: RunRecord, changes: list[dict], probe: ProbeComparison) -> tuple[str, str]:
    new_result = new.result or Result()
    if new_result.verdict == "probe_failed" or probe.ok[1] is False:
        return "regression", f"the probe failed on the new vLLM: {probe.reason_new or 'see the new run'}"
    if not new_result.verified:
        return "error", (f"the re-tune did not verify ({new_result.verdict}"
                         + (f", {new_result.error_kind}" if new_result.error_kind else "") + ")")
    worse = [c for c in changes if c["status"] == "worse"]
    if worse:
        return "regression", "; ".join(f"{c['what']} {_num(c['before'])} -> {_num(c['after'])} "
                                       f"(beyond the tolerance of {_num(c['tolerance'])})" for c in worse)
    better = [c for c in changes if c["status"] == "better"]
    if better:
        return "better", "; ".join(f"{c['what']} {_num(c['before'])} -> {_num(c['after'])}" for c in better)
    return "same", "no change beyond tolerance"


def probe_of(record: RunRecord) -> ProbeResult | None:
    """The probe of a run's final boot (None: it ran none)."""
    result = record.result or Result()
    if result.probe:
        return result.probe
    attempts = record.attempts or []
    return attempts[-1].probe if attempts else None


def probe_changes(old: RunRecord, new: RunRecord) -> tuple[ProbeComparison, list[dict]]:
    """The two probes side by side, and their timing changes where both probed alike.

    TTFT is lower-is-better, prefill tokens/s higher-is-better; both are compared only when the
    two prompts are within SAME_LENGTH of each other (a longer prompt takes longer by itself).
    """
    po, pn = probe_of(old), probe_of(new)
    summary = ProbeComparison(mode=(pn or po or ProbeResult()).mode, ok=[_ok(po), _ok(pn)],
                              prompt_tokens=[(po or ProbeResult()).prompt_tokens, (pn or ProbeResult()).prompt_tokens],
                              reason_new=pn.reason if pn and not pn.ok else None)
    if not po or not pn or not po.ok or not pn.ok:
        summary.note = ("no probe on either run" if not po and not pn else
                           "the old run ran no probe: nothing to time against" if not po else
                           "the new run ran no probe" if not pn else "a probe failed: no timings compared")
        return summary, []
    a, b = po.prompt_tokens, pn.prompt_tokens
    if not a or not b or abs(a - b) > SAME_LENGTH * max(a, b):
        summary.note = f"the probes' prompts differ in length ({_num(a)} vs {_num(b)} tokens): timings not compared"
        return summary, []
    out = []
    if po.ttft_s and pn.ttft_s:
        out.append(_timing_change("TTFT s", po.ttft_s, pn.ttft_s, pn.ttft_s - po.ttft_s, lower_is_better=True))
    if po.prefill_tokens_per_s and pn.prefill_tokens_per_s:
        seconds = b / pn.prefill_tokens_per_s - a / po.prefill_tokens_per_s  # the prefill's own time, moved
        out.append(_timing_change("prefill tokens/s", po.prefill_tokens_per_s, pn.prefill_tokens_per_s, seconds))
    summary.note = (f"both probed {_num(a)} vs {_num(b)} prompt tokens; timings within a factor of "
                    f"{TIMING_FACTOR:g}, or within {TIMING_FLOOR_S:g} s of the request's time, count as same")
    return summary, out


def _ok(probe: ProbeResult | None) -> bool | None:
    return None if not probe else bool(probe.ok)


def _final_facts(record: RunRecord) -> BootFacts:
    attempts = record.attempts or []
    return (attempts[-1].facts if attempts else None) or BootFacts()


def _change(what: str, before: float, after: float, expected: float, tolerance: float) -> dict:
    delta = after - before
    unexplained = delta - expected
    status = "worse" if unexplained < -tolerance else "better" if unexplained > tolerance else "same"
    return {"what": what, "before": before, "after": after, "delta": delta, "expected": expected,
            "unexplained": unexplained, "tolerance": tolerance, "status": status}


def _timing_change(what: str, before: float, after: float, seconds: float, lower_is_better: bool = False) -> dict:
    """A timing against the old one, as a ratio: worse or better beyond TIMING_FACTOR, and only where
    the request's time moved by TIMING_FLOOR_S or more (`seconds`: by how much; the tolerance, in the
    figure's unit, is the distance to the worse bound)."""
    speedup = before / after if lower_is_better else after / before
    status = "worse" if speedup < 1 / TIMING_FACTOR else "better" if speedup > TIMING_FACTOR else "same"
    if abs(seconds) < TIMING_FLOOR_S:
        status = "same"
    bound = before * TIMING_FACTOR if lower_is_better else before / TIMING_FACTOR
    return {"what": what, "before": before, "after": after, "delta": after - before, "expected": 0.0,
            "unexplained": after - before, "tolerance": abs(bound - before), "status": status,
            "tolerance_text": f"a factor of {TIMING_FACTOR:g} and {TIMING_FLOOR_S:g} s", "seconds": round(seconds, 3)}


def _num(value: object) -> str:
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float) and value >= 100:
        return f"{value:,.0f}"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


# ---- which runs are outdated ---------------------------------------------------------------------

def configuration_key(record: RunRecord) -> tuple:
    """What makes two runs the same configuration to re-measure: the command (without the
    lengths and ports autotune sets) and the environment that changes vLLM."""
    argv = list((record.command or Command()).argv or [])
    for flag in ("--max-model-len", "--port"):
        argv = servecmd.without_flag(argv, flag)
    env = record.environment or {}
    return tuple(argv), tuple(sorted(env.items())), record.target


def outdated(records: list[RunRecord], installed_version: InstalledVersion) -> list[tuple[RunRecord, str]]:
    """The newest verified run of each configuration whose vLLM is not the installed one, with
    that version. `installed_version(run_record)` says which vLLM the run's command would start now
    (None: unknown, the run is left out). Sweep points are left out: a sweep is re-run as a sweep."""
    out = []
    for record in configurations(records):
        now = installed_version(record)
        if now is not None and record.vllm_version != now:
            out.append((record, now))
    return out


def nothing_outdated(records: list[RunRecord], installed_version: InstalledVersion) -> str:
    """Why `reproduce --outdated` finds nothing to do, truthfully (the runs, or the versions, may be
    what is missing)."""
    found = configurations(records)
    if not found:
        return "no verified configuration is recorded (sweep points are reproduced as their sweep)"
    unknown = [record.run_id or "" for record in found if installed_version(record) is None]
    if len(unknown) == len(found):
        return ("which vLLM the recorded commands start now could not be found (their Python or `vllm` is not "
                "here), so none is known to be outdated")
    text = f"{len(found) - len(unknown)} verified configuration(s) were measured on the vLLM their command starts now"
    return text + (f"; for {', '.join(unknown)} the vLLM it starts now is unknown" if unknown else "")


def configurations(records: list[RunRecord]) -> list[RunRecord]:
    """The newest verified run of each configuration (sweep points left out)."""
    newest: dict[tuple, RunRecord] = {}
    for record in sorted(records, key=lambda r: (r.started_at or "", r.run_id or "")):
        if record.kind == "sweep-point" or not (isinstance(record.result, Result) and record.result.verified):
            continue
        newest[configuration_key(record)] = record
    return list(newest.values())


def undetermined(records: list[RunRecord], installed_version: InstalledVersion) -> list[str]:
    """The run ids of the verified configurations whose command's vLLM now cannot be told (a wrapper
    script, a container, a Python that is not here): `--outdated` checked nothing for them."""
    return [record.run_id or "" for record in configurations(records) if installed_version(record) is None]


def worst_exit(codes: list[int]) -> int:
    """One exit code for several reproduces: any regression 7, else any failure 3, else any
    configuration that could not be told 10, else 0."""
    for code in (EXIT_REGRESSION, EXIT_ERROR, EXIT_UNDETERMINED):
        if code in codes:
            return code
    return EXIT_SAME_OR_BETTER
