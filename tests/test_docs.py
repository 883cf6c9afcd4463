"""Docs are code: every fenced python and shell block in README.md and docs/ runs here.

Blocks of one file run in order, in one fresh folder, sharing one Python namespace,
the way a reader would type them. ``python`` blocks are executed; ``sh``/``bash``
blocks run under ``bash -euo pipefail`` with this interpreter's ``bin/`` first on
PATH. Other fences (``text``, ``sql``, ``json``) are illustrations, not commands.
Two lines are not run as typed: ``make test`` is the command that runs this suite
(``test_ci_runs_the_readme_test_command`` checks that CI runs it), and ``make demo``
would rebuild the virtualenv under a running suite, so ``test_make_demo_runs`` runs
the script it runs instead.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```", re.S | re.M)
RUNNABLE = {"python", "sh", "bash"}


def blocks(path: Path) -> list[tuple[str, str, int]]:
    """``(language, code, line)`` of each fenced block in ``path``."""
    text = path.read_text()
    return [
        (m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1) for m in _FENCE.finditer(text)
    ]


def _shell_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ROOT)
    env["REPO"] = str(ROOT)
    return env


@pytest.mark.parametrize("doc", DOCS, ids=[p.name for p in DOCS])
def test_doc_examples_run(doc: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runnable = [b for b in blocks(doc) if b[0] in RUNNABLE]
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": f"doc_{doc.stem}"}
    for lang, code, line in runnable:
        where = f"{doc.relative_to(ROOT)}:{line}"
        if lang == "python":
            exec(compile(code, where, "exec"), namespace)  # noqa: S102 - running our own docs
            continue
        script = "\n".join(
            ln
            for ln in code.splitlines()
            if ln.split("#")[0].strip() not in ("make test", "make demo")
        )
        result = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=tmp_path,
            env=_shell_env(),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert result.returncode == 0, f"{where} failed:\n{result.stdout}\n{result.stderr}"


def test_readme_gives_the_two_setup_commands() -> None:
    shell = "\n".join(code for lang, code, _ in blocks(ROOT / "README.md") if lang in RUNNABLE)
    assert "make demo" in shell and "make test" in shell


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make test$", ci, re.M), ci


def test_make_demo_runs(tmp_path: Path) -> None:
    """``make demo``'s script, run as the Makefile runs it, into a scratch folder."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py"), str(tmp_path / "demo-data")],
        cwd=ROOT,
        env=_shell_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "all match" in result.stdout
    assert re.search(r"indexed 4 shards \(4 built", result.stdout), result.stdout
