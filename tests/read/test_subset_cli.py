"""``indextar ls`` and ``indextar get`` with ``--select/--exclude FILE`` (issue 14)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import sample_members, tar_bytes

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
