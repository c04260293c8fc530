"""The words a run records: each attempt's outcome, the bases of a length that is not vLLM's own
number, and what sets a verified ceiling below the target.

They are the vocabulary of run.json, read back by analysis/ and the commands; run/strategy.py
decides with them (and re-exports them as strategy.VERIFIED and so on).
"""

# Attempt outcomes, as recorded in run.json.
VERIFIED = "verified"  # healthy and /v1/models reports the asked length
NOT_VERIFIED = "booted_not_verified"  # healthy, but the server does not serve the asked length
PROBE_FAILED = "probe_failed"  # healthy and serving the length, but a near-ceiling request failed
QUEUED = "queued"  # healthy and reporting the length, but a request that long waits in vLLM's queue forever
FRONT_DOOR = "front_door"  # healthy, but its front door turned autotune away (a key it wants, TLS): server/health.py
REFUSED = "refused"  # vLLM's KV-cache refusal
AUTOFIT_READ = "autofit_read"  # auto_probe: the fitted length was read, the boot stopped
ERROR = "error"  # another fatal failure (see error_kind)
EXITED = "exited"  # the process ended with no known cause in its log
HUNG = "hung"  # no output for --stall-timeout seconds
INTERRUPTED = "interrupted"  # autotune itself was stopped

# The bases of a length that is not vLLM's own number: a prediction (start_at), a length aimed from a
# boot's KV pool (room), one computed from a refusal's two-decimal GiB figures (computed; vLLM
# 0.8.4-0.9.0.1 print no estimate). Once such a boot verifies, its own pool decides: below the
# ceiling it shows, the next boot is there (a computed one within strategy.ROOM_TOLERANCE is accepted).
PREDICTED = ("start_at", "room", "computed")

# What sets a verified ceiling below the target: the KV pool, or a limit that is not memory
# (vllm/log/plausible.py LIMIT_SOURCES: vLLM refused a length above it and named it).
KV_CACHE = "kv_cache"
LIMITS = (KV_CACHE, "model_maximum", "max_num_batched_tokens", "draft_model")
