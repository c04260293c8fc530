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
so a 90 s boot takes about a second; 0 is instant; FAKE_VLLM_TIME_SCALE in the environment
overrides it), --print-version (what package metadata
would say) and --print-gpus (the profile's GPUs as NVML would list them, JSON): it stands for
another machine, so autotune asks it these (vllm/versions.py, host/machine.py); --write-model-files
(the profile's model's config.json and header-only safetensors into the hub cache HF_HUB_CACHE or
HF_HOME names, as a first boot's download leaves them: testing/model_files.py).
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
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from autotune.testing import fake_boot_v034, fake_lines, fake_metrics, profiles
from autotune.testing.fake_args import USAGE, Request, UsageError, read_request
from autotune.testing.profiles import GIB, PROFILES
from autotune.vllm import servecmd, versions


def _gib(family: dict, value_bytes: float) -> str:
    """A GiB figure as this version prints it: %.2f, or format_gib (round to 2: "16.0") from 0.14."""
    value = value_bytes / GIB
    return f"{value:.2f}" if family["gib"] == "%.2f" else f"{round(value, 2)}"


class ReplayedBoot:
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
            self.write(template.format(**figures))

    def write(self, line: str) -> None:
        """One line of output; when whoever read it is gone (a closed pipe), serve on without it, as
        vLLM's server outlives the terminal it was started from."""
        try:
            print(line, file=self.out, flush=True)
        except (BrokenPipeError, ValueError):
            self.out = sys.stdout = sys.stderr = open(os.devnull, "w")

    def per_rank(self, key: str) -> None:
        for rank in range(self.req.settings.tp):
            self.say(key, rank=rank, w=self.pids["w"] + rank)

    def fail(self, key: str, status: int = 1, **more) -> int:
        self.say(key, **more)
        if key not in ("uuid", "above_derived", "port_busy", "batched_below_len", "batched_below_seqs"):
            self.say("engine_failed")
            self.say("failed_tail")
        return status

    def run(self, bind: Callable[[], object] = lambda: None) -> int | tuple[int, int]:
        """(served length, KV tokens) when ready; otherwise the exit status. `bind` takes the port
        right after the arguments are printed, as vLLM's setup_server does (OSError: it is taken)."""
        p, s, req = self.p, self.req.settings, self.req
        vk = versions.profile(p.version)
        args = (f"Namespace(model_tag={req.model!r}, " + ", ".join(f"{k}={v!r}" for k, v in req.args_shown.items())
                + ")") if self.p.family == "v0" else repr(req.args_shown)
        length = p.derived_max_len if req.max_model_len in (None, "auto") else req.max_model_len
        self.figures.update(args=args, L=length, L_c=f"{length:,}", derived=p.derived_max_len)
        self.say("banner")
        try:
            bind()
        except OSError:
            return self.fail("port_busy")
        visible = [v for v in (req.env_visible or "").split(",") if v.strip()]
        if any(v.strip().upper().startswith(("GPU-", "MIG-")) for v in visible) and not vk.gpu_uuids_work:
            return self.fail("uuid", uuid=next(v for v in visible if v.strip().upper().startswith(("GPU-", "MIG-"))))
        if length > p.derived_max_len:
            return self.fail("above_derived")
        self.say("max_len")
        seqs = profiles.max_num_seqs(p, s)
        self.figures.update(batched=profiles.batched_tokens(p, s), seqs=seqs, asked=length)
        if profiles.batched_tokens(p, s) < seqs:
            return self.fail("batched_below_seqs")
        batched = profiles.batched_limit(p, s, req.options)
        if batched is not None and length > batched:
            return self.fail("batched_below_len")
        draft = profiles.draft_limit(p, req.options)
        if draft is not None and length > draft:
            self.say("draft_limit", draft=draft)
            length = draft
            self.figures.update(L=length, L_c=f"{length:,}")
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
        if self.family.get("extensible"):  # 0.34+: the extensible KV cache, or 0.34's words without it
            return fake_boot_v034.kv(self, length)
        # The pool is measured at this boot's length (`auto`: the model's full length, never re-profiled).
        available = profiles.available_kv_bytes(p, s, length)
        if s.kv_cache_memory_bytes is None:
            available -= int(req.busy_gib * profiles.GIB)
        room = profiles.check_bytes(p, s, available)  # what lengths are checked against (0.29+: less a block)
        eq = s.gmu - p.cudagraph_gib / p.gpu_memory_gib
        self.figures.update(avail=_gib(self.family, available), room=_gib(self.family, max(room, 0)),
                            gmu4=f"{s.gmu:.4f}", gmu2=f"{s.gmu:.2f}", gmu_eq=f"{eq:.4f}",
                            gmu_up=f"{s.gmu + (s.gmu - eq):.4f}", node=_gib(self.family, p.gpu_memory_gib * GIB),
                            requested=_gib(self.family, p.gpu_memory_gib * s.gmu * GIB),
                            non_kv=_gib(self.family, profiles.non_kv_gib(p, s, length) * GIB))
        self.per_rank("cg")
        if self.p.family == "v0":
            self._v0_figures(available, length)
        explicit = s.kv_cache_memory_bytes is not None and "available_explicit" in self.family
        self.per_rank("available_explicit" if explicit else "available")
        self.per_rank("cg_enabled")
        if room <= 0:  # vLLM's check, on what it checks against
            return self.fail("no_memory")
        if req.max_model_len == "auto":
            fitted = profiles.estimate(p, s, room, length)  # the model's maximum, or a draft's below it
            if fitted <= 0:
                return self.fail("no_memory")
            self.figures.update(fit=fitted, fit_from=length)
            self.say("autofit_full" if fitted >= length else "autofit_reduced")
            length = fitted
        need = profiles.needed_bytes(p, s, length)
        if need > room:
            est = profiles.estimate(p, s, room, length)
            self.figures.update(need=_gib(self.family, need), est=est,
                                estimate_msg=self.family["estimate_msg"].format(est=est) if est > 0 else "")
            self.say("refusal")
            self.say("failed_tail")
            return 1
        tokens = profiles.kv_cache_tokens(p, s, available)
        # vLLM's concurrency is the pool over one request's need, which the window keeps small (0.9.1+);
        # a full-attention request takes whole blocks (get_max_concurrency_for_kv_cache_config: blocks over
        # cdiv(length, block_size)), so off the block grid it is not tokens / length.
        conc = (available / profiles.needed_bytes(p, s, length) if p.sliding_window
                else (tokens // p.block_size) / math.ceil(length / p.block_size))
        self.figures.update(L=length, L_c=f"{length:,}", tokens_c=f"{tokens:,}", conc=f"{conc:.2f}",
                            concurrency=conc)  # /metrics serves the same figure unrounded
        self.say("kv")
        blocks = profiles.mamba_blocks(p, s, available)
        if blocks is not None and blocks < profiles.max_num_seqs(p, s):
            return self.fail("mamba", seqs=profiles.max_num_seqs(p, s), blocks=blocks)
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


def served_model_name(req: Request) -> str:
    """What clients ask for: the first --served-model-name where one is given (vLLM's
    OpenAIServingModels), else the model."""
    named = req.options.get("served-model-name")
    return (named[0] if isinstance(named, list) else named) or req.model


def make_handler(boot: ReplayedBoot, served_len: int, kv_tokens: int):
    model = served_model_name(boot.req)
    queue = fake_metrics.Queue(profiles.max_num_seqs(boot.p, boot.req.settings))
    prefix = boot.family["prefixes"][0].format(**boot.figures)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # uvicorn's access line (cpu-0.32.0 logs)
            boot.write(f'{prefix}INFO:     {self.client_address[0]}:{self.client_address[1]} - "{self.requestline}" '
                       f'{args[1] if len(args) > 1 else ""} OK')

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
                                                        queue, boot.figures.get("concurrency")).encode(),
                           "text/plain; version=0.0.4; charset=utf-8")
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


class HTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        """A client that hung up mid-answer (a probe's timeout, a tune stopped) is no error: uvicorn
        prints nothing for it either. socketserver's default prints a traceback to sys.stderr, which
        for the replay run in a thread (testing/inprocess.py) is whatever this process runs next:
        one test's JSON output once ended in another test's BrokenPipeError."""
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)


def bind(port: int, host: str | None = None) -> HTTPServer:
    """The HTTP server on its port, bound but not yet accepting (vLLM binds before it boots); on
    --host, else every interface, as vLLM (uvicorn with no host) does."""
    server = HTTPServer((host or "0.0.0.0", port), BaseHTTPRequestHandler, bind_and_activate=False)
    try:
        server.server_bind()
    except OSError:
        server.server_close()
        raise
    return server


def serve(boot: ReplayedBoot, server: HTTPServer, served_len: int, kv_tokens: int, stop: threading.Event) -> int:
    """Answer requests until `stop` is set, then shut down as the version does."""
    server.RequestHandlerClass = make_handler(boot, served_len, kv_tokens)
    server.server_activate()
    # A short poll: shutdown() waits for the loop to see it (0.5 s by default).
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    boot.say("listening")
    boot.say("ready")
    stop.wait()
    boot.say("shutdown")
    boot.sleep(boot.p.shutdown_s)
    server.shutdown()
    return 0


def run(req: Request, stop: threading.Event, out=None) -> int:
    """The program once its options are read: boot, then serve until `stop`; the exit status."""
    boot = ReplayedBoot(req, out)
    taken: list[HTTPServer] = []
    try:
        flags = req.options  # the serve flags it was started with, by long name
        host = flags.get("host")
        outcome = boot.run(bind=lambda: taken.append(bind(req.port, host if isinstance(host, str) else None)))
        if isinstance(outcome, int):
            boot.sleep(min(boot.p.shutdown_s, 3.0))  # the teardown after a failure (log-formats.md 10)
            return outcome
        return serve(boot, taken[0], *outcome, stop)
    finally:
        for server in taken:
            server.server_close()


def list_profiles() -> str:
    lines = []
    for p in profiles.PROFILES.values():
        lines.append(f"{p.name}\n  vLLM {p.version} on {p.gpu_count}x {p.gpu_name} ({p.gpu_memory_gib} GiB, "
                     f"cc {p.compute_capability}), {p.model}: {p.summary}\n  lines from: {'; '.join(p.sources)}")
    return "\n".join(lines)


def write_model_files(argv: list[str], env: dict) -> int:
    """--write-model-files: the profile's model's files into the hub cache, as a first boot's download
    leaves them (testing/model_files.py), so that autotune reads them as on a real machine."""
    from autotune.model.files import hub_cache
    from autotune.testing import model_files

    profile = PROFILES.get(servecmd.flag_value(argv, "--profile") or "")
    if profile is None:
        print(f"{USAGE}\nfake_vllm: error: --write-model-files needs --profile NAME", file=sys.stderr)
        return 2
    try:
        folder = model_files.write(profile.model, hub_cache(env))
    except (model_files.HubCacheInUse, OSError) as exc:
        print(f"fake_vllm: error: {exc}", file=sys.stderr)
        return 1
    if folder is None:
        print(f"fake_vllm: the replay carries no files of {profile.model} (its figures are fitted to real logs)",
              file=sys.stderr)
        return 1
    print(folder)
    return 0


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
    if servecmd.has_flag(argv, "--write-model-files"):
        return write_model_files(argv, env)
    asked = [f for f in (versions.FAKE_VERSION_FLAG, versions.FAKE_GPUS_FLAG) if servecmd.has_flag(argv, f)]
    try:
        profile = read_request(argv, env).profile if asked else None
    except UsageError:  # package metadata and NVML answer whatever the serve flags are: the profile is enough
        profile = PROFILES.get(servecmd.flag_value(argv, "--profile") or "")
    if asked and profile is not None:
        print(profile.version if asked[0] == versions.FAKE_VERSION_FLAG else json.dumps(profile.nvml_inventory()))
        return 0
    try:
        req = read_request(argv, env)
    except UsageError as exc:
        print(f"{USAGE}\nfake_vllm: error: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return run(req, stop)

if __name__ == "__main__":
    sys.exit(main())
