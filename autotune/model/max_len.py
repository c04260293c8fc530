"""The maximum length vLLM derives from a model's config.json and tokenizer_config.json.

``derived_max_model_len`` mirrors vLLM's ``_get_and_verify_max_len`` (0.32/0.33): the
smallest of the length keys in the text config, ``model_max_length`` overriding, the
tokenizer's ``model_max_length``, then the RoPE scaling factor for the rope types that
do not already include it. Older vLLM (up to ~0.10) also scaled YaRN configs
(``original_max_position_embeddings * factor``): ``derived_max_len(..., legacy=True)``.

The files themselves are read by model/files.py (``read_model_config``: local files only, a
model folder or a snapshot already in the Hugging Face cache; never downloaded). The preflight
checks (run/preflight.py) use both.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

# vLLM's _get_and_verify_max_len: the keys, in order, whose smallest value is the maximum.
MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")
# RoPE types whose max_position_embeddings already includes the scaling (vLLM 0.32+).
ROPE_ALREADY_SCALED = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")
# The same list up to ~vLLM 0.10, where YaRN was scaled from original_max_position_embeddings.
ROPE_ALREADY_SCALED_LEGACY = ("su", "longrope", "llama3")
# Sub-configs transformers' get_text_config() looks for (composite / multimodal models).
TEXT_CONFIG_KEYS = ("text_encoder", "decoder", "generator", "text_config")



def _text_config(config: Mapping) -> Mapping:
    """transformers' get_text_config(): the one nested text config of a composite model."""
    found = [config[k] for k in TEXT_CONFIG_KEYS if isinstance(config.get(k), dict)]
    return found[0] if len(found) == 1 else config


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return value


def max_len_source(config: Mapping) -> tuple[str, object]:
    text = _text_config(config)
    if _number(text.get("model_max_length")):
        return "model_max_length", text["model_max_length"]
    best: tuple[str, object] = ("?", None)
    for key in MAX_LEN_KEYS:
        value = _number(text.get(key))
        if value is not None and (best[1] is None or value < best[1]):
            best = (key, text[key])
    return best


def _rope_parameters(config: Mapping) -> list[dict]:
    """The RoPE parameter dicts, as transformers presents them to vLLM: ``rope_parameters``
    (per layer type when nested), else the legacy ``rope_scaling`` with ``type`` read as
    ``rope_type``."""
    params = config.get("rope_parameters")
    if not isinstance(params, dict) or not params:
        params = config.get("rope_scaling")
    if not isinstance(params, dict) or not params:
        return []
    if all(isinstance(v, dict) for v in params.values()):
        found = [dict(v) for v in params.values() if v]
    else:
        found = [dict(params)]
    for p in found:
        if "rope_type" not in p and "type" in p:
            p["rope_type"] = p["type"]
        p.setdefault("rope_type", "default")
    return found


def derived_max_len(config: Mapping, tokenizer_config: Mapping | None, disable_sliding_window: bool,
             legacy: bool) -> int | None:
    text = _text_config(config)
    derived: float = math.inf
    for key in MAX_LEN_KEYS:
        value = _number(text.get(key))
        if value is not None:
            derived = min(derived, value)
    override = _number(text.get("model_max_length"))
    if override:
        derived = override
    sliding = _number(text.get("sliding_window"))
    if disable_sliding_window and sliding is not None and sliding < derived:
        derived = sliding
    if isinstance(tokenizer_config, Mapping):
        tok_max = _number(tokenizer_config.get("model_max_length"))
        if tok_max is not None:
            derived = min(derived, tok_max)
    if derived == math.inf:
        return None  # vLLM would assume 2048 with a warning; too uncertain to refuse on
    model_type = str(config.get("model_type", ""))
    rope = _rope_parameters(config)
    if rope and "gemma3" not in model_type:
        factor: float | None = 1.0
        skip = ROPE_ALREADY_SCALED_LEGACY if legacy else ROPE_ALREADY_SCALED
        for params in rope:
            if params["rope_type"] not in skip:
                factor = params.get("factor", factor)
                if legacy and params["rope_type"] == "yarn":
                    original = _number(params.get("original_max_position_embeddings"))
                    if original is not None:
                        derived = original
        derived *= _number(factor) or 1.0
    return int(derived)


def derived_max_model_len(config: Mapping | None, tokenizer_config: Mapping | None = None, *,
                          disable_sliding_window: bool = False) -> int | None:
    """The longest --max-model-len vLLM (0.32/0.33) accepts for this config.json, or None when
    the config names no length key. ``tokenizer_config`` is tokenizer_config.json, whose
    ``model_max_length`` also caps it."""
    if not isinstance(config, Mapping):
        return None
    return derived_max_len(config, tokenizer_config, disable_sliding_window, legacy=False)


def maximum_here(model: str | None, env: Mapping[str, str] | None = None) -> int | None:
    """The model's own maximum where its files are on this machine (a folder, or the hub cache); None
    where they are not."""
    from autotune.model import files

    config = files.read_model_config(model, env)
    return derived_max_model_len(config, files.read_tokenizer_config(model, env)) if config else None
