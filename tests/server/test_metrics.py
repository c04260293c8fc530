"""server/metrics.py: a vLLM server's /metrics read into typed figures; the replaying vLLM serves them
in its version's words. The real figures: a vLLM 0.32 CPU server's /metrics, captured whole
(tests/fixtures/metrics/cpu-0.32.0-tiny-llama.txt: tiny Llama, --kv-cache-memory-bytes 128M,
--max-model-len 8192, boot log 'CPU KV cache size: 16,384 tokens ... 8,192 tokens per request: 2.00x')."""


import pytest

from autotune.host import processes
from autotune.server import client, metrics
from autotune.testing import fake_metrics
from tests.helpers.paths import FIXTURES_DIR

FIXTURE = FIXTURES_DIR / "metrics" / "cpu-0.32.0-tiny-llama.txt"


def test_the_real_032_cpu_servers_pool_and_queue():
    figures = metrics.parse(FIXTURE.read_text())
    cache = figures.cache_config
    assert len(figures.cache_configs) == 1 and cache.engine == "0"
    assert (cache.block_size, cache.num_gpu_blocks, cache.pool_tokens) == (128, 128, 16384)
    assert (cache.kv_cache_size_tokens, cache.kv_cache_max_concurrency) == (16384, 2.0)
    assert cache.kv_cache_memory_bytes == 128 * 2**20 and cache.gpu_memory_utilization == 0.92
    assert (figures.requests_waiting, figures.requests_running) == (0.0, 0.0)
    # every label is kept as served, "None" included
    assert cache.labels["num_cpu_blocks"] == "None" and cache.labels["cache_dtype"] == "auto"
    assert figures.to_dict()["cache_config"]["pool_tokens"] == 16384


def test_waiting_by_reason_is_not_the_waiting_gauge():
    text = ('vllm:num_requests_waiting{engine="0",model_name="m"} 2.0\n'
            'vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 7.0\n')
    assert metrics.parse(text).requests_waiting == 2.0


def test_engines_of_a_data_parallel_server_are_summed_for_the_queue_and_kept_apart_for_the_pool():
    text = "".join(f'vllm:num_requests_running{{engine="{e}",model_name="m"}} 1.0\n'
                   f'vllm:cache_config_info{{block_size="16",engine="{e}",num_gpu_blocks="100"}} 1.0\n'
                   for e in "01")
    figures = metrics.parse(text)
    assert figures.requests_running == 2.0 and figures.requests_waiting is None
    assert [c.engine for c in figures.cache_configs] == ["0", "1"] and figures.cache_config.pool_tokens == 1600


def test_escaped_label_values_unset_figures_and_a_broken_line():
    text = ('# HELP vllm:cache_config_info x\n'
            'vllm:cache_config_info{a="q\\"uo\\\\te\\n",block_size="None",num_gpu_blocks="12"} 1.0\n'
            'vllm:num_requests_waiting{engine="0" 3.0\n'  # broken: skipped, the rest still read
            'vllm:num_requests_running 4.0 1700000000000\n')
    figures = metrics.parse(text)
    assert figures.cache_config.labels["a"] == 'q"uo\\te\n'
    assert figures.cache_config.block_size is None and figures.cache_config.pool_tokens is None
    assert figures.requests_waiting is None and figures.requests_running == 4.0


def test_older_versions_have_no_token_figures():
    cache = metrics.parse('vllm:cache_config_info{block_size="16",gpu_memory_utilization="0.9",'
                          'num_gpu_blocks="3821",swap_space_bytes="4294967296"} 1.0\n').cache_config
    assert cache.pool_tokens == 61136 and cache.engine is None
    assert cache.kv_cache_size_tokens is None and cache.kv_cache_memory_bytes is None


# ---- the replaying vLLM's /metrics, read through the one client -------------------------------------------

@pytest.mark.parametrize("profile, labels_absent, labels_present", [
    ("v0-0.6.4", {"engine", "kv_cache_memory_bytes", "kv_cache_size_tokens"}, {"swap_space_bytes"}),
    ("v1-0.13.0", {"kv_cache_size_tokens", "swap_space_bytes"}, {"engine", "kv_cache_memory_bytes"}),
    ("v1-0.33.0", {"swap_space_bytes"}, {"engine", "kv_cache_size_tokens", "kv_cache_max_concurrency"}),
])
def test_the_replaying_vllm_serves_its_versions_labels(fake_server, profile, labels_absent, labels_present):
    server = fake_server("--profile", profile, "--max-model-len", "8192")
    figures = metrics.read(client.plain(server.port))
    cache = figures.cache_config
    assert not labels_absent & set(cache.labels) and labels_present <= set(cache.labels)
    assert cache.block_size == 16 and cache.gpu_memory_utilization == server.boot.req.settings.gmu
    assert f"{cache.pool_tokens:,}" == server.boot.figures["tokens_c"]  # the boot's "KV cache size: N tokens"
    assert (figures.requests_waiting, figures.requests_running) == (0.0, 0.0)


def test_the_replaying_vllm_reports_its_token_figures_as_vllm_computes_them(fake_server):
    server = fake_server("--profile", "v1-0.33.0", "--max-model-len", "8000")
    cache = metrics.read(client.plain(server.port)).cache_config
    # a request of 8,000 tokens takes 500 blocks of 16: concurrency = blocks / 500
    assert cache.kv_cache_max_concurrency == pytest.approx(cache.num_gpu_blocks / 500)
    assert cache.kv_cache_size_tokens == int(cache.num_gpu_blocks / 500 * 8000)


def test_the_fake_queue_counts_running_up_to_max_num_seqs():
    queue = fake_metrics.Queue(max_num_seqs=1)
    with queue:
        assert queue.counts() == (1, 0)
        with queue:
            assert queue.counts() == (1, 1)
    assert queue.counts() == (0, 0)


def test_nothing_listening_is_metrics_unavailable():
    with pytest.raises(metrics.MetricsUnavailable, match="GET /metrics: ConnectionRefusedError"):
        metrics.read(client.plain(processes.free_port()), timeout=2)


def test_a_server_without_vllms_metrics_says_so():
    from tests.helpers.front_door_server import FrontDoorServer

    # FrontDoorServer answers /metrics 404
    with FrontDoorServer() as server, pytest.raises(metrics.MetricsUnavailable, match="answered 404"):
        metrics.read(client.plain(server.port))
