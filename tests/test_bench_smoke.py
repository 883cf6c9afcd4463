"""Smoke test for tools/bench.py: it runs and reports every tool. Timings are not checked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "tools" / "bench.py"
TOOLS = (
    "indextar build_index",
    "indextar scan only",
    "indextar scan + grouping",
    "tarfile getmembers",
    "ratarmountcore SQLiteIndexedTar",
    "bare header walk (floor)",
    "GNU tar tf",
)


def run_bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=120
    )


def test_index_quick_prints_a_row_per_tool_and_data_set(tmp_path: Path) -> None:
    done = run_bench("index", "--quick", "--data-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    for tool in TOOLS:
        assert sum(row.startswith(f"| {tool} |") for row in rows) == 2, (tool, done.stdout)
    for target in (
        "scan only >= bare header walk",
        "build_index >= 10x ratarmountcore",
        "build_index >= 10x tarfile",
        "scan reads only the headers",
    ):
        assert any(
            target in line and line.startswith(("- PASS", "- FAIL"))
            for line in done.stdout.splitlines()
        ), (target, done.stdout)


def test_index_quick_json(tmp_path: Path) -> None:
    done = run_bench("index", "--quick", "--json", "--data-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)["index"]
    assert [d["label"] for d in results["data_sets"]] == ["tiny", "large"]
    for data_set in results["data_sets"]:
        assert [r["tool"] for r in data_set["results"]] == list(TOOLS)
