"""build_indexes and iter_builds over many local shards (index/build.py, index/jobs.py)."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import sample_members, tar_bytes

from indextar import ShardFormatError, build_indexes
from indextar.index import build
from indextar.index.build import iter_builds
from indextar.index.fresh import fresh_on_stat
from indextar.index.jobs import BuildOptions


def shards(folder: Path, count: int, *, bad: tuple[int, ...] = ()) -> list[str]:
    paths = []
    for n in range(count):
        path = folder / f"s-{n:03d}.tar"
        data = tar_bytes(sample_members(5, prefix=f"p{n}_"))
        path.write_bytes(b"not a tar" * 100 if n in bad else data)
        paths.append(str(path))
    return paths


def test_any_executor_builds_and_every_failure_is_named(tmp_path: Path) -> None:
    paths = shards(tmp_path, 6, bad=(1, 4))
    with ThreadPoolExecutor(2) as pool, pytest.raises(ShardFormatError) as failed:
        build_indexes(paths, executor=pool)
    message = str(failed.value)
    assert message.startswith(repr(paths[1])) and "2 of 6 shards failed" in message
    assert repr(paths[4]) in message
    # The others were built all the same.
    assert sorted(p.name for p in tmp_path.glob("*.idx.sqlite")) == [
        f"s-{n:03d}.tar.idx.sqlite" for n in (0, 2, 3, 5)
    ]


def test_a_fresh_rerun_starts_no_pool_and_a_touched_shard_is_rebuilt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = shards(tmp_path, 5)
    first = list(iter_builds(paths, BuildOptions(), workers=2))
    assert all(o.built and o.scan == "local" for o in first)

    def no_pool(workers: int) -> None:
        raise AssertionError("a pool was started for shards that were all fresh")

    monkeypatch.setattr(build, "_process_pool", no_pool)
    again = list(iter_builds(paths, BuildOptions(), workers=4))
    assert [o.shard for o in again] == paths and not any(o.built for o in again)

    st = os.stat(paths[2])
    os.utime(paths[2], ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert fresh_on_stat(paths[2], BuildOptions()) is None
    assert fresh_on_stat(paths[3], BuildOptions()) is not None
    # One job: built in this process, still no pool.
    rebuilt = [o for o in iter_builds(paths, BuildOptions(force=False), workers=4) if not o.ok]
    assert len(rebuilt) == 1 and rebuilt[0].error_type == "StaleIndexError"
    forced = [o for o in iter_builds([paths[2]], BuildOptions(force=True), workers=4)]
    assert forced[0].built


def test_a_recheck_reads_the_index_metadata_from_its_extended_attribute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from indextar.index import fresh

    paths = shards(tmp_path, 3)
    built = {o.shard: o.index for o in iter_builds(paths, BuildOptions(), workers=1)}
    try:
        os.getxattr(str(built[paths[0]].path), "user.indextar.meta")  # type: ignore[union-attr]
    except OSError:
        pytest.skip(f"the filesystem under {tmp_path} keeps no user extended attributes")

    def no_sqlite(path: Path) -> None:
        raise AssertionError("the index was opened")

    monkeypatch.setattr(fresh, "read_meta", no_sqlite)
    for path in paths:
        fresh = fresh_on_stat(path, BuildOptions())
        assert fresh is not None and fresh.meta == built[path].meta  # type: ignore[union-attr]
    monkeypatch.undo()
    # A rebuilt index is a new inode, with its own attribute.
    rebuilt = next(iter_builds([paths[1]], BuildOptions(force=True), workers=1))
    assert rebuilt.built and rebuilt.index is not None
    assert fresh_on_stat(paths[1], BuildOptions()) == rebuilt.index
