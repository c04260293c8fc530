"""The replaying vLLM (autotune.testing.fake_vllm): its figures, its words per version, its
failures, its HTTP server. Its boot logs are read by autotune's own parser, so a line the
fake prints that autotune cannot read fails here."""

import io
import json
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from autotune.run import launch
from autotune.testing import fake_vllm, profiles
from autotune.testing.profiles import GIB, Settings
from autotune.vllm import logparse, versions

SEED = "seed-3090-qwen3.6-27b"
SEED_LEVERS = ["--gpu-memory-utilization", "0.98", "--max-num-seqs", "1", "--max-num-batched-tokens", "512",
               "--enable-chunked-prefill"]


def boot(*argv, env=None):
    """(exit status or (served length, KV tokens), parsed result, the lines) of one in-process boot."""
    out = io.StringIO()
    req = fake_vllm.read_request(["--time-scale", "0", *argv], env or {})
    outcome = fake_vllm.Boot(req, out).run()
    lines = out.getvalue().splitlines()
    return outcome, logparse.parse_lines(lines).result(), lines


# ---- the seed machine's figures (issue 12) -------------------------------------------------------

def test_the_seed_machine_as_the_seed_tells_it():
    p = profiles.by_name(SEED)
    levers = Settings(gmu=0.98, max_num_seqs=1, max_num_batched_tokens=512)
    available = profiles.available_kv_bytes(p, levers)
    assert round(available / GIB, 2) == 3.9
    assert round(profiles.needed_bytes(p, levers, 65536) / GIB, 2) == 4.16
    assert profiles.estimate(p, levers, available, 65536) == 61152
    assert round(profiles.available_kv_bytes(p, Settings(gmu=0.98, max_num_seqs=8)) / GIB, 2) == 3.55
    # about 1 GiB besides the 18.91 GiB of weights, at the seed's first settings
    used = 24.0 * 0.98 - profiles.available_kv_bytes(p, Settings(gmu=0.98, max_num_seqs=8)) / GIB
    assert 19.9 < used < 20.0
    assert p.mamba_state_mib == 147.0 and p.prefill_tokens_per_s == 1100.0


def test_the_seed_refuses_65536_in_its_version_words():
    outcome, result, lines = boot("--profile", SEED, *SEED_LEVERS, "--max-model-len", "65536")
    assert outcome == 1
    assert result["vllm_version"] == "0.20.2"
    assert (result["kv_needed_gib"], result["refusal_available_kv_gib"], result["estimated_max_model_len"]) == \
        (4.16, 3.9, 61152)
    refusal = [line for line in lines if "To serve at least one request" in line][0]
    assert "with the models's max seq len (65536), (4.16 GiB KV cache is needed" in refusal
    assert refusal.endswith("the estimated maximum model length is 61152. Try increasing `gpu_memory_utilization` "
                            "or decreasing `max_model_len` when initializing the engine. See "
                            "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.")
    assert lines[-1].endswith("Failed core proc(s): {'EngineCore': 1}")


def test_the_seed_serves_its_estimate():
    outcome, result, _ = boot("--profile", SEED, *SEED_LEVERS, "--max-model-len", "61152")
    assert outcome == (61152, 61152)
    assert result["kv_cache_tokens"] == 61152 and result["available_kv_gib"] == 3.9


# ---- every profile, read by autotune's parser ------------------------------------------------------

@pytest.mark.parametrize("name", list(profiles.PROFILES))
def test_every_profile_refuses_above_its_ceiling_and_autotune_reads_the_ceiling(name):
    p = profiles.by_name(name)
    gmu = "0.6" if p.tp > 1 else str(versions.default_gmu(p.version))  # two 3090s hold the whole 262,144 at 0.92
    args = ["--profile", name, "--max-model-len", str(p.derived_max_len), "--max-num-seqs", "8",
            "--tensor-parallel-size", str(p.tp), "--gpu-memory-utilization", gmu]
    outcome, result, _ = boot(*args)
    assert result["vllm_version"] == p.version
    assert outcome == 1 and result["outcome"] == "refused"
    ceiling, source = logparse.ceiling_from(result)
    expected_source = {"v0": "v0_kv_capacity", "v1_084": "computed_from_gib"}.get(p.family, "estimate")
    assert source == expected_source
    for _ in range(3):  # a ceiling computed from two-decimal GiB figures may be a block or two high
        outcome, result, _ = boot(*args[:2], "--max-model-len", str(ceiling), *args[4:])
        if outcome != 1:
            break
        assert source == "computed_from_gib"
        ceiling, _ = logparse.ceiling_from(result)
    served, tokens = outcome
    # The pool holds the ceiling, except a sliding-window model's: its boot check counts the windowed
    # layers at their window (tests/test_queue_watch.py: its longer requests wait forever).
    assert served == ceiling and (tokens >= ceiling) is not bool(p.sliding_window)


def test_the_no_estimate_profile_prints_no_number():
    _, result, lines = boot("--profile", "v1-0.9.0-no-estimate", "--max-model-len", "131072")
    refusal = [line for line in lines if "To serve at least one request" in line][0]
    assert "(5.57 GiB). Based on the available memory,  Try increasing" in refusal
    assert "estimated_max_model_len" not in result or not result["estimated_max_model_len"]
    assert logparse.ceiling_from(result) == (45616, "computed_from_gib")


@pytest.mark.parametrize("name,word", [("v1-0.21.0", "models's"), ("v1-0.33.0", "model's"),
                                        ("v1-0.13.0", "models's")])
def test_the_refusal_wording_follows_the_version(name, word):
    _, _, lines = boot("--profile", name, "--max-model-len", "131072")
    assert any(f"with the {word} max seq len (131072)" in line for line in lines)


def test_033_prints_one_merged_kv_line():
    _, result, lines = boot("--profile", "v1-0.33.0", "--max-model-len", "32768")
    merged = [line for line in lines if "KV cache size:" in line]
    assert len(merged) == 1 and "tokens, Maximum concurrency for 32,768 tokens per request" in merged[0]
    assert result["kv_cache_tokens"] == profiles.kv_cache_tokens(
        profiles.by_name("v1-0.33.0"), Settings(gmu=0.92),
        profiles.available_kv_bytes(profiles.by_name("v1-0.33.0"), Settings(gmu=0.92)))


def test_tp2_prints_one_line_per_rank():
    _, _, lines = boot("--profile", "tp2-2x3090-qwen3.6-27b", "--tensor-parallel-size", "2", "--max-num-seqs", "8")
    available = [line for line in lines if "Available KV cache memory" in line]
    assert [line.split(")")[0] for line in available] == [line.split(")")[0] for line in available]
    assert [line.split(" pid=")[0] for line in available] == ["(Worker_TP0", "(Worker_TP1"]


# ---- auto-fit by version -----------------------------------------------------------------------

def test_auto_is_served_from_020_and_only_read_on_014_to_019():
    served, _ = boot("--profile", "v1-0.21.0", "--max-model-len", "auto")[0]
    fitted = boot("--profile", "v1-0.17.0-auto-probe", "--max-model-len", "auto")
    assert served == 44480
    assert fitted[1]["autofit_max_model_len"] == 45616
    assert fitted[0][0] == 131072  # 0.14-0.19: the API server keeps the derived length (vLLM PR #39102)


def test_auto_before_014_is_a_usage_error():
    with pytest.raises(fake_vllm.UsageError, match="invalid human_readable_int value: 'auto'"):
        fake_vllm.read_request(["--profile", "v1-0.13.0", "--max-model-len", "auto"], {})


# ---- failures on request -------------------------------------------------------------------------

def test_fp8_kv_fails_below_compute_capability_89():
    outcome, result, _ = boot("--profile", SEED, "--kv-cache-dtype", "fp8", "--max-num-seqs", "4")
    assert outcome == 1 and result["error_kind"] == "fp8_unsupported_arch"


def test_gpu_uuids_fail_up_to_021_only():
    env = {"CUDA_VISIBLE_DEVICES": "GPU-52a3a85d-3c55-ca3a-a955-82c69ed360fc"}
    outcome, result, _ = boot("--profile", "v1-0.21.0", "--max-model-len", "8192", env=env)
    assert outcome == 1 and result["error_kind"] == "cuda_visible_devices_uuid"
    assert boot("--profile", "v1-0.33.0", "--max-model-len", "8192", env=env)[0] == (8192, 44480)


def test_more_sequences_than_mamba_blocks_fails_with_the_number():
    outcome, result, _ = boot("--profile", SEED, "--gpu-memory-utilization", "0.98", "--max-model-len", "8192")
    assert outcome == 1
    assert (result["error_kind"], result["mamba_cache_blocks"], result["max_num_seqs_refused"]) == \
        ("mamba_cache_blocks", 16, 256)


def test_a_length_above_the_models_maximum_fails_at_config_time():
    outcome, result, _ = boot("--profile", "v1-0.21.0", "--max-model-len", "200000")
    assert outcome == 1 and result["error_kind"] == "max_model_len_above_derived"
    assert result["derived_max_model_len"] == 131072


def test_an_unknown_profile_is_a_usage_error_naming_them():
    with pytest.raises(fake_vllm.UsageError, match="no profile 'nope'.*seed-3090-qwen3.6-27b"):
        fake_vllm.read_request(["--profile", "nope"], {})


# ---- the program -----------------------------------------------------------------------------------

def test_profile_list_names_each_profile_with_its_source(capsys):
    assert fake_vllm.main(["--profile", "list"]) == 0
    out = capsys.readouterr().out
    for p in profiles.PROFILES.values():
        assert p.name in out and p.sources[0] in out


def test_autotune_sees_the_profiles_version():
    argv = [sys.executable, "-m", "autotune.testing.fake_vllm", "--profile", "v1-0.17.0-auto-probe"]
    assert versions.detect_version(argv, {"PATH": ""}) == "0.17.0"


def test_the_server_answers_like_vllm_and_stops_on_sigint(tmp_path):
    port = launch.free_port()
    proc = subprocess.Popen([sys.executable, "-m", "autotune.testing.fake_vllm", "--profile", "v1-0.21.0",
                             "--time-scale", "0", "--port", str(port), "--max-model-len", "4096"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                if urllib.request.urlopen(base + "/health", timeout=1).status == 200:
                    break
            except OSError:
                time.sleep(0.05)
        models = json.load(urllib.request.urlopen(base + "/v1/models"))
        assert models["data"][0]["max_model_len"] == 4096
        post = lambda path, body: urllib.request.urlopen(urllib.request.Request(  # noqa: E731
            base + path, json.dumps(body).encode(), {"Content-Type": "application/json"}), timeout=5)
        assert json.load(post("/tokenize", {"prompt": "x" * 400}))["count"] == 101
        stream = post("/v1/completions", {"prompt": "hello", "max_tokens": 3, "stream": True}).read().decode()
        assert stream.count("data: ") == 5 and stream.rstrip().endswith("data: [DONE]")
        with pytest.raises(urllib.error.HTTPError) as too_long:
            post("/v1/completions", {"prompt": "x" * 20000, "max_tokens": 8})
        assert too_long.value.code == 400
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
        log = proc.stdout.read().decode()
        assert "Starting vLLM server on http://0.0.0.0:" in log and "Application shutdown complete." in log
    finally:
        proc.kill()
        proc.wait()


def test_a_computed_ceiling_refused_at_equal_printed_figures_steps_one_block_down():
    """Found by the no-estimate profile: 46,848 tokens need 5.72 GiB and 5.72 GiB are available
    as printed, so the figures give 46,848 again; vLLM refused it, so the block below it."""
    outcome, result, _ = boot("--profile", "v1-0.9.0-no-estimate", "--max-model-len", "46848", "--max-num-seqs", "8")
    assert outcome == 1 and (result["kv_needed_gib"], result["refusal_available_kv_gib"]) == (5.72, 5.72)
    assert logparse.ceiling_from(result) == (46832, "computed_from_gib")
