"""Mosaic streaming and LitData rows for tools/bench_remote.py: the same samples
converted to their formats, in the same S3 bucket, read through the same proxy.

Both come from the ``bench`` extra. Where their dependencies pull in a torchvision
that does not match the installed torch, or none (Mosaic's package ``__init__`` imports
its vision datasets), Mosaic's ``streaming.base`` is imported without that ``__init__``:
the reader measured is the same.
"""

from __future__ import annotations

import importlib.util
import logging
import multiprocessing
import os
import sys
import tarfile
import tempfile
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

BUCKET = "bench"
MOSAIC = "mds"
LITDATA = "litdata"
KEYS = {"AWS_ACCESS_KEY_ID": "indextar-test", "AWS_SECRET_ACCESS_KEY": "indextar-test"}
log = logging.getLogger("bench_remote")


def _samples(paths: list[Path]) -> Iterator[tuple[bytes, int]]:
    """Each sample's ``(jpg bytes, class)``, in shard order."""
    for path in paths:
        with tarfile.open(path) as tf:
            jpg = b""
            for member in tf:
                data = tf.extractfile(member).read()  # type: ignore[union-attr]
                if member.name.endswith(".jpg"):
                    jpg = data
                else:
                    yield jpg, int(data)


def import_mosaic() -> Any:
    """Mosaic's ``streaming.base`` (the readers and writers)."""
    try:
        import streaming.base
    except (RuntimeError, ImportError):  # its vision module's torchvision: absent, or not torch's
        spec = importlib.util.find_spec("streaming")
        if spec is None or spec.submodule_search_locations is None:
            raise
        for name in [m for m in sys.modules if m == "streaming" or m.startswith("streaming.")]:
            del sys.modules[name]
        package = types.ModuleType("streaming")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["streaming"] = package
        import streaming.base
    return streaming.base


def _litdata_sample(sample: tuple[bytes, int]) -> dict[str, Any]:
    return {"jpg": sample[0], "cls": sample[1]}


def _upload(server: Any, folder: Path, prefix: str) -> None:
    """Every file under ``folder`` into the bucket under ``prefix``: by S3 PUTs, or where
    the store is a folder (tools/nginx_store.py), by its own ``put``."""
    files = sorted(path for path in folder.rglob("*") if path.is_file())
    keys = [f"{BUCKET}/{prefix}/{path.relative_to(folder)}" for path in files]
    if hasattr(server, "put"):
        for path, key in zip(files, keys, strict=True):
            server.put(path, key)
        return
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **server.storage_options())
    for path, key in zip(files, keys, strict=True):
        fs.put_file(str(path), key)


def prepare_peers(folder: Path, paths: list[Path], seaweed: Any) -> None:
    """Convert the shards to Mosaic's MDS and LitData's chunks (each about a tar's size)
    and upload them; a peer that is not installed is skipped."""
    shard_bytes = paths[0].stat().st_size + (1 << 20)
    try:
        mosaic = import_mosaic()
        with mosaic.MDSWriter(
            out=str(folder / MOSAIC), columns={"jpg": "bytes", "cls": "int"},
            size_limit=shard_bytes,
        ) as writer:  # fmt: skip
            for jpg, cls in _samples(paths):
                writer.write({"jpg": jpg, "cls": cls})
        _upload(seaweed, folder / MOSAIC, MOSAIC)
    except ImportError as e:
        log.warning("Mosaic streaming is not installed (%s): its row is skipped", e)
    start_method = multiprocessing.get_start_method(allow_none=True)
    try:
        from litdata import optimize

        optimize(
            fn=_litdata_sample, inputs=list(_samples(paths)), output_dir=str(folder / LITDATA),
            chunk_bytes=shard_bytes, num_workers=1, mode="overwrite",
        )  # fmt: skip
        # optimize() sets the start method to spawn for the whole process; the other
        # rows' DataLoader workers are measured under the platform's default (fork)
        multiprocessing.set_start_method(start_method, force=True)
        _upload(seaweed, folder / LITDATA, LITDATA)
    except ImportError as e:
        log.warning("LitData is not installed (%s): its row is skipped", e)


def mosaic_streaming(store: Any, mark: Callable[[], None]) -> int:
    mosaic = import_mosaic()
    os.environ.update(KEYS, S3_ENDPOINT_URL=store.endpoint)
    if store.tls is not None:  # --tls: boto3 trusts the front's certificate
        os.environ["AWS_CA_BUNDLE"] = str(store.tls.ca)
    mosaic.util.clean_stale_shared_memory()
    with tempfile.TemporaryDirectory(dir=store.work) as local:
        ds = mosaic.StreamingDataset(
            remote=f"s3://{BUCKET}/{MOSAIC}", local=local, shuffle=True, shuffle_seed=0,
            batch_size=64,
        )  # fmt: skip
        done = 0
        for _ in ds:
            mark()
            done += 1
        return done


def litdata_streaming(store: Any, mark: Callable[[], None]) -> int:
    from litdata import StreamingDataset
    from litdata.streaming import downloader

    # its obstore chunk downloads take their client options from this table only
    downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = "true"  # type: ignore[index]
    if store.tls is not None:  # --tls: the front's certificate is its own CA
        downloader._OBSTORE_CLIENT_OPTIONS["allow_invalid_certificates"] = "true"
        os.environ["AWS_CA_BUNDLE"] = str(store.tls.ca)

    options = {
        "endpoint_url": store.endpoint,
        "aws_access_key_id": KEYS["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": KEYS["AWS_SECRET_ACCESS_KEY"],
        "region_name": "us-east-1",
    }
    with tempfile.TemporaryDirectory(dir=store.work) as cache:
        ds = StreamingDataset(
            f"s3://{BUCKET}/{LITDATA}", cache_dir=cache, shuffle=True, seed=0,
            storage_options=options,
        )  # fmt: skip
        done = 0
        for _ in ds:
            mark()
            done += 1
        return done


def peer_rows() -> list[tuple[str, Callable[[Any, Callable[[], None]], int]]]:
    rows: list[tuple[str, Callable[[Any, Callable[[], None]], int]]] = []
    try:
        import_mosaic()
        rows.append(("Mosaic streaming (shuffle=True, whole-shard downloads)", mosaic_streaming))
    except ImportError:
        pass
    if importlib.util.find_spec("litdata") is not None:
        rows.append(("LitData (shuffle=True, chunk downloads)", litdata_streaming))
    return rows
