"""Fuzzing in CI: a seeded slice of ``tools/fuzz.py`` and hypothesis round trips.

The long runs are ``python tools/fuzz.py --seconds N``; docs/reliability.md has
their figures. Here a few hundred cases of the same generator and mutators run
through every target, plus the inputs that once broke a reader.
"""

from __future__ import annotations

import io
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import FORMATS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tarcraft import base256, blocks, header, pax_records

from indextar import IndexedTarDataset, ShardFormatError, TruncatedShardError, build_index, scan_tar
from indextar.tarstream import iter_members

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import fuzz  # noqa: E402

# -- the seeded slice ------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1])
def test_fuzz_slice(seed: int) -> None:
    result = fuzz.fuzz(seed=seed, cases=120, jobs=1, timeout=10.0)
    assert not result.failures, "\n".join(result.failures[:5])
    counts = result.counts
    # The slice reaches both sides of every target, not only refusals.
    assert counts["scan"]["indexed, equals tarfile"] > 10, counts
    assert counts["index"]["indexed, verified, read back"] > 10, counts
    assert counts["stream"]["streamed, equals scan"] > 10, counts
    assert sum(n for k, n in counts["scan"].items() if k.startswith("refused")) > 50, counts


# -- inputs that once escaped as another exception, or allocated a forged size -------------


def pax_then(records: dict[str, str], member: bytes, typeflag: bytes = b"x") -> bytes:
    payload = pax_records(records)
    return header("././@PaxHeader", len(payload), typeflag=typeflag) + blocks(payload) + member


FORGED = {
    # GNU base-256 sizes past int64 were an OverflowError in the scanner.
    "base-256 size of 8 EiB": header("a.txt", size_field=base256(1 << 63)) + bytes(1024),
    "base-256 size of 2**88 - 1": header("a.txt", size_field=base256((1 << 88) - 1)) + bytes(1024),
    "PAX size of 8 EiB": pax_then({"size": str(1 << 63)}, header("a.txt") + bytes(1024)),
    "PAX size with 400 digits": pax_then({"size": "9" * 400}, header("a.txt") + bytes(1024)),
    # str.isdigit() accepts these; int() does not (a ValueError in the scanner).
    "PAX size in Arabic-Indic digits": pax_then({"size": "١٢"}, header("a.txt") + bytes(1024)),
    "PAX size of superscript two": pax_then({"size": "²"}, header("a.txt") + bytes(1024)),
    # The stream read(n) these sizes at once (MemoryError), or read to EOF on -1.
    "octal size of 8 GiB": header("a.txt", size_field=b"77777777777\0") + bytes(1024),
    "base-256 negative size": header("a.txt", size_field=base256(-1)) + bytes(1024),
    "global PAX size of 8 EiB": pax_then({"size": str(1 << 63)}, header("a.txt") + bytes(1024), b"g"),
    "PAX path with a NUL byte": pax_then({"path": "a\0b.jpg"}, header("a.txt") + bytes(1024)),
}


@pytest.mark.parametrize("name", FORGED)
def test_forged_sizes_and_records_are_refused_by_every_reader(name: str, tmp_path: Path) -> None:
    data = FORGED[name]
    with pytest.raises(ShardFormatError):
        scan_tar(data, shard="forged.tar")
    shard = tmp_path / "forged.tar"
    shard.write_bytes(data)
    with pytest.raises(ShardFormatError):
        build_index(shard)
    assert [p.name for p in tmp_path.iterdir()] == ["forged.tar"]
    with pytest.raises(ShardFormatError):
        list(iter_members(io.BufferedReader(io.BytesIO(data)), shard="forged.tar"))  # type: ignore[arg-type]


def test_a_stream_claiming_8_gib_reads_only_what_is_there() -> None:
    # Under tracemalloc the read must stay near the real 1 KiB, not the claimed 8 GiB.
    import tracemalloc

    data = FORGED["octal size of 8 GiB"]
    tracemalloc.start()
    try:
        with pytest.raises(TruncatedShardError, match="wanted 8589934592 bytes, got 1024"):
            list(iter_members(io.BufferedReader(io.BytesIO(data)), shard="big.tar"))  # type: ignore[arg-type]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, peak


def test_stacked_extension_headers_follow_gnu_tar() -> None:
    # Two PAX headers merge; of two GNU long names the last wins (tarfile: the first).
    member = header("plain.txt", 3) + blocks(b"abc")
    data = pax_then({"path": "first.txt"}, pax_then({"mtime": "1"}, member)) + bytes(1024)
    assert scan_tar(data).names == ["first.txt"]
    assert [m.name for m in iter_members(io.BytesIO(data), shard="s")] == ["first.txt"]  # type: ignore[arg-type]
    long1, long2 = b"one.txt\0", b"two.txt\0"
    data = (
        header("././@LongLink", len(long1), typeflag=b"L") + blocks(long1)
        + header("././@LongLink", len(long2), typeflag=b"L") + blocks(long2)
        + member + bytes(1024)
    )
    assert scan_tar(data).names == ["two.txt"] == fuzz.gnu_tar_names(data)
    assert [m.name for m in iter_members(io.BytesIO(data), shard="s")] == ["two.txt"]  # type: ignore[arg-type]


# -- round trips -------------------------------------------------------------------------

name_part = st.text(alphabet=st.sampled_from("abcxyz019_-é日Ω"), min_size=1, max_size=12)
# A key: folders and a stem (no dots, not hidden, not a webdataset meta name), or one
# long enough to need the ustar prefix field or an extension header.
key = st.one_of(
    st.builds(lambda folders, stem: "/".join([*folders, "k" + stem]), st.lists(name_part, max_size=3), name_part),
    st.builds(lambda n, stem: "long" * n + "/k" + stem, st.integers(20, 60), name_part),
)
extension = st.sampled_from(["jpg", "cls", "seg.png", "json", "TXT"])


@st.composite
def shards(draw: st.DrawFn) -> tuple[str, list[tuple[str, str, bytes]]]:
    """A format and ``(key, extension, data)`` members with distinct keys."""
    fmt = draw(st.sampled_from(sorted(FORMATS)))
    keys = draw(st.lists(key, min_size=1, max_size=8, unique=True))
    if fmt == "ustar":  # ustar holds ASCII names of 100 bytes (+155 of prefix) only
        keys = [
            k for k in keys
            if k.isascii() and len(k.rsplit("/", 1)[-1]) <= 90 and len(k.rpartition("/")[0]) <= 155
        ]
    size = st.one_of(st.sampled_from([0, 1, 511, 512, 513]), st.integers(0, 3 * 512))
    members = []
    for k in keys:
        for ext in draw(st.lists(extension, min_size=1, max_size=3, unique_by=str.lower)):
            n = draw(size)
            members.append((k, ext, draw(st.binary(min_size=n, max_size=n))))
    return fmt, members


def written(fmt: str, members: list[tuple[str, str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=FORMATS[fmt]) as tf:
        for k, ext, data in members:
            info = tarfile.TarInfo(f"{k}.{ext}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@settings(max_examples=100, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(shards())
def test_any_member_set_round_trips_through_the_dataset(
    tmp_path: Path, shard: tuple[str, list[tuple[str, str, bytes]]]
) -> None:
    fmt, members = shard
    data = written(fmt, members)
    scanned = fuzz.check_scan(scan_tar(data), data)
    assert scanned == [(f"{k}.{ext}", d) for k, ext, d in members]
    path = tmp_path / f"rt-{fmt}.tar"
    path.write_bytes(data)
    build_index(path, force=True)
    ds = IndexedTarDataset(path)
    got = [(s["__key__"], ext, v) for s in (ds[i] for i in range(len(ds))) for ext, v in s.items() if not ext.startswith("__")]
    ds.close()
    # Extensions are lowercased by the naming rules; the bytes are exactly those written.
    assert got == [(k, ext.lower(), d) for k, ext, d in members]
