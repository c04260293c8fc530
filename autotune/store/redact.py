"""Keep secrets off disk and screen: keys, tokens and passwords in the serve command and its environment.

A secret has a value (never written) and a name: the environment variable the paste-ready
files and run.json refer to it by, as `${NAME}` (vLLM's own VLLM_API_KEY for `--api-key`,
HF_TOKEN for `--hf-token`, the variable's own name for an environment secret). Found by
`find_secrets` in:

- the environment: variables named like a secret (`*_TOKEN`, `*_KEY`, `*_SECRET`, `*PASSWORD*`);
- the serve command: the value of an option named like one (`--api-key`, `--hf-token`,
  `--*-token`, `--*-secret`, `--*-password`; not `--ssl-keyfile`, a path), and credentials
  inside URLs (`https://user:PASS@host`, `?token=...`, `&sig=...`).

A tune remembers the secrets of its command (`remember`); from then on everything autotune
writes or prints passes through `scrub`, which puts `${NAME}` where a secret's value was:
run.json, server.json, the attempt logs, the progress lines, `--json`. `show` scrubs old
records with the secrets their own argv reveals. `resolve_argv` turns a recorded command
back into one that boots, taking each `${NAME}` from the environment (resume, reproduce).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence
from typing import Any

from autotune.errors import AutotuneError
from autotune.events import Emit
from autotune.store.record import RunRecord

MASK = "***"
SECRET_PATTERNS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "*_TOKEN", "*_KEY", "*_SECRET", "*PASSWORD*")
# Options whose value is a secret, and the variable that stands for it. vLLM itself reads
# VLLM_API_KEY when --api-key is not given, and huggingface_hub reads HF_TOKEN.
KNOWN_SECRET_OPTIONS = {"api-key": "VLLM_API_KEY", "hf-token": "HF_TOKEN"}
_SECRET_OPTION = re.compile(r"(?:^|-)(?:token|secret|password|passwd|api-key|access-key|secret-key)$")
_URL_PASSWORD = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^/:@\s]*):(?P<secret>[^/@\s]+)@", re.I)
_URL_PARAM = re.compile(r"[?&](?P<name>[a-z_-]*(?:token|key|secret|password|sig|signature))=(?P<secret>[^&#\s]+)",
                        re.I)
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*", re.S)
_PLACEHOLDER = re.compile(r"\$\{([A-Z_][A-Z0-9_]*)\}")
# Shorter values are replaced only where they are a whole argv word or environment value:
# replacing every "abc" in a log would wreck it and protect little.
MIN_SCRUB_IN_TEXT = 6


def is_secret(name: str) -> bool:
    upper = name.upper()
    return any(fnmatch.fnmatchcase(upper, pattern) for pattern in SECRET_PATTERNS)


def redact_env(env: dict[str, str]) -> dict[str, str]:
    """A copy with secret values replaced by ***."""
    return {k: (MASK if is_secret(k) else v) for k, v in env.items()}


def env_for_shell(env: dict[str, str]) -> dict[str, str]:
    """A copy where secrets refer to the user's own variable ($NAME) instead of a value."""
    return {k: (f"${k}" if is_secret(k) else v) for k, v in env.items()}


def placeholder(name: str) -> str:
    return "${" + name + "}"


def placeholders_in(text: str) -> list[str]:
    """The variable names of the `${NAME}` placeholders in text."""
    return _PLACEHOLDER.findall(text)


def secret_option_env(option: str) -> str | None:
    """The variable that stands for option's value (api-key -> VLLM_API_KEY), or None when
    the option is not a secret. `option` is a long name without dashes in front."""
    name = option.lstrip("-").replace("_", "-").lower()
    if name in KNOWN_SECRET_OPTIONS:
        return KNOWN_SECRET_OPTIONS[name]
    if _SECRET_OPTION.search(name) and not name.endswith(("file", "path", "dir")):
        return name.upper().replace("-", "_")
    return None


def _url_secrets(text: str, stem: str) -> dict[str, str]:
    found = {}
    for match in _URL_PASSWORD.finditer(text):
        found[match.group("secret")] = f"{stem}_PASSWORD"
    for match in _URL_PARAM.finditer(text):
        found[match.group("secret")] = f"{stem}_{match.group('name').upper().replace('-', '_')}"
    return found


def find_secrets(argv: Sequence[str], env: Mapping[str, str] | None = None) -> dict[str, str]:
    """{secret value: variable name} in a serve command and its environment (pure)."""
    found: dict[str, str] = {}
    for name, value in (env or {}).items():
        # A short value (FOO_KEY=1) would turn every "1" in a record into ${FOO_KEY}; it is
        # never written anyway (run.json records the environment's secrets as ***).
        if is_secret(name) and len(value or "") >= MIN_SCRUB_IN_TEXT and not placeholders_in(value):
            found[value] = name
    argv = list(argv)
    i = 0
    while i < len(argv):
        token = argv[i]
        option, eq, inline = token.partition("=") if token.startswith("--") else (token, "", "")
        env_name = secret_option_env(option) if option.startswith("--") else None
        if env_name:
            values = [inline] if eq else []
            if not eq:
                while i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                    values.append(argv[i + 1])  # --api-key takes one or more keys
                    i += 1
            for n, value in enumerate(values):
                if value and not placeholders_in(value):
                    found[value] = env_name if n == 0 else f"{env_name}_{n + 1}"
        elif _ASSIGNMENT.fullmatch(token) and is_secret(token.partition("=")[0]):
            # `env VLLM_API_KEY=... vllm serve`, `docker run -e HF_TOKEN=...`
            name, _, value = token.partition("=")
            if value and not placeholders_in(value):
                found[value] = name
        else:
            found.update(_url_secrets(inline if eq else token, "URL"))
        i += 1
    return found


# vLLM's "non-default args: {...}" line, the one place it prints its options' values.
_LOGGED_SECRET = re.compile(r"'(?P<name>[a-z_]*(?:api_key|token|secret|password))': "
                            r"(?P<value>\[[^\]]*\]|'[^']*')")


def learn_from_log(text: str) -> None:
    """Remember the secrets vLLM prints in its non-default args (a key autotune could not
    find in the command, such as one a wrapper script adds), so they are scrubbed too.
    (vLLM 0.32 masks --api-key there itself; older versions and other secret options do not.)"""
    if "non-default args" not in text:
        return
    for match in _LOGGED_SECRET.finditer(text):
        env_name = secret_option_env(match.group("name").replace("_", "-")) or match.group("name").upper()
        values = re.findall(r"'([^']*)'", match.group("value"))
        # vLLM 0.32 prints the key masked ('***'): a mask is not a secret
        _SEEN.add({v: (env_name if n == 0 else f"{env_name}_{n + 1}") for n, v in enumerate(values)
                   if v and set(v) != {"*"}})


class Scrubber:
    """Replaces secret values by `${NAME}` in text and in records (lists, dicts, strings)."""

    def __init__(self, secrets: Mapping[str, str] | None = None):
        self.secrets: dict[str, str] = {}
        if secrets:
            self.add(secrets)

    def add(self, secrets: Mapping[str, str]) -> None:
        self.secrets.update({v: n for v, n in secrets.items() if v})
        # Longest first: a key that contains another is replaced whole.
        self._ordered = sorted(self.secrets.items(), key=lambda item: -len(item[0]))

    def text(self, text: str) -> str:
        if not self.secrets or not isinstance(text, str):
            return text
        if text in self.secrets:
            return placeholder(self.secrets[text])
        for value, name in self._ordered:
            if len(value) >= MIN_SCRUB_IN_TEXT and value in text:
                text = text.replace(value, placeholder(name))
        return text

    def bytes(self, data: bytes) -> bytes:
        if not self.secrets:
            return data
        text = data.decode("utf-8", "surrogateescape")
        scrubbed = self.text(text)
        return data if scrubbed == text else scrubbed.encode("utf-8", "surrogateescape")

    def obj(self, value: Any) -> Any:
        if not self.secrets:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.text(k) if isinstance(k, str) else k: self.obj(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self.obj(v) for v in value)
        return value


# Everything this process has seen as a secret: once seen, never written or printed.
_SEEN = Scrubber()


def remember(argv: Sequence[str], env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Note the secrets of a serve command and its environment; return them ({value: name})."""
    found = find_secrets(argv, env)
    _SEEN.add(found)
    return found


def remember_secret(value: str | None, name: str) -> None:
    """Note one secret found elsewhere (a key in the command's --config file)."""
    if value and not placeholders_in(value):
        _SEEN.add({value: name})


def scrub(value: Any) -> Any:
    """value (text, bytes or a record) with every remembered secret replaced by `${NAME}`."""
    if isinstance(value, bytes):
        return _SEEN.bytes(value)
    return _SEEN.obj(value)


def scrub_log_line(line: bytes) -> bytes:
    """A line of vLLM's output as it may be written: secrets it reveals learned, all scrubbed."""
    if b"non-default args" in line:
        learn_from_log(line.decode("utf-8", "replace"))
    return _SEEN.bytes(line)


def scrubbing(emit: Emit) -> Emit:
    """An event callback that passes every event on scrubbed (for the progress output)."""
    def scrubbed(kind: str, **data: Any) -> None:
        emit(kind, **scrub(data))
    return scrubbed


def record_scrubber(record: RunRecord) -> Scrubber:
    """A scrubber for a record written by any autotune, from the secrets its own commands show
    (`show` uses it: records from before secrets were scrubbed are masked when read)."""
    found: dict[str, str] = {}
    commands = [record.command.argv if record.command else None, record.result.final_argv if record.result else None]
    commands += [attempt.argv for attempt in record.attempts or []]
    for argv in commands:
        if isinstance(argv, list):
            found.update(find_secrets([str(a) for a in argv]))
    return Scrubber(found)


def prepare(argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """The command a tune boots: a recorded one's `${NAME}` references resolved from env
    (MissingSecret otherwise), its secrets and env's remembered for scrubbing."""
    resolved = resolve_argv(argv, env)
    remember(resolved, env)
    return resolved


def _secret_name(name: str) -> bool:
    """A name find_secrets gives: a secret's variable, perhaps numbered (VLLM_API_KEY_2), or URL_*."""
    stem = re.sub(r"_\d+$", "", name)
    return is_secret(stem) or stem.startswith("URL_") or secret_option_env(stem.lower().replace("_", "-")) is not None


class MissingSecret(AutotuneError, ValueError):
    """A recorded command needs a secret from the environment, and it is not set."""


def resolve_argv(argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """A recorded command with each `${NAME}` a secret was replaced by taken from env.

    Only secret-looking names are resolved (a `${HOME}` the user typed stays as typed).
    Raises MissingSecret naming the variables to set.
    """
    missing = sorted({name for a in argv for name in placeholders_in(a) if _secret_name(name) and name not in env})
    if missing:
        raise MissingSecret(f"the recorded serve command takes {', '.join(missing)} from the environment "
                            "(autotune never writes a secret down): set it in the environment and run again")

    def value_of(match: re.Match) -> str:
        name = match.group(1)
        return env[name] if _secret_name(name) else match.group(0)

    return [_PLACEHOLDER.sub(value_of, a) for a in argv]
