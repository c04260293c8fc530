"""The one HTTP client for the server autotune started: health checks, /v1/models, the probe.

A production serve command changes the server's front door (on its command line or in its
`--config` YAML): `--api-key` (or VLLM_API_KEY in its environment) guards /v1/* with a Bearer key, `--ssl-keyfile/--ssl-certfile` make it
speak https, `--root-path` is the prefix a proxy strips, `--uds` puts it on a unix socket
instead of a port, `--host` picks the address it listens on. `front_door` reads all of that
from the serve command and its environment (pure); `ServerClient` talks to it with httpx.

A tune only ever talks to a server it started on this machine: a wildcard or host name in
`--host` is reached on loopback, an address that is not this machine's is refused. Without
`--ssl-ca-certs` the server's certificate is accepted on loopback only when it is the one in
its own `--ssl-certfile` (pinned: compared byte for byte), never on trust alone.

`autotune verify URL` talks to a server someone deployed, anywhere: `door_for_url` reaches it where
the URL says, checks its certificate against the system's CAs (or `--ssl-ca-certs`) AND its host
name, and takes the key from VLLM_API_KEY.

The key is kept in memory and sent as `Authorization: Bearer`; `FrontDoor.describe()` (what
run.json records) says where it came from, never what it is.
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx

from autotune.errors import AutotuneError
from autotune.vllm import servecmd

LOOPBACK = "127.0.0.1"
# vLLM reads its key from --api-key, else from this variable (vllm/entrypoints/serve/middleware/register.py).
API_KEY_ENV = "VLLM_API_KEY"
# Paths vLLM's AuthenticationMiddleware guards (0.32: /v1, /v2, /inference, /cohere; /health is open).
GUARDED_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")
_WILDCARDS = {"", "0.0.0.0", "::", "localhost", "ip6-localhost"}


class FrontDoorError(AutotuneError, ValueError):
    """The serve command asks for a front door autotune cannot use (bad --host, unreadable cert)."""


@dataclass(frozen=True)
class FrontDoor:
    """How to reach the server one serve command starts, as autotune reads it."""

    port: int | None
    scheme: str = "http"
    host: str = LOOPBACK  # where autotune connects: always this machine
    root_path: str = ""
    uds: str | None = None
    api_key: str | None = field(default=None, repr=False)
    key_source: str | None = None  # "--api-key" | "VLLM_API_KEY" | None
    ca_certs: str | None = None  # --ssl-ca-certs: verify the chain against it
    certfile: str | None = None  # --ssl-certfile: pinned when there is no CA file
    listen_host: str | None = None  # --host as given
    url: str | None = None  # autotune verify URL: a deployed server, reached where the URL says

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        netloc = "localhost" if self.uds else f"{host}:{self.port}"
        return f"{self.scheme}://{netloc}{self.root_path}"

    @property
    def where(self) -> str:
        """Where the server is, for people: its URL, or its unix socket."""
        if self.url:
            return self.url
        return f"unix:{self.uds} ({self.scheme})" if self.uds else self.base_url

    def describe(self) -> dict:
        """What run.json keeps about the front door: never the key itself."""
        out: dict = {"url": self.where, "scheme": self.scheme,
                     "api_key": f"from {self.key_source}" if self.key_source else None}
        if self.scheme == "https" and self.url:
            out["tls_verify"] = (f"against --ssl-ca-certs {self.ca_certs}" if self.ca_certs
                                 else "against the system's CAs") + ", with the host name"
        elif self.scheme == "https":
            out["tls_verify"] = (f"against --ssl-ca-certs {self.ca_certs}" if self.ca_certs
                                 else f"pinned to the server's own --ssl-certfile {self.certfile} (loopback)")
        if self.root_path:
            out["root_path"] = self.root_path
        if self.listen_host is not None and self.listen_host != self.host:
            out["listen_host"] = self.listen_host
        return out


def _option(argv: Sequence[str], flag: str) -> str | None:
    value = servecmd.flag_value(argv, flag)
    return value if value else None


def connect_host(listen_host: str | None, local_addresses: Sequence[str] = ()) -> str:
    """The address autotune connects to for a server started with `--host listen_host`.

    A wildcard, a loopback address or a host name: loopback (for ::1, ::1). A specific address
    of this machine: that address (the server listens only there). Anything else is not here.
    """
    host = (listen_host or "").strip().strip("[]")
    if host in _WILDCARDS:
        return LOOPBACK
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return LOOPBACK  # a host name: it resolves to this machine, or vLLM could not bind it
    if address.is_loopback:
        return str(address)
    if str(address) in local_addresses:
        return str(address)
    raise FrontDoorError(f"--host {listen_host} is not an address of this machine: autotune only talks to a "
                         "server it started here (use 0.0.0.0, 127.0.0.1 or one of this machine's addresses)")


def front_door(argv: Sequence[str], env: Mapping[str, str], port: int | None,
               local_addresses: Sequence[str] = ()) -> FrontDoor:
    """The front door of the server `argv` starts with environment `env` on `port` (pure; argv
    with its --config file's options already in, see front_door_of).

    The key: `--api-key` wins over VLLM_API_KEY, as in vLLM. TLS: vLLM serves https only
    when both --ssl-keyfile and --ssl-certfile are given.
    """
    key_flag = _option(argv, "--api-key")
    api_key, source = (key_flag, "--api-key") if key_flag else (env.get(API_KEY_ENV) or None, API_KEY_ENV)
    certfile = _option(argv, "--ssl-certfile")
    tls = bool(certfile and _option(argv, "--ssl-keyfile"))
    root = (_option(argv, "--root-path") or "").rstrip("/")
    if root and not root.startswith("/"):
        root = "/" + root
    listen_host = _option(argv, "--host")
    uds = _option(argv, "--uds")
    return FrontDoor(port=port, scheme="https" if tls else "http",
                     host=LOOPBACK if uds else connect_host(listen_host, local_addresses),
                     root_path=root, uds=uds, api_key=api_key, key_source=source if api_key else None,
                     ca_certs=_option(argv, "--ssl-ca-certs") if tls else None, certfile=certfile if tls else None,
                     listen_host=listen_host)


def front_door_of(argv: Sequence[str], env: Mapping[str, str], port: int | None, cwd: str | None = None) -> FrontDoor:
    """front_door for a command about to boot here: its --config file's options read (servecmd,
    the one reader; the command line wins), this machine's addresses known."""
    try:
        expanded = servecmd.expand_config(argv, cwd)
    except servecmd.ConfigFileError:
        expanded = list(argv)  # vLLM cannot read it either: the boot fails and says so
    door = front_door(expanded, env, port, local_addresses())
    if door.key_source == "--api-key" and not servecmd.flag_value(argv, "--api-key"):
        door = replace(door, key_source="api-key in the --config file")
    return door


def local_addresses() -> list[str]:
    """The IP addresses of this machine's interfaces (for a --host that names one)."""
    import psutil

    out = []
    for addrs in psutil.net_if_addrs().values():
        out += [a.address.split("%")[0] for a in addrs if a.family.name in ("AF_INET", "AF_INET6")]
    return out


def door_for_url(url: str, env: Mapping[str, str], ca_certs: str | None = None) -> FrontDoor:
    """The front door of a deployed server at `url` (http[s]://host[:port][/root]); the key from
    VLLM_API_KEY in env. Raises FrontDoorError for what is not such a URL."""
    from urllib.parse import urlsplit

    text = url.strip()
    parts = urlsplit(text if "://" in text else f"http://{text}")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FrontDoorError(f"{url!r} is not a server's URL: give http://HOST:PORT or https://HOST[:PORT][/root-path]")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise FrontDoorError(f"{url!r}: {exc}") from None
    if "://" not in text and parts.port is None:  # a bare word: a typo as often as a host on port 80
        raise FrontDoorError(f"{url!r} is not a server's URL (no scheme, no port): give http://HOST:PORT (vLLM "
                             f"serves on port 8000 unless --port says otherwise: http://{parts.hostname}:8000)")
    root = parts.path.rstrip("/")
    for suffix in ("/v1/models", "/v1", "/health"):  # a URL copied from a client's settings
        root = root.removesuffix(suffix) if root.endswith(suffix) else root
    key = env.get(API_KEY_ENV) or None
    return FrontDoor(port=port, scheme=parts.scheme, host=parts.hostname, root_path=root, api_key=key,
                     key_source=API_KEY_ENV if key else None, ca_certs=ca_certs if parts.scheme == "https" else None,
                     url=f"{parts.scheme}://{parts.netloc}{root}")


def plain(port: int) -> FrontDoor:
    """A server on 127.0.0.1:port with no key and no TLS (what a bare serve command gives)."""
    return FrontDoor(port=port)


def as_door(server: FrontDoor | int) -> FrontDoor:
    return server if isinstance(server, FrontDoor) else plain(server)


# ---------------------------------------------------------------------------
# TLS
# ---------------------------------------------------------------------------


class TlsMismatch(Exception):
    """The TLS of the connection is not what the serve command says (its message says how)."""


def _ssl_context(door: FrontDoor) -> ssl.SSLContext | bool:
    if door.scheme != "https":
        return False  # plain HTTP: no TLS, so no CA bundle to load (0.1 s a client, one client a port)
    if door.url:  # a deployed server: its chain and its host name, as any client checks them
        if not door.ca_certs:
            return True
        try:
            return ssl.create_default_context(cafile=door.ca_certs)
        except (OSError, ssl.SSLError) as exc:
            raise FrontDoorError(f"cannot read --ssl-ca-certs {door.ca_certs}: {exc}") from exc
    if door.ca_certs:
        try:
            context = ssl.create_default_context(cafile=door.ca_certs)
        except (OSError, ssl.SSLError) as exc:
            raise FrontDoorError(f"cannot read --ssl-ca-certs {door.ca_certs}: {exc}") from exc
        # The chain is checked against the CA; the name is not, since autotune connects on
        # loopback and the certificate names the server's public name.
        context.check_hostname = False
        return context
    # No CA: accept only the server's own certificate, compared after the handshake (_check_pin).
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def pinned_der(certfile: str) -> bytes:
    """The first certificate of a PEM file, in DER form (what the server presents)."""
    try:
        text = Path(certfile).read_text()
    except OSError as exc:
        raise FrontDoorError(f"cannot read --ssl-certfile {certfile}: {exc.strerror}") from exc
    begin, end = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"
    start = text.find(begin)
    stop = text.find(end, start)
    if start < 0 or stop < 0:
        raise FrontDoorError(f"--ssl-certfile {certfile} holds no PEM certificate")
    return ssl.PEM_cert_to_DER_cert(text[start:stop + len(end)])


# ---------------------------------------------------------------------------
# The client
# ---------------------------------------------------------------------------


class ServerClient:
    """httpx, set up for one front door; thread-safe (the full probe sends two requests at once)."""

    def __init__(self, door: FrontDoor | int):
        self.door = as_door(door)
        # No connection is kept between requests: a boot's server is stopped and the next one may
        # take its port, and a stale pooled connection would read as a broken answer.
        transport = httpx.HTTPTransport(uds=self.door.uds, verify=_ssl_context(self.door), retries=0,
                                        limits=httpx.Limits(max_keepalive_connections=0))
        self._pin = (pinned_der(self.door.certfile)
                     if self.door.scheme == "https" and not self.door.ca_certs and self.door.certfile else None)
        self._pinned_ok = False
        self._lock = threading.Lock()
        self._http = httpx.Client(transport=transport, base_url=self.door.base_url, trust_env=False)

    def close(self) -> None:
        self._http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _headers(self, path: str, json_body: bool) -> dict[str, str]:
        headers = {"Content-Type": "application/json"} if json_body else {}
        if self.door.api_key and path.startswith(GUARDED_PREFIXES):
            headers["Authorization"] = f"Bearer {self.door.api_key}"
        return headers

    def _check_pin(self, response: httpx.Response) -> None:
        if self._pin is None or self._pinned_ok:
            return
        stream = response.extensions.get("network_stream")
        ssl_object = stream.get_extra_info("ssl_object") if stream is not None else None
        presented = ssl_object.getpeercert(True) if ssl_object is not None else None
        if presented != self._pin:
            raise TlsMismatch(f"the certificate the server on {self.door.where} presents is not the one in its "
                              f"--ssl-certfile {self.door.certfile}: give --ssl-ca-certs to verify it against a CA")
        with self._lock:
            self._pinned_ok = True

    def request(self, method: str, path: str, timeout: float, payload: dict | None = None) -> tuple[int, bytes]:
        """(status, body). Raises httpx.HTTPError when no answer came, TlsMismatch on a wrong certificate."""
        with self._http.stream(method, path, json=payload, headers=self._headers(path, payload is not None),
                               timeout=timeout) as response:
            self._check_pin(response)
            return response.status_code, response.read()

    @contextmanager
    def stream(self, path: str, payload: dict, timeout: float) -> Iterator[httpx.Response]:
        """POST path and yield the open response. `timeout` bounds the whole request: a timer
        cuts the connection when it runs out, so the caller's read ends (as a ReadError)."""
        with self._http.stream("POST", path, json=payload, headers=self._headers(path, True),
                               timeout=timeout) as response:
            self._check_pin(response)
            timer = threading.Timer(timeout, abort, (response,))
            timer.daemon = True
            timer.start()
            try:
                yield response
            finally:
                timer.cancel()


def abort(response: httpx.Response) -> None:
    """End an open response from another thread: its socket is shut down first, since closing it
    alone does not wake a read blocked on it (that read would wait for its own timeout)."""
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already gone
    response.close()


# ---------------------------------------------------------------------------
# What a failure means
# ---------------------------------------------------------------------------


def root_cause(exc: BaseException) -> BaseException:
    """The innermost exception (httpx wraps httpcore, which wraps the OSError or SSLError)."""
    seen = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        inner = exc.__cause__ or exc.__context__
        if inner is None:
            break
        exc = inner
    return exc


def describe_error(exc: BaseException) -> str:
    """One line for a failed request: the innermost cause's type and message."""
    cause = root_cause(exc)
    if isinstance(exc, httpx.TimeoutException) or isinstance(cause, TimeoutError):
        return f"timed out ({type(cause).__name__})"
    text = str(cause).strip() or str(exc).strip()
    return f"{type(cause).__name__}: {text}" if text else type(cause).__name__


def refused(exc: BaseException) -> bool:
    """Nothing listens (yet): connection refused, or a unix socket that does not exist yet."""
    return isinstance(exc, httpx.ConnectError) and isinstance(root_cause(exc), (ConnectionRefusedError,
                                                                               FileNotFoundError))


def tls_failure(exc: BaseException) -> bool:
    return isinstance(exc, TlsMismatch) or isinstance(root_cause(exc), ssl.SSLError)


def speaks_tls(door: FrontDoor, timeout: float = 3.0) -> bool:
    """Does the server on door's port answer a TLS handshake? (For a server autotune reached
    over http that closed every connection: it may speak https under a config autotune did not read.)"""
    import socket

    if door.uds or door.port is None:
        return False
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((door.host, door.port), timeout=timeout) as sock, context.wrap_socket(sock):
            return True
    except (OSError, ssl.SSLError):
        return False
