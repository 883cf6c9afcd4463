"""The tree stays lint-clean, formatted and strictly typed (pyproject.toml's settings)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TREES = ["indextar", "tests", "tools", "examples"]


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)


def ruff() -> str:
    found = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert found, "ruff is a test dependency (pyproject.toml's test extra)"
    return found


def test_ruff_finds_nothing() -> None:
    done = run(ruff(), "check", "--output-format", "concise", *TREES)
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_format_leaves_every_file_as_it_is() -> None:
    done = run(ruff(), "format", "--check", *TREES)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.timeout(300)
def test_mypy_strict_on_the_library() -> None:
    done = run(sys.executable, "-m", "mypy", "indextar")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Success" in done.stdout
