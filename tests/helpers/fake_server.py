"""The replaying vLLM's HTTP side in a thread of the test (no subprocess): one boot of a profile,
then /health, /v1/models, /version, /tokenize, /v1/completions and /metrics on a free port."""
from __future__ import annotations

import os
import threading
from http.server import ThreadingHTTPServer

from autotune.host import processes
from autotune.testing import fake_vllm


class FakeServer:
    def __init__(self, *argv: str):
        req = fake_vllm.read_request(["--time-scale", "0", *argv], {})
        self._out = open(os.devnull, "w")
        self.boot = fake_vllm.ReplayedBoot(req, out=self._out)
        self.served, self.kv_tokens = self.boot.run()
        self.port = processes.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        handler = type("QuietHandler", (fake_vllm.make_handler(self.boot, self.served, self.kv_tokens),),
                       {"log_message": lambda *args: None})  # no access lines on the test's stdout
        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._out.close()

