"""Where the tests' own files are, for a test module at any depth under tests/."""
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parent.parent
ROOT_DIR = TESTS_DIR.parent
FIXTURES_DIR = TESTS_DIR / "fixtures"
HELPERS_DIR = TESTS_DIR / "helpers"
