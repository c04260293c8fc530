"""The paste-ready files: each one starts the same server the run verified.

The records are real run.json files (tests/fixtures/progress) and variations of them with a
pinned GPU, secrets, and the kinds of options real serve commands carry. The checks read
each file the way its consumer does: the shell (shlex), YAML, and vLLM's OWN argument
parser (the installed vLLM: tests/helpers/installed_vllm.py), which must read
vllm-config.yaml into exactly the settings the command line gives.
"""
from __future__ import annotations

import re
import shlex
import subprocess

import pytest
import yaml

from autotune.export import local, verified
from autotune.store.record import RunRecord
from autotune.store.redact import is_secret
from tests.helpers import installed_vllm
from tests.helpers.emit_records import gpu_record, real


def typed(rec: dict) -> RunRecord:
    """The record as the renderers take it (artifact.load gives the same)."""
    return RunRecord.from_dict(rec)


RECORDS_UNDER_TEST = {
    "cpu-refusal": lambda: real(),
    "cpu-auto": lambda: real("cpu-0.32.0-auto-verified.run.json"),
    "gpu-pinned": gpu_record,
}


@pytest.fixture(params=sorted(RECORDS_UNDER_TEST))
def record(request):
    return RECORDS_UNDER_TEST[request.param]()


def env_and_argv(line: str) -> tuple[dict[str, str], list[str]]:
    words = shlex.split(line)
    env = {}
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    return env, words


# ---------------------------------------------------------------------------
# command.sh
# ---------------------------------------------------------------------------

def test_command_sh_is_a_script_of_comments_then_one_command_line_that_round_trips(record):
    text = local.render_command(typed(record))
    lines = text.splitlines()
    secrets = verified.secret_names(typed(record))
    assert lines[0] == "#!/bin/sh" and lines[1].startswith("# verified by autotune ")
    assert all(line.startswith("#") for line in lines[:-1]) and not lines[-1].startswith("#")
    assert f"with vLLM {record['vllm_version']} on 2026-11-29" in lines[1]
    if secrets:
        assert lines[2].startswith(f"# set {', '.join(secrets)} in the environment first")
    env, argv = env_and_argv(lines[-1])
    # every secret of the command is a reference to a variable; the rest is as verified, and a local
    # model's folder is served under its base name, as in every other file
    served = [] if "--served-model-name" in record["result"]["final_argv"] else ["--served-model-name", "tiny-llama"]
    assert argv == [{"key-one": "${VLLM_API_KEY}", "key-two": "${VLLM_API_KEY_2}"}.get(a, a)
                    for a in record["result"]["final_argv"]] + served
    if not record["command"].get("cwd"):  # an old record: the note says where the relative paths start
        assert "# run it from the folder autotune ran in (the run recorded none): .venv/bin/python " \
               ".demo/tiny-llama are relative to it" in lines
    # environment first, as recorded; the secret (recorded as ***) refers to the user's own variable
    assert env == {k: (f"${k}" if is_secret(k) else v) for k, v in record["environment"].items()}
    assert list(env) == list(record["environment"])
    assert "***" not in text


def test_the_secret_is_a_shell_reference_expanded_by_the_shell_that_runs_it(tmp_path):
    line = local.command_line(typed(gpu_record()))
    assert "HF_TOKEN=$HF_TOKEN" in line.split()
    # run the line's environment part in a real shell, with the program replaced by `env`
    env, _ = env_and_argv(line)
    script = " ".join(f"{k}={shlex.quote(v) if not v.startswith('$') else v}" for k, v in env.items()) + " env"
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True,
                         env={"HF_TOKEN": "hf_from_the_users_shell", "PATH": "/usr/bin:/bin"}).stdout
    assert "HF_TOKEN=hf_from_the_users_shell" in out.splitlines()
    assert "VLLM_CACHE_ROOT=/data/vllm 100%$cache" in out.splitlines()


def test_command_sh_runs_from_any_folder(tmp_path):
    """`make demo`'s run: .venv/bin/python and .demo/tiny-llama relative to the folder it ran in. The
    script in the run folder runs, as ./command.sh, from another folder: executable, a shebang, its
    paths absolute (the program here prints the words it was given)."""
    tuned_in = tmp_path / "project"
    program = tuned_in / ".venv" / "bin" / "python"
    program.parent.mkdir(parents=True)
    program.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    program.chmod(0o755)
    (tuned_in / ".demo" / "tiny-llama").mkdir(parents=True)
    rec = real()
    rec["command"]["cwd"] = str(tuned_in)
    run_dir = tmp_path / "runs" / "20261129T104543Z-tiny-llama"
    run_dir.mkdir(parents=True)
    local.write_all(run_dir, typed(rec))
    assert (run_dir / "command.sh").stat().st_mode & 0o777 == 0o755
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = subprocess.run([str(run_dir / "command.sh")], cwd=elsewhere, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    words = out.stdout.splitlines()
    assert words[:3] == ["-m", "vllm.entrypoints.openai.api_server", "--model"]
    assert words[3] == f"{tuned_in}/.demo/tiny-llama" and words[-2:] == ["--served-model-name", "tiny-llama"]


@pytest.mark.parametrize("argv, expected", [
    (["vllm", "serve", "Qwen/Qwen3-8B", "--config", "cfg.yaml"], ["vllm", "serve", "Qwen/Qwen3-8B", "--config", "/r/cfg.yaml"]),
    (["./venv/bin/vllm", "serve", "models/a/b", "--ssl-keyfile=key.pem"],
     ["/r/venv/bin/vllm", "serve", "/r/models/a/b", "--ssl-keyfile=/r/key.pem"]),
    (["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "../m", "--chat-template", "{{ x }}",
      "--api-key", "${VLLM_API_KEY}"],
     ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/r/../m", "--chat-template", "{{ x }}",
      "--api-key", "${VLLM_API_KEY}"]),
])
def test_command_sh_anchors_each_relative_path_at_the_recorded_folder(argv, expected):
    assert verified.anchored(argv, "/r") == expected
    assert verified.anchored(argv, None) == argv  # no folder recorded: the note says where they start


# ---------------------------------------------------------------------------
# vllm-config.yaml, checked against the installed vLLM
# ---------------------------------------------------------------------------

VLLM_PARSE = r"""
import json, re, sys, warnings
warnings.simplefilter("ignore")
from vllm.utils.argparse_utils import FlexibleArgumentParser

try:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
except ImportError:  # older layouts
    from vllm.entrypoints.openai.cli_args import make_arg_parser

def parser():
    return make_arg_parser(FlexibleArgumentParser(description="vLLM OpenAI-Compatible RESTful API server."))

def settings(args):
    found = {k: repr(v) for k, v in sorted(vars(args).items())}
    model_tag = found.pop("model_tag", "None")
    if model_tag != "None":  # `vllm serve MODEL` and `model: MODEL` mean the same
        found["model"] = model_tag
    return found

cases = json.load(sys.stdin)
out = {"help": parser().format_help(), "results": []}
for case in cases:
    out["results"].append({"from_config": settings(parser().parse_args(["--config", case["config"], *case["extra"]])),
                           "from_argv": settings(parser().parse_args(case["argv"]))})
print(json.dumps(out))
"""


@pytest.fixture(scope="session")
def vllm_reads(tmp_path_factory):
    """For every record under test: what vLLM's own parser makes of vllm-config.yaml and of the
    command's options; plus vLLM's --help text."""
    folder = tmp_path_factory.mktemp("yaml")
    cases, names = [], sorted(RECORDS_UNDER_TEST)
    for name in names:
        rec = RECORDS_UNDER_TEST[name]()
        path = folder / f"{name}.yaml"
        path.write_text(local.render_yaml(typed(rec)))
        argv = local.served_argv(typed(rec))  # command.sh's: the served name every file gives
        cmd = verified.parse_vllm_command(argv)
        # vllm-config.yaml's usage line adds the options that hold a secret reference
        usage = next(line for line in path.read_text().splitlines() if line.startswith("# usage: "))
        extra = shlex.split(usage.split("--config vllm-config.yaml", 1)[1].split("   (or:")[0])
        cases.append({"config": str(path), "extra": extra, "argv": argv[len(cmd.launcher):]})
    out = installed_vllm.run_json(VLLM_PARSE, cases)
    return out["help"], dict(zip(names, out["results"], strict=True))


def test_vllms_help_lists_the_long_options(vllm_reads):
    help_text, _ = vllm_reads
    # the same text `python -m vllm.entrypoints.openai.api_server --help` prints
    assert "--max-model-len" in help_text and "--kv-cache-memory-bytes" in help_text


def test_vllm_config_yaml_loads_and_every_key_is_a_vllm_long_option(record, vllm_reads):
    help_text, _ = vllm_reads
    long_options = set(re.findall(r"(?<![\w-])--([a-z0-9][a-z0-9-]*)", help_text))
    text = local.render_yaml(typed(record))
    config = yaml.safe_load(text)
    assert isinstance(config, dict) and config
    for key in config:
        assert key in long_options, f"{key!r} is not a long option of the installed vLLM"
    assert config["max-model-len"] == record["result"]["ceiling"]
    assert f"with vLLM {record['vllm_version']} on 2026-11-29" in text.splitlines()[0]


@pytest.mark.parametrize("name", sorted(RECORDS_UNDER_TEST))
def test_vllm_reads_the_config_file_into_the_same_settings_as_the_command(name, vllm_reads):
    _, results = vllm_reads
    read = results[name]
    assert read["from_config"] == read["from_argv"]
    assert read["from_argv"]["max_model_len"] in ("16256", "61152")
    assert read["from_config"]["served_model_name"] in ("['tiny-llama']", "['qwen 27b']")


@pytest.mark.parametrize("value, text", [
    (True, "true"), (16256, "16256"), ("16256", "16256"), ("0.95", "0.95"), ("-1", "-1"),
    ("1.10", '"1.10"'), ("007", '"007"'), ("128M", '"128M"'), ("yes", '"yes"'), ("null", '"null"'),
    ("1e5", '"1e5"'), ('{"a": 1}', '"{\\"a\\": 1}"'), ("qwen 27b", '"qwen 27b"'),
])
def test_yaml_scalars_read_back_as_the_text_vllm_would_get(value, text):
    assert verified.yaml_scalar(value) == text
    loaded = yaml.safe_load(f"k: {text}")["k"]  # vLLM's loader then passes str(loaded) on
    assert loaded is True if value is True else str(loaded) == str(value)


# ---------------------------------------------------------------------------
# docker-compose.yml
# ---------------------------------------------------------------------------

def test_docker_compose_for_a_pinned_gpu():
    rec = gpu_record()
    text = local.render_compose(typed(rec))
    compose = yaml.safe_load(text)
    service = compose["services"]["vllm"]
    assert service["image"] == "vllm/vllm-openai:v0.32.0"
    assert service["ipc"] == "host"
    devices = service["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "device_ids": ["1"], "capabilities": ["gpu"]}]
    assert "# GPU 1: NVIDIA GeForce RTX 3090 (GPU-3090bbbb)" in text
    assert service["ports"] == ["8011:8011"]
    assert "${HOME}/.cache/huggingface:/root/.cache/huggingface" in service["volumes"]
    # the same vLLM options after the image, compose's $ escaping undone
    command = [word.replace("$$", "$") for word in service["command"]]
    assert command[:2] == ["--model", "Qwen/Qwen3.6-27B-AWQ"]
    assert verified.parse_vllm_command(["vllm", "serve", *command]).options == \
        verified.parse_vllm_command(verified.final_argv(typed(rec))).options
    assert "key-one" not in text and command[command.index("--api-key") + 1] == "${VLLM_API_KEY}"
    # inside the container the reserved GPU is device 0: no CUDA_VISIBLE_DEVICES there
    env = service["environment"]
    assert "CUDA_VISIBLE_DEVICES" not in env and "CUDA_DEVICE_ORDER" not in env
    assert env["HF_TOKEN"] == "${HF_TOKEN}" and env["VLLM_ATTENTION_BACKEND"] == "FLASH_ATTN"
    assert env["VLLM_CACHE_ROOT"] == "/data/vllm 100%$$cache"  # compose reads $$ as one $
    assert "***" not in text


def test_docker_compose_for_the_real_cpu_run_mounts_the_local_model_and_says_which_image():
    rec = real()
    rec["command"]["cwd"] = "/work/main"
    text = local.render_compose(typed(rec))
    service = yaml.safe_load(text)["services"]["vllm"]
    # vLLM's CPU image, as the Kubernetes files and SkyPilot use for this run (the CUDA one would not start)
    assert service["image"] == "public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:v0.32.0" and service["ipc"] == "host"
    assert "/work/main/.demo/tiny-llama:/models/tiny-llama:ro" in service["volumes"]
    assert service["command"][:2] == ["--model", "/models/tiny-llama"]
    assert service["ports"] == ["8000:8000"]  # autotune chose the port: the image's default
    assert "deploy" not in service  # no GPU was used
    assert "CPU backend" in text


def test_docker_compose_without_pinning_reserves_all_gpus():
    rec = gpu_record()
    del rec["environment"]["CUDA_VISIBLE_DEVICES"]
    devices = yaml.safe_load(local.render_compose(typed(rec)))["services"]["vllm"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]


# ---------------------------------------------------------------------------
# vllm.service
# ---------------------------------------------------------------------------

def unit_values(text: str, key: str) -> list[str]:
    return [line.split("=", 1)[1] for line in text.splitlines() if line.startswith(key + "=")]


def test_the_unit_runs_command_sh_s_command_with_the_same_environment(record):
    text = local.render_systemd(typed(record))
    line = local.render_command(typed(record)).splitlines()[-1]
    env, argv = env_and_argv(line.strip())
    command_part = " ".join(verified.shell_word(a) for a in argv)  # shlex's quoting; a ${secret} double-quoted
    if "/" in argv[0] and not argv[0].startswith("/"):
        # systemd runs only absolute paths: the relative python of `make demo` is made absolute
        # when the run recorded its folder, else a note says to set WorkingDirectory=
        assert "WorkingDirectory=" in text or "set WorkingDirectory=" in text
        command_part = command_part.split(" ", 1)[1]
        assert unit_values(text, "ExecStart")[0].endswith(" " + command_part)
    else:
        assert unit_values(text, "ExecStart") == [command_part]
    for key, value in env.items():
        if value == f"${key}":  # a secret: read from the environment file, never written
            assert "EnvironmentFile=-/etc/default/vllm" in text and f"{key}=" not in "".join(
                unit_values(text, "Environment"))
        else:
            assert f'"{key}={value.replace("%", "%%")}"' in unit_values(text, "Environment")
    assert unit_values(text, "Restart") == ["on-failure"]
    assert "[Install]" in text and unit_values(text, "WantedBy") == ["multi-user.target"]
    assert f"with vLLM {record['vllm_version']} on 2026-11-29" in text.splitlines()[0]
    assert "***" not in text


def test_the_unit_makes_a_relative_program_absolute_from_the_recorded_folder():
    rec = real()
    rec["command"]["cwd"] = "/work/main"
    text = local.render_systemd(typed(rec))
    assert unit_values(text, "WorkingDirectory") == ["/work/main"]
    assert unit_values(text, "ExecStart")[0].startswith("/work/main/.venv/bin/python -m vllm.entrypoints")


@pytest.mark.parametrize("word, written", [
    ("plain", "plain"), ("two words", "'two words'"), ("100%", '"100%%"'), ("$HOME", '"$$HOME"'),
    ('{"a": 1}', "'{\"a\": 1}'"), ("it's", '"it\'s"'), ("a\\b", '"a\\\\b"'),
])
def test_exec_start_words(word, written):
    assert local.systemd_word(word) == written


# ---------------------------------------------------------------------------
# All of them
# ---------------------------------------------------------------------------

def test_write_all_writes_every_file_atomically(tmp_path):
    names = local.write_all(tmp_path, typed(real()))
    # the four, then the deployment targets and the sizing report (tests/export/test_deploy.py)
    assert names == ["command.sh", "vllm-config.yaml", "docker-compose.yml", "vllm.service",
                     "values-production-stack.yaml", "ray-serve.yaml", "rayservice.yaml",
                     "kserve-inferenceservice.yaml", "kserve-llminferenceservice.yaml", "k8s-deployment.yaml", "skypilot.yaml",
                     "sizing-report.md"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names)  # no temporary file left
    assert (tmp_path / "command.sh").read_text() == local.render_command(typed(real()))


def test_a_run_without_a_verified_command_gives_no_file(tmp_path):
    rec = real()
    rec["result"] = {"verdict": "hung", "ceiling": None, "verified": False}
    assert local.write_all(tmp_path, typed(rec)) == [] and list(tmp_path.iterdir()) == []
    with pytest.raises(verified.NotEmittable, match="no verified command .verdict: hung"):
        local.render(typed(rec), local.COMPOSE)


def test_a_command_that_is_not_plain_vllm_gives_the_shell_and_systemd_files_only(tmp_path):
    rec = real()
    rec["result"]["final_argv"] = ["docker", "run", "--gpus", "all", "vllm/vllm-openai:v0.32.0",
                                   "--model", "m", "--max-model-len", "16256"]
    texts, skipped = local.render_all(typed(rec))
    assert sorted(texts) == ["command.sh", "vllm.service"]
    assert "not a plain `vllm serve` or api_server command" in skipped["vllm-config.yaml"]
    assert unit_values(texts["vllm.service"], "ExecStart") == [shlex.join(rec["result"]["final_argv"])]
    assert local.write_all(tmp_path, typed(rec)) == ["command.sh", "vllm.service"]


@pytest.mark.parametrize("argv, model, options", [
    (["vllm", "serve", "org/m", "--dtype", "half"], "org/m", [("dtype", "half")]),
    (["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "--model=/m", "--max_model_len", "-1"],
     "/m", [("max-model-len", "-1")]),
    (["vllm", "serve", "m", "-tp", "2", "-ep", "--api-key", "a", "b"], "m",
     [("tensor-parallel-size", "2"), ("enable-expert-parallel", True), ("api-key", ["a", "b"])]),
])
def test_parse_vllm_command(argv, model, options):
    cmd = verified.parse_vllm_command(argv)
    assert (cmd.model, cmd.options) == (model, options)


def test_an_unknown_short_option_is_refused_rather_than_guessed():
    with pytest.raises(verified.NotEmittable, match="-zz has no known long name"):
        verified.parse_vllm_command(["vllm", "serve", "m", "-zz", "1"])


def test_a_command_whose_config_file_is_gone_gets_no_merged_one():
    rec = real()
    rec["command"]["cwd"] = "/nonexistent"
    rec["result"]["final_argv"] = ["vllm", "serve", "--config", "mine.yaml", "--max-model-len", "16256"]
    with pytest.raises(verified.NotEmittable, match=r"--config /nonexistent/mine.yaml: No such file"):
        local.render_yaml(typed(rec))
    texts, skipped = local.render_all(typed(rec))
    assert "vllm-config.yaml" in skipped and "command.sh" in texts


def test_a_command_with_its_own_config_file_gets_the_merged_options(tmp_path):
    """issue 12: gmu and max-num-seqs in --config, the length a flag: one file with all of them,
    the flags over the file as vLLM reads them."""
    (tmp_path / "mine.yaml").write_text("model: m\ngpu-memory-utilization: 0.12\nmax-num-seqs: 1\nmax-model-len: 999\n")
    rec = real()
    rec["command"]["cwd"] = str(tmp_path)
    rec["result"]["final_argv"] = ["vllm", "serve", "--config", "mine.yaml", "--max-model-len", "16256"]
    text = local.render_yaml(typed(rec))
    body = [line for line in text.splitlines() if not line.startswith("#")]
    assert body == ['model: "m"', "gpu-memory-utilization: 0.12", "max-num-seqs: 1", "max-model-len: 16256"]
