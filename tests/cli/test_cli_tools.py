"""The CLI's shard tools: create, reshard, ls, cat, get, export (output, --json, exit codes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from readers import TREE, make_tree

from indextar.cli.commands import main

ROOT = Path(__file__).resolve().parents[2]


def run(*argv: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    """The real ``indextar`` command, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "indextar", *argv],
        cwd=cwd,
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@pytest.fixture
def made(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    make_tree(tmp_path / "src", TREE)
    os.chdir(tmp_path)
    assert main(["create", "src", "out-%03d.tar", "--maxcount", "3", "-j", "1"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("created 2 shards: 4 samples from 6 files")
    assert "skipped 3 files (hidden 2, no-extension 1)" in captured.out
    assert "skipped 1 no-extension files: dog/README" in captured.err
    return tmp_path


def test_create_json_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_tree(tmp_path / "src", TREE)
    out = str(tmp_path / "j-%d.tar")
    assert main(["create", str(tmp_path / "src"), out, "--json", "--maxsize", "3KiB"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["samples"] == 4 and summary["skipped"]["no-extension"] == ["dog/README"]
    # 3 KiB holds one 2-member sample plus the end blocks exactly; no two samples fit.
    assert len(summary["shards"]) == 4


def test_ls_and_cat(made: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ls", "out-000.tar"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "cat/0001\tjpg:9 json:8",
        "cat/0002\tjpg:900",
        "dog/deep/er/0003\tjpg:5 seg.png:9",
    ]
    result = run("cat", "out-001.tar", "dog/img.v2.jpg", cwd=made)
    assert result.returncode == 0 and result.stdout == TREE["dog/img.v2.JPG"]
    missing = run("cat", "out-001.tar", "dog/img.png", cwd=made)
    assert missing.returncode == 1 and missing.stdout == b""
    assert missing.stderr.decode().strip() == (
        "indextar: error: shard 'out-001.tar': sample 'dog/img' has no 'png' member; it has v2.jpg"
    )


def test_get_by_dataset_index(made: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["get", "out-{000..001}.tar", "3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("sample 3: key 'dog/img'\n  shard out-001.tar, sample 0, bytes 0..1024")
    assert "'dog-v2'" in out
    assert main(["get", "out-{000..001}.tar", "-1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["key"] == "dog/img"
    assert main(["get", "out-{000..001}.tar", "4"]) == 1
    assert "out of range: the dataset has 4 samples" in capsys.readouterr().err


def test_reshard_and_export(made: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reshard", "out-*.tar", "r-%d.tar", "--shuffle", "--seed", "1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["samples"] == 4 and result["shards"] == ["r-0.tar"]
    assert main(["export", "--dali", "dali", "r-0.tar"]) == 0
    assert (made / "dali" / "r-0.idx").read_text().startswith("v1.2 4\n")
    assert main(["export", "--wids", "ds.json", "out-*.tar", "-q"]) == 0
    assert capsys.readouterr().out.startswith("exported 1 shards")
    assert json.loads((made / "ds.json").read_text())["shardlist"][1]["nsamples"] == 1


def test_bad_arguments_exit_2_and_errors_exit_1(tmp_path: Path) -> None:
    bad_size = run("create", "src", "o-%d.tar", "--maxsize", "lots", cwd=tmp_path)
    assert bad_size.returncode == 2 and b"invalid size 'lots'" in bad_size.stderr
    no_folder = run("create", "missing", "o-%d.tar", cwd=tmp_path)
    assert no_folder.returncode == 1
    assert no_folder.stderr.decode().strip() == "indextar: error: 'missing' is not a folder"
