"""Compare two index files by content: every table row, and the meta except build time."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from indextar.index.shard import build_index

TABLES = ("members", "samples", "skipped", "arrays")


def index_rows(path: Path) -> dict[str, list[tuple[object, ...]]]:
    """Every row of every table, and the meta without ``created``."""
    conn = sqlite3.connect(path)
    try:
        rows = {t: conn.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall() for t in TABLES}
        rows["meta"] = conn.execute(
            "SELECT key, value FROM meta WHERE key != 'created' ORDER BY key"
        ).fetchall()
    finally:
        conn.close()
    return rows


def assert_index_matches_scan(shard: Path, written_index: Path, scratch: Path) -> None:
    """The index written alongside ``shard`` equals the one a fresh scan builds."""
    rebuilt = build_index(shard, index_dir=scratch, force=True)
    assert index_rows(written_index) == index_rows(rebuilt.path)
