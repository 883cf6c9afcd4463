"""Indexing at scale (issue 17): many shards, a cluster, remote shards scanned as they stream.

Measures, on data it writes itself:

* 10,000 small shards: a cold build in a process pool and on a Dask ``LocalCluster``
  (2 worker processes, 1 thread each, TCP on 127.0.0.1), side by side; then the
  all-fresh re-check (stat only, no pool) against the check before issue 17 (every
  index opened and fingerprinted in a process pool);
* 100,000 shards (hard links of one small shard and its index: distinct paths, a
  warm page cache, so this is the CPU cost per shard): the all-fresh re-check in the
  library and through ``indextar index``, ``write_manifest``, opening a dataset from
  the manifest, ``len`` and ``ds[i]`` with one shard's index loaded, and appending
  1,000 shards to the manifest;
* remote shards on the loopback S3 server (SeaweedFS): the streaming scan against
  copy-then-scan (the build before issue 17), and the bytes each scan fetched,
  including the ranged header scan of large members.

Run: ``.venv/bin/python tools/bench_scale.py`` (``--quick`` for a smoke run), or as
the ``scale`` section of ``tools/bench.py``.
"""

from __future__ import annotations

import argparse
import io
import mmap
import os
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import best_of, timed  # noqa: E402
from loopback_servers import SeaweedServer  # noqa: E402

Report = Callable[[str], None]


def write_tar(path: Path, members: dict[str, bytes]) -> None:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def small_shards(folder: Path, count: int) -> list[str]:
    rng = random.Random(0)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for n in range(count):
        members = {}
        for i in range(10):
            members[f"s{n:06d}_{i:02d}.jpg"] = rng.randbytes(1000)
            members[f"s{n:06d}_{i:02d}.cls"] = str(i).encode()
        path = folder / f"shard-{n:06d}.tar"
        write_tar(path, members)
        paths.append(str(path))
    return paths


# -- 10k shards: pool against LocalCluster, and the re-check ---------------------------------


def many_small(folder: Path, count: int, report: Report) -> dict[str, float]:
    from distributed import Client, LocalCluster

    from indextar.index.build import default_workers, iter_builds, parallel_map
    from indextar.index.jobs import BuildOptions
    from indextar.index.shard import open_index

    paths = small_shards(folder / "small", count)
    pool_dir, dask_dir = folder / "pool-ix", folder / "dask-ix"
    pool_s, outcomes = timed(
        lambda: list(iter_builds(paths, BuildOptions(index_dir=str(pool_dir)), workers=None))
    )
    assert all(o.built for o in outcomes)
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=None,
            scheduler_kwargs={"dashboard_address": ":0"},  # its HTTP server, not on 8787
        ) as cluster,
        Client(cluster) as client,
    ):
        executor = client.get_executor()
        options = BuildOptions(index_dir=str(dask_dir))
        dask_s, outcomes = timed(lambda: list(iter_builds(paths, options, executor=executor)))
    assert all(o.built for o in outcomes)
    recheck_s, outcomes = timed(
        lambda: list(iter_builds(paths, BuildOptions(index_dir=str(pool_dir)), workers=None))
    )
    assert not any(o.built for o in outcomes)

    def before() -> int:  # the check before issue 17: every index opened in a pool
        return sum(
            1 for _ in parallel_map(_open_one, paths, (str(pool_dir),), workers=default_workers())
        )

    before_s, _ = timed(before)
    one_s, _ = timed(lambda: [open_index(p, index_dir=pool_dir) for p in paths])
    report(f"{count:,} shards of 10 samples ({default_workers()} pool processes, 2 cores):")
    report("")
    report("| | seconds | shards/s | ratio |")
    report("| --- | ---: | ---: | ---: |")
    report(f"| cold build, process pool | {pool_s:.2f} | {count / pool_s:,.0f} | 1.00 |")
    report(
        f"| cold build, Dask LocalCluster (2 processes) | {dask_s:.2f} | {count / dask_s:,.0f} "
        f"| {pool_s / dask_s:.2f} |"
    )
    report(
        f"| all-fresh re-check (stat, no pool) | {recheck_s:.2f} | {count / recheck_s:,.0f} "
        f"| {before_s / recheck_s:.1f}x faster |"
    )
    report(f"| re-check before: open_index, pool | {before_s:.2f} | {count / before_s:,.0f} | |")
    report(f"| re-check before: open_index, 1 process | {one_s:.2f} | {count / one_s:,.0f} | |")
    report("")
    return {
        "pool_build_s": pool_s,
        "dask_build_s": dask_s,
        "recheck_s": recheck_s,
        "recheck_before_pool_s": before_s,
        "recheck_before_one_s": one_s,
    }


def _open_one(shard: str, index_dir: str) -> str:
    from indextar.index.shard import open_index

    return str(open_index(shard, index_dir=index_dir).path)


# -- 100k shards: re-check and manifests -------------------------------------------------------


def hundred_thousand(folder: Path, count: int, report: Report) -> dict[str, float]:
    import numpy as np

    import indextar
    from indextar.index.build import iter_builds
    from indextar.index.jobs import BuildOptions
    from indextar.index.manifest import append_to_manifest, write_manifest

    data = folder / "many"
    data.mkdir(parents=True, exist_ok=True)
    first = Path(small_shards(folder / "one", 1)[0])
    index = indextar.build_index(first)
    sources: list[tuple[Path, Path]] = []
    for n in range(count):
        if n % 50_000 == 0:  # a file takes at most 65,000 links on ext4: copies (mtimes kept)
            copy = folder / "one" / f"copy-{n}"
            copy.mkdir()
            shard_copy = Path(shutil.copy2(first, copy / first.name))
            sources.append((shard_copy, Path(shutil.copy2(index.path, copy / index.path.name))))
        shard_source, index_source = sources[-1]
        os.link(shard_source, data / f"shard-{n:07d}.tar")
        os.link(index_source, data / f"shard-{n:07d}.tar.idx.sqlite")
    paths = [str(data / f"shard-{n:07d}.tar") for n in range(count)]
    recheck_s, outcomes = timed(lambda: list(iter_builds(paths, BuildOptions(), workers=None)))
    assert len(outcomes) == count and not any(o.built for o in outcomes)
    cli_s, done = timed(
        lambda: subprocess.run(
            [sys.executable, "-m", "indextar", "index", str(data / "*.tar"), "-q"],
            capture_output=True,
            text=True,
        )
    )
    assert done.returncode == 0, done.stderr
    indexes = [o.index for o in outcomes]
    manifest = data / "dataset.json"
    write_s, _ = timed(lambda: write_manifest(manifest, indexes[:-1000]))
    append_s, _ = timed(lambda: append_to_manifest(manifest, indexes[-1000:]))
    open_s, ds = timed(lambda: indextar.IndexedTarDataset(str(manifest)))
    len_s, length = timed(lambda: len(ds))
    i = int(np.random.default_rng(0).integers(length))
    get_s, sample = timed(lambda: ds[i])
    assert sample["__key__"] and len(ds._open) == 1  # only that shard's index is loaded
    size_mb = manifest.stat().st_size / 1e6
    report(f"{count:,} shards (hard links of one shard and its index; warm page cache):")
    report("")
    report("| | seconds |")
    report("| --- | ---: |")
    report(f"| all-fresh re-check, iter_builds (no pool) | {recheck_s:.2f} |")
    report(f"| all-fresh re-check, `indextar index DIR/*.tar -q` | {cli_s:.2f} |")
    report(f"| write_manifest, {count - 1000:,} shards ({size_mb:.1f} MB) | {write_s:.2f} |")
    report(f"| append_to_manifest, 1,000 shards | {append_s:.3f} |")
    report(f"| IndexedTarDataset(manifest) | {open_s:.2f} |")
    report(f"| len(ds) | {len_s:.6f} |")
    report(f"| ds[i], the first read (opens one shard's index) | {get_s:.4f} |")
    report("")
    ds.close()
    return {
        "recheck_100k_s": recheck_s,
        "cli_recheck_100k_s": cli_s,
        "write_manifest_s": write_s,
        "append_1000_s": append_s,
        "open_manifest_s": open_s,
        "first_get_s": get_s,
    }


# -- remote: streaming scan against copy-then-scan ----------------------------------------------


def copy_then_scan(url: str, storage_options: dict[str, Any], scratch: Path) -> int:
    """The remote build before issue 17, as it was: the whole shard copied to a
    temporary file, mapped, scanned and fingerprinted, the copy deleted, the index written."""
    from indextar.index.meta import IndexMeta, fingerprint
    from indextar.index.naming import group_members
    from indextar.index.remote import remote_index_path
    from indextar.index.tables import write_index
    from indextar.source.remote import RangeSource
    from indextar.source.stream import RemoteStream
    from indextar.tar.scan import scan_tar

    stat = RangeSource(url, storage_options=storage_options).stat()
    source = RangeSource(url, expected=stat, storage_options=storage_options)
    fd, name = tempfile.mkstemp(dir=scratch)
    try:
        with os.fdopen(fd, "wb") as f, RemoteStream(source) as stream:
            shutil.copyfileobj(stream, f, 1 << 20)
        with open(name, "rb") as copy, mmap.mmap(copy.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            scan = scan_tar(mm, shard=url)
            content_fingerprint = fingerprint(mm, stat.size)
        grouping = group_members(scan, shard=url)
    finally:
        os.unlink(name)
    meta = IndexMeta.describe(
        scan,
        grouping,
        shard_name=url,
        shard_size=stat.size,
        shard_mtime_ns=0,
        fingerprint=content_fingerprint,
        etag=stat.etag,
    )
    write_index(remote_index_path(url, scratch), meta, scan, grouping)
    return len(grouping.keys)


def remote(folder: Path, shard_mb: int, report: Report) -> dict[str, float]:
    from indextar.index.remote import scan_remote_shard

    rng = random.Random(1)
    served = folder / "served"
    served.mkdir(parents=True, exist_ok=True)
    per_member = {"web.tar": 100 << 10, "k256.tar": 256 << 10, "video.tar": 8 << 20}
    for name, size in per_member.items():
        count = max(2, (shard_mb << 20) // size)
        members = {}
        for i in range(count // 2):
            members[f"k{i:06d}.json"] = b"{}"
            members[f"k{i:06d}.bin"] = rng.randbytes(size)
        write_tar(served / name, members)
    scratch = folder / "scratch"
    scratch.mkdir(exist_ok=True)
    out: dict[str, float] = {}
    with SeaweedServer(folder / "seaweed") as s3:
        s3.upload("bench", sorted(served.glob("*.tar")))
        options = s3.storage_options()
        url = "s3://bench/web.tar"
        size = (served / "web.tar").stat().st_size
        copy_s, _ = best_of(lambda: copy_then_scan(url, options, scratch), 3)
        stream_s, _ = best_of(
            lambda: scan_remote_shard(
                url, index_dir=folder / "rix", storage_options=options, mode="stream"
            ),
            3,
        )
        report(f"One {size / 1e6:.0f} MB shard of 100 KiB members on the loopback S3 server:")
        report("")
        report("| | seconds | MB/s | ratio | temporary disk |")
        report("| --- | ---: | ---: | ---: | ---: |")
        report(f"| copy-then-scan (before) | {copy_s:.2f} | {size / copy_s / 1e6:,.0f} | 1.00 "
               f"| {size / 1e6:.0f} MB |")  # fmt: skip
        report(f"| streaming scan | {stream_s:.2f} | {size / stream_s / 1e6:,.0f} "
               f"| {copy_s / stream_s:.2f} | 0 |")  # fmt: skip
        report("")
        report("Bytes each remote build fetched:")
        report("")
        report("| shard | member size | mode | fetched | of the shard | seconds |")
        report("| --- | ---: | --- | ---: | ---: | ---: |")
        for name, member in per_member.items():
            shard_size = (served / name).stat().st_size
            for mode in ("auto", "stream", "ranged"):
                start = time.perf_counter()
                build = scan_remote_shard(
                    f"s3://bench/{name}",
                    index_dir=folder / f"rix-{mode}",
                    storage_options=options,
                    mode=mode,  # type: ignore[arg-type]
                )
                seconds = time.perf_counter() - start
                share = build.bytes_fetched / shard_size
                report(
                    f"| {name} ({shard_size / 1e6:.0f} MB) | {member >> 10:,} KiB | {mode} -> "
                    f"{build.mode} | {build.bytes_fetched / 1e6:,.2f} MB | {share:.2%} "
                    f"| {seconds:.2f} |"
                )
                out[f"{name}:{mode}:fetched"] = share
        report("")
        out.update(remote_recheck(folder, s3, 100 if shard_mb < 64 else 2_000, report))
    out.update(copy_then_scan_s=copy_s, streaming_scan_s=stream_s)
    return out


def remote_recheck(folder: Path, s3: SeaweedServer, count: int, report: Report) -> dict[str, float]:
    """A re-run over ``count`` indexed remote shards: by one listing against a request each."""
    import s3fs

    from indextar.index import build as builds
    from indextar.index.build import iter_builds
    from indextar.index.jobs import BuildOptions

    options = s3.storage_options()
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
    fs.mkdir("many")
    shard = folder / "small-remote.tar"
    write_tar(shard, {f"k{i:03d}.cls": str(i).encode() for i in range(10)})
    data = shard.read_bytes()
    urls = [f"s3://many/shard-{n:06d}.tar" for n in range(count)]
    fs.pipe({url.removeprefix("s3://"): data for url in urls})
    build = BuildOptions(index_dir=str(folder / "many-ix"), storage_options=options)
    cold_s, outcomes = timed(lambda: list(iter_builds(urls, build, workers=None)))
    assert all(o.built for o in outcomes)
    listed_s, outcomes = timed(lambda: list(iter_builds(urls, build, workers=None)))
    assert not any(o.built for o in outcomes)
    listing = builds.fresh_by_listing
    builds.fresh_by_listing = lambda urls, options: {}  # type: ignore[assignment]
    try:  # the check before: one metadata request per shard, in the pool
        each_s, outcomes = timed(lambda: list(iter_builds(urls, build, workers=None)))
    finally:
        builds.fresh_by_listing = listing  # type: ignore[assignment]
    assert not any(o.built for o in outcomes)
    report(f"{count:,} small remote shards on the loopback S3 server:")
    report("")
    report("| | seconds | shards/s |")
    report("| --- | ---: | ---: |")
    report(f"| cold build (streamed, pool) | {cold_s:.2f} | {count / cold_s:,.0f} |")
    report(f"| all-fresh re-check by listing | {listed_s:.2f} | {count / listed_s:,.0f} |")
    report(f"| all-fresh re-check, a request each (pool) | {each_s:.2f} | {count / each_s:,.0f} |")
    report("")
    return {
        "remote_cold_s": cold_s,
        "remote_recheck_listed_s": listed_s,
        "remote_recheck_each_s": each_s,
    }


PARTS = ("small", "manifest", "remote")


def run(
    report: Report = print, quick: bool = False, parts: tuple[str, ...] = PARTS
) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="indextar-scale-", dir=os.environ.get("BENCH_TMP")))
    try:
        results: dict[str, Any] = {}
        if "small" in parts:
            results["small"] = many_small(folder, 300 if quick else 10_000, report)
        if "manifest" in parts:
            results["manifest"] = hundred_thousand(folder, 3_000 if quick else 100_000, report)
        if "remote" in parts:
            results["remote"] = remote(folder, 8 if quick else 256, report)
        return results
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("parts", nargs="*", help=f"which of {', '.join(PARTS)} (default: all)")
    args = parser.parse_args()
    unknown = set(args.parts) - set(PARTS)
    if unknown:
        parser.error(f"unknown parts {sorted(unknown)}; choose from {', '.join(PARTS)}")
    run(quick=args.quick, parts=tuple(args.parts) or PARTS)


if __name__ == "__main__":
    main()
