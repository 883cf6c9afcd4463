"""zstd streams read front to back (source/codecs.decompressed_stream): zstd's own
reader stops silently where its input stops, even inside a frame, so the frames are
followed alongside (tar/compress.ZstdFrameWalk) and a stream cut inside one is an error
naming the shard and the frame, wherever the cut falls."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest
import zstandard

from indextar.errors import TruncatedShardError
from indextar.source.codecs import decompressed_stream
from indextar.tar.compress import ZstdFrameWalk, zstd_frame_spans

SKIPPABLE = b"\x50\x2a\x4d\x18" + (6).to_bytes(4, "little") + b"seektb"


def zstd_file() -> tuple[bytes, bytes]:
    """Five frames of every header shape (checksum or not, content size or not, an empty
    frame, RLE blocks, a skippable frame), and what they decompress to."""
    rng = np.random.default_rng(7)
    parts = [rng.integers(0, 256, 300_000, np.uint8).tobytes(), b"x" * 500_000, b"", b"ab" * 9]
    sized = zstandard.ZstdCompressor(write_content_size=True, write_checksum=True)
    unsized = zstandard.ZstdCompressor(write_content_size=False, write_checksum=False)
    frames = [sized.compress(parts[0]), SKIPPABLE, unsized.compress(parts[1])]
    frames += [sized.compress(parts[2]), unsized.compress(parts[3])]
    return b"".join(frames), b"".join(parts)


def test_the_walk_ends_between_frames_exactly_where_frames_end() -> None:
    data, _ = zstd_file()
    ends = {offset + size for offset, size, _ in zstd_frame_spans(data)} | {0}
    rng = np.random.default_rng(3)
    cuts = set(rng.integers(0, len(data) + 1, 300).tolist()) | ends | {e - 1 for e in ends}
    for cut in sorted(c for c in cuts if c >= 0):
        walk, at = ZstdFrameWalk(), 0
        while at < cut:  # fed in pieces of every size, a field split anywhere
            step = int(rng.choice([1, 2, 3, 5, 511, 131_075]))
            walk.feed(data[at : min(cut, at + step)])
            at += step
        assert walk.between_frames == (cut in ends), cut
        assert walk.offset == cut


def test_a_stream_cut_inside_a_frame_is_an_error_naming_the_frame() -> None:
    data, plain = zstd_file()
    spans = zstd_frame_spans(data)
    for offset, size, _ in spans:
        for cut in (offset + 1, offset + size // 2, offset + size - 1):
            raw = io.BufferedReader(io.BytesIO(data[:cut]))
            with pytest.raises(TruncatedShardError, match="cut short") as caught:
                decompressed_stream(raw, "zstd", shard="s.tar.zst").read()
            assert caught.value.shard == "s.tar.zst" and caught.value.offset == offset
        whole = decompressed_stream(
            io.BufferedReader(io.BytesIO(data[: offset + size])), "zstd", shard="s.tar.zst"
        ).read()  # cut where a frame ends: no error here, what tar's end marker catches
        assert plain.startswith(whole)
    assert (
        decompressed_stream(io.BufferedReader(io.BytesIO(data)), "zstd", shard="s").read() == plain
    )


def test_random_bytes_are_left_to_the_decompressor() -> None:
    walk = ZstdFrameWalk()
    walk.feed(os.urandom(4096))
    assert walk.between_frames  # not a zstd frame: the walk stops, zstd says what is wrong
