"""server/client.py and server/health.py's front-door diagnosis, against a local front door with a key and TLS
(tests/helpers/front_door_server.py); real vLLM: tests/e2e/test_front_door_real_vllm.py."""
from __future__ import annotations

import os

import pytest

from autotune.server import client, health, probe
from autotune.testing.selfsigned import make_self_signed
from tests.helpers.front_door_server import FrontDoorServer

KEY = "sk-test-0123456789"


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    return make_self_signed(tmp_path_factory.mktemp("tls"))


def door_of(argv, env=None, port=None):
    return client.front_door(["vllm", "serve", "m", *argv], env or {}, port)


# ---- reading the serve command (pure) ------------------------------------------------------

def test_a_bare_command_is_plain_http_on_loopback():
    door = door_of([], port=8000)
    assert (door.scheme, door.host, door.api_key, door.base_url) == ("http", "127.0.0.1", None, "http://127.0.0.1:8000")
    assert door.describe() == {"url": "http://127.0.0.1:8000", "scheme": "http", "api_key": None}


def test_the_key_comes_from_the_command_before_the_environment_and_is_never_described():
    door = door_of(["--api-key", KEY], {"VLLM_API_KEY": "other-key-123"}, 8000)
    assert door.api_key == KEY and door.key_source == "--api-key"
    door = door_of([], {"VLLM_API_KEY": "env-key-12345"}, 8000)
    assert door.api_key == "env-key-12345" and door.key_source == "VLLM_API_KEY"
    assert "env-key-12345" not in repr(door) and "env-key-12345" not in str(door.describe())


def test_tls_needs_both_files_and_root_path_and_host_are_read():
    assert door_of(["--ssl-certfile", "c.pem"], port=1).scheme == "http"  # vLLM: both or plain http
    door = door_of(["--ssl-keyfile", "k.pem", "--ssl-certfile", "c.pem", "--root-path", "api/",
                    "--host", "0.0.0.0"], port=8443)
    assert door.base_url == "https://127.0.0.1:8443/api"
    assert "pinned to the server's own --ssl-certfile c.pem" in door.describe()["tls_verify"]


@pytest.mark.parametrize("host, connects", [(None, "127.0.0.1"), ("0.0.0.0", "127.0.0.1"), ("::", "127.0.0.1"),
                                            ("localhost", "127.0.0.1"), ("::1", "::1"), ("127.0.0.2", "127.0.0.2"),
                                            ("my-host.example", "127.0.0.1"), ("10.1.2.3", "10.1.2.3")])
def test_a_host_that_is_not_loopback_is_reached_on_this_machine(host, connects):
    assert client.connect_host(host, local_addresses=["10.1.2.3"]) == connects


def test_an_address_of_another_machine_is_refused():
    with pytest.raises(client.FrontDoorError, match="not an address of this machine"):
        client.connect_host("192.0.2.7", local_addresses=["10.1.2.3"])


def test_a_unix_socket_replaces_host_and_port():
    door = door_of(["--uds", "/tmp/v.sock", "--port", "9"], port=9)
    assert door.uds == "/tmp/v.sock" and door.where == "unix:/tmp/v.sock (http)"


# ---- talking to it ---------------------------------------------------------------------------

def test_the_key_is_sent_as_bearer_on_v1_only_and_verifies():
    with FrontDoorServer(api_key=KEY, max_model_len=4096) as server:
        door = door_of(["--api-key", KEY], port=server.port)
        assert health.health(door) is True
        ok, reason, evidence = health.check_serving(door, 4096)
        assert ok, reason
        assert server.seen_auth == [None, f"Bearer {KEY}"]  # /health is never guarded in vLLM


@pytest.mark.parametrize("argv, env, says", [
    ([], {}, "the server wants an API key and autotune found none"),
    (["--api-key", "sk-wrong-key-999"], {}, "refused the API key autotune sent (taken from --api-key"),
])
def test_a_401_is_the_front_door_never_the_length(argv, env, says):
    with FrontDoorServer(api_key=KEY) as server:
        ok, reason, evidence = health.check_serving(door_of(argv, env, server.port), 4096)
    assert not ok and says in reason and "does not serve" not in reason
    assert evidence["front_door"]["kind"] == "api_key"
    assert "--api-key` in the serve command and its --config file, then VLLM_API_KEY" in reason
    assert "sk-wrong-key-999" not in reason and KEY not in reason + evidence["front_door"]["fix"]


def test_https_with_the_servers_own_certificate_pinned(cert):
    keyfile, certfile = cert
    with FrontDoorServer(certfile=certfile, keyfile=keyfile) as server:
        door = door_of(["--ssl-keyfile", str(keyfile), "--ssl-certfile", str(certfile)], port=server.port)
        assert health.health(door) is True
        assert health.check_serving(door, 4096)[0]
        # against a CA file (the self-signed certificate is its own CA)
        door = door_of(["--ssl-keyfile", str(keyfile), "--ssl-certfile", str(certfile),
                        "--ssl-ca-certs", str(certfile)], port=server.port)
        assert health.check_serving(door, 4096)[0]


def test_a_certificate_that_is_not_the_pinned_one_is_a_tls_diagnosis(cert, tmp_path):
    keyfile, certfile = cert
    _, other = make_self_signed(tmp_path, "other")
    with FrontDoorServer(certfile=certfile, keyfile=keyfile) as server:
        door = door_of(["--ssl-keyfile", str(keyfile), "--ssl-certfile", str(other)], port=server.port)
        with pytest.raises(health.FrontDoorRefused, match="is not the one in its --ssl-certfile") as caught:
            health.health(door)
    assert caught.value.kind == "tls"


def test_http_to_an_https_server_says_it_speaks_https(cert):
    keyfile, certfile = cert
    with FrontDoorServer(certfile=certfile, keyfile=keyfile) as server:
        with pytest.raises(health.FrontDoorRefused, match="speaks https, but the serve command autotune read has no"):
            health.health(server.port)
        assert health.health_ok(server.port) is False  # before the server says it listens: a plain no


def test_https_to_an_http_server_is_a_tls_diagnosis(cert):
    keyfile, certfile = cert
    with FrontDoorServer() as server:
        door = door_of(["--ssl-keyfile", str(keyfile), "--ssl-certfile", str(certfile)], port=server.port)
        with pytest.raises(health.FrontDoorRefused, match="TLS handshake"):
            health.health(door)


def test_the_probe_goes_through_the_same_front_door(cert):
    keyfile, certfile = cert
    with FrontDoorServer(api_key=KEY, certfile=certfile, keyfile=keyfile, max_model_len=2048, root_path="/api") as server:
        door = door_of(["--api-key", KEY, "--ssl-keyfile", str(keyfile), "--ssl-certfile", str(certfile),
                        "--root-path", "/api"], port=server.port)
        rec = probe.probe(door, 2048, "full", server_pid=os.getpid(), request_timeout_s=10, small_timeout_s=5)
    assert rec["ok"], rec["reason"]
    assert rec["model"] == "front-door-model" and 2048 - 4 - rec["margin_tokens"] <= rec["prompt_tokens"] <= 2044
    assert KEY not in str(rec)


def test_the_front_door_may_be_set_in_the_config_file(tmp_path):
    (tmp_path / "serve.yaml").write_text("api-key: sk-in-config-123\nssl_keyfile: k.pem\nssl-certfile: c.pem\n"
                                         "root-path: /api\n")
    argv = ["vllm", "serve", "m", "--config", "serve.yaml"]
    door = client.front_door_of(argv, {}, 8000, cwd=str(tmp_path))
    assert (door.api_key, door.key_source, door.base_url) == ("sk-in-config-123", "api-key in the --config file",
                                                             "https://127.0.0.1:8000/api")
    # the command line wins over the file, as in vLLM
    door = client.front_door_of([*argv, "--api-key", "sk-cli"], {}, 8000, cwd=str(tmp_path))
    assert (door.api_key, door.key_source) == ("sk-cli", "--api-key")


def test_a_unix_socket_front_door(short_tmp):
    """--uds: vLLM listens on a unix socket instead of host:port (0.32 has it)."""
    import socketserver

    from tests.helpers.front_door_server import FrontDoorServer

    path = str(short_tmp / "vllm.sock")
    tcp = FrontDoorServer(api_key=KEY)  # its handler, served on the socket below
    tcp.httpd.server_close()

    class UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        daemon_threads = True

        def get_request(self):
            request, _ = super().get_request()
            return request, ("local", 0)

    door = door_of(["--uds", path, "--api-key", KEY], port=8000)
    assert health.health_ok(door) is False  # no socket yet: not up, not an error
    server = UnixHTTPServer(path, tcp.httpd.RequestHandlerClass)
    thread = __import__("threading").Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert health.health(door) is True
        assert health.check_serving(door, 4096)[0]
    finally:
        server.shutdown()
        server.server_close()
