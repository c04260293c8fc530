"""What a group's measured runs predict at another gmu (pure): available KV, KV tokens, the ceiling."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from autotune.analysis.run_groups import Group
from autotune.analysis.run_row import Row


@dataclass
class GmuPrediction:
    """A group's ceiling at another gmu, from its own runs (not from the model's files: estimate's FilesPrediction)."""

    group_id: str
    gmu: float
    available_kv_gib: float
    kv_cache_tokens: int | None
    ceiling: int | None  # the longest --max-model-len expected to boot
    ceiling_is_upper_bound: bool  # no measured run was KV-limited: the ceiling is at most the KV tokens
    basis: str  # the fit or slope the prediction comes from
    warnings: list[str]
    error_tokens: float | None = None  # the token line's residual spread (3 runs or more)
    device: str = ""  # the group's device label ("cpu ..." or a GPU)
    slack_tokens: int | None = None  # what vLLM keeps between its pool and its ceiling, as the group showed
    unknown_slack: str = ""  # why the ceiling is only an upper bound (ceiling_is_upper_bound)
    length_slope: float | None = None  # the group's pool tokens per token of length (its ceiling is a fixed point)
    ceiling_is: str = ""  # FIXED_POINT or VLLM_ESTIMATE: which length the ceiling is (ceiling_label)


# What a predicted ceiling is. Where the pool shrinks as the length grows (the group's runs showed a
# slope), the longest length whose own pool holds it: the fixed point, above vLLM's own estimate made
# at a longer length. Elsewhere vLLM's estimate at this pool is exact.
FIXED_POINT = "fixed_point"
VLLM_ESTIMATE = "vllm_estimate"


def ceiling_label(p: GmuPrediction) -> str:
    """The ceiling's kind in words, for the card and predict's text."""
    if p.ceiling_is == FIXED_POINT:
        return (f"the fixed point: the longest length whose own pool holds it (the pool loses "
                f"{p.length_slope:.3f} tokens per token of --max-model-len; vLLM's own estimate at a longer "
                "length lands below it)")
    return "vLLM's estimate at this pool (these runs showed no pool that shrinks as the length grows)"


def predict(group: Group, rows: list[Row], gmu: float, memory_gib: float | None = None,
            model_maximum: int | None = None) -> GmuPrediction | None:
    """Available KV, KV tokens and the ceiling at `gmu`, from a group's measured runs.

    Two or more gmu values: the least-squares lines. One gmu value: the budget's change
    (device memory x gmu) from the runs measured there. Where the device memory is known the
    lines run against the budget, at `memory_gib` (the device memory read just before the
    boot: a VM's CPU node can change between runs) or else the newest run's. None when
    neither works. model_maximum: the model's own maximum from its files here, where no run of the
    group showed it (the ceiling never goes above it).
    """
    points = [r for r in rows if r.gmu is not None and r.available_kv_gib is not None]
    if not points or not group.gmu_sets_kv:
        return None
    warnings: list[str] = []
    fit = group.fit
    tpg = group.tokens_per_gib
    newest_memory = next((r.device_memory_gib for r in reversed(points) if r.device_memory_gib is not None), None)
    memory_now = memory_gib if memory_gib is not None and newest_memory is not None else newest_memory
    if fit is not None:
        x = memory_now * gmu if fit.x == "budget" else gmu
        kv = fit.kv_a * x - fit.kv_b
        basis = (f"least squares over {fit.runs} runs at gmu {fit.gmu_min:g}-{fit.gmu_max:g}: "
                 f"available KV = {fit.a_gib:.2f} x gmu - {fit.b_gib:.2f} GiB")
        if fit.tokens_a is not None:
            tokens = fit.tokens_a * x - fit.tokens_b
            per = "GiB of budget (device memory x gmu)" if fit.x == "budget" else "unit of gmu"
            basis += f"; KV tokens: {fit.tokens_a:,.0f} per {per}"
        else:
            tokens = kv * tpg if tpg else None
        low, high = fit.gmu_min, fit.gmu_max
    elif group.expectation.mode == "budget":
        kv, tokens, basis = _moved_by_budget(group, points, memory_now * gmu, tpg)
        low = high = points[0].gmu
    else:
        return None
    if fit is None or fit.x == "budget":
        memories = {r.device_memory_gib for r in points}
        if memory_now != newest_memory:
            basis += (f"; device memory {memory_now:.2f} GiB, read before this boot (the runs saw "
                      f"{min(memories)}-{max(memories)} GiB)")
        else:
            basis += (f"; device memory {memory_now} GiB" if len(memories) == 1 else
                      f"; device memory taken as {memory_now} GiB, the newest run's (the runs saw "
                      f"{min(memories)}-{max(memories)} GiB)")
    if gmu < low - 1e-9 or gmu > high + 1e-9:
        measured = f"{low:g}" if low == high else f"{low:g}-{high:g}"
        warnings.append(f"gmu {gmu:g} is outside the measured range ({measured}): this is an extrapolation")
    if kv <= 0:
        warnings.append(f"the line gives {kv:.2f} GiB at gmu {gmu:g}: nothing would be left for the KV cache")
    ceiling = None
    upper = False
    unknown_slack = ""
    if tokens is not None:
        tokens = max(0, int(tokens))
        if group.ceiling_slack_tokens is not None:
            ceiling = whole_blocks(max(0, tokens - group.ceiling_slack_tokens), rows)
        else:
            ceiling, upper, unknown_slack = tokens, True, why_no_slack(rows)
            warnings.append(f"{unknown_slack}: the ceiling is at most the KV token count")
        maximum = group.model_maximum or model_maximum
        if maximum is not None and ceiling is not None and ceiling > maximum:
            ceiling = maximum  # vLLM serves no more than the model's own maximum
            basis += f"; capped at the model's own maximum, {maximum:,}"
    return GmuPrediction(group_id=group.group_id, gmu=gmu, available_kv_gib=kv, kv_cache_tokens=tokens,
                      ceiling=ceiling, ceiling_is_upper_bound=upper, basis=basis, warnings=warnings,
                      error_tokens=fit.tokens_residual_std if fit is not None else None, device=points[0].device,
                      slack_tokens=None if upper else group.ceiling_slack_tokens, unknown_slack=unknown_slack,
                      length_slope=group.length_slope,
                      ceiling_is=FIXED_POINT if group.length_slope else VLLM_ESTIMATE)


def _moved_by_budget(group: Group, points: list[Row], budget: float, tpg: float | None):
    """One gmu value measured: (available KV, KV tokens, basis) moved by the budget's change. Where the
    pool shrinks as the length grows, a longer ceiling gives back part of the budget it gained: the
    fixed point moves by budget x tokens per GiB / (1 + slope)."""
    kv = statistics.mean(r.available_kv_gib + budget - r.budget_gib for r in points)
    with_tokens = [r for r in points if r.kv_cache_tokens is not None]
    moved = tpg / (1 + (group.length_slope or 0.0)) if tpg else None
    tokens = (statistics.mean(r.kv_cache_tokens + (budget - r.budget_gib) * moved for r in with_tokens)
              if with_tokens and moved else None)
    basis = f"one gmu value measured ({points[0].gmu:g}), moved by the budget: device memory x gmu"
    if tpg:
        basis += f"; {tpg:,.0f} tokens per GiB ({group.tokens_per_gib_source})"
    if tpg and group.length_slope:
        basis += (f", {moved:,.0f} at the fixed point: the pool loses {group.length_slope:.3f} tokens per token "
                  "of --max-model-len")
    return kv, tokens, basis


def why_no_slack(rows: list[Row]) -> str:
    """Why the runs do not show what vLLM keeps between its pool and its ceiling (run_groups._ceiling_slack)."""
    if any(r.kv_limited and r.ceiling_from_vllm and not r.one_memory for r in rows):
        # A refusal's estimate read against the pool of a boot that was given other memory (this VM's
        # node moves) would teach a slack of thousands of tokens.
        return ("what vLLM keeps under its pool is not known: the memory of each run limited by KV moved "
                "between its refused boot and its verified one")
    return "no measured run was limited by KV (each reached its target)"


def whole_blocks(tokens: int, rows: list[Row]) -> int:
    """tokens rounded down to the KV block the runs show (vLLM's ceilings are whole blocks); as is
    where the runs show no block size, or several."""
    sizes = {r.block_size for r in rows if r.block_size}
    if len(sizes) != 1:
        return tokens
    size = sizes.pop()
    return tokens - tokens % size
