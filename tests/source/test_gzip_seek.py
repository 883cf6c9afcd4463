"""Reads of a foreign ``.tar.gz`` from its seek points (``source/gzipped.py``): zlib
from a point (``_gunzip.c``'s ``inflate_from``) against the whole decompressed file,
sparse windows against whole ones, the span cache (hits, misses, eviction), batch
reads against one-by-one reads, corrupt and truncated files, fork and spawn workers."""

from __future__ import annotations

import contextlib
import gzip
import multiprocessing
import os
import pickle
import random
import sqlite3
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest
from readers import wds_samples
from tarcraft import GNU_TAR, write_tree
from torch.utils.data import DataLoader

import indextar
from indextar import native
from indextar.errors import ShardFormatError, TruncatedShardError
from indextar.index.arrays import read_layout
from indextar.index.verify import verify_index
from indextar.source import spancache
from indextar.source.gzipped import GzipSeekSource
from indextar.source.local import open_source
from indextar.source.seekpoints import SeekPoints, build_seek_points
from indextar.source.spancache import SPAN_CACHE, SpanCache

SPACING = 1 << 16


def members(n: int, size: int) -> dict[str, bytes]:
    """``n`` samples: a ``bin`` half random (a long deflate stream), half zeros, and a
    ``txt``."""
    rng = np.random.default_rng(n)
    out: dict[str, bytes] = {}
    for i in range(n):
        out[f"s{i:05d}.bin"] = rng.bytes(size // 2) + bytes(size // 2)
        out[f"s{i:05d}.txt"] = f"sample {i}".encode()
    return out


def expected(tar: bytes) -> list[dict[str, object]]:
    return wds_samples(tar)


def gnu_targz(folder: Path, files: dict[str, bytes]) -> Path:
    """``files`` as one gzip stream by GNU ``tar czf``, the same bytes in every run (so
    that a corruption is caught the same way: reads from a seek point check no CRC,
    and some corruptions decode to wrong bytes of the right length)."""
    write_tree(folder / "tree", files)
    archive = folder / "gnu.tar.gz"
    subprocess.run(
        [GNU_TAR, "--sort=name", "--mtime=@0", "--owner=0", "--group=0", "--numeric-owner",
         "-czf", str(archive), "-C", str(folder / "tree"), "."],
        check=True, env={**os.environ, "LC_ALL": "C.UTF-8"},
    )  # fmt: skip
    return archive


@pytest.fixture(scope="module")
def targz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~1.3 MB of tar in one gzip stream: about 20 seek points."""
    archive = gnu_targz(tmp_path_factory.mktemp("gz"), members(200, size=6000))
    indextar.build_index(archive, seek_spacing=SPACING)
    return archive


@pytest.fixture(scope="module")
def two_members(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two tars' worth of data as two gzip members of ~700 KB (``cat a.gz b.gz``), so
    reads cross a member's end."""
    folder = tmp_path_factory.mktemp("gz2")
    tar = gzip.decompress(gnu_targz(folder, members(200, size=6000)).read_bytes())
    whole = folder / "two.tar.gz"
    with open(whole, "wb") as out:
        for part in (tar[: len(tar) // 2 + 1234], tar[len(tar) // 2 + 1234 :]):
            out.write(subprocess.run(["gzip", "-6", "-c"], input=part, stdout=subprocess.PIPE,
                                     check=True).stdout)  # fmt: skip
    indextar.build_index(whole, seek_spacing=SPACING)
    return whole


def seek_source(path: Path, cache: SpanCache | None = None) -> GzipSeekSource:
    index = indextar.open_index(path)
    layout = read_layout(index.path, index.meta)
    assert layout.seek_points is not None
    return GzipSeekSource(
        open_source(path), layout.seek_points, local_path=str(path),
        cache=SpanCache(0) if cache is None else cache,
    )  # fmt: skip


def ranges(size: int, count: int, seed: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    out = [(0, 0), (0, 1), (size - 1, 1), (size - 70_000, 70_000)]  # ends, and a long one
    for _ in range(count):
        length = rng.choice([1, 100, 6656, 20_000, 150_000])
        out.append((rng.randrange(size - length), length))
    return out


@pytest.mark.parametrize("name", ["targz", "two_members"])
def test_reads_from_seek_points_equal_the_decompressed_file(
    name: str, request: pytest.FixtureRequest
) -> None:
    path: Path = request.getfixturevalue(name)
    tar = gzip.decompress(path.read_bytes())
    source = seek_source(path)
    assert source.size == len(tar) and len(source._starts) > 10
    if name == "two_members":  # a point at the second member's start, none needed before
        assert any(not w for w in source.points.windows[1:])
    for offset, length in ranges(len(tar), 120, seed=1):
        assert source.read(offset, length) == tar[offset : offset + length], (offset, length)
    with pytest.raises(TruncatedShardError, match="outside the decompressed shard"):
        source.read(len(tar) - 10, 11)


def test_sparse_windows_keep_few_bytes_and_read_as_whole_ones(
    targz: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tar = gzip.decompress(targz.read_bytes())
    sparse = seek_source(targz).points
    whole = build_seek_points(str(targz), spacing=SPACING)  # zran's own, whole windows
    assert np.array_equal(sparse.points, whole.points)
    assert whole.windows_agree(sparse) and not sparse.windows_agree(whole)
    kept = [np.count_nonzero(np.frombuffer(zlib.decompress(w), np.uint8)) for w in sparse.windows
            if w]  # fmt: skip
    assert max(kept) < 32768 // 2  # half random data: most of a window is never referenced
    assert sum(map(len, sparse.windows)) < sum(map(len, whole.windows)) // 2
    # zlib from the sparse windows, zlib from the whole ones, and zran (the fallback
    # where _gunzip.c is not built) from the sparse ones read the same bytes
    by_whole = GzipSeekSource(open_source(targz), whole, cache=SpanCache(0))
    with monkeypatch.context() as patch:  # _gunzip.c is looked up at the first read
        patch.setenv(native.PURE_PYTHON_ENV, "1")
        by_zran = seek_source(targz)
        for offset, length in ranges(len(tar), 40, seed=2):
            want = tar[offset : offset + length]
            assert by_whole.read(offset, length) == want and by_zran.read(offset, length) == want
        assert by_zran._gunzip is None


def test_a_wrong_window_byte_that_is_kept_changes_what_is_read(targz: Path) -> None:
    """The kept bytes are the ones reads use: a window whose kept bytes are flipped
    reads other bytes (so the test above is not vacuous)."""
    points = seek_source(targz).points
    n = next(i for i, w in enumerate(points.windows) if w and i > 0)
    window = np.frombuffer(zlib.decompress(points.windows[n]), np.uint8).copy()
    window[window != 0] ^= 0xFF
    windows = list(points.windows)
    windows[n] = zlib.compress(window.tobytes())
    bent = SeekPoints(points.compressed_size, points.uncompressed_size, points.spacing,
                      points.points, tuple(windows))  # fmt: skip
    start, end = int(points.points[n, 2]), int(points.points[n + 1, 2])
    good = seek_source(targz).read(start, end - start)
    assert (
        GzipSeekSource(open_source(targz), bent, cache=SpanCache(0)).read(start, end - start)
        != good
    )


def test_span_cache_evicts_least_recently_used_within_its_budget() -> None:
    cache = SpanCache(100)
    cache.put((1, 0), b"a" * 40)
    cache.put((1, 1), b"b" * 40)
    assert cache.get((1, 0)) == b"a" * 40  # (1, 1) is now the least recently used
    cache.put((2, 0), b"c" * 40)
    assert (1, 1) not in cache and cache.size == 80 and len(cache) == 2
    cache.put((2, 0), b"c" * 60)  # replaced, not counted twice
    assert cache.size == 100
    cache.put((3, 0), b"d" * 101)  # larger than the budget: not kept, nothing evicted
    assert (3, 0) not in cache and cache.size == 100
    assert cache.get((9, 9)) is None and (cache.hits, cache.misses) == (1, 1)
    cache.drop(2)
    assert list(cache._entries) == [(1, 0)] and cache.size == 40
    assert SpanCache(-5).budget == 0


def test_set_span_cache_budget_evicts_what_no_longer_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spancache, "SPAN_CACHE", SpanCache(1000))
    spancache.SPAN_CACHE.put((1, 0), bytes(600))
    spancache.SPAN_CACHE.put((1, 1), bytes(300))
    spancache.set_span_cache_budget(500)
    assert list(spancache.SPAN_CACHE._entries) == [(1, 1)] and spancache.SPAN_CACHE.budget == 500
    spancache.set_span_cache_budget(0)
    assert len(spancache.SPAN_CACHE) == 0


def test_budget_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INDEXTAR_GZIP_CACHE_BYTES", "12345")
    assert spancache._budget_from_environment() == 12345
    monkeypatch.setenv("INDEXTAR_GZIP_CACHE_BYTES", "lots")
    assert spancache._budget_from_environment() == spancache.DEFAULT_BUDGET
    monkeypatch.delenv("INDEXTAR_GZIP_CACHE_BYTES")
    assert spancache._budget_from_environment() == spancache.DEFAULT_BUDGET


def counting(source: GzipSeekSource, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Record ``(seek point, bytes decompressed)`` for every decompression."""
    calls: list[tuple[int, int]] = []
    decompress = source._decompress

    def recorded(point: int, end: int, whole: bool) -> bytes:
        data = decompress(point, end, whole)
        calls.append((point, len(data)))
        return data

    monkeypatch.setattr(source, "_decompress", recorded)
    return calls


def test_cache_hits_misses_and_eviction(targz: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tar = gzip.decompress(targz.read_bytes())
    cache = SpanCache(1 << 30)
    source = seek_source(targz, cache)
    calls = counting(source, monkeypatch)
    starts = source._starts
    a = starts[3] + 20_000
    assert source.read(a, 5000) == tar[a : a + 5000]  # first touch: to the read's end
    assert calls == [(3, 25_000)] and ((source._token, 3) in cache)
    source._last_at = -1  # from here on, only the cache can serve
    assert source.read(a - 15_000, 10_000) == tar[a - 15_000 : a - 5000]  # inside: a hit
    assert len(calls) == 1 and cache.hits == 1
    b = starts[3] + 40_000  # beyond what is kept: the second read takes the whole span
    assert source.read(b, 3000) == tar[b : b + 3000]
    assert calls[-1] == (3, starts[4] - starts[3])
    source._last_at = -1
    assert source.read(starts[4] - 100, 100) == tar[starts[4] - 100 : starts[4]]
    assert len(calls) == 2
    # a budget of two first touches (300 bytes each): a third evicts the least recent
    small = SpanCache(700)
    source = seek_source(targz, small)
    calls = counting(source, monkeypatch)
    for point in (1, 2, 1, 5):
        source._last_at = -1
        offset = starts[point] + 100
        assert source.read(offset, 200) == tar[offset : offset + 200]
    assert [p for p, _ in calls] == [1, 2, 5]  # the second read of 1 was a hit
    assert (source._token, 2) not in small and (source._token, 1) in small
    assert small.size <= small.budget
    source.close()
    assert len(small) == 0  # a closed source's spans are dropped


def test_sources_do_not_share_entries(targz: Path) -> None:
    cache = SpanCache(1 << 30)
    first, second = seek_source(targz, cache), seek_source(targz, cache)
    first.read(1000, 10)
    assert first._token != second._token and len(cache) == 1
    second.read(1000, 10)
    assert len(cache) == 2


def test_batch_reads_equal_one_by_one_and_decompress_each_span_once(
    targz: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tar = gzip.decompress(targz.read_bytes())
    source = seek_source(targz)  # no cache: all the saving is the batch's
    calls = counting(source, monkeypatch)
    rng = random.Random(3)
    wanted = [(o, n) for o, n in ranges(len(tar), 60, seed=4) if n < 100_000]
    rng.shuffle(wanted)
    got = source.read_many([o for o, _ in wanted], [n for _, n in wanted])
    assert got == [tar[o : o + n] for o, n in wanted]
    points = [int(np.searchsorted(source._starts, o, "right")) - 1 for o, _ in wanted]
    assert sorted(p for p, _ in calls) == sorted(set(points))  # one decompression a span
    # and through the dataset: a DataLoader batch is read by __getitems__
    ds = indextar.IndexedTarDataset(str(targz))
    order = rng.sample(range(len(ds)), 50)
    assert ds.__getitems__(order) == [ds[i] for i in order]
    assert [s["bin"] for s in ds.__getitems__(order)] == [expected(tar)[i]["bin"] for i in order]


def corrupted(path: Path, tmp_path: Path, at: float, name: str) -> Path:
    data = bytearray(path.read_bytes())
    middle = int(len(data) * at)
    data[middle : middle + 200] = bytes(range(200))
    bad = tmp_path / name
    bad.write_bytes(bytes(data))
    return bad


def test_corrupt_and_truncated_files_raise_naming_shard_and_offset(
    targz: Path, tmp_path: Path
) -> None:
    points = seek_source(targz).points
    tar = gzip.decompress(targz.read_bytes())
    bad = corrupted(targz, tmp_path, 0.5, "bad.tar.gz")  # same size, the index's points
    source = GzipSeekSource(open_source(bad), points, cache=SpanCache(0))
    c_bad = len(bad.read_bytes()) // 2
    point = int(np.searchsorted(points.points[:, 0], c_bad, "right")) - 1
    start, end = int(points.points[point, 2]), int(points.points[point + 1, 2])
    with pytest.raises(ShardFormatError, match="corrupt gzip data") as err:
        source.read(start, end - start)
    assert err.value.shard == str(bad) and err.value.offset is not None
    assert c_bad - 65536 <= err.value.offset <= c_bad + 65536
    assert source.read(0, 1000) == tar[:1000]  # the spans before it still read
    for at in (0.2, 0.3, 0.5, 0.7):  # a zlib error or too few bytes: corrupt either way
        bad = corrupted(targz, tmp_path, at, f"bad-{at}.tar.gz")
        source = GzipSeekSource(open_source(bad), points, cache=SpanCache(0))
        with pytest.raises(ShardFormatError, match="corrupt gzip data") as err:
            source.read(0, len(tar))
        assert err.value.shard == str(bad) and not isinstance(err.value, TruncatedShardError)
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(targz.read_bytes()[: int(points.points[-3, 0])])
    source = GzipSeekSource(open_source(cut), points, cache=SpanCache(0))
    with pytest.raises(TruncatedShardError, match="it ends before the seek point") as cut_err:
        source.read(len(tar) - 10_000, 10_000)
    assert cut_err.value.shard == str(cut) and cut_err.value.offset == points.points[-2, 0]
    start = int(points.points[-4, 2])  # from a point before the cut, across it
    with pytest.raises(TruncatedShardError, match="the gzip stream gave") as cut_err:
        source.read(start, len(tar) - start)
    assert cut_err.value.shard == str(cut) and cut_err.value.offset is not None


def check_in_child(path: str, queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    ds = indextar.IndexedTarDataset(path)
    empty = len(SPAN_CACHE) == 0
    queue.put((empty, bytes(ds[150]["bin"])))


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_workers_read_through_their_own_cache(targz: Path, method: str) -> None:
    want = expected(gzip.decompress(targz.read_bytes()))
    ds = indextar.IndexedTarDataset(str(targz))
    for i in range(0, 200, 7):  # the parent's cache holds spans, its lock was used
        ds[i]
    assert len(SPAN_CACHE) > 0
    loader = DataLoader(
        ds, batch_size=8, num_workers=2, multiprocessing_context=method, collate_fn=list,
        sampler=random.Random(5).sample(range(len(ds)), len(ds)),
    )  # fmt: skip
    got = {s["__key__"]: s["bin"] for batch in loader for s in batch}
    assert got == {w["__key__"]: w["bin"] for w in want}
    if method == "fork":
        context = multiprocessing.get_context("fork")
        queue = context.Queue()
        child = context.Process(target=check_in_child, args=(str(targz), queue))
        child.start()
        empty, data = queue.get(timeout=60)
        child.join(60)
        assert empty and data == want[150]["bin"]  # a forked child starts with none
    ds.close()


def test_spacing_default_and_index_size(tmp_path: Path) -> None:
    from indextar.index.decompress import DEFAULT_SEEK_SPACING

    archive = gnu_targz(tmp_path, members(100, size=6000))
    index = indextar.build_index(archive)
    assert index.meta.seek_spacing == DEFAULT_SEEK_SPACING == 1 << 17
    assert os.path.getsize(index.path) < 200_000


def test_verify_accepts_whole_windows_and_refuses_a_wrong_kept_byte(tmp_path: Path) -> None:
    """An index written before windows were sparse (whole windows) still verifies; a
    window whose kept bytes differ from the shard's does not."""
    archive = gnu_targz(tmp_path, members(100, size=6000))
    indextar.build_index(archive, seek_spacing=SPACING)
    whole = build_seek_points(str(archive), spacing=SPACING)
    sparse = seek_source(archive).points
    path = indextar.index_path(archive)
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.executemany(
            "UPDATE seek_points SET window = ? WHERE point_id = ?",
            [(w or None, n) for n, w in enumerate(whole.windows)],
        )
    assert verify_index(archive).ok
    tar = gzip.decompress(archive.read_bytes())
    assert seek_source(archive).read(300_000, 50_000) == tar[300_000:350_000]
    n = next(i for i, w in enumerate(sparse.windows) if w and i > 0)
    window = bytearray(zlib.decompress(sparse.windows[n]))
    at = next(i for i, b in enumerate(window) if b and b != (i & 0xFF))
    window[at] ^= 0x01
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute(
            "UPDATE seek_points SET window = ? WHERE point_id = ?", (zlib.compress(window), n)
        )
    assert verify_index(archive).problems == [
        "seek points: their windows differ from the shard's data"
    ]


def test_a_lock_held_at_a_fork_does_not_block_the_child(targz: Path) -> None:
    source = seek_source(targz)
    source.read(0, 10)
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    with source._guard():  # as if another thread were reading when the DataLoader forks
        child = context.Process(target=read_in_child, args=(source, queue))
        child.start()
    assert queue.get(timeout=60) == gzip.decompress(targz.read_bytes())[5000:6000]
    child.join(60)
    restored = pickle.loads(pickle.dumps(source))  # a spawned worker's copy
    assert restored.cache is SPAN_CACHE and restored.read(5000, 1000) == source.read(5000, 1000)


def read_in_child(source: GzipSeekSource, queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    queue.put(source.read(5000, 1000))


def test_a_cache_passed_in_starts_empty_in_a_forked_child_with_its_own_lock(targz: Path) -> None:
    cache = SpanCache(1 << 30)
    source = seek_source(targz, cache)
    source.read(0, 10)
    assert len(cache) > 0
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    with cache._guard():  # held by another thread at the fork
        child = context.Process(target=cache_in_child, args=(source, queue))
        child.start()
    assert queue.get(timeout=60) == (0, gzip.decompress(targz.read_bytes())[5000:6000], 1)
    child.join(60)


def cache_in_child(source: GzipSeekSource, queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    empty = len(source.cache)
    queue.put((empty, source.read(5000, 1000), len(source.cache)))


def outcome_in_child(ds: indextar.IndexedTarDataset, queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    try:
        queue.put(bytes(ds[3]["bin"]))
    except Exception as e:
        queue.put(type(e).__name__)


def test_a_forked_child_refuses_a_file_replaced_after_the_parent_read_it(
    tmp_path: Path,
) -> None:
    """The parent's last span is not the child's: a child reading the span the parent
    read last finds the file replaced by rename, as with a plain tar."""
    archive = gnu_targz(tmp_path / "a", members(20, size=6000))
    indextar.build_index(archive, seek_spacing=SPACING)
    plain = tmp_path / "plain.tar"
    plain.write_bytes(gzip.decompress(archive.read_bytes()))
    indextar.build_index(plain)
    datasets = [indextar.IndexedTarDataset(str(archive)), indextar.IndexedTarDataset(str(plain))]
    for ds in datasets:
        assert ds[3]["bin"] == members(20, size=6000)["s00003.bin"]
    newer = gnu_targz(tmp_path / "b", members(21, size=6000))
    os.replace(newer, archive)
    plain.with_suffix(".new").write_bytes(gzip.decompress(archive.read_bytes()))
    os.replace(plain.with_suffix(".new"), plain)
    context = multiprocessing.get_context("fork")
    for ds in datasets:
        queue = context.Queue()
        child = context.Process(target=outcome_in_child, args=(ds, queue))
        child.start()
        assert queue.get(timeout=60) == "StaleIndexError", ds
        child.join(60)


def test_a_file_changed_in_place_is_refused_even_where_its_spans_are_kept(
    tmp_path: Path,
) -> None:
    """A sample read once (its span in the cache, and as the last span) is refused once
    the file is rewritten in place, one by one and in a batch, as with a plain tar."""
    archive = gnu_targz(tmp_path, members(20, size=6000))
    indextar.build_index(archive, seek_spacing=SPACING)
    plain = tmp_path / "plain.tar"
    plain.write_bytes(gzip.decompress(archive.read_bytes()))
    indextar.build_index(plain)
    for path in (archive, plain):
        ds = indextar.IndexedTarDataset(str(path))
        assert [s["bin"] for s in ds.__getitems__([3, 4])] == [ds[3]["bin"], ds[4]["bin"]]
        with open(path, "r+b") as f:  # same size, one byte changed, a new mtime
            f.seek(100)
            byte = f.read(1)
            f.seek(100)
            f.write(bytes([byte[0] ^ 1]))
        os.utime(path, ns=(1, 1))
        with pytest.raises(indextar.StaleIndexError, match="changed in place"):
            ds[3]
        with pytest.raises(indextar.StaleIndexError, match="changed in place"):
            ds.__getitems__([3, 4])
