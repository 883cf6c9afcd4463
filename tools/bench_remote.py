"""Random and streaming reads from an object store with latency (issue 25).

The shards (8 x 1,000 samples of 100 KB by default; ``--small``: 8 x 100) go into
SeaweedFS's S3 gateway on 127.0.0.1 (``--store nginx``: S3's read API served by nginx,
tools/nginx_store.py, a store whose CPU per request is near nothing, as a real
store's is to its client; ``--store http``: an aiohttp file server), behind a proxy
(tools/loopback_servers.py ``DelayProxy``: by default the TCP delay line of
tools/delay_line.py, ``--proxy aiohttp`` the older aiohttp one) that delays every
response ``--delay-ms`` (default: 0 and 20, one table each) and counts the bytes of
the bodies it returns.
With ``--tls`` the clients reach the proxy through HTTPS (tools/nginx_store.py's
``NginxTlsFront``: nginx with its own certificate, forwarding over kept-alive plain
connections), so each pays for TLS as against a real store, and the proxy still
counts the answers' bodies. Each row reads every sample once, on the same server:

* indextar i.i.d.: ``IndexedTarDataset(remote="ranges")`` + ``ResumableSampler`` +
  ``DataLoader(batch_size=64)`` with 0 and 2 workers, and the same with read-ahead
  (``batch_sampler=ReadAheadBatches(sampler, 64)``);
* indextar ``StreamingTarDataset`` and webdataset's ``WebDataset`` (``pipe:curl``),
  and streaming by pipelined ranged GETs instead of one GET per shard
  (tools/bench_remote_chunked.py);
* indextar ``remote="cache"`` filled by whole shards and by the ranged reads, first
  and second epoch (tools/bench_remote_cache.py);
* raw clients on the same spans in the sampler's order, the ceiling: aiohttp ranged
  GETs, ``--in-flight`` (256) at once, unsigned; obstore ``get_range_async`` the same
  way, and obstore ``get_ranges`` per shard over windows of 256 samples (its merging;
  tools/bench_remote_clients.py);
* Mosaic streaming and LitData on the same samples in their formats
  (tools/bench_remote_peers.py; skipped, with a note, where not installed).

Columns: samples/s from the row's first call to its last sample (start-up included),
client CPU per sample (this process and its reaped children: DataLoader workers,
``curl``; not the servers), server CPU per sample (the store's processes and the
proxy's, from /proc), time to the first sample, and bytes per sample counted at the
proxy against the sample's span. Everything shares the machine's cores with the
servers, so a row whose server CPU is high is held by the lab, not by its client.

Run::

    python tools/bench_remote.py --small --no-write      # a quick run, prints only
    python tools/bench_remote.py                          # the docs table
    python tools/bench_remote.py --store nginx            # its nginx table
    python tools/bench_remote.py --store nginx --tls      # the same, the clients on HTTPS
    python tools/bench_remote.py --delay-ms 20 --store http --only indextar
    python tools/bench_remote.py --small --no-write --only Streaming "webdataset streaming"
    python tools/bench_remote.py --loopback               # the older loopback table

The read-ahead rows (the targets') run ``--repeat`` times (default 3), and the table
gives the run of the median client CPU per sample, its note the spread of all runs.

``--small`` took 4-5 minutes on the shared 2-core machine at load 10 (most of it
converting for the peers and the slow i.i.d. rows); the default reads ten times the
samples, with the i.i.d. rows at today's 0.3-0.5k samples/s taking most of it.

Needs the ``test`` extra (SeaweedFS, webdataset) and, for every row, the ``bench``
extra (obstore) and the ``bench-peers`` packages, installed apart so that they leave
the pinned torch alone::

    pip install --target /tmp/benchdeps --no-deps mosaicml-streaming litdata ...
    PYTHONPATH=/tmp/benchdeps python tools/bench_remote.py

Writes its tables, each followed by the issue's target ratios (indextar i.i.d. with
read-ahead and 2 workers against the raw client, Mosaic and LitData), into
docs/benchmarks-remote.md between the ``bench_remote`` markers (``--no-write`` to skip).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import logging
import os
import platform
import random
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loopback_servers import DelayProxy, HttpServer, SeaweedServer  # noqa: E402
from procstats import cpu_seconds, process_tree_cpu  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "benchmarks-remote.md"
BUCKET = "bench"
log = logging.getLogger("bench_remote")


def write_shards(folder: Path, shards: int, per_shard: int, size: int) -> list[Path]:
    """``shards`` tars of ``per_shard`` samples: a random ``.jpg`` of ``size`` bytes and
    a ``.cls`` each."""
    rng = random.Random(0)
    paths = []
    for s in range(shards):
        path = folder / f"bench-{s:03d}.tar"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
            for i in range(per_shard):
                for ext, data in (("jpg", rng.randbytes(size)), ("cls", str(i % 10).encode())):
                    info = tarfile.TarInfo(f"s{s:03d}_{i:06d}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
        paths.append(path)
    return paths


def sample_spans(path: Path) -> list[tuple[int, int]]:
    """Each sample's ``(offset, length)``: from its first header to its last member's
    end, what one ranged read of the sample fetches."""
    spans: dict[str, list[int]] = {}
    with tarfile.open(path) as tf:
        for member in tf:
            stem = member.name.rsplit(".", 1)[0]
            end = member.offset_data + member.size
            spans.setdefault(stem, [member.offset, end])[1] = end
    return [(start, end - start) for start, end in spans.values()]


@dataclass(frozen=True, slots=True)
class Store:
    """Where the rows read the shards: through the proxy, with the options each client needs."""

    kind: str  # "s3" or "http"
    proxy: DelayProxy
    server_pid: int  # the store's process (its CPU and the proxy's: the server column)
    names: list[str]
    spans: list[list[tuple[int, int]]]  # per shard, per sample
    index_dir: Path
    work: Path
    stats: list[Any]  # per shard, its RemoteStat (size, ETag), as an index records it
    tls: Any = None  # ``--tls``: the NginxTlsFront the clients reach the proxy through

    @property
    def endpoint(self) -> str:
        """Where clients send their requests: the proxy, or the TLS front before it."""
        return self.tls.endpoint if self.tls is not None else self.proxy.endpoint

    @property
    def urls(self) -> list[str]:
        if self.kind == "s3":
            return [f"s3://{BUCKET}/{name}" for name in self.names]
        return [f"{self.endpoint}/files/{name}" for name in self.names]

    def http_url(self, name: str) -> str:
        """The plain URL of an object (S3: path style, unsigned; the gateway runs without auth)."""
        prefix = BUCKET if self.kind == "s3" else "files"
        return f"{self.endpoint}/{prefix}/{name}"

    @property
    def storage_options(self) -> dict[str, Any] | None:
        if self.kind != "s3":
            return None  # --tls is for the S3 stores
        client: dict[str, Any] = {"region_name": "us-east-1"}
        if self.tls is not None:
            client["verify"] = str(self.tls.ca)
        return {
            "key": "indextar-test",
            "secret": "indextar-test",
            "endpoint_url": self.endpoint,
            "client_kwargs": client,
        }

    def ssl_context(self) -> Any:
        """The TLS context that trusts the front's certificate (None without ``--tls``)."""
        return None if self.tls is None else self.tls.ssl_context()

    def order(self) -> list[tuple[int, int]]:
        """Every sample once, as ``(shard, sample)``, in ``ResumableSampler``'s order."""
        from indextar import ResumableSampler

        per_shard = [len(s) for s in self.spans]
        starts = [sum(per_shard[:n]) for n in range(len(per_shard))]
        located = []
        for i in ResumableSampler(sum(per_shard), seed=0):
            shard = max(n for n, start in enumerate(starts) if start <= i)
            located.append((shard, i - starts[shard]))
        return located

    @property
    def span_bytes(self) -> int:
        return sum(length for shard in self.spans for _, length in shard)


@dataclass(frozen=True, slots=True)
class Row:
    case: str
    samples: int
    seconds: float
    cpu: float
    first: float
    fetched: int
    server_cpu: float = 0.0  # the store's and the proxy's
    note: str = ""
    requests: int = 0  # answered, as counted at the proxy (refusals included)

    def cells(self, span_bytes: int) -> list[str]:
        if not self.samples:
            return [self.case, "-", "-", "-", "-", "-", self.note]
        per_sample = self.fetched / self.samples
        return [
            self.case,
            f"{self.samples / self.seconds:,.0f}",
            f"{self.cpu / self.samples * 1e3:.2f} ms",
            f"{self.server_cpu / self.samples * 1e3:.2f} ms",
            f"{self.first:.2f} s",
            f"{per_sample / 1e3:,.1f} kB ({self.fetched / span_bytes:.2f}x)",
            "; ".join(filter(None, [self.note, self.refused()])),
        ]

    def refused(self) -> str:
        """Requests a sample where more were answered than samples read (a store's
        refusals and their retries: ``--rate-limit``)."""
        per_sample = self.requests / self.samples
        return f"{per_sample:.2f} requests a sample" if per_sample > 1.01 else ""


Reader = Callable[[Store, Callable[[], None]], int]


def measure(case: str, store: Store, read: Reader) -> Row:
    """One row: ``read(store, mark)`` reads every sample and calls ``mark()`` at each."""
    print(f"  {case} ...", file=sys.stderr, flush=True)
    store.proxy.reset()
    first: list[float] = []

    def server() -> float:
        front = process_tree_cpu(store.tls.pid) if store.tls is not None else 0.0
        return process_tree_cpu(store.server_pid) + process_tree_cpu(store.proxy.pid) + front

    cpu, served, start = cpu_seconds(), server(), time.perf_counter()

    def mark() -> None:
        if not first:
            first.append(time.perf_counter() - start)

    try:
        count = read(store, mark)
    except Exception as e:  # a peer that cannot run here: say so in the table
        log.exception("%s failed", case)
        return Row(case, 0, 0, 0, 0, 0, note=f"failed: {type(e).__name__}: {str(e)[:80]}")
    seconds, cpu, served = time.perf_counter() - start, cpu_seconds() - cpu, server() - served
    stats = store.proxy.stats()
    first_at = first[0] if first else seconds
    return Row(
        case, count, seconds, cpu, first_at, stats["bytes"], served, requests=stats["requests"]
    )


# -- the rows ---------------------------------------------------------------------


def _count(batch: list[Any]) -> int:
    return len(batch)


def indextar_iid(workers: int, *, ahead: bool = False) -> Reader:
    def read(store: Store, mark: Callable[[], None]) -> int:
        import torch.utils.data

        from indextar import IndexedTarDataset, ReadAheadBatches, ResumableSampler

        ds = IndexedTarDataset(
            store.urls, remote="ranges", index_dir=store.index_dir,
            storage_options=store.storage_options,
        )  # fmt: skip
        sampler = ResumableSampler(ds, seed=0)
        batches: dict[str, Any] = (
            {"batch_sampler": ReadAheadBatches(sampler, 64)}
            if ahead
            else {"batch_size": 64, "sampler": sampler}
        )
        loader = torch.utils.data.DataLoader(
            ds, num_workers=workers, collate_fn=_count, **batches
        )  # fmt: skip
        done = 0
        for batch in loader:
            mark()
            done += batch
        return done

    return read


def indextar_streaming(store: Store, mark: Callable[[], None]) -> int:
    from indextar import StreamingTarDataset

    done = 0
    for _ in StreamingTarDataset(store.urls, storage_options=store.storage_options):
        mark()
        done += 1
    return done


def webdataset_streaming(store: Store, mark: Callable[[], None]) -> int:
    import webdataset as wds

    ca = f" --cacert {store.tls.ca}" if store.tls is not None else ""
    urls = [f"pipe:curl -s --fail{ca} {store.http_url(name)}" for name in store.names]
    done = 0
    for _ in wds.WebDataset(urls, shardshuffle=False):
        mark()
        done += 1
    return done


def measure_repeated(case: str, store: Store, read: Reader, repeat: int) -> Row:
    """:func:`measure` ``repeat`` times: the run of the median client CPU per sample
    (the target a single 3-second row on a shared 2-core machine misses or meets by
    its noise), its note giving every run's spread."""
    runs = [measure(case, store, read) for _ in range(repeat)]
    failed = [r for r in runs if not r.samples]
    if repeat == 1 or failed:
        return failed[0] if failed else runs[0]  # a failed run's note says why
    done = sorted(runs, key=lambda r: r.cpu / r.samples)
    rates = [r.samples / r.seconds for r in done]
    cpus = [r.cpu / r.samples * 1e3 for r in done]
    note = (
        f"median CPU of {repeat} runs: {min(cpus):.2f}-{max(cpus):.2f} ms,"
        f" {min(rates):,.0f}-{max(rates):,.0f}/s"
    )
    return dataclasses.replace(done[(len(done) - 1) // 2], note=note)


def rows_for(
    store: Store, in_flight: int, only: list[str] | None = None, repeat: int = 1
) -> list[Row]:
    from bench_remote_cache import cache_rows
    from bench_remote_chunked import chunked_streaming
    from bench_remote_clients import obstore_get_ranges, obstore_ranges, raw_aiohttp
    from bench_remote_peers import peer_rows

    cases: list[tuple[str, Reader]] = [
        ("indextar i.i.d. ranges, 0 workers", indextar_iid(0)),
        ("indextar i.i.d. ranges, 2 workers", indextar_iid(2)),
        ("indextar i.i.d. ranges + read-ahead, 0 workers", indextar_iid(0, ahead=True)),
        ("indextar i.i.d. ranges + read-ahead, 2 workers", indextar_iid(2, ahead=True)),
        ("indextar `StreamingTarDataset`", indextar_streaming),
        ("webdataset streaming (`pipe:curl`)", webdataset_streaming),
        ("streaming by ranged GETs, 1 MiB x 8 in flight", chunked_streaming(1 << 20, 8)),
        ("streaming by ranged GETs, 8 MiB x 4 in flight", chunked_streaming(8 << 20, 4)),
        (f"raw aiohttp ranged GETs, {in_flight} in flight", raw_aiohttp(in_flight)),
        *cache_rows(),
    ]
    try:
        import obstore  # noqa: F401

        cases += [
            (f"obstore `get_range_async`, {in_flight} in flight", obstore_ranges(in_flight)),
            ("obstore `get_ranges` per shard, windows of 256 (merged)", obstore_get_ranges(256)),
        ]
    except ImportError:
        log.warning("obstore is not installed (the bench extra): its rows are skipped")
    if store.kind == "s3":
        cases += peer_rows()
    picked = [(case, read) for case, read in cases if not only or any(o in case for o in only)]
    return [
        measure_repeated(case, store, read, repeat if "read-ahead" in case else 1)
        for case, read in picked
    ]


# -- the run ------------------------------------------------------------------------


def table(rows: list[Row], span_bytes: int) -> str:
    lines = [
        "| case | samples/s | client CPU per sample | server CPU per sample | first sample"
        " | bytes per sample | note |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    return "\n".join(lines + ["| " + " | ".join(row.cells(span_bytes)) + " |" for row in rows])


IID = "indextar i.i.d. ranges + read-ahead, 2 workers"
AGAINST = {"the raw aiohttp client": "raw aiohttp", "Mosaic": "Mosaic", "LitData": "LitData"}


def ratios(rows: list[Row]) -> str:
    """The issue's targets, as ratios of samples/s within this table's run."""
    rate = {row.case: row.samples / row.seconds for row in rows if row.samples}
    if IID not in rate:
        return ""
    found = []
    for name, prefix in AGAINST.items():
        other = next((r for case, r in rate.items() if case.startswith(prefix)), None)
        if other:
            found.append(f"{rate[IID] / other:.2f}x {name}")
    return f"{IID}: " + ", ".join(found) + "." if found else ""


def write_doc(text: str, marker: str = "bench_remote") -> None:
    """Replace what lies between the doc's ``marker`` comments (or append them)."""
    begin, end = f"<!-- {marker}: begin -->", f"<!-- {marker}: end -->"
    doc = DOC.read_text() if DOC.exists() else "# Remote shards: benchmark\n"
    block = f"{begin}\n{text}\n{end}"
    if begin in doc:
        doc = doc[: doc.index(begin)] + block + doc[doc.index(end) + len(end) :]
    else:
        doc = doc.rstrip("\n") + "\n\n" + block + "\n"
    DOC.write_text(doc)


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--per-shard", type=int, default=1000)
    parser.add_argument("--size", type=int, default=100_000, help="bytes of each sample's jpg")
    parser.add_argument("--small", action="store_true", help="100 samples a shard (a quick run)")
    parser.add_argument("--delay-ms", type=float, nargs="+", default=[0, 20])
    parser.add_argument(
        "--store", choices=["s3", "nginx", "http"], default="s3",
        help="s3: SeaweedFS's S3 gateway; nginx: S3's read API served by nginx"
        " (tools/nginx_store.py); http: an aiohttp file server",
    )  # fmt: skip
    parser.add_argument(
        "--proxy", choices=["tcp", "aiohttp"], default="tcp",
        help="the delaying proxy: a TCP delay line (tools/delay_line.py) or the older aiohttp one",
    )  # fmt: skip
    parser.add_argument(
        "--tls", action="store_true",
        help="the clients reach the proxy through HTTPS (nginx in front, its own certificate;"
        " S3 stores only)",
    )  # fmt: skip
    parser.add_argument(
        "--rate-limit", type=int, default=None,
        help="--store nginx serves this many GETs a second and refuses the rest with 503,"
        " as S3 a prefix asked too fast",
    )  # fmt: skip
    parser.add_argument(
        "--no-aimd", action="store_true",
        help="the read-ahead keeps its requests in flight whatever the store answers"
        " (as before source/throttle.py), to compare",
    )  # fmt: skip
    parser.add_argument("--in-flight", type=int, default=256, help="the raw clients' requests")
    parser.add_argument(
        "--only", nargs="+", default=[], help="only the rows whose name contains one of these"
    )
    parser.add_argument(
        "--repeat", type=int, default=3,
        help="runs of each read-ahead row (the targets' rows): the median client CPU's",
    )  # fmt: skip
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--loopback", action="store_true", help="the older loopback table")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.loopback:
        from bench_remote_loopback import main as loopback

        sys.argv = [sys.argv[0]] + (["--no-write"] if args.no_write else [])
        return loopback()
    if args.small:
        args.per_shard = 100
    if args.tls and args.store == "http":
        parser.error("--tls is for the S3 stores (--store s3 or nginx)")
    if args.rate_limit is not None and args.store != "nginx":
        parser.error("--rate-limit is for --store nginx")
    if args.no_aimd:  # forked DataLoader workers inherit it
        from indextar.source import prefetch
        from indextar.source.throttle import InFlightLimit

        # the prefetcher's in_flight from the start (no slow start), never moved: a
        # limit whose minimum is its maximum (its refusals still counted)
        prefetch.InFlightLimit = lambda most: InFlightLimit(most, minimum=most, initial=most)  # type: ignore[misc,assignment]
    # torch, imported by the first row that needs it, took 7-13 s of that row's first
    # sample at load 14: import it once before any row
    import torch.utils.data  # noqa: F401
    from bench_remote_peers import prepare_peers

    sections = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        paths = write_shards(folder, args.shards, args.per_shard, args.size)
        spans = [sample_spans(p) for p in paths]
        if args.store == "s3":
            upstream_cm: Any = SeaweedServer(folder / "seaweed")
        elif args.store == "nginx":
            from nginx_store import NginxStore

            upstream_cm = NginxStore(folder / "nginx", rate_limit=args.rate_limit)
        else:
            upstream_cm = HttpServer(folder)
        kind = "http" if args.store == "http" else "s3"
        with upstream_cm as upstream:
            if kind == "s3":
                upstream.upload(BUCKET, paths)
                if not args.only or any(o in p for o in args.only for p in ("Mosaic", "LitData")):
                    prepare_peers(folder, paths, upstream)  # only for the peers' rows
                origin = f"http://127.0.0.1:{upstream.port}"
            else:
                origin = f"http://127.0.0.1:{upstream.port}"
            stats: list[Any] = []
            for delay in args.delay_ms:
                with contextlib.ExitStack() as stack:
                    proxy = stack.enter_context(DelayProxy(origin, delay_ms=delay, kind=args.proxy))
                    tls = None
                    if args.tls:
                        from nginx_store import NginxTlsFront

                        tls = stack.enter_context(
                            NginxTlsFront(folder / f"tls-{delay:g}", f"127.0.0.1:{proxy.port}")
                        )
                    store = Store(
                        kind, proxy, upstream.pid, [p.name for p in paths], spans,
                        folder / f"index-{args.store}", folder, stats, tls,
                    )  # fmt: skip
                    if delay == args.delay_ms[0]:  # build the indexes once, outside the rows
                        from bench_remote_chunked import stats_of

                        from indextar import IndexedTarDataset

                        stats[:] = stats_of(store.urls, store.storage_options)

                        built = IndexedTarDataset(
                            store.urls, index_dir=store.index_dir,
                            storage_options=store.storage_options,
                        )  # fmt: skip
                        for shard in range(
                            args.shards
                        ):  # a shard's index is built at its first read
                            built[shard * args.per_shard]
                    print(f"{args.store}, {delay:g} ms:", file=sys.stderr)
                    before = load()
                    rows = rows_for(store, args.in_flight, args.only, args.repeat)
                sections.append(
                    f"**{delay:g} ms added to every response** (load average before: {before})"
                    f"\n\n{table(rows, store.span_bytes)}\n\n{ratios(rows)}".rstrip()
                )
                print(sections[-1] + "\n", flush=True)
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    server = {
        "s3": "SeaweedFS S3 gateway",
        "nginx": "S3's read API served by nginx",
        "http": "an aiohttp file server",
    }[args.store]
    line = "a TCP delay line" if args.proxy == "tcp" else "an aiohttp proxy"
    if args.tls:
        line += ", reached through HTTPS (nginx's TLS front, tools/nginx_store.py)"
    text = (
        f"Measured by `tools/bench_remote.py{' --small' if args.small else ''}"
        f"{' --store ' + args.store if args.store != 's3' else ''}"
        f"{' --tls' if args.tls else ''}`"
        f" ({args.shards} shards x {args.per_shard:,} samples"
        f" of {args.size:,} + 1 bytes; {server} on 127.0.0.1 behind {line};"
        f" {machine}; {time.strftime('%Y-%m-%d')}).\n\n" + "\n\n".join(sections)
    )
    if not args.no_write:
        marker = "bench_remote" if args.store == "s3" else f"bench_remote_{args.store}"
        write_doc(text, marker + ("_tls" if args.tls else ""))


if __name__ == "__main__":
    main()
