"""The summary card: printed at the end of a run and by `autotune show` (pure)."""

from __future__ import annotations

import signal
from collections.abc import Mapping
from pathlib import Path

from autotune.analysis import ranks as kv_ranks
from autotune.cli.formats import fmt_duration
from autotune.export import targets as deploy_targets
from autotune.run import levers as lever_rules
from autotune.run import strategy
from autotune.run import warnings as run_warnings
from autotune.store.outcomes import Basis, Verdict
from autotune.store.record import Attempt, Margin, ProbeResult, Reach, Recovery, Result, RunRecord, Verification
from autotune.vllm import servecmd
from autotune.vllm.log import LIMIT_SOURCES


def _result_of(run: RunRecord) -> Result:
    return run.result if isinstance(run.result, Result) else Result()


def _attempts_of(run: RunRecord) -> list[Attempt]:
    return [a for a in (run.attempts or []) if isinstance(a, Attempt)]

def _where(source: dict | None) -> str:
    if not source or not source.get("line"):
        return ""
    run = f"run {source['run']} " if source.get("run") else ""  # read in a lever run (--reach)
    return f"{run}attempt-{source.get('attempt')}.log line {source['line']}"


def _boot_list(attempts: list[Attempt]) -> str:
    parts = []
    for a in attempts:
        length = a.max_model_len
        shown = f"{length:,} " if isinstance(length, int) else f"{length} " if length else ""
        fitted = a.fact("autofit_max_model_len")
        if not isinstance(length, int) and isinstance(fitted, int):
            shown += f"(fitted {fitted:,}) "
        took = f" ({fmt_duration(a.duration_s)})" if isinstance(a.duration_s, (int, float)) else ""
        named = LIMIT_SOURCES.get(a.ceiling_source)  # refused above a limit vLLM named, not a failure
        parts.append(f"{shown}{f'above {named}' if named else a.outcome or '?'}{took}")
    return ", ".join(parts)


def _extensible_words(attempts: list[Attempt]) -> str:
    """vLLM 0.34's extensible KV cache, a setting of the run: on (the pool measured after CUDA-graph capture),
    or off and vLLM's reason ("" before 0.34, or where the log did not say)."""
    said = next((a for a in reversed(attempts) if a.fact("extensible_kv_cache") is not None), None)
    if said is None:
        return ""
    if said.fact("extensible_kv_cache") == "on":
        return " (extensible KV cache on: the pool measured after CUDA-graph capture and warmup)"
    why = said.fact("extensible_kv_cache_off_reason")
    return " (extensible KV cache off" + (f": {why}" if why else "") + ")"


def _unknown_failure_lines(result: Result, attempts: list[Attempt], run_dir: str | Path | None) -> list[str]:
    """A last boot that failed for a reason outside the catalog: what its log said last (its final
    exception line), how the server exited, and where the whole log is."""
    last = attempts[-1] if attempts else None
    if last is None or result.verdict == Verdict.VERIFIED or last.error_kind or \
            last.outcome not in ("error", "exited"):
        return []
    log = last.log or f"attempt-{last.index}.log"
    stated = last.facts.exception if last.facts is not None else None
    line = ((last.provenance if isinstance(last.provenance, dict) else {}).get("exception") or {}).get("line")
    if not stated:  # no exception line: the log's last words
        stated, line = next((text for text in reversed(last.log_tail or []) if text.strip()), None), None
    lines = [f"  failed:   {stated}" + (f"  ({log} line {line})" if line else "")] if stated else []
    lines += [f"            {text}" for text in _details_of(stated, last.traceback_tail or [])]
    status = last.exit_status
    if isinstance(status, int):
        lines.append(f"  exit:     {_exit_status(status)}")
    lines.append(f"  log:      {Path(run_dir) / log if run_dir else log}")
    return lines


def _hung_lines(attempts: list[Attempt], run_dir: str | Path | None) -> list[str]:
    """A last boot the stall watchdog stopped: the last line it printed (or that it printed none), and its log."""
    last = attempts[-1] if attempts else None
    if last is None or last.outcome != "hung":
        return []
    log = last.log or f"attempt-{last.index}.log"
    said = next((text for text in reversed(last.log_tail or []) if text.strip()), None)
    return [f"  last:     {said}" if said else "  last:     nothing: the command printed no line at all",
            f"  log:      {Path(run_dir) / log if run_dir else log}"]


def _details_of(stated: str | None, tail: list[str], most: int = 1, width: int = 160) -> list[str]:
    """The indented lines that continue an exception line in its traceback (pydantic's "Value error, ...")."""
    texts = [str(text) for text in tail]
    at = next((i for i, text in enumerate(texts) if stated and text.strip() and stated.startswith(text.strip())), None)
    if at is None:
        return []
    details = []
    for text in texts[at + 1 :]:
        if not text[:1].isspace() or not text.strip() or len(details) == most:
            break
        text = text.strip()
        details.append(text if len(text) <= width else text[: width - 3] + "...")
    return details


def _exit_status(status: int) -> str:
    if status >= 0:
        return f"status {status}"
    try:
        return f"killed by signal {-status} ({signal.Signals(-status).name})"
    except ValueError:
        return f"killed by signal {-status}"


def _mamba_line(attempts: list[Attempt]) -> list[str]:
    """A hybrid model's Mamba state bounds --max-num-seqs (recovery.py lowered it): concurrency, not length."""
    lowered = [a for a in attempts if (a.recovery or Recovery()).kind == "mamba_cache_blocks"]
    if not lowered:
        return []
    was, now = lowered[0].fact("max_num_seqs_refused"), lowered[-1].fact("mamba_cache_blocks")
    return [f"  seqs:     --max-num-seqs {now} (was {was}): vLLM has Mamba state for {now} sequences, a bound "
            "on concurrent requests, not on length"]


def _reach_lines(record: RunRecord, reach: Reach, run_dir: str | Path | None) -> list[str]:
    """The lever search of --reach: what it explained, each lever run and its ceiling, its best."""
    lines = []
    for i, text in enumerate(reach.explanation or []):
        lines.append(("  levers:   " if i == 0 else "            ") + str(text))
    for step in (reach.steps or []) if reach.explanation else []:
        ceiling = step.ceiling
        lines.append(f"            lever run {step.run_id}: {lever_rules.describe(step.lever, step.value)}"
                     f" -> {f'{ceiling:,}' if isinstance(ceiling, int) else step.verdict}")
    if isinstance(reach.interrupted, dict):
        lines.append(f"  levers:   interrupted: {reach.interrupted.get('by')}")
    return lines + _best_lines(record, reach, run_dir)


def _best_lines(record: RunRecord, reach: Reach, run_dir: str | Path | None) -> list[str]:
    """The lever search's best verified configuration, where a lever run beat the run itself."""
    best = reach.best
    if not isinstance(best, dict) or best.get("run_id") in (None, record.run_id) or record.result.reached_with_levers:
        return []
    where = Path(run_dir).parent / best["run_id"] if run_dir else Path(best["run_id"])
    lines = [f"  best:     --max-model-len {best['ceiling']:,} with {', '.join(best.get('changed') or []) or 'the same flags'}"
             f" (lever run {best['run_id']})"]
    lines += [f"            {where / name}" for name in best.get("files") or []][:1]
    return lines


def _probe_lines(result: Result, attempts: list[Attempt]) -> list[str]:
    lines = []
    final = attempts[-1] if attempts else Attempt()
    verification = final.verification or Verification()
    checked = result.checked if isinstance(result.checked, dict) else None
    if checked:  # the ceiling was reached in a lever run (--reach): its check is the one that counts
        lines.append(f"  checked:  {checked.get('reason')} (run {checked.get('run')})")
    elif verification.reason:
        lines.append(f"  checked:  {verification.reason}")
    probe = result.probe or final.probe or verification.probe
    if isinstance(probe, ProbeResult):
        lines.extend(probe_lines(probe))
    return lines


def probe_lines(probe: ProbeResult) -> list[str]:
    """A probe record (server/probe.py) as the card's lines: passed or FAILED, its figures, the head-of-line wait."""
    lines = []
    mode = f"{probe.mode} " if probe.mode else ""
    head = f"  probe:    {mode}{'passed' if probe.ok else 'FAILED'}"
    figures = []
    if isinstance(probe.prompt_tokens, int):
        figures.append(f"{probe.prompt_tokens:,} prompt tokens")
    if isinstance(probe.ttft_s, (int, float)):
        figures.append(f"time to first token {fmt_duration(probe.ttft_s)}")
    if isinstance(probe.prefill_tokens_per_s, (int, float)):
        figures.append(f"prefill {probe.prefill_tokens_per_s:,.0f} tokens/s")
    if isinstance(probe.growth_gib, (int, float)):
        flagged = " (more than expected: vLLM preallocates the KV pool)" if probe.growth_flagged else ""
        figures.append(f"memory growth {probe.growth_gib} GiB{flagged}")
    lines.append(head + (": " + ", ".join(figures) if figures else ""))
    hol = probe.head_of_line or {}
    if isinstance(hol.get("short_wait_s"), (int, float)):
        lines.append(f"            a short request sent during the long prefill waited {fmt_duration(hol['short_wait_s'])}")
    if not probe.ok and probe.reason:
        lines.append(f"            {probe.reason}")
    return lines


def _serving_line(serving: Mapping, run_id: str | None) -> str:
    """Where the server --keep-serving handed over serves (and listens), and how to stop it; or that
    it no longer runs."""
    url, pid, host = (serving.get(key) for key in ("url", "pid", "host"))
    if serving.get("stopped"):
        return f"  serving:  no longer (was {url}, pid {pid}; {serving['stopped'].get('by')})"
    where = f", listening on {_listened(['--host', host])}" if isinstance(host, str) else ""
    return (f"  serving:  {url} (pid {pid}{where}); yours now: "
            f"`autotune clean` leaves it running, `autotune stop {run_id}` stops it")


def _context_lines(record: RunRecord) -> list[str]:
    """The margin the run kept (--margin), and the run it reproduces."""
    lines = []
    kept = record.margin or Margin()
    if kept.summary:
        lines.append(f"  margin:   {kept.summary}")
    links = record.links or {}
    if links.get("reproduces"):
        lines.append(f"  reproduces {links['reproduces']} (`autotune compare {links['reproduces']} "
                     f"{record.run_id}` puts them side by side)")
    return lines


def _listened(argv: list[str]) -> str:
    """Where a boot with this argv listened."""
    uds, host = servecmd.flag_value(argv, "--uds"), servecmd.flag_value(argv, "--host")
    if uds:
        return f"unix:{uds}"
    if host:
        return f"{host} (this machine only)" if host == servecmd.LOOPBACK_HOST else host
    return "the container's network" if servecmd.is_container(argv) else "every interface (vLLM's default)"


def _listen_lines(record: RunRecord, attempts: list[Attempt]) -> list[str]:
    """Where the boots listened (autotune binds them to 127.0.0.1 unless the command says where), and
    that the paste-ready command keeps the command's own host, named (the kept server: _serving_line)."""
    where = [(a.index, _listened(list(a.argv or []))) for a in attempts if a.argv]
    if not where:
        return []
    distinct = list(dict.fromkeys(text for _, text in where))
    text = distinct[0] if len(distinct) == 1 else "; ".join(f"boot {i}: {w}" for i, w in where)
    user = list(record.command.argv or []) if record.command else []
    added = any(servecmd.flag_value(a.argv or [], "--host") != servecmd.flag_value(user, "--host")
                for a in attempts if a.argv)
    own = _listened(user) if user else "the command's own"
    return [f"  listened: {text}" + (f"; command.sh keeps the command's own host: {own}" if added else "")]


def _port_lines(record: RunRecord) -> list[str]:
    """The command's --port was in use as the run began: which port the boots used, which one
    command.sh keeps, and who held it."""
    in_use = record.command.port_in_use if record.command else None
    if not isinstance(in_use, dict):
        return []
    port, held_by, used = (in_use[key] for key in ("port", "held_by", "used"))
    return [f"  port:     your --port {port} was in use ({held_by}): the boots used {used}; command.sh keeps "
            f"--port {port} (free it before you run command.sh)"]


def render_summary(record: RunRecord, run_dir: str | Path | None = None) -> str:
    """The card printed at the end of a run (stdout) and by `autotune show`.

    ceiling vs target, the KV figures with the log line each was read from, boots and time,
    what verification showed, warnings with cause and remedy, and the files written.
    run_dir: where the run lives, for the file paths (without it, the run id is shown).
    """
    r = _result_of(record)
    attempts = _attempts_of(record)
    target = record.target
    verdict = r.verdict
    lines: list[str] = []
    ceiling = r.ceiling
    if verdict == Verdict.VERIFIED and isinstance(ceiling, int):
        if isinstance(target, int) and ceiling >= target:
            lines.append(f"Verified: --max-model-len {ceiling:,} (the target) boots and serves.")
        elif isinstance(target, int):
            lines.append(f"Verified ceiling: --max-model-len {ceiling:,} ({min(99, round(ceiling / target * 100))}% of the target "
                         f"{target:,}; {target - ceiling:,} tokens short).")
        else:
            lines.append(f"Verified ceiling: --max-model-len {ceiling:,}.")
    elif verdict is None:
        lines.append(f"No result yet: the run is {record.state or 'unknown'}.")
    else:
        kind = f" ({r.error_kind})" if r.error_kind else ""
        lines.append(f"No verified ceiling: {verdict}{kind}. {r.reason or ''}".rstrip())
        lines.extend(_unknown_failure_lines(r, attempts, run_dir))
        lines.extend(_hung_lines(attempts, run_dir))
    ranks = r.ranks
    if r.has("available_kv_gib"):
        where = _where(r.available_kv_gib_source)
        what = kv_ranks.describe(ranks) if ranks else f"{r.available_kv_gib} GiB available"
        lines.append(f"  KV cache: {what}" + (f"  ({where})" if where else ""))
    if r.has("kv_cache_tokens"):
        where = _where(r.kv_cache_tokens_source)
        pad = "  KV cache: " if not r.has("available_kv_gib") else "            "
        across = " across all ranks (each holds its share of every token)" if ranks else ""
        lines.append(f"{pad}{r.kv_cache_tokens:,} tokens{across}" + (f"  ({where})" if where else ""))
    lines.extend(_context_lines(record))
    if verdict == Verdict.VERIFIED and attempts and attempts[-1].basis in strategy.PREDICTED and r.reason:
        lines.append(f"  accepted: {r.reason}")  # a boot aimed from a prediction: how its own pool confirmed it
    if verdict == Verdict.VERIFIED and any(a.basis == Basis.FIXED_POINT for a in attempts) and r.reason:
        lines.append(f"  longest:  {r.reason}")  # the pool shrinks as the length grows: what proved the top
        lines.extend(_slope_line(record))
    if r.diagnosis:
        lines.append(f"  cause:    {r.diagnosis.get('cause')}")
        lines.append(f"  fix:      {r.diagnosis.get('fix')}")
    duration = record.duration_s
    took = f" in {fmt_duration(duration)}" if isinstance(duration, (int, float)) else ""
    reach = record.reach if isinstance(record.reach, Reach) else Reach()
    more = f" (+ {reach.boots} in lever runs)" if reach.boots else ""
    lines.append(f"  boots:    {len(attempts)}{took}: {_boot_list(attempts)}{more}" if attempts else "  boots:    none")
    lines.extend(_listen_lines(record, attempts))
    lines.extend(_port_lines(record))
    lines.extend(_probe_lines(r, attempts))
    lines.extend(_reach_lines(record, reach, run_dir))
    lines.extend(_mamba_line(attempts))
    for a in attempts:
        retries = a.http_retries or []
        if retries:
            endpoints = ", ".join(sorted({str(x.get("endpoint")) for x in retries}))
            lines.append(f"  retries:  boot {a.index}: {len(retries)} broken answer(s) from {endpoints} "
                         f"asked again (first: {retries[0].get('error')})")
    if record.vllm_version:
        lines.append(f"  vLLM:     {record.vllm_version}{_extensible_words(attempts)}")
    if r.serving:
        lines.append(_serving_line(r.serving, record.run_id))
    for w in run_warnings.of(record):  # decided as the run ended (run/warnings.py): the card only shows them
        lines.append(f"  Warning: {w.message}")
        if w.cause:
            lines.append(f"    cause:  {w.cause}")
        if w.remedy:
            lines.append(f"    remedy: {w.remedy}")
    folder = run_dir
    lines.append(f"  run:      {folder if folder else record.run_id}")
    lines += files_lines(r.files or [], folder)
    return "\n".join(lines)


def files_lines(files: list[str], folder) -> list[str]:
    """The paste-ready files a line each; the deployment files and the report on one line beside them."""
    beside = [name for name in files if name in deploy_targets.FILE_NAMES]
    lines = [("  files:    " if i == 0 else "            ") + (str(Path(folder) / name) if folder else name)
             for i, name in enumerate(name for name in files if name not in beside)]
    if beside:
        lines.append(f"  deploy:   {' '.join(beside)} (beside them)")
    return lines


def _slope_line(record: RunRecord) -> list[str]:
    """How fast the pool shrank as the length grew in this run's boots, and why: run.json's
    result.longest (recomputed for a record written before it; analysis/longest.py)."""
    from autotune.analysis import longest

    found = longest.of_record(record)
    if found is None or found.slope is None:
        return []
    return [f"  slope:    the pool loses {found.slope:.3f} tokens per token of --max-model-len: "
            f"{longest.describe_causes(found.slope_causes)}"]
