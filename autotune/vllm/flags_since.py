"""Which vLLM version first has each flag autotune's behaviour depends on (read by vllm/versions.py,
the one home of version facts; a table of its own as it grows with every release)."""

# Flags that came with a release, where autotune's behaviour depends on them: the first version
# whose vllm/engine/arg_utils.py has each (absent from the release before: 0.8.4, 0.10.1, 0.18.1,
# 0.30.0). An older vLLM's argparse refuses them (exit 2); the replaying vLLM too (testing/
# fake_args.py). Each with what to do instead. None of the flags autotune reads or writes has left
# vLLM yet (0.33).
FLAGS_SINCE: dict[str, tuple[tuple[int, int, int], str]] = {
    "--no-enable-chunked-prefill": ((0, 8, 5), "write --enable-chunked-prefill False"),
    "--kv-cache-memory-bytes": ((0, 10, 2), "size the KV cache with --gpu-memory-utilization"),
    "--scheduler-reserve-full-isl": ((0, 19, 0), "drop it: before 0.19 a request is admitted when its first "
                                                 "chunk fits"),
    "--no-scheduler-reserve-full-isl": ((0, 19, 0), "drop it: before 0.19 a request is admitted when its first "
                                                    "chunk fits"),
    "--device-memory-utilization": ((0, 31, 0), "write --gpu-memory-utilization"),
    # 0.34.0 (vllm/engine/arg_utils.py; absent in 0.33.0).
    "--enable-extensible-kv-cache": ((0, 34, 0), "drop it: before 0.34 the KV cache is sized from profiling "
                                                 "estimates"),
    "--no-enable-extensible-kv-cache": ((0, 34, 0), "drop it: before 0.34 the KV cache is sized from profiling "
                                                    "estimates"),
    "--max-num-inflight-kv-loads": ((0, 34, 0), "drop it"),
    "--cache-aware-admission-window": ((0, 34, 0), "drop it"),
    "--cache-aware-admission-threshold": ((0, 34, 0), "drop it"),
    "--checkpoint-prepare-on-startup": ((0, 34, 0), "drop it"),
    "--no-checkpoint-prepare-on-startup": ((0, 34, 0), "drop it"),
    "--shuffle-safetensors-files": ((0, 34, 0), "drop it"),
    "--no-shuffle-safetensors-files": ((0, 34, 0), "drop it"),
}
