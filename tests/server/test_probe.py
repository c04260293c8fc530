"""The probe: prompt sizing (pure), memory reading, and real requests to a real vLLM (CPU).

The real server is the embedded default at its real ceiling: the tiny model with a 128 MiB
KV pool (16,384 tokens) booted at --max-model-len 16,256, vLLM's own estimate. One boot
serves every real-vLLM test in this module.
"""
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autotune.host import processes
from autotune.server import probe, probe_memory, prompt
from autotune.server.probe_memory import growth_summary
from autotune.server.prompt import (
    ProbeFailure,
    filler_text,
    next_char_count,
    next_try,
    prompt_budget,
    size_prompt,
    within_margin,
)

CEILING = 16256


# ---- prompt sizing (pure) ------------------------------------------------------------

def test_filler_is_exactly_as_long_as_asked_and_starts_with_the_salt():
    for n in (1, 7, 100, 10_000):
        assert len(filler_text(n, salt="probe a")) == n
    assert filler_text(100, salt="probe a").startswith("[probe a] ")
    assert filler_text(0) == ""
    assert filler_text(500, "x") == filler_text(500, "x")  # deterministic
    assert filler_text(500, "a")[4:] == filler_text(500, "b")[4:]  # same length salts: same body


def test_budget_leaves_room_for_the_output_tokens():
    assert prompt_budget(16256, 4) == 16252
    assert within_margin(16252, 16252, 32) and within_margin(16220, 16252, 32)
    assert not within_margin(16219, 16252, 32) and not within_margin(16253, 16252, 32)


def test_next_length_scales_by_the_token_ratio_rounded_down():
    assert next_char_count(4000, 1000, 2000) == 8000
    assert next_char_count(1000, 3, 2) == 666
    assert next_char_count(10, 0, 5) == 20  # nothing counted yet: grow


def test_next_try_follows_the_line_through_the_last_two_tries():
    # 1 BOS token + 1 token per 3 characters: the line through two tries hits the goal exactly
    assert prompt.secant_char_count((300, 101), (600, 201), 1001) == 3000
    assert next_try([(300, 101), (600, 201)], 1001, short_chars=600, long_chars=None) == 3000
    assert prompt.secant_char_count((300, 101), (300, 101), 1001) is None  # one point is no line


def test_next_try_stays_between_what_fits_and_what_does_not():
    # the scaled length would go back below a length known to fit: bisect instead
    assert next_try([(2000, 1100)], goal_tokens=1000, short_chars=1900, long_chars=2000) == 1950
    # no length left between the two: stop
    assert next_try([(1001, 501)], goal_tokens=500, short_chars=1000, long_chars=1001) is None
    # nothing too long known yet: scaling up is free
    assert next_try([(1000, 250)], goal_tokens=1000, short_chars=1000, long_chars=None) == 4000


def test_size_prompt_lands_within_the_margin_on_a_linear_tokenizer():
    calls = []

    def count(text):
        calls.append(len(text))
        return len(text) // 3 + 1  # a BOS token and 3 characters per token

    sized = size_prompt(budget=16252, margin=32, count_tokens=count)
    assert 16252 - 32 <= sized.tokens <= 16252
    assert sized.tokens == count(sized.text)
    assert sized.tokenize_calls == len(calls) - 1 <= 3


def test_size_prompt_with_the_tiny_models_real_tokenizer(tiny_model):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))

    def count(text):
        return len(tok.encode(text).ids)

    for max_model_len in (200, 4096, 16256, 131072):
        budget = prompt_budget(max_model_len, 4)
        margin = prompt.default_margin(max_model_len)
        sized = size_prompt(budget, margin, count, salt="autotune probe 1a2b3c4d 1")
        assert sized.within_margin, (max_model_len, sized.tokens, budget)
        assert count(sized.text) == sized.tokens
        assert sized.tokenize_calls <= 4


@settings(max_examples=300, deadline=None)
@given(budget=st.integers(1, 300_000), margin=st.integers(0, 512),
       chars_per_token=st.floats(1.0, 8.0), fixed=st.integers(0, 50))
def test_size_prompt_never_exceeds_the_budget(budget, margin, chars_per_token, fixed):
    def count(text):
        return fixed + int(len(text) / chars_per_token)

    if count("x") > budget:  # not even one character fits
        with pytest.raises(ProbeFailure):
            size_prompt(budget, margin, count)
        return
    sized = size_prompt(budget, margin, count)
    assert sized.tokens <= budget
    assert sized.tokens == count(sized.text)


def test_size_prompt_on_a_jumpy_tokenizer_stays_under_the_budget():
    # Tokens grow in steps of 50 (a tokenizer that is far from linear): the margin cannot
    # always be met, but the prompt is never above the budget and the calls are bounded.
    def count(text):
        return (len(text) // 200) * 50

    sized = size_prompt(budget=1000, margin=10, count_tokens=count, max_calls=6)
    assert sized.tokens <= 1000 and sized.tokenize_calls <= 6


def test_size_prompt_refuses_an_impossible_budget():
    with pytest.raises(ValueError):
        size_prompt(0, 10, len)
    with pytest.raises(ProbeFailure):
        size_prompt(10, 2, lambda text: 100)  # every prompt is too long


# ---- memory figures --------------------------------------------------------------------

def test_growth_is_flagged_only_above_the_threshold_and_unknown_is_not_fine():
    gib = 2**30
    ok = growth_summary(2 * gib, 2 * gib + gib // 10, 2 * gib + gib // 5, threshold_gib=0.25)
    assert ok["growth_gib"] == 0.1 and ok["peak_growth_gib"] == 0.2 and ok["growth_flagged"] is False
    big = growth_summary(2 * gib, 3 * gib, None, threshold_gib=0.25)
    assert big["growth_gib"] == 1.0 and big["growth_flagged"] is True and big["peak_growth_gib"] is None
    unknown = growth_summary(None, 3 * gib, None, threshold_gib=0.25)
    assert unknown["growth_gib"] is None and unknown["growth_flagged"] is None


def test_cpu_memory_is_the_rss_of_the_whole_process_tree(tmp_path):
    # A parent with a child that holds ~64 MiB: the tree's RSS includes the child's.
    code = ("import subprocess, sys, time; "
            "c = subprocess.Popen([sys.executable, '-c', 'b = b\"x\" * (64 << 20); import time; time.sleep(60)']); "
            "time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        reader = probe_memory.MemoryReader(parent.pid, None)
        # Until the child has touched its 64 MiB (a loaded machine takes a while): the tree's reading
        # must then exceed the parent's own by that much; a reading of the parent alone never does.
        while time.monotonic() < deadline:
            own = psutil.Process(parent.pid).memory_info().rss
            total = reader.read_bytes() or 0
            if len(processes.process_tree(parent.pid)) == 2 and total > own + (60 << 20):
                break
            time.sleep(0.1)
        assert reader.device == "cpu" and total > own + (60 << 20)
    finally:
        processes.stop_tree(parent.pid, None, stages=((signal.SIGKILL, 5.0),))
    assert probe_memory.MemoryReader(parent.pid, None).read_bytes() is None  # gone: unknown, not zero


def test_gpu_memory_without_nvml_is_unavailable_not_an_error():
    reader = probe_memory.MemoryReader(os.getpid(), [0])
    assert reader.device == "gpu"
    value = reader.read_bytes()
    if reader.unavailable:  # this machine: no NVIDIA driver (or nvidia-ml-py missing)
        assert value is None
        rec = probe_memory.memory_record(reader, value, value, None)
        assert rec["unavailable_reason"] == reader.unavailable and rec["growth_flagged"] is None
    else:  # a machine with a GPU 0
        assert value > 0
    reader.close()


# ---- failures without a server -----------------------------------------------------------

def test_nothing_listening_is_a_failed_probe_not_an_exception():
    port = processes.free_port()
    rec = probe.probe(port, 4096, "quick", server_pid=os.getpid(), request_timeout_s=5, small_timeout_s=5)
    assert rec["ok"] is False
    assert "GET /v1/models" in rec["reason"] and "refused" in rec["reason"]
    assert rec["requests"] == []


def test_bad_arguments_are_programming_errors():
    with pytest.raises(ValueError):
        probe.probe(1, 4096, "thorough", server_pid=os.getpid())
    with pytest.raises(ValueError):
        probe.probe(1, 4, "quick", server_pid=os.getpid())


def test_head_of_line_allows_the_readers_timing_but_not_a_short_request_served_beside_the_prefill():
    """A real run (test_probe_real_vllm.py, a loaded machine): with --max-num-seqs 1 the short request's
    first token was noted just before the long one's, whose reader is a thread of its own."""
    from autotune.server.probe import HOL_READER_SLACK_S, StreamResult, _head_of_line

    def stream(sent, first):
        return StreamResult(True, "", sent, first_token_at=first)

    long2 = stream(100.0, 112.0)  # a 12 s prefill
    assert _head_of_line(long2, stream(101.0, 112.05))["waited_for_long_prefill"]  # right after it
    assert _head_of_line(long2, stream(101.0, 112.0 - HOL_READER_SLACK_S / 2))["waited_for_long_prefill"]
    assert not _head_of_line(long2, stream(101.0, 101.2))["waited_for_long_prefill"]  # served beside it
    quick = stream(100.0, 100.3)  # a 0.3 s prefill: the slack shrinks to a tenth of it
    assert not _head_of_line(quick, stream(100.05, 100.2))["waited_for_long_prefill"]
    assert _head_of_line(quick, stream(100.05, 100.29))["waited_for_long_prefill"]
