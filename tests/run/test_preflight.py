"""autotune.run.preflight: refusals before any boot, the model's own maximum, flag hygiene.

Inventories are data in the shape of autotune.host.machine.gpu_facts(); the serve commands are
the reference user's (a 27B AWQ model on an RTX 3090 beside a GTX 1660 SUPER).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from autotune.host import gpus
from autotune.run import preflight
from autotune.run.preflight import Problem, check, derived_max_model_len, missing_flags, read_model_config
from autotune.vllm.log import parse_file
from tests.helpers import installed_vllm
from tests.helpers.gpu_cards import GTX_1660S, REFERENCE, RTX_3090, RTX_4090, TWINS, gpu
from tests.helpers.paths import FIXTURES_DIR

FIXTURES = FIXTURES_DIR

SERVE = ["vllm", "serve", "Qwen/Qwen3.6-27B-AWQ", "--quantization", "awq_marlin", "--max-num-seqs", "1"]
ON_3090 = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "1"}
H100 = gpu(0, "NVIDIA H100 80GB HBM3", "9.0", "00000000:19:00.0", "GPU-1d2e3f40-aaaa-bbbb-cccc-000000000001",
           total=79.19, free=78.6)
B200 = gpu(0, "NVIDIA B200", "10.0", "00000000:1B:00.0", "GPU-1d2e3f40-aaaa-bbbb-cccc-000000000002",
           total=178.35, free=177.9)
RTX_5090 = gpu(0, "NVIDIA GeForce RTX 5090", "12.0", "00000000:01:00.0", "GPU-1d2e3f40-aaaa-bbbb-cccc-000000000003",
               total=31.36, free=30.9)


def kinds(problems):
    return [p.kind for p in problems]


# --- fp8 / nvfp4 KV cache, bf16 --------------------------------------------------------


@pytest.mark.parametrize("dtype", ["fp8", "fp8_e4m3", "FP8"])
def test_fp8_kv_on_ampere_is_refused_with_the_fix(dtype):
    problems = check(SERVE + ["--kv-cache-dtype", dtype, "--gpu-memory-utilization", "0.9"], ON_3090, REFERENCE,
                     65536, None)
    assert kinds(problems) == ["fp8_kv_unsupported_arch"]
    p = problems[0]
    assert p.saw == f"--kv-cache-dtype {dtype.lower()} on GPU 1 (NVIDIA GeForce RTX 3090, cc 8.6)"
    assert "8.9" in p.why and "type fp8e4nv not supported" in p.why
    assert p.fix.startswith("drop --kv-cache-dtype (or pass --kv-cache-dtype auto)")


def test_fp8_kv_equals_form_is_read_too():
    assert kinds(check(SERVE + ["--kv-cache-dtype=fp8"], ON_3090, REFERENCE, 65536, None)) == ["fp8_kv_unsupported_arch"]
    assert kinds(check(SERVE + ["--kv_cache_dtype", "fp8"], ON_3090, REFERENCE, 65536, None)) == ["fp8_kv_unsupported_arch"]


@pytest.mark.parametrize("inventory,env", [
    ([RTX_4090 | {"index": 0, "pci_bus_id": "00000000:01:00.0"}], {}),  # Ada 8.9
    ([H100], {}),
    ([B200], {}),
])
def test_fp8_kv_on_ada_and_newer_boots(inventory, env):
    assert check(SERVE + ["--kv-cache-dtype", "fp8"], env, inventory, 65536, None) == []


def test_fp8_e5m2_and_auto_are_not_refused_on_ampere():
    assert check(SERVE + ["--kv-cache-dtype", "fp8_e5m2"], ON_3090, REFERENCE, 65536, None) == []
    assert check(SERVE + ["--kv-cache-dtype", "auto"], ON_3090, REFERENCE, 65536, None) == []


def test_nvfp4_kv_is_blackwell_only():
    problems = check(SERVE + ["--kv-cache-dtype", "nvfp4"], {}, [H100], 65536, None)
    assert kinds(problems) == ["nvfp4_kv_unsupported_arch"]
    assert "Blackwell" in problems[0].why
    assert check(SERVE + ["--kv-cache-dtype", "nvfp4"], {}, [B200], 65536, None) == []
    assert check(SERVE + ["--kv-cache-dtype", "nvfp4"], {}, [RTX_5090], 65536, None) == []


def test_bf16_on_turing_is_refused():
    on_1660 = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0"}
    problems = check(SERVE + ["--dtype", "bfloat16", "--gpu-memory-utilization", "0.8"], on_1660, REFERENCE, 4096, None)
    assert kinds(problems) == ["bf16_unsupported"]
    assert problems[0].fix == "pass --dtype half (float16)"
    assert check(SERVE + ["--dtype", "bfloat16"], ON_3090, REFERENCE, 4096, None) == []


def test_fp8_on_the_unpinned_reference_machine_is_refused_because_both_gpus_fail():
    # CUDA's numbering is unknown (FASTEST_FIRST, two different GPUs), but neither reaches 8.9.
    problems = check(SERVE + ["--kv-cache-dtype", "fp8"], {}, REFERENCE, 65536, None)
    assert kinds(problems) == ["fp8_kv_unsupported_arch"]
    assert "GPU 0 (NVIDIA GeForce GTX 1660 SUPER, cc 7.5), GPU 1 (NVIDIA GeForce RTX 3090, cc 8.6)" in problems[0].saw


def test_unknown_order_refuses_only_what_every_gpu_fails():
    # bf16 fails on the 1660 but not on the 3090, and CUDA may pick either: no refusal.
    assert check(SERVE + ["--dtype", "bfloat16"], {}, REFERENCE, 65536, None) == []


# --- gpu-memory-utilization ---------------------------------------------------------


@pytest.mark.parametrize("value,kind", [
    ("1.5", "gmu_out_of_range"), ("0", "gmu_out_of_range"), ("-0.2", "gmu_out_of_range"),
    ("abc", "gmu_invalid"), ("nan", "gmu_invalid"), ("0.995", "gmu_risky"), ("1", "gmu_risky"),
])
def test_gmu_values_refused(value, kind):
    problems = check(SERVE + ["--gpu-memory-utilization", value], ON_3090, REFERENCE, 65536, None)
    assert kinds(problems) == [kind]
    assert problems[0].saw == f"--gpu-memory-utilization {value}"


def test_oversize_gmu_refused_even_without_gpus():
    # The value check needs no GPU (vLLM on the CPU backend reads it as a fraction of RAM).
    assert kinds(check(SERVE + ["--gpu-memory-utilization", "1.2"], {}, [], 65536, None)) == ["gmu_out_of_range"]


def test_risky_gmu_allowed_then_checked_against_free_memory():
    problems = check(SERVE + ["--gpu-memory-utilization", "0.995"], ON_3090, REFERENCE, 65536, None,
                     allow_risky_gmu=True)
    # 0.995 x 24 GiB = 23.88 GiB > 23.58 GiB free.
    assert kinds(problems) == ["gmu_above_free"]
    assert problems[0].fix == ("lower --gpu-memory-utilization to 0.98 or less (0.98 x 24 GiB fits in the "
                               "23.58 GiB free), or free the GPU")


def test_gmu_above_free_names_the_processes_holding_memory():
    busy = RTX_3090 | {"memory_free_gib": 17.41, "memory_used_gib": 6.59, "processes": [
        {"pid": 4242, "name": "python3", "command": "python3 -m vllm.entrypoints.openai.api_server", "used_gib": 6.1},
        {"pid": 977, "name": "firefox", "command": "firefox", "used_gib": 0.3},
    ]}
    problems = check(SERVE + ["--gpu-memory-utilization", "0.95"], ON_3090, [GTX_1660S, busy], 65536, None)
    assert kinds(problems) == ["gmu_above_free"]
    p = problems[0]
    assert p.saw == ("--gpu-memory-utilization 0.95 asks for 22.80 GiB of GPU 1 (NVIDIA GeForce RTX 3090, cc 8.6), "
                     "which has 24 GiB of which 17.41 GiB are free now; held by pid 4242 python3 -m "
                     "vllm.entrypoints.openai.api_server (6.1 GiB), pid 977 firefox (0.3 GiB)")
    assert "Free memory on device" in p.why
    assert p.fix.startswith("stop pid 4242 python3 -m vllm.entrypoints.openai.api_server (6.1 GiB), pid 977 firefox")
    assert p.fix.endswith("or lower --gpu-memory-utilization to 0.72 or less (0.72 x 24 GiB fits in the 17.41 GiB free)")


def test_default_gmu_is_checked_too():
    busy = RTX_3090 | {"memory_free_gib": 20.0}
    problems = check(SERVE, ON_3090, [GTX_1660S, busy], 65536, None)
    assert kinds(problems) == ["gmu_above_free"]
    assert problems[0].saw.startswith("vLLM's default --gpu-memory-utilization 0.9 asks for 21.60 GiB")


def test_only_the_gpus_vllm_uses_are_checked():
    # The 1660 runs the desktop (5.2 of 6 GiB free: 0.9 would not fit), but vLLM gets the 3090.
    assert check(SERVE + ["--gpu-memory-utilization", "0.9"], ON_3090, REFERENCE, 65536, None) == []
    on_1660 = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0"}
    problems = check(SERVE + ["--gpu-memory-utilization", "0.9"], on_1660, REFERENCE, 65536, None)
    assert kinds(problems) == ["gmu_above_free"]
    assert "held by pid 2310 Xorg (0.61 GiB)" in problems[0].saw


def test_tensor_parallel_needs_enough_visible_gpus():
    problems = check(SERVE + ["-tp", "2"], ON_3090, REFERENCE, 65536, None)
    assert kinds(problems) == ["not_enough_gpus"]
    assert problems[0].saw == "tensor x pipeline x data parallel = 2 GPUs, CUDA_VISIBLE_DEVICES=1: 1 visible"
    assert check(SERVE + ["--tensor-parallel-size", "2"], {}, TWINS, 65536, None) == []


def test_no_visible_gpu():
    problems = check(SERVE, {"CUDA_VISIBLE_DEVICES": ""}, REFERENCE, 65536, None)
    assert kinds(problems) == ["no_gpu_visible"]


# --- a planted UUID, end to end through the pure pieces -------------------------------


def test_planted_uuid_is_translated_then_checked_on_the_right_gpu():
    user_env = {"CUDA_VISIBLE_DEVICES": "GPU-af7b61d8-2c4e-4d8a-b0a4-93f1e2d7c6b5", "HOME": "/home/u"}
    plan = gpus.plan_gpus(None, user_env, REFERENCE)
    assert plan.env_changes == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "1"}
    assert "invalid literal for int()" in plan.warnings[0]
    vllm_env = {**user_env, **plan.env_changes}
    problems = check(SERVE + ["--kv-cache-dtype", "fp8"], vllm_env, REFERENCE, 65536, None)
    assert [p.saw for p in problems] == ["--kv-cache-dtype fp8 on GPU 1 (NVIDIA GeForce RTX 3090, cc 8.6)"]


def test_problem_renders_saw_why_fix():
    problem = Problem("gmu_risky", "--gpu-memory-utilization 1", "why text", "fix text")
    assert problem.render() == "gmu_risky:\n  saw: --gpu-memory-utilization 1\n  why: why text\n  fix: fix text"
    assert problem.to_dict() == {"kind": "gmu_risky", "saw": "--gpu-memory-utilization 1", "why": "why text",
                                 "fix": "fix text"}


# --- the model's own maximum ---------------------------------------------------------


LLAMA31 = {"model_type": "llama", "max_position_embeddings": 131072, "rope_theta": 500000.0,
           "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 8192, "rope_type": "llama3"}}
QWEN25_YARN = {"model_type": "qwen2", "max_position_embeddings": 32768, "sliding_window": 131072,
               "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}}
LINEAR_X4 = {"model_type": "llama", "max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 4.0}}
DYNAMIC_X2 = {"model_type": "llama", "max_position_embeddings": 4096, "rope_scaling": {"type": "dynamic", "factor": 2.0}}
QWEN3_VL = {"model_type": "qwen3_vl", "text_config": {"model_type": "qwen3_vl_text", "max_position_embeddings": 262144,
                                                      "num_attention_heads": 64}}
GEMMA3 = {"model_type": "gemma3_text", "max_position_embeddings": 131072, "rope_scaling": {"rope_type": "linear", "factor": 8.0}}
GPT2 = {"model_type": "gpt2", "n_positions": 1024, "n_ctx": 1024}
COMMAND_R = {"model_type": "cohere", "max_position_embeddings": 8192, "model_max_length": 131072}
MISTRAL_SW = {"model_type": "mistral", "max_position_embeddings": 32768, "sliding_window": 4096}


@pytest.mark.parametrize("config,expected", [
    (LLAMA31, 131072),  # llama3 rope: already scaled
    (QWEN25_YARN, 32768),  # yarn: already scaled in 0.32 (older vLLM: 131072, see below)
    (LINEAR_X4, 16384),
    (DYNAMIC_X2, 8192),
    (QWEN3_VL, 262144),  # the nested text config
    (GEMMA3, 131072),  # gemma3: never scaled again
    (GPT2, 1024),
    (COMMAND_R, 131072),  # model_max_length overrides
    (MISTRAL_SW, 32768),
    ({"model_type": "llama", "max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": None}}, 4096),
    ({"model_type": "llama", "max_position_embeddings": 4096, "max_sequence_length": 2048}, 2048),  # the smallest key
    ({"model_type": "llama", "hidden_size": 64}, None),  # no length key: unknown
    ({"model_type": "x", "max_position_embeddings": 8192,
      "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0},
                          "sliding_attention": {"rope_type": "default"}}}, 16384),  # per-layer-type rope
])
def test_derived_max_model_len(config, expected):
    assert derived_max_model_len(config) == expected


def test_derived_max_model_len_tokenizer_and_sliding_window():
    assert derived_max_model_len(LLAMA31, {"model_max_length": 8192}) == 8192
    assert derived_max_model_len(LLAMA31, {"model_max_length": 10 ** 30}) == 131072
    assert derived_max_model_len(MISTRAL_SW, disable_sliding_window=True) == 4096
    assert derived_max_model_len(None) is None


def test_target_above_the_models_maximum_is_refused():
    problems = check(SERVE, {}, [], 262144, LLAMA31)
    assert kinds(problems) == ["target_above_model_max"]
    p = problems[0]
    assert p.saw == ("target 262,144 tokens; the model's config.json gives max_position_embeddings=131072, "
                     "so vLLM derives 131,072")
    assert "User-specified max_model_len (262144) is greater than the derived max_model_len" in p.why
    assert p.fix.startswith("use --target 131072 or --target max")


@pytest.mark.parametrize("target,config,env,argv_extra", [
    (131072, LLAMA31, {}, []),  # at the maximum
    ("max", LLAMA31, {}, []),  # the user asked for the maximum: autotune uses it
    (None, LLAMA31, {}, []),
    (262144, None, {}, []),  # no local config.json: nothing certain
    (262144, LLAMA31, {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}, []),  # the user overrides vLLM's check
    (262144, LLAMA31, {}, ["--hf-overrides", '{"max_position_embeddings": 262144}']),
    (262144, LLAMA31, {}, ["--hf-overrides", "not json"]),  # cannot tell: do not refuse
    (131072, QWEN25_YARN, {}, []),  # vLLM <= 0.10 accepts 131072 for YaRN x4: never refused
])
def test_lengths_not_refused(target, config, env, argv_extra):
    assert check(SERVE + argv_extra, env, [], target, config) == []


def test_yarn_refusal_quotes_both_version_families():
    problems = check(SERVE, {}, [], 262144, QWEN25_YARN)
    assert kinds(problems) == ["target_above_model_max"]
    assert "(131,072 on vLLM up to 0.10" in problems[0].saw
    assert problems[0].fix.startswith("use --target 131072 or --target max")


def test_tokenizer_config_caps_the_length():
    assert kinds(check(SERVE, {}, [], 16384, LLAMA31, tokenizer_config={"model_max_length": 8192})) == [
        "target_above_model_max"]


# Real vLLM 0.32 agrees: its own _get_and_verify_max_len on the same config.json files, loaded the way
# vLLM loads them (transformers' AutoConfig).

VLLM_CASES = [LLAMA31, QWEN25_YARN, LINEAR_X4, DYNAMIC_X2, QWEN3_VL, GPT2, MISTRAL_SW,
              {"model_type": "llama", "max_position_embeddings": 4096, "max_sequence_length": 2048}]


VLLM_DERIVE = r"""
import json, sys
from types import SimpleNamespace
from transformers import AutoConfig
from vllm.config.model import _get_and_verify_max_len
from vllm.transformers_utils.config import get_hf_text_config
from vllm.transformers_utils.model_arch_config_convertor import ModelArchConfigConvertorBase


out = []
for folder in json.load(sys.stdin):
    hf_config = AutoConfig.from_pretrained(folder)
    text = get_hf_text_config(hf_config)
    arch = SimpleNamespace(derived_max_model_len_and_key=ModelArchConfigConvertorBase(hf_config, text)
                           .derive_max_model_len_and_key())
    out.append(_get_and_verify_max_len(hf_config, arch, None, None, False, None))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def vllm_derived(tmp_path_factory) -> list[int]:
    """The max_model_len the installed vLLM derives from each of VLLM_CASES' config.json."""
    folders = []
    for i, config in enumerate(VLLM_CASES):
        folders.append(tmp_path_factory.mktemp(f"vllm-case-{i}"))
        (folders[-1] / "config.json").write_text(json.dumps(config))
    return installed_vllm.run_json(VLLM_DERIVE, [str(f) for f in folders])


@pytest.mark.parametrize("case", range(len(VLLM_CASES)),
                         ids=[c["model_type"] + "-" + str(len(json.dumps(c))) for c in VLLM_CASES])
def test_derived_max_model_len_matches_vllm(case, vllm_derived, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(VLLM_CASES[case]))
    assert derived_max_model_len(read_model_config(str(tmp_path))) == vllm_derived[case]


def test_tiny_model_maximum_matches_what_real_vllm_printed(tiny_model):
    # The real refusal (tests/fixtures/failures) says: derived max_model_len (max_position_embeddings=1048576.0 ...).
    printed = parse_file(FIXTURES / "failures" / "cpu-0.32.0-max-model-len-above-derived.log").result()
    assert printed["derived_max_model_len"] == 1048576
    config = read_model_config(str(tiny_model))
    tokenizer = preflight.read_tokenizer_config(str(tiny_model))
    assert derived_max_model_len(config, tokenizer) == printed["derived_max_model_len"]
    problems = check(SERVE, {}, [], 2097152, config, tokenizer_config=tokenizer)
    assert kinds(problems) == ["target_above_model_max"]


# --- reading config.json locally, never downloading ----------------------------------------------


def test_read_model_config_from_a_folder_and_the_hf_cache(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA31))
    assert read_model_config(str(folder)) == LLAMA31

    hub = tmp_path / "hub"
    snap = hub / "models--Qwen--Qwen3.6-27B-AWQ" / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(QWEN3_VL))
    (snap / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 262144}))
    (hub / "models--Qwen--Qwen3.6-27B-AWQ" / "refs").mkdir()
    (hub / "models--Qwen--Qwen3.6-27B-AWQ" / "refs" / "main").write_text("0123abcd")
    env = {"HF_HUB_CACHE": str(hub)}
    assert read_model_config("Qwen/Qwen3.6-27B-AWQ", env) == QWEN3_VL
    assert preflight.read_tokenizer_config("Qwen/Qwen3.6-27B-AWQ", env) == {"model_max_length": 262144}
    assert read_model_config("Qwen/Qwen3.6-27B-AWQ", {"HF_HOME": str(tmp_path)}) == QWEN3_VL  # HF_HOME/hub
    assert read_model_config("Qwen/Qwen3.6-27B-AWQ", env, revision="0123abcd") == QWEN3_VL
    assert read_model_config("Qwen/Qwen3.6-27B-AWQ", env, revision="v2") is None
    assert read_model_config("Qwen/Not-Cached", env) is None


def test_read_model_config_unreadable(tmp_path):
    assert read_model_config(None) is None
    assert read_model_config(str(tmp_path / "missing")) is None
    (tmp_path / "config.json").write_text("{not json")
    assert read_model_config(str(tmp_path)) is None
    (tmp_path / "config.json").write_text("[1, 2]")
    assert read_model_config(str(tmp_path)) is None
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    assert read_model_config(str(gguf)) is None


# --- flag hygiene ---------------------------------------------------------------------------


def _non_default_args(path: Path) -> dict:
    return parse_file(path).result()["non_default_args"]


def test_real_cpu_boot_shows_every_flag_autotune_passed():
    # The exact command of tests/fixtures/failures/cpu-0.32.0-address-in-use.log (see its README).
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--dtype", "bfloat16", "--enforce-eager",
            "--max-num-seqs", "1", "--kv-cache-memory-bytes", "128M", "--model", ".demo/tiny-llama",
            "--port", "49789", "--max-model-len", "4096"]
    printed = _non_default_args(FIXTURES / "failures" / "cpu-0.32.0-address-in-use.log")
    assert missing_flags(argv, printed) == []
    # A flag the user gave that vLLM did not get is reported as typed.
    assert missing_flags(argv + ["--enable-prefix-caching"], printed) == ["--enable-prefix-caching"]


# The reference user's 2x3090 command, reconstructed from the non-default args of a real log
# (tests/fixtures/logs/009-...): every flag is there.
CLUB_3090 = ["vllm", "serve", "~/.cache/huggingface/qwen3.6-27b-autoround-int4",
             "--chat-template", "/etc/qwen-froggeric-chat-template.jinja",
             "--default-chat-template-kwargs", '{"enable_thinking": false}',
             "--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder", "--host", "0.0.0.0",
             "--trust-remote-code", "--dtype", "float16", "--max-model-len", "262144", "--quantization", "auto_round",
             "--served-model-name", "qwen3.6-27b-autoround",
             "--override-generation-config", '{"temperature": 0.6, "top_p": 0.95}',
             "--reasoning-parser", "qwen3", "-tp", "2", "--disable-custom-all-reduce",
             "--kv-cache-dtype", "fp8_e5m2", "--enable-prefix-caching", "--max-num-batched-tokens", "8192",
             "--max-num-seqs", "2", "--enable-chunked-prefill",
             "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 3}']


def test_real_2x3090_log_shows_every_flag():
    printed = _non_default_args(FIXTURES / "logs" / "009-2x3090-qwen36-27b-int4-autoround-bench-report.log")
    assert missing_flags(CLUB_3090, printed) == []


def test_lost_trailing_flags_are_named():
    # The zsh paste story: the flags after --max-num-seqs never reached vLLM.
    printed = _non_default_args(FIXTURES / "logs" / "009-2x3090-qwen36-27b-int4-autoround-bench-report.log")
    got = {k: v for k, v in printed.items() if k not in ("enable_chunked_prefill", "speculative_config")}
    assert missing_flags(CLUB_3090, got) == ["--enable-chunked-prefill", "--speculative-config"]
    warning = preflight.describe_missing_flags(["--enable-chunked-prefill", "--speculative-config"])
    assert warning.startswith("vLLM's non-default args do not show --enable-chunked-prefill --speculative-config:")
    assert preflight.describe_missing_flags([]) is None


@pytest.mark.parametrize("extra,printed,expected", [
    (["--max_num_seqs", "4"], {"max_num_seqs": 4}, []),  # underscores
    (["--max-num-seqs=4"], {"max_num_seqs": 4}, []),
    (["--compilation-config.mode", "3"], {"compilation_config": {"mode": 3}}, []),  # dotted
    (["-O3"], {"optimization_level": 3}, []),  # 0.2x+
    (["-O3"], {"compilation_config": {"level": 3}}, []),  # older
    (["-q", "awq"], {"quantization": "awq"}, []),
    (["-q", "awq"], {}, ["-q"]),
    (["--kv-cache-memory=1G"], {"kv_cache_memory_bytes": 1073741824}, []),  # argparse abbreviation
    (["--no-enable-prefix-caching"], {"enable_prefix_caching": False}, []),
    (["--no-enable-prefix-caching"], {}, ["--no-enable-prefix-caching"]),
    (["--dtype", "auto"], {}, []),  # vLLM's default: absent by design
    (["--gpu-memory-utilization", "0.90"], {}, []),  # default up to 0.19
    (["--gpu-memory-utilization", "0.92"], {}, []),  # default from 0.20
    (["--gpu-memory-utilization", "0.95"], {}, ["--gpu-memory-utilization"]),
    (["--port", "8000"], {}, []),
    (["--tensor-parallel-size", "1"], {}, []),
    (["--trust-remote-code"], {}, ["--trust-remote-code"]),
    (["--config", "serve.yaml"], {}, []),  # expanded by vLLM, never listed itself
    (["-xyz", "1"], {}, []),  # an unknown short option: cannot tell
])
def test_missing_flags_normalisation(extra, printed, expected):
    argv = ["vllm", "serve", "m"] + extra
    printed = {"model_tag": "m", "model": "m", **printed}
    assert missing_flags(argv, printed) == expected


def test_missing_flags_entry_points():
    printed = {"model": "m", "max_num_seqs": 2}
    assert missing_flags(["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m", "--max-num-seqs", "2",
                          "--enforce-eager"], printed) == ["--enforce-eager"]
    docker = ["docker", "run", "--rm", "--gpus", "all", "-v", "/data/vllm:/root/.cache", "-p", "8000:8000",
              "--ipc=host", "vllm/vllm-openai:v0.10.1", "--model", "m", "--max-num-seqs", "2", "--enforce-eager"]
    assert missing_flags(docker, printed) == ["--enforce-eager"]
    assert missing_flags(["vllm", "serve", "m", "--enforce-eager"], None) == []  # vLLM < 0.9 prints no such line


def test_flags_from_a_config_file_are_checked_and_a_disagreement_named(tmp_path):
    (tmp_path / "serve.yaml").write_text("gpu-memory-utilization: 0.12\nmax-num-seqs: 1\n")
    argv = ["vllm", "serve", "m", "--config", "serve.yaml", "--max-num-seqs", "2"]
    printed = {"model_tag": "m", "model": "m", "gpu_memory_utilization": 0.9, "max_num_seqs": 2}
    assert preflight.missing_flags(argv, printed, str(tmp_path)) == []
    found = preflight.disagreeing_flags(argv, printed, str(tmp_path))
    assert found == [{"flag": "--gpu-memory-utilization", "asked": 0.12, "used": 0.9}]
    assert preflight.describe_disagreements(found).startswith(
        "vLLM's non-default args disagree with the command (--gpu-memory-utilization: the command asks 0.12, "
        "vLLM used 0.9)")
    assert preflight.missing_flags(argv, {"model": "m", "max_num_seqs": 2}, str(tmp_path)) == \
        ["--gpu-memory-utilization"]
    # as vLLM reads them: auto is -1, 64K is 65,536
    assert preflight.disagreeing_flags(["vllm", "serve", "m", "--max-model-len", "auto"], {"max_model_len": -1}) == []
    assert preflight.disagreeing_flags(["vllm", "serve", "m", "--max-model-len", "64K"], {"max_model_len": 65536}) == []
    # and sizes: 8k batched tokens are 8,000; 128m bytes 128,000,000 (128M would be 128 MiB)
    assert preflight.disagreeing_flags(["vllm", "serve", "m", "--max-num-batched-tokens", "8k",
                                        "--kv-cache-memory-bytes", "128m"],
                                       {"max_num_batched_tokens": 8000, "kv_cache_memory_bytes": 128_000_000}) == []
    assert preflight.disagreeing_flags(["vllm", "serve", "m", "--kv-cache-memory-bytes", "128M"],
                                       {"kv_cache_memory_bytes": 128_000_000}) == \
        [{"flag": "--kv-cache-memory-bytes", "asked": 128 << 20, "used": 128_000_000}]


def test_a_disagreement_is_kept_in_the_attempt_as_well_as_warned(tmp_path, monkeypatch):
    from autotune.run import checks
    from autotune.store.record import Attempt

    monkeypatch.chdir(tmp_path)
    (tmp_path / "serve.yaml").write_text("gpu-memory-utilization: 0.12\n")
    attempt = Attempt.from_dict({"index": 1, "facts": {"non_default_args": {"model": "m",
                                                                          "gpu_memory_utilization": 0.9}}})
    said = []
    checks.check_flags(attempt, ["vllm", "serve", "m", "--config", "serve.yaml"], lambda event, **d: said.append(d))
    assert attempt.to_dict()["disagreeing_flags"] == [{"flag": "--gpu-memory-utilization", "asked": 0.12, "used": 0.9}]
    assert [d["text"][:48] for d in said] == ["vLLM's non-default args disagree with the comman"]
    clean = Attempt.from_dict({"index": 1, "facts": {"non_default_args": {"model": "m"}}})
    checks.check_flags(clean, ["vllm", "serve", "m"], lambda event, **d: None)
    assert "disagreeing_flags" not in clean.to_dict()
