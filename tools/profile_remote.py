"""Where a remote ranged read's client CPU goes (issue 25): clients side by side.

One shard of ``--samples`` samples of 100 KB goes into SeaweedFS's S3 gateway and an
aiohttp file server, each behind ``DelayProxy`` (``--delay-ms``, default 0 and 20).
Each client then fetches the same spans in one random order, ``--in-flight`` (64, a
batch) at once, and we report wall time and the process's CPU per request (all its
threads: s3fs runs its own event loop thread), after a warm-up of 64 requests that
pays the imports and the first client's set-up:

* aiohttp GETs, unsigned; with S3 SigV4 headers from botocore's ``S3SigV4Auth``; with
  SigV4 computed by the small signer below (the signing key cached per day);
* obstore ``get_range_async`` (Rust, signs itself);
* s3fs ``cat_ranges`` and fsspec HTTP ``cat_ranges`` (fsspec's own batching);
* indextar's path today: ``RangeSource.read_many`` (fsspec's loop, a conditional
  ``get_object`` per span through aiobotocore for S3, ``session.get`` for HTTP).

Signing alone is timed without I/O (10,000 requests each). ``--py-spy FILE`` instead
profiles ``IndexedTarDataset.__getitems__`` (0 workers, batches of 64, S3) under
``py-spy record --format raw`` and prints the share of samples per library.

Run: ``python tools/profile_remote.py [--delay-ms 0 20] [--py-spy /tmp/iid.txt]``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import hashlib
import hmac
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_remote import BUCKET, sample_spans, write_shards  # noqa: E402
from loopback_servers import DelayProxy, HttpServer, SeaweedServer  # noqa: E402

KEY, SECRET, REGION = "indextar-test", "indextar-test", "us-east-1"
Spans = list[tuple[int, int]]


class SigV4:
    """S3 SigV4 headers for a GET with an unsigned payload; the day's key is cached."""

    def __init__(self, key: str, secret: str, region: str):
        self.key, self.secret, self.region = key, secret, region
        self._day = ""
        self._signing_key = b""

    def headers(
        self, host: str, path: str, extra: dict[str, str], *,
        payload: str = "UNSIGNED-PAYLOAD", now: datetime.datetime | None = None,
    ) -> dict[str, str]:  # fmt: skip
        now = now or datetime.datetime.now(datetime.timezone.utc)
        stamp, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
        if day != self._day:
            k = hmac.digest(b"AWS4" + self.secret.encode(), day.encode(), "sha256")
            for part in (self.region, "s3", "aws4_request"):
                k = hmac.digest(k, part.encode(), "sha256")
            self._day, self._signing_key = day, k
        headers = {
            "host": host, "x-amz-content-sha256": payload, "x-amz-date": stamp,
            **{k.lower(): v for k, v in extra.items()},
        }  # fmt: skip
        names = sorted(headers)
        canonical = "\n".join(
            ["GET", path, "", *(f"{n}:{headers[n]}" for n in names), "", ";".join(names),
             payload]
        )  # fmt: skip
        scope = f"{day}/{self.region}/s3/aws4_request"
        to_sign = (
            f"AWS4-HMAC-SHA256\n{stamp}\n{scope}\n" + hashlib.sha256(canonical.encode()).hexdigest()
        )
        signature = hmac.new(self._signing_key, to_sign.encode(), "sha256").hexdigest()
        headers["authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={self.key}/{scope}, "
            f"SignedHeaders={';'.join(names)}, Signature={signature}"
        )
        del headers["host"]
        return headers


def botocore_headers(url: str, extra: dict[str, str]) -> dict[str, str]:
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    request = AWSRequest("GET", url, headers=dict(extra))
    S3SigV4Auth(Credentials(KEY, SECRET), "s3", REGION).add_auth(request)
    return dict(request.headers.items())


def aiohttp_client(sign: str) -> Callable[[str, str, Spans, int], int]:
    def run(base: str, name: str, spans: Spans, in_flight: int) -> int:
        import aiohttp

        signer = SigV4(KEY, SECRET, REGION)
        host, path = base.split("//")[1].split("/")[0], f"/{BUCKET}/{name}"

        async def go() -> int:
            limit = asyncio.Semaphore(in_flight)
            async with aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=in_flight)
            ) as session:

                async def one(offset: int, length: int) -> int:
                    headers = {"Range": f"bytes={offset}-{offset + length - 1}"}
                    url = f"{base}/{name}"
                    if sign == "botocore":
                        headers = botocore_headers(url, headers)
                    elif sign == "hand":
                        headers = signer.headers(host, path, headers)
                    async with limit, session.get(url, headers=headers) as r:
                        r.raise_for_status()
                        return len(await r.read())

                return sum(await asyncio.gather(*(one(o, n) for o, n in spans)))

        return asyncio.run(go())

    return run


def obstore_client(base: str, name: str, spans: Spans, in_flight: int) -> int:
    import obstore
    from obstore.store import S3Store

    endpoint = base.rsplit("/", 1)[0]
    store = S3Store(
        BUCKET, endpoint=endpoint, access_key_id=KEY, secret_access_key=SECRET, region=REGION,
        virtual_hosted_style_request=False, client_options={"allow_http": True},
    )  # fmt: skip

    async def go() -> int:
        limit = asyncio.Semaphore(in_flight)

        async def one(offset: int, length: int) -> int:
            async with limit:
                return len(await obstore.get_range_async(store, name, start=offset, length=length))

        return sum(await asyncio.gather(*(one(o, n) for o, n in spans)))

    return asyncio.run(go())


def _options(base: str) -> dict[str, Any]:
    return {
        "key": KEY, "secret": SECRET, "endpoint_url": base.rsplit("/", 1)[0],
        "client_kwargs": {"region_name": REGION}, "skip_instance_cache": True,
    }  # fmt: skip


def fsspec_cat_ranges(base: str, name: str, spans: Spans, in_flight: int) -> int:
    import fsspec

    if base.endswith(BUCKET):  # fsspec's instance cache: the warm-up's client is reused
        options = _options(base)
        options.pop("skip_instance_cache")
        fs, path = fsspec.filesystem("s3", **options), f"{BUCKET}/{name}"
    else:
        fs, path = fsspec.filesystem("http"), f"{base}/{name}"
    got = fs.cat_ranges(
        [path] * len(spans), [o for o, _ in spans], [o + n for o, n in spans],
        batch_size=in_flight,
    )  # fmt: skip
    return sum(map(len, got))


def indextar_read_many(base: str, name: str, spans: Spans, in_flight: int) -> int:
    from indextar.source.remote import RangeSource

    if base.endswith(BUCKET):
        url, options = f"s3://{BUCKET}/{name}", _options(base)
        options.pop("skip_instance_cache")
    else:
        url, options = f"{base}/{name}", None
    source = RangeSource(url, storage_options=options, max_in_flight=in_flight)
    source.stat()  # the per-process HEAD, as a dataset's first read pays it
    total = 0
    for i in range(0, len(spans), in_flight):  # one batch at a time, as today
        batch = spans[i : i + in_flight]
        total += sum(map(len, source.read_many([o for o, _ in batch], [n for _, n in batch])))
    return total


CLIENTS: dict[str, tuple[str, Callable[[str, str, Spans, int], int]]] = {
    "aiohttp, unsigned": ("s3", aiohttp_client("none")),
    "aiohttp + SigV4 by hand": ("s3", aiohttp_client("hand")),
    "aiohttp + botocore S3SigV4Auth": ("s3", aiohttp_client("botocore")),
    "obstore get_range_async": ("s3", obstore_client),
    "s3fs cat_ranges": ("s3", fsspec_cat_ranges),
    "indextar RangeSource.read_many (S3)": ("s3", indextar_read_many),
    "aiohttp (HTTP server)": ("http", aiohttp_client("none")),
    "fsspec HTTP cat_ranges": ("http", fsspec_cat_ranges),
    "indextar RangeSource.read_many (HTTP)": ("http", indextar_read_many),
}


def signing_cost() -> list[str]:
    signer, n = SigV4(KEY, SECRET, REGION), 10_000
    extra = {"Range": "bytes=0-99999", "If-Match": '"abc"'}
    rows = []
    for what, sign in (
        ("SigV4 by hand", lambda: signer.headers("127.0.0.1:1", "/b/k", extra)),
        ("botocore S3SigV4Auth", lambda: botocore_headers("http://127.0.0.1:1/b/k", extra)),
    ):
        start = time.process_time()
        for _ in range(n):
            sign()
        cost = (time.process_time() - start) / n * 1e6
        rows.append(f"| signing alone: {what} | | {cost:.0f} us |")
    return rows


def py_spy(out: Path, s3: str, names: list[str], per_shard: int, index_dir: Path) -> None:
    """py-spy every thread of a 0-worker i.i.d. read (batches of 64) into ``out``."""
    script = f"""
import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})
from profile_remote import _options
from indextar import IndexedTarDataset, ResumableSampler
options = _options({s3!r}); options.pop("skip_instance_cache")
ds = IndexedTarDataset({[f"s3://{BUCKET}/{n}" for n in names]!r}, index_dir={str(index_dir)!r},
                       storage_options=options)
order = list(ResumableSampler(ds, seed=0))
for i in range(0, len(order), 64):
    ds.__getitems__(order[i:i + 64])
"""
    subprocess.run(
        ["py-spy", "record", "-r", "250", "-f", "raw", "-o", str(out), "--", sys.executable,
         "-c", script], check=True, capture_output=True,
    )  # fmt: skip
    shares(out)


IDLE = ("EpollSelector.select", "Condition.wait", "_worker (concurrent", "Lock.acquire", "sleep")
# (substring of a frame's file, what it is), the first match from the leaf up names
# the code a busy sample is charged to: its own work plus the stdlib it calls
OWNERS = [
    ("botocore/auth.py", "botocore: SigV4 signing"),
    ("botocore/hooks.py", "botocore: event hooks"),
    ("aiobotocore/hooks.py", "botocore: event hooks"),
    ("botocore/parsers.py", "botocore: response parsing"),
    ("botocore/validate.py", "botocore: parameter validation"),
    ("botocore/serialize.py", "botocore: request serialization"),
    ("botocore/useragent.py", "botocore: user agent string"),
    ("botocore/regions.py", "botocore: endpoint rules"),
    ("botocore/endpoint_provider.py", "botocore: endpoint rules"),
    ("aiobotocore/", "aiobotocore: other (client, endpoint, response)"),
    ("botocore/", "botocore: other (request objects, handlers)"),
    ("s3fs/", "s3fs"),
    ("fsspec/", "fsspec"),
    ("aiohttp/", "aiohttp (HTTP client)"),
    ("multidict/", "aiohttp (HTTP client)"),
    ("yarl/", "aiohttp (HTTP client)"),
    ("asyncio/", "asyncio (event loop, transports)"),
    ("indextar/", "indextar's own code"),
    ("threading.py", "thread hand-offs"),
    ("concurrent/", "thread hand-offs"),
]


def owner(frames: list[str]) -> str:
    if any("_find_and_load" in f for f in frames):
        return "imports (start-up)"
    for frame in reversed(frames):
        for part, name in OWNERS:
            if f"({part}" in frame or f"/{part}" in frame:
                return name
    return "other (stdlib, torch)"


def shares(out: Path) -> None:
    """Print where the busy samples go (not those waiting in select, a lock or an idle
    pool thread): each is charged to the innermost library on its stack (OWNERS)."""
    owners: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    busy = idle = 0
    for line in out.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n, frames = int(count), stack.split(";")
        if not frames[-1].strip() or frames[-1].startswith(IDLE):
            idle += n
            continue
        busy += n
        owners[owner(frames)] += n
        if owner(frames) != "imports (start-up)":
            leaves[frames[-1]] += n
    start_up = owners.pop("imports (start-up)", 0)
    busy -= start_up
    print(f"py-spy: {busy} busy samples after start-up ({start_up} in imports), {idle} waiting")
    for name, n in owners.most_common():
        print(f"| {name} | {n / busy:.1%} |")
    for leaf, n in leaves.most_common(12):
        print(f"  leaf {n / busy:6.1%} {leaf}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--delay-ms", type=float, nargs="+", default=[0, 20])
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--py-spy", type=Path, help="profile the i.i.d. path into this file")
    parser.add_argument(
        "--only", default="", help="only clients whose name contains one of these, comma-separated"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (path,) = write_shards(folder, 1, args.samples, 100_000)
        spans = sample_spans(path)
        random.Random(0).shuffle(spans)
        with SeaweedServer(folder / "seaweed") as seaweed, HttpServer(folder) as http:
            seaweed.upload(BUCKET, [path])
            for delay in args.delay_ms:
                with (
                    DelayProxy(f"http://127.0.0.1:{seaweed.port}", delay_ms=delay) as s3p,
                    DelayProxy(f"http://127.0.0.1:{http.port}", delay_ms=delay) as httpp,
                ):
                    bases = {"s3": f"{s3p.endpoint}/{BUCKET}", "http": f"{httpp.endpoint}/files"}
                    if args.py_spy:
                        from indextar import IndexedTarDataset

                        options = _options(bases["s3"])
                        options.pop("skip_instance_cache")
                        ix = folder / "ix"
                        IndexedTarDataset([f"s3://{BUCKET}/{path.name}"], index_dir=ix,
                                          storage_options=options)[0]  # fmt: skip
                        print(f"\n{delay:g} ms:")
                        out = args.py_spy.with_suffix(f".{delay:g}ms.txt")
                        py_spy(out, bases["s3"], [path.name], args.samples, ix)
                        continue
                    print(f"\n**{delay:g} ms**, {args.in_flight} in flight\n")
                    print("| client | requests/s | client CPU per request |")
                    print("| --- | ---: | ---: |")
                    for what, (kind, client) in CLIENTS.items():
                        if not any(part in what for part in args.only.split(",")):
                            continue
                        client(bases[kind], path.name, spans[:64], args.in_flight)  # warm-up
                        cpu, start = time.process_time(), time.perf_counter()
                        got = client(bases[kind], path.name, spans, args.in_flight)
                        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
                        assert got == sum(n for _, n in spans), (what, got)
                        print(f"| {what} | {len(spans) / wall:,.0f} | "
                              f"{cpu / len(spans) * 1e3:.3f} ms |", flush=True)  # fmt: skip
    if not args.py_spy and not args.only:
        print("\n".join(signing_cost()))


if __name__ == "__main__":
    main()
