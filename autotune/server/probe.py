"""Prove a booted server really serves its context: near-ceiling requests, timed, with memory read.

A boot that passes /health is not yet proof: servers have booted at a fitted length and
then run out of memory on the first long request (vLLM #21410, #57475), and prefill can
fall off a cliff at lengths no boot check touches. So after the ceiling boots:

- quick: ONE request whose prompt fills the context to within `margin_tokens` of
  max_model_len minus the output tokens, a few output tokens, streamed so the first
  chunk times the prefill (TTFT). The prompt is sized with the server's own /tokenize,
  never by guessing characters per token (see `size_prompt`).
- full: quick, then a second near-ceiling request (is it repeatable?) and, while that one
  is in prefill, a short request whose time to first token is the head-of-line wait a
  user would see behind a long prompt.

Memory is read before the first request and after the last (and sampled while they run):
on a GPU the NVML used memory of the pinned GPUs, on the CPU backend the resident memory
(RSS) summed over the server's whole process tree. vLLM preallocates the KV pool, so a
near-ceiling request should not grow it: growth above a small threshold is flagged.

Every call is bounded in time and goes through client.py to the server autotune started,
through the front door its serve command sets up (key, TLS, root path, unix socket). `probe`
never raises for what the server does (HTTP errors, a dropped connection, a timeout): it
returns ok False and the reason.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from autotune.server import client as client_mod
from autotune.server import health
from autotune.server.probe_memory import MemoryReader, PeakSampler, memory_record
from autotune.server.prompt import ProbeFailure, SizedPrompt, default_margin, filler_text, prompt_budget, size_prompt
from autotune.server.queue_watch import STUCK_AFTER_S, WHY, QueueWatch

QUICK = "quick"
FULL = "full"
MODES = (QUICK, FULL)

MAX_TOKENS = 4  # output tokens per request: enough to see decoding start, cheap everywhere
REQUEST_TIMEOUT_S = 600.0  # one long request: prefill of the whole context on a slow CPU
SMALL_TIMEOUT_S = 30.0  # /v1/models, /tokenize
BODY_EXCERPT = 300

# ---------------------------------------------------------------------------
# HTTP (loopback only, every call bounded)
# ---------------------------------------------------------------------------


def _excerpt(body: bytes | str) -> str:
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    text = " ".join(text.split())
    return text if len(text) <= BODY_EXCERPT else text[:BODY_EXCERPT] + "..."


def _describe(exc: BaseException) -> str:
    cause = client_mod.root_cause(exc)
    if isinstance(exc, httpx.TimeoutException) or isinstance(cause, TimeoutError):
        return "timed out"
    if client_mod.refused(exc):
        return "connection refused (is the server running?)"
    if isinstance(cause, (ConnectionResetError, BrokenPipeError)) or isinstance(exc, httpx.RemoteProtocolError):
        return f"the server dropped the connection ({type(cause).__name__})"
    return client_mod.describe_error(exc)


_HTTP_ERRORS = (httpx.HTTPError, OSError, client_mod.TlsMismatch)


def _post_json(server: health.Server, path: str, payload: dict, timeout: float) -> dict:
    what = f"POST {path}"
    try:
        status, body = health.client_of(server).request("POST", path, timeout, payload)
    except _HTTP_ERRORS as exc:
        raise ProbeFailure(f"{what}: {_describe(exc)}") from exc
    if status != 200:
        raise ProbeFailure(f"{what}: HTTP {status}: {_excerpt(body)}")
    try:
        return json.loads(body)
    except ValueError as exc:
        raise ProbeFailure(f"{what}: not JSON: {_excerpt(body)}") from exc


def _model_id(server: health.Server, timeout: float) -> str:
    try:
        models = health.served_models(server, timeout=timeout)
    except (OSError, health.ProbeError) as exc:
        raise ProbeFailure(f"GET /v1/models: {_describe(exc) if isinstance(exc, OSError) else exc}") from exc
    if not models:
        raise ProbeFailure("GET /v1/models lists no model")
    return models[0].id


def tokenizer_of(server: health.Server, model: str, timeout: float = SMALL_TIMEOUT_S) -> Callable[[str], int]:
    def count(text: str) -> int:
        data = _post_json(server, "/tokenize", {"model": model, "prompt": text}, timeout)
        try:
            return int(data["count"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ProbeFailure(f"POST /tokenize: no count in {_excerpt(json.dumps(data))}") from exc
    return count


@dataclass
class StreamResult:
    ok: bool
    reason: str
    sent_at: float  # monotonic
    first_token_at: float | None = None
    done_at: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    status: int | None = None
    queued: dict | None = None  # it waited in vLLM's queue with nothing running, and was ended (queue_watch.py)

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.sent_at

    @property
    def total_s(self) -> float | None:
        return None if self.done_at is None else self.done_at - self.sent_at


def stream_completion(server: health.Server, payload: dict, timeout: float,
                      watch: QueueWatch | None = None) -> StreamResult:
    """POST /v1/completions with stream=true; time the first chunk and the end. Never raises.

    `timeout` bounds the whole request (client.ServerClient.stream closes it when it runs out);
    `watch` ends it sooner when vLLM keeps it waiting with nothing running (queue_watch.py).
    """
    sent = time.monotonic()
    result = StreamResult(ok=False, reason="", sent_at=sent)
    try:
        _stream(server, payload, timeout, watch, result)
    finally:
        if watch is not None:
            watch.attach(None)  # the connection may go back to the pool: never cut it now
        if watch is not None and watch.verdict is not None:
            result.ok, result.queued = False, watch.verdict
            result.reason = (f"POST /v1/completions: waited in vLLM's queue for {watch.verdict['stuck_s']:g} s with "
                             f"{watch.verdict['waiting']:g} waiting and nothing running ({watch.verdict['source']}), "
                             "so autotune ended it")
    return result


def _stream(server: health.Server, payload: dict, timeout: float, watch: QueueWatch | None,
            result: StreamResult) -> StreamResult:
    sent = result.sent_at
    deadline = sent + timeout
    body = {**payload, "stream": True, "stream_options": {"include_usage": True}}
    try:
        with health.client_of(server).stream("/v1/completions", body, timeout) as resp:
            if watch is not None:
                watch.attach(resp)
            result.status = resp.status_code
            if resp.status_code != 200:
                result.reason = f"POST /v1/completions: HTTP {resp.status_code}: {_excerpt(resp.read()[:4096])}"
                return result
            for line in resp.iter_lines():
                line = line.strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    result.done_at = time.monotonic()
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    result.reason = f"POST /v1/completions: error in stream: {_excerpt(json.dumps(chunk['error']))}"
                    return result
                if chunk.get("choices"):
                    if result.first_token_at is None:
                        result.first_token_at = time.monotonic()
                    finish = chunk["choices"][0].get("finish_reason")
                    result.finish_reason = finish or result.finish_reason
                usage = chunk.get("usage")
                if usage:
                    result.prompt_tokens = usage.get("prompt_tokens")
                    result.completion_tokens = usage.get("completion_tokens")
        if result.done_at is None:
            result.reason = "POST /v1/completions: the stream ended without [DONE]"
            if time.monotonic() >= deadline:
                result.reason = _cut_short("timed out", result, sent)
            return result
        if result.first_token_at is None:
            result.reason = "POST /v1/completions: no token came back"
            return result
        result.ok = True
        result.reason = "ok"
        return result
    except (*_HTTP_ERRORS, ValueError) as exc:
        # The deadline's timer closes the stream: that reads as an error, but it is the timeout.
        what = "timed out" if time.monotonic() >= deadline else _describe(exc)
        result.reason = _cut_short(what, result, sent)
        return result


def _cut_short(what: str, result: StreamResult, sent: float) -> str:
    stage = "before the first token" if result.first_token_at is None else "while decoding"
    return f"POST /v1/completions: {what} {stage} after {time.monotonic() - sent:.1f} s"


# ---------------------------------------------------------------------------
# The probe
# ---------------------------------------------------------------------------


def _request_record(role: str, res: StreamResult, prompt: SizedPrompt | None, t0: float) -> dict:
    rec = {
        "role": role,
        "ok": res.ok,
        "reason": res.reason,
        "prompt_tokens": res.prompt_tokens if res.prompt_tokens is not None else (prompt.tokens if prompt else None),
        "completion_tokens": res.completion_tokens,
        "sent_at_s": round(res.sent_at - t0, 3),
        "ttft_s": _r(res.ttft_s),
        "total_s": _r(res.total_s),
        "finish_reason": res.finish_reason,
    }
    if prompt is not None:
        rec["tokenized_prompt_tokens"] = prompt.tokens
        rec["tokenize_calls"] = prompt.tokenize_calls
    if prompt is not None and res.ok and res.ttft_s and rec["prompt_tokens"]:
        rec["prefill_tokens_per_s"] = round(rec["prompt_tokens"] / res.ttft_s, 1)
    if res.status is not None and res.status != 200:
        rec["http_status"] = res.status
    return rec


def _r(value: float | None, nd: int = 3) -> float | None:
    return None if value is None else round(value, nd)


def _completion_payload(model: str, prompt: str, max_tokens: int, ignore_eos: bool) -> dict:
    payload = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    if ignore_eos:
        payload["ignore_eos"] = True  # vLLM's extra parameter: always decode max_tokens
    return payload


class _Session:
    """One probe's state: the model, the tokenizer, whether ignore_eos is accepted."""

    def __init__(self, server: health.Server, timeout: float, queue_stuck_s: float):
        self.server = server
        self.timeout = timeout
        self.queue_stuck_s = queue_stuck_s
        self.ignore_eos = True

    def _send(self, payload: dict) -> StreamResult:
        with QueueWatch(self.server, self.queue_stuck_s) as watch:  # never waits quietly in vLLM's queue
            return stream_completion(self.server, payload, self.timeout, watch)

    def complete(self, model: str, prompt: str, max_tokens: int) -> StreamResult:
        res = self._send(_completion_payload(model, prompt, max_tokens, self.ignore_eos))
        if not res.ok and res.status == 400 and self.ignore_eos and "ignore_eos" in res.reason:
            # A server without vLLM's extra parameters: the same request without it.
            self.ignore_eos = False
            res = self._send(_completion_payload(model, prompt, max_tokens, False))
        return res


def probe(server: health.Server, max_model_len: int, mode: str, server_pid: int | None, gpu_indices: list[int] | None = None,
          margin_tokens: int | None = None, *, max_tokens: int = MAX_TOKENS,
          request_timeout_s: float = REQUEST_TIMEOUT_S, small_timeout_s: float = SMALL_TIMEOUT_S,
          queue_stuck_s: float = STUCK_AFTER_S, emit: Callable[..., None] | None = None) -> dict:
    """Probe the server (a client.FrontDoor, or a plain loopback port) at max_model_len; return the record (never raises for
    what the server does). mode: "quick" or "full" (see the module docstring).

    emit, if given, is called as emit("probe_request", role=..., prompt_tokens=...) before each
    request and emit("probe_request_done", role=..., ok=..., ttft_s=..., reason=...) after it,
    so a long prefill shows progress.
    """
    if mode not in MODES:
        raise ValueError(f"probe mode must be one of {MODES}, not {mode!r}")
    if max_model_len <= max_tokens:
        raise ValueError(f"max_model_len {max_model_len} leaves no room for a prompt and {max_tokens} output tokens")
    margin = default_margin(max_model_len) if margin_tokens is None else margin_tokens
    budget = prompt_budget(max_model_len, max_tokens)
    t0 = time.monotonic()
    record: dict = {
        "mode": mode,
        "ok": False,
        "reason": "",
        "max_model_len": max_model_len,
        "max_tokens": max_tokens,
        "prompt_budget_tokens": budget,
        "margin_tokens": margin,
        "model": None,
        "prompt_tokens": None,
        "completion_tokens": None,
        "ttft_s": None,
        "total_s": None,
        "prefill_tokens_per_s": None,
        "requests": [],
    }
    reader = MemoryReader(server_pid, gpu_indices)
    before = reader.read_bytes()
    peak, memory = None, {}
    try:
        with PeakSampler(reader) as sampler:
            try:
                _run_requests(record, _Session(server, request_timeout_s, queue_stuck_s), budget, margin, max_tokens,
                              mode, small_timeout_s, t0, emit or (lambda event, **data: None))
            finally:
                peak = sampler.peak
    finally:
        after = reader.read_bytes()
        record["memory"] = memory = memory_record(reader, before, after, peak)
        reader.close()
    record["growth_gib"] = memory["growth_gib"]
    record["growth_flagged"] = memory["growth_flagged"]
    record["duration_s"] = round(time.monotonic() - t0, 2)
    return record


def _long_and_short(session: _Session, model: str, second: SizedPrompt, short_prompt: str, short_delay: float,
                    max_tokens: int, request_timeout_s: float, emit: Callable[..., None]):
    """The second near-ceiling request, and a short one sent short_delay seconds into it (in its
    prefill); (long result, short result)."""
    results: dict[str, StreamResult] = {}

    def run_long():
        results["long"] = session.complete(model, second.text, max_tokens)

    thread = threading.Thread(target=run_long, name="probe-long-2", daemon=True)
    emit("probe_request", role="long_repeat", prompt_tokens=second.tokens)
    thread.start()
    time.sleep(short_delay)
    emit("probe_request", role="short_during_prefill", prompt_tokens=None)
    short = session.complete(model, short_prompt, max_tokens)
    emit("probe_request_done", role="short_during_prefill", ok=short.ok, ttft_s=_r(short.ttft_s), reason=short.reason)
    thread.join(timeout=request_timeout_s + 5)
    long2 = results.get("long") or StreamResult(False, "the second long request did not finish", time.monotonic())
    return long2, short


# Each request's first token is noted by its own reader (a thread for the long one): on a loaded
# machine the long one's can be noted a little after the short one's, which the server sends right
# after it. A short request served beside the prefill answers long before the long one's first token.
HOL_READER_SLACK_S = 0.5  # at most; never more than a tenth of the long request's time to first token


def _head_of_line(long2: StreamResult, short: StreamResult) -> dict:
    """How long the short request waited behind the long one's prefill."""
    slack = min(HOL_READER_SLACK_S, 0.1 * long2.ttft_s) if long2.ttft_s is not None else 0.0
    return {
        "short_sent_after_long_s": round(short.sent_at - long2.sent_at, 3),
        "sent_during_long_prefill": long2.first_token_at is None or short.sent_at < long2.first_token_at,
        "short_wait_s": _r(short.ttft_s),  # time to first token of the short request
        "long_ttft_s": _r(long2.ttft_s),
        # With max-num-seqs 1 (or no chunked prefill) the short request's first token comes
        # only after the long one's: it waited for the whole prefill.
        "waited_for_long_prefill": (short.first_token_at is not None and long2.first_token_at is not None
                                    and short.first_token_at >= long2.first_token_at - slack),
    }


def _run_requests(probe_record: dict, session: _Session, budget: int, margin: int, max_tokens: int, mode: str,
                  small_timeout_s: float, t0: float, emit: Callable[..., None]) -> None:
    """Send the probe's requests, filling in probe_record (the probe's own record, attempt.probe
    in run.json: not a run record) as they answer."""
    server = session.server
    # A salt unique to this probe starts every prompt: vLLM's prefix cache would otherwise
    # answer a repeated prompt (an earlier probe's, or the first long one) without prefill.
    nonce = uuid.uuid4().hex[:8]
    try:
        model = _model_id(server, small_timeout_s)
        probe_record["model"] = model
        count = tokenizer_of(server, model, small_timeout_s)
        first = size_prompt(budget, margin, count, salt=f"autotune probe {nonce} 1")
    except ProbeFailure as exc:
        probe_record["reason"] = str(exc)
        return
    probe_record["prompt_within_margin"] = first.within_margin

    emit("probe_request", role="long", prompt_tokens=first.tokens)
    res = session.complete(model, first.text, max_tokens)
    emit("probe_request_done", role="long", ok=res.ok, ttft_s=_r(res.ttft_s), reason=res.reason)
    long1 = _request_record("long", res, first, t0)
    probe_record["requests"].append(long1)
    for key in ("prompt_tokens", "completion_tokens", "ttft_s", "total_s", "prefill_tokens_per_s"):
        probe_record[key] = long1.get(key)
    if res.queued is not None:
        probe_record["queued"] = res.queued
        probe_record["reason"] = (f"the near-ceiling request ({first.tokens:,} prompt tokens) never ran: it "
                                  f"{res.reason.removeprefix('POST /v1/completions: ')}. {WHY}")
        return
    if not res.ok:
        probe_record["reason"] = f"the near-ceiling request ({first.tokens} prompt tokens) failed: {res.reason}"
        return
    if mode == QUICK:
        probe_record["ok"] = True
        probe_record["reason"] = (f"{long1['prompt_tokens']} prompt tokens + {long1['completion_tokens']} output "
                                  f"tokens served at max_model_len {probe_record['max_model_len']}")
        return

    # full: a second near-ceiling request (with another salt, so the prefix cache cannot
    # answer it), and a short request sent while that one is in prefill.
    try:
        second = size_prompt(budget, margin, count, salt=f"autotune probe {nonce} 2", first_chars=len(first.text))
    except ProbeFailure as exc:
        probe_record["reason"] = str(exc)
        return
    # Send the short one well inside the long one's prefill (the first request timed it).
    short_prompt = filler_text(64, salt=f"autotune probe {nonce} short")
    long2_res, short_res = _long_and_short(session, model, second, short_prompt, min(1.0, (res.ttft_s or 1.0) / 4),
                                           max_tokens, session.timeout, emit)
    long2 = _request_record("long_repeat", long2_res, second, t0)
    emit("probe_request_done", role="long_repeat", ok=long2_res.ok, ttft_s=long2["ttft_s"], reason=long2_res.reason)
    short = _request_record("short_during_prefill", short_res, None, t0)
    probe_record["requests"] += [long2, short]
    probe_record["head_of_line"] = _head_of_line(long2_res, short_res)
    if long2["ok"] and res.ttft_s and long2_res.ttft_s:
        probe_record["repeat_ttft_ratio"] = round(long2_res.ttft_s / res.ttft_s, 2)
    probe_record["repeatable"] = bool(long2["ok"])
    if not long2["ok"]:
        probe_record["reason"] = (f"the second near-ceiling request ({second.tokens} prompt tokens) failed: "
                                  f"{long2['reason']}")
        return
    if not short["ok"]:
        probe_record["reason"] = f"the short request sent during prefill failed: {short['reason']}"
        return
    probe_record["ok"] = True
    probe_record["reason"] = (f"two near-ceiling requests ({long1['prompt_tokens']} and {long2['prompt_tokens']} "
                              f"prompt tokens) and a short one during prefill served at max_model_len "
                              f"{probe_record['max_model_len']}")
