"""The Python autotune claims is a Python its commands run on (here: every command imports the package).

pyproject.toml's requires-python names the lowest version; ruff checks the syntax against the same
version (target-version), the README says it, and every standard-library name the package uses
exists in it (the table below: what each version added). Under 3.10, `enum.StrEnum`
(store/outcomes.py) failed every command at import; vLLM's CPU build, the demo and CI run 3.11.
The package is then compiled, and imported module by module, by an interpreter of the lowest
version where one is on this machine (the suite's own, where it is that version).
"""
from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "autotune"

# Standard-library names added after 3.10, by the version that added them: (module, name) -> version;
# "builtins" for a builtin, name None for a whole module.
ADDED = {
    ("enum", "StrEnum"): (3, 11), ("datetime", "UTC"): (3, 11), ("tomllib", None): (3, 11),
    ("typing", "Self"): (3, 11), ("typing", "LiteralString"): (3, 11), ("typing", "Never"): (3, 11),
    ("typing", "assert_never"): (3, 11), ("typing", "reveal_type"): (3, 11), ("typing", "Required"): (3, 11),
    ("typing", "NotRequired"): (3, 11), ("asyncio", "TaskGroup"): (3, 11), ("asyncio", "timeout"): (3, 11),
    ("hashlib", "file_digest"): (3, 11), ("contextlib", "chdir"): (3, 11), ("enum", "verify"): (3, 11),
    ("builtins", "ExceptionGroup"): (3, 11), ("builtins", "BaseExceptionGroup"): (3, 11),
    ("typing", "override"): (3, 12), ("itertools", "batched"): (3, 12), ("typing", "TypeAliasType"): (3, 12),
    ("warnings", "deprecated"): (3, 13), ("typing", "TypeIs"): (3, 13), ("copy", "replace"): (3, 13),
}


def lowest() -> tuple[int, int]:
    spec = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    found = re.fullmatch(r">=\s*3\.(\d+)", spec.strip())
    assert found, f"requires-python {spec!r}: a plain lower bound, >=3.N"
    return 3, int(found.group(1))


def sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def used_names(tree: ast.AST) -> set[tuple[str, str | None]]:
    """(module, name) for each standard-library name the module imports or reads off a module."""
    modules: dict[str, str] = {}  # local name -> module
    used: set[tuple[str, str | None]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                modules[alias.asname or alias.name] = alias.name
                used.add((alias.name, None))
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            used.add((node.module, None))
            used.update((node.module, alias.name) for alias in node.names)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
            used.add((modules[node.value.id], node.attr))
        elif isinstance(node, ast.Name):
            used.add(("builtins", node.id))
    return used


def test_pyproject_ruff_and_the_readme_name_one_lowest_python():
    major, minor = lowest()
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert config["tool"]["ruff"]["target-version"] == f"py{major}{minor}"
    assert config["tool"]["mypy"]["python_version"] == f"{major}.{minor}"
    claims = re.findall(r"Python (\d+\.\d+)\+", (ROOT / "README.md").read_text())
    assert claims and set(claims) == {f"{major}.{minor}"}, claims


def test_the_package_uses_no_standard_library_name_newer_than_it_claims():
    floor = lowest()
    newer = sorted(f"{path.relative_to(ROOT)}: {module}.{name or ''} ({'.'.join(map(str, ADDED[module, name]))})"
                   for path in sources() for module, name in used_names(ast.parse(path.read_text()))
                   if ADDED.get((module, name), (0, 0)) > floor)
    assert newer == [], f"requires-python says {floor}: {newer}"


def test_the_package_parses_as_the_lowest_python_reads_it():
    floor = lowest()
    for path in sources():
        ast.parse(path.read_text(), filename=str(path), feature_version=floor)


def lowest_interpreter() -> str | None:
    major, minor = lowest()
    if sys.version_info[:2] == (major, minor):
        return sys.executable
    return shutil.which(f"python{major}.{minor}")


IMPORT_EVERY_MODULE = r"""
import importlib, pathlib, sys
root = pathlib.Path(sys.argv[1])
for path in sorted((root / "autotune").rglob("*.py")):
    parts = path.relative_to(root).with_suffix("").parts
    name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    if sys.argv[2] == "import" and parts[-1] != "__main__":  # __main__ runs the command line
        importlib.import_module(name)
    compile(path.read_text(), str(path), "exec")
print("ok", sys.version_info[:2])
"""


def test_the_lowest_claimed_python_compiles_and_imports_the_package():
    python = lowest_interpreter()
    if python is None:
        pytest.skip(f"no Python {'.'.join(map(str, lowest()))} on this machine")
    # the suite's own interpreter has the dependencies: it also imports every module; another compiles them
    how = "import" if python == sys.executable else "compile"
    out = subprocess.run([python, "-c", IMPORT_EVERY_MODULE, str(ROOT), how], capture_output=True, text=True,
                         timeout=110, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == f"ok {lowest()}"
