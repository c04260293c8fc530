"""What to launch next (pure): the target and the attempts so far in, the next step out.

The refusal path works on every vLLM version: boot at the target; if vLLM refuses,
it says (or lets us compute) the largest length that fits, so boot there next. The
estimate is tight and re-profiling can move available memory by a few MiB, so a
boot at the estimate may be refused again with a slightly lower estimate: each
refusal strictly lowers the length, so the loop ends.
"""

from __future__ import annotations

from dataclasses import dataclass

# Attempt outcomes, as recorded in run.json.
VERIFIED = "verified"  # healthy and /v1/models reports the asked length
NOT_VERIFIED = "booted_not_verified"  # healthy, but the server does not serve the asked length
REFUSED = "refused"  # vLLM's KV-cache refusal
ERROR = "error"  # another fatal failure (see error_kind)
EXITED = "exited"  # the process ended with no known cause in its log
HUNG = "hung"  # no output for --stall-timeout seconds
INTERRUPTED = "interrupted"  # autotune itself was stopped


@dataclass(frozen=True)
class AttemptSummary:
    max_model_len: int
    outcome: str
    ceiling: int | None = None  # what the log says fits, when it says
    ceiling_source: str = "none"
    error_kind: str | None = None


@dataclass(frozen=True)
class Launch:
    max_model_len: int
    reason: str


@dataclass(frozen=True)
class Stop:
    verdict: str  # verified | refused_no_ceiling | nothing_fits | error | hung | not_verified | max_boots
    ceiling: int | None
    reason: str


def next_step(target: int, attempts: list[AttemptSummary], max_boots: int = 6) -> Launch | Stop:
    if not attempts:
        return Launch(target, "the target")
    last = attempts[-1]
    if last.outcome == VERIFIED:
        if last.max_model_len == target:
            return Stop("verified", target, "the target itself boots")
        return Stop("verified", last.max_model_len,
                    f"{last.max_model_len} is the largest length vLLM accepts here "
                    f"({last.max_model_len - target:+d} tokens against the target {target})")
    if last.outcome == NOT_VERIFIED:
        return Stop("not_verified", None, "the server booted but does not serve the length asked for")
    if last.outcome == HUNG:
        return Stop("hung", None, f"the boot at {last.max_model_len} stopped producing output")
    if last.outcome == INTERRUPTED:
        return Stop("interrupted", None, "autotune was interrupted")
    if last.outcome in (ERROR, EXITED):
        kind = last.error_kind or "unknown"
        return Stop("error", None, f"the boot at {last.max_model_len} failed ({kind}), not for lack of KV cache")
    if last.outcome == REFUSED:
        if last.ceiling is None:
            return Stop("refused_no_ceiling", None,
                        "vLLM refused the length but its log gives no figure to compute a ceiling from")
        nxt = min(last.ceiling, last.max_model_len - 1)
        if nxt <= 0:
            return Stop("nothing_fits", None, "vLLM says not even one token of context fits")
        if len(attempts) >= max_boots:
            return Stop("max_boots", None, f"gave up after {len(attempts)} boots (--max-boots)")
        how = {"estimate": "vLLM's estimate", "computed_from_gib": "computed from the GiB figures vLLM printed",
               "v0_kv_capacity": "the KV capacity vLLM printed", "autofit": "vLLM's auto-fit"}
        return Launch(nxt, f"the ceiling from attempt {len(attempts)} ({how.get(last.ceiling_source, last.ceiling_source)})")
    return Stop("error", None, f"unexpected attempt outcome {last.outcome!r}")
