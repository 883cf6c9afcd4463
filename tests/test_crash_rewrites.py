"""Crash safety of every rewrite: ``meta import``, ``recompress``, a manifest append and a
shard-cache fill killed with SIGKILL, a few times each (the long form, with its counts in
docs/reliability.md: ``python tools/crash_storm.py --kills 25``).

After every kill each file is the old one or the new one (an index that opens holds one
of the two states; no half-written file opens), nothing else is left but the writers'
hidden temporary and lock files, and a re-run succeeds and leaves the new state. One
kill in three lands as soon as the rewrite's temporary file or download appears.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from crash_scenarios import SCENARIOS
from crash_storm import Forker, storm

KILLS = int(os.environ.get("INDEXTAR_CRASH_KILLS_REWRITES", "3"))


@pytest.fixture(scope="module")
def forker() -> Iterator[Forker]:
    server = Forker()
    yield server
    server.close()


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_a_killed_rewrite_leaves_old_or_new_and_a_rerun_succeeds(
    name: str, forker: Forker, tmp_path: Path
) -> None:
    with SCENARIOS[name](tmp_path / name, small=True) as scenario:
        counts = storm(scenario, forker, kills=KILLS, seed=11, timing_runs=1)
    print(counts)
    assert counts["kills"] == KILLS
