"""Remote index builds read the shard once, forward, with no copy on disk (index/remote.py).

Against the loopback HTTP server: the index equals a local build of the same bytes
(arrays, fingerprint, span check), errors equal the local scan's, and large members
are read by their headers alone.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import sample_members, tar_bytes
from loopback_servers import HttpServer
from tarcraft import BLOCK, blocks, header, pax_records

from indextar import IndexedTarDataset, IndextarError, build_index, scan_tar
from indextar.index.remote import build_remote_index, remote_index_path, scan_remote_shard


def _global_named() -> bytes:
    def pax(kind: bytes, records: dict[str, str]) -> bytes:
        data = pax_records(records)
        return header("./PaxHeaders/x", len(data), typeflag=kind) + blocks(data)

    return (
        pax(b"g", {"path": "k.txt"})  # names every later member without a local path
        + pax(b"x", {"path": "a.txt"})
        + header("ignored.txt", 3)
        + blocks(b"aaa")
        + header("zzz.txt", 3)
        + blocks(b"bbb")
        + bytes(2 * BLOCK)
    )


SHARDS = {
    "ustar.tar": tar_bytes(sample_members(30, exts=("jpg", "cls")), "ustar"),
    "gnu.tar": tar_bytes(
        {**sample_members(20, exts=("json",)), "x" * 150 + ".txt": b"long"}, "gnu"
    ),
    "pax.tar": tar_bytes({**sample_members(20, exts=("txt",)), "caf\u00e9.txt": b"utf8"}, "pax"),
    "global.tar": _global_named(),
    "video.tar": tar_bytes(
        {
            f"v{i:03d}.{ext}": os.urandom(3 << 20) if ext == "mp4" else b"{}"
            for i in range(6)
            for ext in ("json", "mp4")
        }
    ),
    "cut.tar": tar_bytes(sample_members(10))[:3000],
}


@pytest.fixture(scope="module")
def served(http_root: Path, http: HttpServer) -> tuple[Path, HttpServer]:
    for name, data in SHARDS.items():
        (http_root / name).write_bytes(data)
    return http_root, http


@pytest.fixture
def no_temp_files(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a remote build wrote a temporary file")

    for name in ("mkstemp", "NamedTemporaryFile", "TemporaryFile", "SpooledTemporaryFile"):
        monkeypatch.setattr(tempfile, name, refuse)


@pytest.mark.parametrize("name", ["ustar.tar", "gnu.tar", "pax.tar", "global.tar", "video.tar"])
def test_a_remote_build_equals_the_local_build(
    name: str, served: tuple[Path, HttpServer], tmp_path: Path, no_temp_files: None
) -> None:
    root, server = served
    local = build_index(root / name, index_dir=tmp_path / "local")
    remote = build_remote_index(server.url(name), index_dir=tmp_path / "remote")
    assert remote.meta.fingerprint == local.meta.fingerprint
    assert remote.meta.span_names == local.meta.span_names == (name != "global.tar")
    assert (remote.meta.num_samples, remote.meta.num_members) == (
        local.meta.num_samples,
        local.meta.num_members,
    )
    assert remote.keys() == local.keys()
    ours, theirs = remote.load_arrays(), local.load_arrays()
    assert np.array_equal(ours.samples, theirs.samples)
    assert np.array_equal(ours.members, theirs.members)
    assert [p.name for p in (tmp_path / "remote").iterdir()] == [remote.path.name]


def test_large_members_are_read_by_their_headers(
    served: tuple[Path, HttpServer], tmp_path: Path
) -> None:
    _, server = served
    size = len(SHARDS["video.tar"])
    ranged = scan_remote_shard(server.url("video.tar"), index_dir=tmp_path)
    assert ranged.mode == "ranged" and ranged.bytes_fetched < 0.02 * size
    streamed = scan_remote_shard(server.url("video.tar"), index_dir=tmp_path / "s", mode="stream")
    assert streamed.mode == "stream" and streamed.bytes_fetched >= size
    assert ranged.index.keys() == streamed.index.keys()
    small = scan_remote_shard(server.url("ustar.tar"), index_dir=tmp_path)
    assert small.mode == "stream"


def test_a_damaged_remote_shard_fails_as_the_local_scan_does(
    served: tuple[Path, HttpServer], tmp_path: Path
) -> None:
    _, server = served
    with pytest.raises(IndextarError) as local:
        scan_tar(SHARDS["cut.tar"], shard="cut.tar")
    for mode in ("stream", "ranged"):
        with pytest.raises(type(local.value)) as remote:
            scan_remote_shard(server.url("cut.tar"), index_dir=tmp_path, mode=mode)  # type: ignore[arg-type]
        assert remote.value.offset == local.value.offset  # type: ignore[attr-defined]
    assert list(tmp_path.iterdir()) == []


def test_a_rerun_over_http_checks_each_shard_by_its_job(
    served: tuple[Path, HttpServer], tmp_path: Path
) -> None:
    # An HTTP folder lists no versions: the listing vouches for nothing, each job checks.
    from indextar.index.build import iter_builds
    from indextar.index.jobs import BuildOptions

    _, server = served
    urls = [server.url(name) for name in ("ustar.tar", "pax.tar")]
    options = BuildOptions(index_dir=str(tmp_path))
    assert all(o.built for o in iter_builds(urls, options, workers=1))
    again = list(iter_builds(urls, options, workers=1))
    assert [o.shard for o in again] == urls
    assert all(o.ok and not o.built for o in again)


def test_a_stale_remote_index_with_imported_columns_is_not_rebuilt_away(
    served: tuple[Path, HttpServer], tmp_path: Path
) -> None:
    # `indextar meta import URL` writes into the index's local copy; a scan cannot give
    # the columns back, so a replaced object's index is refused, as build_index refuses.
    import pyarrow as pa
    import pyarrow.parquet as pq

    from indextar.errors import StaleIndexError
    from indextar.index.attribute_import import import_attributes
    from indextar.index.jobs import BuildOptions, build_shard
    from indextar.index.remote import open_remote_index

    root, server = served
    (root / "imported.tar").write_bytes(tar_bytes(sample_members(4, exts=("txt",))))
    url, folder = server.url("imported.tar"), tmp_path / "ix"
    index = build_remote_index(url, index_dir=folder)
    table = tmp_path / "clip.parquet"
    pq.write_table(pa.table({"key": index.keys(), "clip": [0.1, 0.2, 0.3, 0.4]}), table)
    import_attributes([url], table, index_dir=folder)
    (root / "imported.tar").write_bytes(tar_bytes(sample_members(5, exts=("txt",))))
    refused = r"imported from 'clip\.parquet'.*changed since it was indexed.*build_remote_index"
    with pytest.raises(StaleIndexError, match=refused):
        open_remote_index(url, index_dir=folder)
    outcome = build_shard(url, BuildOptions(index_dir=str(folder)))
    assert not outcome.built and outcome.error_type == "StaleIndexError"
    assert outcome.error is not None and "clip.parquet" in outcome.error
    assert index.imported_from() == ["clip.parquet"]  # the local copy is untouched
    forced = build_shard(url, BuildOptions(index_dir=str(folder), force=True))
    assert forced.built and forced.index is not None and forced.index.meta.num_samples == 5
    assert forced.index.imported_from() == []


def test_a_remote_tar_gz_is_indexed_at_the_seek_spacing_asked(
    served: tuple[Path, HttpServer], tmp_path: Path
) -> None:
    # `indextar index URL --seek-spacing N` is a BuildOptions field: the remote build takes it.
    import gzip

    from indextar.index.arrays import read_layout
    from indextar.index.jobs import BuildOptions, build_shard

    root, server = served
    rng = np.random.default_rng(0)
    words = [bytes(rng.integers(97, 123, 6, np.uint8)) for _ in range(2000)]
    plain = tar_bytes(
        {
            f"t{i:03d}.txt": b" ".join(words[j] for j in rng.integers(0, 2000, 300))
            for i in range(300)
        }
    )
    (root / "spaced.tar.gz").write_bytes(gzip.compress(plain, mtime=0))
    outcome = build_shard(
        server.url("spaced.tar.gz"), BuildOptions(index_dir=str(tmp_path), seek_spacing=65536)
    )
    assert outcome.built and outcome.index is not None
    meta = outcome.index.meta
    assert meta.compression == "gzip" and meta.seek_spacing == 65536
    points = read_layout(outcome.index.path, meta).seek_points
    assert points is not None and len(points.points) >= len(plain) // 65536 - 2


def test_a_bz2_object_is_refused_with_steps_that_work_for_a_url(
    served: tuple[Path, HttpServer], tmp_path: Path
) -> None:
    # `bzip2 -dc URL > URL` runs nowhere: a URL's hint is download, decompress, upload.
    import bz2

    import indextar

    root, server = served
    (root / "data.tar.bz2").write_bytes(bz2.compress(SHARDS["ustar.tar"]))
    url = server.url("data.tar.bz2")
    steps = (
        "download it as data.tar.bz2, run `bzip2 -dc data.tar.bz2 > data.tar`, and upload "
        f"data.tar as {url.removesuffix('.bz2')}"
    )
    with pytest.raises(indextar.CompressedShardError, match="random access needs") as built:
        build_remote_index(url, index_dir=tmp_path)
    with pytest.raises(indextar.CompressedShardError, match="streaming needs") as streamed:
        list(indextar.StreamingTarDataset(url))
    for caught in (built, streamed):
        assert steps in str(caught.value) and f"> {url}" not in str(caught.value)
    assert list(tmp_path.iterdir()) == []


def test_a_remote_shard_opened_for_reading_reads_its_index_meta_once(
    served: tuple[Path, HttpServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shard list that records no index: open_entry takes the index find_index found
    in index_dir and checked, its meta with it (the meta was read again, through a
    second connection)."""
    import indextar.index.meta as meta_module
    import indextar.index.opener as opener

    _, server = served
    url = server.url("ustar.tar")
    build_remote_index(url, index_dir=tmp_path)
    listed = tmp_path / "wids.json"
    listed.write_text(json.dumps({"wids_version": 1, "shardlist": [{"url": url, "nsamples": 30}]}))
    ds = IndexedTarDataset(listed, index_dir=tmp_path)
    reads: list[str] = []
    real = meta_module.meta_from

    def counting(conn: Any, path: Path) -> Any:
        reads.append(str(path))
        return real(conn, path)

    monkeypatch.setattr(meta_module, "meta_from", counting)
    monkeypatch.setattr(opener, "meta_from", counting)
    assert ds[3]["cls"] == sample_members(30)["s000003.cls"]
    assert reads == [str(remote_index_path(url, tmp_path))]
