"""The streamed scan (tar/streamscan.py) gives exactly scan_tar's members and errors.

Compared on the fuzz corpus (tools/fuzz.py's generator and mutators), its forged
inputs, and shards GNU tar wrote; streamed front to back from a file object, and read
by ranged reads of the headers alone (source/forward.py) over the same bytes.
"""

from __future__ import annotations

import io
import os
import tracemalloc
from pathlib import Path
from typing import Any

import fuzz
import pytest
from tarcraft import GNU_TAR, gnu_tar, write_tree

from indextar import IndextarError, scan_tar
from indextar.source.base import ByteSource
from indextar.source.forward import ForwardReader
from indextar.tar.streamscan import FileReader, StreamedBytes, scan_stream

EDGES = 64 << 10


class MemorySource(ByteSource):
    """Bytes in memory as a source, counting what is read."""

    def __init__(self, data: bytes):
        self.data = data
        self.read_bytes = 0

    @property
    def size(self) -> int:
        return len(self.data)

    def read(self, offset: int, length: int) -> bytes:
        self.read_bytes += length
        return self.data[offset : offset + length]


def outcome(scan: Any) -> tuple[Any, ...]:
    """A scan's every field, or an error's class, offset and message."""
    try:
        s = scan()
    except IndextarError as e:
        return ("error", type(e).__name__, getattr(e, "offset", None), str(e))
    return (
        s.names,
        s.types.tolist(),
        s.header_offsets.tolist(),
        s.data_offsets.tolist(),
        s.sizes.tolist(),
        s.end_offset,
        s.file_size,
        s.extension_headers,
    )


def streamed(data: bytes, *, ignore_zeros: bool = False, mode: str = "file") -> Any:
    if mode == "file":
        reader: Any = FileReader(io.BufferedReader(io.BytesIO(data)))  # type: ignore[arg-type]
    else:
        reader = ForwardReader(MemorySource(data), mode=mode, min_read=512)  # type: ignore[arg-type]
    view = StreamedBytes(reader, len(data), shard="s.tar", edges=EDGES)
    scan = scan_stream(view, ignore_zeros=ignore_zeros)
    view.finish()
    assert view.head() == data[:EDGES] and view.tail() == data[-EDGES:]
    return scan


def assert_same(data: bytes, **options: Any) -> tuple[Any, ...]:
    ignore_zeros = options.get("ignore_zeros", False)
    expected = outcome(lambda: scan_tar(data, shard="s.tar", ignore_zeros=ignore_zeros))
    for mode in ("file", "stream", "ranged"):
        got = outcome(lambda: streamed(data, mode=mode, **options))  # noqa: B023 - called now
        assert got == expected, mode
    return expected


@pytest.mark.parametrize("seed", [0, 1])
def test_the_fuzz_corpus_scans_alike_streamed_and_in_memory(seed: int) -> None:
    refused = 0
    for number in range(150):
        data = fuzz.make_case(seed, number).data
        for ignore_zeros in (False, True):
            refused += assert_same(data, ignore_zeros=ignore_zeros)[0] == "error"
    assert 50 < refused < 280  # both sides: refusals and scans


@pytest.mark.parametrize("name", sorted(fuzz.forged_inputs()))
def test_forged_inputs_scan_alike(name: str) -> None:
    assert_same(fuzz.forged_inputs()[name])  # most are refused; some only when grouped


@pytest.mark.skipif(not os.path.exists(GNU_TAR), reason="GNU tar is not installed")
@pytest.mark.parametrize("options", [("--format=gnu",), ("--format=posix",), ("--format=ustar",)])
def test_gnu_tar_shards_scan_alike(options: tuple[str, ...], tmp_path: Path) -> None:
    long = "deep/" * 30 if options != ("--format=ustar",) else "deep/" * 10
    files: dict[str, bytes | str | None] = {
        "a/0001.jpg": os.urandom(70_000),
        "a/0001.cls": b"1",
        f"{long}0002.json": b"{}",
        "a/0003.txt": "caf\u00e9 ".encode() * 300,
        "a/link.txt": "->0003.txt",
        "a/folder": None,
    }
    root = tmp_path / "root"
    write_tree(root, files)
    archive = gnu_tar(tmp_path / "g.tar", root, sorted(files), *options)
    data = archive.read_bytes()
    scanned = assert_same(data)
    assert scanned[0][:2] == ["a/0001.cls", "a/0001.jpg"]
    # Concatenated archives (cat a.tar b.tar), read on past the zeros.
    both = assert_same(data + data, ignore_zeros=True)
    assert both[0] == scanned[0] * 2
    # Cut inside a member, and inside the end marker.
    assert assert_same(data[: len(data) // 2])[1] == "TruncatedShardError"
    assert assert_same(data[: -10240 + 100])[0] == "error"


@pytest.mark.parametrize("cut", [0, 1, 700, 512 * 150 + 3])
def test_a_shard_cut_anywhere_past_the_fingerprint_span_fails_alike(cut: int) -> None:
    from conftest import tar_bytes

    data = tar_bytes({f"{i:03d}.bin": bytes([i]) * 3000 for i in range(60)})
    assert len(data) > 2 * EDGES
    expected = assert_same(data[: len(data) - cut])
    assert (expected[0] == "error") == (cut > 10240 - 2 * 512 - 512)


def test_a_stream_passes_member_data_without_holding_it(tmp_path: Path) -> None:
    members = {f"{i:04d}.bin": os.urandom(1 << 20) for i in range(48)}
    path = tmp_path / "big.tar"
    from conftest import tar_bytes

    path.write_bytes(tar_bytes(members))
    tracemalloc.start()
    try:
        with open(path, "rb", buffering=0) as f:
            view = StreamedBytes(FileReader(f), path.stat().st_size, shard="big.tar")  # type: ignore[arg-type]
            scan = scan_stream(view)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert scan.names == sorted(members)
    assert peak < 4 << 20, peak  # the 1 MiB skip buffer and the headers, not 48 MiB


def test_ranged_reads_fetch_the_headers_alone() -> None:
    from conftest import tar_bytes

    data = tar_bytes({f"{i:04d}.mp4": bytes(256 << 10) for i in range(256)})
    source = MemorySource(data)
    reader = ForwardReader(source, mode="auto")
    view = StreamedBytes(reader, len(data), shard="s.tar", edges=EDGES)
    assert outcome(lambda: scan_stream(view)) == outcome(lambda: scan_tar(data))
    view.finish()
    assert reader.mode == "stream"  # 256 KiB members: below the ranged threshold
    # Forced ranged: the headers (1 KiB reads) and the fingerprint's edges, 0.6% of 64 MiB.
    source = MemorySource(data)
    reader = ForwardReader(source, mode="ranged")
    view = StreamedBytes(reader, len(data), shard="s.tar", edges=EDGES)
    scan_stream(view)
    view.finish()
    assert source.read_bytes == reader.bytes_fetched < 0.01 * len(data)
    # Members of 2 MiB: auto chooses ranged reads.
    sizes = {"json": 10, "mp4": 2 << 20}
    data = tar_bytes({f"{i:04d}.{ext}": bytes(n) for i in range(8) for ext, n in sizes.items()})
    reader = ForwardReader(MemorySource(data), mode="auto")
    view = StreamedBytes(reader, len(data), shard="s.tar", edges=EDGES)
    assert outcome(lambda: scan_stream(view)) == outcome(lambda: scan_tar(data))
    assert reader.mode == "ranged" and reader.bytes_fetched < 0.02 * len(data)
