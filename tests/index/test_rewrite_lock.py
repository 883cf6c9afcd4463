"""Writers of one index (or manifest) at once: each rewrite-by-rename holds the file's
lock, so no writer's change is lost (issue 26, 1c). Real processes, started together."""

from __future__ import annotations

import json
import multiprocessing
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import tar_bytes

import indextar
from indextar.errors import IndextarError
from indextar.index.attribute_import import import_attributes
from indextar.index.manifest import append_to_manifest, read_manifest, write_manifest

SHARDS = 10
SAMPLES = 50
ROUNDS = 3


@pytest.fixture(scope="module")
def pool() -> Iterator[tuple[Any, Any]]:
    """Two worker processes with indextar and pyarrow already imported, and a barrier
    that starts their work at the same moment."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["indextar", "pyarrow.parquet"])
    with ctx.Manager() as manager, ctx.Pool(2) as workers:
        yield workers, manager.Barrier(2)


def _keys(n: int) -> list[str]:
    return [f"s{n:02d}_{i:04d}" for i in range(SAMPLES)]


def _shards(folder: Path, *, meta: bool = False, count: int = SHARDS) -> list[str]:
    shards = []
    for n in range(count):
        members: dict[str, bytes] = {}
        for key in _keys(n):
            members[f"{key}.txt"] = key.encode()
            members[f"{key}.json"] = json.dumps({"a": 1}).encode()
        path = folder / f"shard-{n:02d}.tar"
        path.write_bytes(tar_bytes(members))
        indextar.build_index(path, attributes_from="json" if meta else None)
        shards.append(str(path))
    return shards


def _table(folder: Path, column: str) -> str:
    keys = [key for n in range(SHARDS) for key in _keys(n)]
    path = folder / f"{column}.parquet"
    pq.write_table(pa.table({"key": keys, column: [1] * len(keys)}), path)
    return str(path)


def _columns(shard: str) -> dict[str, int]:
    """Each attribute column of the shard's index: how many samples have it set."""
    with sqlite3.connect(indextar.index_path(shard)) as conn:
        names = [row[1] for row in conn.execute("PRAGMA table_info(attributes)")]
        return {
            name: conn.execute(f'SELECT count("{name}") FROM attributes').fetchone()[0]
            for name in names
            if name != "__sample__"
        }


def _after_barrier(barrier: Any, call: Callable[..., Any], *args: Any) -> str:
    """Run ``call(*args)`` once both processes are ready; what it raised, or ''."""
    barrier.wait()
    try:
        call(*args)
    except IndextarError as e:
        return f"{type(e).__name__}: {e}"
    return ""


def _race(pool: tuple[Any, Any], *calls: tuple[Any, ...]) -> list[str]:
    workers, barrier = pool
    jobs = [workers.apply_async(_after_barrier, (barrier, *call)) for call in calls]
    return [job.get(timeout=60) for job in jobs]


def test_two_imports_of_different_columns_keep_both(pool: tuple[Any, Any], tmp_path: Path) -> None:
    shards = _shards(tmp_path)
    for r in range(ROUNDS):
        x, y = _table(tmp_path, f"x{r}"), _table(tmp_path, f"y{r}")
        errors = _race(pool, (import_attributes, shards, x), (import_attributes, shards, y))
        assert errors == ["", ""]
        for shard in shards:
            columns = _columns(shard)
            assert columns.get(f"x{r}") == SAMPLES and columns.get(f"y{r}") == SAMPLES, (
                shard,
                columns,
            )
    assert not list(tmp_path.glob(".*"))  # no temporary or lock files left


def test_a_build_racing_an_import_loses_neither(pool: tuple[Any, Any], tmp_path: Path) -> None:
    # A rebuild that adds the JSON attributes ("a") to plain indexes, against an import
    # of "x". What reported success is in every index; a rebuild after the import
    # refuses (it would drop "x"), and nothing else fails.
    for r in range(ROUNDS):
        folder = tmp_path / f"round{r}"
        folder.mkdir()
        shards = _shards(folder)
        built, imported = _race(
            pool, (_build_all, shards[::-1]), (import_attributes, shards, _table(folder, "x"))
        )
        for shard in shards:
            columns = _columns(shard)
            assert imported or columns.get("x") == SAMPLES, (shard, columns)
            assert built or columns.get("a") == SAMPLES, (shard, columns)
        assert imported == "" and (built == "" or "would drop the imported" in built), built
        if built:
            assert "x.parquet" in built


def _build_all(shards: list[str]) -> None:
    for shard in shards:
        indextar.build_index(shard, attributes_from="json")


def _append_each(manifest: str, shards: list[str]) -> None:
    for shard in shards:  # one rewrite per shard: many chances to interleave
        append_to_manifest(manifest, [indextar.open_index(shard)])


def test_two_appends_to_a_manifest_keep_every_shard(pool: tuple[Any, Any], tmp_path: Path) -> None:
    shards = _shards(tmp_path)
    half = SHARDS // 2
    for r in range(ROUNDS):
        manifest = str(tmp_path / f"m{r}.json")
        write_manifest(manifest, [])
        errors = _race(
            pool, (_append_each, manifest, shards[:half]), (_append_each, manifest, shards[half:])
        )
        assert errors == ["", ""]
        listed = sorted(shard.url for shard in read_manifest(manifest).shards)
        assert listed == sorted(shards)


_HOLD = """
import sys, time
from pathlib import Path
from indextar.atomic import rewrite_lock
with rewrite_lock(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(60)
"""


def test_readers_pass_a_held_lock_and_a_killed_holder_releases_it(tmp_path: Path) -> None:
    (shard,) = _shards(tmp_path, meta=True, count=1)
    index = indextar.index_path(shard)
    table = _table(tmp_path, "x")
    done: list[object] = []
    writer = threading.Thread(target=lambda: done.append(import_attributes([shard], table)))
    command = [sys.executable, "-c", _HOLD, str(index)]
    with subprocess.Popen(command, stdout=subprocess.PIPE) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
            writer.start()
            writer.join(0.5)
            assert writer.is_alive()  # waits for the holder
            dataset = indextar.IndexedTarDataset([shard])  # readers do not wait
            assert dataset[0]["txt"] == b"s00_0000"
            assert len(dataset.where("a = 1", cache_dir=False)) == SAMPLES
        finally:
            holder.kill()  # SIGKILL: the kernel drops its lock
    writer.join(30)
    assert not writer.is_alive() and len(done) == 1
    assert _columns(shard).get("x") == SAMPLES
    assert not list(tmp_path.glob(".*"))  # the dead holder's lock file went with the lock
