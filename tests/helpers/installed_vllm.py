"""The installed vLLM, asked in one process.

Tests that check a reading of ours against vLLM's own (its serve parser, its engine arguments, its
size type, its model-length derivation) run a script that imports vLLM and prints JSON. A fresh
interpreter spends ~7 s of CPU importing vLLM's parser each time; here one Python, started on first
use, imports it once and runs each script in a fresh namespace, its stdin the given text and its
printed output returned. The modules that use it run on one pytest-xdist worker (tests/conftest.py,
pytest_xdist_make_scheduler), so the import happens once per `make test-fast`.

The scripts are the same text `python -c SCRIPT` would run: `python -c` one of them to see it alone.
"""
from __future__ import annotations

import atexit
import json
import subprocess
import sys
import tempfile

# Replies travel on a copy of the original stdout; fd 1 then goes to stderr, so whatever vLLM logs to
# stdout (its default handler) cannot interleave with them. A script's print() is captured per run.
SERVER = r"""
import contextlib, io, json, os, sys, traceback, warnings
replies = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
warnings.simplefilter("ignore")
import vllm.engine.arg_utils, vllm.utils.argparse_utils  # the slow part, once
try:
    import vllm.entrypoints.launchers.cli_args
except ImportError:  # older layouts
    import vllm.entrypoints.openai.cli_args
stdin = sys.stdin
for line in stdin:
    request = json.loads(line)
    printed = io.StringIO()
    sys.stdin = io.StringIO(request["stdin"])
    reply = {}
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(request["script"], "<script>", "exec"), {"__name__": "__main__"})
    except BaseException:
        reply["error"] = traceback.format_exc()
    finally:
        sys.stdin = stdin
    reply["stdout"] = printed.getvalue()
    replies.write(json.dumps(reply) + "\n")
    replies.flush()
"""

_server: subprocess.Popen | None = None
_stderr = None


def _started() -> subprocess.Popen:
    global _server, _stderr
    if _server is None or _server.poll() is not None:
        _stderr = tempfile.TemporaryFile(mode="w+")
        _server = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=_stderr, text=True)
        atexit.register(_server.kill)
    return _server


def run(script: str, stdin: str = "") -> str:
    """What `python -c script` prints with `stdin` as its input, run by the installed vLLM's Python.
    A script that raises fails the test with its traceback."""
    server = _started()
    server.stdin.write(json.dumps({"script": script, "stdin": stdin}) + "\n")
    server.stdin.flush()
    line = server.stdout.readline()
    if not line:
        _stderr.seek(0)
        raise AssertionError(f"the installed vLLM's Python exited {server.wait()}:\n{_stderr.read()[-3000:]}")
    reply = json.loads(line)
    assert "error" not in reply, reply["error"][-3000:]
    return reply["stdout"]


def run_json(script: str, payload) -> object:
    """The JSON a script prints last, given `payload` as JSON on its stdin."""
    return json.loads(run(script, json.dumps(payload)).strip().splitlines()[-1])
