"""What a run's record says of the longest length that boots (pure): vLLM's own figure beside the
verified maximum, the gap, how the top was proved, the slope and its causes, the boots it cost.

Where the pool shrinks as --max-model-len grows (analysis/pool_slope.py), vLLM's figure (the
refusal's estimate at the target, or `auto`'s fit at the model's full length) lands below what
boots, and run/fixed_point.py goes on to the fixed point. This reads the recorded attempts back
into run.json's `result.longest` (store/record/run_parts.py Longest): written as the run ends, and
recomputed by readers of records written before it (the card, compare).
"""

from __future__ import annotations

from autotune.analysis import pool_slope
from autotune.store.record import Attempt, Longest, Result, RunRecord
from autotune.vllm import servecmd, versions

REFUSED_ABOVE = "refused_above"  # a boot one step above was refused: vLLM's own word
OWN_POOL = "own_pool"  # the verified boot's pool holds no step more (it only shrinks as the length grows)
MAX_BOOTS = "max_boots"  # --max-boots ended the search before a proof


def _source(attempt: Attempt, key: str) -> dict:
    provenance = attempt.provenance if isinstance(attempt.provenance, dict) else {}
    seen = provenance.get(key, None)
    return {"attempt": attempt.index, **(seen if isinstance(seen, dict) else {})}


def vllm_figure(attempts: list[Attempt]) -> tuple[int, str, dict] | None:
    """vLLM's own figure, as the run first saw it: (length, refusal | auto, where it was read)."""
    for a in attempts:
        if a.outcome == "refused" and a.ceiling_source == "estimate" and isinstance(a.ceiling, int):
            return a.ceiling, "refusal", _source(a, "estimated_max_model_len")
        if a.outcome == "verified" and a.max_model_len == "auto" and isinstance(a.ceiling, int) \
                and isinstance(a.fact("autofit_from"), int):
            return a.ceiling, "auto", _source(a, "autofit_max_model_len")
    return None


def causes_of(attempts: list[Attempt], cause: str) -> list[str]:
    """The slope's causes: the one its boots showed, and chunked prefill off where the command says
    so without --max-num-batched-tokens (vLLM then profiles a batch of max_model_len tokens)."""
    argv = list(attempts[-1].argv or []) if attempts else []
    off = servecmd.has_flag(argv, "--no-enable-chunked-prefill") and not servecmd.has_flag(
        argv, "--max-num-batched-tokens")
    return [cause, *([pool_slope.CHUNKED_PREFILL_OFF] if off and cause != pool_slope.CHUNKED_PREFILL_OFF else [])]


def _proof(attempts: list[Attempt], top: int, grid: int) -> tuple[str, dict]:
    """How the top was proved: a refusal one step above (its line), or the verified boot's own pool."""
    for a in attempts:
        if a.outcome == "refused" and isinstance(a.max_model_len, int) and top < a.max_model_len <= top + grid:
            return REFUSED_ABOVE, {"max_model_len": a.max_model_len, "estimate": a.ceiling,
                                   **_source(a, "estimated_max_model_len")}
    for a in reversed(attempts):
        tokens = a.fact("kv_cache_tokens")
        if a.outcome == "verified" and a.max_model_len == top and isinstance(tokens, int):
            holds = pool_slope.pool_fits(tokens, top, grid, versions.check_holds_back_null_block(a.fact("vllm_version")))
            if holds < top + grid:
                return OWN_POOL, {"max_model_len": top, "kv_cache_tokens": tokens, "holds": holds,
                                  **_source(a, "kv_cache_tokens")}
    return MAX_BOOTS, {}


def longest_of(attempts: list[Attempt], result: Result) -> Longest | None:
    """run.json's `result.longest` for a verified run whose pool moved with the length; None else
    (vLLM's estimate is exact where nothing grows with the length: nothing to add)."""
    top = result.ceiling
    if result.verdict != "verified" or not isinstance(top, int) or result.limit not in (None, "kv_cache"):
        return None
    causes = [c for c in (pool_slope.cause_of_attempt(a) for a in attempts) if c]
    if not causes:
        return None
    grid = max(pool_slope.grid_of(a.facts, servecmd.flag_value(list(a.argv or []), "--block-size"))
               for a in attempts)
    longest = Longest(verified=top, boots=len(attempts))
    figure = vllm_figure(attempts)
    if figure is not None:
        longest.vllm_figure, longest.vllm_figure_from, longest.vllm_figure_source = figure
        longest.gap_pct = round((top - figure[0]) / figure[0] * 100, 1) if figure[0] else None
    longest.proved_by, longest.proof = _proof(attempts, top, grid)
    slope = pool_slope.slope_of_run(attempts)
    if slope is not None:
        longest.slope = round(slope[0], 4)
    longest.slope_causes = causes_of(attempts, slope[1] if slope else causes[0])
    return longest


def of_record(run: RunRecord) -> Longest | None:
    """The record's own `result.longest`, else recomputed from its attempts (a record written before it)."""
    result = run.result if isinstance(run.result, Result) else None
    if result is None:
        return None
    if isinstance(result.longest, Longest):
        return result.longest
    done = [a for a in (run.attempts or []) if a.outcome != "interrupted" and a.recovery is None]
    return longest_of(done, result)


def describe_causes(causes: list[str] | None) -> str:
    """The causes as the card and compare say them."""
    return "; and ".join(pool_slope.CAUSES.get(c, c) for c in causes or [])


# The levers that act on the slope itself, per cause, as (reach's lever, what to tell the user).
SLOPE_LEVERS = {
    pool_slope.CPU_LENGTH_BUFFERS: ("max_num_seqs", "fewer --max-num-seqs: the CPU runner keeps max_num_seqs x "
                                                    "max_model_len token buffers (~5 B per sequence per token of "
                                                    "length) before it measures the pool"),
    pool_slope.CHUNKED_PREFILL_OFF: ("chunked_prefill", "chunked prefill on (--enable-chunked-prefill), or a "
                                                        "lower --max-num-batched-tokens: with it off vLLM profiles a "
                                                        "batch of max_model_len tokens"),
}


def slope_levers(causes: list[str] | None, argv: list[str]) -> list[tuple[str, str]]:
    """The levers that make the pool shrink less as the length grows, where the slope's causes say
    they help and the command has room for them (--max-num-seqs already 1 has none)."""
    out = []
    for cause in causes or []:
        if cause not in SLOPE_LEVERS:
            continue
        lever, text = SLOPE_LEVERS[cause]
        seqs = servecmd.flag_value(argv, "--max-num-seqs")
        if lever == "max_num_seqs" and seqs is not None and seqs.isdigit() and int(seqs) <= 1:
            continue
        out.append((lever, text))
    return out
