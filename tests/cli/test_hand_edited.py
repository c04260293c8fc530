"""Issue 37: a hand-edited run.json with a value of the wrong type (`"ceiling": "abc"`). `show`
contradicted itself, `show --emit k8s` wrote `abc` into a manifest and `compare` raised TypeError.
Each now refuses the record with one line naming the file and the field, no traceback, exit 1
(docs/exit-codes.md: bad input, an unreadable file)."""

from __future__ import annotations

import json

import pytest

from autotune.errors import ExitCode
from tests.helpers.cli import run_autotune
from tests.helpers.emit_records import real


@pytest.fixture
def runs(tmp_path):
    good, edited = real(), real()
    edited["result"]["ceiling"] = "abc"
    for name, record in (("good", good), ("edited", edited)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "run.json").write_text(json.dumps(record))
    return tmp_path


@pytest.mark.parametrize("command", [["show", "edited"], ["show", "edited", "--emit", "k8s"],
                                     ["show", "edited", "--json"], ["compare", "good", "edited"]],
                         ids=" ".join)
def test_a_wrong_type_is_one_line_naming_the_file_and_the_field(runs, command):
    out = run_autotune(*command, runs_dir=runs, cwd=runs, timeout=60)
    assert out.exit_code == ExitCode.INPUT, out
    assert out.stderr.strip().splitlines() == ['Error: edited/run.json: result.ceiling: expected an integer, got "abc"'], out
    assert out.stdout == "" and "Traceback" not in out.stderr, out
    assert not list(runs.rglob("*.yaml")), "nothing written from a refused record"
