"""A length vLLM accepts but never serves: a request within max-model-len that waits in vLLM's
queue forever, and how autotune sees it without hanging.

From 0.19 vLLM's scheduler admits a new request only when its whole prompt fits the KV pool
(--scheduler-reserve-full-isl, versions.admits_whole_prompts_only). A sliding-window or hybrid
model's boot check counts the windowed layers at their window, so it passes a max-model-len
longer than the pool: a request between the two waits with `Running: 0 reqs, Waiting: 1 reqs`
until the client gives up, and every request behind it waits too (vllm#39734). Two ways to see it:

- before any request: vLLM 0.11-0.20 prints the pool as "KV cache size: N tokens" in whole blocks
  of every layer; N below the length asked for is that case (pool_below_length). From 0.21 the
  figure is the concurrency times the length, which says nothing of it;
- during a request (probe.py): /metrics shows the request waiting with nothing running, for
  STUCK_AFTER_S (QueueWatch). The log's own `Running: 0 reqs, Waiting: 1 reqs` line is no
  witness: vLLM logs it at DEBUG while the engine has had no throughput (v1/metrics/loggers.py
  engine_is_idle), so for a first request it never shows.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from autotune.host.signals import GATE
from autotune.server import client, health, metrics
from autotune.store.record import Attempt
from autotune.vllm import versions

STUCK_AFTER_S = 15.0  # running 0 and waiting >= 1 this long: the scheduler will not admit it
POLL_S = 1.0
WHY = ("vLLM admits a request only when its KV pool can hold the whole prompt (--scheduler-reserve-full-isl, "
       "the default from 0.19), and its boot check counts sliding-window layers at their window: the pool "
       "is smaller than the max-model-len it accepted (sliding-window and hybrid models; vllm#39734)")


def waits_over_pool(pool: int | None, length: int, argv: list[str], version: str | None) -> bool:
    """Does a request of `length` tokens wait forever on this vLLM, whose pool holds `pool` tokens in
    whole blocks of every layer (its log's "KV cache size" 0.11-0.20, or /metrics' num_gpu_blocks x
    block_size there)? False when that cannot be told (pure)."""
    found = versions.profile(version)
    if not isinstance(pool, int) or pool >= length or found is None or found.version >= (0, 21, 0):
        return False
    return bool(versions.admits_whole_prompts_only(argv, version))


def pool_below_length(log_facts: dict, length: int, argv: list[str], version: str | None) -> str | None:
    """Why a request of `length` tokens would wait forever, from the boot log alone (the parser's
    facts); None when the log does not say so (pure)."""
    pool = log_facts.get("kv_cache_tokens")
    if not waits_over_pool(pool, length, argv, version):
        return None
    return (f"its KV pool holds {pool:,} tokens (\"KV cache size\"), fewer than max-model-len {length:,}: a request "
            f"longer than the pool would wait in vLLM's queue forever. {WHY}")


def card_warning(attempt: Attempt) -> dict | None:
    """The card's warning for a boot whose full-length request would wait (or waited) forever."""
    if attempt.outcome != "queued":
        return None
    pool = attempt.fact("kv_cache_tokens")
    length = attempt.max_model_len
    length = attempt.fact("autofit_max_model_len") if not isinstance(length, int) else length
    queued = attempt.probe.queued if attempt.probe is not None else None
    seen = (f"its near-ceiling request waited {queued['stuck_s']:g} s in the queue with nothing running"
            if queued else f"its KV pool holds {pool:,} tokens" if isinstance(pool, int) else "")
    at_most = f"at most {pool:,} (the pool)" if isinstance(pool, int) else "at most what its KV pool holds"
    return {"message": f"boot {attempt.index} at {length:,} booted, but a request that long waits in vLLM's "
                       f"queue forever ({seen})" if isinstance(length, int) else "a boot's requests wait forever",
            "cause": WHY,
            "remedy": f"serve --max-model-len {at_most}, or add {versions.NO_FULL_ISL_FLAG} (vLLM 0.19+: a request "
                      "is admitted when its first chunk fits) and verify it with --probe quick"}


@dataclass
class QueueWatch:
    """While one request is in flight: reads /metrics every poll_s; when the server shows requests
    waiting and none running for stuck_s, it closes the request's response and says so (verdict).
    A server whose /metrics cannot be read is not watched (the request's own timeout stays)."""

    server: health.Server
    stuck_s: float = STUCK_AFTER_S
    poll_s: float = POLL_S
    read: Callable[[health.Server], metrics.ServerMetrics] = metrics.read
    verdict: dict | None = None
    unwatched: str | None = None  # why /metrics could not be watched
    _response: object = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def attach(self, response) -> None:
        """The open response of the watched request: closed when it is stuck."""
        self._response = response
        if response is not None and self.verdict is not None:
            client.abort(response)

    def __enter__(self) -> QueueWatch:
        self._thread = threading.Thread(target=self._run, name="probe-queue", daemon=True)
        try:
            # A Ctrl-C inside start() leaves a thread half started, which the interpreter's exit then
            # trips over ("Exception ignored in thread started by ... KeyError"): start it whole, and
            # on the signal raised after it, stop it before unwinding.
            with GATE.deferred():
                self._thread.start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.poll_s + 5)

    def _run(self) -> None:
        t0 = time.monotonic()
        since = None
        polls = 0
        while not self._stop.wait(self.poll_s if polls else 0):
            polls += 1
            try:
                seen = self.read(self.server)
            except metrics.MetricsUnavailable as exc:
                self.unwatched = str(exc)
                return
            except Exception as exc:  # noqa: BLE001 - a client closed under it (Ctrl-C): never a thread's traceback
                self.unwatched = f"GET /metrics: {type(exc).__name__}: {exc}"
                return
            now = time.monotonic()
            waiting, running = seen.requests_waiting, seen.requests_running
            if waiting is None or running is None:
                self.unwatched = "GET /metrics has no vllm:num_requests_waiting / vllm:num_requests_running"
                return
            since = (since or now) if running == 0 and waiting >= 1 else None
            if since is not None and now - since >= self.stuck_s:
                self.verdict = {"waiting": waiting, "running": running, "stuck_s": round(now - since, 1),
                                "after_s": round(now - t0, 1), "polls": polls,
                                "source": f"GET /metrics {metrics.REQUESTS_WAITING}, {metrics.REQUESTS_RUNNING}"}
                if self._response is not None:
                    client.abort(self._response)
                return
