"""indextar.recompress loses nothing (issue 15, item 4): every entry is copied with its
header blocks, so GNU tar lists the same names, modes, owners, times, links and
directories before and after, the uncompressed bytes are the source's, and the index the
writer records is the one an index build of the new shard makes."""

from __future__ import annotations

import io
import os
import subprocess
from pathlib import Path

import pytest
import zstandard
from conftest import tar_bytes
from tarcraft import GNU_TAR, gnu_tar, write_tree

import indextar
from indextar.index.arrays import read_layout
from indextar.write.recompress import recompress

ENV = {**os.environ, "LC_ALL": "C.UTF-8", "TZ": "UTC"}
LONG = "x" * 120  # a GNU long name, or a PAX path record


def source_tree(root: Path) -> Path:
    write_tree(
        root,
        {
            "README": b"no sample: no extension\n",
            "empty/": None,
            "link": "->sub/s1.jpg",
            **{f"sub/s{i}.jpg": b"jpeg %d" % i * 40 for i in range(1, 6)},
            **{f"sub/s{i}.cls": b"%d" % i for i in range(1, 6)},
            f"sub/{LONG}.txt": b"a long name",
            "sub/hard.txt": "=>README",
        },
    )
    (root / "sub" / "s2.jpg").chmod(0o600)
    (root / "sub" / "s3.cls").chmod(0o755)
    return root


def listing(path: Path, *options: str) -> list[str]:
    """``tar -tv``: mode, owner/group, size, mtime and name (and link) of every entry."""
    return subprocess.run(
        [GNU_TAR, *options, "--full-time", "-tvf", str(path)],
        env=ENV, capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip


def plain_bytes(path: Path) -> bytes:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        return subprocess.run(["gzip", "-dc", str(path)], capture_output=True, check=True).stdout
    if data[:4] == b"\x28\xb5\x2f\xfd":
        return zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)).read()
    return data


def samples(path: Path) -> list[tuple[str, dict[str, bytes]]]:
    ds = indextar.IndexedTarDataset(str(path))  # raw bytes
    return [
        (s["__key__"], {k: v for k, v in s.items() if not k.startswith("__")})
        for s in (ds[i] for i in range(len(ds)))
    ]


@pytest.mark.parametrize("fmt", ["gnu", "posix"])
@pytest.mark.parametrize("codec", [None, "gzip", "zstd"])
def test_gnu_tar_lists_the_same_entries_before_and_after(
    fmt: str, codec: str | None, tmp_path: Path
) -> None:
    root = source_tree(tmp_path / "tree")
    source = gnu_tar(
        tmp_path / "src.tar", root, ["."],
        f"--format={fmt}", "--sort=name", "--owner=alice:1234", "--group=staff:99",
        "--mtime=2020-09-13 12:26:40.5",
    )  # fmt: skip
    target = tmp_path / {None: "out.tar", "gzip": "out.tar.gz", "zstd": "out.tar.zst"}[codec]
    index = recompress(source, target, compress=codec)
    before = listing(source)
    assert any(line.startswith("d") for line in before) and any("->" in line for line in before)
    assert any(" link to " in line for line in before) and any(LONG in line for line in before)
    assert any("alice/staff" in line and "-rw-------" in line for line in before)
    assert listing(target) == before
    assert listing(target, "--numeric-owner") == listing(source, "--numeric-owner")
    # The uncompressed target is the source's bytes up to its end marker, then one.
    plain, original = plain_bytes(target), source.read_bytes()
    end = len(plain) - 1024
    assert plain[:end] == original[:end] and plain[end:] == bytes(1024)
    assert not original[end:].strip(b"\0")  # the source's end marker and record padding
    # The writer's index is what an index build of the target makes.
    assert index is not None
    rebuilt = indextar.build_index(target, index_dir=tmp_path / "rebuilt")
    assert (
        index.keys() == rebuilt.keys() == [*(f"./sub/s{i}" for i in range(1, 6)), f"./sub/{LONG}"]
    )
    assert (
        index.skipped_counts()
        == rebuilt.skipped_counts()
        == indextar.build_index(source).skipped_counts()
    )
    assert index.extension_counts() == rebuilt.extension_counts()
    assert index.meta.span_names == rebuilt.meta.span_names
    assert samples(target) == samples(source)
    if codec is not None:  # ./ README empty/ link sub/ sub/hard.txt, six samples, the end
        frames = read_layout(index.path, index.meta).frames
        assert frames is not None and len(frames) == 1 + 6 + 1


def test_tarfile_pax_headers_are_kept_and_spans_still_name_their_keys(tmp_path: Path) -> None:
    members = {
        f"k{i:03d}.{ext}": b"%s %d" % (ext.encode(), i) for i in range(30) for ext in ("txt", "cls")
    }
    members["__meta__.json"] = b"{}"
    source = tmp_path / "pax.tar"
    source.write_bytes(tar_bytes(members, "pax"))
    index = recompress(source, tmp_path / "pax.tar.zst", compress="zstd")
    assert index is not None and index.meta.span_names
    assert listing(tmp_path / "pax.tar.zst") == listing(source)
    assert samples(tmp_path / "pax.tar.zst") == samples(source)
    assert index.skipped_counts() == indextar.build_index(source).skipped_counts()


def test_many_entries_in_no_sample_are_framed_about_a_mebibyte_at_a_time(tmp_path: Path) -> None:
    files = {f"doc/{i:03d}": bytes([i]) * 300_000 for i in range(8)}  # no extension: no sample
    files.update({"a.txt": b"a", "b.txt": b"b"})
    root = tmp_path / "tree"
    write_tree(root, files)
    source = gnu_tar(tmp_path / "docs.tar", root, sorted(files), "--format=gnu")
    index = recompress(source, tmp_path / "docs.tar.gz", compress="gzip")
    assert index is not None and index.skipped_counts() == {"no-extension": 8}
    frames = read_layout(index.path, index.meta).frames
    assert frames is not None
    assert len(frames) == 2 + 2 + 1  # a, b, two runs of four docs, the end marker
    assert [int(size) // 300_000 for size in frames[2:4, 3]] == [4, 4]
    assert listing(tmp_path / "docs.tar.gz") == listing(source)
