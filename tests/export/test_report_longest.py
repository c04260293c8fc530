"""Issue 35: the sizing report says the longest length that boots beside vLLM's own figure, how the top
was proved, the slope, and names the levers that act on it where its cause says they help."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from autotune.cli import cli
from tests.helpers.replay import fake

CPU = "cpu-0.32.0-tiny"
GMU = ["--model", "tiny", "--gpu-memory-utilization", "0.2"]


def report_of(runs, *flags) -> str:
    result = CliRunner().invoke(cli, ["tune", "--json", "--quiet", "--probe", "none", "--strategy", "auto",
                                      "--runs-dir", str(runs), "--target", "1048576", "--", *fake(CPU, *GMU, *flags)],
                                catch_exceptions=False)
    record = json.loads(result.output[result.output.index("{"):])
    return (Path(runs) / record["run_id"] / "sizing-report.md").read_text()


@pytest.mark.usefixtures("replay_in_process")
def test_the_report_names_the_levers_that_act_on_the_slope(tmp_path):
    text = report_of(tmp_path, "--no-enable-chunked-prefill")
    assert "## The longest length that boots" in text
    assert "vLLM's auto fits 306,048; this command serves 423,552 (+38.4 %)." in text
    assert "Proved: the verified boot's own pool holds no step more (attempt 3:" in text
    assert "- fewer --max-num-seqs: the CPU runner keeps max_num_seqs x max_model_len token buffers" in text
    assert "- chunked prefill on (--enable-chunked-prefill), or a lower --max-num-batched-tokens" in text


@pytest.mark.usefixtures("replay_in_process")
def test_a_pool_that_does_not_move_has_no_such_section(tmp_path):
    assert "## The longest length that boots" not in report_of(tmp_path, "--kv-cache-memory-bytes", "3G")


@pytest.mark.usefixtures("replay_in_process")
def test_with_one_sequence_only_chunked_prefill_is_left_to_name(tmp_path):
    text = report_of(tmp_path, "--max-num-seqs", "1", "--no-enable-chunked-prefill")
    assert "this command serves 453,120 (+17.0 %)" in text
    levers = text[text.index("Levers that act on the slope"):text.index("## Concurrency")]
    assert "chunked prefill on" in levers and "fewer --max-num-seqs" not in levers
