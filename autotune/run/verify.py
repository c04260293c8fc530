"""Talk to the server autotune started, over HTTP on loopback only.

A boot counts as up when GET /health answers 200 and GET /v1/models reports the
max_model_len that was asked for (vLLM >= 0.20 reports the fitted length there, older
ones the requested one; a mismatch means the server is not serving what we think).
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Callable, TypeVar

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

LOOPBACK = "127.0.0.1"

# A server that listens but breaks an answer (a reset, a dropped connection, a 5xx, a timeout)
# while it starts is asked again this many times, 0.5 s, 1 s, 2 s, 4 s apart, before the boot
# counts as not verified. Each retry is recorded in the attempt (run.json).
HTTP_RETRIES = 4
RETRY_WAIT_FIRST_S = 0.5
RETRY_WAIT_MAX_S = 4.0

T = TypeVar("T")


class ProbeError(Exception):
    pass


class Transient(ProbeError):
    """The server is listening, but this answer broke; asking again may work."""


def _cause(exc: BaseException) -> BaseException:
    if isinstance(exc, urllib.error.URLError) and isinstance(exc.reason, BaseException):
        return exc.reason
    return exc


def _describe(exc: BaseException) -> str:
    cause = _cause(exc)
    text = str(cause).strip()
    return f"{type(cause).__name__}: {text}" if text else type(cause).__name__


def with_retries(call: Callable[[], T], endpoint: str, on_retry: Callable[[dict], None] | None = None,
                 retries: int = HTTP_RETRIES) -> T:
    """call(), asked again with exponential backoff while it raises Transient (bounded).

    on_retry gets one dict per retry: endpoint, the try that failed, its error, the wait.
    After the last try the Transient propagates.
    """
    t0 = time.monotonic()

    def before_sleep(state) -> None:
        if on_retry is not None:
            on_retry({"endpoint": endpoint, "try": state.attempt_number,
                      "error": str(state.outcome.exception()), "wait_s": round(state.next_action.sleep, 2),
                      "at_s": round(time.monotonic() - t0, 2)})

    retrying = Retrying(retry=retry_if_exception_type(Transient), stop=stop_after_attempt(retries + 1),
                        wait=wait_exponential(multiplier=RETRY_WAIT_FIRST_S, max=RETRY_WAIT_MAX_S),
                        before_sleep=before_sleep, reraise=True)
    return retrying(call)


def base_url(port: int) -> str:
    return f"http://{LOOPBACK}:{port}"


def _request(url: str, timeout: float, data: dict | None = None) -> tuple[int, bytes]:
    if not url.startswith(f"http://{LOOPBACK}:"):
        # The probe only ever talks to the server autotune started on this machine.
        raise ProbeError(f"refusing to contact a non-loopback address: {url}")
    body = json.dumps(data).encode() if data is not None else None
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"} if body else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read() if exc.fp else b""


def health_ok(port: int, timeout: float = 2.0) -> bool:
    try:
        return health(port, timeout)
    except ProbeError:
        return False


def health(port: int, timeout: float = 2.0) -> bool:
    """GET /health: True on 200; False while nothing listens (connection refused) or on a 4xx.

    Raises Transient when something listens but the answer breaks: a reset or dropped
    connection, a timeout, a 5xx (what a server does while its HTTP stack or engine starts).
    """
    try:
        status, _ = _request(base_url(port) + "/health", timeout)
    except (OSError, http.client.HTTPException) as exc:
        if isinstance(_cause(exc), ConnectionRefusedError):
            return False
        raise Transient(f"GET /health: {_describe(exc)}") from exc
    if status >= 500:
        raise Transient(f"GET /health answered {status}")
    return status == 200


@dataclass
class ModelInfo:
    id: str
    max_model_len: int | None


def served_models(port: int, timeout: float = 5.0) -> list[ModelInfo]:
    try:
        status, body = _request(base_url(port) + "/v1/models", timeout)
    except (OSError, http.client.HTTPException) as exc:
        raise Transient(f"GET /v1/models: {_describe(exc)}") from exc
    if status >= 500:
        raise Transient(f"GET /v1/models answered {status}")
    if status != 200:
        raise ProbeError(f"GET /v1/models answered {status}")
    try:
        data = json.loads(body)["data"]
        return [ModelInfo(id=str(m.get("id")), max_model_len=m.get("max_model_len")) for m in data]
    except (ValueError, KeyError, TypeError) as exc:
        raise ProbeError(f"GET /v1/models gave an unexpected body: {body[:200]!r}") from exc


def check_serving(port: int, expected_len: int | None,
                  on_retry: Callable[[dict], None] | None = None) -> tuple[bool, str, dict]:
    """(verified, reason, evidence) for a server that answers /health.

    expected_len None: the boot log did not say which length vLLM chose (an auto-fit boot
    without its Auto-fit line), so nothing can be verified. A broken answer is asked again
    (with_retries) before it counts.
    """
    try:
        models = with_retries(lambda: served_models(port), "/v1/models", on_retry)
    except (OSError, ProbeError) as exc:
        return False, f"/v1/models failed: {exc}", {}
    evidence = {"models": [{"id": m.id, "max_model_len": m.max_model_len} for m in models]}
    if not models:
        return False, "/v1/models lists no model", evidence
    reported = models[0].max_model_len
    if expected_len is None:
        return False, f"/v1/models reports max_model_len {reported}, but the log did not say what was fitted", evidence
    if reported != expected_len:
        return False, f"/v1/models reports max_model_len {reported}, asked for {expected_len}", evidence
    return True, f"/health 200 and /v1/models reports max_model_len {reported}", evidence
