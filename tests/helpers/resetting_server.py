"""An HTTP server whose first answers break: it resets the connection of the first N requests.

A real vLLM can't be made to reset its /health endpoint on demand, so this small script
stands in for that one fault. After the N resets it answers like a vLLM that is up:
/health 200 and /v1/models with the --max-model-len it was given.

    python resetting_server.py --port P --max-model-len L [--resets N] [--status 503]
                               [--api-key K | --api-key-file F]

--status answers the first N requests with that HTTP status instead of a reset.
"""
import argparse
import json
import socket
import struct
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

args_parser = argparse.ArgumentParser()
args_parser.add_argument("--port", type=int, required=True)
args_parser.add_argument("--max-model-len", type=int, required=True)
args_parser.add_argument("--resets", type=int, default=2)
args_parser.add_argument("--status", type=int, default=None)
args_parser.add_argument("--model", default="resetting-model")
# A key on /v1/* as vLLM's middleware wants it: given (--api-key) or read from a file autotune cannot see.
args_parser.add_argument("--api-key", default=None)
args_parser.add_argument("--api-key-file", default=None)
# https as vLLM serves it (both files), or under other names autotune does not read (a wrapper's TLS).
args_parser.add_argument("--ssl-keyfile", default=None)
args_parser.add_argument("--ssl-certfile", default=None)
args_parser.add_argument("--hidden-tls", nargs=2, metavar=("KEYFILE", "CERTFILE"), default=None)
args, _ = args_parser.parse_known_args()

broken = {"left": args.resets}
KEY = args.api_key or (Path(args.api_key_file).read_text().strip() if args.api_key_file else None)


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's naming)
        if broken["left"] > 0:
            broken["left"] -= 1
            print(f"breaking request {self.path} ({broken['left']} more to break)", flush=True)
            if args.status:
                self.send_response(args.status)
                self.end_headers()
                return
            # SO_LINGER 0: close() sends RST, as a server whose HTTP stack is restarting does.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            self.close_connection = True
            return
        if KEY and self.path.startswith("/v1") and self.headers.get("Authorization") != f"Bearer {KEY}":
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path == "/health":
            body = b""
        elif self.path == "/v1/models":
            body = json.dumps({"object": "list", "data": [
                {"id": args.model, "object": "model", "max_model_len": args.max_model_len}]}).encode()
        else:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt, *a):
        print("request: " + fmt % a, flush=True)


server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
tls = (args.ssl_keyfile, args.ssl_certfile) if args.ssl_keyfile and args.ssl_certfile else args.hidden_tls
if tls:
    import ssl

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls[1], tls[0])
    server.socket = context.wrap_socket(server.socket, server_side=True)
# The line vLLM 0.32 prints once it listens (entry.py), with its usual prefix.
print(f"(APIServer pid=1) INFO 11-30 12:00:00 [entry.py:140] Starting vLLM server on http://127.0.0.1:{args.port}",
      flush=True)
sys.stdout.flush()
server.serve_forever()
