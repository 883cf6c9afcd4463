"""indextar index on local shards: --dry-run, --json-lines, failures and --retry-failed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import flip_bit, sample_members, tar_bytes

from indextar.cli.commands import main


def test_dry_run_json_lines_and_retry_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    for n in range(4):
        data = tar_bytes(sample_members(3, prefix=f"p{n}_"))
        (tmp_path / f"s-{n}.tar").write_bytes(b"junk" * 300 if n == 2 else data)
    assert main(["index", "s-{0..3}.tar", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would build s-0.tar" in out and "4 to build" in out and "0 up to date" in out
    assert not list(tmp_path.glob("*.idx.sqlite"))

    assert main(["index", "s-{0..3}.tar", "--json-lines"]) == 1
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(line["shard"] for line in lines[:-1]) == [f"s-{n}.tar" for n in range(4)]
    assert lines[-1]["summary"]["failed"] == 1 and lines[-1]["summary"]["built"] == 3
    failed = json.loads((tmp_path / "indextar-failed.json").read_text())["failed"]
    assert [f["shard"] for f in failed] == ["s-2.tar"]
    assert failed[0]["error_type"] == "ShardFormatError"

    assert main(["index", "s-{0..3}.tar", "--dry-run"]) == 0
    assert "1 to build, 0 to check against the store, 3 up to date" in capsys.readouterr().out

    (tmp_path / "s-2.tar").write_bytes(tar_bytes(sample_members(3, prefix="p2_")))
    assert main(["index", "s-{0..3}.tar", "--retry-failed", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [s["shard"] for s in document["shards"]] == ["s-2.tar"]
    assert document["summary"]["built"] == 1
    assert not (tmp_path / "indextar-failed.json").exists()
    assert main(["index", "s-{0..3}.tar", "--retry-failed"]) == 1  # nothing left to retry
    assert "no indextar-failed.json" in capsys.readouterr().err


def test_failed_file_names_the_failures_list_and_no_failed_file_writes_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--failed-file PATH lists the failures there instead of in the current folder,
    --retry-failed reads it back from there; --no-failed-file writes and removes none."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "good.tar").write_bytes(tar_bytes(sample_members(3)))
    (tmp_path / "bad.tar").write_bytes(b"junk" * 300)
    elsewhere = tmp_path / "runs" / "failed.json"
    elsewhere.parent.mkdir()
    assert main(["index", "good.tar", "bad.tar", "--failed-file", str(elsewhere)]) == 1
    assert f"1 failed shard listed in {elsewhere}" in capsys.readouterr().out
    assert [f["shard"] for f in json.loads(elsewhere.read_text())["failed"]] == ["bad.tar"]
    assert not (tmp_path / "indextar-failed.json").exists()

    assert main(["index", "good.tar", "bad.tar", "--no-failed-file"]) == 1
    captured = capsys.readouterr()
    assert "'bad.tar' at byte offset 0: not a tar archive" in captured.err
    assert "listed in" not in captured.out
    assert not (tmp_path / "indextar-failed.json").exists()
    assert main(["index", "good.tar", "--retry-failed", "--no-failed-file"]) == 1
    assert "not with --no-failed-file" in capsys.readouterr().err

    (tmp_path / "bad.tar").write_bytes(tar_bytes(sample_members(2, prefix="b_")))
    assert main(["index", "good.tar", "bad.tar", "--no-failed-file", "-q"]) == 0
    assert elsewhere.exists()  # --no-failed-file leaves another run's list alone
    retried = ["index", "good.tar", "bad.tar", "--retry-failed", "--failures", str(elsewhere)]
    assert main(retried) == 0  # --failures: the option's older name
    assert "indexed 1 shard (0 built, 1 up to date)" in capsys.readouterr().out
    assert not elsewhere.exists()


def test_append_adds_new_shards_to_a_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    for n in range(3):
        (tmp_path / f"s-{n}.tar").write_bytes(tar_bytes(sample_members(2, prefix=f"p{n}_")))
    assert main(["index", "s-0.tar", "s-1.tar", "--manifest", "m.json", "-q"]) == 0
    assert main(["index", "s-2.tar", "--manifest", "m.json", "--append", "-q"]) == 0
    shards = json.loads((tmp_path / "m.json").read_text())["shardlist"]
    assert [s["url"] for s in shards] == ["s-0.tar", "s-1.tar", "s-2.tar"]
    assert main(["index", "s-2.tar", "--manifest", "m.json", "-q"]) == 0  # without: anew
    assert [s["url"] for s in json.loads((tmp_path / "m.json").read_text())["shardlist"]] == [
        "s-2.tar"
    ]


def test_index_checksums_and_verify_finds_a_flipped_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    members = {f"k{i:03d}.bin": bytes([i]) * 8192 for i in range(40)}  # 360 KiB
    shard = tmp_path / "s.tar"
    shard.write_bytes(tar_bytes(members))
    assert main(["index", "s.tar", "--checksums", "-q"]) == 0
    assert main(["info", "s.tar", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["checksum"] == "crc32"
    assert main(["verify", "s.tar", "-q"]) == 0
    flip_bit(shard, 20 * 8704 + 512 + 3)  # k020.bin: its header at 20 * 8704, then its data
    capsys.readouterr()
    assert main(["verify", "s.tar", "-q"]) == 1
    err = capsys.readouterr().err
    assert "1 of 40 samples do not match their crc32 checksum" in err
    assert f"'k020' at byte offset {20 * 8704}" in err
    assert main(["index", "s.tar", "--checksums", "xxh3_64", "--force", "-q"]) == 0
    assert main(["verify", "s.tar", "-q"]) == 0
