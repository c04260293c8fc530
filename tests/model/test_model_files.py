"""Weights and KV shape from a model's files: safetensors headers, index, config.json by attention kind.

The flagship configs are transformers' own defaults (its config classes default to the
published models: Qwen3-Next-80B-A3B, DeepSeek-V3, Gemma-3, ...), so these figures are the
real models', computed by hand in each test.
"""
import json
import struct

import pytest

from autotune.model import files as mf
from tests.helpers.model_folders import write_safetensors


def test_weights_sum_every_tensor_of_every_shard_from_the_headers(tmp_path):
    a = write_safetensors(tmp_path / "model-00001-of-00002.safetensors",
                          {"embed": ("BF16", [512, 64]), "norm": ("F32", [64])})
    b = write_safetensors(tmp_path / "model-00002-of-00002.safetensors", {"lm_head": ("F8_E4M3", [512, 64])})
    w = mf.weights(tmp_path)
    assert w.bytes == a + b == 512 * 64 * 2 + 64 * 4 + 512 * 64
    assert w.tensors == 3 and w.files == 2
    assert w.by_dtype == {"BF16": 65536, "F32": 256, "F8_E4M3": 32768}
    assert w.source == "safetensors headers (3 tensors in 2 files)"


def test_weights_of_the_tiny_model_are_its_file_less_the_header(tiny_model):
    path = tiny_model / "model.safetensors"
    (length,) = struct.unpack("<Q", path.read_bytes()[:8])
    assert mf.weights(tiny_model).bytes == path.stat().st_size - 8 - length


def test_weights_from_an_index_when_the_shards_are_not_here(tmp_path):
    (tmp_path / mf.SAFETENSORS_INDEX).write_text(json.dumps(
        {"metadata": {"total_size": 16_060_522_496}, "weight_map": {"a": "s1", "b": "s2", "c": "s2"}}))
    w = mf.weights(tmp_path)
    assert w.bytes == 16_060_522_496 and w.files == 2 and "total_size" in w.source


def test_no_weights_and_a_broken_header_are_clear_errors(tmp_path):
    with pytest.raises(mf.ModelFilesError, match="no \\*.safetensors files"):
        mf.weights(tmp_path)
    (tmp_path / "x.safetensors").write_bytes(struct.pack("<Q", 2**40))
    with pytest.raises(mf.ModelFilesError, match="not a safetensors file"):
        mf.weights(tmp_path)


def test_config_errors_name_the_file(tmp_path):
    with pytest.raises(mf.ModelFilesError, match="config.json: not found"):
        mf.read_config(tmp_path)
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(mf.ModelFilesError, match="cannot read it"):
        mf.read_config(tmp_path)


LLAMA_31_8B = {"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32,
               "num_key_value_heads": 8, "hidden_size": 4096, "torch_dtype": "bfloat16"}


def test_gqa_llama_31_8b_is_128_kib_per_token_and_fp8_halves_it():
    assert mf.kv_shape(LLAMA_31_8B).full_bytes_per_token == 32 * 2 * 8 * 128 * 2 == 131072
    fp8 = mf.kv_shape(LLAMA_31_8B, kv_cache_dtype="fp8")
    assert fp8.full_bytes_per_token == 65536 and fp8.kv_dtype == "fp8"


def test_tensor_parallel_splits_kv_heads_and_replicates_past_them():
    assert mf.kv_shape(LLAMA_31_8B, tp=8).full_bytes_per_token == 32 * 2 * 1 * 128 * 2
    over = mf.kv_shape(LLAMA_31_8B, tp=16)
    assert over.full_bytes_per_token == 32 * 2 * 1 * 128 * 2
    assert any("replica" in n for n in over.notes)


def test_pipeline_parallel_counts_the_largest_stage():
    shape = mf.kv_shape({**LLAMA_31_8B, "num_hidden_layers": 33}, pp=2)
    assert shape.full_bytes_per_token == 17 * 2 * 8 * 128 * 2


def test_mha_without_kv_heads_or_head_dim_uses_heads_and_hidden():
    cfg = {"num_hidden_layers": 4, "num_attention_heads": 8, "hidden_size": 512}
    assert mf.kv_shape(cfg).full_bytes_per_token == 4 * 2 * 8 * 64 * 2 == 8192


def defaults(cls_name):
    transformers = pytest.importorskip("transformers")
    return getattr(transformers, cls_name)().to_dict()


def test_mla_deepseek_v3_is_the_latent_not_the_heads():
    cfg = defaults("DeepseekV3Config")  # 61 layers, kv_lora_rank 512, qk_rope_head_dim 64
    shape = mf.kv_shape({**cfg, "torch_dtype": "bfloat16"}, tp=8)
    assert shape.attention_kinds == ["mla"]
    assert shape.full_bytes_per_token == 61 * (512 + 64) * 2 == 70272  # TP does not split the latent


def test_sliding_gemma3_layers_hold_only_their_window():
    cfg = defaults("Gemma3TextConfig")  # 26 layers, 5 sliding (window 4096) : 1 full, 4 KV heads x 256
    shape = mf.kv_shape({**cfg, "torch_dtype": "bfloat16"})
    full = next(g for g in shape.groups if g.kind == "full")
    sliding = next(g for g in shape.groups if g.kind == "sliding")
    assert (full.layers, sliding.layers, sliding.window) == (4, 22, 4096)
    assert full.bytes_per_token == sliding.bytes_per_token == 2 * 4 * 256 * 2
    assert shape.full_bytes_per_token == 4 * 4096  # only the 4 full layers keep every token


def test_hybrid_qwen3_next_state_per_sequence_and_full_layers_per_token():
    cfg = defaults("Qwen3NextConfig")  # 48 layers, 1 full : 3 gated delta net; 2 KV heads x 256
    shape = mf.kv_shape({**cfg, "torch_dtype": "bfloat16"})
    linear = next(g for g in shape.groups if g.kind == "linear")
    assert linear.layers == 36 and shape.full_bytes_per_token == 12 * 2 * 2 * 256 * 2
    conv = (2 * 16 * 128 + 32 * 128) * 3 * 2  # conv dim x (kernel - 1) x bf16
    recurrent = 32 * 128 * 128 * 2  # value heads x value dim x key dim x bf16
    assert linear.state_parts == {"conv": conv, "recurrent": recurrent}
    fp32 = mf.kv_shape({**cfg, "torch_dtype": "bfloat16"}, mamba_ssm_cache_dtype="float32")
    assert next(g for g in fp32.groups if g.kind == "linear").state_bytes == conv + 2 * recurrent


def test_unknown_layer_kinds_and_kv_dtypes_are_refused():
    with pytest.raises(mf.ModelFilesError, match="does not know"):
        mf.layer_kinds({"num_hidden_layers": 2, "layer_types": ["full_attention", "moe_gate"]})
    with pytest.raises(mf.ModelFilesError, match="unknown --kv-cache-dtype"):
        mf.kv_shape(LLAMA_31_8B, kv_cache_dtype="int3")


def test_multimodal_wrappers_use_their_text_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["X"], "text_config": LLAMA_31_8B}))
    assert mf.kv_shape(mf.read_config(tmp_path)).full_bytes_per_token == 131072


def test_only_a_name_that_can_only_be_a_path_is_judged_missing(tmp_path):
    from pathlib import Path

    from autotune.model.files import missing_model_folder

    (tmp_path / "here").mkdir()
    assert missing_model_folder("./here", tmp_path) is None
    assert missing_model_folder(str(tmp_path / "here"), "/") is None
    assert missing_model_folder("./gone", tmp_path) == tmp_path / "gone"
    assert missing_model_folder("a/b/c", tmp_path) == tmp_path / "a/b/c"
    assert missing_model_folder("/no/such/model", tmp_path) == Path("/no/such/model")
    for hub_or_uri in ("Qwen/Qwen3-8B", "gpt2", "s3://bucket/model", None, "tiny-llama"):
        assert missing_model_folder(hub_or_uri, tmp_path) is None
