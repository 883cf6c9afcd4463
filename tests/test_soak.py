"""A CI slice of tools/soak.py: 20,000 random samples through 2 DataLoader workers,
every member checked against the SHA-1 recorded when it was written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SOAK = Path(__file__).resolve().parent.parent / "tools" / "soak.py"


def test_soak_slice_reads_every_byte_right_with_flat_memory(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(SOAK),
            "--samples",
            "20000",
            "--shards",
            "4",
            "--per-shard",
            "1000",
            "--data-dir",
            str(tmp_path),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["samples"] == 20000 and result["members"] == 40000
    assert result["mismatches"] == 0
    rss = result["rss"]
    assert len(rss) == 10
    # Flat: after the first tenth, neither the main process nor the workers grow.
    assert rss[-1]["main_mb"] - rss[0]["main_mb"] < 20, rss
    assert rss[-1]["workers_mb"] - rss[0]["workers_mb"] < 40, rss
