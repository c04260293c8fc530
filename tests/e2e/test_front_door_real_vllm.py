"""Production front doors on real vLLM (CPU backend): API keys, TLS, kept servers, no secret written.

One story per module, in the order a user lives it, with as few boots as it can:

1. a tune of a server with --api-key and a self-signed TLS certificate, kept serving;
2. `autotune clean`: the kept server is listed and left running;
3. a following tune, keyed by VLLM_API_KEY in the environment: the kept server survives it too;
4. the paste-ready files (command.sh and vllm-config.yaml of 1, command.sh of 3) boot as
   written with the key set in the environment;
5. `autotune stop` stops the kept server, checking it is still the same process;
6. a server whose key autotune cannot find (a wrapper script reads it from a file) ends with
   the front-door diagnosis and its exit code.

The keys' values are searched for in every file of the runs folder and in all output.
"""
from __future__ import annotations

import json
import os
import shlex
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from autotune.host import processes
from autotune.server import client, health
from autotune.store import redact
from autotune.testing.selfsigned import make_self_signed
from tests.conftest import vllm_serve_argv
from tests.helpers.cli import keep_output, run_autotune

pytestmark = [pytest.mark.vllm, pytest.mark.long(240)]

KV = ["--kv-cache-memory-bytes", "128M"]
KEY = "sk-e2e-argv-7f3c9a1d5e"  # given as --api-key
ENV_KEY = "sk-e2e-env-5b2e8d40aa"  # given as VLLM_API_KEY
FILE_KEY = "sk-e2e-file-0c61f2b9d3"  # read by a wrapper script autotune cannot see into
EXIT_FRONT_DOOR = 9


def record_of(runs_dir: Path, run_id: str) -> dict:
    return json.loads((runs_dir / run_id / "run.json").read_text())


def newest_run(runs_dir: Path, exclude=()) -> str:
    return sorted(p.name for p in runs_dir.iterdir() if p.is_dir() and p.name not in exclude)[-1]


def assert_written_nowhere(secret: str, runs_dir: Path, *outputs: str) -> None:
    for path in runs_dir.rglob("*"):
        if path.is_file():
            assert secret not in path.read_text(errors="replace"), path
    for text in outputs:
        assert secret not in text


def wait_until_serving(door: client.FrontDoor, server: processes.ServerProcess, log: Path, limit_s: float = 300):
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and server.poll() is None and not health.health_ok(door):
        list(server.lines(timeout=0.5))
    assert health.health_ok(door), log.read_text()[-3000:]


@pytest.fixture(scope="module")
def story(tiny_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("front-door")
    runs_dir = folder / "runs"
    keyfile, certfile = make_self_signed(folder / "tls")
    port = processes.free_port()
    keyed_tls = vllm_serve_argv(tiny_model, *KV, "--api-key", KEY, "--ssl-keyfile", str(keyfile),
                                "--ssl-certfile", str(certfile), "--port", str(port))
    s = SimpleNamespace(runs_dir=runs_dir, keyfile=keyfile, certfile=certfile, port=port, model=tiny_model,
                        folder=folder)
    # 1. key + TLS, kept serving
    s.first = run_autotune("--target", "4096", "--keep-serving", "--", *keyed_tls, runs_dir=runs_dir)
    s.first_id = newest_run(runs_dir)
    s.door = client.front_door(keyed_tls, {}, port)
    s.alive_after_first = health.health_ok(s.door)
    # 2. clean leaves it alone
    s.clean = run_autotune("clean", "--json", runs_dir=runs_dir)
    # the kept server is the verified command relaunched as command.sh says (the numeric length, server/handover.py)
    s.alive_after_clean = health.health_ok(s.door) and bool(health.served_models(s.door))
    s.runs_listing = run_autotune("runs", runs_dir=runs_dir)
    s.show_first = run_autotune("show", s.first_id, runs_dir=runs_dir)
    # 3. a following tune, keyed from the environment
    s.second = run_autotune("--target", "4096", "--", *vllm_serve_argv(tiny_model, *KV), runs_dir=runs_dir,
                            env={"VLLM_API_KEY": ENV_KEY})
    s.second_id = newest_run(runs_dir, exclude={s.first_id})
    s.alive_after_second = health.health_ok(s.door)
    for name in ("first", "clean", "runs_listing", "show_first", "second"):
        keep_output(folder, name, getattr(s, name))
    yield s
    # whatever a failed test left: stop the kept server by its recorded identity
    run_autotune("stop", s.first_id, runs_dir=runs_dir)


def test_a_keyed_https_tune_is_verified_and_probed_over_https(story):
    assert story.first.returncode == 0, story.first.stdout + story.first.stderr[-3000:]
    record = record_of(story.runs_dir, story.first_id)
    attempt = record["attempts"][-1]
    assert attempt["outcome"] == "verified"
    door = attempt["verification"]["door"]
    assert door["url"] == f"https://127.0.0.1:{story.port}" and door["api_key"] == "from --api-key"
    assert "pinned to the server's own --ssl-certfile" in door["tls_verify"]
    assert attempt["probe"]["ok"], attempt["probe"]["reason"]
    assert record["command"]["argv"][record["command"]["argv"].index("--api-key") + 1] == "${VLLM_API_KEY}"
    assert "Verified: --max-model-len 4,096" in story.first.stdout
    assert "disagree" not in story.first.stderr  # vLLM prints the key masked: not a disagreement


def test_a_tune_keyed_by_vllm_api_key_is_verified_and_probed(story):
    assert story.second.returncode == 0, story.second.stdout + story.second.stderr[-3000:]
    attempt = record_of(story.runs_dir, story.second_id)["attempts"][-1]
    assert attempt["verification"]["door"]["api_key"] == "from VLLM_API_KEY"
    assert attempt["probe"]["ok"], attempt["probe"]["reason"]


def test_no_key_is_written_anywhere(story):
    outputs = [p.stdout + p.stderr for p in (story.first, story.clean, story.runs_listing, story.show_first,
                                             story.second)]
    assert_written_nowhere(KEY, story.runs_dir, *outputs)
    assert_written_nowhere(ENV_KEY, story.runs_dir, *outputs)
    # vLLM 0.32 masks the key in its own non-default args line
    log = (story.runs_dir / story.first_id / record_of(story.runs_dir, story.first_id)["attempts"][-1]["log"])
    assert "'api_key': '***'" in log.read_text()
    assert record_of(story.runs_dir, story.second_id)["environment"]["VLLM_API_KEY"] == "***"


def test_a_kept_server_survives_clean_and_a_following_tune_and_says_where_it_serves(story):
    assert story.alive_after_first
    found = json.loads(story.clean.stdout)
    kept = [c for c in found if c["action"] == "kept_serving"]
    assert len(kept) == 1 and f"`autotune stop {story.first_id}`" in kept[0]["detail"]
    assert story.alive_after_clean
    assert "kept by --keep-serving" in story.second.stderr  # the following tune lists it too
    assert story.alive_after_second
    url = f"https://127.0.0.1:{story.port}"
    assert "serving" in story.runs_listing.stdout
    assert f"serving:  {url}" in story.show_first.stdout and f"autotune stop {story.first_id}" in story.show_first.stdout


def _boot_written(line: str, env: dict, log: Path) -> processes.ServerProcess:
    return processes.ServerProcess(["bash", "-c", line], env={**os.environ, **env}, log_path=log)


def test_the_paste_ready_files_boot_as_written_with_the_key_in_the_environment(story):
    run_dir = story.runs_dir / story.first_id
    command = (run_dir / "command.sh").read_text()
    assert KEY not in command and '--api-key "${VLLM_API_KEY}"' in command
    assert "# set VLLM_API_KEY in the environment first" in command
    yaml_text = (run_dir / "vllm-config.yaml").read_text()
    usage = next(line for line in yaml_text.splitlines() if line.startswith("# usage: ")).removeprefix("# usage: ")
    assert "api-key" not in yaml_text.split("# usage:")[1].split("\n", 1)[1]  # only on the usage line
    second_command = (story.runs_dir / story.second_id / "command.sh").read_text()
    assert "VLLM_API_KEY=$VLLM_API_KEY" in second_command
    cases = [("command.sh (key + TLS)", command.splitlines()[-1], {"VLLM_API_KEY": KEY}, run_dir),
             ("vllm-config.yaml (key + TLS)", usage.split("   (or:")[0], {"VLLM_API_KEY": KEY}, run_dir),
             ("command.sh (VLLM_API_KEY)", second_command.splitlines()[-1], {"VLLM_API_KEY": ENV_KEY},
              story.runs_dir / story.second_id)]
    for name, line, env, cwd in cases:
        port = processes.free_port()
        log = story.folder / f"rerun-{port}.log"
        server = _boot_written(f"cd {shlex.quote(str(cwd))} && {line} --port {port}", env, log)
        try:
            argv = redact.resolve_argv(shlex.split(line), env) + ["--port", str(port)]
            door = client.front_door_of(argv, env, port, cwd=str(cwd))
            wait_until_serving(door, server, log)
            ok, reason, _ = health.check_serving(door, 4096)  # the length the tunes verified
            assert ok, f"{name}: {reason}"
            # the key is in force: without it the same server turns autotune away
            bare = client.FrontDoor(port=port, scheme=door.scheme, certfile=door.certfile)
            with pytest.raises(health.FrontDoorRefused, match="wants an API key"):
                health.served_models(bare)
        finally:
            report = server.stop()
        assert report.leftover_pids == [], name


def test_stop_ends_the_kept_server_on_request(story):
    marker = json.loads((story.runs_dir / story.first_id / "server.json").read_text())
    stopped = run_autotune("stop", story.first_id, "--json", runs_dir=story.runs_dir)
    keep_output(story.folder, "stop", stopped)
    keep_output(story.folder, "show_after_stop", run_autotune("show", story.first_id, runs_dir=story.runs_dir))
    assert stopped.returncode == 0, stopped.stderr
    assert json.loads(stopped.stdout)["pid"] == marker["pid"]
    assert not psutil.pid_exists(marker["pid"]) or psutil.Process(marker["pid"]).status() == psutil.STATUS_ZOMBIE
    assert not health.health_ok(story.door)
    assert record_of(story.runs_dir, story.first_id)["result"]["serving"]["stopped"]["by"] == "autotune stop"
    again = run_autotune("stop", story.first_id, runs_dir=story.runs_dir)
    assert again.returncode == 1 and "has no server kept serving" in again.stderr


def test_a_keyed_server_whose_key_autotune_cannot_find_ends_with_the_front_door_diagnosis(tiny_model, tmp_path):
    (tmp_path / "key").write_text(FILE_KEY)
    wrapper = tmp_path / "serve.sh"  # a wrapper that reads the key from a secrets file
    wrapper.write_text("#!/bin/sh\nexec " + shlex.join(vllm_serve_argv(tiny_model, *KV))
                       + f' --api-key "$(cat {shlex.quote(str(tmp_path / "key"))})" "$@"\n')
    wrapper.chmod(0o755)
    runs_dir = tmp_path / "runs"
    proc = run_autotune("--target", "4096", "--probe", "none", "--", str(wrapper), "--model", str(tiny_model),
                        runs_dir=runs_dir)
    keep_output(tmp_path, "no_key", proc)
    assert proc.returncode == EXIT_FRONT_DOOR, proc.stdout + proc.stderr[-3000:]
    assert "wants an API key and autotune found none" in proc.stdout
    assert "does not serve the length" not in proc.stdout + proc.stderr
    record = record_of(runs_dir, newest_run(runs_dir))
    assert record["result"]["verdict"] == "front_door"
    assert record["attempts"][-1]["outcome"] == "front_door"
    # vLLM printed the key in its log: learned from that line, it is scrubbed there too
    assert_written_nowhere(FILE_KEY, runs_dir, proc.stdout, proc.stderr)
