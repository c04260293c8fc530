"""Keep secrets off disk and screen: environment values of tokens, keys and passwords."""

from __future__ import annotations

import fnmatch

MASK = "***"
SECRET_PATTERNS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "*_TOKEN", "*_KEY", "*_SECRET", "*PASSWORD*")


def is_secret(name: str) -> bool:
    upper = name.upper()
    return any(fnmatch.fnmatchcase(upper, pattern) for pattern in SECRET_PATTERNS)


def redact_env(env: dict[str, str]) -> dict[str, str]:
    """A copy with secret values replaced by ***."""
    return {k: (MASK if is_secret(k) else v) for k, v in env.items()}


def env_for_shell(env: dict[str, str]) -> dict[str, str]:
    """A copy where secrets refer to the user's own variable ($NAME) instead of a value."""
    return {k: (f"${k}" if is_secret(k) else v) for k, v in env.items()}
