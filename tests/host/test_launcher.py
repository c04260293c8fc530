"""The launcher seam (host/launcher.py): every boot and every question of a tune go through the
current launcher; the in-process one (testing/inprocess.py) answers as the process one does."""

from __future__ import annotations

import json
import os
import sys

from autotune.host import launcher, machine
from autotune.testing import profiles
from autotune.testing.inprocess import InProcessLauncher, ThreadServer, replaying_in_process
from tests.helpers.cli import invoke_autotune
from tests.helpers.replay import fake


def test_the_in_process_launcher_answers_the_questions_as_the_replaying_process_does():
    argv = fake("v1-0.17.0-auto-probe", scale="0")
    env = dict(os.environ)
    by_process = (launcher.detect_version(argv, env), launcher.gpus_for(argv, env))
    with replaying_in_process():
        in_process = (launcher.detect_version(argv, env), launcher.gpus_for(argv, env))
    assert by_process == in_process
    assert by_process[0] == "0.17.0"
    assert by_process[1].gpus == profiles.by_name("v1-0.17.0-auto-probe").nvml_inventory()
    assert by_process[1].elsewhere  # not this machine's


def test_a_command_that_is_not_the_replay_is_asked_by_a_process_whatever_the_launcher():
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    with replaying_in_process():
        assert launcher.detect_version(argv, dict(os.environ)) == launcher.ProcessLauncher().ask(
            argv, dict(os.environ), "--print-version", 30)
        assert launcher.gpus_for(argv) == machine.GpuInventory(*machine.gpu_facts())  # this machine's NVML
        assert launcher.gpus_for(argv).elsewhere is None  # only the replay stands for other GPUs


def test_the_launcher_is_the_default_again_after_the_block_even_when_it_raised():
    inside = InProcessLauncher()
    try:
        with launcher.use_launcher(inside):
            assert launcher.current() is inside
            raise KeyError("out of the block")
    except KeyError:
        pass
    assert isinstance(launcher.current(), launcher.ProcessLauncher)
    assert not isinstance(launcher.current(), InProcessLauncher)


class CountedServer(ThreadServer):
    started: list[list[str]] = []

    def __init__(self, argv, env, log_path, cwd=None):
        CountedServer.started.append(list(argv))
        super().__init__(argv, env, log_path, cwd)


def test_every_boot_of_a_tune_is_started_by_the_current_launcher():
    CountedServer.started = []
    with replaying_in_process(CountedServer):
        result = invoke_autotune("tune", "--target", "64K", "--strategy", "refusal", "--probe", "none", "--json",
                                 "--quiet", "--", *fake("seed-3090-qwen3.6-27b", scale="0"))
    record = json.loads(result.stdout)
    assert result.exit_code == 0, result.output
    assert [a["argv"] for a in record["attempts"]] == CountedServer.started
    assert len(CountedServer.started) == len(record["attempts"]) >= 2  # refused, then the ceiling
    assert {a["pid"] for a in record["attempts"]} == {os.getpid()}  # served in this process, no child


def test_the_launcher_says_what_a_stand_in_stands_for_and_vllm_stands_for_itself():
    stood_in = launcher.stand_in([*fake("v1-0.17.0-auto-probe"), "--max-num-seqs", "1", "--print-gpus"])
    assert stood_in.argv == ["vllm", "serve", "--max-num-seqs", "1"]  # the replay's own options and questions out
    assert stood_in.what == "autotune's replaying vLLM (profile v1-0.17.0-auto-probe)"
    assert launcher.stand_in(["vllm", "serve", "m", "--max-num-seqs", "1"]) is None
