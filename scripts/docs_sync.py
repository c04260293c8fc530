"""Keep docs/ in step with the CLI: each command's `--help` text and the failure catalog.

Generated blocks sit between marker comments in the Markdown pages:

    <!-- autotune-help: tune -->            ...the output of `autotune tune --help`...
    <!-- /autotune-help -->
    <!-- autotune-catalog -->               ...a table of every error_kind in autotune.vllm.log.failures...
    <!-- /autotune-catalog -->

Every command of the CLI must have its help block in some page (docs/<command>.md unless a
page already holds its marker); the root `autotune --help` is named `autotune`.
tests/cli/test_docs_help.py fails when a block is missing or out of date.

    python scripts/docs_sync.py            rewrite the blocks in place
    python scripts/docs_sync.py --check    only report (exit 1 when something is out of step)
    python scripts/docs_sync.py --create-missing
                                            also create docs/<command>.md for a command that has
                                            no page yet (then add an example with real output)
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import click

ROOT_NAME = "autotune"
DOCS_DIR = Path(__file__).resolve().parent.parent / "docs"
# The width a terminal of 80 columns or more gets (click: min(columns, 80) - 2).
HELP_WIDTH = 78

_HELP_BLOCK_RE = re.compile(r"<!-- autotune-help: (?P<name>[\w-]+) -->\n(?P<body>.*?)<!-- /autotune-help -->", re.S)
_CATALOG_BLOCK_RE = re.compile(r"<!-- autotune-catalog -->\n(?P<body>.*?)<!-- /autotune-catalog -->", re.S)
CATALOG_PAGE = "troubleshooting.md"


def command_names() -> list[str]:
    """The root and every command registered in the CLI, as `autotune --help` lists them."""
    from autotune.cli.main import cli

    return [ROOT_NAME] + sorted(cli.commands)


def help_text(name: str) -> str:
    """What `autotune NAME --help` prints on a terminal of 80 columns or more (with its final newline)."""
    from autotune.cli.main import cli

    # The commands' own context_settings (e.g. -h as well as --help) apply, as on the command line.
    with click.Context(cli, info_name=ROOT_NAME, terminal_width=HELP_WIDTH, **cli.context_settings) as root:
        if name == ROOT_NAME:
            return cli.get_help(root) + "\n"
        command = cli.commands[name]
        with click.Context(command, info_name=name, parent=root, terminal_width=HELP_WIDTH,
                           **command.context_settings) as ctx:
            return command.get_help(ctx) + "\n"


def help_block(name: str) -> str:
    shown = ROOT_NAME if name == ROOT_NAME else f"{ROOT_NAME} {name}"
    return f"```text\n$ {shown} --help\n{help_text(name)}```\n"


def catalog_block() -> str:
    from autotune.vllm.log import CATALOG

    def cell(text: str) -> str:
        return " ".join(str(text).split()).replace("|", "\\|")

    rows = ["| `error_kind` | ends the boot | cause | fix |", "|---|---|---|---|"]
    for kind in CATALOG:
        rows.append(f"| `{kind.kind}` | {'yes' if kind.fatal else 'no'} | {cell(kind.cause)} | {cell(kind.fix)} |")
    return "\n".join(rows) + "\n"


@dataclass
class Report:
    changed: list[Path] = field(default_factory=list)  # pages whose blocks were (or would be) rewritten
    missing: list[str] = field(default_factory=list)  # commands without a help block anywhere
    stale: list[str] = field(default_factory=list)  # blocks naming a command the CLI no longer has
    created: list[Path] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def in_step(self) -> bool:
        return not (self.changed or self.missing or self.stale or self.problems)


def _pages(docs_dir: Path) -> list[Path]:
    return sorted(docs_dir.glob("*.md"))


def synced_text(text: str, names: set[str], blocks: dict[str, str], stale: list[str], page: str) -> str:
    """The page's text with every generated block brought up to date (pure)."""
    def help_repl(found: re.Match[str]) -> str:
        name = found.group("name")
        if name not in names:
            stale.append(f"{page}: {name}")
            return found.group(0)
        return f"<!-- autotune-help: {name} -->\n{blocks[name]}<!-- /autotune-help -->"

    text = _HELP_BLOCK_RE.sub(help_repl, text)
    if "catalog" in blocks:
        text = _CATALOG_BLOCK_RE.sub(lambda _: f"<!-- autotune-catalog -->\n{blocks['catalog']}<!-- /autotune-catalog -->",
                                     text)
    return text


def sync(docs_dir: Path = DOCS_DIR, write: bool = True, create_missing: bool = False) -> Report:
    """Bring every generated block in docs_dir up to date (or, write=False, report what is out of step)."""
    report = Report()
    names = command_names()
    blocks = {name: help_block(name) for name in names}
    blocks["catalog"] = catalog_block()
    documented: set[str] = set()
    catalog_seen = False
    for page in _pages(docs_dir):
        text = page.read_text(encoding="utf-8")
        documented.update(m.group("name") for m in _HELP_BLOCK_RE.finditer(text))
        catalog_seen = catalog_seen or bool(_CATALOG_BLOCK_RE.search(text))
        new = synced_text(text, set(names), blocks, report.stale, page.name)
        if new != text:
            report.changed.append(page)
            if write:
                page.write_text(new, encoding="utf-8")
    for name in names:
        if name in documented:
            continue
        if create_missing and write and name != ROOT_NAME:
            page = docs_dir / f"{name}.md"
            if page.exists():
                report.problems.append(f"{page}: exists but has no `<!-- autotune-help: {name} -->` block")
                continue
            page.write_text(_stub(name, blocks[name]), encoding="utf-8")
            report.created.append(page)
        else:
            report.missing.append(name)
    if not catalog_seen:
        report.problems.append(f"no `<!-- autotune-catalog -->` block in {docs_dir / CATALOG_PAGE}")
    return report


def _stub(name: str, block: str) -> str:
    from autotune.cli.main import cli

    summary = cli.commands[name].get_short_help_str(limit=200)
    return (f"# `autotune {name}`\n\n{summary}\n\n## Usage\n\n<!-- autotune-help: {name} -->\n{block}"
            "<!-- /autotune-help -->\n\n## Example\n\nAdd a real example: the command and its output.\n")


def explain(report: Report, wrote: bool = False) -> str:
    lines = []
    lines += [f"{'updated' if wrote else 'out of date'}: {p}" for p in report.changed]
    lines += [f"no help block for `autotune {n}`: add `<!-- autotune-help: {n} -->` and "
              f"`<!-- /autotune-help -->` to its page (docs/{n}.md), or run "
              "`python scripts/docs_sync.py --create-missing`" for n in report.missing]
    lines += [f"help block for a command the CLI does not have: {s}" for s in report.stale]
    lines += report.problems
    lines += [f"created {p}: add an example with real output" for p in report.created]
    return "\n".join(lines)


@click.command()
@click.option("--check", is_flag=True, help="Only report what is out of step; exit 1 if anything is.")
@click.option("--create-missing", is_flag=True, help="Create docs/<command>.md for commands without a page.")
@click.option("--docs-dir", type=click.Path(file_okay=False, path_type=Path), default=DOCS_DIR, show_default=True)
def main(check: bool, create_missing: bool, docs_dir: Path) -> None:
    """Rewrite the generated blocks of docs/ (each command's --help, the failure catalog)."""
    report = sync(docs_dir, write=not check, create_missing=create_missing)
    text = explain(report, wrote=not check)
    if text:
        click.echo(text, err=True)
    if check and not report.in_step:
        sys.exit(1)
    if not check and (report.missing or report.stale or report.problems):
        sys.exit(1)
    if not text:
        click.echo("docs/ is in step with the CLI", err=True)


if __name__ == "__main__":
    main()
