"""Logs as the systems that carry them write them: the same facts as the log vLLM printed.

Every real boot log in tests/fixtures/logs goes through each carrier (tests/helpers/log_carriers.py:
docker's json-file driver, Fluent Bit's CRI parser, ``journalctl -o json-pretty``, the CRI log
format of Kubernetes nodes, ``kubectl logs --timestamps``, Grafana's "Download logs", ``logcli``'s
rows and jsonl) and must read as the plain log does: every figure and word, the outcome, the boots.
A line longer than the runtime's buffer arrives in parts (16 KiB; here also a small buffer, so that
most lines of every log are split, inside words and numbers): the parts are one line again.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.vllm.log import BootLogParser, parse_lines
from tests.helpers import log_carriers as carry
from tests.helpers.real_logs import ALL_LOGS, FIXTURES, boot_facts, boot_facts_of, log_lines

SMALL = 61  # a buffer far smaller than a line: most lines split, inside words, numbers and UTF-8 characters


def _boots(lines: list[str]) -> list[dict]:
    return [boot_facts(boot["result"]) for boot in parse_lines(lines).boots()]


def fluent_bit_cri(lines: list[str], split: int = carry.SPLIT) -> list[str]:
    """Fluent Bit's ``cri`` parser, forwarded as JSON (its ``_p`` field: P for a part of a line, F for its
    last part; ``log`` without the newline)."""
    out = []
    for row in carry.cri(lines, split):
        time, stream, tag, text = row.split(" ", 3)
        out.append(json.dumps({"time": time, "stream": stream, "_p": tag, "log": text, "kubernetes": {"pod_name": "v"}}))
    return out


CARRIERS = {
    "docker-json-file": carry.docker_json_file,
    "docker-json-file-split": lambda lines: carry.docker_json_file(lines, split=SMALL),
    "fluent-bit-cri-split": lambda lines: fluent_bit_cri(lines, split=SMALL),
    "journalctl-json-pretty": carry.journal_json_pretty,
    "cri": carry.cri,
    "cri-split": lambda lines: carry.cri(lines, split=SMALL),
    "kubectl-timestamps": carry.kubectl_timestamps,
    "grafana-download": lambda lines: carry.grafana_download(lines, newest_first=False),
    "logcli": lambda lines: carry.logcli(lines, forward=True),
    "logcli-jsonl": lambda lines: carry.logcli_jsonl(lines, forward=True),
}


@pytest.mark.parametrize("carrier", CARRIERS)
@pytest.mark.parametrize("log", ALL_LOGS, ids=lambda p: p.stem)
def test_a_carried_log_reads_as_the_log_vllm_printed(log: Path, carrier: str):
    lines = log_lines(log)
    carried = CARRIERS[carrier](lines)
    assert carried != lines
    assert _boots(carried) == _boots(lines)


def test_the_parts_of_a_line_over_16_kib_are_one_line_again():
    """A line past the runtime's buffer (docker, containerd: 16 KiB): the figure at its end is read once
    its parts are joined, at the first part's line."""
    kv = "(EngineCore pid=2390) INFO 05-16 10:08:44 [kv_cache_utils.py:1710] GPU KV cache size: 41,776 tokens"
    long = "(EngineCore pid=2390) INFO 05-16 10:08:44 [core.py:1] " + "x" * 20000 + " GPU KV cache size: 1 tokens"
    for carrier in (carry.docker_json_file, carry.cri, fluent_bit_cri):
        rows = carrier([long, kv])
        assert len(rows) == 3
        parser = parse_lines(rows)
        assert parser.result()["kv_cache_tokens"] == 41776 and parser.provenance()["kv_cache_tokens"]["line"] == 3
    split_kv = carry.cri(["x", kv], split=30)
    assert len(split_kv) == 5 and parse_lines(split_kv).provenance()["kv_cache_tokens"]["line"] == 2


def test_a_part_whose_last_record_never_came_is_read_as_it_stands():
    """A log cut after a partial record: its text is read, a figure at its end never (it may go on)."""
    kv = "(EngineCore pid=2390) INFO 05-16 10:08:44 [kv_cache_utils.py:1710] GPU KV cache size: 41,776 tokens"
    rows = carry.cri([kv + " (x)"], split=len(kv) + 2)
    assert [row.split(" ", 3)[2] for row in rows] == ["P", "F"]
    assert parse_lines(rows[:1]).result()["kv_cache_tokens"] == 41776
    assert "kv_cache_tokens" not in parse_lines(carry.cri([kv], split=kv.index("41,776") + 4)[:1]).result()


def test_each_stream_joins_its_own_parts():
    """stdout and stderr interleave in one CRI file: a part continues its own stream's line."""
    kv = "(EngineCore pid=2390) INFO 05-16 10:08:44 [kv_cache_utils.py:1710] GPU KV cache size: 41,776 tokens"
    err = carry.cri([kv], split=40)
    out = carry.cri(["INFO 05-16 10:08:45 [api_server.py:1] vLLM API server version 0.9.1"], split=30, stream="stdout")
    rows = [err[0], out[0], err[1], out[1], out[2], err[2]]
    result = parse_lines(rows).result()
    assert result["kv_cache_tokens"] == 41776 and result["vllm_version"] == "0.9.1"


def test_a_docker_record_that_holds_a_whole_line_is_no_wrap():
    """Lines docker captured are whole: a line that looks like the rest of the one before is its own."""
    first = "(EngineCore pid=1) INFO 05-16 10:08:44 [core.py:1] GPU KV cache size: 41,776 tokens"
    assert parse_lines(carry.docker_json_file([first, "and more"])).result()["kv_cache_tokens"] == 41776


def test_json_pretty_reads_its_message_at_the_message_row():
    kv = "(EngineCore pid=2390) INFO 05-16 10:08:44 [kv_cache_utils.py:1710] GPU KV cache size: 41,776 tokens"
    rows = carry.journal_json_pretty(["hello", kv])
    parser = parse_lines(rows)
    assert parser.result()["kv_cache_tokens"] == 41776
    assert rows[parser.provenance()["kv_cache_tokens"]["line"] - 1].lstrip().startswith('"MESSAGE"')


def test_a_grafana_row_is_no_number_of_its_own():
    """Grafana's epoch and ISO time before the entry are no part of vLLM's line."""
    row = "1764600000123\t2025-12-01T14:40:00.123Z\tINFO 12-01 14:40:00 [api_server.py:1] vLLM API server version 0.9.1"
    assert boot_facts_of([row])["vllm_version"] == "0.9.1"
    assert boot_facts_of(carry.grafana_download([(FIXTURES / "208-v09x-4xh100-qwen3-235b-trimmed-two-lines.log")
                                             .read_text().splitlines()[1]], newest_first=False))["kv_cache_tokens"] == 178880


def test_a_line_that_is_a_lone_brace_holds_back_no_text():
    """A ``{`` alone may open a json-pretty entry; a next row that is no JSON row ends it at once (a
    Cloud Logging paste that never closes held back the log's next 8,192 lines, read twice)."""
    kv = "(EngineCore pid=2390) INFO 05-16 10:08:44 [kv_cache_utils.py:1710] GPU KV cache size: 41,776 tokens"
    parser = BootLogParser()
    parser.feed("  {")
    parser.feed('    "insertId": "mhj2jzf4ev0il",')
    assert [fact.key for fact in parser.feed(kv)] == ["kv_cache_tokens", "kv_cache_device"]
