"""docs/ stays in step with the CLI: every command's page holds its live `--help`, and the
troubleshooting table holds every error kind of the catalog.

Every command registered in the CLI at test time is checked, so a new command fails here until
it has a page. `python scripts/docs_sync.py` rewrites the generated blocks.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

from autotune.cli import cli
from autotune.vllm.log import CATALOG
from tests.helpers.paths import ROOT_DIR

ROOT = ROOT_DIR
sys.path.insert(0, str(ROOT / "scripts"))  # docs_sync is a developer tool, not part of the package
import docs_sync  # noqa: E402

DOCS = ROOT / "docs"
COMMANDS = docs_sync.command_names()


def blocks() -> dict[str, list[tuple[str, str]]]:
    """command -> [(page, the text between its markers)] over every page of docs/."""
    found: dict[str, list[tuple[str, str]]] = {}
    for page in sorted(DOCS.glob("*.md")):
        for m in docs_sync._HELP_BLOCK_RE.finditer(page.read_text(encoding="utf-8")):
            found.setdefault(m.group("name"), []).append((page.name, m.group("body")))
    return found


def live_help(name: str) -> str:
    """What `autotune NAME --help` prints (terminal of 80+ columns: click wraps at 78)."""
    args = ["--help"] if name == docs_sync.ROOT_NAME else [name, "--help"]
    result = CliRunner().invoke(cli, args, prog_name="autotune", terminal_width=78)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_has_a_page_with_its_live_help(name):
    found = blocks().get(name)
    assert found, (f"`autotune {name}` has no page with its --help: add `<!-- autotune-help: {name} -->` and "
                   f"`<!-- /autotune-help -->` to docs/{name}.md (or the page that documents it), then run "
                   "`python scripts/docs_sync.py`")
    assert len(found) == 1, f"`autotune {name}` --help appears on several pages: {[p for p, _ in found]}"
    page, body = found[0]
    shown = "autotune" if name == docs_sync.ROOT_NAME else f"autotune {name}"
    expected = f"```text\n$ {shown} --help\n{live_help(name)}```\n"
    assert body == expected, f"docs/{page} is out of step with `{shown} --help`: run `python scripts/docs_sync.py`"


def test_the_pages_match_what_the_installed_cli_prints():
    """The real console script, not just click's test runner (one command is enough)."""
    env = {**os.environ, "COLUMNS": "80"}
    out = subprocess.run([sys.executable, "-m", "autotune", "runs", "--help"], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=60).stdout
    (page, body), = blocks()["runs"]
    assert body == f"```text\n$ autotune runs --help\n{out}```\n"


def test_no_page_documents_a_command_that_does_not_exist():
    stale = sorted(set(blocks()) - set(COMMANDS))
    assert not stale, f"help blocks for commands the CLI does not have: {stale}"


def test_the_troubleshooting_table_lists_every_error_kind_of_the_catalog():
    text = (DOCS / docs_sync.CATALOG_PAGE).read_text(encoding="utf-8")
    m = docs_sync._CATALOG_BLOCK_RE.search(text)
    assert m, "docs/troubleshooting.md lost its <!-- autotune-catalog --> block"
    assert m.group("body") == docs_sync.catalog_block(), "run `python scripts/docs_sync.py`"
    kinds = re.findall(r"^\| `(\w+)` \| (?:yes|no) \|", m.group("body"), re.M)
    assert kinds == [k.kind for k in CATALOG]
    for kind in CATALOG:
        assert " ".join(kind.fix.split()).replace("|", "\\|") in m.group("body")


def test_docs_sync_check_agrees(tmp_path):
    report = docs_sync.sync(DOCS, write=False)
    assert not report.changed and not report.stale and not report.problems, docs_sync.explain(report)


def test_docs_sync_rewrites_an_outdated_block_and_reports_a_missing_page(tmp_path):
    (tmp_path / "runs.md").write_text("# runs\n\n<!-- autotune-help: runs -->\nold text\n<!-- /autotune-help -->\n"
                                      "<!-- autotune-help: gone -->\nx\n<!-- /autotune-help -->\n")
    (tmp_path / "troubleshooting.md").write_text("<!-- autotune-catalog -->\n<!-- /autotune-catalog -->\n")
    report = docs_sync.sync(tmp_path, write=True)
    assert report.changed == [tmp_path / "runs.md", tmp_path / "troubleshooting.md"]
    assert "$ autotune runs --help\nUsage: autotune runs [OPTIONS]" in (tmp_path / "runs.md").read_text()
    assert report.stale == ["runs.md: gone"]
    assert "show" in report.missing and "runs" not in report.missing
    again = docs_sync.sync(tmp_path, write=False)
    assert not again.changed
    created = docs_sync.sync(tmp_path, write=True, create_missing=True).created
    assert tmp_path / "show.md" in created
    assert docs_sync._HELP_BLOCK_RE.search((tmp_path / "show.md").read_text()).group("name") == "show"
