import pytest

from autotune.vllm import servecmd
from tests.helpers import installed_vllm

BASE = ["vllm", "serve", "Qwen/Qwen3-8B", "--gpu-memory-utilization", "0.95"]


@pytest.mark.parametrize("argv", [
    BASE + ["--max-model-len", "16384"],
    BASE + ["--max-model-len=16384"],
    BASE + ["--max_model_len", "16384"],
    ["vllm", "serve", "M", "--max-model-len", "8192", "--port", "9000", "--max-model-len=4096"],
    BASE,
])
def test_with_max_model_len_replaces_every_form(argv):
    out = servecmd.with_max_model_len(argv, 65536)
    assert out.count("--max-model-len") == 1
    assert not any(a.startswith(("--max-model-len=", "--max_model_len")) for a in out)
    assert out[-2:] == ["--max-model-len", "65536"]
    assert servecmd.flag_value(out, "--max-model-len") == "65536"


def test_flag_value_last_wins_and_both_forms():
    argv = ["x", "--port=8000", "--port", "9000"]
    assert servecmd.port_of(argv) == 9000
    assert servecmd.port_of(["x", "--port=8001"]) == 8001
    assert servecmd.port_of(["x"]) is None
    assert servecmd.port_of(["x", "--port", "abc"]) is None


def test_model_of_positional_and_flag():
    assert servecmd.model_of(BASE) == "Qwen/Qwen3-8B"
    assert servecmd.model_of(["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m/x"]) == "/m/x"
    assert servecmd.model_of(["docker", "run", "img", "--model=org/m"]) == "org/m"
    assert servecmd.model_of(["vllm", "serve", "--help"]) is None


@pytest.mark.parametrize("text,value", [("65536", 65536), ("64K", 65536), ("64k", 64000), ("1M", 1048576),
                                        (" 4096 ", 4096), ("32_768", 32768), ("25.6k", 25600)])
def test_parse_length(text, value):
    assert servecmd.parse_length(text) == value


@pytest.mark.parametrize("text", ["0", "-5", "abc", "1.5", "64G", "", "1.5K"])
def test_parse_length_rejects(text):
    with pytest.raises(ValueError):
        servecmd.parse_length(text)


def test_one_line_quotes_and_env_first():
    line = servecmd.one_line(["vllm", "serve", "my model", "--x", "a'b"], {"HF_TOKEN": "$HF_TOKEN", "A": "1 2"})
    assert "\n" not in line
    assert line.startswith("HF_TOKEN=$HF_TOKEN A='1 2' vllm serve 'my model'")


def test_long_options_for_config_file():
    argv = ["vllm", "serve", "org/m", "--max-model-len", "4096", "--enforce-eager", "--gpu-memory-utilization=0.9",
            "--served-model-name", "m1", "--max_num_seqs", "1"]
    assert servecmd.long_options(argv) == {
        "model": "org/m", "max-model-len": 4096, "enforce-eager": True, "gpu-memory-utilization": 0.9,
        "served-model-name": "m1", "max-num-seqs": 1}


def test_model_slug():
    assert servecmd.model_slug("Qwen/Qwen3.6-27B-AWQ") == "qwen3.6-27b-awq"
    assert servecmd.model_slug("/tmp/x/tiny-llama/") == "tiny-llama"
    assert servecmd.model_slug(None) == "unknown-model"


def test_long_options_reads_what_the_strict_reading_refuses():
    # a docker command and an unknown short option: the settings are still read for comparing runs
    argv = ["docker", "run", "--gpus", "all", "vllm/vllm-openai", "--model", "org/m", "-tp", "2", "-zz", "x",
            "--gpu-memory-utilization", "0.90"]
    options = servecmd.long_options(argv)
    assert options["model"] == "org/m" and options["tensor-parallel-size"] == 2 and options["zz"] == "x"
    assert options["gpu-memory-utilization"] == 0.9  # 0.90 and 0.9 are one setting
    with pytest.raises(servecmd.NotPlainVllm):
        servecmd.parse_vllm_command(argv)


def test_the_strict_and_the_lenient_reading_agree_on_a_plain_command():
    argv = ["vllm", "serve", "org/m", "-tp", "2", "--max_num_seqs", "1", "--enforce-eager"]
    assert servecmd.parse_vllm_command(argv).options == servecmd.parse_vllm_command(argv, strict=False).options


def test_one_reader_for_docker_short_o_and_the_end_of_options():
    from autotune.vllm.servecmd import parse_vllm_command

    docker = ["docker", "run", "--rm", "--gpus", "all", "-v", "/d:/root/.cache", "vllm/vllm-openai:v0.10.1",
              "--model", "m", "-O3", "--max-num-seqs", "2", "--", "--not-an-option"]
    cmd = parse_vllm_command(docker, strict=False)
    assert cmd.model == "m"
    assert cmd.options == [("optimization-level", "3"), ("max-num-seqs", "2")]
    assert cmd.typed == ["-O", "--max-num-seqs"]


# ---- --device-memory-utilization: vLLM 0.31's name for --gpu-memory-utilization ----------------

GMU = "--gpu-memory-utilization"


@pytest.mark.parametrize("argv,value", [
    (["vllm", "serve", "m", "--device-memory-utilization", "0.9"], "0.9"),
    (["vllm", "serve", "m", "--device_memory_utilization=0.85"], "0.85"),
    # one argparse dest: the last of either name wins
    (["vllm", "serve", "m", "--gpu-memory-utilization", "0.8", "--device-memory-utilization", "0.95"], "0.95"),
    (["vllm", "serve", "m", "--device-memory-utilization", "0.95", "--gpu-memory-utilization=0.8"], "0.8"),
])
def test_the_gmu_flag_is_read_under_either_name(argv, value):
    assert servecmd.flag_value(argv, GMU) == value
    assert servecmd.has_flag(argv, GMU)
    assert servecmd.long_options(argv)["gpu-memory-utilization"] == float(value)
    assert "device-memory-utilization" not in servecmd.long_options(argv)


def test_rewriting_gmu_leaves_one_value_whatever_names_the_command_used():
    argv = ["vllm", "serve", "m", "--device-memory-utilization", "0.9", "--gpu_memory_utilization", "0.8",
            "--device_memory_utilization=0.7", "--max-num-seqs", "1"]
    rewritten = servecmd.with_flag(argv, GMU, 0.95)
    assert rewritten == ["vllm", "serve", "m", "--max-num-seqs", "1", GMU, "0.95"]
    assert servecmd.without_flag(argv, GMU) == ["vllm", "serve", "m", "--max-num-seqs", "1"]


def test_a_config_file_may_use_the_device_name(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("device-memory-utilization: 0.9\nmax-num-seqs: 2\n")
    argv = servecmd.expand_config(["vllm", "serve", "m", "--config", str(config)])
    assert servecmd.flag_value(argv, GMU) == "0.9"
    assert servecmd.flag_value(servecmd.with_flag(argv, GMU, 0.5), GMU) == "0.5"


# ---- the launcher is not a setting -----------------------------------------------------------------

@pytest.mark.parametrize("argv", [
    ["python", "-m", "autotune.testing.fake_vllm", "--profile", "p", "--max-num-seqs", "8"],
    ["/usr/bin/python3.12", "-m", "autotune.testing.fake_vllm", "--profile", "p", "--max-num-seqs", "8"],
    ["./serve.sh", "--profile", "p", "--max-num-seqs", "8"],
])
def test_a_launchers_program_and_its_m_are_not_options(argv):
    options = servecmd.long_options(argv)
    assert options == {"profile": "p", "max-num-seqs": 8}


# vLLM's human_readable_int (its type for --max-model-len, --kv-cache-memory-bytes, --max-num-batched-tokens):
# lowercase k m g t are decimal, uppercase binary and whole numbers only, anything else as Python's int().
SIZES = ["128m", "128M", "2g", "2G", "25.6k", "64K", " 64k ", "1.5K", "1.5G", "1t", "1T", "134217728", "32_768",
         "+5", "1e3", "0x10", "128MiB", "2GB", "lots", ""]
READ_AS_VLLM = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
from vllm.utils.argparse_utils import human_readable_int

out = []
for text in json.load(sys.stdin):
    try:
        out.append(human_readable_int(text))
    except Exception:
        out.append(None)
print(json.dumps(out))
"""


def _ours(text):
    try:
        return servecmd.human_readable_int(text)
    except ValueError:
        return None


def test_human_readable_int_reads_a_size_as_the_installed_vllm_does():
    vllm_reads = installed_vllm.run_json(READ_AS_VLLM, SIZES)
    assert vllm_reads[:2] == [128_000_000, 128 << 20]  # 128m is decimal, 128M binary
    assert [_ours(text) for text in SIZES] == vllm_reads


def test_human_readable_int_says_why_a_size_is_refused():
    with pytest.raises(ValueError, match="1.5K: decimals are not allowed with binary suffixes like K; did you mean "
                                         "1.5k"):
        servecmd.human_readable_int("1.5K")
    with pytest.raises(ValueError, match="'128MiB' is not a whole number"):
        servecmd.human_readable_int("128MiB")
