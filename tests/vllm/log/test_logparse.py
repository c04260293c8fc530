"""Tests for autotune.vllm.log (the parser): real fixture logs, one test per log format, the
ceiling computation and fuzzing for robustness."""

from __future__ import annotations

import io
import json
import math
import re
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autotune.vllm.log import SCHEMA_KEYS, BootLogParser, Fact, ceiling_from, failures, parse_file, parse_lines
from autotune.vllm.log.boot import TEXT_MAX
from autotune.vllm.log.clean import unwrap

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
FIXTURE_JSONS = sorted(FIXTURES.glob("*.json"))

EXPECTED_SCHEMA = (
    "vllm_version", "non_default_args", "attention_backend", "weights_gib", "available_kv_gib",
    "kv_cache_tokens", "max_concurrency", "max_concurrency_tokens", "gpu_blocks", "cpu_blocks",
    "max_model_len_requested", "kv_needed_gib", "refusal_available_kv_gib", "estimated_max_model_len",
    "kv_cache_max_tokens", "outcome", "error_kind",
)

# Independent of the module under test: how a stored log line looks once cleaned.
_TEST_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]|\^\[\[[0-9;]*m")


def _file_lines(path: Path) -> list[str]:
    raw = path.read_bytes()
    if raw.endswith(b"\n"):
        raw = raw[:-1]
    out = []
    for chunk in raw.split(b"\n"):
        text = chunk.decode("utf-8", "replace").replace("\r", "").replace("\x00", "")
        out.append(_TEST_ANSI.sub("", text))
    return out


def _record_texts(line: str) -> list[str]:
    """The text a JSON log record of vLLM's JSON logging carries (its message and traceback); [] for text."""
    if not line.startswith('{"'):
        return []
    record = json.loads(line)
    return [*record["message"].split("\n"), *record.get("exc_info", "").split("\n")]


def _parse(*lines: str | bytes) -> dict:
    return parse_lines(lines).result()


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# ---------------------------------------------------------------------------
# Contract
# ---------------------------------------------------------------------------


def test_schema_keys_exact_order():
    assert SCHEMA_KEYS == EXPECTED_SCHEMA


def test_fixture_set_is_complete():
    names = {p.stem for p in FIXTURE_JSONS}
    assert len(names) >= 33  # 21 first fixtures + the 12 real logs numbered 101 and up (and the unseen-log set)
    for json_path in FIXTURE_JSONS:
        assert json_path.with_suffix(".log").exists(), json_path
    assert sum(1 for n in names if n.startswith("cpu-0.32.0-")) == 10  # with JSON logging, a bad flag and value (issue 20)


# ---------------------------------------------------------------------------
# Real logs
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("json_path", FIXTURE_JSONS, ids=lambda p: p.stem)
def test_fixture_expected_values(json_path: Path):
    expected = json.loads(json_path.read_text())["expected"]
    parser = parse_file(json_path.with_suffix(".log"))
    result = parser.result()
    assert parser.internal_errors == 0
    for key, value in expected.items():
        assert key in result, f"{key} missing"
        assert result[key] == value, key
        if isinstance(value, float):
            # "as printed": a float stays a float (4.00 -> 4.0), an int stays an int.
            assert isinstance(result[key], float), key
        elif isinstance(value, int) and not isinstance(value, bool):
            assert isinstance(result[key], int) and not isinstance(result[key], bool), key
    for key in SCHEMA_KEYS:
        if key not in expected:
            assert key not in result, f"{key} must be absent, got {result[key]!r}"
    assert parser.outcome == expected["outcome"]
    assert parser.refused == (expected["outcome"] == "refused")
    assert parser.fatal == (expected["outcome"] in ("refused", "error"))
    json.dumps(result, allow_nan=False)


@pytest.mark.parametrize("json_path", FIXTURE_JSONS, ids=lambda p: p.stem)
def test_fixture_provenance_points_at_the_right_line(json_path: Path):
    log = json_path.with_suffix(".log")
    parser = parse_file(log)
    result = parser.result()
    provenance = parser.provenance()
    lines = _file_lines(log)
    assert parser.line_count == len(lines)
    assert set(provenance) == set(result) - {"outcome", "implausible"}
    for key, value in result.items():
        if key in ("outcome", "implausible"):
            continue
        entry = provenance[key]
        assert 1 <= entry["line"] <= len(lines), key
        text = entry["text"]
        assert len(text) <= TEXT_MAX
        # A hard-wrapped line is read rejoined: its text may run on into the next lines.
        here = entry["line"] - 1
        record = _record_texts(lines[here])
        if record:  # a JSON record is read as its text, behind a prefix made of its fields
            assert any(part and (part in text or text[-80:] in part) for part in record), (
                f"{key}: text is not from the record on line {entry['line']}")
        else:
            # (a message read across lines is read without what a paste put around each: a quote's bar)
            assert any(text in joiner.join(rows[here : here + n]) for rows in (lines, [unwrap(x) for x in lines])
                       for n in (1, 2, 3, 4) for joiner in ("", " ")), f"{key}: text is not from line {entry['line']}"
        if _is_number(value):
            assert str(value) in text.replace(",", ""), f"{key}={value} not shown in {text!r}"
        elif isinstance(value, str) and key not in ("error_kind", "post_ready_error_kind", "compile_cache"):  # labels, not text
            assert value in text, key
    if "error_kind" in result:
        # The provenance of error_kind is the signature line itself.
        kind = failures.match(provenance["error_kind"]["text"])
        assert kind is not None and kind.kind == result["error_kind"]


@pytest.mark.parametrize("json_path", FIXTURE_JSONS, ids=lambda p: p.stem)
def test_streaming_str_bytes_and_file_agree(json_path: Path):
    log = json_path.with_suffix(".log")
    raw = log.read_bytes()
    by_file = parse_file(log)
    by_bytes = parse_lines(io.BytesIO(raw).readlines())  # binary readlines splits on b'\n' only
    by_str = parse_lines(raw.decode("utf-8", "replace").split("\n"))
    assert by_file.result() == by_bytes.result()
    assert by_file.provenance() == by_bytes.provenance()
    assert by_file.result() == by_str.result()


def test_fixture_specifics():
    # 017: the MoE kernel line "[mxfp4.py:165] Using Triton backend" (no period) is not the backend.
    r017 = parse_file(FIXTURES / "017-v014-h100-gpt-oss-120b-ansi-color-prefix.log").result()
    assert r017["attention_backend"] == "FLASH_ATTN"
    # 021: a request-time AssertionError after the server answered does not make it an error.
    p021 = parse_file(FIXTURES / "021-v080rc2-tesla-t4-fa2-turing-xformers-gptq.log")
    assert p021.outcome == "ready" and not p021.fatal
    # 023: "EngineCore failed to start." comes first; the CUDA OOM later replaces engine_died.
    p023 = parse_file(FIXTURES / "023-v011-8xa100-qwen3-vl-235b-cuda-oom-enginecore-dp0.log")
    assert p023.facts["error_kind"].line_no == 8
    # 020: the fp8 root cause (line 4) wins over the later EngineCore death (line 6).
    p020 = parse_file(FIXTURES / "020-ampere-fp8e4nv-unsupported-worker-pp0-tp1-ep1-prefix.log")
    assert p020.facts["error_kind"].line_no == 4
    # 003/036: the requested length comes from the refusal, not from arguments.
    assert ceiling_from(parse_file(FIXTURES / "036-v085dev-2x-rtx5090-qwq32b-bnb-pp2-rank0-prefix-refused.log").result()) == (58384, "v0_kv_capacity")
    assert ceiling_from(parse_file(FIXTURES / "006-kv-fp8-refused-bare-valueerror.log").result()) == (122080, "estimate")
    auto = parse_file(FIXTURES / "cpu-0.32.0-ready-max-model-len-auto.log").result()
    assert ceiling_from(auto) == (130944, "autofit")
    # The CPU refusal is printed twice (logger, then stderr traceback): the first one is kept.
    refused = parse_file(FIXTURES / "cpu-0.32.0-refused-kvcache-space-1gib.log")
    assert refused.facts["estimated_max_model_len"].line_no == 76


# ---------------------------------------------------------------------------
# One test per format (log-formats.md sections 11/12 and the version table)
# ---------------------------------------------------------------------------


def test_v06_bracketless_prefix_v0_boot():
    r = _parse(
        "INFO 09-20 10:00:01 api_server.py:495] vLLM API server version 0.6.1",
        "INFO 09-20 10:00:01 api_server.py:496] args: Namespace(model_tag='meta-llama/Llama-3.1-8B-Instruct', config='', host=None, port=8000, max_model_len=131072, gpu_memory_utilization=0.9, dispatch_function=<function serve at 0x7f>)",
        "INFO 09-20 10:00:09 llm_engine.py:232] Initializing an LLM engine (v0.6.1) with config: model='meta-llama/Llama-3.1-8B-Instruct', max_seq_len=131072, download_dir=None",
        "INFO 09-20 10:00:12 model_runner.py:1008] Loading model weights took 14.9888 GB",
        "INFO 09-20 10:00:15 gpu_executor.py:122] # GPU blocks: 2677, # CPU blocks: 2048",
        "INFO 09-20 10:00:15 gpu_executor.py:126] Maximum concurrency for 131072 tokens per request: 0.33x",
        "ERROR 09-20 10:00:15 engine.py:366] The model's max seq len (131072) is larger than the maximum number of tokens that can be stored in KV cache (42832). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.",
        "Process SpawnProcess-1:",
        "RuntimeError: Engine process failed to start. See stack trace for the root cause.",
    )
    assert r["vllm_version"] == "0.6.1"
    assert r["args_namespace"] == {
        "model_tag": "meta-llama/Llama-3.1-8B-Instruct", "config": "", "host": None, "port": 8000,
        "max_model_len": 131072, "gpu_memory_utilization": 0.9,
    }
    assert "non_default_args" not in r
    assert r["max_seq_len_engine"] == 131072
    assert (r["weights_gib"], r["weights_unit_in_log"]) == (14.9888, "GB")
    assert (r["gpu_blocks"], r["cpu_blocks"]) == (2677, 2048)
    assert (r["max_concurrency_tokens"], r["max_concurrency"]) == (131072, 0.33)
    assert (r["max_model_len_requested"], r["kv_cache_max_tokens"]) == (131072, 42832)
    assert (r["outcome"], r["error_kind"]) == ("refused", "kv_cache_insufficient_legacy")
    assert ceiling_from(r) == (42832, "v0_kv_capacity")


def test_v064_memory_profiling_and_graph_line():
    r = _parse(
        "INFO 11-20 10:00:15 worker.py:232] Memory profiling results: total_gpu_memory=23.58GiB initial_memory_usage=15.34GiB peak_torch_memory=16.21GiB memory_usage_post_profile=15.35Gib non_torch_memory=0.21GiB kv_cache_size=5.23GiB gpu_memory_utilization=0.90",
        "INFO 11-20 10:00:31 model_runner.py:1518] Graph capturing finished in 16 secs, took 0.54 GiB",
        "INFO 11-20 10:00:31 selector.py:135] Using Flash Attention backend.",
    )
    assert r["kv_cache_size_gib"] == 5.23
    assert "available_kv_gib" not in r
    assert r["cuda_graph_gib"] == 0.54
    assert r["attention_backend"] == "Flash Attention"
    assert r["outcome"] == "incomplete"


def test_v0_multiline_profile_with_crlf_continuations():
    # NewLineFormatter: every continuation line repeats the prefix and ends in \r.
    chunk = (
        "INFO 01-28 10:00:14 worker.py:266] Memory profiling takes 3.12 seconds\r\n"
        "INFO 01-28 10:00:14 worker.py:266] the current vLLM instance can use total_gpu_memory (23.58GiB) x gpu_memory_utilization (0.90) = 21.22GiB\r\n"
        "INFO 01-28 10:00:14 worker.py:266] model weights take 14.99GiB; non_torch_memory takes 0.21GiB; PyTorch activation peak memory takes 0.79GiB; the rest of the memory reserved for KV Cache is 5.23GiB.\n"
    )
    parser = BootLogParser()
    facts = parser.feed(chunk)  # one call with embedded newlines = three lines
    assert [f.key for f in facts] == ["kv_cache_reserved_gib"]
    assert facts[0].value == 5.23 and facts[0].line_no == 3
    assert "\r" not in facts[0].text
    parser.feed("INFO 01-28 10:00:14 executor_base.py:108] # CUDA blocks: 2677, # CPU blocks: 2048\r\n")
    assert parser.facts["gpu_blocks"].line_no == 4
    assert parser.outcome == "ready"


def test_v07_gb_and_models_typo_without_estimate():
    r = _parse(
        "INFO 02-21 10:00:14 kv_cache_utils.py:522] # GPU blocks: 2677",
        "ValueError: To serve at least one request with the models's max seq len (131072), (16.00 GB KV cache is needed, which is larger than the available KV cache memory (5.23 GB). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.",
    )
    assert r["gpu_blocks"] == 2677 and "cpu_blocks" not in r
    assert (r["max_model_len_requested"], r["kv_needed_gib"], r["refusal_available_kv_gib"]) == (131072, 16.0, 5.23)
    assert r["refusal_unit_in_log"] == "GB"
    assert "estimated_max_model_len" not in r
    assert (r["outcome"], r["error_kind"]) == ("refused", "kv_cache_insufficient")
    assert ceiling_from(r) == (42832, "computed_from_gib")


def test_v080_boot_lines():
    r = _parse(
        "INFO 03-20 10:00:01 [api_server.py:981] vLLM API server version 0.8.1",
        "INFO 03-20 10:00:08 [core.py:61] Initializing a V1 LLM engine (v0.8.1) with config: model='meta-llama/Llama-3.1-8B-Instruct', max_seq_len=131072, enforce_eager=False",
        "INFO 03-20 10:00:11 [cuda.py:215] Using Flash Attention backend on V1 engine.",
        "INFO 03-20 10:00:20 [gpu_model_runner.py:1101] Model loading took 14.9889 GB and 7.524711 seconds",
        "ERROR 03-20 10:00:48 [core.py:340] EngineCore hit an exception: Traceback (most recent call last):",
        "ValueError: To serve at least one request with the models's max seq len (131072), (16.00 GB KV cache is needed, which is larger than the available KV cache memory (5.23 GB). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.",
        "CRITICAL 03-20 10:00:48 [core_client.py:269] Got fatal signal from worker processes, shutting down. See stack trace above for root cause issue.",
        "Killed",
    )
    assert r["vllm_version"] == "0.8.1"
    assert r["attention_backend"] == "Flash Attention"
    assert (r["weights_gib"], r["weights_unit_in_log"]) == (14.9889, "GB")
    assert r["max_seq_len_engine"] == 131072
    assert (r["outcome"], r["error_kind"]) == ("refused", "kv_cache_insufficient")


def test_v084_buggy_estimate_has_no_number_and_ceiling_is_computed():
    r = _parse(
        "INFO 04-20 10:00:01 [api_server.py:1034] vLLM API server version 0.8.4",
        "INFO 04-20 10:00:20 [gpu_model_runner.py:1291] Model loading took 14.9889 GiB and 7.112034 seconds",
        "ValueError: To serve at least one request with the models's max seq len (131072), (16.00 GiB KV cache is needed, which is larger than the available KV cache memory (5.23 GiB). Based on the available memory,  Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.",
    )
    assert "estimated_max_model_len" not in r
    assert r["refusal_unit_in_log"] == "GiB"
    # By hand: 5.23 / 16.00 * 131072 = 42844.16 tokens = 2677.76 blocks of 16 -> 2677 blocks -> 42832.
    assert ceiling_from(r) == (42832, "computed_from_gib")


def test_v091_available_kv_and_fixed_estimate_and_non_default_args():
    r = _parse(
        "INFO 06-12 10:00:01 [api_server.py:1287] vLLM API server version 0.9.1",
        "INFO 06-12 10:00:01 [cli_args.py:309] non-default args: {'model': 'meta-llama/Llama-3.1-8B-Instruct', 'max_model_len': 131072}",
        "INFO 06-12 10:00:47 [gpu_worker.py:227] Available KV cache memory: 5.23 GiB",
        "ERROR 06-12 10:00:47 [core.py:515] EngineCore failed to start.",
        "ERROR 06-12 10:00:47 [core.py:515] ValueError: To serve at least one request with the models's max seq len (131072), (16.00 GiB KV cache is needed, which is larger than the available KV cache memory (5.23 GiB). Based on the available memory, the estimated maximum model length is 42832. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.",
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore_0': 1}",
    )
    assert r["non_default_args"] == {"model": "meta-llama/Llama-3.1-8B-Instruct", "max_model_len": 131072}
    assert r["available_kv_gib"] == 5.23
    assert r["estimated_max_model_len"] == 42832
    assert r["max_model_len_requested"] == 131072
    assert (r["outcome"], r["error_kind"]) == ("refused", "kv_cache_insufficient")
    assert ceiling_from(r) == (42832, "estimate")


def test_v0102_relaunch_ready_with_prefixes():
    r = _parse(
        "(APIServer pid=4120) INFO 09-15 10:05:01 [utils.py:328] non-default args: {'model_tag': 'meta-llama/Llama-3.1-8B-Instruct', 'model': 'meta-llama/Llama-3.1-8B-Instruct', 'max_model_len': 42832}",
        "(EngineCore_DP0 pid=4190) INFO 09-15 10:05:40 [gpu_worker.py:298] Available KV cache memory: 5.23 GiB",
        "(EngineCore_DP0 pid=4190) INFO 09-15 10:05:40 [kv_cache_utils.py:864] GPU KV cache size: 42,832 tokens",
        "(EngineCore_DP0 pid=4190) INFO 09-15 10:05:40 [kv_cache_utils.py:868] Maximum concurrency for 42,832 tokens per request: 1.00x",
        "(EngineCore_DP0 pid=4190) INFO 09-15 10:05:52 [gpu_model_runner.py:3118] Graph capturing finished in 12 secs, took 0.52 GiB",
        "(APIServer pid=4120) INFO 09-15 10:05:55 [api_server.py:1971] Starting vLLM API server 0 on http://0.0.0.0:8000",
        "(APIServer pid=4120) INFO:     Application startup complete.",
    )
    assert "max_model_len_requested" not in r  # never from args
    assert (r["kv_cache_tokens"], r["kv_cache_device"]) == (42832, "GPU")
    assert (r["max_concurrency_tokens"], r["max_concurrency"]) == (42832, 1.0)
    assert r["cuda_graph_gib"] == 0.52
    assert r["listen_url"] == "http://0.0.0.0:8000"
    assert r["outcome"] == "ready" and "error_kind" not in r


def test_v013_docs_link_and_tuple_backend_list():
    r = _parse(
        "(EngineCore_DP0 pid=5311) INFO 12-20 10:00:11 [cuda.py:352] Using FLASH_ATTN attention backend out of potential backends: ('FLASH_ATTN', 'FLASHINFER', 'TRITON_ATTN', 'FLEX_ATTENTION')",
        "(EngineCore_DP0 pid=5311) INFO 12-20 10:00:20 [gpu_model_runner.py:3660] Model loading took 14.9889 GiB memory and 6.912341 seconds",
        "(EngineCore_DP0 pid=5311) ERROR 12-20 10:00:46 [core.py:866] ValueError: To serve at least one request with the models's max seq len (131072), (16.00 GiB KV cache is needed, which is larger than the available KV cache memory (5.23 GiB). Based on the available memory, the estimated maximum model length is 42832. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine. See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.",
    )
    assert r["attention_backend"] == "FLASH_ATTN"
    assert r["weights_gib"] == 14.9889
    assert r["estimated_max_model_len"] == 42832
    assert r["outcome"] == "refused"


def test_v014_format_gib_one_decimal():
    r = _parse(
        "(EngineCore_DP0 pid=771) ValueError: To serve at least one request with the models's max seq len (131072), (16.0 GiB KV cache is needed, which is larger than the available KV cache memory (5.23 GiB). Based on the available memory, the estimated maximum model length is 42832. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine. See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
    )
    assert r["kv_needed_gib"] == 16.0 and isinstance(r["kv_needed_gib"], float)
    assert r["refusal_available_kv_gib"] == 5.23


def test_v017_logo_banner_autofit_and_ready():
    r = _parse(
        "(APIServer pid=700) INFO 03-05 10:00:01 [utils.py:282]",
        "(APIServer pid=700) INFO 03-05 10:00:01 [utils.py:282]        █     █     █▄   ▄█",
        "(APIServer pid=700) INFO 03-05 10:00:01 [utils.py:282]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.17.0",
        "(APIServer pid=700) INFO 03-05 10:00:01 [utils.py:282]   █▄█▀ █     █     █     █  model   meta-llama/Llama-3.1-8B-Instruct",
        "(APIServer pid=700) INFO 03-05 10:00:01 [utils.py:282]    ▀▀  ▀▀▀▀▀ ▀▀▀▀▀ ▀     ▀",
        "(APIServer pid=700) INFO 03-05 10:00:01 [utils.py:238] non-default args: {'model_tag': 'meta-llama/Llama-3.1-8B-Instruct', 'model': 'meta-llama/Llama-3.1-8B-Instruct', 'max_model_len': -1}",
        "(APIServer pid=700) INFO 03-05 10:00:05 [model.py:1554] Using max model len 131072",
        "(EngineCore_DP0 pid=771) INFO 03-05 10:00:46 [gpu_worker.py:425] Available KV cache memory: 5.23 GiB",
        "(EngineCore_DP0 pid=771) INFO 03-05 10:00:46 [kv_cache_utils.py:1456] Auto-fit max_model_len: reduced from 131072 to 42832 to fit in available GPU memory (5.23 GiB available for KV cache)",
        "(EngineCore_DP0 pid=771) INFO 03-05 10:00:46 [kv_cache_utils.py:1314] GPU KV cache size: 42,832 tokens",
        "(APIServer pid=700) INFO 03-05 10:00:58 [api_server.py:501] Starting vLLM API server 0 on http://0.0.0.0:8000",
    )
    assert r["vllm_version"] == "0.17.0"
    assert r["non_default_args"]["max_model_len"] == -1
    assert r["max_model_len_resolved"] == 131072
    assert (r["autofit_from"], r["autofit_max_model_len"]) == (131072, 42832)
    assert ceiling_from(r) == (42832, "autofit")
    assert r["outcome"] == "ready"


def test_disable_log_logo_banner():
    r = _parse("(APIServer pid=1) INFO 03-05 10:00:01 [utils.py:240] vLLM server version 0.17.0, serving model meta-llama/Llama-3.1-8B-Instruct")
    assert r["vllm_version"] == "0.17.0"


def test_the_model_vllm_serves_is_read_where_it_says_it():
    # non-default args (0.9+): the model the command named
    r = parse_file(FIXTURES / "cpu-0.32.0-ready-max-model-len-auto.log")
    assert r.facts["model"].value == "./tiny2" and "'model': './tiny2'" in r.facts["model"].text
    # a command without --model: only the engine's config names vLLM's default (the replaying vLLM's profile)
    r = parse_lines([
        "(APIServer pid=1) INFO 12-01 18:02:55 [utils.py:238] non-default args: {'tensor_parallel_size': 2, 'port': 1}",
        "(EngineCore_DP0 pid=2) INFO 12-01 18:02:55 [core.py:93] Initializing a V1 LLM engine (v0.19.1) with config: "
        "model='google/gemma-4-31B-it', speculative_config=None, tokenizer='google/gemma-4-31B-it', max_seq_len=262144",
    ])
    assert (r.facts["model"].value, r.facts["model"].line_no) == ("google/gemma-4-31B-it", 2)
    # V0's Namespace: `vllm serve M` puts M in model_tag
    r = _parse("INFO 09-20 10:00:01 api_server.py:496] args: Namespace(model_tag='meta-llama/Llama-3.1-8B-Instruct', "
               "model='meta-llama/Llama-3.1-8B-Instruct', port=8000)")
    assert r["model"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert _parse("INFO 12-01 15:27:36 [launcher.py:1] vLLM server version 0.32.0, serving model ./tiny2")["model"] == \
        "./tiny2"


def test_version_word_outside_the_banner_is_ignored():
    r = _parse(
        "(APIServer pid=1) INFO 03-05 10:00:01 [utils.py:282]   █▄█▀ █     █     █     █  model   meta-llama/Llama-3.1-8B-Instruct",
        "WARNING 03-05 10:00:02 [config.py:10] transformers version 4.57.1",
        "INFO 03-05 10:00:02 [x.py:1] Using the torch version 2.9.0",
        "See https://example/version 12",
    )
    assert "vllm_version" not in r


def test_first_version_wins():
    r = _parse(
        "INFO 03-20 10:00:01 [api_server.py:981] vLLM API server version 0.8.1",
        "INFO 03-20 10:00:08 [core.py:61] Initializing a V1 LLM engine (v0.8.2) with config: model='m', max_seq_len=4096,",
    )
    assert r["vllm_version"] == "0.8.1"


def test_autofit_full_context_fits():
    r = _parse("(EngineCore pid=88) INFO 11-20 10:00:44 [kv_cache_planning.py:1400] Auto-fit max_model_len: full model context length 32768 fits in available KV cache memory (5.1 GiB GPU)")
    assert r["autofit_max_model_len"] == 32768 and "autofit_from" not in r
    assert ceiling_from(r) == (32768, "autofit")


def test_v021_cuda_graph_estimate_and_starting_server():
    r = _parse(
        "(EngineCore pid=2210) INFO 05-16 10:00:44 [gpu_model_runner.py:6143] Estimated CUDA graph memory: 0.61 GiB total",
        "(EngineCore pid=2210) INFO 05-16 10:00:44 [gpu_worker.py:463] Available KV cache memory: 5.1 GiB",
        "(EngineCore pid=2390) INFO 05-16 10:08:44 [kv_cache_utils.py:1710] GPU KV cache size: 41,776 tokens",
        "(APIServer pid=2330) INFO 05-16 10:09:00 [api_server.py:617] Starting vLLM server on http://0.0.0.0:8000",
    )
    assert r["cuda_graph_estimated_gib"] == 0.61
    assert r["available_kv_gib"] == 5.1
    assert r["kv_cache_tokens"] == 41776
    assert r["listen_url"] == "http://0.0.0.0:8000"


def test_v033_model_s_and_merged_kv_line():
    r = _parse(
        "(EngineCore pid=88) INFO 11-20 10:00:44 [kv_cache_utils.py:1148] GPU KV cache size: 41,776 tokens, Maximum concurrency for 41,776 tokens per request: 1.00x"
    )
    assert (r["kv_cache_tokens"], r["max_concurrency_tokens"], r["max_concurrency"]) == (41776, 41776, 1.0)
    r = _parse(
        "(EngineCore pid=88) ValueError: To serve at least one request with the model's max seq len (131072), (16.0 GiB KV cache is needed, which is larger than the available KV cache memory (5.1 GiB). Based on the available memory, the estimated maximum model length is 41776. Try increasing `gpu_memory_utilization` (which also controls CPU memory on the CPU backend) or decreasing `max_model_len` when initializing the engine. See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
    )
    assert (r["max_model_len_requested"], r["estimated_max_model_len"]) == (131072, 41776)
    assert r["error_kind"] == "kv_cache_insufficient"


def test_kv_cache_device_words():
    assert _parse("CPU KV cache size: 2,248,576 tokens, Maximum concurrency for 32,768 tokens per request: 68.62x")["kv_cache_device"] == "CPU"
    assert _parse("XPU KV cache size: 1,024 tokens")["kv_cache_device"] == "XPU"
    r = _parse("GPU + host KV cache size: 100,000 tokens, Maximum concurrency for 10,000 tokens per request: 10.00x")
    assert (r["kv_cache_device"], r["kv_cache_tokens"]) == ("GPU + host", 100000)
    r = _parse("[kv_cache_utils.py:1] KV cache size: 512 tokens")
    assert r["kv_cache_tokens"] == 512 and "kv_cache_device" not in r


def test_thousands_separators():
    r = _parse("GPU KV cache size: 2,042,016 tokens", "Maximum concurrency for 1,048,576 tokens per request: 1.95x")
    assert r["kv_cache_tokens"] == 2042016
    assert r["max_concurrency_tokens"] == 1048576
    assert r["max_concurrency"] == 1.95


def test_block_line_variants():
    assert _parse("# cuda blocks: 5148, # CPU blocks: 9362")["gpu_blocks"] == 5148
    r = _parse("INFO 09-20 10:00:15 cpu_executor.py:1] # CPU blocks: 2730")
    assert r["cpu_blocks"] == 2730 and "gpu_blocks" not in r and r["outcome"] == "ready"
    r = _parse("INFO 01-01 00:00:00 [executor_base.py:111] # CPU blocks: 2730, # CPU blocks: 0")
    assert r["cpu_blocks"] == 2730 and "gpu_blocks" not in r


def test_cpu_backend_auto_and_explicit_set():
    r = _parse("(Worker pid=9) INFO 05-16 10:00:30 [cpu_worker.py:211] Auto set (25.73/62.79) GiB for KV cache on node 0, with 57.77 GiB requested memory for the worker. 32.04 GiB memory was consumed by non-kv usages.")
    assert (r["cpu_kv_gib"], r["cpu_node_total_gib"], r["cpu_worker_requested_gib"], r["cpu_non_kv_gib"]) == (25.73, 62.79, 57.77, 32.04)
    assert r["available_kv_gib"] == 25.73
    r = _parse("Explicitly set (1.0/9.09) GiB for KV cache on node 0.")
    assert (r["cpu_kv_gib"], r["available_kv_gib"]) == (1.0, 1.0)
    assert "cpu_worker_requested_gib" not in r
    # A real "Available KV cache memory" line is the better source and replaces the CPU value.
    parser = parse_lines(["Explicitly set (1.0/9.09) GiB for KV cache on node 0.", "Available KV cache memory: 0.98 GiB"])
    assert parser.result()["available_kv_gib"] == 0.98
    assert parser.provenance()["available_kv_gib"]["line"] == 2
    r = _parse("Available KV cache memory: 0.98 GiB", "Explicitly set (1.0/9.09) GiB for KV cache on node 0.")
    assert r["available_kv_gib"] == 0.98


def test_cpu_kvcache_space_warnings():
    assert _parse("WARNING 01-20 10:00:02 [cpu.py:158] VLLM_CPU_KVCACHE_SPACE not set. Using 31.5 GiB for KV cache.")["cpu_kvcache_space_gib"] == 31.5
    r = _parse("WARNING 05-10 10:00:02 [cpu.py:110] Environment variable VLLM_CPU_KVCACHE_SPACE (GiB) for CPU backend is not set, using 4 by default.")
    assert r["cpu_kvcache_space_gib"] == 4
    assert "available_kv_gib" not in r


def test_ansi_escapes_real_and_caret():
    line = "\x1b[0;36m(EngineCore_DP0 pid=1)\x1b[0;0m \x1b[32mINFO\x1b[0m 01-27 00:31:59 \x1b[90m[gpu_worker.py:1]\x1b[0m Available KV cache memory: 5.23 GiB"
    parser = parse_lines([line])
    assert parser.result()["available_kv_gib"] == 5.23
    assert "\x1b" not in parser.facts["available_kv_gib"].text
    caret = "^[[0;36m(EngineCore_DP0 pid=70073)^[[0;0m INFO 01-27 00:31:44 [cuda.py:351] Using FLASH_ATTN attention backend out of potential backends: ('FLASH_ATTN', 'TRITON_ATTN')"
    parser = parse_lines([caret])
    assert parser.result()["attention_backend"] == "FLASH_ATTN"
    assert "^[" not in parser.facts["attention_backend"].text


def test_docker_compose_journald_quote_and_backtick_prefixes():
    r = _parse(
        "> qwen3-8b-1   | (APIServer pid=1) INFO 08-06 10:08:29 [utils.py:233] non-default args: {'model': 'm', 'max_model_len': 16384}",
        "авг 18 14:15:02 llm python3[28145]: (Worker_TP0 pid=28145) INFO 08-18 14:15:02 [gpu_worker.py:475] Available KV cache memory: 5.35 GiB",
        "vllm-1  | (EngineCore pid=28059) INFO 08-18 14:15:02 [kv_cache_utils.py:1733] GPU KV cache size: 215,401 tokens",
        "2025-08-18T14:15:02.123456Z (EngineCore pid=1) INFO 08-18 14:15:02 [kv_cache_utils.py:1734] Maximum concurrency for 8,192 tokens per request: 26.29x",
    )
    assert r["non_default_args"] == {"model": "m", "max_model_len": 16384}
    assert r["available_kv_gib"] == 5.35
    assert r["kv_cache_tokens"] == 215401
    assert r["max_concurrency"] == 26.29
    r = _parse(
        "`(APIServer pid=1) INFO 06-12 10:00:01 [utils.py:1] non-default args: {'model': 'm', 'max_model_len': 8192}`",
        "`INFO 06-12 10:00:47 [gpu_worker.py:227] Available KV cache memory: 5.23 GiB`",
    )
    assert r["non_default_args"] == {"model": "m", "max_model_len": 8192}
    assert r["available_kv_gib"] == 5.23


def test_attention_backend_forms():
    assert _parse("INFO [cuda.py:282] Using XFormers backend.  ")["attention_backend"] == "XFormers"
    assert _parse("INFO [cuda.py:1] Using AttentionBackendEnum.FLASH_ATTN backend.")["attention_backend"] == "FLASH_ATTN"
    assert _parse("INFO [cuda.py:1] Using FLASHINFER backend.")["attention_backend"] == "FLASHINFER"
    assert _parse("INFO [cuda.py:1] Using Torch SDPA backend.")["attention_backend"] == "Torch SDPA"
    assert _parse("INFO [cuda.py:1] Using FlashInfer backend on V1 engine by default for Blackwell (SM 10.0) GPUs.")["attention_backend"] == "FlashInfer"
    assert _parse("INFO 01-27 00:31:44 [cuda.py:351] Using FLASH_ATTN attention backend out of potential backends: ['FLASH_ATTN', 'TRITON_ATTN'].")["attention_backend"] == "FLASH_ATTN"
    # Not the attention backend: MoE kernel line without a period, ViT encoder, MoE oracle.
    assert "attention_backend" not in _parse("INFO 01-27 00:31:44 [mxfp4.py:165] Using Triton backend")
    assert "attention_backend" not in _parse("INFO [mm.py:1] Using backend TORCH_SDPA for vit attention")
    assert "attention_backend" not in _parse("INFO [oracle.py:1] Using 'FLASHINFER_CUTLASS' NvFp4 MoE backend out of potential backends: ['A'].")
    assert "attention_backend" not in _parse("INFO [fused_moe.py:1] Using FlashInfer MoE backend.")


def test_strong_backend_line_beats_earlier_generic_one_and_first_generic_wins():
    r = _parse(
        "INFO [cuda.py:1] Using Flash Attention backend on V1 engine.",
        "INFO [cuda.py:2] Using FLEX_ATTENTION attention backend out of potential backends: ['FLEX_ATTENTION']",
        "INFO [cuda.py:3] Using FLASH_ATTN attention backend out of potential backends: ['FLASH_ATTN']",
    )
    assert r["attention_backend"] == "FLEX_ATTENTION"
    r = _parse("Using XFormers backend.", "Using Flash Attention backend.")
    assert r["attention_backend"] == "XFormers"


def test_attention_fallback_reason_is_not_fatal():
    parser = parse_lines([
        "ERROR 03-19 11:53:56 [fa_utils.py:1] Cannot use FA version 2 is not supported due to FA2 is only supported on devices with compute capability >= 8",
    ])
    r = parser.result()
    assert r["outcome"] == "incomplete" and not parser.fatal
    assert r["attention_fallback_reason"] == "Cannot use FA version 2 is not supported due to FA2 is only supported on devices with compute capability >= 8"
    assert r["warning_kinds"] == ["fa2_unavailable_low_cc"]
    assert "error_kind" not in r


def test_non_default_args_with_enum_repr_falls_back_to_pairs():
    r = _parse(
        "(APIServer pid=1) INFO 01-01 00:00:00 [utils.py:1] non-default args: {'model': 'm', 'attention_backend': <AttentionBackendEnum.FLASH_ATTN: 'FLASH_ATTN'>, 'max_model_len': 131072, 'served_model_name': ['a', 'b'], 'gpu_memory_utilization': 0.85, 'trust_remote_code': True}"
    )
    args = r["non_default_args"]
    assert args["model"] == "m"
    assert args["max_model_len"] == 131072
    assert args["served_model_name"] == ["a", "b"]
    assert args["gpu_memory_utilization"] == 0.85
    assert args["trust_remote_code"] is True
    assert args["attention_backend"] == "<AttentionBackendEnum.FLASH_ATTN: 'FLASH_ATTN'>"
    json.dumps(r, allow_nan=False)


def test_non_default_args_cut_line_keeps_complete_pairs():
    r = _parse("non-default args: {'model': 'm, with comma', 'max_model_len': 4096, 'override': {'a': 1}, 'gpu_mem")
    assert r["non_default_args"] == {"model": "m, with comma", "max_model_len": 4096, "override": {"a": 1}}


def test_non_default_args_odd_literals_are_json_safe():
    r = _parse("non-default args: {'t': (1, 2), 's': {3}, 'b': b'x', 'big': 1e999, 7: None}")
    assert r["non_default_args"] == {"t": [1, 2], "s": [3], "b": "x", "big": "inf", "7": None}
    json.dumps(r, allow_nan=False)


def test_max_model_len_requested_only_from_refusals():
    r = _parse(
        "non-default args: {'max_model_len': 131072}",
        "args: Namespace(max_model_len=131072)",
        "Using max model len 131072",
        "Initializing a V1 LLM engine (v0.9.1) with config: model='m', max_seq_len=131072,",
    )
    assert "max_model_len_requested" not in r
    assert r["max_model_len_resolved"] == 131072 and r["max_seq_len_engine"] == 131072


def test_user_specified_above_derived_and_mamba_are_fatal_with_numbers():
    r = _parse(
        "ValueError: User-specified max_model_len (262144) is greater than the derived max_model_len (max_position_embeddings=131072 or model_max_length=None in model's config.json). To allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1."
    )
    assert (r["outcome"], r["error_kind"], r["derived_max_model_len"]) == ("error", "max_model_len_above_derived", 131072)
    # The config-time refusal names the requested length (fixture 113) and the config key.
    assert (r["max_model_len_requested"], r["derived_max_model_len_key"]) == (262144, "max_position_embeddings")
    r = _parse("  Value error, User-specified max_model_len (262144) is greater than the derived max_model_len (max_position_embeddings=131072.0 or model_max_length=None in model's config.json).")
    assert r["derived_max_model_len"] == 131072
    warning = _parse("WARNING [model.py:1] User-specified max_model_len (262144) is greater than the derived max_model_len (max_position_embeddings=131072 or model_max_length=None in model's config.json). This may lead to incorrect model outputs or CUDA errors. Make sure the value is correct and within the model context size.")
    assert warning["outcome"] == "incomplete"
    r = _parse("ValueError: max_num_seqs (256) exceeds available Mamba cache blocks (196).")
    assert (r["error_kind"], r["max_num_seqs_refused"], r["mamba_cache_blocks"]) == ("mamba_cache_blocks", 256, 196)


def test_free_memory_below_gmu_numbers():
    r = _parse("(Worker_TP0 pid=1) ValueError: Free memory on device cuda:0 (6.2/23.58 GiB) on startup is less than desired GPU memory utilization (0.9, 21.22 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.")
    assert (r["error_kind"], r["startup_free_gib"], r["startup_total_gib"]) == ("free_memory_below_gmu", 6.2, 23.58)


# ---------------------------------------------------------------------------
# Outcome and error_kind rules
# ---------------------------------------------------------------------------


def test_engine_died_alone_then_replaced_by_later_cause():
    parser = BootLogParser()
    parser.feed("(EngineCore_DP0 pid=1) ERROR 10-23 08:05:13 [core.py:708] EngineCore failed to start.")
    assert parser.outcome == "error" and parser.fatal and not parser.refused
    assert parser.result()["error_kind"] == "engine_died"
    new = parser.feed("(EngineCore_DP0 pid=1) ERROR 10-23 08:05:13 [core.py:708] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.")
    assert [f.key for f in new if f.key != "exception"] == ["error_kind"]
    assert parser.result()["error_kind"] == "cuda_oom"
    parser.feed("RuntimeError: Engine core initialization failed. See root cause above.")
    parser.feed("ValueError: No available memory for the cache blocks.")  # later causes do not replace the first
    assert parser.result()["error_kind"] == "cuda_oom"
    assert parser.provenance()["error_kind"]["line"] == 2


def test_refusal_beats_errors_and_flags_at_once():
    parser = BootLogParser()
    parser.feed("INFO 06-12 10:00:47 [gpu_worker.py:227] Available KV cache memory: 5.23 GiB")
    assert not parser.refused and not parser.fatal
    parser.feed("ERROR 06-12 10:00:47 [core.py:515] EngineCore failed to start.")
    assert parser.fatal and not parser.refused
    parser.feed("ERROR [core.py:515] ValueError: To serve at least one request with the models's max seq len (131072), (16.00 GiB KV cache is needed, which is larger than the available KV cache memory (5.23 GiB). Based on the available memory, the estimated maximum model length is 42832. Try increasing")
    assert parser.refused and parser.fatal and parser.outcome == "refused"
    assert parser.result()["error_kind"] == "kv_cache_insufficient"


def test_v0_blocks_then_refusal_is_refused():
    r = _parse("# GPU blocks: 1478, # CPU blocks: 2048", "The model's max seq len (29000) is larger than the maximum number of tokens that can be stored in KV cache (23648). Try")
    assert r["outcome"] == "refused"


def test_ready_sources():
    for line in (
        "INFO:     Uvicorn running on http://0.0.0.0:8000 (Press CTRL+C to quit)",
        "INFO 02-21 10:01:02 api_server.py:958] Starting vLLM API server on http://0.0.0.0:8000",
        "(APIServer pid=1) INFO:     Application startup complete.",
        'INFO:     127.0.0.1:41950 - "POST /v1/completions HTTP/1.1" 500 Internal Server Error',
        "GPU KV cache size: 1,024 tokens",
        "# GPU blocks: 10, # CPU blocks: 0",
    ):
        assert _parse(line)["outcome"] == "ready", line
    assert _parse("INFO:     Uvicorn running on http://0.0.0.0:8000 (Press CTRL+C to quit)")["listen_url"] == "http://0.0.0.0:8000"
    # A log that ends on an ERROR line (fixture 116) is an error; the line is the stated cause.
    ended = _parse("ERROR 01-01 [x.py:1] something broke")
    assert ended["outcome"] == "error" and "error_kind" not in ended
    assert _parse("ERROR 01-01 [x.py:1] something broke", "INFO 01-01 [x.py:2] going on")["outcome"] == "incomplete"
    assert _parse()["outcome"] == "incomplete"


def test_fatal_after_server_ready_is_request_time():
    parser = parse_lines([
        "(APIServer pid=1) INFO 01-01 [api_server.py:1] Starting vLLM server on http://0.0.0.0:8000",
        "(EngineCore pid=2) ERROR 01-01 [core.py:1] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB",
    ])
    r = parser.result()
    assert r["outcome"] == "ready" and "error_kind" not in r and not parser.fatal
    assert r["post_ready_error_kind"] == "cuda_oom"


def test_feed_returns_only_new_facts():
    parser = BootLogParser()
    line = "Maximum concurrency for 100,000 tokens per request: 2.31x"
    new = parser.feed(line)
    assert {f.key for f in new} == {"max_concurrency", "max_concurrency_tokens"}
    assert all(isinstance(f, Fact) and f.line_no == 1 for f in new)
    assert parser.feed(line) == []
    assert parser.feed("") == []
    assert parser.line_count == 3


def test_text_window_shows_the_value_on_long_lines():
    prefix = "x" * 1000
    parser = parse_lines([prefix + " ValueError: To serve at least one request with the model's max seq len (131072),"
                          " (16.0 GiB KV cache is needed, which is larger than the available KV cache memory (7.77 GiB). "
                          + "y" * 1000])
    fact = parser.facts["refusal_available_kv_gib"]
    assert len(fact.text) == TEXT_MAX and "7.77" in fact.text
    short = parse_lines(["Available KV cache memory: 7.77 GiB"]).facts["available_kv_gib"]
    assert short.text == "Available KV cache memory: 7.77 GiB"


def test_bytes_nul_and_invalid_utf8():
    parser = BootLogParser()
    parser.feed(b"\xff\xfeAvail\x00able KV cache memory: 3.5 GiB\r\n")
    assert parser.result()["available_kv_gib"] == 3.5
    parser.feed("lone surrogate \udcff Using XFormers backend.")
    json.dumps(parser.provenance(), ensure_ascii=False).encode("utf-8")
    assert parser.internal_errors == 0


def test_result_is_a_copy():
    parser = parse_lines(["non-default args: {'model': 'm'}"])
    parser.result()["non_default_args"]["model"] = "changed"
    assert parser.result()["non_default_args"] == {"model": "m"}


# ---------------------------------------------------------------------------
# ceiling_from
# ---------------------------------------------------------------------------


def test_ceiling_each_source():
    assert ceiling_from({"estimated_max_model_len": 42832, "kv_cache_max_tokens": 1, "autofit_max_model_len": 2}) == (42832, "estimate")
    assert ceiling_from({"kv_cache_max_tokens": 23648, "max_model_len_requested": 29000}) == (23648, "v0_kv_capacity")
    assert ceiling_from({"autofit_max_model_len": 130944, "autofit_from": 1048576}) == (130944, "autofit")
    assert ceiling_from({}) == (None, "none")
    assert ceiling_from({"outcome": "ready", "kv_cache_tokens": 42832}) == (None, "none")


def test_ceiling_computed_from_gib_by_hand():
    result = {"max_model_len_requested": 131072, "kv_needed_gib": 16.0, "refusal_available_kv_gib": 5.23}
    # 5.23 / 16 = 0.326875; x 131072 = 42844.16 tokens; / 16 = 2677.76 blocks -> 2677 -> 2677 * 16.
    assert 2677 * 16 == 42832
    assert ceiling_from(result) == (42832, "computed_from_gib")
    # From fixture 006's numbers (the log also prints the estimate 122080):
    # 5.59 / 10.12 * 221000 = 122073.12...; / 16 = 7629.57 -> 7629 * 16 = 122064 (block-rounded, below 122080).
    assert ceiling_from({"max_model_len_requested": 221000, "kv_needed_gib": 10.12, "refusal_available_kv_gib": 5.59}) == (122064, "computed_from_gib")


def test_ceiling_computed_is_exact_on_printed_decimals():
    # 0.3 / 0.1 * 160 / 16 = 30 exactly; in binary floating point 0.3 / 0.1 = 2.9999999999999996.
    assert math.floor(0.3 / 0.1 * 160 / 16) == 29
    assert ceiling_from({"max_model_len_requested": 160, "kv_needed_gib": 0.1, "refusal_available_kv_gib": 0.3}) == (480, "computed_from_gib")
    # Nothing fits: 0 tokens, still "computed".
    assert ceiling_from({"max_model_len_requested": 16, "kv_needed_gib": 16.0, "refusal_available_kv_gib": 0.01}) == (0, "computed_from_gib")


def test_ceiling_ignores_garbage():
    assert ceiling_from({"estimated_max_model_len": "42832"}) == (None, "none")
    assert ceiling_from({"estimated_max_model_len": True}) == (None, "none")
    assert ceiling_from({"max_model_len_requested": 131072, "kv_needed_gib": 0.0, "refusal_available_kv_gib": 5.0}) == (None, "none")
    assert ceiling_from({"max_model_len_requested": 131072, "kv_needed_gib": float("nan"), "refusal_available_kv_gib": 5.0}) == (None, "none")
    assert ceiling_from(None) == (None, "none")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------
# parse_file: bounded memory
# ---------------------------------------------------------------------------


def test_parse_file_cuts_long_lines_with_bounded_memory(tmp_path: Path):
    path = tmp_path / "huge.log"
    with open(path, "wb") as handle:
        handle.write(b"Available KV cache memory: 1.25 GiB " + b"z" * (12 << 20) + b"\n")  # 12 MiB line
        handle.write(b"GPU KV cache size: 1,024 tokens\n")
        handle.write(b"q" * (12 << 20))  # last line, no newline
    assert path.stat().st_size > 24 << 20
    tracemalloc.start()
    try:
        parser = parse_file(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"peak {peak} bytes: the file was not streamed"
    assert parser.line_count == 3
    assert parser.facts["available_kv_gib"].line_no == 1
    assert parser.facts["kv_cache_tokens"].line_no == 2
    assert parser.outcome == "ready"


# ---------------------------------------------------------------------------
# Robustness (fuzzing)
# ---------------------------------------------------------------------------

_REAL_LINES = sorted({
    line
    for log in FIXTURES.glob("*.log")
    for line in log.read_text(encoding="utf-8", errors="replace").split("\n")
    if line.strip()
})


@st.composite
def _mangled_real_line(draw):
    line = draw(st.sampled_from(_REAL_LINES))
    cut = draw(st.integers(min_value=0, max_value=len(line)))
    head = line[:cut]
    insert = draw(st.sampled_from(["", "\x00", "\r", "\x1b[0;36m", "^[[0m", "\ufffd", "\n", "{", "'", "(", ",", "9" * 40,
                                   '{"', '{"MESSAGE": "', '"}', "&#39;", "&gt;", "<pre>", "</code>"]))
    at = draw(st.integers(min_value=0, max_value=len(head)))
    return head[:at] + insert + head[at:]


_ANY_LINE = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=300),
    st.text(alphabet=st.sampled_from("0123456789.,() {}[]'\":=x#-\x00\r\n\x1b^█"), max_size=500),
    _mangled_real_line(),
    st.builds(lambda s, n: s * n, _mangled_real_line(), st.integers(min_value=1, max_value=40)),
    st.builds(lambda n: "9" * n, st.integers(min_value=1, max_value=6000)),
    st.builds(lambda n: "non-default args: {" + "[" * n, st.integers(min_value=1, max_value=3000)),
    # JSON log records (issue 20): journald's, vLLM's own, and the first row of one cut by a wrap
    st.builds(lambda line: json.dumps({"MESSAGE": line}), _mangled_real_line()),
    st.builds(lambda line, n: json.dumps({"levelname": "ERROR", "message": line, "exc_info": line})[:n],
              _mangled_real_line(), st.integers(min_value=1, max_value=400)),
)


def _check_robust(lines: list) -> None:
    parser = BootLogParser()
    for line in lines:
        new = parser.feed(line)
        assert isinstance(new, list)
    assert parser.internal_errors == 0
    result = parser.result()
    json.dumps(result, allow_nan=False)
    json.dumps(parser.provenance(), allow_nan=False, ensure_ascii=False).encode("utf-8")
    assert result["outcome"] in ("ready", "refused", "error", "incomplete")
    assert set(parser.provenance()) == set(result) - {"outcome", "implausible"}
    assert all(len(f.text) <= TEXT_MAX for f in parser.facts.values())
    value, source = ceiling_from(result)
    assert source in ("estimate", "v0_kv_capacity", "computed_from_gib", "autofit", "none")
    assert value is None or (isinstance(value, int) and value >= 0)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(_ANY_LINE, max_size=20))
def test_fuzz_feed_never_raises(lines):
    _check_robust(lines)


@pytest.mark.slow
@settings(max_examples=100_000, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(_ANY_LINE, max_size=20))
def test_fuzz_feed_never_raises_slow(lines):
    _check_robust(lines)


def test_very_long_lines_are_fast_enough():
    import time

    lines = [
        "We couldn't connect to " * 40000,
        "non-default args: {" + "'a': 1, " * 100000,
        "OSError: " + "x " * 400000,
        "Using " + "a " * 400000 + " backend.",
        "█" * 100000 + " version " * 50000,
    ]
    start = time.perf_counter()
    parser = parse_lines(lines)
    assert time.perf_counter() - start < 10
    assert parser.internal_errors == 0
