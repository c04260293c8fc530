"""One boot whose server dies with a failure autotune does not know: once its log is drained,
the parser is closed, so the final traceback line is the stated cause in run.json (the
`exception` fact, an unknown diagnosis with its line number). No vLLM: a short script plays a
server that prints vLLM's banner and dies inside a traceback."""

import json
import sys

from click.testing import CliRunner

from autotune.cli import cli
from autotune.testing import profiles

_DIES_IN_A_TRACEBACK = "\n".join([
    "import sys",
    "print('INFO 11-30 12:00:00 [api_server.py:1] vLLM API server version 0.10.0', flush=True)",
    "print('Traceback (most recent call last):', flush=True)",
    "print('  File \"/opt/vllm/entrypoints/cli/main.py\", line 54, in main', flush=True)",
    "print('    args.dispatch_function(args)', flush=True)",
    "sys.exit(1)",
])


def test_unknown_failure_gets_its_final_traceback_line_as_cause(monkeypatch, tmp_path):
    inventory = profiles.by_name("v1-0.21.0").nvml_inventory()
    monkeypatch.setattr("autotune.host.machine.gpu_facts", lambda: (inventory, None))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["tune", "--json", "--quiet", "--target", "4096", "--probe", "none", "--",
                                      sys.executable, "-c", _DIES_IN_A_TRACEBACK], catch_exceptions=False)
    record = json.loads(result.output[result.output.index("{"):])
    attempt = record["attempts"][0]
    assert attempt["outcome"] == "error"
    assert attempt["facts"]["exception"] == "args.dispatch_function(args)"
    assert attempt["provenance"]["exception"]["line"] == 4
    assert "(line 4): args.dispatch_function(args)" in attempt["diagnosis"]["cause"]
