"""``indextar query`` and ``indextar meta import`` (issue 16)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import indextar
from indextar.cli.commands import main


@pytest.fixture
def shards(make_tar: Callable[..., Path]) -> list[str]:
    paths = []
    for s in range(2):
        members: dict[str, bytes] = {}
        for i in range(8):
            key = f"s{s}-{i:02d}"
            members[f"{key}.jpg"] = b"j" * (100 * i)
            members[f"{key}.json"] = json.dumps({"aesthetic": i + s / 2, "lang": "en"}).encode()
        paths.append(str(make_tar(members, name=f"d-{s}.tar")))
    assert main(["index", "-q", "-j", "1", "--meta", "json", *paths]) == 0
    return paths


def test_count_keys_json_and_summary(
    shards: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    where = ["--where", "aesthetic >= 5 AND size(jpg) < 700", "--no-cache"]
    expected = ["s0-05", "s0-06", "s1-05", "s1-06"]
    assert main(["query", *shards, *where, "--count"]) == 0
    assert capsys.readouterr().out == "4\n"
    assert main(["query", *shards, *where, "--keys"]) == 0
    keys = capsys.readouterr().out
    assert keys.splitlines() == expected
    # The key list is a key file for select().
    (tmp_path / "keys.txt").write_text(keys)
    ds = indextar.IndexedTarDataset(shards)
    assert [s["__key__"] for s in ds.select(tmp_path / "keys.txt")] == expected
    assert main(["query", *shards, *where, "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["__key__"] for r in rows] == expected
    assert rows[0] == {
        "__shard__": shards[0],
        "__index__": 5,
        "__key__": "s0-05",
        "aesthetic": 5.0,
        "lang": "en",
    }
    assert main(["query", *shards, *where]) == 0
    assert capsys.readouterr().out.startswith("4 of 16 samples in 2 shards match")


def test_errors_are_one_line(shards: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["query", *shards, "--where", "colour = 1", "--count", "--no-cache"]) == 1
    err = capsys.readouterr().err
    assert "no such column: colour" in err and "d-0.tar" in err


def test_meta_import_then_query(
    shards: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = tmp_path / "wm.parquet"
    keys = [f"s{s}-{i:02d}" for s in range(2) for i in range(8)]
    pq.write_table(pa.table({"id": keys, "watermark": [i / 16 for i in range(16)]}), table)
    assert main(["meta", "import", str(table), *shards, "--key", "id", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report == {
        "shards": 2,
        "samples": 16,
        "matched": 16,
        "missing": 0,
        "unused": 0,
        "columns": ["watermark"],
    }
    assert main(["query", *shards, "--where", "watermark < 0.5", "--count", "--no-cache"]) == 0
    assert capsys.readouterr().out == "8\n"
    dup = tmp_path / "dup.parquet"
    pq.write_table(pa.table({"key": ["s0-01", "s0-01"], "x": [1, 2]}), dup)
    assert main(["meta", "import", str(dup), *shards]) == 1
    assert "'s0-01'" in capsys.readouterr().err
