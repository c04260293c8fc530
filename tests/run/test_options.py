"""The request (run/options.py's TuneOptions) is defined once: the click options of the commands that
take its options, run.json's "options" and the reading back of an old run all use that table's
defaults. A default spelled again anywhere in cli/ or run/ fails here."""

import ast
import dataclasses
from pathlib import Path

import pytest

from autotune.cli import reproduce as reproduce_cli
from autotune.cli import sweep as sweep_cli
from autotune.cli import tune as tune_cli
from autotune.cli import verify as verify_cli
from autotune.run import options
from autotune.run.options import TuneOptions
from autotune.store.record import RunRecord
from tests.helpers.paths import ROOT_DIR

ROOT = ROOT_DIR / "autotune"
TABLE = {f.name: f for f in dataclasses.fields(TuneOptions)}
WITH_DEFAULT = {name: options.default(name) for name, f in TABLE.items()
                if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}
KEPT = {name for name, f in TABLE.items() if f.metadata.get("kept")}  # what run.json's "options" hold
FLAGS = {f.metadata["flag"]: name for name, f in TABLE.items() if f.metadata.get("flag")}


def given(command, *args) -> dict:
    """What the command's function receives for these arguments (click's defaults filled in)."""
    return command.make_context(command.name, list(args)).params


def test_every_option_of_tune_that_the_table_defines_has_the_tables_flag_default_and_help():
    received = given(tune_cli.tune, "--target", "4096", "--", "vllm", "serve", "m")
    for name, field in TABLE.items():
        flag = field.metadata.get("flag")
        if flag is None:
            continue
        (param,) = [p for p in tune_cli.tune.params if flag in p.opts]
        assert param.help == field.metadata["help"], name
        if name == "margin_bytes":  # given in GiB (MemoryType), turned into bytes by the command
            assert received["margin_gib"] is None
        else:
            assert received[name] == options.default(name), name
    assert received["stall_timeout_s"] == 1200.0 and received["max_boots"] == 6 and received["probe"] == "quick"


def test_commands_that_share_an_option_share_its_default_unless_they_say_otherwise():
    sweep = given(sweep_cli.sweep_cmd, "--gmu", "0.9", "--target", "4096", "--", "vllm", "serve", "m")
    assert (sweep["stall_timeout_s"], sweep["max_boots"], sweep["strategy"]) == (1200, 6, "auto")
    assert sweep["probe"] == "none"  # a sweep's own: a 100K-token prefill on a CPU takes minutes
    reproduce = given(reproduce_cli.reproduce_cmd, "RUN")
    assert reproduce["stall_timeout"] == 1200 and reproduce["probe"] is None  # None: the original run's
    assert given(verify_cli.verify, "http://localhost:8000")["probe"] == "quick"


def test_run_json_keeps_the_kept_options_and_an_old_run_reads_back_the_same_defaults(tmp_path):
    asked = TuneOptions(target=4096, serve_argv=["vllm", "serve", "m"], runs_dir=tmp_path)
    kept = options.kept_options(asked)
    assert list(kept) == ["stall_timeout_s", "max_boots", "probe", "back_off", "keep_serving", "strategy",
                          "start_at", "slack", "reach", "max_gmu", "allow_kv_quant", "extra_env", "margin_bytes"]
    assert kept["stall_timeout_s"] == 1200.0 and kept["max_boots"] == 6 and kept["max_gmu"] == 0.95
    run_dir = tmp_path / "run-1"
    for recorded in ({}, kept):  # a run written before options were kept, and one written now
        record = RunRecord.from_dict({"run_id": "run-1", "target": 4096, "command": {"argv": ["vllm", "serve", "m"]},
                                      "options": recorded})
        back = options.from_record(record, run_dir, env=None)
        assert options.kept_options(back) == kept
        assert back.serve_argv == ("vllm", "serve", "m") and back.runs_dir == tmp_path


def test_the_plans_values_replace_the_requests_in_run_json_and_nothing_else_does():
    asked = TuneOptions(target=4096, serve_argv=["vllm"], runs_dir=Path("runs"), max_gmu=0.99)
    assert options.kept_options(asked, max_gmu=0.9166, start_at=1000)["max_gmu"] == 0.9166
    with pytest.raises(KeyError, match="target"):
        options.kept_options(asked, target=1)


def test_the_request_cannot_be_changed_once_made():
    asked = TuneOptions(target=4096, serve_argv=["vllm"], runs_dir=Path("runs"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        asked.serve_argv = ["other"]
    assert asked.serve_argv == ("vllm",)


# ---- a default spelled twice -----------------------------------------------------------------------------

def spelled_again(source: str) -> list[str]:
    """Where source spells a default of the table again: a click option of a table flag, a class
    field named as a table field, or a kept option read back as `.get("field", default)` /
    `.get("field") or default`, with the table's own default as a literal."""
    found = []

    def same(node, name) -> bool:
        return (isinstance(node, ast.Constant) and name in WITH_DEFAULT and type(node.value) is not type(None)
                and node.value == WITH_DEFAULT[name])

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            first = node.args[0] if node.args else None
            key = first.value if isinstance(first, ast.Constant) else None
            if node.func.attr == "option" and key in FLAGS:
                found += [f"line {node.lineno}: {key} default={kw.value.value!r}" for kw in node.keywords
                          if kw.arg == "default" and same(kw.value, FLAGS[key])]
            elif node.func.attr == "get" and len(node.args) == 2 and key in KEPT and same(node.args[1], key):
                found.append(f"line {node.lineno}: .get({key!r}, {node.args[1].value!r})")
        elif isinstance(node, ast.ClassDef):
            found += [f"line {item.lineno}: {item.target.id} = {item.value.value!r}" for item in node.body
                      if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                      and same(item.value, item.target.id)]
        elif isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or) and len(node.values) == 2:
            call, fallback = node.values
            if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "get"
                    and call.args and isinstance(call.args[0], ast.Constant) and call.args[0].value in KEPT
                    and same(fallback, call.args[0].value)):
                found.append(f"line {node.lineno}: .get({call.args[0].value!r}) or {fallback.value!r}")
    return found


@pytest.mark.parametrize("source, says", [
    ('click.option("--stall-timeout", type=float, default=1200)', "--stall-timeout default=1200"),
    ('click.option("--max-gmu", default=0.95, help="x")', "--max-gmu default=0.95"),
    ("class SweepOptions:\n    max_boots: int = 6\n", "max_boots = 6"),
    ('options.get("max_boots", 6)', ".get('max_boots', 6)"),
    ('int(options.get("max_boots") or 6)', ".get('max_boots') or 6"),
    ('options.get("probe", "quick")', ".get('probe', 'quick')"),
])
def test_a_default_spelled_again_is_found(source, says):
    assert [f for f in spelled_again(source) if says in f], spelled_again(source)


@pytest.mark.parametrize("source", [
    'click.option("--probe", default="none")',  # a command's own default, not the table's
    'options.get("max_boots", 7)',
    "class Leaf:\n    kind: str = 'leaf'\n",
    'request_option("stall_timeout_s")',
    'record.get("kind", "tune")',  # the record's kind, not an option read back from run.json "options"
])
def test_a_default_of_its_own_is_not_a_second_spelling(source):
    assert spelled_again(source) == []


def test_no_default_of_the_request_is_spelled_twice_in_cli_or_run():
    found = {}
    for path in sorted([*(ROOT / "cli").glob("*.py"), *(ROOT / "run").glob("*.py")]):
        if path.name != "options.py" or path.parent.name != "run":
            found.update({f"{path.relative_to(ROOT)}: {where}": 1 for where in spelled_again(path.read_text())})
    assert not found, "defaults spelled again (take them from run/options.py):\n" + "\n".join(found)


def test_each_kept_option_is_a_field_of_the_record_part_that_keeps_it():
    """from_record reads each kept option as an attribute of KeptOptions (run.json's "options")."""
    from autotune.store.record import KeptOptions

    assert {f.name for f in dataclasses.fields(KeptOptions)} >= KEPT
