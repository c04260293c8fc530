"""analysis/ranks.py: with TP/PP, available KV is per rank (as vLLM prints it), the total is ranks x it,
and KV tokens are the model's (not multiplied)."""
from autotune.analysis import ranks
from autotune.store.record import BootFacts
from tests.helpers.compare_records import typed


def test_single_rank_gives_nothing_to_split():
    assert ranks.kv_by_rank(["vllm", "serve", "m"], BootFacts.from_dict({"available_kv_gib": 0.12})) is None


def test_tensor_parallel_two_gives_per_rank_and_total_and_says_which_is_which():
    # The TP=2 run on vLLM CPU: each rank printed 0.12 GiB; 32,768 tokens fit in both together.
    got = ranks.kv_by_rank(["python", "-m", "vllm.entrypoints.openai.api_server", "--tensor-parallel-size", "2"],
                           BootFacts.from_dict({"available_kv_gib": 0.12, "kv_cache_tokens": 32_768}))
    assert (got["ranks"], got["available_kv_gib_per_rank"], got["available_kv_gib_total"]) == (2, 0.12, 0.24)
    assert got["kv_cache_tokens"] == 32_768 and "not multiplied" in got["note"]
    assert ranks.describe(got) == "0.12 GiB available per rank x 2 ranks (TP 2) = 0.24 GiB in all"


def test_sizes_come_from_short_flags_or_from_vllms_non_default_args():
    assert ranks.parallel_sizes(["vllm", "serve", "m", "-tp", "4", "-pp", "2"]) == (4, 2)
    assert ranks.parallel_sizes(["vllm", "serve", "m", "--tensor-parallel-size=2"]) == (2, 1)
    facts = {"non_default_args": {"tensor_parallel_size": 2, "pipeline_parallel_size": 2}, "available_kv_gib": 1.5}
    got = ranks.kv_by_rank(["my-wrapper.sh"], BootFacts.from_dict(facts))
    assert got["ranks"] == 4 and got["available_kv_gib_total"] == 6.0
    assert ranks.describe(got).endswith("(TP 2 x PP 2) = 6.0 GiB in all")


def test_the_summary_says_which_figure_is_per_rank_and_which_is_the_total():
    from autotune.cli.summary import render_summary

    record = {"run_id": "r2", "target": 65_536, "links": {"reproduces": "r1"},
              "attempts": [{"index": 1, "max_model_len": 32_640, "outcome": "verified"}],
              "result": {"verdict": "verified", "verified": True, "ceiling": 32_640, "available_kv_gib": 0.12,
                         "kv_cache_tokens": 32_768,
                         "ranks": ranks.kv_by_rank(["vllm", "serve", "m", "-tp", "2"],
                                                   BootFacts.from_dict({"available_kv_gib": 0.12,
                                                                        "kv_cache_tokens": 32_768}))}}
    text = render_summary(typed(record))
    assert "KV cache: 0.12 GiB available per rank x 2 ranks (TP 2) = 0.24 GiB in all" in text
    assert "32,768 tokens across all ranks (each holds its share of every token)" in text
    assert "reproduces r1" in text
