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
from hypothesis import given, settings
from hypothesis import strategies as st

from autotune.host import launcher, processes
from autotune.testing import fake_vllm, profiles
from autotune.testing.profiles import GIB, Settings
from autotune.testing.truth import truth
from autotune.vllm import versions
from autotune.vllm.log import ceiling_from, parse_lines
from tests.helpers.replay import SEED, SEED_LEVERS, boot

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
    if truth(["--profile", name, "--gpu-memory-utilization", gmu, "--max-num-seqs", "8"]).limit == "model_maximum":
        # an H100 holds the whole 131,072 at the default; an MI300X's 70B weights need more than 0.3 of it
        gmu = "0.3" if p.gpu_memory_gib * 0.3 > p.weights_gib / p.tp + 2 else "0.75"
    args = ["--profile", name, "--max-model-len", str(p.derived_max_len), "--max-num-seqs", "8",
            "--tensor-parallel-size", str(p.tp), "--gpu-memory-utilization", gmu]
    outcome, result, _ = boot(*args)
    assert result["vllm_version"] == p.version
    assert outcome == 1 and result["outcome"] == "refused"
    ceiling, source = ceiling_from(result)
    expected_source = {"v0": "v0_kv_capacity", "v1_084": "computed_from_gib"}.get(p.family, "estimate")
    assert source == expected_source
    for _ in range(3):  # a ceiling computed from two-decimal GiB figures may be a block or two high
        outcome, result, _ = boot(*args[:2], "--max-model-len", str(ceiling), *args[4:])
        if outcome != 1:
            break
        # Refused again: a ceiling computed from GiB figures, or 0.34's estimate against the upper bound
        # refused after CUDA-graph capture and warmup (once: that refusal is against the measured pool).
        assert source == "computed_from_gib" or result.get("refusal_stage") == "after_warmup"
        ceiling, source = ceiling_from(result)
    served, tokens = outcome
    # The pool holds the ceiling, except a sliding-window model's: its boot check counts the windowed
    # layers at their window (tests/server/test_queue_watch.py: its longer requests wait forever).
    assert served == ceiling and (tokens >= ceiling) is not bool(p.sliding_window)


def test_the_no_estimate_profile_prints_no_number():
    _, result, lines = boot("--profile", "v1-0.9.0-no-estimate", "--max-model-len", "131072")
    refusal = [line for line in lines if "To serve at least one request" in line][0]
    assert "(5.57 GiB). Based on the available memory,  Try increasing" in refusal
    assert "estimated_max_model_len" not in result or not result["estimated_max_model_len"]
    assert ceiling_from(result) == (45616, "computed_from_gib")


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


@pytest.mark.parametrize("name,held_back", [("v1-0.21.0", False), ("v1-0.33.0", True)])
def test_the_null_block_is_held_back_by_the_check_and_the_fit_from_029(name, held_back):
    """As real vLLM 0.32 on this machine's CPU: a 128 MiB pool of 128 blocks reports 16,384 tokens and
    `auto` fits 16,256 (README), one block less, and the boot check refuses 16,384 with that estimate.
    vLLM 0.29+ plans lengths against the pool less the null block its BlockPool keeps; before, against
    every block (versions.check_holds_back_null_block). Here: 64 blocks of 16 tokens of 128 KiB."""
    pool = ["--profile", name, "--kv-cache-memory-bytes", "128M"]
    usable = 1024 - 16 * held_back
    (served, tokens), facts, _ = boot(*pool, "--max-model-len", "auto")
    assert (served, tokens, facts["autofit_max_model_len"]) == (usable, 1024, usable)
    outcome, facts, _ = boot(*pool, "--max-model-len", "1024")
    if held_back:
        assert outcome == 1 and facts["estimated_max_model_len"] == usable
    else:
        assert outcome == (1024, 1024)
    assert boot(*pool, "--max-model-len", str(usable))[0] == (usable, 1024)
    found = truth(pool)
    assert (found.ceiling, found.kv_cache_tokens) == (usable, 1024)


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
    assert launcher.detect_version(argv, {"PATH": ""}) == "0.17.0"


def test_the_server_answers_like_vllm_and_stops_on_sigint(tmp_path):
    port = processes.free_port()
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


def test_a_computed_ceiling_refused_at_equal_printed_figures_takes_their_lower_bound():
    """Found by the no-estimate profile: 46,848 tokens need 5.72 GiB and 5.72 GiB are available
    as printed, so the figures give 46,848 again; vLLM refused it. The block below it was the next
    answer, but within their rounding the figures cannot place the ceiling (the oracle found one
    block down per boot, 50,464 to 50,416 in four refusals): their lower bound, which boots, and
    that boot's KV pool decides the rest (run/strategy.py PREDICTED)."""
    outcome, result, _ = boot("--profile", "v1-0.9.0-no-estimate", "--max-model-len", "46848", "--max-num-seqs", "8")
    assert outcome == 1 and (result["kv_needed_gib"], result["refusal_available_kv_gib"]) == (5.72, 5.72)
    # floor((5.72 - 0.005) / (5.72 + 0.005) x 46,848 / 16) x 16
    assert ceiling_from(result) == (46752, "computed_from_gib")
    assert truth(["--profile", "v1-0.9.0-no-estimate", "--max-num-seqs", "8"]).ceiling == 46832


# ---- its command line, as vLLM's argparse reads it (issue 20) ------------------------------------

def run_main(capsys, *argv) -> tuple[int, str]:
    code = fake_vllm.main(list(argv), {})
    out = capsys.readouterr()
    return code, out.out + out.err


def test_vllm_serves_model_positional_is_the_model(capsys):
    """`vllm serve MODEL ...`: the model is an optional positional (model_tag); before, the replay
    skipped it and served its profile's model."""
    req = fake_vllm.read_request(["Qwen/Qwen3-8B", "--profile", "v1-0.33.0", "--max-model-len", "4096"], {})
    assert req.model == "Qwen/Qwen3-8B" and req.args_shown["model_tag"] == "Qwen/Qwen3-8B"
    assert run_main(capsys, "Qwen/Qwen3-8B", "--profile", "v1-0.33.0", "--print-version") == (0, "0.33.0\n")
    code, out = run_main(capsys, "Qwen/Qwen3-8B", "Qwen/other", "--profile", "v1-0.33.0")
    assert code == 2 and "fake_vllm: error: unrecognized arguments: Qwen/other" in out


def test_the_time_scale_in_the_environment_wins_over_the_flag():
    """FAKE_VLLM_TIME_SCALE: a test catches a fleet mid-boot at a slow scale, then runs the same plan fast."""
    argv = ["--profile", SEED, "--time-scale", "0.05"]
    assert fake_vllm.read_request(argv, {}).time_scale == 0.05
    assert fake_vllm.read_request(argv, {"FAKE_VLLM_TIME_SCALE": "0.005"}).time_scale == 0.005
    assert fake_vllm.read_request(["--profile", SEED], {"FAKE_VLLM_TIME_SCALE": "0"}).time_scale == 0.0


def test_an_option_vllm_does_not_know_exits_2_as_argparse_does(capsys):
    """Before, the replay took any flag and showed it among vLLM's non-default args."""
    code, out = run_main(capsys, "--profile", "v1-0.33.0", "--max-model-length", "4096", "--bogus")
    assert code == 2 and out.splitlines() == [
        "usage: python -m autotune.testing.fake_vllm [MODEL] --profile NAME [vllm serve options]",
        "fake_vllm: error: unrecognized arguments: --max-model-length --bogus"]
    code, out = run_main(capsys, "--profile", "v1-0.33.0", "--max", "4096")
    assert code == 2 and "ambiguous option: --max could match --max-cpu-loras," in out


def test_argparse_spellings_are_read_as_vllm_reads_them():
    """`_` for `-`, `--flag=value`, a unique prefix of a long option, a short alias, a flag's --no- form."""
    req = fake_vllm.read_request(["--profile", "seed-3090-qwen3.6-27b", "--max_num_seqs=4", "--gpu-memory-util", "0.95",
                                  "-tp", "1", "--no-enable-chunked-prefill", "--max-num-batched-tokens", "4096"], {})
    assert (req.settings.max_num_seqs, req.settings.gmu, req.settings.tp) == (4, 0.95, 1)
    assert req.options["no-enable-chunked-prefill"] is True
    assert {"max_num_seqs": 4, "gpu_memory_utilization": 0.95}.items() <= req.args_shown.items()


def test_sizes_are_read_as_vllm_reads_them():
    """vLLM's human_readable_int (autotune.vllm.servecmd): lowercase decimal, uppercase binary and whole."""
    req = fake_vllm.read_request(["--profile", "v1-0.33.0", "--kv-cache-memory-bytes", "2g",
                                  "--max-num-batched-tokens", "2k", "--max-model-len", "16K"], {})
    assert (req.settings.kv_cache_memory_bytes, req.settings.max_num_batched_tokens, req.max_model_len) == \
        (2 * 10**9, 2000, 16384)
    assert req.args_shown["kv_cache_memory_bytes"] == 2 * 10**9  # printed as vLLM stored it
    with pytest.raises(fake_vllm.UsageError, match="argument --kv-cache-memory-bytes: invalid human_readable_int "
                                                   "value: '1.5G'"):
        fake_vllm.read_request(["--profile", "v1-0.33.0", "--kv-cache-memory-bytes", "1.5G"], {})


@pytest.mark.parametrize("version_profile,argv,accepted", [
    ("v0-0.6.4", ["--kv-cache-memory-bytes", "4G"], False),  # 0.10.2+
    ("v1-0.13.0", ["--kv-cache-memory-bytes", "4G"], True),
    ("v1-0.21.0", ["--device-memory-utilization", "0.9"], False),  # an alias from 0.31
    ("v1-0.33.0", ["--device-memory-utilization", "0.9"], True),
    ("v1-0.17.0-auto-probe", ["--no-scheduler-reserve-full-isl"], False),  # 0.19+
    ("sliding-2xh100-gemma4-31b", ["--no-scheduler-reserve-full-isl"], True),
    ("v1-0.17.0-auto-probe", ["--scheduler-reserve-full-isl"], False),
    ("v0-0.6.4", ["--no-enable-chunked-prefill"], False),  # 0.8.5+ (before: --enable-chunked-prefill False)
    ("v1-0.9.0-no-estimate", ["--no-enable-chunked-prefill"], True),
])
def test_a_flag_the_version_does_not_have_yet_is_unrecognized(version_profile, argv, accepted):
    if accepted:
        req = fake_vllm.read_request(["--profile", version_profile, *argv], {})
        assert argv[0] != "--device-memory-utilization" or req.settings.gmu == 0.9
    else:
        with pytest.raises(fake_vllm.UsageError, match=f"unrecognized arguments: {argv[0]}"):
            fake_vllm.read_request(["--profile", version_profile, *argv], {})


def test_a_flag_the_version_does_not_have_is_unrecognized_however_it_is_written(capsys):
    """vLLM's FlexibleArgumentParser reads `_` as `-` before argparse, which then takes a unique prefix:
    the version's flags decide, however the flag is written (versions.FLAGS_SINCE)."""
    for written in (["--no_scheduler_reserve_full_isl"], ["--no-scheduler-reserve"], ["--kv-cache-memory-bytes=4G"]):
        profile = "v0-0.6.4" if written[0].startswith("--kv") else "v1-0.17.0-auto-probe"
        code, out = run_main(capsys, "--profile", profile, *written)
        shown = written[0].replace("_", "-") if written[0].startswith("--no_") else written[0]
        assert code == 2 and out.rstrip().endswith(f"fake_vllm: error: unrecognized arguments: {shown}"), out
    # what autotune asks it (its version, its GPUs) it answers whatever the rest of the command line
    code, out = run_main(capsys, "--profile", "v1-0.17.0-auto-probe", "--no-scheduler-reserve-full-isl",
                         "--print-version")
    assert (code, out) == (0, "0.17.0\n")


def test_the_port_is_bound_before_the_engine_and_a_taken_one_fails_as_vllm_does():
    """vLLM binds its port right after the arguments (setup_server): a taken port ends the boot
    before the engine starts, with the traceback of tests/fixtures/failures/cpu-0.32.0-address-in-use.log."""
    import socket
    import threading

    holder = socket.socket()
    holder.bind(("0.0.0.0", 0))
    holder.listen(1)
    try:
        req = fake_vllm.read_request(["--profile", "v1-0.33.0", "--time-scale", "0", "--port",
                                      str(holder.getsockname()[1]), "--max-model-len", "4096"], {})
        out = io.StringIO()
        assert fake_vllm.run(req, threading.Event(), out) == 1
    finally:
        holder.close()
    result = parse_lines(out.getvalue().splitlines()).result()
    assert result["error_kind"] == "address_in_use" and "Initializing" not in out.getvalue()


@settings(max_examples=150, deadline=None, derandomize=True)
@given(name=st.sampled_from(sorted(profiles.PROFILES)), gmu=st.sampled_from([0.3, 0.6, 0.9, 0.95]),
       seqs=st.sampled_from([1, 16, 256]), batched=st.sampled_from([None, 512, 8192]), off=st.booleans(),
       draft=st.sampled_from([None, 8192, 65536]))
def test_the_truth_is_what_the_replay_boots(name, gmu, seqs, batched, off, draft):
    """testing/truth.py against the replay itself: a boot at the truth serves it; one token more does
    not (refused, served shorter, or over its KV pool, whose longest requests vLLM never admits); a
    command the truth says cannot boot does not, at any length."""
    argv = ["--profile", name, "--gpu-memory-utilization", str(gmu), "--max-num-seqs", str(seqs)]
    argv += ["--max-num-batched-tokens", str(batched)] if batched else []
    argv += ["--no-enable-chunked-prefill"] if off else []
    argv += ["--speculative-config", json.dumps({"model": "d", "max_model_len": draft})] if draft else []
    found = truth(argv)
    if found.limit == "usage":  # a flag this version does not have: argparse ends it, at any length
        with pytest.raises(fake_vllm.UsageError):
            boot(*argv)
        return
    if not found.boots:
        for length in (1024, profiles.by_name(name).derived_max_len):
            assert not isinstance(boot(*argv, "--max-model-len", str(length))[0], tuple), found
        return
    served = boot(*argv, "--max-model-len", str(found.ceiling))[0]
    assert isinstance(served, tuple) and served[0] == found.ceiling, found
    above = boot(*argv, "--max-model-len", str(found.ceiling + 1))[0]
    assert not isinstance(above, tuple) or min(above) < found.ceiling + 1, found


# ---- vLLM's default batch by device (versions.batch_defaults) -----------------------------------

H100 = "h100-0.33.0-llama-8b"


def test_the_h100_profile_boots_at_8192_batched_tokens_and_1024_seqs_when_the_flags_are_absent():
    default = boot("--profile", H100, "--max-model-len", "8192")
    explicit = boot("--profile", H100, "--max-model-len", "8192", "--max-num-batched-tokens", "8192",
                    "--max-num-seqs", "1024")
    small = boot("--profile", H100, "--max-model-len", "8192", "--max-num-batched-tokens", "2048",
                 "--max-num-seqs", "256")
    assert default[0] == explicit[0] == (8192, 455888) and default[1]["available_kv_gib"] == 55.65
    assert small[0] == (8192, 463584)  # what it booted at before it followed vLLM's rule
    # vLLM's own words name the default: more seqs than the 8,192 default batched tokens is refused
    outcome, result, lines = boot("--profile", H100, "--max-model-len", "8192", "--max-num-seqs", "9000")
    assert outcome == 1 and result["error_kind"] == "max_num_batched_tokens_below_max_num_seqs"
    assert any("max_num_batched_tokens (8192) must be greater than or equal to max_num_seqs (9000)" in line
               for line in lines)
    assert truth(["--profile", H100, "--max-num-seqs", "9000"]).limit == "batched_tokens_below_max_num_seqs"


def test_the_3090_profiles_keep_2048_and_256_and_a_default_seqs_follows_small_batched_tokens():
    p = profiles.by_name("v1-0.33.0")
    assert (profiles.batched_tokens(p, Settings(gmu=0.92)), profiles.max_num_seqs(p, Settings(gmu=0.92))) == (2048, 256)
    # 0.11+: a default max_num_seqs is lowered to the command's batched tokens, so 128 boots
    assert profiles.max_num_seqs(p, Settings(gmu=0.92, max_num_batched_tokens=128)) == 128
    outcome, _, _ = boot("--profile", "v1-0.33.0", "--max-model-len", "128", "--max-num-batched-tokens", "128")
    assert outcome[0] == 128  # booted: 128 seqs, not the 256 the batched tokens would refuse


def test_a_client_that_hangs_up_mid_answer_prints_nothing_but_other_errors_do(capsys):
    """Found in a clean-clone run: a request thread of an in-process replay met a closed socket after its
    test had ended, and socketserver's traceback landed in the next test's captured output."""
    from autotune.host.processes import free_port
    from autotune.testing import fake_vllm

    server = fake_vllm.bind(free_port(), "127.0.0.1")
    try:
        for error in (BrokenPipeError(32, "Broken pipe"), ConnectionResetError(104, "reset"), ValueError("a bug")):
            try:
                raise error
            except (OSError, ValueError):
                server.handle_error(None, ("127.0.0.1", 1))
    finally:
        server.server_close()
    err = capsys.readouterr().err
    assert "ValueError: a bug" in err
    assert "BrokenPipeError" not in err and "ConnectionResetError" not in err
