"""What to launch next (pure): the target and the attempts so far in, the next step out.

Three plans, chosen from the installed vLLM version (vllminfo.auto_fit_mode):

- refusal (every version): boot at the target; if vLLM refuses, it says (or lets us
  compute) the largest length that fits, so boot there next. The estimate is tight and
  re-profiling can move available memory by a few MiB, so a boot at the estimate may be
  refused again with a slightly lower estimate: each refusal strictly lowers the length,
  so the loop ends.
- auto (vLLM >= 0.20): one boot with `--max-model-len auto`; vLLM fits the length and
  serves it. The target is the cap vLLM lacks: a fit at or above it proves the target.
- auto_probe (0.14-0.19): the same boot only to read the fitted length (the API server
  would not serve it), then one explicit boot at min(fit, target).

A first boot may also start at a predicted length instead of the target (a sweep's
prediction, or a tune's from this machine's runs of the same command). History only chooses
where to start, never what is accepted: a verified boot below the target proves a ceiling only
if it came from vLLM's own number, or if it is the ceiling the boot's own KV pool shows (vLLM
serves no request longer than its pool; less the slack a group showed between pool and ceiling:
none, or the null block). Below that, the next boot is there, and vLLM serves it or refuses it
with its own estimate. Only a length computed from a refusal's GiB figures (vLLM 0.8.4-0.9.0.1
print no estimate) may be accepted up to ROOM_TOLERANCE under its pool.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.run import fixed_point

# The words a run records (store/outcomes.py), re-exported: run/ reads them as strategy.VERIFIED and so on.
from autotune.store.outcomes import (  # noqa: F401
    AUTOFIT_READ,
    ERROR,
    EXITED,
    FRONT_DOOR,
    HUNG,
    INTERRUPTED,
    KV_CACHE,
    LIMITS,
    NOT_VERIFIED,
    PREDICTED,
    PROBE_FAILED,
    QUEUED,
    REFUSED,
    VERIFIED,
    Basis,
    Verdict,
)

PLANS = ("refusal", "auto", "auto_probe")
ROOM_TOLERANCE = 0.01
BACK_OFF = 0.10  # --back-off: after a failed probe, retry this fraction lower

AUTO = "auto"  # the value of --max-model-len for an auto-fit boot


@dataclass(frozen=True)
class AttemptSummary:
    max_model_len: int | str  # a length, or "auto"
    outcome: str
    ceiling: int | None = None  # what the log says fits, when it says (refusal estimate or auto-fit)
    ceiling_source: str = "none"  # estimate | ... (memory), or a LIMITS source: not memory
    error_kind: str | None = None
    basis: str = Basis.TARGET  # why this length was booted (a Basis)
    kv_cache_tokens: int | None = None  # the KV capacity the boot reported
    index: int | None = None  # the boot's number in its run (interrupted or recovered boots count too)
    limit: str = KV_CACHE  # what its ceiling is (LIMITS): an auto-fit at the model's (or a draft's) full length is not memory
    pool_at: int | None = None  # the length its pool was measured at (auto: the full length it profiled)
    grid: int = 16  # vLLM's step of lengths here: the KV block size
    holds_null: bool = True  # vLLM keeps one block of the pool back (0.29+)
    pool_moves: str | None = None  # why this boot's pool shrinks as the length grows, where its log or command says
    concurrency: float | None = None  # vLLM's "Maximum concurrency" at this length (the pool over one request)


@dataclass(frozen=True)
class Launch:
    max_model_len: int | str
    reason: str
    basis: str = Basis.TARGET


@dataclass(frozen=True)
class Stop:
    verdict: Verdict
    ceiling: int | None
    reason: str
    limit: str | None = None  # a verified ceiling below the target: what set it (LIMITS)



_HOW = {"estimate": "vLLM's estimate", "computed_from_gib": "computed from the GiB figures vLLM printed",
        "v0_kv_capacity": "the KV capacity vLLM printed", "autofit": "vLLM's auto-fit"}


def next_step(target: int, attempts: list[AttemptSummary], max_boots: int = 6, plan: str = "refusal",
              start_at: int | None = None, back_off: bool = False, slack: int | None = None) -> Launch | Stop:
    if not attempts:
        return _first_launch(target, plan, start_at)

    last = attempts[-1]
    n = len(attempts)
    boot = last.index or n
    converging = fixed_point.next_step(target, attempts, n, max_boots)
    if converging is not None:  # the pool shrinks as the length grows: the longest length that boots
        if converging.stop:
            return Stop(Verdict.VERIFIED, converging.length, converging.reason, KV_CACHE)
        return Launch(converging.length, converging.reason, Basis.FIXED_POINT)
    if last.outcome == VERIFIED:
        if last.max_model_len == AUTO:
            fit = last.ceiling
            if fit is None:
                return Stop(Verdict.NOT_VERIFIED, None, "the auto-fit boot did not say which length it fitted")
            if fit >= target:
                return Stop(Verdict.VERIFIED, target,
                            f"the target fits: vLLM's auto-fit served {fit} >= {target} in one boot")
            return Stop(Verdict.VERIFIED, fit, f"{fit} is the length vLLM's auto-fit served ({fit - target:+d} against the target)",
                        last.limit)
        length = int(last.max_model_len)
        if length >= target:
            return Stop(Verdict.VERIFIED, target, "the target itself boots")
        if last.basis == Basis.POOL:
            return Stop(Verdict.VERIFIED, length, f"{length:,} is the longest request vLLM admits here: its KV pool "
                                            f"({length - target:+,} tokens against the target)", KV_CACHE)
        if last.basis in PREDICTED and last.kv_cache_tokens is not None:
            before = attempts[-2].kv_cache_tokens if n > 1 else None
            room = _room_step(target, last, length, boot, n, max_boots, slack, before)
            if room is not None:
                return room
        return Stop(Verdict.VERIFIED, length,
                    f"{length} is the largest length vLLM accepts here ({length - target:+d} tokens against the target {target})",
                    attempts[-2].limit if last.basis == Basis.CEILING and n > 1 else KV_CACHE)
    if last.outcome == AUTOFIT_READ:
        if last.ceiling is None:
            return Stop(Verdict.ERROR, None, "the auto-fit boot stopped without a fitted length")
        if n >= max_boots:
            return Stop(Verdict.MAX_BOOTS, None, f"gave up after {n} boots (--max-boots)")
        nxt = min(last.ceiling, target)
        return Launch(nxt, f"vLLM's auto-fit length {last.ceiling}" + (" capped at the target" if nxt == target else "")
                      + " (this vLLM does not serve an auto-fitted length itself)", Basis.CEILING)
    if last.outcome in (PROBE_FAILED, QUEUED):
        return _requests_failed(target, last, n, boot, max_boots, back_off)
    if last.outcome in (ERROR, EXITED, NOT_VERIFIED) and last.ceiling is not None and last.limit != KV_CACHE:
        return _limit_step(target, last, boot, n, max_boots)
    if last.outcome == NOT_VERIFIED:
        return Stop(Verdict.NOT_VERIFIED, None, "the server booted but does not serve the length asked for")
    if last.outcome == FRONT_DOOR:
        return Stop(Verdict.FRONT_DOOR, None, f"the server booted at {last.max_model_len}, but its front door turned "
                                        "autotune away (see the diagnosis)")
    if last.outcome == HUNG:
        return Stop(Verdict.HUNG, None, f"the boot at {last.max_model_len} stopped producing output")
    if last.outcome == INTERRUPTED:
        return Stop(Verdict.INTERRUPTED, None, "autotune was interrupted")
    if last.outcome in (ERROR, EXITED):
        kind = last.error_kind or "unknown"
        return Stop(Verdict.ERROR, None, f"the boot at {last.max_model_len} failed ({kind}), not for lack of KV cache")
    if last.outcome == REFUSED:
        if last.ceiling is None:
            return Stop(Verdict.REFUSED_NO_CEILING, None,
                        "vLLM refused the length but its log gives no figure to compute a ceiling from")
        asked = int(last.max_model_len)
        nxt = min(last.ceiling, asked - 1, target)
        if nxt <= 0:
            return Stop(Verdict.NOTHING_FITS, None, "vLLM says not even one token of context fits")
        if n >= max_boots:
            return Stop(Verdict.MAX_BOOTS, None, f"gave up after {n} boots (--max-boots)")
        return Launch(nxt, f"the ceiling from boot {boot} ({_HOW.get(last.ceiling_source, last.ceiling_source)})",
                      Basis.COMPUTED if last.ceiling_source == "computed_from_gib" else Basis.CEILING)
    return Stop(Verdict.ERROR, None, f"unexpected attempt outcome {last.outcome!r}")


def _first_launch(target: int, plan: str, start_at: int | None) -> Launch:
    if plan == "auto" and start_at is not None and start_at < target:
        # Only where the group's pool shrinks as the length grows (run/aim.py): auto would stop short.
        return Launch(start_at, "the group's fixed point (auto profiles at the full length and stops short)",
                      Basis.START_AT)
    if plan in ("auto", "auto_probe"):
        return Launch(AUTO, "vLLM's --max-model-len auto fits the length in one boot", Basis.AUTO)
    if start_at is not None and start_at < target:
        return Launch(start_at, "the predicted ceiling", Basis.START_AT)
    return Launch(target, "the target", Basis.TARGET)


def _requests_failed(target: int, last: AttemptSummary, n: int, boot: int, max_boots: int,
                     back_off: bool) -> Launch | Stop:
    """After a boot that serves the length but whose requests do not: one that waits in vLLM's
    queue forever is followed by its KV pool where the log showed it; else --back-off goes lower."""
    served = last.ceiling if last.max_model_len == AUTO else last.max_model_len
    pool = last.kv_cache_tokens
    if last.outcome == QUEUED and pool is not None and served is not None and pool < int(served):
        if n >= max_boots:
            return Stop(Verdict.MAX_BOOTS, None, f"gave up after {n} boots (--max-boots)")
        return Launch(min(pool, target), f"boot {boot} booted at {int(served):,}, but a longer request than its "
                                         f"KV pool ({pool:,} tokens) waits in vLLM's queue forever", Basis.POOL)
    if not back_off or served is None:
        what = "waited in its queue forever" if last.outcome == QUEUED else "failed"
        return Stop(Verdict.NOT_VERIFIED, None, f"the server booted at {served} but a near-ceiling request {what}"
                    + ("" if back_off else " (--back-off retries lower)"))
    if n >= max_boots:
        return Stop(Verdict.MAX_BOOTS, None, f"gave up after {n} boots (--max-boots)")
    lower = int(int(served) * (1 - BACK_OFF))
    return Launch(min(lower, target), f"boot {boot} booted at {served} but its probe failed: backing off "
                                      f"{int(served) - lower} tokens ({BACK_OFF:.0%})", Basis.BACK_OFF)


_LIMIT_TEXT = {"model_maximum": "the model's own maximum", "max_num_batched_tokens":
               "--max-num-batched-tokens (chunked prefill is off)", "draft_model": "the draft model's max_model_len"}


def _limit_step(target: int, last: AttemptSummary, boot: int, n: int, max_boots: int) -> Launch | Stop:
    """vLLM refused (or lowered) the length for a limit that is not memory, and named it: boot there."""
    asked, ceiling = last.max_model_len, int(last.ceiling)
    nxt = min(ceiling, target)
    what = _LIMIT_TEXT.get(last.limit, last.limit)
    if isinstance(asked, int) and nxt >= asked:
        return Stop(Verdict.ERROR, None, f"boot {boot} at {asked:,} was refused for {what} ({ceiling:,}), which is not below it")
    if n >= max_boots:
        return Stop(Verdict.MAX_BOOTS, None, f"gave up after {n} boots (--max-boots)")
    head = f"{what}, {ceiling:,}" + (" (capped at the target)" if nxt < ceiling else "")
    return Launch(nxt, f"{head}: vLLM {'lowered' if last.limit == 'draft_model' else 'refused'} "
                       f"{asked if isinstance(asked, str) else format(asked, ',')} at boot {boot}", Basis.CEILING)


def _room_step(target: int, last: AttemptSummary, length: int, boot: int, n: int, max_boots: int,
               slack: int | None, pool_before: int | None = None) -> Launch | Stop | None:
    """A predicted (or room, or computed) boot verified: is it the ceiling its own KV pool shows?

    vLLM serves no request longer than its pool, so the ceiling is at most the pool's token count;
    with the slack a group showed (what vLLM keeps between its pool and its ceiling: none, or the null
    block) it is exactly pool - slack. A length under that is not accepted: the next boot is there
    (or at the pool itself where the slack is unknown or does not hold: vLLM serves it, or refuses
    it with its own estimate). Under it stay only: a computed length (no estimate printed), within
    ROOM_TOLERANCE; and, where a real machine's pool moves between boots (the replay's never does), a
    predicted boot closer to its pool than the slack, or a room boot whose pool moved within
    ROOM_TOLERANCE of the pool it was aimed from."""
    pool = int(last.kv_cache_tokens)
    # A boot aimed at pool - slack that shows room again: the memory moved, or the slack does not hold
    # here; the pool itself is next (vLLM serves it, or refuses it with its own estimate).
    trusted = slack is not None and pool - slack >= length and (last.basis != Basis.ROOM or pool - slack == length)
    fits = pool - slack if trusted else pool
    told = (f"{pool:,} tokens less vLLM's {slack:,}-token slack" if fits != pool else f"a pool of {pool:,} tokens")
    if length >= min(fits, target):
        return Stop(Verdict.VERIFIED, length, f"{length:,} boots and is the ceiling its KV pool shows ({told}; "
                                        f"{length - target:+,} against the target)", KV_CACHE)
    if slack is not None and last.basis == Basis.START_AT and pool - slack < length:
        # Closer to its pool than the group's slack: the slack was learnt a little too large (on a real
        # machine the pool moves by a few MiB between boots), and vLLM's ceiling lies between this boot
        # and its pool; booting the pool would only be refused and cost a third boot.
        return Stop(Verdict.VERIFIED, length, f"{length:,} boots, within the {slack:,}-token slack the group showed of its "
                                        f"{pool:,}-token pool ({length - target:+,} against the target)", KV_CACHE)
    if last.basis == Basis.COMPUTED and pool <= length * (1 + ROOM_TOLERANCE):
        return Stop(Verdict.VERIFIED, length, f"{length:,} boots and is within {ROOM_TOLERANCE:.0%} of the {pool:,} tokens "
                                        f"its KV pool shows ({length - target:+,} against the target)", KV_CACHE)
    if last.basis == Basis.ROOM and pool_before is not None and pool != pool_before \
            and abs(pool - pool_before) <= pool_before * ROOM_TOLERANCE:
        # Aimed at the last boot's pool, this boot's pool came out a little different: vLLM re-profiles
        # every boot, and on a real machine the pool moves by a few MiB between boots of one command
        # (93,056 then 93,696 tokens on the CPU backend). Chasing it would not end; the boot stands.
        return Stop(Verdict.VERIFIED, length, f"{length:,} boots; it was aimed at the {pool_before:,}-token pool of the boot "
                                        f"before, and this boot's pool ({pool:,}) moved by vLLM's re-profiling "
                                        f"({length - target:+,} against the target)", KV_CACHE)
    if n >= max_boots:
        return Stop(Verdict.VERIFIED, length, f"{length:,} boots; its KV pool ({told}) shows room for {fits:,}, "
                                        f"but --max-boots is reached", KV_CACHE)
    return Launch(min(target, fits), f"boot {boot} at {length:,} showed {told}: {fits:,} fits", Basis.ROOM)


def sweep_plan(requested: str, auto_fit: str | None) -> tuple[str, str]:
    """The strategy a sweep tunes its values with, and why (auto_fit: versions.auto_fit_mode).

    vLLM that serves an auto-fitted length does each value in one boot, which no prediction
    beats. One that only reports it (auto_probe) takes two boots a value, while a prediction from
    the values before boots a value in one: there, and without auto-fit, the refusal path.
    """
    if requested == "refusal":
        return "refusal", "--strategy refusal: each value boots the prediction from the values before it"
    if auto_fit == "auto":
        return "auto", ("this vLLM fits each value's length itself (--max-model-len auto): one boot per value, "
                        "and on to the longest length that boots where the pool shrinks as the length grows")
    if auto_fit == "auto_probe":
        return "refusal", ("this vLLM reports a fitted length but does not serve it (two boots per value): "
                           "the refusal path, booting predictions, takes fewer")
    return "refusal", "this vLLM cannot fit a length itself: the refusal path, booting predictions"
