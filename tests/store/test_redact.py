"""redact.py: secrets of the serve command and its environment never written, always resolvable."""
from __future__ import annotations

import json

import pytest

from autotune.store import redact
from autotune.store.record import RunRecord

ARGV = ["vllm", "serve", "m", "--api-key", "sk-live-abcdef123", "--hf-token=hf_tokenvalue42",
        "--ssl-keyfile", "/etc/tls/server.key", "--tokenizer", "https://me:pa55word99@hub.example/t?token=qwerty12345&x=1",
        "--max-model-len", "4096"]


def test_find_secrets_names_each_by_the_variable_that_stands_for_it():
    found = redact.find_secrets(ARGV, {"HF_TOKEN": "hf_envvalue777", "HOME": "/root", "VLLM_API_KEY": "***"})
    assert found == {"hf_envvalue777": "HF_TOKEN", "sk-live-abcdef123": "VLLM_API_KEY",
                     "hf_tokenvalue42": "HF_TOKEN", "pa55word99": "URL_PASSWORD", "qwerty12345": "URL_TOKEN"}


@pytest.mark.parametrize("option, env", [("--api-key", "VLLM_API_KEY"), ("--hf-token", "HF_TOKEN"),
                                         ("--my-secret", "MY_SECRET"), ("--db_password", "DB_PASSWORD"),
                                         ("--ssl-keyfile", None), ("--max-model-len", None), ("--tokenizer", None)])
def test_which_options_hold_a_secret(option, env):
    assert redact.secret_option_env(option) == env


def test_scrubbed_records_hold_references_and_resolve_back():
    scrubber = redact.Scrubber(redact.find_secrets(ARGV))
    record = {"argv": ARGV, "log_tail": ["non-default args: {'api_key': ['sk-live-abcdef123']}"]}
    text = json.dumps(scrubber.obj(record))
    for value in ("sk-live-abcdef123", "hf_tokenvalue42", "pa55word99", "qwerty12345"):
        assert value not in text
    argv = scrubber.obj(ARGV)
    assert argv[4] == "${VLLM_API_KEY}" and argv[5] == "--hf-token=${HF_TOKEN}"
    env = {"VLLM_API_KEY": "sk-live-abcdef123", "HF_TOKEN": "hf_tokenvalue42", "URL_PASSWORD": "pa55word99",
           "URL_TOKEN": "qwerty12345"}
    assert redact.resolve_argv(argv, env) == ARGV


def test_a_recorded_command_without_its_secret_in_the_environment_says_what_to_set():
    with pytest.raises(redact.MissingSecret, match="takes VLLM_API_KEY from the environment"):
        redact.resolve_argv(["vllm", "serve", "m", "--api-key", "${VLLM_API_KEY}"], {})
    # a ${NAME} the user typed that is not a secret's stays as typed
    assert redact.resolve_argv(["echo", "${HOME}"], {"HOME": "/root"}) == ["echo", "${HOME}"]


def test_a_short_secret_is_replaced_as_a_whole_word_only():
    scrubber = redact.Scrubber(redact.find_secrets(["vllm", "--api-key", "abc"]))
    assert scrubber.obj(["--api-key", "abc", "abcdef"]) == ["--api-key", "${VLLM_API_KEY}", "abcdef"]


def test_remembered_secrets_are_scrubbed_from_events_and_bytes():
    redact.remember(["x", "--api-key", "sk-remembered-0042"])
    seen = []
    redact.scrubbing(lambda kind, **d: seen.append((kind, d)))("log_line", text="key sk-remembered-0042 here")
    assert seen == [("log_line", {"text": "key ${VLLM_API_KEY} here"})]
    assert redact.scrub(b"... sk-remembered-0042\n") == b"... ${VLLM_API_KEY}\n"


def test_old_records_are_masked_from_their_own_commands():
    old = {"command": {"argv": ["vllm", "serve", "m", "--api-key", "sk-old-record-1"]},
           "attempts": [{"argv": ["vllm", "serve", "m", "--api-key", "sk-old-record-1"],
                         "log_tail": ["api_key: sk-old-record-1"]}]}
    shown = redact.record_scrubber(RunRecord.from_dict(old)).obj(old)
    assert "sk-old-record-1" not in json.dumps(shown)


def test_secrets_in_assignments_and_in_vllms_non_default_args_line():
    assert redact.find_secrets(["env", "VLLM_API_KEY=sk-assigned-001", "vllm", "serve", "m"]) == \
        {"sk-assigned-001": "VLLM_API_KEY"}
    line = (b"(APIServer pid=7) INFO 11-30 12:00:00 [utils.py:1] non-default args: {'model_tag': 'm', "
            b"'api_key': ['sk-from-a-wrapper-77'], 'port': 8000}\n")
    assert redact.scrub_log_line(line) == line.replace(b"sk-from-a-wrapper-77", b"${VLLM_API_KEY}")
    assert redact.scrub("later: sk-from-a-wrapper-77") == "later: ${VLLM_API_KEY}"  # learned for good
    masked = b"non-default args: {'port': 1, 'api_key': '***'}\n"  # vLLM 0.32 masks it itself
    assert redact.scrub_log_line(masked) == masked and redact.scrub(["***"]) == ["***"]


def test_a_short_environment_secret_does_not_rewrite_ordinary_values():
    assert redact.find_secrets([], {"SOME_KEY": "auto", "HF_TOKEN": "hf_long_enough"}) == {"hf_long_enough": "HF_TOKEN"}
