"""The parser is never fooled: adversarial classes built from REAL log lines (tests/fixtures/logs).

Each class of issue 11 has a test here: several boots in one log, phrases injected into the
echoed arguments / the model name / request logs (a hypothesis property), tracebacks that
decide the outcome, messy lines (CR-only, hard wraps at any width, escape sequences, quotes,
box frames, Ray suffixes, stacked prefixes) and numbers (ASCII digits, whole thousands
groups, cut digit runs, implausible values).
"""

from __future__ import annotations

import gzip
import html
import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autotune.vllm.log import BootLogParser, ceiling_from, diagnosis, parse_file, parse_lines
from autotune.vllm.log.read import MAX_LINE_BYTES

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
ALL_LOGS = sorted(FIXTURES.glob("*.log"))


def _lines(name: str) -> list[str]:
    text = (FIXTURES / name).read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def _boot_facts(result: dict) -> dict:
    """What a boot log says about the boot: the outcome, the failure and every figure/word,
    without the echoed arguments, the model they name and the stated exception text (which quote user input)."""
    return {k: v for k, v in result.items()
            if k not in ("non_default_args", "args_namespace", "model", "exception")
            and not isinstance(v, (dict, list))}


def _facts_of(lines: list[str]) -> dict:
    return _boot_facts(parse_lines(lines).result())


# ---------------------------------------------------------------------------
# Boots, not files
# ---------------------------------------------------------------------------

REFUSED = "cpu-0.32.0-refused-gmu-0.10.log"
READY = "cpu-0.32.0-ready-at-estimate-130944.log"
AUTO = "cpu-0.32.0-ready-max-model-len-auto.log"


@pytest.mark.parametrize("log", ALL_LOGS, ids=lambda p: p.stem)
def test_each_real_log_is_one_boot(log: Path):
    # The tune loop feeds one attempt's log: it must read exactly that boot.
    parser = parse_file(log)
    expected = json.loads(log.with_suffix(".json").read_text())["expected"]
    assert parser.boots_in_log == expected.get("boots_in_log", 1)


@pytest.mark.parametrize("first,second", [(REFUSED, READY), (READY, REFUSED), (AUTO, REFUSED),
                                          ("cpu-0.32.0-error-gmu-0.05-node-memory.log", READY)])
def test_appended_boots_are_split_and_the_last_one_is_reported(first: str, second: str):
    joined = _lines(first) + _lines(second)
    parser = parse_lines(joined)
    assert parser.boots_in_log == 2
    assert _boot_facts(parser.result()) == _facts_of(_lines(second))
    boots = parser.boots()
    assert [b["boot"] for b in boots] == [1, 2]
    assert _boot_facts(boots[0]["result"]) == _facts_of(_lines(first))
    assert boots[0]["first_line"] == 1 and len(_lines(first)) - 20 < boots[1]["first_line"] <= len(_lines(first)) + 10
    # Provenance points into the second boot's lines of the joined file.
    for key, where in parser.provenance().items():
        assert where["line"] > boots[0]["last_line"] - 1, key


def test_a_restart_loop_of_three_boots_reports_the_last():
    lines = _lines(REFUSED) + _lines(REFUSED) + _lines(READY)
    parser = parse_lines(lines)
    assert parser.boots_in_log == 3
    assert [b["result"]["outcome"] for b in parser.boots()] == ["refused", "refused", "ready"]
    assert parser.outcome == "ready" and "error_kind" not in parser.result()


def test_streaming_feed_of_two_attempts_reads_only_the_last():
    # A tune attempt's log never holds two boots, but if one did (an appended file), the
    # streaming parser the loop uses reports the boot it is reading now.
    parser = BootLogParser()
    for line in _lines(REFUSED):
        parser.feed(line + "\n")
    assert parser.refused
    for line in _lines(READY):
        parser.feed(line + "\n")
    assert not parser.refused and parser.outcome == "ready"
    assert parser.boots_in_log == 2


def test_a_paste_that_puts_the_sizing_before_the_arguments_is_one_boot():
    # Real fixtures 009/010: the poster pasted the KV lines first, the config after (earlier stamps).
    for name in ("009-2x3090-qwen36-27b-int4-autoround-bench-report.log", "010-v024-rtx5090-qwen36-35b-a3b-nvfp4-moe.log"):
        parser = parse_file(FIXTURES / name)
        assert parser.boots_in_log == 1 and parser.outcome == "ready"


def test_data_parallel_engines_starting_together_are_one_boot():
    line = _lines(REFUSED)[23]  # the engine config line of a real boot
    assert "Initializing a V1 LLM engine" in line
    lines = _lines(REFUSED)[:24] + [line.replace("EngineCore pid=", "EngineCore_DP1 pid=1")] + _lines(REFUSED)[24:]
    assert parse_lines(lines).boots_in_log == 1


# ---------------------------------------------------------------------------
# Facts only from the lines that carry them (property test)
# ---------------------------------------------------------------------------

# Failure signatures and figure phrases, as real vLLM prints them (catalog tests, fixtures).
PHRASES = (
    "CUDA out of memory",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
    "EngineCore failed to start.",
    "RuntimeError: Engine core initialization failed. See root cause above.",
    "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`",
    "OSError: [Errno 98] Address already in use",
    "ValueError: Free memory on device (6.2/23.58 GiB) on startup is less than desired GPU memory utilization (0.9, 21.22 GiB).",
    "ValueError: To serve at least one request with the model's max seq len (131072), (16.0 GiB KV cache is needed,"
    " which is larger than the available KV cache memory (5.1 GiB). Based on the available memory, the estimated"
    " maximum model length is 999999.",
    "the estimated maximum model length is 999999",
    "The model's max seq len (999999) is larger than the maximum number of tokens that can be stored in KV cache (999999).",
    "GPU KV cache size: 999,999 tokens",
    "Maximum concurrency for 999,999 tokens per request: 99.00x",
    "Available KV cache memory: 999.9 GiB",
    "Available KV cache memory: -3.5 GiB",
    "# GPU blocks: 99999, # CPU blocks: 9",
    "Auto-fit max_model_len: reduced from 131072 to 999",
    "Loading model weights took 99.9 GB",
    "Model loading took 99.9 GiB memory and 1.0 seconds",
    "Starting vLLM API server 0 on http://0.0.0.0:9999",
    "Application startup complete.",
    "vLLM API server version 9.9.9",
    "Initializing a V1 LLM engine (v9.9.9) with config: model='x', max_seq_len=999999,",
    "non-default args: {'model': 'evil', 'max_model_len': 999999}",
    "Traceback (most recent call last):",
    "User-specified max_model_len (9) is greater than the derived max_model_len (max_position_embeddings=8 or model_max_length=None in model's config.json).",
    "max_num_seqs (256) exceeds available Mamba cache blocks (1).",
    "Bfloat16 is only supported on GPUs with compute capability of at least 8.0",
    "RuntimeError: Could not find nvcc",
    "type fp8e4nv not supported in this architecture",
    "Total number of attention heads (52) must be divisible by tensor parallel size (8).",
    "importlib.metadata.PackageNotFoundError: No package metadata was found for vllm",
)

# Real logs whose arguments name the model (the name is echoed in later lines).
_ARGS_RE = re.compile(r"(non-default args: \{|args: Namespace\()")
WITH_ARGS = [p.name for p in ALL_LOGS if any(_ARGS_RE.search(line) for line in _lines(p.name))]
_MODEL_RE = re.compile(r"""(?:'model'|'model_tag'|\bmodel)(?::\s*|=)'([^']{2,200})'""")


def _in_records(inject):
    """The injection applied to the text of a JSON log record (vLLM's JSON logging) as to a text line:
    a real JSON log escapes what its messages quote."""
    def injected(lines: list[str], phrase: str) -> list[str]:
        out = []
        for line in lines:
            if line.startswith('{"'):
                record = json.loads(line)
                record["message"] = inject([record["message"]], phrase)[0]
                line = json.dumps(record)
            else:
                line = inject([line], phrase)[0]
            out.append(line)
        return out
    return injected


def _inject_args(lines: list[str], phrase: str) -> list[str]:
    out = []
    for line in lines:
        found = _ARGS_RE.search(line)
        if found is not None:
            item = f"'note': {phrase!r}, " if found.group(1).endswith("{") else f"note={phrase!r}, "
            line = line[: found.end()] + item + line[found.end():]
        out.append(line)
    return out


def _text_of(line: str) -> str:
    return json.loads(line)["message"] if line.startswith('{"') else line


def _inject_model(lines: list[str], phrase: str) -> list[str]:
    names = {m.group(1) for line in lines for m in _MODEL_RE.finditer(_text_of(line))}
    evil = f"acme/{phrase}-7B"

    def rename(texts: list[str], _phrase: str) -> list[str]:
        out = []
        for text in texts:
            for name in sorted(names, key=len, reverse=True):
                if name in text:
                    text = text.replace(f"'{name}'", repr(evil)).replace(name, evil)
            out.append(text)
        return out

    return _in_records(rename)(lines, phrase)


def _inject_requests(lines: list[str], phrase: str) -> list[str]:
    requests = [
        f"(APIServer pid=1) INFO 11-29 10:09:01 [logger.py:39] Received request cmpl-9f1: prompt: {phrase!r}, "
        "params: SamplingParams(n=1, temperature=0.6, max_tokens=16), prompt_token_ids: None, lora_request: None.",
        '(APIServer pid=1) INFO:     127.0.0.1:41950 - "POST /v1/completions HTTP/1.1" 200 OK',
        "(APIServer pid=1) INFO 11-29 10:09:11 [loggers.py:271] Engine 000: Avg prompt throughput: 2.4 tokens/s, "
        f"Avg generation throughput: 0.2 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.0% {phrase}",
    ]
    ready = parse_lines(lines).provenance().get("server_ready", {}).get("line")  # where the server listens
    if not ready:
        requests = [line for line in requests if " HTTP/1.1" not in line]  # no server answered yet
    at = ready if ready else len(lines)
    return lines[:at] + requests + lines[at:]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(log=st.sampled_from(WITH_ARGS), phrase=st.sampled_from(PHRASES),
       site=st.sampled_from(("args", "model", "requests")))
def test_injected_phrases_change_no_boot_fact(log: str, phrase: str, site: str):
    lines = _lines(log)
    inject = {"args": _in_records(_inject_args), "model": _inject_model, "requests": _inject_requests}[site]
    before = parse_lines(lines)
    after = parse_lines(inject(lines, phrase))
    assert _boot_facts(after.result()) == _boot_facts(before.result())
    assert after.boots_in_log == before.boots_in_log
    assert after.internal_errors == 0


@pytest.mark.parametrize("phrase", PHRASES)
def test_request_logs_after_ready_never_fill_boot_facts(phrase: str):
    # A server that has answered requests for a day: every request line after the ready one.
    lines = _lines(READY)
    assert _facts_of(_inject_requests(lines, phrase)) == _facts_of(lines)
    assert ceiling_from(parse_lines(_inject_requests(lines, phrase)).result()) == ceiling_from(parse_lines(lines).result())


def test_model_named_like_a_failure_keeps_a_healthy_boot_healthy():
    lines = _inject_model(_lines(READY), "CUDA out of memory")
    assert any("acme/CUDA out of memory-7B" in line for line in lines)
    parser = parse_lines(lines)
    assert parser.outcome == "ready" and not parser.fatal and "error_kind" not in parser.result()


def test_a_prompt_echo_with_an_estimate_never_becomes_a_relaunch_length():
    lines = _inject_requests(_lines(REFUSED), "the estimated maximum model length is 999999")
    result = parse_lines(lines).result()
    assert ceiling_from(result) == (parse_lines(_lines(REFUSED)).result()["estimated_max_model_len"], "estimate")
    assert "999999" not in json.dumps(diagnosis(result))


def test_an_info_line_about_free_memory_on_startup_is_not_an_error():
    # vLLM 0.2x INFO line (catalog NOT_FAILURES) and the real passed check of fixture 215.
    r = parse_lines(["INFO 09-15 10:00:00 [gpu_worker.py:1] Free memory on device (20.1/23.58 GiB) on startup. "
                     "Desired GPU memory utilization is (0.9, 21.22 GiB). Actual usage is 14.99 GiB for weight"]).result()
    assert r["outcome"] == "incomplete" and "error_kind" not in r and "startup_free_gib" not in r
    info = "(Worker pid=3) INFO 05-16 10:00:30 [gpu_worker.py:1] Free memory on device cuda:0 (6.2/23.56 GiB) on startup is less than desired GPU memory utilization (0.9, 21.2 GiB)"
    assert parse_lines([info]).outcome == "incomplete"


# ---------------------------------------------------------------------------
# Tracebacks decide the outcome
# ---------------------------------------------------------------------------

# Real frames and an exception that is no known failure (fixture 122's RuntimeError wrapper).
_TRACEBACK = [
    "(EngineCore_DP0 pid=10078) Traceback (most recent call last):",
    '(EngineCore_DP0 pid=10078)   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 506, in run_engine_core',
    "(EngineCore_DP0 pid=10078)     engine_core = EngineCoreProc(*args, **kwargs)",
    "(EngineCore_DP0 pid=10078) RuntimeError: Worker failed with error 'NCCL error: unhandled system error', please check the stack trace above for the root cause",
]


def test_a_traceback_after_the_kv_line_is_an_error():
    lines = _lines("105-v0-tp8-vllmworkerprocess-llama31-8b-gpu-blocks-concurrency.log") + _TRACEBACK
    parser = parse_lines(lines + ["(VllmWorkerProcess pid=3311321) INFO 07-18 12:26:40 [x.py:1] still talking"])
    assert parser.outcome == "error" and "error_kind" not in parser.result()
    assert parser.result()["exception"].startswith("RuntimeError: Worker failed with error 'NCCL error")
    assert parser.provenance()["exception"]["line"] == len(lines)
    # ... but only once the log has ended: mid-stream (the tune loop) it is not yet decided.
    streaming = BootLogParser()
    for line in lines:
        streaming.feed(line)
    assert streaming.outcome == "ready"


def test_a_log_ending_inside_a_traceback_is_an_error_with_its_stated_cause():
    parser = parse_file(FIXTURES / "203-v08-traceback-frames-cut-mid-prefix-no-exception.log")
    assert parser.outcome == "error"
    lines = _lines(READY)[:60] + _TRACEBACK
    parser = parse_lines(lines)
    found = diagnosis(parser.result(), parser.provenance())
    assert found["kind"] == "unknown"
    assert f"(line {len(lines)})" in found["cause"] and "NCCL error" in found["cause"]


def test_negative_available_kv_is_its_own_kind_even_when_the_engine_dies_after():
    parser = parse_lines([
        "(EngineCore pid=2210) INFO 05-16 10:00:44 [gpu_worker.py:463] Available KV cache memory: -1.73 GiB",
        "(EngineCore pid=2210) ERROR 05-16 10:00:44 [core.py:1140] EngineCore failed to start.",
        "(APIServer pid=2150) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore': 1}",
    ])
    assert (parser.outcome, parser.result()["error_kind"]) == ("error", "negative_available_kv")
    assert parser.result()["available_kv_gib"] == -1.73


def test_the_console_script_package_metadata_failure_has_a_fix():
    parser = parse_file(FIXTURES / "cpu-0.32.0-error-console-script-package-metadata.log")
    found = diagnosis(parser.result())
    assert found["kind"] == "vllm_package_metadata_missing"
    assert "python -m vllm.entrypoints.openai.api_server" in found["fix"]


# ---------------------------------------------------------------------------
# Messy lines
# ---------------------------------------------------------------------------


def _hard_wrap(lines: list[str], width: int) -> list[str]:
    out = []
    for line in lines:
        line = line.replace("\r", "")
        out += [line[i : i + width] for i in range(0, len(line), width)] or [""]
    return out


@pytest.mark.parametrize("width", (60, 80, 97, 120, 133, 200, 250))
@pytest.mark.parametrize("log", ALL_LOGS, ids=lambda p: p.stem)
def test_hard_wrapped_logs_read_the_same(log: Path, width: int):
    lines = _lines(log.name)
    assert _facts_of(_hard_wrap(lines, width)) == _facts_of(lines)


def test_a_number_split_by_a_wrap_is_rejoined_not_misread():
    line = ("(EngineCore pid=88) ValueError: To serve at least one request with the model's max seq len (131072), "
            "(16.0 GiB KV cache is needed, which is larger than the available KV cache memory (5.1 GiB). Based on "
            "the available memory, the estimated maximum model length is 41776. Try increasing `gpu_memory_utilization`")
    cut = line.index("41776") + 2  # "...length is 41" | "776. Try ..."
    r = parse_lines([line[:cut], line[cut:]]).result()
    assert r["estimated_max_model_len"] == 41776


@pytest.mark.parametrize("log", ALL_LOGS, ids=lambda p: p.stem)
def test_cr_only_line_endings(log: Path, tmp_path: Path):
    lines = _lines(log.name)
    path = tmp_path / "cr.log"
    path.write_bytes("\r".join(line.replace("\r", "") for line in lines).encode("utf-8"))
    assert _boot_facts(parse_file(path).result()) == _facts_of(lines)


def test_every_terminal_escape_sequence_is_stripped():
    real = "(EngineCore pid=2390) INFO 05-16 10:08:44 [kv_cache_utils.py:1710] GPU KV cache size: 41,776 tokens"
    for dressed in (
        "\x1b]0;vllm serve\x07" + real,  # OSC window title
        "\x1b[2K\x1b[1G" + real,  # erase line, cursor to column 1 (tqdm)
        "\x1b[?25l" + real + "\x1b[?25h",  # hide/show cursor
        "\x1b(B\x1b[m" + real,  # charset selection, SGR reset
        "\x9b0;36m" + real,  # 8-bit CSI
        "^[[0;36m(EngineCore pid=2390)^[[0;0m" + real[len("(EngineCore pid=2390)"):],  # pasted caret notation
        "\x1b[1;32mG\x1b[0mPU KV cache size: 41,776 tokens",
        "GPU KV cache sizX\x08e: 41,776 tokens",  # overstrike
    ):
        parser = parse_lines([dressed])
        assert parser.result().get("kv_cache_tokens") == 41776, repr(dressed)
        assert "\x1b" not in parser.facts["kv_cache_tokens"].text


@pytest.mark.parametrize("wrapper", (
    lambda line: "> " + line,  # Markdown quote
    lambda line: "> > " + line,  # quoted quote
    lambda line: "│ " + line.ljust(245) + " │",  # k9s box frame (fixture 104)
    lambda line: line + " [repeated 30x across cluster]",  # Ray (fixture 116)
    lambda line: "2026-07-08T22:40:03.166647879Z " + line,  # kubectl --timestamps (fixture 126)
    lambda line: "vllm-1  | " + line,  # docker compose
    lambda line: "авг 18 14:15:02 llm python3[28145]: " + line,  # journald (fixture 030)
    lambda line: "> 2026-07-08T22:40:03Z vllm-1  | Aug 17 18:42:18 vllm vllm[8052]: " + line,  # stacked
    lambda line: "`" + line + "`",  # inline code (fixture 109)
    lambda line: "2024-04-27 10:13:05 | ERROR | stderr | " + line,  # QAnything's logger (fixture 509)
    lambda line: "2024-04-27 10:13:05.123 | INFO     | vllm_runner:main:42 - " + line,  # loguru's default
    lambda line: html.escape(line).replace("&#x27;", "&#39;"),  # an HTML-escaped paste (issue 20)
    lambda line: json.dumps({"MESSAGE": line, "PRIORITY": "6", "_PID": "1"}),  # journalctl -o json (issue 20)
    lambda line: "2026-07-08T22:40:03Z " + json.dumps({"MESSAGE": line}),  # the same behind kubectl's stamp
))
def test_wrappers_and_stacked_prefixes(wrapper):
    lines = _lines(REFUSED)
    assert _facts_of([wrapper(line) for line in lines]) == _facts_of(lines)


def test_ray_worker_prefix_and_repeated_suffix_on_real_lines():
    r = parse_file(FIXTURES / "116-ray-multinode-rayworkerwrapper-ip-repeated-across-cluster-v0-profiling.log").result()
    assert r["kv_cache_reserved_gib"] == 21.2


# ---------------------------------------------------------------------------
# Numbers
# ---------------------------------------------------------------------------


def test_only_ascii_digits_are_numbers():
    assert "kv_cache_tokens" not in parse_lines(["GPU KV cache size: ٤٢٨٣٢ tokens"]).result()
    assert "kv_cache_tokens" not in parse_lines(["GPU KV cache size: 4٢832 tokens"]).result()
    r = parse_lines(["ValueError: To serve at least one request with the model's max seq len (131072), (16.0 GiB KV cache"
                     " is needed, which is larger than the available KV cache memory (5.1 GiB). Based on the available"
                     " memory, the estimated maximum model length is 4177６."]).result()
    assert "estimated_max_model_len" not in r and r["max_model_len_requested"] == 131072


def test_thousands_separators_only_in_whole_groups():
    assert parse_lines(["GPU KV cache size: 1,2,3,4 tokens"]).result().get("kv_cache_tokens") is None
    assert parse_lines(["GPU KV cache size: 42,83,2 tokens"]).result().get("kv_cache_tokens") is None
    assert parse_lines(["GPU KV cache size: 4283,2 tokens"]).result().get("kv_cache_tokens") is None
    assert parse_lines(["GPU KV cache size: 2,248,576 tokens"]).result()["kv_cache_tokens"] == 2248576
    assert parse_lines(["Maximum concurrency for 1,2 tokens per request: 1.00x"]).result().get("max_concurrency") is None


def test_a_digit_run_cut_by_the_line_limit_is_no_value(tmp_path: Path):
    head = b"(EngineCore pid=1) INFO 01-01 00:00:00 [kv_cache_utils.py:1] # GPU blocks: "
    path = tmp_path / "cut.log"
    # The digit run starts before the 1 MiB limit and runs past it: what is left is no value.
    path.write_bytes(head + b"1" * (MAX_LINE_BYTES - len(head) + 5) + b"\nGPU KV cache size: 1,024 tokens\n")
    r = parse_file(path).result()
    assert "gpu_blocks" not in r
    assert r["line_cut"] == 1 and r["kv_cache_tokens"] == 1024


def test_implausible_values_are_kept_flagged_and_never_a_fix():
    refusal = ("ValueError: To serve at least one request with the model's max seq len (131072), (16.0 GiB KV cache is"
               " needed, which is larger than the available KV cache memory (5.1 GiB). Based on the available memory,"
               " the estimated maximum model length is {}. Try increasing")
    for estimate in (0, 131072, 999999):
        r = parse_lines([refusal.format(estimate)]).result()
        assert r["estimated_max_model_len"] == estimate  # kept as seen
        assert [f["key"] for f in r["implausible"]] == ["estimated_max_model_len"]
        value, source = ceiling_from(r)
        assert source == "computed_from_gib" and value < 131072  # from the GiB figures instead
        assert str(estimate) not in diagnosis(r)["fix"].replace("131072", "")
    r = parse_lines(["Available KV cache memory: 99999.5 GiB"]).result()
    assert r["available_kv_gib"] == 99999.5 and r["implausible"][0]["why"].endswith("beyond any device")
    r = parse_lines(["The model's max seq len (29000) is larger than the maximum number of tokens that can be stored in KV cache (50000)."]).result()
    assert ceiling_from(r) == (None, "none")


def test_gzip_logs_are_read_transparently(tmp_path: Path):
    path = tmp_path / "attempt-1.log.gz"
    path.write_bytes(gzip.compress((FIXTURES / REFUSED).read_bytes()))
    assert parse_file(path).result() == parse_file(FIXTURES / REFUSED).result()


def test_a_second_arguments_line_starts_a_boot_even_without_a_banner():
    # A paste trimmed of the banners: each boot still prints its arguments once.
    def trimmed(name: str) -> list[str]:
        return [line for line in _lines(name) if "version" not in line and "█" not in line]

    assert sum("non-default args" in line for line in trimmed(READY)) == 1
    parser = parse_lines(trimmed(READY) + trimmed(REFUSED))  # in time order, as a restart loop writes
    assert parser.boots_in_log == 2 and parser.outcome == "refused"
    # The arguments of a boot pasted after its error (fixture 311) do not start a boot.
    assert parse_file(FIXTURES / "311-v02x-heads-not-divisible-quoted-before-its-args-line.log").boots_in_log == 1


@pytest.mark.parametrize("prefix", ("2024-04-27 10:13:05 | ERROR | stderr | ",
                                    "2024-04-27 10:13:05.123 | ERROR    | worker:run:42 - "))
def test_a_pipe_separated_logger_prefix_leaves_the_exception_line_clean(prefix):
    """A traceback the wrapper's own logger printed (fixture 509: QAnything) ends in the exception
    line itself as the stated cause, not in the logger's fields."""
    lines = [prefix + text for text in ("Traceback (most recent call last):",
                                        '  File "/srv/run.py", line 3, in <module>',
                                        "RuntimeError: the frobnicator is out of order")]
    parser = parse_lines(lines)
    parser.close()
    assert parser.outcome == "error"
    assert parser.result()["exception"] == "RuntimeError: the frobnicator is out of order"
