"""What the README, the Makefile and docs/ say is what autotune does (issue 37: a new user's afternoon).

Each check is a statement a reader acts on: the demo's target, the card they will see, the command
they copy, the folder a citation points to, the help of --strategy auto.
"""
from __future__ import annotations

import re

from click.testing import CliRunner

from autotune.cli import cli
from autotune.export import local, targets
from tests.helpers.paths import ROOT_DIR

ROOT = ROOT_DIR
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
# The pages whose example cards issue 37 found without the card's newer lines.
CARD_PAGES = [ROOT / "README.md", ROOT / "docs" / "resume.md", ROOT / "docs" / "fake-vllm.md"]


def cards(text: str) -> list[list[str]]:
    """Each full card of a page: its lines from `Verified ceiling` to its last `files:` line."""
    found, lines = [], text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Verified ceiling:"):
            j = i + 1
            while j < len(lines) and lines[j].startswith("  "):
                j += 1
            found.append(lines[i:j])
    return found


def test_the_demo_is_described_as_it_runs():
    """vLLM 0.32's --max-model-len auto fits the demo's length in one boot: nothing is refused."""
    for path in (ROOT / "README.md", ROOT / "Makefile"):
        text = path.read_text()
        assert not re.search(r"so (the|a) target of 65,536 is refused", text), path.name
        assert "one boot" in text, path.name


def test_the_example_cards_carry_the_lines_the_card_prints():
    """A card that lists the paste-ready files of a plain vLLM command lists them all: the four host
    files a line each, then the deployment files on one `deploy:` line (cli/summary.files_lines)."""
    expected_deploy = f"  deploy:   {' '.join(targets.FILE_NAMES)} (beside them)"
    for path in CARD_PAGES:
        full = [card for card in cards(path.read_text()) if any(line.startswith("  files:") for line in card)]
        assert full, f"{path.name} shows no full card"
        for card in full:
            at = next(i for i, line in enumerate(card) if line.startswith("  files:"))
            listed = [card[at]] + [line for line in card[at + 1:] if line.startswith(" " * 12)]
            names = [line.split()[-1].rsplit("/", 1)[-1] for line in listed]
            assert names == list(local.FILES[:4]), (path.name, card[0], names)
            assert expected_deploy in card, (path.name, card[0])


def test_every_fleet_render_a_page_shows_says_how_pods_get_autotune():
    """`fleet render --k8s` requires --autotune (wheel:URL, configmap:NAME or image): a command without
    it stops at click's usage error."""
    result = CliRunner().invoke(cli, ["fleet", "render", "docs/examples/fleet-seed.yaml", "--k8s", "--pvc", "c"])
    assert result.exit_code == 2 and "Missing option '--autotune'" in result.output
    for path in PAGES:
        text = path.read_text().replace("\\\n", " ")  # a command continued on the next line is one command
        for command in re.findall(r"autotune fleet render [^`\n]*", text):
            assert "--autotune" in command, (path.name, command)


def test_no_page_cites_a_folder_a_clone_does_not_have():
    """The reference folder beside the development checkout (../shared/) is not in the repository:
    a citation names the copy the repository keeps (tests/fixtures/logs/)."""
    for path in PAGES:
        text = path.read_text()
        for cited in re.findall(r"`((?:\.\./)*shared/[^`]*)`", text):
            raise AssertionError(f"{path.name} cites {cited}, which a clone has not")
        for cited in re.findall(r"`(tests/fixtures/[^`*]*)", text):
            cited = cited.split("...")[0]  # 018-...: the file's name, shortened
            assert (ROOT / cited.rstrip("/")).exists() or list(ROOT.glob(cited + "*")), (path.name, cited)


def test_no_page_prints_a_path_of_a_developers_machine():
    for path in PAGES:
        found = re.findall(r"/work/[\w./-]*", path.read_text())
        assert found == [], (path.name, found)


def test_strategy_auto_help_says_the_server_boots_at_vllms_own_fit():
    """--max-model-len auto boots uncapped: vLLM fits the longest length its pool holds, which may pass
    the target (only a vLLM that reads the fitted length without serving it relaunches, capped)."""
    result = CliRunner().invoke(cli, ["tune", "--help"], terminal_width=200)
    strategy = re.search(r"--strategy \[[^\]]*\]\s+(.*?)(?:\n  -|\n  --)", result.output, re.S).group(1)
    assert "capped at the target" not in strategy
    assert "past the target where it fits" in " ".join(strategy.split())
