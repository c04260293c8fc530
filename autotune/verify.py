"""Talk to the server autotune started, over HTTP on loopback only.

A boot counts as up when GET /health answers 200 and GET /v1/models reports the
max_model_len that was asked for (vLLM >= 0.20 reports the fitted length there, older
ones the requested one; a mismatch means the server is not serving what we think).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass

LOOPBACK = "127.0.0.1"


class ProbeError(Exception):
    pass


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
        status, _ = _request(base_url(port) + "/health", timeout)
    except (OSError, ProbeError, ValueError):
        return False
    return status == 200


@dataclass
class ModelInfo:
    id: str
    max_model_len: int | None


def served_models(port: int, timeout: float = 5.0) -> list[ModelInfo]:
    status, body = _request(base_url(port) + "/v1/models", timeout)
    if status != 200:
        raise ProbeError(f"GET /v1/models answered {status}")
    try:
        data = json.loads(body)["data"]
        return [ModelInfo(id=str(m.get("id")), max_model_len=m.get("max_model_len")) for m in data]
    except (ValueError, KeyError, TypeError) as exc:
        raise ProbeError(f"GET /v1/models gave an unexpected body: {body[:200]!r}") from exc


def check_serving(port: int, expected_len: int | None) -> tuple[bool, str, dict]:
    """(verified, reason, evidence) for a server that answers /health.

    expected_len None: the boot log did not say which length vLLM chose (an auto-fit boot
    without its Auto-fit line), so nothing can be verified.
    """
    try:
        models = served_models(port)
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
