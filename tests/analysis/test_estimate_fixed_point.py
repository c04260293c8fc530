"""Issue 35: predict from the model files alone gives the fixed point where the command's settings
make the pool shrink as --max-model-len grows (vLLM's CPU backend sized by gmu: max_num_seqs x 5 B per
token of length), labelled as such; vLLM's estimate, labelled as such, where nothing moves it."""

import json
import shlex

import pytest
from click.testing import CliRunner

from autotune.analysis import estimate
from autotune.cli.main import cli
from autotune.model import files as mf
from autotune.vllm import kv_pool
from tests.helpers.model_folders import gqa_folder

GIB = 2**30


@pytest.fixture(scope="module")
def gqa(tmp_path_factory):
    return gqa_folder(tmp_path_factory.mktemp("m") / "gqa")


def predicted(model, *flags):
    argv = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), *flags]
    result = CliRunner().invoke(cli, ["predict", "--device-memory", "23.54GiB", "--device", "cpu",
                                      "--runs-dir", "/nonexistent-runs", "--command", shlex.join(argv), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def ceiling_of(p):
    return next(f for f in p["figures"] if f["name"] == "ceiling")


def test_with_the_cpu_backends_default_sequences_the_ceiling_is_the_fixed_point(gqa):
    p = predicted(gqa, "--gpu-memory-utilization", "0.06")
    ceiling = ceiling_of(p)
    assert p["ceiling_is"] == "fixed_point" and ceiling["source"].startswith("the fixed point"), ceiling
    assert "640 B of the pool per token of length" in ceiling["source"]  # 128 sequences x 5 B
    one = predicted(gqa, "--gpu-memory-utilization", "0.06", "--max-num-seqs", "1")
    assert one["ceiling_is"] == "fixed_point" and ceiling_of(one)["value"] > ceiling["value"]  # 5 B, not 640


def test_the_fixed_point_is_the_longest_length_whose_own_pool_holds_it(gqa):
    shape, settings = mf.kv_shape(mf.read_config(gqa)), kv_pool.Settings(128, 4096)
    available, per_token = 3.5 * GIB, 640
    top = estimate.fixed_point(shape, settings, available, per_token, 0, 10_000_000)

    def holds(length):
        return kv_pool.max_model_len(shape, settings, int(available - per_token * length), 10_000_000) >= length

    assert top % 128 == 0 and holds(top) and not holds(top + 128)
    assert top < kv_pool.max_model_len(shape, settings, int(available), 10_000_000)  # below the pool with no buffers


def test_a_fixed_pool_gives_vllms_estimate_and_says_so(gqa):
    p = predicted(gqa, "--kv-cache-memory-bytes", "2G")
    assert p["ceiling_is"] == "vllm_estimate"
    assert ceiling_of(p)["source"] == "the longest --max-model-len vLLM accepts (its refusal's estimate)"
