"""Archives GNU tar reads that indextar once refused or called corrupt (issue 12).

GNU sparse members with extension blocks, names that are not UTF-8, and archives
concatenated with ``cat``: each built here by GNU tar itself, and each read by the scan
(C walker and numpy), the index, and the streaming reader.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from readers import wds_samples
from tarcraft import GNU_TAR, gnu_tar

from indextar import (
    IndexedTarDataset,
    ShardFormatError,
    UnsupportedMemberError,
    build_index,
    build_indexes,
)
from indextar.index.verify import verify_index
from indextar.tar.scan import scan_tar
from indextar.tar.stream import iter_members

pytestmark = [
    pytest.mark.usefixtures("scanner"),
    pytest.mark.skipif(not os.path.exists(GNU_TAR), reason="GNU tar is not installed"),
]

# -- GNU sparse members with extension blocks ----------------------------------------


def sparse_file(path: Path, regions: int) -> None:
    """A 1 MiB-spaced sparse file with ``regions`` data regions and holes between."""
    with open(path, "wb") as f:
        for i in range(regions):
            f.seek(i * (1 << 20))
            f.write(b"region %d" % i)
        f.truncate(regions * (1 << 20))


@pytest.fixture
def sparse_archive(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.txt").write_bytes(b"dense")
    sparse_file(root / "many-regions.bin", 30)  # 4 in the header, 21 + 5 in two extension blocks
    if os.stat(root / "many-regions.bin").st_blocks * 512 >= 30 << 20:
        pytest.skip("this filesystem has no sparse files, so tar --sparse stores none")
    path = gnu_tar(
        tmp_path / "sparse.tar", root, [b"a.txt", b"many-regions.bin"], "--sparse", "--format=gnu"
    )
    header = path.read_bytes()[1024:1536]
    assert header[156:157] == b"S" and header[482] == 1  # the map runs on in extension blocks
    return path


def test_sparse_member_with_extension_blocks_is_refused_by_name(sparse_archive: Path) -> None:
    with pytest.raises(UnsupportedMemberError) as e:
        build_index(sparse_archive)
    message = str(e.value)
    assert message.startswith(f"{str(sparse_archive)!r} at byte offset 1024: ")
    assert "member 'many-regions.bin' is a GNU sparse file of 31457280 bytes" in message
    assert "checksum" not in message and e.value.offset == 1024
    with pytest.raises(UnsupportedMemberError, match="many-regions.bin") as scanned:
        scan_tar(sparse_archive.read_bytes(), shard="s.tar")
    assert scanned.value.offset == 1024


def test_sparse_member_after_a_long_name_is_named_in_full(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    name = "d" * 120 + ".bin"
    sparse_file(root / name, 6)
    path = gnu_tar(tmp_path / "long.tar", root, [name.encode()], "--sparse", "--format=gnu")
    with pytest.raises(UnsupportedMemberError) as e:
        scan_tar(path.read_bytes(), shard="long.tar")
    assert f"member {name!r} is a GNU sparse file" in str(e.value)
    assert e.value.offset == 0  # its GNU long-name header


def test_streaming_refuses_the_sparse_member_by_name(sparse_archive: Path) -> None:
    with open(sparse_archive, "rb") as f, pytest.raises(UnsupportedMemberError) as e:
        list(iter_members(f, shard="s.tar"))
    assert "member 'many-regions.bin' is a GNU sparse file of 31457280 bytes" in str(e.value)
    assert e.value.offset == 1024


# -- names that are not UTF-8 --------------------------------------------------------

LATIN1 = [
    b"Datei-mit-d\xe4mlicher-Unicode-Kodierung.txt",
    b"ordner/Datei-mit-d\xe4mlicher-Unicode-Kodierung.txt",
    b"ordner/Datei-mit-d\xe4mlicher-Unicode-Kodierung.cls",
    b"caf\xe9.J\xc9PG",
    b"plain.txt",
]


@pytest.fixture
def latin1_archive(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    os.makedirs(os.path.join(bytes(root), b"ordner"))
    for name in LATIN1:
        with open(os.path.join(bytes(root), name), "wb") as f:
            f.write(b"data of " + name)
    return gnu_tar(tmp_path / "latin1.tar", root, LATIN1, "--format=gnu")


def test_latin1_names_give_webdataset_keys(latin1_archive: Path) -> None:
    expected = wds_samples(latin1_archive.read_bytes())
    assert [s["__key__"] for s in expected] == [
        "Datei-mit-d\udce4mlicher-Unicode-Kodierung",
        "ordner/Datei-mit-d\udce4mlicher-Unicode-Kodierung",
        "caf\udce9",
        "plain",
    ]
    index = build_index(latin1_archive)
    assert index.keys() == [s["__key__"] for s in expected]
    assert index.find_key("caf\udce9") == [2] and index.find_key("caf\ufffd") == []
    ds = IndexedTarDataset(str(latin1_archive))
    got = [ds[i] for i in range(len(ds))]
    dataset_fields = ("__url__", "__shard__", "__index__", "__local_path__")
    assert [{k: v for k, v in s.items() if k not in dataset_fields} for s in got] == expected
    assert got[2]["j\udcc9pg"] == b"data of caf\xe9.J\xc9PG"
    assert verify_index(latin1_archive).ok


def test_latin1_names_in_the_stream(latin1_archive: Path) -> None:
    with open(latin1_archive, "rb") as f:
        names = [m.name for m in iter_members(f, shard="latin1.tar")]
    assert [n.encode("utf-8", "surrogateescape") for n in names] == LATIN1


# -- concatenated archives -----------------------------------------------------------


@pytest.fixture
def concatenated(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    root.mkdir()
    for i in range(6):
        (root / f"s{i}.txt").write_bytes(b"text %d" % i)
        (root / f"s{i}.cls").write_bytes(b"%d" % i)
    parts = [
        gnu_tar(
            tmp_path / f"part{p}.tar",
            root,
            [f"s{i}.{e}".encode() for i in r for e in ("cls", "txt")],
            "--format=gnu",
        )
        for p, r in enumerate((range(0, 3), range(3, 6)))
    ]
    path = tmp_path / "both.tar"
    path.write_bytes(b"".join(p.read_bytes() for p in parts))  # cat part0.tar part1.tar
    return path


def test_concatenated_archives_are_refused_naming_the_option(concatenated: Path) -> None:
    with pytest.raises(ShardFormatError, match=r"ignore_zeros=True") as e:
        build_index(concatenated)
    assert e.value.offset == 10240  # GNU tar pads the first part to a 10 KiB record


def test_ignore_zeros_indexes_every_part(concatenated: Path) -> None:
    index = build_index(concatenated, ignore_zeros=True)
    assert index.keys() == [f"s{i}" for i in range(6)]
    assert index.meta.ignore_zeros and verify_index(concatenated).ok
    ds = IndexedTarDataset(str(concatenated))
    assert [ds[i]["txt"] for i in range(6)] == [b"text %d" % i for i in range(6)]
    assert build_indexes([str(concatenated)], ignore_zeros=True, workers=1)[0].path == index.path
    # Built with the option, the index is not reused by a build without it.
    with pytest.raises(ShardFormatError, match="ignore_zeros"):
        build_index(concatenated)


def test_ignore_zeros_in_the_stream(concatenated: Path) -> None:
    buf = concatenated.read_bytes()
    names = [m.name for m in iter_members(io.BytesIO(buf), shard="c.tar", ignore_zeros=True)]
    assert names == [f"s{i}.{e}" for i in range(6) for e in ("cls", "txt")]
    assert len(list(iter_members(io.BytesIO(buf), shard="c.tar"))) == 6  # the first part


def test_cli_ignore_zeros(concatenated: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[2]))
    run = [sys.executable, "-m", "indextar", "index", str(concatenated)]
    refused = subprocess.run(run, env=env, capture_output=True, text=True)
    assert refused.returncode != 0 and "ignore_zeros" in refused.stderr
    done = subprocess.run([*run, "--ignore-zeros"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "6 samples, 12 members" in done.stdout
