"""indextar.write.convert from Mosaic MDS and LitData, read by indextar's own readers from
datasets their real writers wrote (tests/data/convert, by write_fixtures.py there: neither
library installs beside the pinned torch); ``export_parquet``; and the CLI's summary."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image
from readers import wds_read

from indextar.cli.commands import main
from indextar.errors import ConvertError
from indextar.write.convert import convert, scan_source
from indextar.write.export_parquet import export_parquet

DATA = Path(__file__).resolve().parents[1] / "data" / "convert"
COUNT = 12  # write_fixtures.py's samples: image i is a 4x3 PNG of colour (i * 20, 7, 99)


def check_fixture_samples(samples: list[dict[str, bytes]]) -> None:
    assert [s["__key__"] for s in samples] == [f"{i:09d}" for i in range(COUNT)]
    for i, sample in enumerate(samples):
        pixels = Image.open(io.BytesIO(sample["image"]))
        assert (pixels.size, pixels.getpixel((0, 0))) == ((4, 3), (i * 20 % 256, 7, 99))
        fields = json.loads(sample["json"])
        assert (fields["label"], fields["caption"], fields["score"]) == (
            i % 3,
            f"sample {i}",
            i / 4,
        )


@pytest.mark.parametrize("name", ["mds", "litdata", "litdata-array"])
def test_fixtures_written_by_the_real_libraries(tmp_path: Path, name: str) -> None:
    source = scan_source(DATA / name)
    assert source.format == name.split("-")[0]
    result = convert(DATA / name, str(tmp_path / "d-%04d.tar"), maxcount=5, jobs=2)
    assert (result.rows, result.samples, [s.samples for s in result.shards]) == (12, 12, [5, 5, 2])
    samples = wds_read([s.path for s in result.shards])
    check_fixture_samples(samples)
    if name == "litdata-array":  # a numpy leaf: its bytes, as LitData stored them
        assert [s["pixels"] for s in samples[:2]] == [bytes(range(6)), bytes(range(1, 7))]


def test_mds_key_column_and_format_mismatch(tmp_path: Path) -> None:
    result = convert(
        DATA / "mds", str(tmp_path / "d-%04d.tar"), format="mds", key="label", maxcount=COUNT
    )
    assert result.skipped == {"duplicate-key": list(range(3, COUNT))}
    with pytest.raises(ConvertError, match="no readable LitData index.json"):
        convert(DATA / "mds", str(tmp_path / "e-%04d.tar"), format="litdata")


def test_export_parquet_of_the_attributes(tmp_path: Path) -> None:
    result = convert(DATA / "mds", str(tmp_path / "d-%04d.tar"), maxcount=5)
    shards = [s.path for s in result.shards]
    table = pq.read_table(export_parquet(shards, tmp_path / "a.parquet"))
    assert table.column_names == ["__shard__", "__index__", "__key__", "caption", "label", "score"]
    assert table.column("__index__").to_pylist() == [0, 1, 2, 3, 4] * 2 + [0, 1]
    assert table.column("label").to_pylist() == [i % 3 for i in range(COUNT)]
    assert table.column("__shard__").to_pylist()[5] == shards[1]
    # and back: the exported table converts (its key column keeps the keys)
    pq.write_table(table.append_column("image", pa.array([b"x"] * COUNT)), tmp_path / "t.parquet")
    again = convert(
        tmp_path / "t.parquet", str(tmp_path / "e-%04d.tar"), key="__key__", attributes=["caption"]
    )
    assert [s["__key__"] for s in wds_read([s.path for s in again.shards])][:2] == [
        "000000000",
        "000000001",
    ]


def test_cli_convert_prints_a_summary_and_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pattern = str(tmp_path / "d-%04d.tar")
    assert main(["convert", str(DATA / "litdata"), pattern, "--maxcount", "5", "-j", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("converted 12 rows into 12 samples in 3 shards, ")
    assert main(["convert", str(DATA / "litdata"), pattern, "--maxcount", "5", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["resumed"], summary["samples"], len(summary["shards"])) == (3, 12, 3)
    assert main(["export", "--parquet", str(tmp_path / "a.parquet"), *summary["shards"]]) == 0
    assert pq.read_table(tmp_path / "a.parquet").num_rows == 12


def test_a_corrupt_mds_shard_names_the_sample_and_byte(tmp_path: Path) -> None:
    shutil.copytree(DATA / "mds", tmp_path / "mds")
    shard = tmp_path / "mds" / "shard.00000.mds"
    data = bytearray(shard.read_bytes())
    count = int.from_bytes(data[:4], "little")
    last = 4 + 4 * count  # the end offset of the last sample
    data[last : last + 4] = (int.from_bytes(data[last : last + 4], "little") + 1).to_bytes(
        4, "little"
    )
    shard.write_bytes(bytes(data))
    with pytest.raises(
        ConvertError, match=rf"sample {count - 1} of 'shard.00000.mds' ends at byte"
    ):
        convert(tmp_path / "mds", str(tmp_path / "d-%04d.tar"))
