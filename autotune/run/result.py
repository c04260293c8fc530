"""A run's result (run.json "result"), assembled once the strategy says stop.

The verdict and the ceiling come from the strategy's Stop; the figures (available KV,
KV tokens, ...) from the last boot that ran to an outcome, each with where it was read;
a verified ceiling gets its command (final_argv) and the paste-ready files (export/local.py).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from autotune.analysis import longest
from autotune.analysis import ranks as kv_ranks
from autotune.export import write_all as write_paste_ready
from autotune.host.processes import ServerProcess
from autotune.run import strategy
from autotune.server import health
from autotune.server import kept as kept_servers
from autotune.store.record import RESULT_FIGURES, Attempt, BootFacts, Result, RunRecord
from autotune.vllm import servecmd

# A command whose boots printed no vLLM line and failed for no known reason: not a vLLM diagnosis.
NOT_VLLM = ("the command printed no vLLM log line (no version, no engine) before it ended: if `{command} ...` "
            "is not a vLLM server, autotune cannot tune it (it tunes `vllm serve ...`, "
            "`python -m vllm.entrypoints.openai.api_server ...`, or a script or container that runs one)")


def assemble(record: RunRecord, stop: strategy.Stop, target: int, argv: list[str], user_port: int | None,
             run_dir: Path, kept: ServerProcess | None, port: int) -> Result:
    """The result of a run whose boots are over; sets record.result (the paste-ready files are
    rendered from the record)."""
    verified = stop.verdict == "verified"
    done = record.boots_done()
    result = Result(verdict=stop.verdict, ceiling=stop.ceiling, verified=verified, reason=stop.reason,
                    target=target, target_reached=verified and stop.ceiling is not None and stop.ceiling >= target,
                    boots=len(record.attempts))
    if verified and stop.ceiling is not None and stop.ceiling < target and stop.limit:
        result.limit = stop.limit
    if stop.verdict == "error" and record.attempts and not any(a.fact("vllm_version") for a in record.attempts) \
            and not record.attempts[-1].error_kind:
        result.reason = NOT_VLLM.format(command=shlex.join(argv[:2]))
    if done:
        _from_last_boot(result, done[-1], verified)
        ranks = kv_ranks.kv_by_rank(argv, done[-1].facts or BootFacts())
        if ranks:
            result.ranks = ranks
    if verified:
        _longest(result, done)
        final_argv = servecmd.with_max_model_len(argv, stop.ceiling)
        # The command to keep uses the user's own port (a recovery may have moved it) or none.
        final_argv = (servecmd.with_flag(final_argv, servecmd.PORT, user_port) if user_port is not None
                      else servecmd.without_flag(final_argv, servecmd.PORT))
        result.final_argv = final_argv
        record.result = result
        result.files = write_paste_ready(run_dir, record)
    if kept is not None:
        handed = kept_servers.kept_marker(run_dir) or {}
        result.serving = {"pid": kept.pid, "port": port,
                          "url": (handed.get("kept") or {}).get("url") or health.base_url(port),
                          "host": servecmd.flag_value(kept.argv, "--host")}  # where it listens (the card)
    record.result = result
    return result


def _longest(result: Result, done: list[Attempt]) -> None:
    """Where the pool shrank as the length grew: vLLM's figure, the gap, the proof, the slope (analysis/longest.py)."""
    found = longest.longest_of([a for a in done if a.recovery is None], result)
    if found is not None:
        found.boots = result.boots
        result.longest = found


def _from_last_boot(result: Result, last: Attempt, verified: bool) -> None:
    """The figures, the failure and the probe of the last boot that ran to an outcome."""
    facts = last.facts if last.facts is not None else BootFacts()
    provenance = last.provenance if isinstance(last.provenance, dict) else {}
    for key in RESULT_FIGURES:
        if facts.has(key):
            setattr(result, key, getattr(facts, key))
            setattr(result, f"{key}_source", {"attempt": last.index, **provenance.get(key, {})})
    if last.error_kind or last.outcome in (strategy.FRONT_DOOR, strategy.HUNG):
        result.error_kind = last.error_kind
        result.diagnosis = last.diagnosis
    if last.probe:
        result.probe = last.probe
    if last.error_kind and not verified and last.no_recovery:
        result.reason += f"; {last.no_recovery}"


def interrupted_reason(exc: BaseException, run_id: str) -> tuple[str, str]:
    """What an interrupted run's result says, and what its interrupted lever search says."""
    return (f"autotune got {exc} and stopped the server; `autotune resume {run_id}` continues",
            f"autotune got {exc}; `autotune resume {run_id}` continues the lever search")


