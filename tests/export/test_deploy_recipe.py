"""`show --emit recipe`: the verified settings as a vllm-project/recipes hardware override, merged into
a real recipe and rendered by the recipes site's own command synthesis (vendored, tests/fixtures/recipes)
under Node.js; the command it gives a user of that GPU is read by the installed vLLM."""
from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys

import pytest
import yaml
from click.testing import CliRunner

from autotune.cli import cli
from autotune.export import local, recipe, targets
from autotune.export.verified import final_argv
from autotune.store import artifact
from autotune.store.record import RunRecord
from tests.helpers import deploy_checks as checks
from tests.helpers.emit_records import gpu_record, real
from tests.helpers.paths import FIXTURES_DIR

RECIPES = FIXTURES_DIR / "recipes"
OVERRIDE_KEYS = {"extra_args", "extra_env", "docker_image"}  # what command-synthesis.js reads of an exact-GPU override
SYNTHESIZE = """
import { resolveCommand, computeDockerMeta } from %s;

let input = "";
process.stdin.on("data", (d) => { input += d; });
process.stdin.on("end", () => {
  const { recipe, strategy, taxonomy, hw } = JSON.parse(input);
  const out = resolveCommand(recipe, "default", "single_node_tp", hw, [], { single_node_tp: strategy }, taxonomy);
  const meta = computeDockerMeta(recipe, recipe.variants.default, taxonomy.hardware_profiles[hw], hw);
  console.log(JSON.stringify({ command: out.command, env: out.env, image: meta.image }));
});
"""


@pytest.fixture(scope="module")
def h100(tmp_path_factory):
    """A tune of the replaying vLLM as vLLM 0.33 on an H100 with Llama 3.1 8B, and its recipe entry."""
    runs = tmp_path_factory.mktemp("runs")
    argv = [sys.executable, "-m", "autotune.testing.fake_vllm", "--profile", "h100-0.33.0-llama-8b",
            "--time-scale", "0.002", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu-memory-utilization", "0.92"]
    result = CliRunner().invoke(cli, ["tune", "--runs-dir", str(runs), "--quiet", "--target", "131072",
                                      "--probe", "none", "--", *argv], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (run_dir,) = artifact.list_runs(runs)
    shown = CliRunner().invoke(cli, ["show", str(run_dir), "--emit", "recipe"], catch_exceptions=False)
    assert shown.exit_code == 0, shown.output
    return artifact.load(run_dir), shown.output


def merged(base: dict, entry: dict) -> dict:
    """The recipe with the entry's keys merged in (mappings key by key, as a contributor would)."""
    out = dict(base)
    for key, value in entry.items():
        out[key] = merged(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return out


def synthesize(recipe_data: dict, hw: str) -> dict:
    """The command, env and image the recipes site shows for this hardware (its own code, in Node.js)."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("Node.js is not installed: the recipes site's command synthesis runs in it")
    inputs = {"recipe": json.loads(json.dumps(recipe_data, default=str)), "hw": hw,
              "strategy": yaml.safe_load((RECIPES / "single_node_tp.yaml").read_text()),
              "taxonomy": json.loads(json.dumps(yaml.safe_load((RECIPES / "taxonomy.yaml").read_text()), default=str))}
    script = SYNTHESIZE % json.dumps((RECIPES / "command-synthesis.mjs").as_uri())
    proc = subprocess.run([node, "--input-type=module", "-e", script], input=json.dumps(inputs),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def serve_words(command: str) -> list[str]:
    words = shlex.split(command.replace("\\\n", " "))
    assert words[:2] == ["vllm", "serve"]
    return words[2:]


def test_the_entry_is_a_recipes_hardware_override(h100):
    """The keys real recipes use (CONTRIBUTING.md's schema, models/*.yaml), for the taxonomy's h100."""
    record, text = h100
    entry = yaml.safe_load(text)
    assert set(entry) == {"meta", "variants"} and entry["meta"] == {"hardware": {"h100": "verified"}}
    (variant,) = entry["variants"].values()
    assert set(variant) == {"tp", "hardware_overrides"} and variant["tp"] == {"h100": 1}
    override = variant["hardware_overrides"]["h100"]
    assert set(override) <= OVERRIDE_KEYS and override["docker_image"] == "vllm/vllm-openai:v0.33.0"
    assert all(isinstance(w, str) for w in override["extra_args"])
    taxonomy = yaml.safe_load((RECIPES / "taxonomy.yaml").read_text())["hardware_profiles"]
    for pid, _, count in recipe.HARDWARE_PROFILES:
        assert taxonomy[pid]["gpu_count"] == count, pid
    real_recipe = yaml.safe_load((RECIPES / "Llama-3.1-8B-Instruct.yaml").read_text())
    assert real_recipe["model"]["model_id"] == record.model
    assert f"merge these keys into models/{record.model}.yaml" in text


def test_the_recipes_site_gives_an_h100_user_the_verified_command(h100):
    record, text = h100
    entry = yaml.safe_load(text)
    base = yaml.safe_load((RECIPES / "Llama-3.1-8B-Instruct.yaml").read_text())
    shown = synthesize(merged(base, entry), "h100")
    assert shown["image"] == "vllm/vllm-openai:v0.33.0"
    words = serve_words(shown["command"])
    ceiling = record.result.ceiling
    for flag, value in (("--max-model-len", str(ceiling)), ("--gpu-memory-utilization", "0.92"),
                        ("--max-num-seqs", "1024"), ("--max-num-batched-tokens", "8192"),
                        ("--tensor-parallel-size", "1")):
        assert words[words.index(flag) + 1] == value, (flag, shown["command"])
    argv = final_argv(record)
    verified = argv[argv.index("--model") + 2:] if "--model" in argv else argv
    command, read = checks.vllm_reads([{"words": ["x", *verified[verified.index("--gpu-memory-utilization"):]]},
                                       {"words": ["x", *words[1:]]}])
    ignored = {"max_num_seqs", "max_num_batched_tokens", "tensor_parallel_size"}  # pinned / the site's
    assert {k: v for k, v in command["engine"].items() if k not in ignored} == \
        {k: v for k, v in read["engine"].items() if k not in ignored}
    other = serve_words(synthesize(merged(base, entry), "h200")["command"])
    assert "--max-model-len" not in other  # the entry is the H100's only


@pytest.mark.parametrize("record, why", [
    (real(), "vLLM's CPU backend"),
    (gpu_record(), "vllm-project/recipes has no hardware profile for 1 x NVIDIA GeForce RTX 3090"),
])
def test_a_run_the_recipes_have_no_profile_for_gives_no_entry(tmp_path, record, why):
    folder = tmp_path / "run"
    folder.mkdir()
    artifact.write_atomic(folder / "run.json", json.dumps(RunRecord.from_dict(record).to_dict()))
    result = CliRunner().invoke(cli, ["show", str(folder), "--emit", "recipe"])
    assert result.exit_code == 1 and why in result.output, result.output


@pytest.mark.parametrize("name, ranks, expected", [
    ("NVIDIA H100 80GB HBM3", 2, "h100"), ("NVIDIA H200", 8, "h200"), ("NVIDIA H100 80GB HBM3", 9, None),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", 1, "rtx_pro_6000"),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", 2, "rtx_pro_6000_2x"),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", 3, "rtx_pro_6000_8x"),
    ("NVIDIA GeForce RTX 4090", 1, "rtx_4090_2x"), ("NVIDIA GB10", 1, "dgx_spark_gb10"),
    ("NVIDIA RTX 6000 Ada Generation", 1, None), ("NVIDIA A100-SXM4-80GB", 1, None),
])
def test_a_gpu_is_the_smallest_profile_that_holds_its_ranks(name, ranks, expected):
    assert recipe.hardware_id(name, ranks) == expected


def test_the_verified_tp_is_the_sites_tp_on_that_gpu(h100):
    """The site would fit an 8B model on one H100 (its vram_minimum_gb); a run verified at TP 2 gets TP 2."""
    record, _ = h100
    rec = record.to_dict()
    rec["result"]["final_argv"] = [*rec["result"]["final_argv"], "--tensor-parallel-size", "2"]
    entry = yaml.safe_load(local.render(RunRecord.from_dict(rec), targets.RECIPE))
    assert entry["variants"]["default"]["tp"] == {"h100": 2}
    base = yaml.safe_load((RECIPES / "Llama-3.1-8B-Instruct.yaml").read_text())
    words = serve_words(synthesize(merged(base, entry), "h100")["command"])
    assert words[words.index("--tensor-parallel-size") + 1] == "2"
    plain = serve_words(synthesize(base, "h100")["command"])
    assert "--tensor-parallel-size" not in plain or plain[plain.index("--tensor-parallel-size") + 1] == "1"
