"""The second witness (server/witness.py): /metrics' KV pool beside the log's figures and the
command's settings; a disagreement is a warning on the card. The real figures: a vLLM 0.32
CPU server's /metrics (tests/fixtures/metrics/) and the log line of the same boot,
'CPU KV cache size: 16,384 tokens, Maximum concurrency for 8,192 tokens per request: 2.00x'."""

import json
import os
import sys

import pytest
from click.testing import CliRunner

from autotune.cli import cli
from autotune.cli.summary import render_summary
from autotune.server import metrics, witness
from tests.helpers.compare_records import typed
from tests.helpers.paths import FIXTURES_DIR

FIXTURE = FIXTURES_DIR / "metrics" / "cpu-0.32.0-tiny-llama.txt"
REAL_LOG_FACTS = {"kv_cache_tokens": 16384, "max_concurrency": 2.0}
REAL_ARGV = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m", "--kv-cache-memory-bytes",
             "128M", "--max-model-len", "8192"]


def real_config():
    return metrics.parse(FIXTURE.read_text()).cache_config


def test_the_real_032_servers_metrics_agree_with_its_log_and_command():
    asked = witness.asked(REAL_ARGV, "0.32.0")
    assert asked == {"gmu": 0.92, "gmu_source": "vLLM 0.32.0's default", "kv_cache_memory_bytes": 128 * 2**20}
    assert witness.disagreements(real_config(), REAL_LOG_FACTS, asked) == []


@pytest.mark.parametrize("facts,argv,figure,text", [
    ({"kv_cache_tokens": 16256}, REAL_ARGV, "kv_cache_size_tokens",
     "KV cache size (tokens): 16,256 in the log, 16,384 in /metrics"),
    ({"max_concurrency": 1.98}, REAL_ARGV, "kv_cache_max_concurrency", "maximum concurrency: 1.98 in the log, 2 in /metrics"),
    ({"engine_num_gpu_blocks": 127}, REAL_ARGV, "num_gpu_blocks", "KV cache blocks: 127 in the log, 128 in /metrics"),
    ({}, [*REAL_ARGV, "--gpu-memory-utilization", "0.5"], "gpu_memory_utilization",
     "--gpu-memory-utilization: 0.5 in the command, 0.92 in /metrics"),
    ({}, [*REAL_ARGV, "--kv-cache-memory-bytes", "1G"], "kv_cache_memory_bytes",
     "--kv-cache-memory-bytes: 1,073,741,824 in the command, 134,217,728 in /metrics"),
])
def test_each_figure_both_carry_is_held_against_the_other(facts, argv, figure, text):
    (found,) = witness.disagreements(real_config(), facts, witness.asked(argv, "0.32.0"))
    assert (found["figure"], found["text"]) == (figure, text)


def test_the_command_s_size_is_read_as_vllm_reads_it():
    # 128m is 128,000,000 bytes to vLLM, not the 128 MiB its /metrics shows for 128M
    asked = witness.asked([*REAL_ARGV[:-2], "--kv-cache-memory-bytes", "128m"], "0.32.0")
    assert asked["kv_cache_memory_bytes"] == 128_000_000
    (found,) = witness.disagreements(real_config(), {}, asked)
    assert found["text"] == "--kv-cache-memory-bytes: 128,000,000 in the command, 134,217,728 in /metrics"


def test_the_logs_two_decimals_are_not_a_disagreement_and_an_unknown_side_is_not_compared():
    config = metrics.parse('vllm:cache_config_info{block_size="16",kv_cache_max_concurrency="1.5333",'
                           'num_gpu_blocks="100"} 1.0\n').cache_config
    assert witness.disagreements(config, {"max_concurrency": 1.53, "kv_cache_tokens": 999}, {"gmu": None}) == []


def test_a_server_without_metrics_is_recorded_as_such():
    found = witness.read(1, {}, REAL_ARGV, "0.32.0")  # port 1: nothing listens
    assert found["read"] is False and found["why"].startswith("GET /metrics")


def _fake(*flags):
    return [sys.executable, "-m", "autotune.testing.fake_vllm", "--time-scale", "0.002", *flags]


def test_every_verified_boot_of_the_replaying_vllm_keeps_an_agreeing_witness():
    result = CliRunner().invoke(cli, ["tune", "--json", "--quiet", "--target", "32768", "--probe", "none", "--",
                                      *_fake("--profile", "v1-0.33.0", "--kv-cache-memory-bytes", "2G")],
                                catch_exceptions=False)
    record = json.loads(result.output[result.output.index("{"):])
    seen = record["attempts"][-1]["metrics"]
    assert seen["read"] is True and seen["disagreements"] == []
    assert seen["cache_config"]["kv_cache_size_tokens"] == record["attempts"][-1]["facts"]["kv_cache_tokens"]
    assert seen["cache_config"]["kv_cache_memory_bytes"] == 2 << 30
    assert "/metrics" not in render_summary(typed(record))


def test_a_wrapper_that_changes_gmu_is_caught_by_the_witness(tmp_path):
    """The command asks 0.9; a wrapper script hands vLLM 0.8: /metrics says what the engine runs with."""
    script = tmp_path / "serve.sh"
    script.write_text(f'#!/bin/sh\nexec {sys.executable} -m autotune.testing.fake_vllm "$@" '
                      '--gpu-memory-utilization 0.8\n')
    os.chmod(script, 0o755)
    result = CliRunner().invoke(cli, ["tune", "--json", "--quiet", "--target", "8192", "--probe", "none", "--",
                                      str(script), "--profile", "v1-0.33.0", "--time-scale", "0.002",
                                      "--gpu-memory-utilization", "0.9"], catch_exceptions=False)
    record = json.loads(result.output[result.output.index("{"):])
    (found,) = record["attempts"][-1]["metrics"]["disagreements"]
    assert (found["figure"], found["asked"], found["metrics"]) == ("gpu_memory_utilization", 0.9, 0.8)
    card = render_summary(typed(record))
    assert "vLLM's /metrics disagrees with --gpu-memory-utilization: 0.9 in the command, 0.8 in /metrics" in card
    assert "attempt-1.log" in card
