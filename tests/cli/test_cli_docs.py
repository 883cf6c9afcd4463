"""docs/cli.md is generated from the parser; it must match it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_cli_reference_matches_the_parser() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_cli_docs.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr


def test_every_subcommand_is_documented() -> None:
    from gen_cli_docs import render

    text = render()
    for command in ("index", "info", "verify"):
        assert f"## indextar {command}\n" in text
