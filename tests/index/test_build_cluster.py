"""Builds on any executor: a real Dask LocalCluster over shards in the loopback S3 store.

Two worker processes (one thread each, TCP on 127.0.0.1) index the bucket's shards
into a shared folder; one damaged shard fails alone, named in the summary; the CLI's
``--dask`` does the same, and ``--retry-failed`` re-runs only the failure once it is
fixed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import sample_members, tar_bytes
from loopback_servers import SeaweedServer

from indextar import ShardFormatError, build_indexes
from indextar.index.build import iter_builds
from indextar.index.jobs import BuildOptions

distributed = pytest.importorskip("distributed", reason="the dask extra (in the test extra)")

SHARDS = 6
BAD = "data-3.tar"


@pytest.fixture(scope="module")
def s3_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("bucket")
    for n in range(SHARDS):
        data = tar_bytes(sample_members(20, prefix=f"s{n}_"))
        (root / f"data-{n}.tar").write_bytes(data[:5000] if f"data-{n}.tar" == BAD else data)
    return sorted(root.glob("*.tar"))


@pytest.fixture(scope="module")
def cluster(s3: SeaweedServer) -> Iterator[distributed.LocalCluster]:
    # The workers inherit the endpoint from the environment, as on a real cluster.
    saved = dict(os.environ)
    os.environ.update(s3.environment())
    try:
        with distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=None,
            # No dashboard, but the scheduler still serves HTTP, on 8787 unless told:
            # any free port, so that a second cluster on this host cannot fail the test.
            scheduler_kwargs={"dashboard_address": ":0"},
        ) as local:
            yield local
    finally:
        os.environ.clear()
        os.environ.update(saved)


URLS = [f"s3://shards/data-{n}.tar" for n in range(SHARDS)]


def test_a_local_cluster_builds_every_shard_but_the_damaged_one(
    cluster: distributed.LocalCluster, s3: SeaweedServer, tmp_path: Path
) -> None:
    options = BuildOptions(index_dir=str(tmp_path), storage_options=s3.storage_options())
    with distributed.Client(cluster) as client:
        outcomes = {o.shard: o for o in iter_builds(URLS, options, executor=client.get_executor())}
        workers = set(client.scheduler_info()["workers"])
    assert sorted(outcomes) == sorted(URLS) and len(workers) == 2
    failed = [url for url, o in outcomes.items() if not o.ok]
    assert failed == [f"s3://shards/{BAD}"]
    assert outcomes[failed[0]].error_type == "TruncatedShardError"
    good = [o for o in outcomes.values() if o.ok]
    assert all(o.built and o.scan == "stream" and o.index is not None for o in good)
    assert sum(o.index.meta.num_samples for o in good if o.index) == 20 * (SHARDS - 1)
    assert len(list(tmp_path.glob("*.idx.sqlite"))) == SHARDS - 1
    # build_indexes on the same executor: the first failure is raised, naming the shard.
    with distributed.Client(cluster) as client, pytest.raises(ShardFormatError, match=BAD):
        build_indexes(
            URLS,
            index_dir=tmp_path,
            executor=client.get_executor(),
            storage_options=s3.storage_options(),
        )


def test_the_cli_on_dask_and_retry_failed(
    cluster: distributed.LocalCluster, s3: SeaweedServer, tmp_path: Path
) -> None:
    env = {**os.environ, **s3.environment()}

    def index(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "indextar", "index", "s3://shards/data-{0..5}.tar",
             "--index-dir", str(tmp_path / "idx"), "--dask", cluster.scheduler_address,
             "--json-lines", *extra],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    first = index()
    assert first.returncode == 1
    lines = [json.loads(line) for line in first.stdout.splitlines()]
    assert lines[-1]["summary"]["failed"] == 1 and lines[-1]["summary"]["built"] == SHARDS - 1
    assert [line["shard"] for line in lines[:-1] if not line["ok"]] == [f"s3://shards/{BAD}"]
    listed = json.loads((tmp_path / "indextar-failed.json").read_text())["failed"]
    assert [entry["shard"] for entry in listed] == [f"s3://shards/{BAD}"]

    dry = index("--dry-run")
    plan = [json.loads(line) for line in dry.stdout.splitlines()]
    assert plan[-1]["summary"] == {  # the bucket's listing answers for the built ones
        "shards": SHARDS,
        "build": 1,
        "check": 0,
        "up to date": SHARDS - 1,
    }

    fixed = tmp_path / BAD
    fixed.write_bytes(tar_bytes(sample_members(20, prefix="s3_")))
    import s3fs

    s3fs.S3FileSystem(skip_instance_cache=True, **s3.storage_options()).put_file(
        str(fixed), f"shards/{BAD}"
    )
    again = index("--retry-failed")
    assert again.returncode == 0, again.stderr
    lines = [json.loads(line) for line in again.stdout.splitlines()]
    assert [line["shard"] for line in lines[:-1]] == [f"s3://shards/{BAD}"]
    assert lines[-1]["summary"]["built"] == 1
    assert not (tmp_path / "indextar-failed.json").exists()


def test_a_rerun_lists_the_folder_instead_of_a_request_per_shard(
    s3: SeaweedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import s3fs

    from indextar.index import build

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **s3.storage_options())
    fs.mkdir("listed")
    for n in range(3):
        fs.pipe(f"listed/x-{n}.tar", tar_bytes(sample_members(4, prefix=f"x{n}_")))
    urls = [f"s3://listed/x-{n}.tar" for n in range(3)]
    options = BuildOptions(index_dir=str(tmp_path), storage_options=s3.storage_options())
    assert all(o.built for o in iter_builds(urls, options, workers=1))

    def no_job(*args: object) -> None:
        raise AssertionError("a job was started for a fresh shard")

    with monkeypatch.context() as patched:
        patched.setattr(build, "build_shard", no_job)
        patched.setattr(build, "_run_on", no_job)
        again = list(iter_builds(urls, options, workers=2))
    assert [o.shard for o in again] == urls and not any(o.built for o in again)
    # The listing vouches for no option a remote job refuses: each job says why.
    for refused in (replace(options, meta="json"), replace(options, ignore_zeros=True)):
        outcomes = list(iter_builds(urls, refused, workers=1))
        assert all(o.error_type == "IndextarError" for o in outcomes), outcomes
        assert all("is for local shards" in (o.error or "") for o in outcomes)
    # A replaced object is listed with another ETag: its shard alone is built again.
    fs.pipe("listed/x-1.tar", tar_bytes(sample_members(5, prefix="y_")))
    third = {o.shard: o for o in iter_builds(urls, options, workers=1)}
    assert [url for url, o in third.items() if o.built] == [urls[1]]
    assert third[urls[1]].index is not None and third[urls[1]].index.meta.num_samples == 5
