"""The words a run records: each attempt's outcome, a run's verdict, the bases of a length that is
not vLLM's own number, what sets a verified ceiling below the target, and the warnings about a run.

They are the vocabulary of run.json, read back by analysis/ and the commands; run/strategy.py
decides with them (and re-exports them as strategy.VERIFIED and so on). Each is a str-valued enum:
a member equals its word, and run.json holds the word, so files read and written stay as they were.
"""

from enum import StrEnum  # Python 3.11: pyproject's requires-python (tests/cli/test_python_version.py)


class Outcome(StrEnum):
    """How one boot ended (run.json "attempts[].outcome")."""

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


class Verdict(StrEnum):
    """How a run ended (run.json "result.verdict"); cli/exitcodes.py gives each its exit code."""

    VERIFIED = "verified"
    ERROR = "error"
    NOT_VERIFIED = "not_verified"
    HUNG = "hung"
    REFUSED_NO_CEILING = "refused_no_ceiling"
    NOTHING_FITS = "nothing_fits"
    MAX_BOOTS = "max_boots"
    FRONT_DOOR = "front_door"
    INTERRUPTED = "interrupted"


# Attempt outcomes under their old names (run/ reads them as strategy.VERIFIED and so on).
VERIFIED = Outcome.VERIFIED
NOT_VERIFIED = Outcome.NOT_VERIFIED
PROBE_FAILED = Outcome.PROBE_FAILED
QUEUED = Outcome.QUEUED
FRONT_DOOR = Outcome.FRONT_DOOR
REFUSED = Outcome.REFUSED
AUTOFIT_READ = Outcome.AUTOFIT_READ
ERROR = Outcome.ERROR
EXITED = Outcome.EXITED
HUNG = Outcome.HUNG
INTERRUPTED = Outcome.INTERRUPTED


class Basis(StrEnum):
    """Why a boot was at its length (run.json "attempts[].basis")."""

    TARGET = "target"
    CEILING = "ceiling"
    AUTO = "auto"
    START_AT = "start_at"  # a prediction from earlier runs
    ROOM = "room"  # aimed from a boot's KV pool
    COMPUTED = "computed"  # from a refusal's two-decimal GiB figures (vLLM 0.8.4-0.9.0.1 print no estimate)
    FIXED_POINT = "fixed_point"  # where the pool shrinks with the length: the line through two pools meets need
    POOL = "pool"  # the boot's KV pool: a longer request would wait in vLLM's queue forever (queued)
    BACK_OFF = "back_off"  # --back-off: 10% under a length whose probe failed


# The bases of a length that is not vLLM's own number. Once such a boot verifies, its own pool
# decides: below the ceiling it shows, the next boot is there (a computed one within
# strategy.ROOM_TOLERANCE is accepted).
PREDICTED = (Basis.START_AT, Basis.ROOM, Basis.COMPUTED)


class Limit(StrEnum):
    """What sets a verified ceiling below the target (run.json "result.limit"): the KV pool, or a
    limit that is not memory (vllm/log/plausible.py LIMIT_SOURCES: vLLM refused a length above it and named it)."""

    KV_CACHE = "kv_cache"
    MODEL_MAXIMUM = "model_maximum"
    MAX_NUM_BATCHED_TOKENS = "max_num_batched_tokens"
    DRAFT_MODEL = "draft_model"


KV_CACHE = Limit.KV_CACHE
LIMITS = tuple(Limit)


class WarningKind(StrEnum):
    """Every warning a finished run can carry (run.json "warnings[].kind"), a closed set as hyperfine's
    `enum Warnings`: run/warnings.py decides each one's message, cause and remedy; the card shows them."""

    LEFTOVER_PROCESSES = "leftover_processes"  # processes alive after a boot was stopped
    METRICS_DISAGREE = "metrics_disagree"  # vLLM's /metrics disagrees with its boot log (server/witness.py)
    QUEUED_FOREVER = "queued_forever"  # a full-length request waits in vLLM's queue forever (server/queue_watch.py)
    REFUSED_AGAIN = "refused_again"  # vLLM refused more than one length before one booted
    SHORT_OF_TARGET = "short_of_target"  # the verified ceiling is below the target


WARNING_KINDS = tuple(WarningKind)
