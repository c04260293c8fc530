"""A replaying vLLM: `python -m autotune.testing.fake_vllm --profile NAME <vllm serve flags>`.

It behaves as one vLLM version on one machine (profiles.py) for tests, and for trying autotune
without a GPU: it prints that version's real boot lines (fake_lines.py) with the figures of
its memory model, refuses a length that does not fit in that version's words, fits
`--max-model-len auto` where the version can, serves /health, /v1/models, /version, /tokenize,
streaming /v1/completions and /metrics (the KV pool and queue in the version's labels,
fake_metrics.py) when ready, and takes the version's time to shut down on SIGINT.
It fails as the version fails when asked for what fails there: `--kv-cache-dtype fp8` below
compute capability 8.9, GPU UUIDs in CUDA_VISIBLE_DEVICES up to 0.21, more --max-num-seqs
than a hybrid model has Mamba cache blocks, a length above the model's own maximum; and a
sliding-window model's server (0.19+) queues a request over its KV pool forever, as vLLM's
scheduler does (vllm#39734): /metrics shows it waiting, nothing running.

It is NOT vLLM: the real CPU-backend boots (tests/e2e) stay the proof that autotune works.

Its own options: --profile NAME (or `list`), --time-scale F (real seconds x F; default 0.01,
so a 90 s boot takes about a second; 0 is instant), --print-version (what package metadata
would say) and --print-gpus (the profile's GPUs as NVML would list them, JSON): it stands for
another machine, so autotune asks it these (vllm/versions.py, host/machine.py).
"""

from __future__ import annotations

import json
import math
import os
import select
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Sequence

from autotune.testing import fake_lines, fake_metrics, profiles
from autotune.testing.profiles import GIB, Profile, Settings
from autotune.vllm import servecmd, versions

DEFAULT_TIME_SCALE = 0.01
FAKE_OPTIONS = ("profile", "time-scale", "print-version", "print-gpus")


class UsageError(Exception):
    """A command line this program (like vLLM's argparse) refuses: exit status 2."""


@dataclass
class Request:
    """What the serve flags ask for."""

    profile: Profile
    model: str
    max_model_len: int | str | None  # int, "auto" or None (the model's own maximum)
    settings: Settings
    port: int
    time_scale: float
    args_shown: dict  # vLLM's non-default args, as it prints them
    env_visible: str | None
    # FAKE_VLLM_BUSY_GIB: memory this GPU does not give vLLM (another process holds it, or the device
    # lost it): the KV pool is that much smaller, as on a sick node of a fleet (compare's node check).
    busy_gib: float = 0.0


def _number(options: dict, name: str, kind, default):
    value = options.get(name)
    if value is None:
        return default
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise UsageError(f"argument --{name}: invalid {kind.__name__} value: {value!r}") from None


BUSY_ENV = "FAKE_VLLM_BUSY_GIB"


def read_request(argv: Sequence[str], env: dict) -> Request:
    try:
        # vLLM reads --config FILE.yaml under its flags (they override the file); argv here is the options only.
        argv = servecmd.expand_config(["python", "-m", versions.FAKE_VLLM_MODULE, *argv])[3:]
    except servecmd.ConfigFileError as exc:
        raise UsageError(str(exc)) from None
    cmd = servecmd.parse_vllm_command(argv, strict=False)
    options = dict(cmd.options)
    name = options.get("profile")
    if not isinstance(name, str):
        raise UsageError("--profile NAME is required (`--profile list` names them)")
    try:
        profile = profiles.by_name(name)
    except KeyError as exc:
        raise UsageError(str(exc.args[0])) from None
    raw_len = options.get("max-model-len")
    max_len: int | str | None = None
    if isinstance(raw_len, str):
        if raw_len.lower() in ("auto", "-1"):
            if not versions.profile(profile.version).max_model_len_auto:
                raise UsageError(f"argument --max-model-len: invalid human_readable_int value: {raw_len!r}")
            max_len = "auto"
        else:
            try:
                max_len = servecmd.parse_length(raw_len)
            except ValueError as exc:
                raise UsageError(f"argument --max-model-len: {exc}") from None
    default_gmu = versions.default_gmu(profile.version)
    kv_bytes = options.get("kv-cache-memory-bytes")
    settings = Settings(
        gmu=_number(options, "gpu-memory-utilization", float, default_gmu),
        max_num_seqs=_number(options, "max-num-seqs", int, 256),
        max_num_batched_tokens=_number(options, "max-num-batched-tokens", int, None),
        kv_cache_dtype=str(options.get("kv-cache-dtype") or "auto"),
        kv_cache_memory_bytes=_kv_bytes(kv_bytes) if kv_bytes is not None else None,
        tp=_number(options, "tensor-parallel-size", int, 1),
        reserve_full_isl=bool(versions.admits_whole_prompts_only(argv, profile.version)))
    shown = {k.replace("-", "_"): _shown(v) for k, v in options.items() if k not in ("print-version", "print-gpus")}
    if max_len == "auto":
        shown["max_model_len"] = -1
    model = cmd.model or profile.model
    shown = {"model_tag": model, "model": model, **shown} if cmd.model else shown
    return Request(profile, model, max_len, settings, _number(options, "port", int, 8000),
                   _number(options, "time-scale", float, DEFAULT_TIME_SCALE), shown,
                   env.get("CUDA_VISIBLE_DEVICES"), _number(env, BUSY_ENV, float, 0.0))


def _kv_bytes(text) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "k": 10**3, "m": 10**6, "g": 10**9}
    text = str(text)
    return int(float(text[:-1]) * units[text[-1]]) if text[-1:] in units else int(text)


def _shown(value):
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return value
        return int(number) if number.is_integer() and "." not in value else number
    return value


def _gib(family: dict, value_bytes: float) -> str:
    """A GiB figure as this version prints it: %.2f, or format_gib (round to 2: "16.0") from 0.14."""
    value = value_bytes / GIB
    return f"{value:.2f}" if family["gib"] == "%.2f" else f"{round(value, 2)}"


class Boot:
    """One boot: prints the lines and decides the outcome (served length, or an exit status)."""

    def __init__(self, req: Request, out=None):
        self.req = req
        self.p = req.profile
        self.family = fake_lines.FAMILIES[self.p.family]
        self.out = out or sys.stdout
        self.pids = {"api": os.getpid(), "core": os.getpid() + 1, "w": os.getpid() + 2}
        self.figures: dict = {"version": self.p.version, "model": req.model, "port": req.port, "rank": 0,
                              "logo_file": self.family["logo_file"], **self.pids}

    def sleep(self, real_s: float) -> None:
        time.sleep(max(0.0, real_s * self.req.time_scale))

    def say(self, key: str, **more) -> None:
        api, core, worker = self.family["prefixes"]
        figures = {**self.figures, **more}
        figures.update(ts=time.strftime("%m-%d %H:%M:%S"), A=api.format(**figures), C=core.format(**figures),
                       W=worker.format(**figures))
        for template in self.family[key]:
            print(template.format(**figures), file=self.out, flush=True)

    def per_rank(self, key: str) -> None:
        for rank in range(self.req.settings.tp):
            self.say(key, rank=rank, w=self.pids["w"] + rank)

    def fail(self, key: str, status: int = 1, **more) -> int:
        self.say(key, **more)
        if key not in ("uuid", "above_derived"):
            self.say("engine_failed")
            self.say("failed_tail")
        return status

    def run(self) -> int | tuple[int, int]:
        """(served length, KV tokens) when ready; otherwise the exit status."""
        p, s, req = self.p, self.req.settings, self.req
        vk = versions.profile(p.version)
        args = (f"Namespace(model_tag={req.model!r}, " + ", ".join(f"{k}={v!r}" for k, v in req.args_shown.items())
                + ")") if self.p.family == "v0" else repr(req.args_shown)
        length = p.derived_max_len if req.max_model_len in (None, "auto") else req.max_model_len
        self.figures.update(args=args, L=length, L_c=f"{length:,}", derived=p.derived_max_len)
        self.say("banner")
        visible = [v for v in (req.env_visible or "").split(",") if v.strip()]
        if any(v.strip().upper().startswith(("GPU-", "MIG-")) for v in visible) and not vk.gpu_uuids_work:
            return self.fail("uuid", uuid=next(v for v in visible if v.strip().upper().startswith(("GPU-", "MIG-"))))
        if length > p.derived_max_len:
            return self.fail("above_derived")
        self.say("max_len")
        self.sleep(p.boot_s * 0.1)
        self.say("engine")
        self.say("backend")
        self.sleep(p.boot_s * 0.4)
        self.figures.update(weights=f"{round(p.weights_gib / s.tp, 2)}", weights4=f"{p.weights_gib / s.tp:.4f}",
                            load_s=f"{p.boot_s * 0.3:.6f}", cg=f"{p.cudagraph_gib:.2f}", capture_s=f"{p.boot_s * 0.1:.0f}")
        self.per_rank("weights")
        if s.kv_cache_dtype.startswith("fp8") and not p.fp8_kv_supported:
            return self.fail("fp8", rank=0)
        self.sleep(p.boot_s * 0.4)
        return self._kv(length)

    def _kv(self, length: int) -> int | tuple[int, int]:
        p, s, req = self.p, self.req.settings, self.req
        available = profiles.available_kv_bytes(p, s)
        if s.kv_cache_memory_bytes is None:
            available -= int(req.busy_gib * profiles.GIB)
        eq = s.gmu - p.cudagraph_gib / p.gpu_memory_gib
        self.figures.update(avail=_gib(self.family, max(available, 0)), gmu4=f"{s.gmu:.4f}", gmu2=f"{s.gmu:.2f}",
                            gmu_eq=f"{eq:.4f}", gmu_up=f"{s.gmu + (s.gmu - eq):.4f}")
        self.per_rank("cg")
        if self.p.family == "v0":
            self._v0_figures(available, length)
        self.per_rank("available")
        self.per_rank("cg_enabled")
        if available <= 0:
            return self.fail("no_memory")
        if req.max_model_len == "auto":
            fitted = profiles.estimate(p, s, available, p.derived_max_len)
            if fitted <= 0:
                return self.fail("no_memory")
            self.figures.update(fit=fitted)
            self.say("autofit_full" if fitted >= p.derived_max_len else "autofit_reduced")
            length = fitted
        need = profiles.needed_bytes(p, s, length)
        if need > available:
            est = profiles.estimate(p, s, available, length)
            self.figures.update(need=_gib(self.family, need), est=est,
                                estimate_msg=self.family["estimate_msg"].format(est=est) if est > 0 else "")
            self.say("refusal")
            self.say("failed_tail")
            return 1
        tokens = profiles.kv_cache_tokens(p, s, available)
        # vLLM's concurrency is the pool over one request's need, which the window keeps small (0.9.1+).
        conc = available / profiles.needed_bytes(p, s, length) if p.sliding_window else tokens / length
        self.figures.update(L=length, L_c=f"{length:,}", tokens_c=f"{tokens:,}", conc=f"{conc:.2f}")
        self.say("kv")
        blocks = profiles.mamba_blocks(p, s, available)
        if blocks is not None and blocks < s.max_num_seqs:
            return self.fail("mamba", seqs=s.max_num_seqs, blocks=blocks)
        self.sleep(p.boot_s * 0.1)
        self.per_rank("capture")
        served = length if (req.max_model_len != "auto" or self.family["serves_fitted_length"]) else p.derived_max_len
        return served, tokens

    def _v0_figures(self, available: int, length: int) -> None:
        p, s = self.p, self.req.settings
        tokens = profiles.kv_cache_tokens(p, s, available)
        weights = p.weights_gib / s.tp
        self.figures.update(total=f"{p.gpu_memory_gib:.2f}", initial=f"{weights + 0.35:.2f}",
                            peak=f"{p.gpu_memory_gib * s.gmu - p.fixed_gib - available / GIB:.2f}",
                            post=f"{weights + 0.36:.2f}", non_torch=f"{p.fixed_gib:.2f}",
                            blocks_kv=tokens // p.block_size, tokens=tokens, conc=f"{tokens / length:.2f}")


# ---- the server, once ready ------------------------------------------------------------------

def count_tokens(text: str) -> int:
    """The fake tokenizer: about four characters a token, plus BOS (linear, as probe.py expects)."""
    return 1 + math.ceil(len(text) / 4)


def _json_body(handler: BaseHTTPRequestHandler) -> dict:
    """A request's JSON object body ({} when it is none)."""
    length = int(handler.headers.get("Content-Length") or 0)
    try:
        data = json.loads(handler.rfile.read(length) or b"{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def too_long(served_len: int, tokens: int, max_tokens: int) -> dict:
    """vLLM's answer to a request over max-model-len (HTTP 400)."""
    return {"object": "error", "type": "BadRequestError", "code": 400, "message": (
        f"This model's maximum context length is {served_len} tokens. However, you requested "
        f"{tokens + max_tokens} tokens ({tokens} in the messages, {max_tokens} in the completion). "
        "Please reduce the length of the messages or completion.")}


def wait_in_the_queue(handler: BaseHTTPRequestHandler, stream: bool) -> None:
    """vLLM's scheduler never admits this request (its prompt is over the KV pool): a stream's
    headers go out, then nothing, until the client gives up (vllm#39734)."""
    if stream:
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Connection", "close")
        handler.end_headers()
        handler.wfile.flush()
    handler.close_connection = True
    while True:
        readable, _, _ = select.select([handler.connection], [], [], 0.2)
        if readable and not handler.connection.recv(1, socket.MSG_PEEK):
            return  # the client closed the connection: vLLM aborts the request


def make_handler(boot: Boot, served_len: int, kv_tokens: int):
    model = boot.req.model
    queue = fake_metrics.Queue(boot.req.settings.max_num_seqs)
    prefix = boot.family["prefixes"][0].format(**boot.figures)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # uvicorn's access line (cpu-0.32.0 logs)
            print(f'{prefix}INFO:     {self.client_address[0]}:{self.client_address[1]} - "{self.requestline}" '
                  f'{args[1] if len(args) > 1 else ""} OK', flush=True)

        def _send(self, status: int, body: bytes = b"", content_type: str | None = None) -> None:
            self.send_response(status)
            if content_type:
                self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, payload: dict) -> None:
            self._send(status, json.dumps(payload).encode(), "application/json")

        def do_GET(self):
            if self.path == "/health":
                self._send(200)
            elif self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{
                    "id": model, "object": "model", "created": int(time.time()), "owned_by": "vllm",
                    "root": model, "parent": None, "max_model_len": served_len}]})
            elif self.path == "/version":
                self._json(200, {"version": boot.p.version})
            elif self.path == "/metrics":
                self._send(200, fake_metrics.exposition(boot.p, boot.req.settings, model, served_len, kv_tokens,
                                                        queue).encode(), "text/plain; version=0.0.4; charset=utf-8")
            else:
                self._json(404, {"detail": "Not Found"})

        def do_POST(self):
            data = _json_body(self)
            prompt = str(data.get("prompt", ""))
            if self.path == "/tokenize":
                count = count_tokens(prompt)
                self._json(200, {"count": count, "max_model_len": served_len, "tokens": list(range(count))})
            elif self.path == "/v1/completions":
                with queue:
                    self._complete(prompt, int(data.get("max_tokens") or 16), bool(data.get("stream")))
            else:
                self._json(404, {"detail": "Not Found"})

        def _complete(self, prompt: str, max_tokens: int, stream: bool) -> None:
            tokens = count_tokens(prompt)
            if tokens + max_tokens > served_len:
                self._json(400, too_long(served_len, tokens, max_tokens))
                return
            if not profiles.admits(boot.p, boot.req.settings, kv_tokens, tokens):
                with queue.never_admitted():
                    wait_in_the_queue(self, stream)
                return
            boot.sleep(tokens / boot.p.prefill_tokens_per_s)  # the prefill
            usage = {"prompt_tokens": tokens, "completion_tokens": max_tokens, "total_tokens": tokens + max_tokens}
            if not stream:
                self._json(200, {"id": "cmpl-fake", "object": "text_completion", "model": model, "usage": usage,
                                 "choices": [{"index": 0, "text": " ok" * max_tokens, "finish_reason": "length"}]})
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            for i in range(max_tokens):
                chunk = {"id": "cmpl-fake", "object": "text_completion", "model": model, "choices": [
                    {"index": 0, "text": " ok", "finish_reason": "length" if i == max_tokens - 1 else None}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())
            self.wfile.flush()
            self.close_connection = True

    return Handler


def serve(boot: Boot, served_len: int, kv_tokens: int) -> int:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    server = ThreadingHTTPServer(("0.0.0.0", boot.req.port), make_handler(boot, served_len, kv_tokens))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    boot.say("listening")
    boot.say("ready")
    stop.wait()
    boot.say("shutdown")
    boot.sleep(boot.p.shutdown_s)
    server.shutdown()
    return 0


def list_profiles() -> str:
    lines = []
    for p in profiles.PROFILES.values():
        lines.append(f"{p.name}\n  vLLM {p.version} on {p.gpu_count}x {p.gpu_name} ({p.gpu_memory_gib} GiB, "
                     f"cc {p.compute_capability}), {p.model}: {p.summary}\n  lines from: {'; '.join(p.sources)}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, env: dict | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ if env is None else env)
    if not argv or argv[0] in ("-h", "--help") or servecmd.has_flag(argv, "--help"):
        print(__doc__.strip() + "\n\nExample:\n  autotune --target 65536 -- python -m autotune.testing.fake_vllm "
              "--profile seed-3090-qwen3.6-27b --gpu-memory-utilization 0.98 --max-num-seqs 1 "
              "--max-num-batched-tokens 512 --enable-chunked-prefill\n\nProfiles:\n" + list_profiles())
        return 0
    if servecmd.flag_value(argv, "--profile") == "list":
        print(list_profiles())
        return 0
    try:
        req = read_request(argv, env)
    except UsageError as exc:
        print(f"usage: python -m autotune.testing.fake_vllm --profile NAME [vllm serve flags]\n"
              f"fake_vllm: error: {exc}", file=sys.stderr)
        return 2
    if servecmd.has_flag(argv, versions.FAKE_VERSION_FLAG):
        print(req.profile.version)
        return 0
    if servecmd.has_flag(argv, versions.FAKE_GPUS_FLAG):
        print(json.dumps(req.profile.nvml_inventory()))
        return 0
    boot = Boot(req)
    outcome = boot.run()
    if isinstance(outcome, int):
        boot.sleep(min(boot.p.shutdown_s, 3.0))  # the teardown after a failure (log-formats.md 10)
        return outcome
    return serve(boot, *outcome)


if __name__ == "__main__":
    sys.exit(main())
