"""analysis/could_serve.py: what a running server's KV pool could serve, from its /metrics alone.

The anchor is real: vLLM 0.32's CPU backend, tiny Llama, --kv-cache-memory-bytes 128M: 128 blocks of
128 tokens (tests/fixtures/metrics/), and `--max-model-len auto` fits 16,256 on the same pool (README)."""


from autotune.analysis.could_serve import EXACT, LIKELY, UNKNOWN, could_serve
from autotune.server import metrics
from tests.helpers.paths import FIXTURES_DIR

REAL = metrics.parse((FIXTURES_DIR / "metrics" / "cpu-0.32.0-tiny-llama.txt").read_text())


def _cache(**labels):
    return metrics.CacheConfig.from_labels({k: str(v) for k, v in labels.items()})


def test_the_real_pool_serves_one_block_less_than_it_holds():
    room = could_serve(REAL.cache_config, 8192, "0.32.0")
    assert (room.pool_tokens, room.max_model_len, room.certainty) == (16384, 16256, EXACT)
    assert room.why == ("128 blocks of 128 tokens, one held back (vLLM 0.32.0 keeps a null block); every layer full "
                        "attention (one request of 8,192 tokens takes 64 blocks: kv_cache_max_concurrency 2.00)")


def test_a_length_that_is_not_a_block_multiple_is_still_recognised_as_full_attention():
    # 128 blocks / 127 per request of 16,256 tokens (the auto-fitted server)
    room = could_serve(_cache(num_gpu_blocks=128, block_size=128, kv_cache_size_tokens=16384,
                              kv_cache_max_concurrency=128 / 127), 16256, "0.32.0")
    assert (room.max_model_len, room.certainty) == (16256, EXACT)


def test_the_seed_machines_vllm_keeps_no_null_block_and_serves_no_concurrency():
    # vLLM 0.20.2: 3,822 blocks of 16 = 61,152 tokens, the seed's own estimate; no kv_cache_max_concurrency yet
    room = could_serve(_cache(num_gpu_blocks=3822, block_size=16, gpu_memory_utilization=0.98), 16384, "0.20.2")
    assert (room.pool_tokens, room.max_model_len, room.certainty) == (61152, 61152, LIKELY)
    assert "none held back (vLLM 0.20.2 checks a length against every block; from 0.29 it keeps the null block " \
           "out)" in room.why
    assert "assumes every layer is full attention" in room.why


def test_the_block_is_held_back_from_029():
    pool = _cache(num_gpu_blocks=100, block_size=16)
    assert could_serve(pool, 1024, "0.28.0").max_model_len == 100 * 16
    assert could_serve(pool, 1024, "0.29.0").max_model_len == 99 * 16


def test_an_unknown_version_is_assumed_to_hold_a_block_back():
    room = could_serve(_cache(num_gpu_blocks=100, block_size=16), 1024, None)
    assert room.max_model_len == 99 * 16 and "the version is unknown: assumed, as from vLLM 0.29" in room.why


def test_a_hybrid_pool_says_it_cannot_tell():
    # a request of 8,192 tokens taking 10 blocks, not 512: sliding-window or linear-attention layers
    room = could_serve(_cache(num_gpu_blocks=1000, block_size=16, kv_cache_size_tokens=819200,
                              kv_cache_max_concurrency=100.0), 8192, "0.33.0")
    assert (room.pool_tokens, room.max_model_len, room.certainty) == (819200, None, UNKNOWN)
    assert "takes 10 blocks, not the 512 of full attention" in room.why


def test_no_pool_figures():
    assert could_serve(None, 8192, "0.32.0").certainty == UNKNOWN
    room = could_serve(_cache(block_size=16), 8192, "0.32.0")
    assert (room.max_model_len, room.why) == (None, "no num_gpu_blocks and block_size in vllm:cache_config_info")


def test_a_sliding_window_server_accepting_more_than_its_pool_serves_only_the_pool():
    # the replaying vLLM's sliding-2xh100-gemma4-31b (vLLM 0.19.1, vllm#39734): 262,144 accepted on 4,790 blocks of
    # 16 tokens; a request longer than the 76,640-token pool waits in the queue forever (server/queue_watch.py)
    room = could_serve(_cache(num_gpu_blocks=4790, block_size=16, gpu_memory_utilization=0.9), 262144, "0.19.1")
    assert (room.pool_tokens, room.max_model_len, room.certainty) == (76640, 76640, LIKELY)
    assert "accepts 262,144, more than the pool holds" in room.why
    assert "waits in vLLM's queue forever" in room.why and "--no-scheduler-reserve-full-isl" in room.why
    assert "assumes every layer is full attention" not in room.why


def test_over_the_pool_before_0_19_or_on_an_unknown_version_cannot_tell():
    # before 0.19 the scheduler admits a prompt chunk by chunk: the request runs, and how much longer fits is unknown
    for version in ("0.18.0", None):
        room = could_serve(_cache(num_gpu_blocks=4790, block_size=16), 262144, version)
        assert (room.pool_tokens, room.max_model_len, room.certainty) == (76640, None, UNKNOWN)
        assert "accepts 262,144, more than the pool holds" in room.why


def test_a_server_of_unknown_version_serving_its_whole_pool_held_no_block_back():
    room = could_serve(_cache(num_gpu_blocks=100, block_size=16), 1600, None)
    assert (room.max_model_len, room.certainty) == (1600, LIKELY) and "none held back (it accepts them all)" in room.why
