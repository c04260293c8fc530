"""The replaying vLLM's model files: config.json and safetensors headers (no weights), where a real
machine keeps them after a first boot downloaded the model (the Hugging Face hub cache).

autotune reads a model's own files wherever they are on this machine (model/files.py,
model/max_len.py): the model's maximum before a boot, the KV bytes per token and weights for
`predict`, the calibration and preflight's prediction, and every boot's check of vLLM's KV figures
against the files (analysis/boot_check.py). Without files on the replay none of that runs there; with
them (``write``) it runs exactly as on a real machine after a first boot.

A model is here when its files agree with the replay's memory model (profiles.py): the KV bytes per
token from config.json are the profile's, the model's maximum is its derived length. The hybrid and
sliding-window profiles' figures are fitted to real logs rather than derived from a config, so they
carry none (their runs see a hub model that is not on this machine).

The safetensors files hold a header and no data: the reader takes only headers (the weights' bytes
from each tensor's data_offsets). A real vLLM pointed at such a folder fails to load it, so ``write``
refuses a hub cache where the model already has a snapshot.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

# meta-llama/Llama-3.1-8B-Instruct's config.json (the hub's, 2024-07): 32 layers of GQA attention with
# 8 KV heads of 128, bf16: 128 KiB of KV cache per token; RoPE llama3 scaling: 131,072 derived.
LLAMA_31_8B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": False,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.42.3", "use_cache": True, "vocab_size": 128256,
}

CONFIGS = {"meta-llama/Llama-3.1-8B-Instruct": LLAMA_31_8B}
SNAPSHOT = "0e9e39f249a16976918f6564b8830bc894c89659"  # the revision the files stand for (refs/main)
DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4}


class HubCacheInUse(Exception):
    """The hub cache already holds this model: header-only files would break a real vLLM there."""


def llama_tensors(config: dict) -> dict[str, list[int]]:
    """A Llama checkpoint's tensors and their shapes, as its safetensors files list them."""
    hidden, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    head = hidden // config["num_attention_heads"]
    kv = config["num_key_value_heads"] * head
    shapes = {"model.embed_tokens.weight": [vocab, hidden], "model.norm.weight": [hidden]}
    if not config.get("tie_word_embeddings"):
        shapes["lm_head.weight"] = [vocab, hidden]
    for i in range(config["num_hidden_layers"]):
        layer = f"model.layers.{i}"
        shapes.update({
            f"{layer}.self_attn.q_proj.weight": [hidden, hidden], f"{layer}.self_attn.k_proj.weight": [kv, hidden],
            f"{layer}.self_attn.v_proj.weight": [kv, hidden], f"{layer}.self_attn.o_proj.weight": [hidden, hidden],
            f"{layer}.mlp.gate_proj.weight": [inter, hidden], f"{layer}.mlp.up_proj.weight": [inter, hidden],
            f"{layer}.mlp.down_proj.weight": [hidden, inter], f"{layer}.input_layernorm.weight": [hidden],
            f"{layer}.post_attention_layernorm.weight": [hidden]})
    return shapes


def safetensors_header(shapes: dict[str, list[int]], dtype: str = "BF16") -> bytes:
    """A safetensors file's header for these tensors, laid end to end; the data itself is left out."""
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in shapes.items():
        size = DTYPE_BYTES[dtype]
        for dim in shape:
            size *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the format pads the header to 8 bytes
    return struct.pack("<Q", len(text)) + text


def has_files(model: str) -> bool:
    return model in CONFIGS


def write(model: str, hub_cache: Path) -> Path | None:
    """Write the model's files into a hub cache as a download leaves them (refs/main, a snapshot);
    the snapshot folder, or None for a model the replay carries no files of."""
    config = CONFIGS.get(model)
    if config is None:
        return None
    repo = Path(hub_cache) / f"models--{model.replace('/', '--')}"
    folder = repo / "snapshots" / SNAPSHOT
    if repo.exists() and not (folder / ".autotune-replay").exists():
        raise HubCacheInUse(f"{repo} already holds {model}: the replay's header-only files would break a real "
                            "vLLM there; point HF_HUB_CACHE (or HF_HOME) at another folder")
    folder.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(SNAPSHOT)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (folder / "model.safetensors").write_bytes(safetensors_header(llama_tensors(config)))
    (folder / ".autotune-replay").write_text("header-only files written by autotune's replaying vLLM\n")
    return folder
