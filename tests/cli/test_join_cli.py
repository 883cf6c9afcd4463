"""``indextar ls``, ``get`` and ``query`` with ``--join PATTERN``: a dataset joined by
key with a sidecar shard set of other shard sizes and order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import tar_bytes

import indextar
from indextar.cli.commands import main


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """images-{0,1}.tar (3 and 2 samples) and clip-0.tar (4 of them, another order,
    with a json attribute); the join cache under ``tmp_path``."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    keys = ["a", "b", "c", "d", "e"]
    for n, group in enumerate([keys[:3], keys[3:]]):
        members = {f"{k}.jpg": f"jpeg {k}".encode() for k in group}
        (tmp_path / f"images-{n}.tar").write_bytes(tar_bytes(members))
    clip = {}
    for k in ["e", "c", "a", "b"]:
        clip[f"{k}.npy"] = f"vector {k}".encode()
        clip[f"{k}.json"] = json.dumps({"score": ord(k) - 96}).encode()
    (tmp_path / "clip-0.tar").write_bytes(tar_bytes(clip))
    for shard in ["images-0.tar", "images-1.tar"]:
        indextar.build_index(shard)
    indextar.build_index("clip-0.tar", attributes_from="json")
    return tmp_path


JOIN = ["--join", "clip-0.tar", "--join-prefix", "clip."]


def test_ls_lists_both_sides_members(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ls", "images-0.tar", *JOIN]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{k}\tjpg:6 clip.npy:8 clip.json:12" for k in "abc"
    ]
    assert main(["ls", "images-1.tar", *JOIN, "--join-how", "left", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows == [
        {"key": "d", "members": {"jpg": 6}},
        {"key": "e", "members": {"jpg": 6, "clip.npy": 8, "clip.json": 12}},
    ]


def test_get_describes_the_joined_sample(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["get", "images-{0..1}.tar", "3", *JOIN, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["key"] == "e" and info["shard"].endswith("images-1.tar")
    assert info["joined"]["key"] == "e" and info["joined"]["shard"].endswith("clip-0.tar")
    assert [m["ext"] for m in info["joined"]["members"]] == ["clip.npy", "clip.json"]
    assert info["joined"]["members"][0]["head"] == "vector e"
    assert main(["get", "images-{0..1}.tar", "3", *JOIN]) == 0
    text = capsys.readouterr().out
    assert "key 'e'" in text and "clip.npy" in text and "'vector e'" in text


def test_query_by_the_joined_sides_attributes(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shards = "images-{0..1}.tar"
    assert main(["query", shards, *JOIN, "--where", "score >= 2", "--keys"]) == 0
    assert capsys.readouterr().out.split() == ["b", "c", "e"]
    assert main(["query", shards, *JOIN, "--where", "score >= 2", "--count"]) == 0
    assert capsys.readouterr().out.strip() == "3"
    assert main(["query", shards, *JOIN, "--where", "__key__ = 'c'", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"__index__": 2, "__key__": "c"}


def test_an_extension_on_both_sides_is_an_error(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (folder / "more-0.tar").write_bytes(tar_bytes({"a.jpg": b"other"}))
    indextar.build_index("more-0.tar")
    assert main(["ls", "images-0.tar", "--join", "more-0.tar"]) == 1
    assert "'jpg' is on both sides" in capsys.readouterr().err
