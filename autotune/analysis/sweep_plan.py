"""Where a sweep point boots first, from its prediction, and what the prediction saved (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune.analysis.gmu_predict import GmuPrediction
from autotune.store.outcomes import Outcome
from autotune.store.record import Attempt, Result, RunRecord

# How a boot at a predicted length L ends (strategy.next_step, given the group's slack s, what vLLM
# keeps between its KV pool and its ceiling): above vLLM's ceiling C, vLLM refuses it and its
# estimate verifies next (2 boots, as without a prediction); when L verifies, the boot's own pool K
# says where the ceiling is, K - s, and L is accepted only when it is that ceiling; below it, the
# next boot is at K - s (2 boots). So a prediction saves a boot only when it is vLLM's ceiling to the
# token, and costs none when it misses: the aim is the predicted ceiling itself.
#
# Where the target may fit (the prediction is within its error of the target), the target boots
# first, as without a prediction: a boot under a target that fits would cost one boot more.
#
# The error of a prediction is the token line's residual spread where 3 or more runs show it;
# from fewer runs it is not known, and a prior is used, as a fraction of the pool. On vLLM's CPU
# backend our sweeps' predictions from one or two points were off by 10-400 tokens in pools of
# 25,000-178,000 (up to 0.4%, when the memory the node reports moved); the prior is 0.2%. On GPUs
# the profiling of activation memory varies between boots (vllm#54383 reports up to ~5%): 1%.
SWEEP_PRIOR_ERROR_FRACTION = {"cpu": 0.002, "gpu": 0.01}
AIM_SIGMAS = 2.0  # a target within this many prediction errors above the prediction may fit: booted first


@dataclass(frozen=True)
class SweepAim:
    start_at: int | None  # the first boot's length; None: the target
    reason: str
    slack_tokens: int | None = None  # for the tune: the ceiling a verified boot's pool shows is pool - slack


def sweep_aim(prediction: GmuPrediction | None, target: int) -> SweepAim:
    """The length a sweep point (or a tune) boots first (None: the target), why, and the slack to read
    its pool with."""
    if prediction is None or prediction.ceiling is None or prediction.kv_cache_tokens is None:
        return SweepAim(None, "no prediction: booting the target")
    if prediction.ceiling_is_upper_bound:
        return SweepAim(None, f"{prediction.unknown_slack}, so the ceiling is not predicted: booting the target")
    prior = SWEEP_PRIOR_ERROR_FRACTION["cpu" if prediction.device.startswith("cpu") else "gpu"]
    sigma = prediction.error_tokens or prior * prediction.kv_cache_tokens
    if prediction.ceiling + AIM_SIGMAS * sigma >= target:
        return SweepAim(None, f"the target {target:,} may fit (predicted ceiling {prediction.ceiling:,}, give or take "
                              f"{sigma:,.0f} tokens): booting it")
    if prediction.ceiling <= 0:
        return SweepAim(None, f"the predicted ceiling {prediction.ceiling:,} is not a length: booting the target")
    slack = prediction.slack_tokens if prediction.slack_tokens is not None else \
        prediction.kv_cache_tokens - prediction.ceiling
    return SweepAim(prediction.ceiling, (
        f"the predicted ceiling {prediction.ceiling:,} (give or take {sigma:,.0f} tokens): if it is vLLM's ceiling "
        f"this boot is the last; above it vLLM refuses and names its own, below it the boot's pool less the "
        f"{slack:,}-token slack is booted next (2 boots at most, as without a prediction)"), slack)


def sweep_start_at(prediction: GmuPrediction | None, target: int) -> tuple[int | None, str]:
    """The length a sweep point boots first (None: the target), and why (see sweep_aim)."""
    aim = sweep_aim(prediction, target)
    return aim.start_at, aim.reason


def sweep_point_outcome(record: RunRecord, start_at: int | None) -> dict:
    """Boots a sweep point used, against the two of the refusal path, and which one was saved."""
    everything = record.attempts or []
    # A boot cut short by an interruption (the sweep was resumed) cost time but decided nothing:
    # it counts as used, not against the predictions.
    attempts = [a for a in everything if a.outcome != Outcome.INTERRUPTED]
    cut_short = len(everything) - len(attempts)
    result = record.result or Result()
    boots = len(attempts)
    ceiling = result.ceiling if result.verified else None
    target = record.target
    first = attempts[0] if attempts else Attempt()
    # Without a prediction a point costs 2 boots when the target is refused (the target, then
    # vLLM's ceiling) and 1 when the target fits.
    baseline = 1 if ceiling is not None and target is not None and ceiling >= target else 2
    if record.plan in ("auto", "auto_probe"):
        baseline = boots  # vLLM fits the length itself: predictions have nothing to save
        note = f"vLLM's --max-model-len auto fitted it ({boots} boot{'s' if boots != 1 else ''}; no prediction used)"
    elif start_at is None:
        note = "no prediction yet: booted the target first"
    elif first.outcome == Outcome.VERIFIED and boots == 1:
        note = (f"saved the boot at the target: the first boot, at {start_at:,} (aimed from the prediction), "
                f"verified and was accepted as the ceiling")
    elif first.outcome == Outcome.REFUSED:
        est = first.ceiling
        note = (f"the first boot, at {start_at:,} (aimed from the prediction), was too high: vLLM refused it"
                + (f" (its estimate: {est:,}, {start_at - est:+,} tokens off)" if est else "")
                + "; no boot saved")
    elif first.outcome == Outcome.VERIFIED:
        note = (f"the first boot, at {start_at:,} (aimed from the prediction), verified but sat under the "
                f"ceiling its KV pool shows: booted again there; no boot saved")
    else:
        note = f"the first boot, at {start_at:,} (aimed from the prediction), ended {first.outcome}"
    outcome: dict[str, Any] = {"boots": boots + cut_short, "boots_without_prediction": baseline, "saved": baseline - boots,
               "note": note}
    if cut_short:
        outcome["boots_interrupted"] = cut_short
        outcome["note"] += f"; plus {cut_short} boot{'s' if cut_short != 1 else ''} cut short by an interruption"
    return outcome
