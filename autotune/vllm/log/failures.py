"""Catalog of vLLM boot failures: what a log line means and what to do about it.

This module is data. Each ``FailureKind`` names an ``error_kind`` (the value the
log parser reports), the regexes that recognise it on a *cleaned* log line
(ANSI codes and ``\\r`` removed; see ``autotune.vllm.log``), whether it ends the
boot, and a one-line cause and fix for the report.

Rules for the patterns:

* They are used with ``re.search``: never anchor them, a line may carry any
  prefix (``(EngineCore_DP0 pid=1) ERROR ...``, ``[rank0]: ``, journald, docker
  compose, a ``> `` quote).
* Gaps between literals are bounded (``.{0,300}?``) so that a pathological
  1 MB line cannot make a search quadratic.
* ``match()`` returns the FIRST entry in ``CATALOG`` order whose pattern
  matches. Specific causes come first; ``engine_died`` (the generic "the engine
  process went away" lines) is last, so the parser can let a specific cause
  that appears later in the same traceback override it.

Versions and wording are from the vLLM log-format reference (sections 2, 7, 8,
9 and 10 of docs/log-formats.md).
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass

from autotune.vllm.log.messages import leading_literal, prefilter

__all__ = ["FailureKind", "CATALOG", "KINDS", "match", "search", "lookup", "diagnosis", "traceback_tail"]


@dataclass(frozen=True)
class FailureKind:
    kind: str  # the error_kind reported by the parser
    patterns: tuple[str, ...]  # regexes, re.search on the cleaned line
    fatal: bool  # does it end the boot?
    cause: str  # one line: what happened
    fix: str  # one line: the concrete next step
    # The same fix with the figures the log printed: a str.format template over the
    # parser's result keys (or several, the first whose keys are all present is used); used
    # by diagnosis() when every key it names is present.
    detail: str | tuple[str, ...] = ""


CATALOG: tuple[FailureKind, ...] = (
    # --- the two refusals the tuner is built around -------------------------
    FailureKind(
        kind="kv_cache_insufficient",
        patterns=(
            # V1 engine, 0.7.0 -> 0.33: "models's" (typo) up to 0.21, "model's" after.
            r"To serve at least one request with the models?'s max seq len \(\d+\)",
        ),
        fatal=True,
        cause=(
            "the KV cache left after weights and activations cannot hold one request of "
            "the requested --max-model-len (V1 engine check)"
        ),
        fix=(
            "relaunch with --max-model-len at or below the estimate the log prints "
            "(or the one computed from the GiB figures), or raise --gpu-memory-utilization "
            "(VLLM_CPU_KVCACHE_SPACE / --kv-cache-memory-bytes on CPU)"
        ),
        detail=(
            "relaunch with --max-model-len {estimated_max_model_len} or less (vLLM's estimate for the "
            "{refusal_available_kv_gib} GiB of KV cache it has; {max_model_len_requested} needs "
            "{kv_needed_gib} GiB), or raise --gpu-memory-utilization"
        ),
    ),
    FailureKind(
        kind="kv_cache_insufficient_legacy",
        patterns=(
            # V0 engine (default up to 0.7.x, fallback path up to 0.10.x); also the V0 CPU worker.
            r"The model's max seq len \(\d+\) is larger than the maximum number of tokens "
            r"that can be stored in KV cache",
        ),
        fatal=True,
        cause=(
            "the KV cache blocks left after profiling hold fewer tokens than the requested "
            "--max-model-len (V0 engine check)"
        ),
        fix=(
            "relaunch with --max-model-len at or below the KV capacity in the second "
            "parentheses of the message, or raise --gpu-memory-utilization"
        ),
        detail=(
            "relaunch with --max-model-len {kv_cache_max_tokens} or less (the KV cache holds "
            "{kv_cache_max_tokens} tokens; {max_model_len_requested} was asked), or raise "
            "--gpu-memory-utilization"
        ),
    ),
    # --- memory budget failures -----------------------------------------------
    FailureKind(
        kind="negative_available_kv",
        patterns=(
            r"No available memory for the cache blocks",
            # V0's block count of zero, which that error follows (read from the INFO line itself
            # by the parser: a cut log may end before the error).
            r"# GPU blocks: 0(?![\d.]|,\d)",
            # --max-model-len auto (0.14+) when not even one token fits.
            r"Cannot auto-fit max_model_len: not enough",
        ),
        fatal=True,
        cause=(
            "weights plus activation peak already use the whole memory budget: zero (or "
            "negative) memory is left for the KV cache"
        ),
        fix=(
            "raise --gpu-memory-utilization, quantize the weights or add tensor parallelism; "
            "on the CPU backend raise --gpu-memory-utilization (fraction of node RAM from "
            "0.20) or VLLM_CPU_KVCACHE_SPACE (must not be 0)"
        ),
    ),
    FailureKind(
        kind="free_memory_below_gmu",
        patterns=(
            # V1 gpu_worker 0.9.1-0.13 "Free memory on device (X/Y GiB) on startup ...";
            # 0.14+ names the device: "Free memory on device cuda:0 (X/Y GiB) ...".
            r"Free memory on device.{0,80}? on startup is less than desired GPU memory utilization",
            # 0.2x+ when weights are held outside the process (external_weight_memory).
            r"Free memory on device.{0,80}? on startup is less than the engine's budget",
        ),
        fatal=True,
        cause=(
            "free GPU memory at startup is below --gpu-memory-utilization x total memory"
        ),
        fix=(
            "another process (often a previous vLLM that has not released memory) holds GPU "
            "memory: wait for it to exit (`autotune gpus` names it) or lower --gpu-memory-utilization"
        ),
        detail=(
            "only {startup_free_gib} of {startup_total_gib} GiB were free: stop the process holding the "
            "rest (often a previous vLLM that has not released memory; `autotune gpus` names it) or lower "
            "--gpu-memory-utilization below {startup_free_fraction}"
        ),
    ),
    FailureKind(
        kind="cpu_node_memory",
        patterns=(
            # CPU backend 0.20+: --gpu-memory-utilization is a fraction of the NUMA node's RAM.
            r"Available memory on node \d+ \(.{0,80}?\) on (?:startup|kv cache allocation) is less than",
        ),
        fatal=True,
        cause=(
            "CPU backend: the NUMA node's free RAM is below what --gpu-memory-utilization "
            "reserves, or the reservation is smaller than the non-KV memory of the worker"
        ),
        fix=(
            "on CPU --gpu-memory-utilization is the fraction of the node's RAM vLLM reserves: 'on "
            "startup' -> lower it or free RAM; 'on kv cache allocation' with a negative figure -> the "
            "reservation is below the non-KV use, raise it (or set --kv-cache-memory-bytes)"
        ),
    ),
    FailureKind(
        kind="cuda_oom",
        patterns=(
            r"CUDA out of memory",  # torch text; also "... occurred when warming up sampler" (0.8+)
            r"OutOfMemoryError",  # torch.OutOfMemoryError / torch.cuda.OutOfMemoryError
            r"CUDA error: out of memory",  # raw CUDA error, e.g. 'Worker failed with error ...'
            # The driver API's own spellings: torch's C10_CUDA_DRIVER_CHECK "CUDA driver error: out of
            # memory" (expandable segments, Marlin repacking: noonghunna/club-3090#60), its error name
            # CUDA_ERROR_OUT_OF_MEMORY (Triton, cupy), the runtime's cudaErrorMemoryAllocation, old torch's
            # "cuda runtime error (2) : out of memory", cuBLAS' workspace, and ROCm's HIP wordings.
            r"CUDA driver error: out of memory",
            r"CUDA_ERROR_OUT_OF_MEMORY",
            r"cudaErrorMemoryAllocation",
            r"cuda runtime error \(2\) ?: out of memory",
            r"CUBLAS_STATUS_ALLOC_FAILED",
            r"Triton Error \[CUDA\]: out of memory",
            r"HIP out of memory",
            r"HIP error: out of memory",
            r"hipErrorOutOfMemory",
            r"Failed to load model - not enough GPU memory",  # 0.13+
        ),
        fatal=True,
        cause=(
            "a CUDA allocation failed during load, profiling, sampler warm-up or graph capture"
        ),
        fix=(
            "lower --max-num-seqs / --max-num-batched-tokens (the warm-up batch) or "
            "--gpu-memory-utilization (headroom outside vLLM's budget); --enforce-eager skips graph "
            "capture; check no other process uses the GPU (`autotune gpus`)"
        ),
    ),
    FailureKind(
        kind="fp8_unsupported_arch",
        patterns=(
            r"type fp8e4nv not supported",  # Triton (newer): '... in this architecture'
            r"fp8e4nv data type is not supported on CUDA arch",  # Triton (older) assert
            r"FlashAttention does not support fp8 kv-cache on this device",  # V1 flash_attn ~0.7-0.10
        ),
        fatal=True,
        cause=(
            "an FP8 (e4m3) kernel was compiled for a GPU older than Ada/Hopper "
            "(compute capability < 8.9)"
        ),
        fix=(
            "pass --kv-cache-dtype auto (or fp8_e5m2 where the attention backend allows it); "
            "fp8_e4m3 needs compute capability >= 8.9; for an FP8 checkpoint use a bf16/fp16 "
            "or int4/int8 checkpoint instead"
        ),
    ),
    FailureKind(
        kind="flashinfer_nvcc_missing",
        patterns=(
            r"Could not find nvcc",
            r"nvcc: not found",  # '/bin/sh: 1: /usr/local/cuda/bin/nvcc: not found'
        ),
        fatal=True,
        cause="FlashInfer tried to JIT-compile a kernel and no CUDA toolkit (nvcc) is installed",
        fix=(
            "install flashinfer-cubin and flashinfer-jit-cache (or a CUDA toolkit), or set "
            "VLLM_USE_FLASHINFER_SAMPLER=0 / choose another attention backend"
        ),
    ),
    FailureKind(
        kind="cuda_visible_devices_uuid",
        patterns=(
            r"invalid literal for int\(\) with base 10: '(?:GPU|MIG)-",
            r"Non-integer device ID",
        ),
        fatal=True,
        cause=(
            "CUDA_VISIBLE_DEVICES holds GPU/MIG UUIDs, which vLLM (through 0.21) parses as "
            "integers"
        ),
        fix=(
            "set CUDA_VISIBLE_DEVICES to integer indices with CUDA_DEVICE_ORDER=PCI_BUS_ID (map UUIDs "
            "with nvidia-smi -L), or let autotune do it: --gpu GPU-xxxx"
        ),
    ),
    FailureKind(
        kind="bf16_unsupported",
        patterns=(
            r"Bfloat16 is only supported on GPUs with compute capability of at least 8\.0",
        ),
        fatal=True,
        cause="bfloat16 was requested on a GPU with compute capability < 8.0 (T4, V100, RTX 20xx)",
        fix="pass --dtype half",
    ),
    FailureKind(
        kind="max_model_len_above_derived",
        patterns=(
            # With VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 the same text is only a warning that ends
            # with "Make sure the value is correct ..."; that variant is not a failure.
            r"User-specified max_model_len \(\d+\) is greater than the derived max_model_len"
            r"(?!.{0,2000}Make sure the value is correct)",
        ),
        fatal=True,
        cause=(
            "--max-model-len is above the model's own maximum (max_position_embeddings etc. "
            "in config.json); refused before model load"
        ),
        fix=(
            "cap --max-model-len at the derived maximum in the message (or use --max-model-len "
            "auto on 0.14+); VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 overrides it at your own risk"
        ),
        detail=(
            "the model's own maximum is {derived_max_model_len} tokens: use --max-model-len "
            "{derived_max_model_len} or less (autotune: --target max); VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 "
            "overrides it at your own risk"
        ),
    ),
    FailureKind(
        kind="max_num_batched_tokens_below_max_model_len",
        patterns=(r"max_num_batched_tokens \(\d+\) is smaller than max_model_len \(\d+\)",),
        fatal=True,
        cause=(
            "chunked prefill is off, so a whole prompt must fit one batch: --max-model-len above "
            "--max-num-batched-tokens is refused before model load (not memory)"
        ),
        fix="raise --max-num-batched-tokens to the length you want, or drop --no-enable-chunked-prefill",
        detail=(
            "with chunked prefill off the longest prompt is --max-num-batched-tokens {batched_tokens_limit}: "
            "raise it to the length you want, or drop --no-enable-chunked-prefill"
        ),
    ),
    FailureKind(
        kind="max_num_batched_tokens_below_max_num_seqs",
        patterns=(r"max_num_batched_tokens \(\d+\) must be greater than or equal to max_num_seqs \(\d+\)",),
        fatal=True,
        cause="--max-num-batched-tokens is below --max-num-seqs: a batch must hold one token of each sequence",
        fix="raise --max-num-batched-tokens to at least --max-num-seqs, or lower --max-num-seqs",
    ),
    FailureKind(
        kind="mamba_cache_blocks",
        patterns=(r"max_num_seqs \(\d+\) exceeds available Mamba cache blocks \(\d+\)",),
        fatal=True,
        cause=(
            "hybrid/Mamba model: the memory left holds fewer Mamba state blocks than "
            "--max-num-seqs"
        ),
        fix=(
            "lower --max-num-seqs to at most the number of Mamba cache blocks in the message, "
            "or raise --gpu-memory-utilization"
        ),
        detail=(
            "relaunch with --max-num-seqs {mamba_cache_blocks} (vLLM has Mamba state for "
            "{mamba_cache_blocks} sequences, not {max_num_seqs_refused}), or raise --gpu-memory-utilization"
        ),
    ),
    FailureKind(
        kind="tp_heads_not_divisible",
        patterns=(
            # All versions (a pydantic "Value error, ..." from 0.10): the heads cannot be split evenly.
            r"Total number of attention heads \(\d+\) must be divisible by tensor parallel size \(\d+\)",
        ),
        fatal=True,
        cause="tensor parallelism splits the attention heads across GPUs, and the head count is not a "
              "multiple of --tensor-parallel-size",
        fix="use a --tensor-parallel-size that divides the head count in the message (e.g. 28 heads: 1, 2, 4, 7), "
            "or split by layers with --pipeline-parallel-size instead",
    ),
    FailureKind(
        kind="vllm_package_metadata_missing",
        patterns=(
            # The `vllm` console script asks importlib.metadata for "vllm"; vllm-cpu (and other renamed
            # builds such as vllm-pascal) are installed under another distribution name.
            r"PackageNotFoundError: No package metadata was found for vllm\b",
        ),
        fatal=True,
        cause="the `vllm` command looks up the installed package by the name \"vllm\", but this build is "
              "installed under another name (vllm-cpu, vllm-pascal, ...), so the command fails before vLLM starts",
        fix="start the server as a module: `python -m vllm.entrypoints.openai.api_server --model M ...` "
            "(the same flags as `vllm serve M ...`); autotune accepts that command after `--`",
    ),
    FailureKind(
        kind="unknown_flag",
        patterns=(
            # argparse, before vLLM starts (exit 2): a flag this vLLM does not have (a typo, or one
            # from another version), a value outside a flag's choices, an abbreviation of two flags.
            # (each starts with a literal whose window the per-line prefilter already searches for, or a rare one)
            r"error: unrecognized arguments: ",
            r"invalid choice: '.{0,200}?' \(choose from ",
            r"error: ambiguous option: ",
        ),
        fatal=True,
        cause="the serve command has a flag (or a flag's value) this vLLM does not know: its argument parser "
              "refused the command line before vLLM started (exit status 2)",
        fix="check the flag's spelling and the installed vLLM's flags with `vllm serve --help` (flags come and go "
            "between versions); remove the flag or use the one this version has",
        detail=(
            "vLLM {vllm_version} does not take {bad_value} for {bad_flag}: use one of the choices the error "
            "lists (`vllm serve --help` shows them)",
            "vLLM {vllm_version} does not know {bad_flag}: check its spelling, or drop it if it belongs to "
            "another vLLM version; `vllm serve --help` lists the flags this version takes",
            "this vLLM does not take {bad_value} for {bad_flag}: use one of the choices the error lists "
            "(`vllm serve --help` shows them)",
            "this vLLM does not know {bad_flag}: check its spelling, or drop it if it belongs to another vLLM "
            "version; `vllm serve --help` lists the flags this version takes",
        ),
    ),
    FailureKind(
        kind="address_in_use",
        patterns=(r"Address already in use", r"Errno 98\b"),
        fatal=True,
        cause="the HTTP port is already bound by another process (often a previous server)",
        fix="wait for the previous server to exit, kill it, or pass another --port",
    ),
    FailureKind(
        kind="model_not_found",
        patterns=(
            r"Repo id must be",
            r"is not a local folder and is not a valid model identifier",
            r"We couldn't connect to .{1,300}? to load the files",
            r"Incorrect path_or_model_id",
            r"does not appear to have a file named config\.json",
            r"No such file or directory: .{0,500}?config\.json",
            r"Cannot find any model weights",
            # vLLM's ModelConfig (pydantic) on a folder that holds no model, or a name that is neither.
            r"Invalid repository ID or local directory specified",
            r"OSError: .{0,500}? does not appear to have",
            # HF_HUB_OFFLINE=1 (or no network) and the repo is not in the local cache.
            r"LocalEntryNotFoundError",
            r"outgoing traffic has been disabled",
            r"RepositoryNotFoundError",
            r"GatedRepoError",
            r"Cannot access gated repo",
        ),
        fatal=True,
        cause=(
            "the model path or Hugging Face repo id cannot be resolved (a typo, a gated repo, or offline "
            "with the model not in the local cache), or it holds no config/weights"
        ),
        fix=(
            "check the model path / repo id; gated repos need HF_TOKEN; offline (HF_HUB_OFFLINE=1) the "
            "model must already be in the HF cache: download it once with `hf download REPO`"
        ),
    ),
    FailureKind(
        kind="memory_profiling_error",
        patterns=(
            # V0 and V1 <= 0.9.0: "Error in memory profiling. Initial free memory X, current free
            # memory Y. This happens when the GPU memory was not properly cleaned up ..."; V1 0.9.1+:
            # "... This happens when other processes sharing the same container release GPU memory ...".
            r"Error in memory profiling\. Initial free memory",
        ),
        fatal=True,
        cause=(
            "GPU memory used by other processes changed while vLLM profiled (a previous server still "
            "releasing memory, or another program allocating/freeing)"
        ),
        fix=(
            "wait until the previous server's memory is released (`autotune gpus`), run vLLM alone on "
            "the GPU, then relaunch"
        ),
    ),
    FailureKind(
        kind="model_runner_v1_removed",
        patterns=(
            # 0.34+ (vllm/platforms/interface.py validate_environ): "VLLM_USE_V2_MODEL_RUNNER=0 is no longer
            # supported: Model Runner V1 has been removed. Unset this variable."
            r"Model Runner V1 has been removed\. Unset this variable",
        ),
        fatal=True,
        cause="VLLM_USE_V2_MODEL_RUNNER asks for Model Runner V1, which vLLM 0.34 removed (on GPU and CPU)",
        fix="unset VLLM_USE_V2_MODEL_RUNNER (the V2 runner is the only one), or pin vLLM 0.33 to keep V1",
    ),
    # --- not fatal by itself ----------------------------------------------------
    FailureKind(
        kind="extensible_kv_cache_disabled",
        patterns=(
            # 0.34+ (vllm/v1/executor/abstract.py): "Disabling the extensible KV cache: %s. The KV cache will be
            # sized from profiling estimates instead of measured memory."
            r"Disabling the extensible KV cache: ",
        ),
        fatal=False,
        cause=(
            "vLLM 0.34 could not use the extensible KV cache on this machine (the reason follows the colon), so "
            "it sizes the pool from profiling estimates: an unset --gpu-memory-utilization is 0.92, not 1.0, "
            "and the CUDA-graph estimate comes off the pool"
        ),
        fix=(
            "nothing, if the pool is enough; else fix the reason (a driver or container without CUDA VMM, a KV "
            "connector that needs legacy IPC) to get the measured pool back, or raise --gpu-memory-utilization"
        ),
        detail="{extensible_kv_cache_off_reason}: fix that to size the KV cache from measured memory again, or "
               "raise --gpu-memory-utilization (unset is 0.92 without the extensible KV cache)",
    ),
    FailureKind(
        kind="gmu_caps_extensible_kv_cache",
        patterns=(
            # 0.34+ (vllm/v1/worker/extensible_kv_cache.py measure_kv_cache_blocks), an explicit 0.7 < gmu < 1.0
            # keeping >= 1 GiB away: "gpu_memory_utilization=%s caps this instance at %s GiB, keeping %s GiB of
            # free device memory out of the KV cache. ..."
            r"gpu_memory_utilization=\S{1,20} caps this instance at",
        ),
        fatal=False,
        cause=(
            "an explicit --gpu-memory-utilization below 1.0 caps the extensible KV cache, which is already "
            "sized from the memory measured after warmup and CUDA-graph capture: the headroom is not needed "
            "for vLLM's own use"
        ),
        fix=(
            "drop --gpu-memory-utilization (vLLM 0.34 then uses all the memory left) unless something vLLM does "
            "not measure shares the GPU (another process, weight-transfer buffers, a KV connector's buffers)"
        ),
        detail="drop --gpu-memory-utilization {gmu_explicit} to give the KV cache the {gmu_withheld_gib} GiB it "
               "keeps out (unless another process shares the GPU)",
    ),
    FailureKind(
        kind="fa2_unavailable_low_cc",
        patterns=(
            r"Cannot use FlashAttention-2 backend for Volta and Turing",  # V0 selector
            r"FA2 is only supported on devices with compute capability >= 8",  # vllm_flash_attn reason
            r"Cannot use FA version",  # logged at ERROR level, yet harmless
        ),
        fatal=False,
        cause=(
            "FlashAttention 2 needs compute capability >= 8.0; vLLM falls back to another "
            "attention backend (XFormers, FlexAttention, Triton)"
        ),
        fix=(
            "on a mixed machine hide the older GPU (autotune --gpu INDEX of the newer one, or "
            "CUDA_VISIBLE_DEVICES) to get FLASH_ATTN back; on a single old GPU nothing to do"
        ),
    ),
    # --- generic engine death: LAST, so any specific cause wins ----------------
    FailureKind(
        kind="engine_died",
        patterns=(
            r"EngineCore failed to start",  # V1 0.8.5+
            r"EngineCore hit an exception",  # V1 0.7-0.8.4
            r"Engine core initialization failed",  # V1 API server, 0.8.4+
            r"Engine process failed to start",  # V0 MQLLMEngine
            r"Got fatal signal from worker processes",  # V1 0.7-0.8.4 (then SIGKILL, rc 137)
            r"WorkerProc failed to start",  # TP>1 worker
            r"WorkerProc initialization failed",  # EngineCore side of the same
        ),
        fatal=True,
        cause="the engine process died during startup; the root cause is earlier in the log",
        fix=(
            "the last exception lines of the log (shown with the diagnosis) name the cause; if none is "
            "visible, rerun with the full log"
        ),
    ),
)

KINDS: tuple[str, ...] = tuple(entry.kind for entry in CATALOG)
# The kinds that are vLLM refusing the requested length for want of KV cache (V1 and V0 wordings).
REFUSAL_KINDS = ("kv_cache_insufficient", "kv_cache_insufficient_legacy")

# Compiled once: (entry, (the literal every match starts with, compiled pattern) ...) in catalog order.
# A pattern whose literal is not in the line cannot match there: a substring test skips its search.
_COMPILED: tuple[tuple[FailureKind, tuple[tuple[str, re.Pattern[str]], ...]], ...] = tuple(
    (entry, tuple((leading_literal(p), re.compile(p)) for p in entry.patterns)) for entry in CATALOG
)
# One alternation of every pattern: a single search rejects the (vast majority of)
# lines that match nothing before the per-entry loop decides which entry wins.
_ANY = re.compile("|".join(f"(?:{p})" for entry in CATALOG for p in entry.patterns))
# Cheaper still: a window of the literal each pattern starts with (see messages.prefilter).
_PREFILTER = prefilter(leading_literal(p) for entry in CATALOG for p in entry.patterns)
_BY_KIND = {entry.kind: entry for entry in CATALOG}


def search(line: str) -> tuple[FailureKind, re.Match[str]] | None:
    """Like ``match`` but also returns the regex match (the parser uses its span
    to show the signature in the provenance text)."""
    if not isinstance(line, str) or _PREFILTER.search(line) is None or _ANY.search(line) is None:
        return None
    for entry, patterns in _COMPILED:
        for literal, pattern in patterns:
            found = pattern.search(line) if literal in line else None
            if found is not None:
                return entry, found
    return None  # pragma: no cover - _ANY matched, so some entry does


def match(line: str) -> FailureKind | None:
    """The first entry, in CATALOG order, with a pattern found in ``line``."""
    hit = search(line)
    return hit[0] if hit is not None else None


def lookup(kind: str) -> FailureKind | None:
    """The entry named ``kind`` (an error_kind), or None."""
    return _BY_KIND.get(kind)


class _Figures(dict):
    """str.format_map mapping that records a missing key instead of raising."""

    missing = False

    def __missing__(self, key: str) -> str:
        self.missing = True
        return ""


def diagnosis(result: dict, provenance: dict | None = None) -> dict | None:
    """The diagnosis of a parsed boot log: ``{"kind", "cause", "fix"}`` for its error_kind,
    the fix filled in with the figures the log printed where the entry has a ``detail``
    and the log shows all of them (none of them flagged implausible); for an error with no
    known kind, kind ``unknown`` and its final exception line (``exception`` in the result,
    its line number from ``provenance``); None when the log shows no failure."""
    kind = result.get("error_kind") if isinstance(result, dict) else None
    entry = lookup(kind) if isinstance(kind, str) else None
    if entry is None:
        return _unknown_failure(result, provenance)
    return {"kind": entry.kind, "cause": entry.cause, "fix": _pool_lever(_detailed_fix(entry, result), result)}


# Where a fix says to grow the KV pool with gmu (and, after it, what the CPU backend uses instead).
_RAISE_GMU = re.compile(r"raise --gpu-memory-utilization(?: \([^)]*\))?")
KV_BYTES_LEVER = ("raise --kv-cache-memory-bytes (now {now}; it fixes the KV pool, so "
                  "--gpu-memory-utilization does not size it)")


def _pool_lever(fix: str, result: dict) -> str:
    """The fix with the lever that sizes the pool: with --kv-cache-memory-bytes (0.10.2+, in vLLM's
    non-default args) the pool is that many bytes whatever gmu says, so raising gmu changes nothing."""
    args = result.get("non_default_args")
    fixed = args.get("kv_cache_memory_bytes") if isinstance(args, dict) else None
    if not fixed:
        return fix
    now = f"{fixed / 2**30:g} GiB" if isinstance(fixed, (int, float)) else str(fixed)
    lever = KV_BYTES_LEVER.format(now=now)
    return _RAISE_GMU.sub(lambda _: lever, fix)


def _detailed_fix(entry: FailureKind, result: dict) -> str:
    """The entry's fix with the figures the log printed: its first detail template whose figures are
    all there and none implausible; else the plain fix."""
    flagged = {item.get("key") for item in result.get("implausible") or () if isinstance(item, dict)}
    figures = _Figures({k: str(v) for k, v in result.items() if isinstance(v, (int, float, str))})
    free, total = result.get("startup_free_gib"), result.get("startup_total_gib")
    if isinstance(free, (int, float)) and isinstance(total, (int, float)) and total > 0:
        figures["startup_free_fraction"] = f"{int(free / total * 100) / 100:.2f}"
    for template in entry.detail if isinstance(entry.detail, tuple) else (entry.detail,):
        named = {field for _, field, _, _ in string.Formatter().parse(template) if field}
        if not template or named & flagged:  # an implausible figure never becomes a fix
            continue
        figures.missing = False
        filled = template.format_map(figures)
        if not figures.missing:
            return filled
    return entry.fix


def _unknown_failure(result: dict, provenance: dict | None) -> dict | None:
    """A boot that failed with no known signature: its final exception line is the cause."""
    if not isinstance(result, dict) or result.get("outcome") != "error":
        return None
    stated = result.get("exception")
    where = ((provenance or {}).get("exception") or {}).get("line")
    at = f" (line {where})" if isinstance(where, int) else ""
    if not isinstance(stated, str) or not stated:
        return {"kind": "unknown", "cause": "the boot failed and its log shows no known failure and no exception",
                "fix": "read the end of the log; the lines before it name the cause"}
    return {"kind": "unknown", "cause": f"the boot failed and the log ends in a failure autotune does not know{at}: "
                                        f"{stated}",
            "fix": "read the log up to that line: the traceback or error above it names the cause"}


_TRACEBACK_START = "Traceback (most recent call last)"
_PREFIX_RE = re.compile(r"^(?:\([\w\-]+ pid=\d+\) )?(?:(?:ERROR|CRITICAL|WARNING|INFO) \S+ \S+ \[[^\]]*\] )?")


def traceback_tail(lines: list[str], n: int = 6) -> list[str]:
    """The end of the most telling Python traceback in a log: its innermost frames and the
    exception (with any indented continuation lines), vLLM's process/level prefixes removed;
    [] when the log holds no traceback.

    "Most telling" is the last traceback whose exception is not one of the generic
    engine-death wrappers (``RuntimeError: Engine core initialization failed ...``), which
    only point back at the real one. For ``engine_died`` and for a process that exited
    with no known cause, this is what tells the user what went wrong."""
    stripped = [_PREFIX_RE.sub("", line.rstrip("\r\n")) for line in lines]
    starts = [i for i, line in enumerate(stripped) if line.startswith(_TRACEBACK_START)]
    blocks = [_traceback_block(stripped, i) for i in starts]
    blocks = [b for b in blocks if b]
    if not blocks:
        return []
    for block in reversed(blocks):
        exception = next((line for line in block if not line.startswith((" ", "\t"))), "")
        found = match(exception)
        if found is None or found.kind != "engine_died":
            return block[-n:]
    return blocks[-1][-n:]


def _traceback_block(stripped: list[str], start: int) -> list[str]:
    block: list[str] = []
    exception_seen = False
    for line in stripped[start + 1:]:
        indented = line.startswith((" ", "\t"))
        if exception_seen:
            if indented and line.strip():
                block.append(line)  # continuation of the exception message (pydantic, ...)
                continue
            break
        if not line.strip():
            continue
        block.append(line)
        if not indented:
            exception_seen = True
    return block if exception_seen else []
