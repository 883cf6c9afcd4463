"""Fuzzing in CI: a seeded slice of ``tools/fuzz.py`` and hypothesis round trips.

The long runs are ``python tools/fuzz.py --seconds N``; docs/reliability.md has
their figures. Here a few hundred cases of the same generator and mutators run
through every target, plus the inputs that once broke a reader.
"""

from __future__ import annotations

import io
import tarfile
import time
from pathlib import Path

import fuzz
import pytest
from conftest import FORMATS
from fuzz_runner import run_cases
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from runner_probe import stuck_or_dead
from tarcraft import blocks, header, pax_records

from indextar import (
    IndexedTarDataset,
    IndextarError,
    ShardFormatError,
    TruncatedShardError,
    build_index,
    scan_tar,
)
from indextar.index.naming import group_members
from indextar.tar.stream import iter_members

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
    # The C walker both walks (folding PAX headers too) and hands over, as the reference scans.
    native = counts["native"]
    assert (
        native["equals reference: C walked"] > 5 and native["equals reference: C handed over"] > 5
    )
    assert sum(n for k, n in native.items() if k.endswith("PAX folded")) > 1, native


def test_a_seconds_run_ends_on_time() -> None:
    # ztables cases take tens of ms: Pool.imap had queued minutes of them by the deadline.
    began = time.monotonic()
    result = fuzz.fuzz(seed=0, seconds=3, targets=("ztables",), jobs=1)
    took = time.monotonic() - began
    # (On a loaded machine the workers' start-up, within the 3 s, may leave no case run.)
    assert not result.failures, "\n".join(result.failures[:3])
    assert took < 3 + 4, f"a 3 s run took {took:.1f} s ({result.cases} cases)"


def test_a_hung_case_and_a_dead_worker_are_findings_and_the_run_goes_on() -> None:
    answers: dict[int, int] = {}
    began = time.monotonic()
    done, lost = run_cases(
        stuck_or_dead, answers.__setitem__, cases=8, seconds=None, jobs=2, hang_after=1.0
    )
    assert time.monotonic() - began < 30
    assert done == 6 and answers == {n: n * 10 for n in (0, 1, 3, 5, 6, 7)}
    assert [(c.number, c.kind) for c in sorted(lost, key=lambda c: c.number)] == [
        (2, "hang"),
        (4, "crash"),
    ]
    assert "SIGKILL" in next(c.why for c in lost if c.number == 4)


# -- inputs that once escaped as another exception, or allocated a forged size -------------


FORGED = fuzz.forged_inputs()
# Sizes and records forged so that a reader would overflow or allocate: every reader
# must refuse these (the stream too, although it stops at the first zero block).
FORGED_SIZES = [name for name in FORGED if "size" in name or "PAX path" in name]


@pytest.mark.parametrize("name", FORGED)
def test_bad_inputs_get_an_indextar_error_from_every_reader(name: str, tmp_path: Path) -> None:
    data = FORGED[name]
    with pytest.raises(IndextarError) as scanned:
        group_members(scan_tar(data, shard="bad.tar"))
    shard = tmp_path / "bad.tar"
    shard.write_bytes(data)
    with pytest.raises(type(scanned.value)):
        build_index(shard)
    assert [p.name for p in tmp_path.iterdir()] == ["bad.tar"]
    stream = io.BufferedReader(io.BytesIO(data))  # type: ignore[arg-type]
    if name in FORGED_SIZES:
        with pytest.raises(ShardFormatError):
            list(iter_members(stream, shard="bad.tar"))
    else:
        try:
            list(iter_members(stream, shard="bad.tar"))
        except IndextarError:
            pass


def test_reliability_doc_lists_every_bad_input_with_its_current_message() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "reliability.md").read_text()
    assert fuzz.forged_table() in doc, "regenerate the table with: python tools/fuzz.py --forged"


def test_a_stream_claiming_8_gib_reads_only_what_is_there() -> None:
    # Under tracemalloc the read must stay near the real 1 KiB, not the claimed 8 GiB.
    import tracemalloc

    data = FORGED["an octal size of 8 GiB with 1 KiB present"]
    tracemalloc.start()
    try:
        with pytest.raises(TruncatedShardError, match="wanted 8589934592 bytes, got 1024"):
            list(iter_members(io.BufferedReader(io.BytesIO(data)), shard="big.tar"))  # type: ignore[arg-type]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, peak


def pax_header(records: dict[str, str]) -> bytes:
    payload = pax_records(records)
    return header("././@PaxHeader", len(payload), typeflag=b"x") + blocks(payload)


@pytest.mark.parametrize(
    "first, second",
    [
        ({"path": "first.txt"}, {"mtime": "1"}),  # GNU tar: the first path is gone
        ({"mtime": "1"}, {"path": "second.txt"}),
        ({"path": "first.txt", "size": "1024"}, {"mtime": "1"}),  # and the first size too
        ({"size": "1024", "mtime": "nan"}, {"path": "second.txt"}),  # found by tools/fuzz.py
    ],
)
def test_a_later_pax_header_replaces_an_earlier_one_as_in_gnu_tar(
    first: dict[str, str], second: dict[str, str]
) -> None:
    # Stacked local PAX headers: GNU tar keeps only the last; tarfile applies both, the
    # first winning. GNU tar decides (its listing is the reference here).
    member = header("plain.txt", 3) + blocks(b"abc")
    data = pax_header(first) + pax_header(second) + member + header("next.txt", 1)
    data += blocks(b"z") + bytes(1024)
    expected = fuzz.gnu_tar_names(data)
    assert expected is not None and expected[-1] == "next.txt"
    assert scan_tar(data).names == expected
    assert [m.name for m in iter_members(io.BytesIO(data), shard="s")] == expected  # type: ignore[arg-type]


def global_header(*records: tuple[str, str]) -> bytes:
    payload = b"".join(pax_records(dict([record])) for record in records)
    return header("././@PaxHeader", len(payload), typeflag=b"g") + blocks(payload)


@pytest.mark.parametrize(
    "globals_",
    [
        [[("path", "first.txt"), ("path", "second.txt")]],  # tarfile: the second
        [[("size", "3"), ("size", "600")]],
        [[("path", "first.txt")], [("mtime", "1")]],  # tarfile: first.txt
        [[("path", "first.txt")], []],
        [[("size", "600")], [("mtime", "1")]],
        [[("path", "first.txt")], [("path", "second.txt")]],
    ],
    ids=["first-record", "first-size", "replaced", "emptied", "size-replaced", "second-header"],
)
def test_global_pax_headers_as_in_gnu_tar(globals_: list[list[tuple[str, str]]]) -> None:
    # GNU tar: a global header replaces every earlier one, and of its records with one
    # keyword the first counts (tarfile merges them, the last counting). Found by
    # tools/fuzz.py --seed 11.
    data = b"".join(global_header(*records) for records in globals_)
    data += header("own.txt", 3) + blocks(b"abc") + header("next.txt", 1) + blocks(b"z")
    data += bytes(1024)
    expected = fuzz.gnu_tar_entries(data)
    assert expected is not None and len(expected) == 2  # a global path names both
    scan = scan_tar(data)
    assert list(zip(scan.names, scan.sizes.tolist())) == expected
    streamed = iter_members(io.BytesIO(data), shard="s")  # type: ignore[arg-type]
    assert [(m.name, len(m.data)) for m in streamed] == expected


def test_stacked_extension_headers_follow_gnu_tar() -> None:
    # Of two GNU long names the last wins (tarfile: the first).
    member = header("plain.txt", 3) + blocks(b"abc")
    long1, long2 = b"one.txt\0", b"two.txt\0"
    data = (
        header("././@LongLink", len(long1), typeflag=b"L")
        + blocks(long1)
        + header("././@LongLink", len(long2), typeflag=b"L")
        + blocks(long2)
        + member
        + bytes(1024)
    )
    assert scan_tar(data).names == ["two.txt"] == fuzz.gnu_tar_names(data)
    assert [m.name for m in iter_members(io.BytesIO(data), shard="s")] == ["two.txt"]  # type: ignore[arg-type]


def test_a_gnu_long_name_runs_to_its_nul_past_its_size_as_in_gnu_tar() -> None:
    # The size stops inside the name; GNU tar reads on into the padding, to the NUL.
    name = b"long-" + b"n" * 120 + b".txt"
    data = (
        header("././@LongLink", 10, typeflag=b"L")
        + blocks(name + b"\0")
        + header("plain.txt", 3)
        + blocks(b"abc")
        + bytes(1024)
    )
    assert scan_tar(data).names == [name.decode()] == fuzz.gnu_tar_names(data)
    assert [m.name for m in iter_members(io.BytesIO(data), shard="s")] == [name.decode()]  # type: ignore[arg-type]


# -- round trips -------------------------------------------------------------------------

name_part = st.text(alphabet=st.sampled_from("abcxyz019_-é日Ω"), min_size=1, max_size=12)
# A key: folders and a stem (no dots, not hidden, not a webdataset meta name), or one
# long enough to need the ustar prefix field or an extension header.
key = st.one_of(
    st.builds(
        lambda folders, stem: "/".join([*folders, "k" + stem]),
        st.lists(name_part, max_size=3),
        name_part,
    ),
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
            k
            for k in keys
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


@settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
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
    got = [
        (s["__key__"], ext, v)
        for s in (ds[i] for i in range(len(ds)))
        for ext, v in s.items()
        if not ext.startswith("__")
    ]
    ds.close()
    # Extensions are lowercased by the naming rules; the bytes are exactly those written.
    assert got == [(k, ext.lower(), d) for k, ext, d in members]
