"""The taken-port recovery decided from a real vLLM (CPU) boot's own log."""

from __future__ import annotations

import os
import socket
import time

import pytest

from autotune.run import launch
from autotune.run.recovery import RecoveryOptions, recovery_for
from autotune.vllm.logparse import BootLogParser
from tests.conftest import vllm_serve_argv


# --- the port recovery against a real vLLM ------------------------------------------------------


@pytest.mark.vllm
def test_real_vllm_on_a_taken_port_is_recovered_with_a_new_port(tiny_model, tmp_path):
    """A real vLLM CPU boot on a port a socket already listens on: vLLM exits with
    `Address already in use`; the parsed log leads to a new-port recovery."""
    parser = BootLogParser()
    with socket.socket() as holder:
        holder.bind(("", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        argv = vllm_serve_argv(tiny_model, "--kv-cache-memory-bytes", "128M", "--port", str(port),
                               "--max-model-len", "4096")
        server = launch.ServerProcess(argv, {**os.environ, "PYTHONUNBUFFERED": "1"}, tmp_path / "attempt-1.log")
        try:
            deadline = time.monotonic() + 240
            while not (server.poll() is not None and server.output_closed) and time.monotonic() < deadline:
                for raw in server.lines(timeout=0.5):
                    parser.feed(raw)
            assert server.poll() is not None, "vLLM did not exit although its port was taken"
        finally:
            server.stop(launch.STAGES_FAST)
    result = parser.result()
    record = {"error_kind": result.get("error_kind"), "facts": result}
    assert result["outcome"] == "error" and record["error_kind"] == "address_in_use"
    rec = recovery_for(record, argv, RecoveryOptions())
    assert rec.new_port and rec.reason.startswith(f"port {port} is already in use")
    # The retry port is free (what the tune loop will pick with launch.free_port()).
    new = launch.free_port()
    assert new != port
