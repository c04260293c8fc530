"""One vocabulary (store/outcomes.py): the bases the strategy gives are Basis members, and
docs/artifact.md names each."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from autotune.run import strategy
from autotune.store.outcomes import Basis
from tests.helpers.paths import ROOT_DIR


def bases_given(source: str) -> list[str]:
    """The third argument of each Launch(...) and each word `.basis` is compared with, as written."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Launch" and len(node.args) > 2:
            found.append(ast.unparse(node.args[2]))
        elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Attribute) and node.left.attr == "basis":
            found += [ast.unparse(c) for c in node.comparators]
    return found


def test_the_strategy_gives_and_reads_bases_only_from_the_vocabulary():
    given = bases_given(Path(strategy.__file__).read_text())
    assert given and all(re.fullmatch(r"Basis\.[A-Z_]+", g) or g == "PREDICTED" for g in given
                         if not g.startswith("Basis.COMPUTED if")), given
    assert {"Basis.POOL", "Basis.BACK_OFF", "Basis.ROOM"} <= set(given)


def test_the_check_finds_a_bare_word():
    assert bases_given('Launch(1, "why", "pool")\nif last.basis == "room": pass') == ["'pool'", "'room'"]


def test_the_artifact_doc_names_every_basis():
    row = next(line for line in (ROOT_DIR / "docs" / "artifact.md").read_text().splitlines()
               if line.startswith("| `basis` |"))
    assert {b.value for b in Basis} <= set(re.findall(r"`([a-z_]+)`", row))
