"""Bad shards: a clear indextar error naming the shard and the byte offset, and no index.

Every case goes through :func:`indextar.build_index` on a file, so each test also
checks that nothing (no index, no temporary file) is left next to a shard that failed.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import random
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from conftest import FORMATS, sample_members, tar_bytes
from tarcraft import BLOCK, Crafter, base256, header, octal

from indextar import (
    CompressedShardError,
    IndextarError,
    SampleFormatError,
    ShardFormatError,
    TruncatedShardError,
    UnsupportedMemberError,
    build_index,
    scan_tar,
)
from indextar.tar.stream import iter_members

# Every test here runs with the C walker and with the numpy scanner (conftest).
pytestmark = pytest.mark.usefixtures("scanner")

# -- helpers ---------------------------------------------------------------------------


def refuse(
    path: Path, exc: type[IndextarError], offset: int, match: str | None = None
) -> IndextarError:
    """Index ``path``; expect ``exc`` at ``offset`` and nothing written next to it."""
    before = sorted(p.name for p in path.parent.iterdir())
    with pytest.raises(exc, match=match) as caught:
        build_index(path)
    error = caught.value
    message = str(error)
    assert repr(str(path)) in message, f"the message does not name the shard: {message}"
    assert f"at byte offset {offset}" in message, f"expected offset {offset}: {message}"
    assert getattr(error, "offset", None) == offset
    assert sorted(p.name for p in path.parent.iterdir()) == before, "something was left behind"
    return error


def write(tmp_path: Path, data: bytes, name: str = "bad.tar") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def member_offsets(buf: bytes) -> list[tuple[int, int, int]]:
    """``(header offset, data offset, size)`` of each member, by tarfile; header
    offsets of extension headers included as separate rows with size ``-1``."""
    rows = []
    with tarfile.open(fileobj=io.BytesIO(buf)) as tf:
        for m in tf.getmembers():
            for ext_offset in range(m.offset, m.offset_data - BLOCK, BLOCK):
                rows.append((ext_offset, -1, -1))  # extension header blocks (and their data)
            rows.append((m.offset_data - BLOCK, m.offset_data, m.size))
    return rows


def header_offsets(buf: bytes) -> list[int]:
    """Offsets of every real header block (extension headers too), by walking sizes."""
    out, pos = [], 0
    while buf[pos : pos + BLOCK].strip(b"\0"):
        out.append(pos)
        size = tarfile.nti(buf[pos + 124 : pos + 136])
        if buf[pos + 156 : pos + 157] in b"123456" and buf[pos + 156] != 0:
            size = 0
        pos += BLOCK + -(-size // BLOCK) * BLOCK
    return out


SHAPES = {
    # Names long enough for GNU L / PAX x headers, and a ustar prefix split.
    "small": {
        **sample_members(3, ("jpg", "json")),
        "deep/" + "d" * 120 + "/s.jpg": b"d" * 700,
        "s-last.cls": b"last",
    },
    # Thousands of tiny members: the vectorised walk.
    "dense": sample_members(1500, ("jpg", "cls")),
}


def shard_bytes(fmt: str, shape: str) -> bytes:
    return tar_bytes(SHAPES[shape], fmt)


# -- truncation ------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_truncated_at_every_kind_of_cut(fmt: str, tmp_path: Path) -> None:
    buf = shard_bytes(fmt, "small")
    headers = header_offsets(buf)
    end = scan_tar(buf).end_offset
    cuts = set(range(1, end + 1, 97)) | {end}
    for h in headers:
        cuts |= {h, h + 1, h + 100, h + BLOCK - 1, h + BLOCK, h + BLOCK + 1}
    cuts = {c for c in cuts if 0 < c <= end}
    assert len(cuts) > 60
    for cut in sorted(cuts):
        path = write(tmp_path, buf[:cut])
        in_header = [h for h in headers if h <= cut < h + BLOCK]
        if cut < BLOCK:
            expected = 0
        elif in_header and cut > in_header[0]:
            expected = in_header[0]  # mid-header: the header that is cut
        elif cut == end or cut in headers:
            expected = cut  # at a member boundary: where the end marker should be
        else:
            # mid-data: the header of the member (or extension header) that is cut
            expected = max(h for h in headers if h < cut)
        refuse(path, TruncatedShardError, expected)


def test_truncated_dense_shard_mid_data_and_mid_header(tmp_path: Path) -> None:
    buf = shard_bytes("gnu", "dense")
    headers = header_offsets(buf)
    for h in headers[100:3000:311]:
        refuse(write(tmp_path, buf[: h + 40]), TruncatedShardError, h)  # mid-header
        refuse(write(tmp_path, buf[: h + BLOCK + 1]), TruncatedShardError, h)  # mid-data


def test_truncation_message_says_what_is_missing(tmp_path: Path) -> None:
    buf = tar_bytes({"a.bin": b"a" * 5000})
    error = refuse(write(tmp_path, buf[:3000]), TruncatedShardError, 0)
    assert "5632" in str(error) and "3000" in str(error)  # needs up to 512 + 5120, has 3000


# -- corrupt checksums -----------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_corrupt_checksum_anywhere(fmt: str, shape: str, tmp_path: Path) -> None:
    buf = shard_bytes(fmt, shape)
    headers = header_offsets(buf)
    picks = {0, 1, len(headers) // 2, len(headers) - 1}
    for i in sorted(picks):
        h = headers[i]
        for field, where in (
            ("name", 5),
            ("size", 130),
            ("mtime", 140),
            ("type", 156),
            ("checksum", 150),
        ):
            bad = bytearray(buf)
            bad[h + where] = ord("7") if bad[h + where] != ord("7") else ord("6")
            error = refuse(write(tmp_path, bytes(bad)), ShardFormatError, h)
            assert "checksum" in str(error), (field, str(error))


def test_first_header_not_matching_says_not_a_tar(tmp_path: Path) -> None:
    buf = bytearray(tar_bytes(sample_members(3)))
    buf[3] ^= 0x01
    refuse(write(tmp_path, bytes(buf)), ShardFormatError, 0, "not a tar archive")


# -- not a tar at all ------------------------------------------------------------------


def test_random_bytes(tmp_path: Path) -> None:
    data = random.Random(1).randbytes(64 * 1024)
    refuse(write(tmp_path, data), ShardFormatError, 0, "not a tar")


def test_png_image(tmp_path: Path) -> None:
    from PIL import Image

    out = io.BytesIO()
    noise = random.Random(3).randbytes(64 * 64 * 3)
    Image.frombytes("RGB", (64, 64), noise).save(out, format="PNG")
    refuse(write(tmp_path, out.getvalue(), "image.tar"), ShardFormatError, 0, "not a tar")


def test_short_text_file(tmp_path: Path) -> None:
    refuse(write(tmp_path, b"hello, world\n"), ShardFormatError, 0, "less than one 512-byte")


def test_zero_byte_file(tmp_path: Path) -> None:
    refuse(write(tmp_path, b""), ShardFormatError, 0, "empty")


# -- compressed shards -----------------------------------------------------------------


def zstd_bytes(data: bytes) -> bytes:
    if shutil.which("zstd"):
        return subprocess.run(
            ["zstd", "-q", "-c"], input=data, capture_output=True, check=True
        ).stdout
    return b"\x28\xb5\x2f\xfd" + random.Random(2).randbytes(600)  # the magic, then garbage


COMPRESSORS = {
    "bzip2": (bz2.compress, ".bz2"),
    "xz": (lzma.compress, ".xz"),
}
# gzip and zstd shards are indexed in place (a zstd shard of one frame is refused with a
# command that converts it): tests/index/test_compressed.py. The scanner alone, given
# their bytes, still refuses them as these.
SCANNER_ONLY = {"gzip": gzip.compress, "zstd": zstd_bytes}


@pytest.mark.parametrize("suffix", ["", "compressed-suffix"])
@pytest.mark.parametrize("kind", COMPRESSORS)
def test_compressed_shard_says_how_to_convert(kind: str, suffix: str, tmp_path: Path) -> None:
    compress, ext = COMPRESSORS[kind]
    plain = tar_bytes(sample_members(20))
    name = "my shard.tar" + (ext if suffix else "")  # a space: the hint must quote it
    path = write(tmp_path, compress(plain), name)
    error = refuse(path, CompressedShardError, 0, f"{kind}-compressed")
    message = str(error)
    assert "random access needs a plain, gzip- or zstd-compressed tar" in message
    # The hint is a shell command; run it and check that it yields the plain tar.
    command = message.split("for example: ", 1)[1].rstrip(")")
    tool = command.split()[0]
    assert shutil.which(tool), f"the hint names {tool!r}, which is not installed"
    subprocess.run(["bash", "-c", command], check=True, cwd=tmp_path, capture_output=True)
    outputs = [p for p in tmp_path.iterdir() if p.read_bytes() == plain]
    assert len(outputs) == 1, command
    assert len(build_index(outputs[0])) == 20


@pytest.mark.parametrize("kind", SCANNER_ONLY)
def test_the_scanner_refuses_gzip_and_zstd_bytes(kind: str) -> None:
    data = SCANNER_ONLY[kind](tar_bytes(sample_members(3)))
    with pytest.raises(CompressedShardError, match=f"{kind}-compressed"):
        scan_tar(data, shard="x.tar")


def test_lz4_is_recognised(tmp_path: Path) -> None:
    refuse(write(tmp_path, b"\x04\x22\x4d\x18" + bytes(600)), CompressedShardError, 0, "lz4")


# -- samples and members indextar cannot index -----------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_duplicate_extension(fmt: str, tmp_path: Path) -> None:
    members = {"a.jpg": b"1", "a.cls": b"2", "b.jpg": b"3", "b.JPG": b"4", "c.jpg": b"5"}
    buf = tar_bytes(members, fmt)
    with tarfile.open(fileobj=io.BytesIO(buf)) as tf:
        second = tf.getmembers()[3].offset
    error = refuse(write(tmp_path, buf), SampleFormatError, second, "'b'")
    assert "'jpg' twice" in str(error) and "b.JPG" in str(error)


def test_duplicate_name_is_a_duplicate_extension(tmp_path: Path) -> None:
    crafter = Crafter().member("x.seg.png", b"1").member("x.seg.png", b"2")
    refuse(write(tmp_path, crafter.finish()), SampleFormatError, 2 * BLOCK)


def test_gnu_sparse_member(tmp_path: Path) -> None:
    crafter = Crafter().member("ok.bin", b"ok").member("holes.bin", b"x" * 10, typeflag=b"S")
    error = refuse(write(tmp_path, crafter.finish()), UnsupportedMemberError, 2 * BLOCK, "sparse")
    assert "holes.bin" in str(error)


def test_multivolume_member(tmp_path: Path) -> None:
    crafter = Crafter().member("cont.bin", b"x" * 10, typeflag=b"M")
    refuse(write(tmp_path, crafter.finish()), UnsupportedMemberError, 0, "multi-volume")


@pytest.mark.parametrize(
    "records",
    [
        {
            "GNU.sparse.major": "1",
            "GNU.sparse.minor": "0",
            "GNU.sparse.name": "s.bin",
            "GNU.sparse.realsize": "9",
        },
        {
            "GNU.sparse.size": "9",
            "GNU.sparse.numblocks": "1",
            "GNU.sparse.offset": "0",
            "GNU.sparse.numbytes": "3",
        },
        {"GNU.sparse.map": "0,3", "GNU.sparse.size": "9"},
    ],
    ids=["1.0", "0.0", "0.1"],
)
def test_pax_sparse_member(records: dict[str, str], tmp_path: Path) -> None:
    crafter = Crafter().member("ok.bin", b"ok").pax(records).member("GNUSparseFile.0/s.bin", b"abc")
    error = refuse(write(tmp_path, crafter.finish()), UnsupportedMemberError, 2 * BLOCK, "sparse")
    # The name as text: the file's own name where a record gives it, else the header's.
    shown = "s.bin" if "GNU.sparse.name" in records else "GNUSparseFile.0/s.bin"
    assert f"member {shown!r} is a PAX sparse file" in str(error)


# -- malformed numeric fields ----------------------------------------------------------

BAD_NUMBERS = {
    "size with an 8": ("size", b"00000000018\0"),
    "size with a letter": ("size", b"0000000001x\0"),
    "size with inner space": ("size", b"00000 00001\0"),
    "size with a sign": ("size", b"+0000000001\0"),
    "mode with a letter": ("mode", b"00006a4\0"),
    "uid bad lead byte": ("uid", b"\x81\0\0\0\0\0\0\1"),
    "mtime garbage": ("mtime", b"yesterday!!\0"),
    "gid hex": ("gid", b"0x10\0\0\0\0"),
}
FIELD_OFFSETS = {"mode": 100, "uid": 108, "gid": 116, "size": 124, "mtime": 136}


@pytest.mark.parametrize("case", BAD_NUMBERS)
@pytest.mark.parametrize("position", ["first", "later"])
def test_invalid_numeric_field(case: str, position: str, tmp_path: Path) -> None:
    field, raw = BAD_NUMBERS[case]
    crafter = Crafter()
    if position == "later":
        for i in range(100):
            crafter.member(f"s{i:03d}.txt", b"fine")
    at = crafter.length
    if field == "size":
        crafter.member("bad.txt", b"", size_field=raw)
    else:
        crafter.member("bad.txt", b"", fields={field: raw})
    crafter.member("after.txt", b"after")
    error = refuse(write(tmp_path, crafter.finish()), ShardFormatError, at + FIELD_OFFSETS[field])
    assert f"the {field} field" in str(error)


def test_bad_octal_checksum_field(tmp_path: Path) -> None:
    block = bytearray(header("a.txt"))
    block[148:156] = b"01234x\0 "
    refuse(write(tmp_path, bytes(block) + bytes(1024)), ShardFormatError, 0, "checksum")


def test_valid_odd_octal_layouts_are_accepted(tmp_path: Path) -> None:
    # What strict readers accept: leading spaces, space or NUL padding, empty fields.
    crafter = Crafter()
    for i, raw in enumerate([b"     12\0\0\0\0\0", b"12          ", b"000000000012", b"\0" * 12]):
        size = 0 if raw == b"\0" * 12 else 10
        crafter.member(f"f{i}.bin", b"z" * size, size_field=raw)
    crafter.member("m.bin", b"", fields={"mode": b"    644 ", "mtime": b" " * 12})
    path = write(tmp_path, crafter.finish(), "odd.tar")
    assert build_index(path).meta.num_members == 5


# -- after the end ---------------------------------------------------------------------


def test_data_after_the_end_marker(tmp_path: Path) -> None:
    buf = tar_bytes(sample_members(5))
    end = scan_tar(buf).end_offset
    for junk_at in (end + 2 * BLOCK, end + 2 * BLOCK + 700, len(buf) - 1):
        bad = bytearray(buf)
        bad[junk_at] = 0x55
        refuse(write(tmp_path, bytes(bad)), ShardFormatError, junk_at, "after the end-of-archive")


def test_concatenated_archives(tmp_path: Path) -> None:
    first = tar_bytes(sample_members(2))
    end = scan_tar(first).end_offset
    second = tar_bytes(sample_members(2, prefix="t"))
    # tar -A would drop the first end marker; a plain cat keeps it: not one archive.
    refuse(write(tmp_path, first + second), ShardFormatError, len(first), "concatenated")
    assert end < len(first)


def test_extension_header_without_a_member(tmp_path: Path) -> None:
    crafter = Crafter().member("a.txt", b"a").extension(b"L", b"dangling.txt\0")
    crafter.extension_start = None
    refuse(
        write(tmp_path, crafter.finish()), ShardFormatError, 2 * BLOCK, "not followed by a member"
    )


def test_malformed_pax_record(tmp_path: Path) -> None:
    crafter = Crafter().member("a.txt", b"a").extension(b"x", b"99 path=x\n", name="PaxHeader/x")
    crafter.member("x", b"x")
    refuse(write(tmp_path, crafter.finish()), ShardFormatError, 2 * BLOCK, "PAX record")


@pytest.mark.parametrize("typeflag", [b"x", b"g"])
def test_pax_size_of_thousands_of_digits(typeflag: bytes, tmp_path: Path) -> None:
    # int() refuses more than 4300 digits with a bare ValueError, without shard or offset.
    crafter = Crafter().member("a.txt", b"a").pax({"size": "9" * 5000}, typeflag=typeflag)
    data = crafter.member("b.txt", b"b").finish()
    error = refuse(write(tmp_path, data), ShardFormatError, 2 * BLOCK, "more than any shard")
    with pytest.raises(ShardFormatError, match="more than any shard") as streamed:
        list(iter_members(io.BytesIO(data), shard="bad.tar"))
    assert str(streamed.value).split(": ", 1)[1] == str(error).split(": ", 1)[1]
    # Leading zeros are not digits of the size: GNU tar and tarfile read 1 here.
    padded = Crafter().member("a.txt", b"a").pax({"size": "0" * 5000 + "1"}, typeflag=typeflag)
    padded.member("b.txt", b"b", stored_size=0)
    sizes = scan_tar(padded.finish()).sizes.tolist()
    assert sizes == [1, 1]


def test_a_failed_rebuild_leaves_no_temporary_file(tmp_path: Path) -> None:
    # A shard that indexed fine, then broke: force=True fails and writes nothing new.
    path = write(tmp_path, tar_bytes(sample_members(5)), "was-good.tar")
    build_index(path)
    before = sorted(p.name for p in tmp_path.iterdir())
    path.write_bytes(b"BZh" + bytes(2000))
    with pytest.raises(CompressedShardError):
        build_index(path, force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_base256_negative_size_is_refused(tmp_path: Path) -> None:
    crafter = Crafter().member("a.txt", b"", size_field=base256(-512))
    refuse(write(tmp_path, crafter.finish()), ShardFormatError, 124, "negative size")


def test_octal_helper_matches_tarfile() -> None:
    assert tarfile.nti(octal(0o1234, 12)) == 0o1234
    assert tarfile.nti(base256(2**40)) == 2**40
    assert tarfile.nti(base256(-5)) == -5


@pytest.mark.parametrize("fmt", FORMATS)
def test_single_byte_flips_anywhere(fmt: str) -> None:
    # A flip in a header block must be refused; a flip in member data changes nothing;
    # a flip in extension data (PAX records, GNU long names) may do either, but only
    # ever raises a ShardFormatError. Nothing else may escape the scanner.
    buf = shard_bytes(fmt, "small")
    good = scan_tar(buf)
    expected = (good.names, good.header_offsets.tolist(), good.sizes.tolist())
    headers = set(header_offsets(buf))
    member_data = [
        (int(start), int(start + size)) for start, size in zip(good.data_offsets, good.sizes)
    ]
    rng = random.Random(11)
    outcomes = {"refused": 0, "same": 0}
    for _ in range(400):
        at = rng.randrange(len(buf))
        bad = bytearray(buf)
        bad[at] = (bad[at] + rng.randrange(1, 256)) % 256
        block = at - at % BLOCK
        try:
            scan = scan_tar(bytes(bad), shard="flip.tar")
        except ShardFormatError as e:
            assert e.offset is not None and f"at byte offset {e.offset}" in str(e)
            outcome = "refused"
        else:
            outcome = (
                "same"
                if (scan.names, scan.header_offsets.tolist(), scan.sizes.tolist()) == expected
                else "changed"
            )
        if (block in headers and not 148 <= at - block < 156) or at >= good.end_offset:
            assert outcome == "refused", at  # a header, or the end marker and padding
        elif any(start <= at < end for start, end in member_data):
            assert outcome == "same", at
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert outcomes["refused"] > 50 and outcomes["same"] > 50
