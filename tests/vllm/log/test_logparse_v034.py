"""vLLM 0.34's boot lines: the pool measured after warmup (Available KV cache memory its upper bound), the
two refusals (before warmup against the upper bound, after it against the pool), the new auto-fit lines,
the extensible KV cache's state and its diagnoses. Every line below is a 0.34.0 format string (the sdist's
vllm/v1/worker/extensible_kv_cache.py, vllm/v1/core/kv_cache_planning.py, vllm/v1/executor/abstract.py,
vllm/v1/core/kv_cache_utils.py, vllm/v1/worker/gpu_worker.py) with figures filled in."""

from __future__ import annotations

from autotune.vllm.log.failures import diagnosis
from autotune.vllm.log.parser import parse_lines

W, C = "(Worker_TP0 pid=3) ", "(EngineCore pid=2) "
AVAILABLE = W + "INFO 11-17 10:00:01 [gpu_worker.py:796] Available KV cache memory: 62.34 GiB"
WARMUP = (W + "INFO 11-17 10:00:05 [extensible_kv_cache.py:694] Memory after warmup: 61.05 GiB free, 0.0 GiB "
          "committed to the KV cache, 1.13 GiB kept for transient activations (1.13 GiB allocated at peak, 0.0 GiB "
          "of torch reservation growth); 3660 KV cache blocks (57.19 GiB) fit within the requested 79.19 GiB. Torch "
          "may reserve up to 20.98 GiB.")
EXTENDED = W + "INFO 11-17 10:00:05 [extensible_kv_cache.py:537] Extended KV cache to 3660 blocks (57.19 GiB)."
KV = C + ("INFO 11-17 10:00:06 [kv_cache_utils.py:1169] GPU KV cache size: 468,480 tokens, Maximum concurrency "
          "for 131,072 tokens per request: 3.57x")
_CORE = ("ValueError: To serve at least one request with the model's max seq len ({L}), ({need} GiB KV cache is "
         "needed, which is larger than the available KV cache memory ({room} GiB). Based on the available memory, "
         "the estimated maximum model length is {est}. ")
_TAIL = ("Decreasing `max_model_len` also reduces what is needed. See "
         "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.")
BEFORE_HINT = ("The extensible KV cache already takes all device memory left after the model and its activations; "
               "decrease `max_model_len` or `max_num_seqs`, or the model needs a device with more memory. ")
AFTER_HINT = ("The extensible KV cache already takes all device memory left after the model, its activations, CUDA "
              "graphs and warmup; decrease `max_model_len` or `max_num_seqs`, or the model needs a device with more "
              "memory. CUDA graphs take less with fewer or smaller capture sizes in the compilation config. ")
PLAIN_HINT = ("Try increasing `gpu_memory_utilization` when initializing the engine (this flag also controls CPU "
              "memory reservation on the CPU backend, despite its name). ")


def refusal(hint: str, **figures) -> str:
    return C + "ERROR 11-17 10:00:07 [core.py:1757] " + _CORE.format(**figures) + hint + _TAIL


def test_the_pool_after_warmup_replaces_the_upper_bound():
    result = parse_lines([AVAILABLE, WARMUP, EXTENDED, KV]).result()
    assert result["kv_upper_bound_gib"] == 62.34
    assert result["available_kv_gib"] == 57.19  # was 62.34 before 0.34 was known: the upper bound read as the pool
    assert (result["warmup_kv_blocks"], result["extended_kv_blocks"], result["extended_kv_gib"]) == (3660, 3660, 57.19)
    assert result["extensible_kv_cache"] == "on" and result["kv_cache_tokens"] == 468480
    assert result["outcome"] == "ready"


def test_a_refusal_before_warmup_is_against_the_upper_bound():
    line = refusal(BEFORE_HINT, L=1048576, need=128.0, room=62.34, est=510720)
    result = parse_lines([AVAILABLE, line]).result()
    assert result["outcome"] == "refused" and result["error_kind"] == "kv_cache_insufficient"
    assert result["refusal_stage"] == "before_warmup" and result["extensible_kv_cache"] == "on"
    assert result["estimated_max_model_len"] == 510720 and result["available_kv_gib"] == 62.34


def test_a_refusal_after_warmup_is_against_the_measured_pool():
    line = refusal(AFTER_HINT, L=510720, need=62.34, room=57.17, est=468352)
    result = parse_lines([AVAILABLE, WARMUP, line]).result()
    assert result["refusal_stage"] == "after_warmup"
    assert result["estimated_max_model_len"] == 468352
    assert (result["kv_upper_bound_gib"], result["available_kv_gib"], result["refusal_available_kv_gib"]) == \
        (62.34, 57.19, 57.17)


def test_the_extensible_kv_cache_off_and_why():
    off = (C + "WARNING 11-17 10:00:00 [abstract.py:176] Disabling the extensible KV cache: GPU driver error 801: "
           "operation not supported. The KV cache will be sized from profiling estimates instead of measured memory.")
    line = refusal(PLAIN_HINT, L=131072, need=16.0, room=9.9, est=81024)
    result = parse_lines([off, AVAILABLE, line]).result()
    assert result["extensible_kv_cache"] == "off"
    assert result["extensible_kv_cache_off_reason"] == "GPU driver error 801: operation not supported"
    assert "refusal_stage" not in result and result["warning_kinds"] == ["extensible_kv_cache_disabled"]
    assert result["available_kv_gib"] == 62.34  # without the extensible cache the profiled figure is the pool
    # The plain 0.34 advice alone says it was off too (kv_cache_memory_bytes turns it off without a line).
    assert parse_lines([AVAILABLE, line]).result()["extensible_kv_cache"] == "off"


def test_auto_fits_twice_and_the_final_length_wins():
    tentative = C + ("INFO 11-17 10:00:02 [kv_cache_planning.py:1479] Auto-fit max_model_len: reduced from 1048576 "
                     "to 510720 to fit in available KV cache memory (62.34 GiB GPU); the final length is set after "
                     "CUDA graph capture and warmup")
    final = C + ("INFO 11-17 10:00:05 [kv_cache_planning.py:1495] --max-model-len auto reduced max_model_len from "
                 "510720 to 468352 (57.19 GiB GPU left for the KV cache after CUDA graph capture and warmup).")
    result = parse_lines([AVAILABLE, tentative, WARMUP, final, EXTENDED, KV]).result()
    assert result["autofit_tentative_max_model_len"] == 510720
    assert result["autofit_max_model_len"] == 468352 and result["autofit_from"] == 1048576
    assert result["autofit_available_kv_gib"] == 57.19
    short = C + ("WARNING 11-17 10:00:05 [kv_cache_planning.py:1507] --max-model-len auto reduced max_model_len from "
                 "9000 to 7040 (1.2 GiB GPU left for the KV cache after CUDA graph capture and warmup). Requests "
                 "longer than 7040 tokens will be rejected. Use more GPUs or set --max-model-len explicitly.")
    result = parse_lines([AVAILABLE, tentative, WARMUP, short]).result()
    assert result["autofit_max_model_len"] == 7040 and result["autofit_short"] is True
    using = C + ("INFO 11-17 10:00:05 [kv_cache_planning.py:1459] Auto-fit max_model_len: using max_model_len=131072, "
                 "which fits in the KV cache memory left after CUDA graph capture and warmup (57.19 GiB GPU).")
    full = C + ("INFO 11-17 10:00:02 [kv_cache_planning.py:1467] Auto-fit max_model_len: full model context length "
                "131072 fits in available KV cache memory (62.34 GiB GPU); the final length is set after CUDA graph "
                "capture and warmup")
    result = parse_lines([AVAILABLE, full, WARMUP, using]).result()
    assert (result["autofit_tentative_max_model_len"], result["autofit_max_model_len"]) == (131072, 131072)


def test_the_explicit_gmu_warning_is_diagnosed_with_its_figures():
    line = W + ("WARNING 11-17 10:00:05 [extensible_kv_cache.py:662] gpu_memory_utilization=0.9 caps this instance "
                "at 71.27 GiB, keeping 6.92 GiB of free device memory out of the KV cache. The extensible KV cache is "
                "sized from the memory measured after warmup and CUDA graph capture, so vLLM's own use needs no "
                "headroom below 1.0.")
    result = parse_lines([AVAILABLE, line, WARMUP, KV]).result()
    assert (result["gmu_explicit"], result["gmu_caps_gib"], result["gmu_withheld_gib"]) == (0.9, 71.27, 6.92)
    assert result["warning_kinds"] == ["gmu_caps_extensible_kv_cache"]
    found = diagnosis({**result, "error_kind": "gmu_caps_extensible_kv_cache"})
    assert "6.92 GiB" in found["fix"] and "--gpu-memory-utilization 0.9" in found["fix"]


def test_model_runner_v1_is_an_error_with_its_fix():
    line = ("(APIServer pid=1) ValueError: VLLM_USE_V2_MODEL_RUNNER=0 is no longer supported: Model Runner V1 has "
            "been removed. Unset this variable.")
    result = parse_lines(["Traceback (most recent call last):", line]).result()
    assert result["error_kind"] == "model_runner_v1_removed" and result["outcome"] == "error"
    assert "unset VLLM_USE_V2_MODEL_RUNNER" in diagnosis(result)["fix"]
