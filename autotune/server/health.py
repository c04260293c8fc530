"""Is the server autotune started up, and does it serve the length asked for?

A boot counts as up when GET /health answers 200 and GET /v1/models reports the
max_model_len that was asked for (vLLM >= 0.20 reports the fitted length there, older
ones the requested one; a mismatch means the server is not serving what we think).

Every request goes through client.py, set up for the serve command's front door (key,
TLS, root path, unix socket). A door that turns autotune away (401/403, a TLS mismatch)
is a FrontDoorRefused with its diagnosis, never "does not serve the length".
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import TypeVar

import httpx
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from autotune.server import client as client_mod
from autotune.server.client import FrontDoor, ServerClient

LOOPBACK = client_mod.LOOPBACK

# A server that listens but breaks an answer (a reset, a dropped connection, a 5xx, a timeout)
# while it starts is asked again this many times, 0.5 s, 1 s, 2 s, 4 s apart, before the boot
# counts as not verified. Each retry is recorded in the attempt (run.json).
HTTP_RETRIES = 4
RETRY_WAIT_FIRST_S = 0.5
RETRY_WAIT_MAX_S = 4.0

T = TypeVar("T")
Server = FrontDoor | ServerClient | int


class ProbeError(Exception):
    pass


class Transient(ProbeError):
    """The server is listening, but this answer broke; asking again may work."""


class FrontDoorRefused(ProbeError):
    """The server answers, but its front door turns autotune away: a key it wants (401/403) or
    TLS that does not match. Its message is the diagnosis; asking again would not help."""

    def __init__(self, message: str, kind: str, fix: str):
        super().__init__(message)
        self.kind = kind  # api_key | tls
        self.fix = fix

    def to_dict(self) -> dict:
        return {"kind": self.kind, "cause": str(self), "fix": self.fix}


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


@lru_cache(maxsize=16)
def _client_for(door: FrontDoor) -> ServerClient:
    return ServerClient(door)


def client_of(server: Server) -> ServerClient:
    """The client for a server given as a client, a front door or a plain loopback port."""
    if isinstance(server, ServerClient):
        return server
    return _client_for(client_mod.as_door(server))


def base_url(server: FrontDoor | int) -> str:
    return client_mod.as_door(server).where


def key_diagnosis(door: FrontDoor, status: int, path: str) -> FrontDoorRefused:
    """What a 401/403 means, given where autotune looked for a key."""
    if door.url:  # a deployed server (autotune verify URL): the key can only come from the environment
        env = client_mod.API_KEY_ENV
        if door.key_source:
            return FrontDoorRefused(f"GET {path} answered {status}: {door.url} refused the API key in {env}",
                                    "api_key", f"set {env} to the key this server checks")
        return FrontDoorRefused(f"GET {path} answered {status}: {door.url} wants an API key and {env} is not set",
                                "api_key", f"export {env}=<the key> before running autotune verify")
    looked = (f"`--api-key` in the serve command and its --config file, then {client_mod.API_KEY_ENV} in the "
              "environment autotune gives vLLM")
    if door.key_source:
        cause = (f"GET {path} answered {status}: the server refused the API key autotune sent "
                 f"(taken from {door.key_source}; it looked in {looked})")
        fix = ("the server checks a different key than the one in the serve command: if the key is set "
               "somewhere autotune does not read (a wrapper script, a secrets file, `docker run -e`), "
               "give it as --api-key or VLLM_API_KEY instead")
    else:
        cause = (f"GET {path} answered {status}: the server wants an API key and autotune found none "
                 f"(it looked in {looked})")
        fix = (f"export {client_mod.API_KEY_ENV}=<the key> before running autotune, or put "
               "--api-key in the serve command (autotune never writes the key's value down)")
    return FrontDoorRefused(cause, "api_key", fix)


def tls_diagnosis(door: FrontDoor, path: str, exc: BaseException) -> FrontDoorRefused:
    detail = client_mod.describe_error(exc)
    if door.url:
        cause = f"GET {path}: the TLS handshake with {door.url} failed ({detail})"
        fix = ("give --ssl-ca-certs FILE, the CA that signed the server's certificate, when the system does not "
               "trust it" if door.scheme == "https" else "the server speaks https: use https:// in the URL")
        return FrontDoorRefused(cause, "tls", fix)
    if door.scheme == "https":
        cause = f"GET {path}: the TLS handshake with {door.where} failed ({detail})"
        fix = ("check --ssl-certfile/--ssl-keyfile (and --ssl-ca-certs, which must be the CA that signed "
               "the server's certificate)")
    else:
        cause = (f"GET {path}: the server on {door.where} speaks https, but the serve command autotune read "
                 f"has no --ssl-keyfile/--ssl-certfile ({detail})")
        fix = ("give --ssl-keyfile/--ssl-certfile on the serve command or in its --config file (not in a wrapper "
               "script autotune cannot read) so autotune speaks https")
    return FrontDoorRefused(cause, "tls", fix)


def _get(server: Server, path: str, timeout: float) -> tuple[int, bytes]:
    """GET path. Raises: ConnectionRefusedError while nothing listens; FrontDoorRefused for a
    TLS mismatch; Transient when something listens but the answer breaks."""
    client = client_of(server)
    try:
        return client.request("GET", path, timeout)
    except (httpx.HTTPError, client_mod.TlsMismatch, OSError) as exc:
        if client_mod.refused(exc):
            raise ConnectionRefusedError(client_mod.describe_error(exc)) from exc
        if client_mod.tls_failure(exc):
            raise tls_diagnosis(client.door, path, exc) from exc
        if (client.door.scheme == "http" and isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError))
                and client_mod.speaks_tls(client.door)):
            raise tls_diagnosis(client.door, path, exc) from exc
        raise Transient(f"GET {path}: {client_mod.describe_error(exc)}") from exc


def health_ok(server: Server, timeout: float = 2.0) -> bool:
    """A plain yes or no: is /health 200 now? (Before the server says it listens.)"""
    try:
        return health(server, timeout)
    except ProbeError:
        return False


def health(server: Server, timeout: float = 2.0) -> bool:
    """GET /health: True on 200; False while nothing listens (connection refused) or on a 4xx.

    Raises Transient when something listens but the answer breaks: a reset or dropped
    connection, a timeout, a 5xx (what a server does while its HTTP stack or engine starts);
    FrontDoorRefused when TLS does not match.
    """
    try:
        status, _ = _get(server, "/health", timeout)
    except ConnectionRefusedError:
        return False
    if status >= 500:
        raise Transient(f"GET /health answered {status}")
    return status == 200


@dataclass
class ModelInfo:
    id: str
    max_model_len: int | None
    root: str | None = None  # the model's path as the server loaded it


def served_models(server: Server, timeout: float = 5.0) -> list[ModelInfo]:
    try:
        status, body = _get(server, "/v1/models", timeout)
    except ConnectionRefusedError as exc:
        raise Transient(f"GET /v1/models: {exc}") from exc
    if status >= 500:
        raise Transient(f"GET /v1/models answered {status}")
    if status in (401, 403):
        raise key_diagnosis(client_of(server).door, status, "/v1/models")
    if status != 200:
        raise ProbeError(f"GET /v1/models answered {status}")
    try:
        data = json.loads(body)["data"]
        return [ModelInfo(id=str(m.get("id")), max_model_len=m.get("max_model_len"), root=m.get("root")) for m in data]
    except (ValueError, KeyError, TypeError) as exc:
        raise ProbeError(f"GET /v1/models gave an unexpected body: {body[:200]!r}") from exc


def check_serving(server: Server, expected_len: int | None,
                  on_retry: Callable[[dict], None] | None = None) -> tuple[bool, str, dict]:
    """(verified, reason, evidence) for a server that answers /health.

    expected_len None: the boot log did not say which length vLLM chose (an auto-fit boot
    without its Auto-fit line), so nothing can be verified. A broken answer is asked again
    (with_retries) before it counts. A front door that refuses autotune: evidence holds
    "front_door" (kind, cause, fix).
    """
    try:
        models = with_retries(lambda: served_models(server), "/v1/models", on_retry)
    except FrontDoorRefused as exc:
        return False, str(exc), {"front_door": exc.to_dict()}
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
