"""The CLI on URLs: HTTP and S3 (SeaweedFS) on 127.0.0.1: `indextar index` and --upload;
info, ls, cat, get, verify, reshard, export, meta import and query through its indexes."""

from __future__ import annotations

import gzip
import json
import os
import sqlite3
import tarfile
from pathlib import Path
from subprocess import CompletedProcess

import pytest
from conftest import sample_members, tar_bytes
from ddpjob import run_module
from loopback_servers import HttpServer, SeaweedServer

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("served")
    for shard in range(2):
        members = sample_members(30, exts=("jpg", "cls"), prefix=f"r{shard}_")
        (folder / f"data-{shard}.tar").write_bytes(tar_bytes(members, "gnu"))
    return folder


@pytest.fixture(scope="module")
def http_root(served: Path) -> Path:
    return served


@pytest.fixture(scope="module")
def s3_files(served: Path) -> list[Path]:
    return [served / f"data-{shard}.tar" for shard in range(2)]


# What `python -m indextar` imports on URLs: once, in the zygote each call forks from.
CLI_IMPORTS = ("indextar", "indextar.cli.commands", "fsspec", "s3fs", "aiohttp")


def indextar_bytes(*args: str, env: dict[str, str] | None = None) -> CompletedProcess[bytes]:
    """``python -m indextar *args``, a process of its own forked from a zygote
    (tests/_rank_zygote.py) that imported the CLI once: 1 s of CPU less a call."""
    full_env = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    return run_module("indextar", list(args), full_env, imports=CLI_IMPORTS)


def indextar(*args: str, env: dict[str, str] | None = None) -> CompletedProcess[str]:
    done = indextar_bytes(*args, env=env)
    return CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())


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


# -- info, ls, cat, get, verify, meta import on URLs -------------------------------------


def _cache_env(tmp_path: Path) -> dict[str, str]:
    """A private default cache, so the default index folder is the test's own."""
    return {"XDG_CACHE_HOME": str(tmp_path / "cache")}


def test_inspect_http_urls_through_the_default_index_folder(
    http: HttpServer, served: Path, tmp_path: Path
) -> None:
    members = sample_members(4, exts=("txt", "cls"), prefix="h_")
    (served / "inspect.tar").write_bytes(tar_bytes(members, "pax"))
    url, env = http.url("inspect.tar"), _cache_env(tmp_path)

    missing = indextar("info", url, env=env)  # not indexed yet: said so, nothing built
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert f"remote shard {url!r} has no index" in missing.stderr
    assert f"`indextar index {url}`" in missing.stderr
    assert not (tmp_path / "cache" / "indextar" / "indexes").exists()

    assert indextar("index", url, "-q", env=env).returncode == 0  # RemoteOptions' folder
    (index_file,) = (tmp_path / "cache" / "indextar" / "indexes").glob("inspect.tar.*.idx.sqlite")

    info = indextar("info", url, "--json", env=env)
    assert info.returncode == 0, info.stderr
    (summary,) = json.loads(info.stdout)
    assert (summary["shard"], summary["index"]) == (url, str(index_file))
    assert (summary["samples"], summary["members"]) == (4, 8)
    assert summary["shard_bytes"] == (served / "inspect.tar").stat().st_size

    listed = indextar("ls", url, "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    assert [row["key"] for row in json.loads(listed.stdout)] == [f"h_{i:06d}" for i in range(4)]
    assert json.loads(listed.stdout)[2]["members"] == {"txt": 3 * len("h_2-txt"), "cls": 21}

    cat = indextar_bytes("cat", url, "h_000002.txt", env=env)
    assert cat.returncode == 0 and cat.stdout == members["h_000002.txt"]

    got = indextar("get", url, "-1", "--json", env=env)
    assert got.returncode == 0, got.stderr
    described = json.loads(got.stdout)
    assert (described["key"], described["index"], described["shard"]) == ("h_000003", 3, url)
    assert described["members"][0]["head"] == members["h_000003.txt"].decode()

    verified = indextar("verify", url, "--json", "-q", env=env)
    assert verified.returncode == 0, verified.stderr
    assert json.loads(verified.stdout) == [{"shard": url, "ok": True, "error": None}]

    # A wrong row in the index: verify reads the object again and says where they differ.
    with sqlite3.connect(index_file) as conn:
        conn.execute("UPDATE members SET size = size + 1 WHERE member_id = 5")
    wrong = indextar("verify", url, env=env)
    assert wrong.returncode == 1 and "Traceback" not in wrong.stderr
    assert f"{url!r}: index does not match the shard: member 5: index has" in wrong.stderr

    # The object replaced: every command refuses the index, naming the URL.
    (served / "inspect.tar").write_bytes(tar_bytes(sample_members(5, ("txt",), "n_"), "pax"))
    for command in (("verify", url), ("info", url), ("get", url, "0")):
        stale = indextar(*command, env=env)
        assert stale.returncode == 1 and "Traceback" not in stale.stderr, command
        assert f"remote shard {url!r} changed since it was indexed" in stale.stderr, command
        assert f"`indextar index {url}` rebuilds it" in stale.stderr, command


def test_inspect_a_remote_tar_gz(http: HttpServer, served: Path, tmp_path: Path) -> None:
    members = sample_members(6, exts=("txt",), prefix="g_")
    (served / "packed.tar.gz").write_bytes(gzip.compress(tar_bytes(members, "gnu"), mtime=0))
    url = http.url("packed.tar.gz")
    folder = str(tmp_path / "indexes")
    assert indextar("index", url, "-q", "--index-dir", folder).returncode == 0

    info = indextar("info", url, "--index-dir", folder, "--json")
    (summary,) = json.loads(info.stdout)
    assert (summary["compression"], summary["samples"]) == ("gzip", 6)
    cat = indextar("cat", url, "g_000004.txt", "--index-dir", folder)
    assert cat.returncode == 0 and cat.stdout == members["g_000004.txt"].decode()
    verified = indextar("verify", url, "--index-dir", folder)
    assert verified.returncode == 0, verified.stderr
    assert "verified 1 of 1 shard: all OK" in verified.stdout

    # The same file on disk: cat and get read its tar's bytes too, not the gzip stream's.
    local = str(served / "packed.tar.gz")
    assert indextar("index", local, "-q").returncode == 0
    assert indextar("cat", local, "g_000004.txt").stdout == members["g_000004.txt"].decode()
    got = json.loads(indextar("get", local, "5", "--json").stdout)
    assert got["members"][0]["head"] == members["g_000005.txt"].decode()


def test_inspect_s3_urls_from_an_uploaded_index(s3: SeaweedServer, tmp_path: Path) -> None:
    import s3fs

    members = sample_members(5, exts=("txt",), prefix="s_")
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **s3.storage_options())
    fs.pipe_file("shards/inspect/s.tar", tar_bytes(members, "gnu"))
    url, env = "s3://shards/inspect/s.tar", s3.environment()
    built = indextar("index", url, "--upload", "--index-dir", str(tmp_path / "a"), "-q", env=env)
    assert built.returncode == 0, built.stderr

    # Another machine: its default index folder is empty; the sidecar is fetched.
    env |= _cache_env(tmp_path)
    listed = indextar("ls", url, env=env)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[1] == f"s_000001\ttxt:{len(members['s_000001.txt'])}"
    assert len(list((tmp_path / "cache" / "indextar" / "indexes").glob("s.tar.*"))) == 1
    got = indextar("get", url, "4", "--json", env=env)
    assert json.loads(got.stdout)["members"][0]["head"] == members["s_000004.txt"].decode()
    verified = indextar("verify", url, "-q", env=env)
    assert verified.returncode == 0 and verified.stderr == "", verified.stderr

    missing = indextar("info", "s3://shards/inspect/none.tar", env=env)
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert "remote shard 's3://shards/inspect/none.tar'" in missing.stderr


def test_reshard_export_and_import_from_http_urls(http: HttpServer, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pattern, folder = http.url("data-{0..1}.tar"), str(tmp_path / "indexes")
    urls = [http.url(f"data-{n}.tar") for n in range(2)]
    assert indextar("index", pattern, "-q", "--index-dir", folder).returncode == 0

    out = tmp_path / "out-%02d.tar"
    copied = indextar("reshard", pattern, str(out), "--index-dir", folder, "-q")
    assert copied.returncode == 0, copied.stderr
    with tarfile.open(tmp_path / "out-00.tar") as tf:
        assert len(tf.getnames()) == 120
        data = tf.extractfile("r1_000002.jpg")
        assert data is not None and data.read() == b"r1_2-jpg" * 3

    wids = tmp_path / "wids.json"
    exported = indextar("export", "--wids", str(wids), pattern, "--index-dir", folder, "-q")
    assert exported.returncode == 0, exported.stderr
    assert [entry["url"] for entry in json.loads(wids.read_text())["shardlist"]] == urls

    table = tmp_path / "scores.parquet"
    pq.write_table(pa.table({"key": ["r0_000003", "r0_000007"], "score": [5, 1]}), table)
    imported = indextar("meta", "import", str(table), urls[0], "--index-dir", folder)
    assert imported.returncode == 0, imported.stderr
    selected = indextar("query", urls[0], "--where", "score > 2", "--keys", "--index-dir", folder)
    assert selected.stdout.split() == ["r0_000003"]
