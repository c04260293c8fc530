"""The torch.compile cache state of a boot (logparse's compile_cache), from real logs."""
import pytest

from autotune.vllm.logparse import parse_lines

LOGS = "tests/fixtures/logs/"


@pytest.mark.parametrize("name, state", [
    ("017-v014-h100-gpt-oss-120b-ansi-color-prefix", "warm"),  # "Directly load the compiled graph(s) ... from the cache"
    ("126-k8s-rfc3339-nanosecond-prefix-cudagraph-profiling-default-on", "cold"),  # "saved AOT compiled function"
    ("128-gptoss-20b-rtx3090-markdown-quoted-enginecore0-weights", "cold"),  # "Compiling a graph for dynamic shape"
    ("104-k9s-box-framed-v0-profiling-cuda-blocks-lowercase", None),  # only "torch.compile takes 28.77 s"
])
def test_compile_cache_state_of_real_logs(name, state):
    with open(LOGS + name + ".log", encoding="utf-8", errors="replace") as fh:
        assert parse_lines(fh).result().get("compile_cache") == state


def test_a_graph_compiled_after_one_loaded_makes_the_boot_cold():
    lines = ["INFO 01-27 00:32:06 [backends.py:226] Directly load the compiled graph(s) for compile range (1, 5120) "
             "from the cache, took 0.808 s",
             "INFO 01-27 00:32:09 [backends.py:398] Compiling a graph for compile range (5121, 8192) takes 3.10 s",
             "INFO 01-27 00:32:10 [backends.py:226] Directly load the compiled graph(s) for compile range (8193, 9000) "
             "from the cache, took 0.1 s"]
    assert parse_lines(lines).result()["compile_cache"] == "cold"
