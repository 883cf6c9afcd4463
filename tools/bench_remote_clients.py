"""The raw clients of tools/bench_remote.py: aiohttp and obstore ranged reads of the
same spans, in the sampler's order, many in flight (the ceiling a client could reach
on this machine), and obstore's merging ``get_ranges`` for its bytes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

BUCKET = "bench"
Reader = Callable[[Any, Callable[[], None]], int]


def _spans_in_order(store: Any) -> Iterator[tuple[str, int, int]]:
    for shard, sample in store.order():
        offset, length = store.spans[shard][sample]
        yield store.names[shard], offset, length


def raw_aiohttp(in_flight: int) -> Reader:
    def read(store: Any, mark: Callable[[], None]) -> int:
        import aiohttp

        async def run() -> int:
            limit = asyncio.Semaphore(in_flight)
            # --tls: one context for the row (the connector's, so that its connections
            # are kept alive: aiohttp pools connections by their request's ssl object)
            connector = aiohttp.TCPConnector(limit=in_flight, ssl=store.ssl_context() or True)
            async with aiohttp.ClientSession(connector=connector) as session:

                async def one(name: str, offset: int, length: int) -> int:
                    headers = {"Range": f"bytes={offset}-{offset + length - 1}"}
                    async with limit, session.get(store.http_url(name), headers=headers) as r:
                        r.raise_for_status()
                        data = await r.read()
                    mark()
                    return 1 if len(data) == length else 0

                return sum(await asyncio.gather(*(one(*s) for s in _spans_in_order(store))))

        return asyncio.run(run())

    return read


def _obstore(store: Any) -> Any:
    from obstore.store import HTTPStore, S3Store

    if store.kind == "http":
        return HTTPStore.from_url(f"{store.endpoint}/files", client_options={"allow_http": True})
    return S3Store(
        BUCKET, endpoint=store.endpoint, access_key_id="indextar-test",
        secret_access_key="indextar-test", region="us-east-1", virtual_hosted_style_request=False,
        # --tls: the front's certificate is its own CA, which obstore cannot be given here
        client_options={"allow_http": True, "allow_invalid_certificates": store.tls is not None},
    )  # fmt: skip


def obstore_ranges(in_flight: int) -> Reader:
    def read(store: Any, mark: Callable[[], None]) -> int:
        import obstore

        client = _obstore(store)

        async def run() -> int:
            limit = asyncio.Semaphore(in_flight)

            async def one(name: str, offset: int, length: int) -> int:
                async with limit:
                    data = await obstore.get_range_async(client, name, start=offset, length=length)
                mark()
                return 1 if len(data) == length else 0

            return sum(await asyncio.gather(*(one(*s) for s in _spans_in_order(store))))

        return asyncio.run(run())

    return read


def obstore_get_ranges(window: int) -> Reader:
    """``get_ranges`` per shard over each ``window`` samples of the order (it merges
    spans closer than 1 MiB, so it may fetch bytes no sample needs)."""

    def read(store: Any, mark: Callable[[], None]) -> int:
        import obstore

        client = _obstore(store)
        spans = list(_spans_in_order(store))

        async def run() -> int:
            done = 0
            for w in range(0, len(spans), window):
                by_shard: dict[str, list[tuple[int, int]]] = {}
                for name, offset, length in spans[w : w + window]:
                    by_shard.setdefault(name, []).append((offset, length))
                got = await asyncio.gather(
                    *(
                        obstore.get_ranges_async(
                            client, name, starts=[o for o, _ in s], lengths=[n for _, n in s]
                        )
                        for name, s in by_shard.items()
                    )
                )
                mark()
                done += sum(len(parts) for parts in got)
            return done

        return asyncio.run(run())

    return read
