"""``indextar ls`` and ``indextar get`` with ``--select/--exclude FILE`` (issue 14)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import sample_members, tar_bytes

from indextar import IndexedTarDataset, SampleIndexError
from indextar.cli.commands import main


def test_ls_and_get_take_a_key_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    shard = tmp_path / "data.tar"
    shard.write_bytes(tar_bytes(sample_members(6, ("txt",))))
    keys = tmp_path / "keys.txt"
    keys.write_text("s000001\ns000004\nmissing\n")
    assert main(["index", str(shard), "-q"]) == 0
    capsys.readouterr()

    assert main(["ls", str(shard), "--select", str(keys), "--json"]) == 0
    assert [row["key"] for row in json.loads(capsys.readouterr().out)] == ["s000001", "s000004"]
    assert "1 of 3 keys match no sample" in caplog.text and "'missing'" in caplog.text
    assert main(["ls", str(shard), "--exclude", str(keys)]) == 0
    listed = [line.split("\t")[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == ["s000000", "s000002", "s000003", "s000005"]

    assert main(["get", str(shard), "1", "--exclude", str(keys), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["key"] == "s000002"  # the 2nd sample kept
    assert main(["get", str(shard), "-1", "--select", str(keys), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["key"] == "s000004"
    assert main(["get", str(shard), "2", "--select", str(keys)]) != 0  # 2 selected: out of range
    assert "out of range" in capsys.readouterr().err


def test_get_with_a_key_file_opens_each_index_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from indextar.read import lookup

    shards = [tmp_path / f"d-{n}.tar" for n in range(2)]
    for n, shard in enumerate(shards):
        shard.write_bytes(tar_bytes(sample_members(3, ("txt",), prefix=f"k{n}_")))
    keys = tmp_path / "keys.txt"
    keys.write_text("k0_000002\nk1_000001\n")
    assert main(["index", "-q", *map(str, shards)]) == 0
    capsys.readouterr()

    def no_second_open(*args: object, **kwargs: object) -> None:
        raise AssertionError("the dataset's indexes were opened again")

    monkeypatch.setattr(lookup, "open_shard_index", no_second_open)
    pattern = str(tmp_path / "d-{0..1}.tar")
    assert main(["get", pattern, "1", "--select", str(keys), "--json"]) == 0
    described = json.loads(capsys.readouterr().out)
    assert (described["key"], described["index"], described["shard"]) == (
        "k1_000001",
        4,
        str(shards[1]),
    )
    # sample_keys, what query --keys prints: in the order asked, shard by shard.
    dataset = IndexedTarDataset([str(s) for s in shards])
    assert list(lookup.sample_keys(dataset, [4, 0, 1, 5])) == [
        "k1_000001",
        "k0_000000",
        "k0_000001",
        "k1_000002",
    ]
    with pytest.raises(SampleIndexError, match=r"in \[0, 6\)"):
        list(lookup.sample_keys(dataset, [6]))
