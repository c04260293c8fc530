"""`autotune parse`: print what autotune reads from vLLM boot logs (the reading is the vllm/log/ package)."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import click

from autotune.cli.exitcodes import ExitCode
from autotune.cli.options import fmt
from autotune.vllm.log import SCHEMA_KEYS, BootLogParser, diagnosis, parse_file, parse_stream

STDIN = "-"
# What a path can be instead of a log file, and why parse refuses it before reading.
_NOT_A_FILE = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe; reading it would wait for a writer: pipe into `autotune parse -`)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


@click.command()
@click.argument("logfiles", nargs=-1, required=True)
@click.option("--json", "json_", is_flag=True,
              help="JSON: the last boot's object with boots_in_log (a list of them for several logs).")
@click.option("--all-boots", is_flag=True,
              help="Show every boot of a log, not only the last (with --json: a list of boots per log).")
@click.option("--provenance/--no-provenance", default=True, show_default=True,
              help="With --json: include the line each value came from under \"provenance\".")
def parse(logfiles, json_, all_boots, provenance):
    """Print what autotune reads from vLLM boot logs.

    \b
    LOGFILES are log files (plain or gzip-compressed) or - for stdin:
      autotune parse attempt-1.log
      docker logs vllm 2>&1 | autotune parse -
      autotune parse --json --all-boots vllm.log.gz
    A log may hold several boots (a restart loop, appended runs): parse shows the last one and
    says how many there were; --all-boots shows each.

    \b
    Keys (absent when the log does not show them): vllm_version, non_default_args,
    attention_backend, weights_gib, available_kv_gib, kv_cache_tokens, max_concurrency,
    max_concurrency_tokens, gpu_blocks, cpu_blocks, max_model_len_requested, kv_needed_gib,
    refusal_available_kv_gib, estimated_max_model_len, kv_cache_max_tokens,
    outcome (ready | refused | error | incomplete), error_kind.
    Each value's source line is under "provenance" in --json output; figures that cannot
    be right are kept as printed and listed under "implausible".

    \b
    Exit codes: 0 every log was parsed (whatever its boot's outcome);
    1 a log could not be read, or is a directory, FIFO, device or socket
    (the other logs are still parsed and printed); 2 usage error;
    11 a log holds no vLLM boot (empty, or no line of vLLM's that autotune
    reads: the wrong file, or a capture without stderr: add 2>&1).
    """
    results: list[tuple[str, dict | list | None]] = []
    failed = empty = False
    for name in logfiles:
        try:
            parser = _read(name)
        except (OSError, EOFError, ValueError) as exc:  # gzip raises EOFError/BadGzipFile on a cut file
            failed = True
            message = _reason(name, exc)
            click.echo(f"Error: {message}", err=True)
            results.append((name, {"log": name, "error": message}))
            continue
        if no_boot(parser):
            empty = True
            message = no_boot_found(parser.line_count)
            click.echo(f"Error: {_shown(name)}: {message}", err=True)
            results.append((name, {"log": name, "boots_in_log": 0, "lines": parser.line_count, "no_boot": message}))
            continue
        results.append((name, _boots(name, parser, provenance) if all_boots else _last(name, parser, provenance)))
    if json_:
        payload = [out for _, out in results]
        click.echo(json.dumps(payload[0] if len(payload) == 1 else payload, indent=2, ensure_ascii=False))
    else:
        blocks = [_text(name, out) for name, out in results
                  if not (isinstance(out, dict) and ("error" in out or "no_boot" in out))]
        if blocks:
            click.echo("\n\n".join(blocks))
    if failed:
        sys.exit(ExitCode.INPUT)
    if empty:
        sys.exit(ExitCode.NO_BOOT)


_CAPTURE_HINT = "is it the server's log? (capture stderr too: `... 2>&1 | autotune parse -`)"


def no_boot_found(line_count: int) -> str:
    """Why a log holds no vLLM boot, said with its size."""
    if line_count == 0:
        return f"no vLLM boot found: the log is empty; {_CAPTURE_HINT}"
    lines = "its line is not" if line_count == 1 else f"none of its {line_count:,} lines is"
    return (f"no vLLM boot found: {lines} one of vLLM's that autotune reads (a version, the arguments, a KV "
            f"figure, a failure); {_CAPTURE_HINT}")


def no_boot(parser: BootLogParser) -> bool:
    """The log holds nothing of a vLLM boot: empty, or not one fact read and no failure."""
    return parser.boots_in_log == 1 and parser.outcome == "incomplete" and not parser.facts


def _shown(name: str) -> str:
    return "stdin" if name == STDIN else name


def _read(name: str) -> BootLogParser:
    if name == STDIN:
        return parse_stream(sys.stdin.buffer)
    mode = os.stat(name).st_mode  # FileNotFoundError, PermissionError: reported as they are
    for test, what in _NOT_A_FILE:
        if test(mode):
            raise ValueError(f"{name} is {what}, not a log file")  # refused before opening it
    return parse_file(name)


def _reason(name: str, exc: BaseException) -> str:
    if isinstance(exc, ValueError) and not isinstance(exc, OSError) and str(exc).startswith(name):
        return str(exc)
    detail = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return f"cannot read {name}: {detail}"


def _with_diagnosis(out: dict, prov: dict, provenance: bool) -> dict:
    found = diagnosis(out, prov)
    if found is not None:
        out["diagnosis"] = {"cause": found["cause"], "fix": found["fix"]}
    if provenance:
        out["provenance"] = prov
    return out


def _last(name: str, parser: BootLogParser, provenance: bool) -> dict:
    out = _with_diagnosis(parser.result(), parser.provenance(), provenance)
    out["boots_in_log"] = parser.boots_in_log
    out["log"] = name
    return out


def _boots(name: str, parser: BootLogParser, provenance: bool) -> list[dict]:
    total = parser.boots_in_log
    out = []
    for boot in parser.boots():
        item = _with_diagnosis(boot["result"], boot["provenance"], provenance)
        item.update(boot=boot["boot"], boots_in_log=total, first_line=boot["first_line"],
                    last_line=boot["last_line"], log=name)
        out.append(item)
    return out


def _text(name: str, out: dict | list) -> str:
    if isinstance(out, list):
        return "\n\n".join(render_parsed(f"{name} (boot {b['boot']} of {b['boots_in_log']}, lines "
                                         f"{b['first_line']}-{b['last_line']})", b) for b in out)
    shown = name
    if out.get("boots_in_log", 1) > 1:
        shown += f" (the last of {out['boots_in_log']} boots; --all-boots shows each)"
    return render_parsed(shown, out)


_NOT_SHOWN = ("outcome", "error_kind", "provenance", "diagnosis", "implausible", "boots_in_log", "log", "boot",
              "first_line", "last_line")


def render_parsed(path: Path | str, out: dict) -> str:
    """The text form of one parsed boot: outcome, each key with its line, the diagnosis."""
    kind = out.get("error_kind") or ("unknown" if out.get("outcome") == "error" else None)
    lines = [f"{path}: {out['outcome']}" + (f" ({kind})" if kind else "")]
    prov = out.get("provenance", {})
    for key in list(SCHEMA_KEYS) + sorted(k for k in out if k not in SCHEMA_KEYS):
        if key in _NOT_SHOWN or key not in out or (key == "exception" and out.get("error_kind")):
            continue  # a known failure's exception line is behind its cause and fix
        where = f"  [line {prov[key]['line']}]" if key in prov else ""
        value = out[key]
        shown = json.dumps(value, ensure_ascii=False) if isinstance(value, (dict, list)) else fmt(value)
        if len(shown) > 100:
            shown = shown[:97] + "..."
        lines.append(f"  {key}: {shown}{where}")
    for item in out.get("implausible") or ():
        lines.append(f"  implausible: {item['key']} = {fmt(item['value'])} ({item['why']}); not used for a fix")
    if out.get("diagnosis"):
        lines.append(f"  cause: {out['diagnosis']['cause']}")
        lines.append(f"  fix:   {out['diagnosis']['fix']}")
    return "\n".join(lines)


COMMANDS = [parse]
