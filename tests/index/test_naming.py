"""The naming rules, checked against webdataset 1.0's own streaming reader on the same tar."""

from __future__ import annotations

import io
import re
import tarfile
from pathlib import Path

import pytest
from conftest import FORMATS, sample_members, tar_bytes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from readers import indexed_samples, wds_samples
from tarcraft import Crafter
from webdataset.tariterators import base_plus_ext

from indextar import SampleFormatError, build_index, scan_tar, split_name
from indextar.index.naming import group_members, skip_reason

# Every test here runs with the C walker and grouping, and with the numpy ones (conftest).
pytestmark = pytest.mark.usefixtures("scanner")

Sample = dict[str, object]


def our_samples(buf: bytes) -> list[Sample]:
    """The same samples from indextar's scan and grouping."""
    scan = scan_tar(buf)
    grouping = group_members(scan)
    samples: list[Sample] = []
    for key, first, count in zip(
        grouping.keys, grouping.first_member.tolist(), grouping.member_count.tolist()
    ):
        sample: Sample = {"__key__": key}
        for position in range(first, first + count):
            row = int(grouping.entries[position])
            start, size = int(scan.data_offsets[row]), int(scan.sizes[row])
            sample[grouping.exts[position]] = buf[start : start + size]
        samples.append(sample)
    return samples


# Every rule in one shard: (name, data) in archive order; data None is a directory,
# "->x" a symlink.
ZOO: dict[str, bytes | str | None] = {
    "s1.jpg": b"jpeg",
    "s1.cls": b"3",
    "s1.seg.png": b"multi-dot extension",
    "s2.JPG": b"uppercase extension",
    "s2.Json": b"{}",
    "s2.": b"empty extension",
    "__meta__": b"meta entry: skipped",
    "__dir__/x.jpg": b"meta folder: skipped",
    "__meta__.json": b"an ordinary sample",
    "__a__b__.txt": b"not meta either",
    "a/__b__/c.jpg": b"meta pattern not at the start",
    "README": b"no extension",
    "dir.d/README": b"a dot only in the folder",
    ".hidden.jpg": b"starts with a dot",
    "dir/": None,
    "dir/.hidden.jpg": b"webdataset's key is 'dir/'",
    "dir/.hidden.cls": b"same key 'dir/'",
    "dir/s3.jpg": b"in a folder",
    "dir/link.jpg": "->s3.jpg",
    "a.b/c.d/e.f.g": b"dots in folders",
    "./dot-slash.jpg": b"key './dot-slash'",
    "ü 1/日本.JPEG": b"UTF-8 and a space",
    "line\nbreak.jpg": b"newline in the key",
    "trailing.jpg\n": b"newline in the extension",
    "r.jpg": b"r first",
    "q.jpg": b"between",
    "r.cls": b"r again: a scattered key",
    "tail.txt": b"last",
}
ZOO_SKIPPED = {"meta": 2, "no-extension": 2, "hidden": 1, "directory": 1, "symlink": 1}


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_rule_matches_webdataset(fmt: str, tmp_path: Path) -> None:
    buf = tar_bytes(ZOO, fmt)
    expected = wds_samples(buf)
    assert our_samples(buf) == expected
    path = tmp_path / "zoo.tar"
    path.write_bytes(buf)
    assert indexed_samples(path) == expected
    keys = [s["__key__"] for s in expected]
    # Spot checks that pin down the rules themselves, not only the agreement.
    assert "dir/" in keys and "__meta__" in keys and "./dot-slash" in keys
    assert {"seg.png", "jpg", "cls"} <= set(expected[0])
    assert set(expected[1]) == {"__key__", "jpg", "json", ""}
    assert "__dir__/x" not in keys and ".hidden" not in keys and "README" not in keys
    assert keys.count("r") == 2
    index = build_index(path)
    assert index.skipped_counts() == ZOO_SKIPPED
    assert index.scattered_keys() == ["r"]
    assert index.find_key("r") == [i for i, k in enumerate(keys) if k == "r"]


def test_hardlinks_and_device_entries_are_skipped_by_kind(tmp_path: Path) -> None:
    crafter = Crafter().member("a.jpg", b"a")
    crafter.member("hard.jpg", b"", typeflag=b"1", linkname="a.jpg")
    crafter.member("tty.jpg", b"", typeflag=b"3")
    crafter.member("disk.jpg", b"", typeflag=b"4")
    crafter.member("pipe.jpg", b"", typeflag=b"6")
    crafter.member("cont.jpg", b"contiguous file: regular", typeflag=b"7")
    crafter.member("b.jpg", b"b")
    buf = crafter.finish()
    assert our_samples(buf) == wds_samples(buf)
    assert [s["__key__"] for s in our_samples(buf)] == ["a", "cont", "b"]
    path = tmp_path / "kinds.tar"
    path.write_bytes(buf)
    counts = build_index(path).skipped_counts()
    assert counts == {"hardlink": 1, "chardev": 1, "blockdev": 1, "fifo": 1}


@pytest.mark.parametrize("fmt", FORMATS)
def test_duplicate_extension_both_refuse(fmt: str) -> None:
    buf = tar_bytes({"k.jpg": b"1", "k.txt": b"2", "k.JPG": b"3"}, fmt)
    with pytest.raises(ValueError, match="duplicate"):
        wds_samples(buf)
    with pytest.raises(SampleFormatError, match="'jpg' twice"):
        group_members(scan_tar(buf))


def test_scattered_keys_are_reported_not_merged() -> None:
    members = {**sample_members(3, ("jpg",)), "s000000.cls": b"late", "x/y.a": b"", "x/y.b": b""}
    buf = tar_bytes(members)
    grouping = group_members(scan_tar(buf))
    assert grouping.keys == ["s000000", "s000001", "s000002", "s000000", "x/y"]
    assert grouping.scattered_keys == ["s000000"]
    assert our_samples(buf) == wds_samples(buf)


def test_adjacent_members_are_one_sample() -> None:
    grouping = group_members(scan_tar(tar_bytes(sample_members(4, ("jpg", "cls", "json")))))
    assert grouping.member_count.tolist() == [3, 3, 3, 3]
    assert grouping.first_member.tolist() == [0, 3, 6, 9]
    assert grouping.sample_of_member.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert grouping.scattered_keys == [] and grouping.skipped == []


def test_only_skipped_entries_give_no_samples() -> None:
    buf = tar_bytes({"d/": None, "README": b"x", "__meta__": b"m"})
    grouping = group_members(scan_tar(buf))
    assert grouping.keys == [] and len(grouping.entries) == 0
    assert sorted(kind for _, kind in grouping.skipped) == ["directory", "meta", "no-extension"]
    assert wds_samples(buf) == []


# -- the rules on arbitrary names ------------------------------------------------------

_names = st.text(alphabet=st.sampled_from(list("ab_./\nÄ ")), min_size=1, max_size=12)


@settings(max_examples=500, derandomize=True, deadline=None)
@given(_names)
def test_split_name_is_webdatasets_base_plus_ext(name: str) -> None:
    key, ext = base_plus_ext(name)
    assert split_name(name) == (None if key is None else (key, ext.lower()))


@settings(max_examples=500, derandomize=True, deadline=None)
@given(_names)
def test_skip_reason_is_webdatasets_filter(name: str) -> None:
    meta = bool(re.match(r"__[^/]*__($|/)", name)) or (
        "/" not in name and name.startswith("__") and name.endswith("__")
    )
    kept_by_webdataset = not meta and base_plus_ext(name)[0] is not None
    assert (skip_reason(name) is None) == kept_by_webdataset


@settings(
    max_examples=100,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],  # the scanner env: per test
)
@given(
    fmt=st.sampled_from(sorted(FORMATS)),
    entries=st.lists(
        st.tuples(
            st.text(alphabet=st.sampled_from(list("ab_./AB")), min_size=1, max_size=8),
            st.booleans(),
        ),
        max_size=14,
    ),
)
def test_grouping_matches_webdataset(fmt: str, entries: list[tuple[str, bool]]) -> None:
    buf_io = io.BytesIO()
    with tarfile.open(fileobj=buf_io, mode="w", format=FORMATS[fmt]) as tf:
        for i, (name, is_dir) in enumerate(entries):
            info = tarfile.TarInfo(name)
            data = f"{i}:{name}".encode()
            if is_dir:
                info.type = tarfile.DIRTYPE
                tf.addfile(info)
            else:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    buf = buf_io.getvalue()
    try:
        expected = wds_samples(buf)
    except ValueError as e:
        assert "duplicate" in str(e)
        with pytest.raises(SampleFormatError):
            our_samples(buf)
        return
    assert our_samples(buf) == expected


@pytest.mark.parametrize("ext", ["__key__", "__url__", "__KEY__"])
def test_extensions_naming_webdatasets_own_fields_are_refused(ext: str) -> None:
    buf = tar_bytes({"a.jpg": b"1", f"a.{ext}": b"2", "b.jpg": b"3"})
    with pytest.raises(ValueError, match="duplicate"):
        wds_samples(buf)
    with pytest.raises(SampleFormatError, match=f"'a.{ext}'") as e:
        group_members(scan_tar(buf), shard="s.tar")
    assert e.value.offset == 1024 and "'s.tar' at byte offset 1024" in str(e.value)


def test_bad_extension_is_kept_where_webdataset_drops_the_sample() -> None:
    # A known difference: webdataset silently drops a sample with a non-empty
    # '__bad__' member (valid_sample); indextar never drops samples silently.
    buf = tar_bytes({"a.jpg": b"1", "a.__bad__": b"2", "b.jpg": b"3"})
    assert [s["__key__"] for s in wds_samples(buf)] == ["b"]
    assert [s["__key__"] for s in our_samples(buf)] == ["a", "b"]
