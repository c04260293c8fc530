"""The real boot logs of tests/fixtures/logs and what the parser reads from them, for the tests that
dress those logs as messy pastes (test_logparse_messy, _broken_messages, _carried)."""
from __future__ import annotations

from pathlib import Path

from autotune.vllm.log import parse_lines

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "logs"
ALL_LOGS = sorted(FIXTURES.glob("*.log"))
TEXT_LOGS = [p for p in ALL_LOGS if "json-logging" not in p.name]


def log_lines(path: Path) -> list[str]:
    lines = path.read_bytes().decode("utf-8", "replace").replace("\r", "").split("\n")  # lines end at \n only
    return lines[:-1] if lines and lines[-1] == "" else lines


def boot_facts(result: dict) -> dict:
    """What a log says about its boot: outcome, failure, every figure and word (not the echoed
    arguments, the model they name and the stated exception text, which quote user input)."""
    return {k: v for k, v in result.items()
            if k not in ("non_default_args", "args_namespace", "model", "exception")
            and not isinstance(v, (dict, list))}


def boot_facts_of(lines: list[str]) -> dict:
    return boot_facts(parse_lines(lines).result())
