"""The house rules of the package, checked: small functions and modules, no import cycle
(function-level imports included), floors that only go down, and no run record passed
around as a bare dict.

The allow-lists name what still broke a rule when this test was written, each with the issue
whose work it is; shorten them as that work lands, never lengthen them.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "autotune"
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 500

# Modules over MAX_MODULE_LINES that are data tables more than code (the failure catalog).
DATA_TABLES = {"autotune/vllm/log/failures.py"}
# Still over the limits, owned by work in progress (issue number in the comment).
MODULES_OVER: set[str] = set()  # none left
FUNCTIONS_OVER: set[str] = set()  # none left
RECORD_DICT_PARAMS: set[str] = set()  # none left

# The floors of the package, top first: a module imports only from its own floor or one below
# (function-level imports included). "autotune" is the package's own modules (__init__, errors, events).
LAYERS = [
    {"cli", "__main__"},  # the face: commands, options, exit codes
    {"fleet", "testing"},  # many tunes; the replaying vLLM and other aids for tests
    {"run"},  # one tune: the loop, boots, strategy, recovery, sweeps
    {"analysis", "export"},  # pure over records: compare, fits, predictions; paste-ready files
    {"store", "server"},  # the runs folder and its words; a server's life: started, marked, kept, stopped, asked
    {"host"},  # this machine: GPUs, memory, processes, signals
    {"vllm"},  # what vLLM is: its log, its failures, its versions, its KV accounting
    {"model"},  # the model's own files
    {"autotune"},  # the package itself: its version, its error base and exit codes
]


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def rel(path: Path) -> str:
    return str(path.relative_to(PACKAGE.parent))


def functions(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package modules this one imports, at any level (a function-level import counts)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in known:
                    found.add(full)
                elif base in known:
                    found.add(base)
    found.discard(name)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def floor_of(name: str) -> str:
    """The floor a module lives on: its folder under autotune/, or "autotune" for the package's own."""
    parts = name.split(".")
    if len(parts) == 1:
        return "autotune"
    return parts[1] if parts[1] == "__main__" or len(parts) > 2 or (PACKAGE / parts[1]).is_dir() else "autotune"


def climbing(graph: dict[str, set[str]], floor: dict[str, str], layers: list[set[str]]) -> list[str]:
    """Every import that reaches a floor above its own module's, as "module -> imported"."""
    level = {folder: i for i, folders in enumerate(layers) for folder in folders}
    return sorted(f"{name} -> {target}" for name, targets in graph.items() for target in targets
                  if level[floor[target]] < level[floor[name]])


def test_every_folder_has_a_floor():
    assert {floor_of(name) for name in modules()} - set().union(*LAYERS) == set()


def test_no_import_climbs_a_floor_even_inside_a_function():
    known = modules()
    graph = {name: imports_of(name, path, known) for name, path in known.items()}
    assert climbing(graph, {name: floor_of(name) for name in known}, LAYERS) == []


def test_the_floor_check_finds_an_import_that_climbs():
    graph = {"p.store.a": {"p.run.b", "p.host.c"}, "p.run.b": {"p.store.a"}, "p.host.c": set()}
    floor = {"p.store.a": "store", "p.run.b": "run", "p.host.c": "host"}
    assert climbing(graph, floor, [{"run"}, {"store"}, {"host"}]) == ["p.store.a -> p.run.b"]


def test_no_import_cycle_even_through_function_level_imports():
    known = modules()
    graph = {name: imports_of(name, path, known) for name, path in known.items()}
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


LOG_PACKAGE = "autotune.vllm.log"  # the log grammar: its __init__ is the one face the rest of the package uses


def reaching_past_the_face(graph: dict[str, set[str]], face: str) -> list[str]:
    """Every import of a module inside ``face``'s package from a module outside it, as "module -> imported"."""
    inside = face + "."
    return sorted(f"{name} -> {target}" for name, targets in graph.items() for target in targets
                  if target.startswith(inside) and not (name == face or name.startswith(inside)))


def test_outside_the_log_package_only_its_face_is_imported():
    known = modules()
    graph = {name: imports_of(name, path, known) for name, path in known.items()}
    assert reaching_past_the_face(graph, LOG_PACKAGE) == []


def test_the_face_check_finds_an_import_of_a_submodule():
    graph = {"p.log": {"p.log.rows"}, "p.log.rows": {"p.log.clean"}, "p.cli.a": {"p.log", "p.log.clean"},
             "p.logs.b": {"p.log"}}
    assert reaching_past_the_face(graph, "p.log") == ["p.cli.a -> p.log.clean"]


def test_no_module_over_the_limit():
    over = {rel(p) for p in modules().values() if len(p.read_text().splitlines()) > MAX_MODULE_LINES}
    assert over - DATA_TABLES - MODULES_OVER == set()


def test_no_function_over_the_limit():
    over = {f"{rel(p)}:{f.name}" for p in modules().values() for f in functions(ast.parse(p.read_text()))
            if f.end_lineno - f.lineno + 1 > MAX_FUNCTION_LINES}
    assert over - FUNCTIONS_OVER == set()


def test_one_serialiser_name():
    """Every method or function that gives an object's JSON form is `to_dict` (store/record/part.py says
    why); as_dict and to_json were the other two spellings before round 4."""
    others = {f"{rel(p)}:{f.name}" for p in modules().values() for f in functions(ast.parse(p.read_text()))
              if f.name in ("as_dict", "to_json", "asdict", "as_json")}
    assert others == set()


def test_no_run_record_parameter_is_a_bare_dict():
    found = set()
    for path in modules().values():
        for f in functions(ast.parse(path.read_text())):
            args = [*f.args.posonlyargs, *f.args.args, *f.args.kwonlyargs]
            for arg in args:
                if arg.arg == "record" and arg.annotation is not None and ast.unparse(arg.annotation) == "dict":
                    found.add(f"{rel(path)}:{f.name}")
    assert found - RECORD_DICT_PARAMS == set()


# The run record is read typed (store/record/): `artifact.load` is its one loader, and the package reads
# attributes (record.result.ceiling), not JSON keys; there is no Part.get. What reads a record field's name
# as a dict key is counted: 33 in cli/ and analysis/ when this check was written, 89 more in run/,
# store/, export/, server/ and fleet/ before round 4 (issue 34), none now. The progress events still carry a
# part's JSON form (redact.scrubbing masks secrets in it) and cli/progress.py types it on arrival
# (Attempt, BootFacts, Reach); `autotune gpus` reads machine_facts() as the Machine part run.json
# keeps; the reproduction's probe summary is a dataclass (ProbeComparison); boot_check reads its
# result as the BootPrediction it becomes.
RECORD_NAMES = {"record", "run", "run_record", "old", "new", "attempt", "a", "last", "first", "final", "result",
                "r", "reach", "step", "command", "facts", "probe", "verification", "recovery", "stop", "machine",
                "options", "margin", "prediction", "kept"}


def record_floors(layers: list[set[str]]) -> list[str]:
    """The folders where a run record can be held: store/'s floor and every floor above it (the floor
    test keeps store/ out of reach below). Below it (host/, vllm/, model/) a dict is never a run record,
    though the log parser's facts share a record's key names."""
    store = next(i for i, floor in enumerate(layers) if "store" in floor)
    return sorted(set().union(*layers[: store + 1]) - {"__main__"})


READ_FOLDERS = record_floors(LAYERS)
MAX_RECORD_KEY_READS = 0
GET_FOLDERS = ("cli", "analysis")
MAX_GET_CALLS = 231  # every `.get(` in cli/ and analysis/ (423 `.get("` alone before the record was typed)


def record_keys() -> set[str]:
    from dataclasses import fields

    from autotune.store.record import RECORD_CLASSES

    return {f.name for cls in RECORD_CLASSES for f in fields(cls)} - {"other", "order", "present"}


def record_key_reads(source: str, keys: set[str]) -> list[str]:
    """`x.get("key")` and `x["key"]` where key is a record field and x is named like a record or its
    part (RECORD_NAMES, or an attribute of that name: run.result.get("ceiling"))."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and node.args and isinstance(node.args[0], ast.Constant):
            receiver, key = node.func.value, node.args[0].value
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
                and isinstance(node.ctx, ast.Load):
            receiver, key = node.value, node.slice.value
        else:
            continue
        name = receiver.id if isinstance(receiver, ast.Name) else receiver.attr \
            if isinstance(receiver, ast.Attribute) else None
        if key in keys and name in RECORD_NAMES:
            found.append(f"{ast.unparse(node)} (line {node.lineno})")
    return found


def read_modules():
    return [p for folder in READ_FOLDERS for p in sorted((PACKAGE / folder).rglob("*.py"))]


def test_the_record_has_one_loader_and_no_untyped_record_parameter():
    untyped = set()
    for path in modules().values():
        source = path.read_text()
        assert "load_run" not in source and "as_run_record" not in source, rel(path)
        for f in functions(ast.parse(source)):
            for arg in [*f.args.posonlyargs, *f.args.args, *f.args.kwonlyargs]:
                shown = ast.unparse(arg.annotation) if arg.annotation is not None else ""
                if arg.arg in ("record", "run", "old", "new", "records") and ("Mapping" in shown or "dict" in shown):
                    untyped.add(f"{rel(path)}:{f.name}({arg.arg}: {shown})")
    assert untyped == set()


def test_commands_and_analysis_read_records_typed():
    keys = record_keys()
    reads = [f"{rel(p)}: {r}" for p in read_modules() for r in record_key_reads(p.read_text(), keys)]
    assert len(reads) <= MAX_RECORD_KEY_READS, "\n".join(reads)
    gets = sum(p.read_text().count(".get(") for folder in GET_FOLDERS for p in (PACKAGE / folder).rglob("*.py"))
    assert gets <= MAX_GET_CALLS  # every .get( in cli/ and analysis/, records or not: it may only fall


def test_the_typed_read_rule_covers_every_floor_that_can_hold_a_record():
    assert READ_FOLDERS == ["analysis", "cli", "export", "fleet", "run", "server", "store", "testing"]
    assert record_floors([{"cli"}, {"run"}, {"store", "server"}, {"vllm"}]) == ["cli", "run", "server", "store"]


def test_the_record_read_counter_fails_on_a_dict_read_in_any_of_those_folders(tmp_path):
    """The counter as the rule runs it, over a package with one record read as a dict in run/."""
    keys = record_keys()
    clean = "def f(record):\n    return record.result.ceiling\n"
    read = "def f(record):\n    return record.get('result')\n"
    assert record_key_reads(clean, keys) == []
    assert record_key_reads(read, keys) == ["record.get('result') (line 2)"]


def test_the_record_read_counter_finds_each_spelling():
    keys = {"ceiling", "facts"}
    source = ('record.get("ceiling"); run.result.get("ceiling"); a["facts"]; record.ceiling; '
              'd.get("ceiling"); record.get("not_a_field"); result["ceiling"] = 1')
    assert [r.split(" (")[0] for r in record_key_reads(source, keys)] == [
        "record.get('ceiling')", "run.result.get('ceiling')", "a['facts']"]


TESTS = PACKAGE.parent / "tests"


def imported_test_modules(source: str, package: str) -> set[str]:
    """The test modules (`test_*`) an import in `source` names, at any level, relative ones resolved
    against `package` (the importing file's dotted package, e.g. tests.e2e)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        found.update(n for n in names if n.rsplit(".", 1)[-1].startswith("test_"))
    return found


def test_no_test_module_imports_another():
    """Shared builders live in tests/helpers/ and fixtures in conftest.py: a test module imported by
    another runs its import-time work twice and ties two files together under pytest-xdist."""
    found = {}
    for path in sorted(TESTS.rglob("*.py")):
        package = ".".join(path.relative_to(TESTS.parent).parts[:-1])
        imported = imported_test_modules(path.read_text(), package)
        if imported:
            found[str(path.relative_to(TESTS.parent))] = sorted(imported)
    assert found == {}


# Folders of tests/ that are not a part of the package: real-vLLM boots, shared builders, data.
TEST_ONLY_FOLDERS = {"e2e", "helpers", "fixtures"}


def test_the_tests_mirror_the_package():
    """A test module sits in the folder of the part of autotune it tests (tests/run/ for autotune/run/,
    tests/vllm/log/ for autotune/vllm/log/); only this file, about the whole package, sits at the top.
    Test module names stay unique across folders: without __init__.py (a tests/vllm/__init__.py would
    make the folder the `vllm` package and hide the real one), pytest imports each by its name."""
    flat = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert flat == ["test_structure.py"]
    folders = {p.relative_to(TESTS) for p in TESTS.rglob("test_*.py")} - {Path("test_structure.py")}
    outside = sorted(str(f) for f in folders if f.parts[0] not in TEST_ONLY_FOLDERS
                     and not (PACKAGE / f.parent).is_dir())
    assert outside == []
    names = [p.name for p in TESTS.rglob("test_*.py") if "e2e" not in p.parts]
    assert sorted({n for n in names if names.count(n) > 1}) == []


def test_the_test_import_finder_finds_every_spelling():
    source = ("from tests.test_compare import record\nimport tests.e2e.test_reach\nfrom tests.e2e import test_reach\n"
              "from .test_gpus import gpu\nfrom tests.helpers.cli import run_autotune\nimport json\n")
    assert imported_test_modules(source, "tests.e2e") == {
        "tests.test_compare", "tests.e2e.test_reach", "tests.e2e.test_gpus"}


def test_ruff_finds_nothing():
    """pyproject.toml's [tool.ruff] rules over autotune/ and tests/ (ruff comes with the test extra)."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "autotune", "tests"],
                          cwd=PACKAGE.parent, capture_output=True, text=True, timeout=120)
    assert "No module named ruff" not in proc.stderr, "ruff is not installed: pip install -e '.[test]'"
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---- the event stream: one home for the event names (autotune/events.py), one renderer protocol ----

def events_sent(source: str, where: str = "") -> list[tuple[str, set[str], str]]:
    """(event, the fields named, where) of each emit("name", ...) in source: a call of a function or
    method named `emit` with a literal name (either branch of `"a" if x else "b"`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        if (func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None) != "emit":
            continue
        first = node.args[0]
        names = [first] if isinstance(first, ast.Constant) else [first.body, first.orelse] \
            if isinstance(first, ast.IfExp) else []
        fields = {k.arg for k in node.keywords if k.arg is not None}
        found += [(n.value, fields, f"{where}:{node.lineno}") for n in names
                  if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    return found


def every_event_sent() -> list[tuple[str, set[str], str]]:
    return [hit for name, path in modules().items() for hit in events_sent(path.read_text(), rel(path))]


def undeclared_events(hits) -> list[str]:
    from autotune import events  # the bottom floor: imports nothing of the package

    out = []
    for name, fields, where in hits:
        event = events.EVENTS.get(name)
        if event is None:
            out.append(f"{where}: {name} is not declared in autotune/events.py")
        elif fields - set(event.fields):
            out.append(f"{where}: {name} sent with {sorted(fields - set(event.fields))}, not among its fields")
    return out


def renderers() -> dict[str, set[str]]:
    """The renderers of the event stream (classes whose base is events.Renderer), each with the events
    it draws (its on_<event> methods)."""
    found = {}
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(ast.unparse(b).endswith("Renderer") for b in node.bases):
                found[f"{name}.{node.name}"] = {f.name.removeprefix("on_") for f in node.body
                                                 if isinstance(f, ast.FunctionDef) and f.name.startswith("on_")
                                                 and f.name != "on_message"}
    return found


def test_every_event_sent_is_declared_with_the_fields_it_is_sent_with():
    hits = every_event_sent()
    assert len({name for name, _, _ in hits}) >= 30  # the finder finds the stream (not an empty scan)
    assert undeclared_events(hits) == []


def test_the_event_finder_finds_an_undeclared_event_and_an_undeclared_field():
    source = 'emit("made_up", x=1)\nself.emit("warning", text="t", colour="red")\nemit("a" if x else "hung", index=1)\n'
    assert undeclared_events(events_sent(source, "m.py")) == [
        "m.py:1: made_up is not declared in autotune/events.py",
        "m.py:2: warning sent with ['colour'], not among its fields",
        "m.py:3: a is not declared in autotune/events.py"]


def test_every_declared_event_is_sent_and_drawn_by_a_renderer_or_carries_a_message():
    from autotune import events

    assert sorted(set(events.EVENTS) - {name for name, _, _ in every_event_sent()}) == []  # none outlives its event
    drawing = renderers()
    assert {"autotune.cli.progress.Progress", "autotune.cli.fleet.FleetProgress",
            "autotune.cli.verify.ProbeProgress"} <= set(drawing)  # the three follow the one protocol
    drawn = set().union(*drawing.values())
    assert sorted(set(drawn) - set(events.EVENTS)) == []  # a renderer draws only declared events
    assert sorted(e.name for e in events.EVENTS.values() if e.name not in drawn and not e.has_message) == []


# ---- the replaying vLLM behind the launcher: shipped code asks the launcher, never "is this the replay?" ----

# Where the question may be asked: the launcher (which answers the rest), the vLLM facts that define how to
# ask the replay (vllm/versions.py), and the replay's own folder.
ASK_THE_REPLAY = {"autotune/host/launcher.py", "autotune/vllm/versions.py"}


# What only the launcher uses: the question, and the replay's own words (its module, flags, options).
REPLAY_NAMES = {"replays", "replayed_command", "FAKE_VLLM_MODULE", "FAKE_VERSION_FLAG", "FAKE_GPUS_FLAG",
                "FAKE_VLLM_OWN_OPTIONS"}


def asking_the_replay(source: str) -> list[int]:
    """The lines of source that use versions.replays (the "is this the replay?" question) or the replay's
    own words (REPLAY_NAMES)."""
    return sorted({node.lineno for node in ast.walk(ast.parse(source))
                   if (node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute)
                       else None) in REPLAY_NAMES})


def test_only_the_launcher_asks_whether_a_command_runs_the_replay():
    found = {rel(path): asking_the_replay(path.read_text()) for path in modules().values()
             if rel(path) not in ASK_THE_REPLAY and not rel(path).startswith("autotune/testing/")}
    assert {where: lines for where, lines in found.items() if lines} == {}
    assert asking_the_replay("if versions.replays(argv):\n    pass\nx = replays(a)\ny = [versions.FAKE_GPUS_FLAG]\n") == [1, 3, 4]


def test_mypy_finds_nothing():
    """pyproject.toml's [tool.mypy]: strict over store/, analysis/ and vllm/ (mypy comes with the test
    extra). About 5 s of CPU from cold, under 1 s with its cache (.mypy_cache/)."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "mypy"], cwd=PACKAGE.parent, capture_output=True, text=True,
                          timeout=300)
    assert "No module named mypy" not in proc.stderr, "mypy is not installed: pip install -e '.[test]'"
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_is_strict(tmp_path):
    """The settings judge: under pyproject's [tool.mypy], a function without annotations is an error."""
    import subprocess
    import sys

    (tmp_path / "loose.py").write_text("def f(x):\n    return x\n")
    proc = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(PACKAGE.parent / "pyproject.toml"),
                           "--no-incremental", str(tmp_path / "loose.py")], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1 and "no-untyped-def" in proc.stdout, proc.stdout + proc.stderr


# ---- one name, one thing: a class name is declared once in the package ----

# Still two classes of one name, each with the work that renames it (shorten, never lengthen).
SHARED_CLASS_NAMES = {
    "Settings": "testing/profiles.py (the replay's boot settings) beside vllm/kv_pool.py's: issue 34's next round",
    "Device": "run/margin.py beside analysis/estimate.py: one device with its memory, to be one class",
}


def class_names(sources: dict[str, str]) -> dict[str, list[str]]:
    """Each class name declared in more than one place, with where."""
    found: dict[str, list[str]] = {}
    for where, source in sources.items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(where)
    return {name: places for name, places in found.items() if len(places) > 1}


def test_a_class_name_says_which_class_it_is():
    shared = class_names({rel(path): path.read_text() for path in modules().values()})
    assert sorted(set(shared) - set(SHARED_CLASS_NAMES)) == []
    assert sorted(set(SHARED_CLASS_NAMES) - set(shared)) == []  # renamed: take it off the list


def test_the_class_name_finder_finds_a_name_declared_twice():
    assert class_names({"a.py": "class Plan:\n    pass\n", "b.py": "class Plan:\n    pass\nclass Boot:\n    pass\n"}) \
        == {"Plan": ["a.py", "b.py"]}
