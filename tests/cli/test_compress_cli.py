"""indextar recompress, create/reshard --compress and index --seek-spacing (issue 15)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import sample_members, tar_bytes
from readers import make_tree
from tarcraft import GNU_TAR

import indextar
from indextar.cli.commands import main
from indextar.index.arrays import read_layout


def samples(path: Path) -> list[tuple[str, bytes, bytes]]:
    ds = indextar.IndexedTarDataset(str(path))
    return [(s["__key__"], s["jpg"], s["cls"]) for s in (ds[i] for i in range(len(ds)))]


@pytest.fixture
def plain(tmp_path: Path) -> Path:
    path = tmp_path / "plain.tar"
    members = sample_members(40)
    members["README"] = b"not in a sample"
    path.write_bytes(tar_bytes(members))
    return path


def test_recompress_round_trips_through_every_format(
    plain: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    want = samples(plain)
    single = tmp_path / "single.tar.zst"  # one frame: refused by build_index, streamed here
    subprocess.run(["zstd", "-q", "-o", str(single), str(plain)], check=True)
    assert main(["recompress", str(single), str(tmp_path / "a.tar.gz"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["compression"] == "gzip" and summary["samples"] == 40
    assert samples(tmp_path / "a.tar.gz") == want
    layout = read_layout(
        *(lambda ix: (ix.path, ix.meta))(indextar.open_index(tmp_path / "a.tar.gz"))
    )
    assert layout.frames is not None and len(layout.frames) == 42  # + README, + the end
    assert main(["recompress", "-q", str(tmp_path / "a.tar.gz"), str(tmp_path / "b.tar.zst")]) == 0
    assert samples(tmp_path / "b.tar.zst") == want
    assert main(["recompress", "-q", str(tmp_path / "b.tar.zst"), str(tmp_path / "c.tar")]) == 0
    assert indextar.open_index(tmp_path / "c.tar").meta.compression == ""
    assert samples(tmp_path / "c.tar") == want
    listed = subprocess.run([GNU_TAR, "--zstd", "-tf", str(tmp_path / "b.tar.zst")],
                            capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    assert len(listed) == 81 and listed[-1] == "README"  # entries in no sample are kept


def test_recompress_refuses_bad_input(plain: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(subprocess.run(["gzip", "-c", str(plain)], capture_output=True,
                                   check=True).stdout[:-100])  # fmt: skip
    assert main(["recompress", "-q", str(cut), str(tmp_path / "out.tar.zst")]) == 1
    assert not (tmp_path / "out.tar.zst").exists()
    assert not list(tmp_path.glob(".out.tar.zst*"))  # no temporary file left either
    assert main(["recompress", "-q", str(plain), str(tmp_path / "out.bin")]) == 1
    assert main(["recompress", "-q", str(plain), str(plain)]) == 1


@pytest.mark.parametrize("codec", ["gzip", "zstd"])
def test_create_and_reshard_compress(tmp_path: Path, codec: str) -> None:
    make_tree(tmp_path / "src", {f"d/{i:03d}.txt": b"x%d" % i * 50 for i in range(30)})
    suffix = "tar.gz" if codec == "gzip" else "tar.zst"
    out = str(tmp_path / f"c-%02d.{suffix}")
    assert main(["create", str(tmp_path / "src"), out, "--compress", codec, "--maxcount", "20",
                 "-q", "-j", "1"]) == 0  # fmt: skip
    created = [tmp_path / f"c-00.{suffix}", tmp_path / f"c-01.{suffix}"]
    assert [indextar.open_index(p).meta.compression for p in created] == [codec, codec]
    ds = indextar.IndexedTarDataset([str(p) for p in created])
    assert len(ds) == 30 and ds[29]["txt"] == b"x29" * 50
    # reshard reads compressed shards and writes plain ones (and back)
    assert main(["reshard", *map(str, created), str(tmp_path / "r-%02d.tar"), "-q"]) == 0
    plain_ds = indextar.IndexedTarDataset(str(tmp_path / "r-00.tar"))
    assert [plain_ds[i]["txt"] for i in range(30)] == [ds[i]["txt"] for i in range(30)]
    assert main(["reshard", str(tmp_path / "r-00.tar"), str(tmp_path / "z-%02d.tar.zst"),
                 "--compress", "zstd", "--shuffle", "-q"]) == 0  # fmt: skip
    shuffled = indextar.IndexedTarDataset(str(tmp_path / "z-00.tar.zst"))
    assert sorted(shuffled[i]["txt"] for i in range(30)) == sorted(ds[i]["txt"] for i in range(30))


def test_index_seek_spacing_and_index_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # varied text: deflate blocks (where zran can place points) stay small
    rng = np.random.default_rng(0)
    words = [bytes(rng.integers(97, 123, 6, np.uint8)) for _ in range(5000)]
    members = {
        f"t{i:04d}.txt": b" ".join(words[j] for j in rng.integers(0, 5000, 300)) for i in range(600)
    }
    gz = tmp_path / "t.tar.gz"
    gz.write_bytes(subprocess.run(["gzip", "-c"], input=tar_bytes(members), capture_output=True,
                                  check=True).stdout)  # fmt: skip
    assert main(["index", str(gz), "--seek-spacing", "131072", "--json"]) == 0
    shard = json.loads(capsys.readouterr().out)["shards"][0]["result"]
    index = indextar.open_index(gz)
    assert index.meta.seek_spacing == 131072
    assert shard["index_bytes"] == index.path.stat().st_size
    points = read_layout(index.path, index.meta).seek_points
    assert points is not None and len(points.points) >= 5


def test_info_names_the_compression(
    plain: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["recompress", "-q", str(plain), str(tmp_path / "p.tar.gz")]) == 0
    assert main(["info", str(tmp_path / "p.tar.gz"), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    index = indextar.open_index(tmp_path / "p.tar.gz")
    assert row["compression"] == "gzip" and row["shard_bytes"] == index.meta.shard_size
    assert row["uncompressed_bytes"] == index.meta.uncompressed_size > row["shard_bytes"]
    assert main(["info", str(tmp_path / "p.tar.gz")]) == 0
    assert f"(gzip: a {index.meta.uncompressed_size:,}-byte tar)" in capsys.readouterr().out
