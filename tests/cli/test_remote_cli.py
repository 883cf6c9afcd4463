"""`indextar index` on URLs: HTTP and S3 (SeaweedFS) on 127.0.0.1, and --upload."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import sample_members, tar_bytes

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
from loopback_servers import HttpServer, SeaweedServer  # noqa: E402


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("served")
    for shard in range(2):
        members = sample_members(30, exts=("jpg", "cls"), prefix=f"r{shard}_")
        (folder / f"data-{shard}.tar").write_bytes(tar_bytes(members, "gnu"))
    return folder


@pytest.fixture(scope="module")
def http(served: Path) -> Iterator[HttpServer]:
    with HttpServer(served) as server:
        yield server


@pytest.fixture(scope="module")
def s3_files(served: Path) -> list[Path]:
    return [served / f"data-{shard}.tar" for shard in range(2)]


def indextar(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "indextar", *args], env=full_env, capture_output=True, text=True
    )


def test_index_http_urls_into_an_index_dir(http: HttpServer, tmp_path: Path) -> None:
    pattern = http.url("data-{0..1}.tar")
    result = indextar("index", pattern, "--index-dir", str(tmp_path), "--json", "-q")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)["summary"]
    assert (summary["shards"], summary["built"], summary["samples"]) == (2, 2, 60)
    assert len(list(tmp_path.glob("data-*.idx.sqlite"))) == 2

    again = indextar("index", pattern, "--index-dir", str(tmp_path), "--json", "-q")
    assert json.loads(again.stdout)["summary"]["built"] == 0

    local = indextar("index", http.url("data-0.tar"), "--upload", "--index-dir", str(tmp_path))
    assert local.returncode == 1  # aiohttp's static files take no PUT: a clear error, no traceback
    assert "indextar: error:" in local.stderr and "Traceback" not in local.stderr


def test_index_s3_and_upload_next_to_the_shards(s3: SeaweedServer, tmp_path: Path) -> None:
    env = s3.environment()  # credentials from the environment, never on the command line
    result = indextar(
        "index",
        "s3://shards/data-{0..1}.tar",
        "--upload",
        "--index-dir",
        str(tmp_path / "a"),
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert "2 built" in result.stdout
    assert "indextar-test" not in result.stdout + result.stderr  # credentials never printed

    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **s3.storage_options())
    assert fs.exists("shards/data-0.tar.idx.sqlite") and fs.exists("shards/data-1.tar.idx.sqlite")

    # A fresh machine (empty index_dir) fetches the uploaded index instead of rebuilding.
    from indextar import IndexedTarDataset

    os.environ.update(env)
    try:
        ds = IndexedTarDataset(
            "s3://shards/data-{0..1}.tar", index_dir=tmp_path / "b", build_missing=False
        )
        assert len(ds) == 60 and ds[31]["__key__"] == "r1_000001"
    finally:
        for name in env:
            os.environ.pop(name, None)
