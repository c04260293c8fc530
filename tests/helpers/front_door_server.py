"""A local stand-in for vLLM's front door, in a thread: an optional Bearer key on /v1/*, optional TLS.

Real vLLM shows the same in tests/e2e/test_front_door_real_vllm.py; this one lets the fast
suite check the client's every branch in milliseconds. It answers /health (never guarded,
as in vLLM), /v1/models, /tokenize (4 characters a token) and streamed /v1/completions.
"""
from __future__ import annotations

import json
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GUARDED = ("/v1", "/v2", "/inference", "/cohere")  # vLLM 0.32's AuthenticationMiddleware


class FrontDoorServer:
    def __init__(self, api_key: str | None = None, certfile=None, keyfile=None, max_model_len: int = 4096,
                 root_path: str = ""):
        self.api_key = api_key
        self.seen_auth: list[str | None] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _path(self):
                path = self.path.split("?")[0]
                return path[len(root_path):] if root_path and path.startswith(root_path) else path

            def _guard(self, path) -> bool:
                auth = self.headers.get("Authorization")
                outer.seen_auth.append(auth)
                if outer.api_key and path.startswith(GUARDED) and auth != f"Bearer {outer.api_key}":
                    self._send(401, {"error": "Unauthorized"})
                    return False
                return True

            def _send(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # noqa: N802
                path = self._path()
                if not self._guard(path):
                    return
                if path == "/health":
                    self._send(200, {})
                elif path == "/v1/models":
                    self._send(200, {"data": [{"id": "front-door-model", "max_model_len": max_model_len}]})
                else:
                    self._send(404, {})

            def do_POST(self):  # noqa: N802
                path = self._path()
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if not self._guard(path):
                    return
                if path == "/tokenize":
                    self._send(200, {"count": len(body["prompt"]) // 4 + 1})
                    return
                if path != "/v1/completions":
                    self._send(404, {})
                    return
                tokens = len(body["prompt"]) // 4 + 1
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                for i in range(body.get("max_tokens", 1)):
                    chunk = {"choices": [{"text": "x", "finish_reason": "length" if i == body["max_tokens"] - 1 else None}]}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                usage = {"choices": [], "usage": {"prompt_tokens": tokens, "completion_tokens": body["max_tokens"]}}
                self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
                self.close_connection = True

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if certfile:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(str(certfile), str(keyfile))
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
