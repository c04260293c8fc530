"""--keep-serving hands over a server that answers to the name every paste-ready file serves (a new
user's clients of command.sh failed against the kept server: it served the model folder's path)."""

import json
import os
from pathlib import Path

import httpx

from tests.helpers.cli import invoke_autotune
from tests.helpers.replay import SEED, fake


def test_the_kept_server_serves_the_name_command_sh_serves(tmp_path):
    folder = tmp_path / "models" / "qwen-local"
    folder.mkdir(parents=True)
    env = {"AUTOTUNE_RUNS_DIR": str(tmp_path / "runs")}
    tuned = invoke_autotune("tune", "--target", "32768", "--probe", "none", "--keep-serving", "--",
                            *fake(SEED, "--model", str(folder), "--max-num-seqs", "1", scale="0"), env=env)
    try:
        assert tuned.exit_code == 0, tuned.output
        record = json.loads(invoke_autotune("show", "--json", "latest", env=env).stdout)
        run_dir = Path(env["AUTOTUNE_RUNS_DIR"]) / record["run_id"]
        assert "--served-model-name qwen-local" in (run_dir / "command.sh").read_text()
        url = record["result"]["serving"]["url"]
        assert [m["id"] for m in httpx.get(f"{url}/v1/models", timeout=5).json()["data"]] == ["qwen-local"]
    finally:
        invoke_autotune("stop", "latest", env=env)
    assert os.path.isdir(folder)
