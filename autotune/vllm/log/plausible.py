"""Judging the figures a boot log printed: which are implausible, and the ceiling they give.

A figure is kept as printed, but one that cannot be right (an estimate of 0 or not below
the refused length, a capacity above the request it refused, a size beyond any device) is
flagged, and a flagged figure never becomes a relaunch length. Stdlib only.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import TypeGuard

__all__ = ["ceiling_from", "implausible", "MAX_DEVICE_GIB", "MAX_TOKENS"]

# Block size of the CUDA KV cache; used only for the 0.7-0.9.0.1 computed ceiling.
CUDA_BLOCK_SIZE = 16
# Beyond any device vLLM runs on (a GB300 NVL72 rack holds ~20 TiB of HBM; a CPU node ~ a few TiB).
MAX_DEVICE_GIB = 32768
MAX_TOKENS = 10**10  # a KV pool or a length beyond this is a misread, not a figure
_GIB_KEYS = ("weights_gib", "available_kv_gib", "kv_needed_gib", "refusal_available_kv_gib", "cpu_kv_gib",
             "kv_cache_size_gib", "kv_cache_reserved_gib", "startup_free_gib", "startup_total_gib",
             "requested_memory_gib", "cuda_graph_gib", "cuda_graph_estimated_gib", "autofit_available_kv_gib")
_TOKEN_KEYS = ("kv_cache_tokens", "max_concurrency_tokens", "estimated_max_model_len", "kv_cache_max_tokens",
               "max_model_len_requested", "autofit_max_model_len", "autofit_from", "derived_max_model_len",
               "max_model_len_resolved", "max_seq_len_engine", "batched_tokens_limit", "draft_max_model_len")


def implausible(result: dict) -> list[dict]:
    """The figures in ``result`` that cannot be right: ``[{"key", "value", "why"}]``."""
    out: list[dict] = []

    def flag(key: str, why: str) -> None:
        out.append({"key": key, "value": result.get(key), "why": why})

    if not isinstance(result, dict):
        return out
    requested = result.get("max_model_len_requested")
    for key, what in (("estimated_max_model_len", "an estimate"), ("kv_cache_max_tokens", "a KV capacity")):
        value = result.get(key)
        if not _is_int(value):
            continue
        if value <= 0:
            flag(key, f"{what} of {value} tokens")
        elif _is_int(requested) and value >= requested:
            flag(key, f"{what} not below the refused length {requested}")
    derived = result.get("derived_max_model_len")
    if _is_int(derived) and _is_int(requested) and derived >= requested:
        flag("derived_max_model_len", f"a model maximum not below the refused length {requested}")
    autofit, autofit_from = result.get("autofit_max_model_len"), result.get("autofit_from")
    if _is_int(autofit) and (autofit <= 0 or (_is_int(autofit_from) and autofit > autofit_from)):
        flag("autofit_max_model_len", f"an auto-fit length of {autofit} (reduced from {autofit_from})")
    for key in _GIB_KEYS:
        value = result.get(key)
        if _is_number(value) and abs(value) > MAX_DEVICE_GIB:
            flag(key, f"{value} GiB is beyond any device")
    for key in _TOKEN_KEYS:
        value = result.get(key)
        if _is_int(value) and value > MAX_TOKENS and not any(e["key"] == key for e in out):
            flag(key, f"{value} tokens is beyond any device")
    return out


def ceiling_from(result: dict) -> tuple[int | None, str]:
    """The largest max_model_len the log says fits, and how it was obtained.

    * ``estimate``: V1 refusal, ``estimated maximum model length is N`` (0.9.1+);
    * ``v0_kv_capacity``: V0 refusal, the KV capacity in tokens;
    * ``computed_from_gib``: V1 refusal without an estimate (0.7-0.9.0.1):
      ``floor(available / needed * requested / 16) * 16``, rounded down, exact on
      the printed decimals (log-formats.md section 2.4); may be 0 (nothing fits); where the
      two figures are within their rounding (0.01 GiB) of each other, their lower bound;
    * ``autofit``: ``Auto-fit max_model_len: reduced from A to N`` (or the full
      length that fits);
    * ``(None, "none")`` otherwise; a figure flagged by ``implausible`` is never used.
    """
    try:
        flagged = {entry["key"] for entry in implausible(result)}
        estimate = result.get("estimated_max_model_len")
        if _is_int(estimate) and estimate > 0 and "estimated_max_model_len" not in flagged:
            return estimate, "estimate"
        capacity = result.get("kv_cache_max_tokens")
        if _is_int(capacity) and capacity >= 0 and "kv_cache_max_tokens" not in flagged:
            return capacity, "v0_kv_capacity"
        requested = result.get("max_model_len_requested")
        needed = result.get("kv_needed_gib")
        available = result.get("refusal_available_kv_gib")
        if (_is_int(requested) and _is_number(needed) and _is_number(available) and needed > 0 and requested > 0
                and not flagged & {"kv_needed_gib", "refusal_available_kv_gib"}):
            ratio = Fraction(repr(available)) / Fraction(repr(needed))
            blocks = math.floor(ratio * requested / CUDA_BLOCK_SIZE)
            if ratio <= 1:
                # vLLM refused `requested`, so the ceiling is below it even when the two-decimal
                # figures round to equal (5.72 needed, 5.72 available): at most the block below it.
                blocks = min(blocks, (requested - 1) // CUDA_BLOCK_SIZE)
            if abs(Fraction(repr(needed)) - Fraction(repr(available))) <= 2 * _HALF_CENT:
                # Within their rounding of each other the figures cannot place the ceiling closer than
                # that rounding (a refused length a block or two above it): their lower bound, which boots.
                low = (Fraction(repr(available)) - _HALF_CENT) / (Fraction(repr(needed)) + _HALF_CENT)
                blocks = min(blocks, math.floor(low * requested / CUDA_BLOCK_SIZE))
            return max(0, blocks) * CUDA_BLOCK_SIZE, "computed_from_gib"
        autofit = result.get("autofit_max_model_len")
        if _is_int(autofit) and autofit > 0 and "autofit_max_model_len" not in flagged:
            return autofit, "autofit"
    except Exception:
        pass
    return None, "none"


# Where a ceiling that is not memory comes from (limit_from): the length asked was above it.
LIMIT_SOURCES = {"model_maximum": "the model's own maximum", "max_num_batched_tokens": "--max-num-batched-tokens "
                 "(chunked prefill is off)", "draft_model": "the draft model's max_model_len"}


def limit_from(result: dict) -> tuple[int | None, str]:
    """A ceiling the log names that is not memory, and its source (LIMIT_SOURCES), or (None, "none"):
    the model's own maximum (vLLM refused a length above its derived max_model_len), --max-num-batched-tokens
    (chunked prefill off: vLLM refused a longer max_model_len), a speculative-decoding draft model's
    max_model_len (0.33 lowered max_model_len to it and booted)."""
    flagged = {entry["key"] for entry in implausible(result)}
    kind = result.get("error_kind")
    for key, source, when in (("derived_max_model_len", "model_maximum", kind == "max_model_len_above_derived"),
                              ("batched_tokens_limit", "max_num_batched_tokens",
                               kind == "max_num_batched_tokens_below_max_model_len"),
                              ("draft_max_model_len", "draft_model", True)):
        value = result.get(key)
        if when and _is_int(value) and value > 0 and key not in flagged:
            return value, source
    return None, "none"


_HALF_CENT = Fraction(1, 200)  # a GiB figure printed with two decimals is within this of the true one


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
