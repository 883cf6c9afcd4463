"""The hand-written HTTP/1.1 client (source/http11.py) over TLS, against a server on
127.0.0.1 with a self-signed certificate made here (the ``openssl`` command): ranged
reads come byte for byte with the certificate's CA given (``verify=`` a CA bundle, as
botocore's), and a server whose certificate is not trusted is refused, through the
direct S3 client with an indextar error naming the URL, not retried."""

from __future__ import annotations

import asyncio
import gc
import re
import socketserver
import ssl
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from loopback_servers import self_signed_certificate

from indextar.errors import RemoteReadError
from indextar.source.conditional import RemoteStat
from indextar.source.http11 import Http11Pool, request_head
from indextar.source.remote import RangeSource, RetryPolicy

BODY = bytes(range(251)) * 8_000  # 2,008,000 bytes: many TLS records a response
ETAG = "0123abcd"


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (its own CA) and its key."""
    made = self_signed_certificate(tmp_path_factory.mktemp("tls"))
    if made is None:
        pytest.skip("no openssl command to make a certificate with")
    return made


class _Ranges(socketserver.BaseRequestHandler):
    """Answers each GET's ``range`` header from :data:`BODY`, on a kept-alive TLS
    connection (a handshake the client refuses ends it)."""

    context: ssl.SSLContext

    def handle(self) -> None:
        try:
            with self.context.wrap_socket(self.request, server_side=True) as tls:
                with tls.makefile("rb") as stream:
                    while self._answer(tls, stream):
                        pass
        except (ssl.SSLError, OSError):
            pass

    def _answer(self, tls: ssl.SSLSocket, stream: Any) -> bool:
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            line = stream.readline()
            if not line:
                return False
            head += line
        found = re.search(rb"\nrange: bytes=(\d+)-(\d+)", head.lower())
        assert found is not None, head
        start, last = int(found[1]), int(found[2])
        data = BODY[start : last + 1]
        tls.sendall(
            b"HTTP/1.1 206 Partial Content\r\ncontent-length: %d\r\n"
            b'content-range: bytes %d-%d/%d\r\netag: "%s"\r\n\r\n'
            % (len(data), start, start + len(data) - 1, len(BODY), ETAG.encode())
            + data
        )
        return True


@pytest.fixture(scope="module")
def server(certificate: tuple[Path, Path]) -> Iterator[int]:
    """An HTTPS server on 127.0.0.1, a thread a connection; its port."""
    with warnings.catch_warnings():  # what earlier modules left to the collector is theirs
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*certificate)
    handler = type("Handler", (_Ranges,), {"context": context})
    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler) as listening:
        listening.daemon_threads = True
        thread = threading.Thread(target=listening.serve_forever, daemon=True)
        thread.start()
        yield listening.server_address[1]
        listening.shutdown()
        thread.join(5)


def _ranges() -> list[tuple[int, int]]:
    return [(0, 1), (0, 512), (1000, 70_000), (123_457, 1_500_000), (len(BODY) - 9, 9)]


def test_ranged_reads_over_tls_come_byte_for_byte_with_the_ca_given(
    certificate: tuple[Path, Path], server: int
) -> None:
    async def reads() -> None:
        netloc = f"127.0.0.1:{server}"
        pool = Http11Pool(
            "https", netloc, verify=str(certificate[0]), connect_timeout=5, read_timeout=5
        )
        try:
            for offset, length in _ranges():
                range_ = {"range": f"bytes={offset}-{offset + length - 1}"}
                answer = await pool.get(
                    f"https://{netloc}/b/k", request_head("/b/k", netloc, range_)
                )
                assert answer.status == 206 and answer.body == BODY[offset : offset + length]
            assert len(pool._idle) == 1  # one kept-alive connection did them all
        finally:
            pool.close()

    asyncio.run(reads())


def _source(port: int, verify: bool | str) -> RangeSource:
    options = {
        "endpoint_url": f"https://127.0.0.1:{port}", "key": "k", "secret": "s",
        "client_kwargs": {"region_name": "us-east-1", "verify": verify},
    }  # fmt: skip
    retry = RetryPolicy(attempts=3, initial_delay=0.01, max_delay=0.02)
    return RangeSource(
        "s3://b/k.tar", expected=RemoteStat(len(BODY), ETAG), storage_options=options, retry=retry
    )


def test_the_direct_s3_client_reads_over_tls_and_refuses_an_untrusted_certificate(
    certificate: tuple[Path, Path], server: int
) -> None:
    trusted = _source(server, str(certificate[0]))
    offsets, lengths = [o for o, _ in _ranges()], [n for _, n in _ranges()]
    assert trusted.read_many(offsets, lengths) == [BODY[o : o + n] for o, n in _ranges()]
    assert trusted.read(77, 100_000) == BODY[77:100_077]
    for verify in (True, "/etc/ssl/certs/ca-certificates.crt"):  # the system's CAs
        if verify is not True and not Path(str(verify)).exists():
            continue
        with pytest.raises(RemoteReadError) as refused:
            _source(server, verify).read(0, 512)
        assert "s3://b/k.tar" in str(refused.value) and "CERTIFICATE_VERIFY_FAILED" in str(
            refused.value
        )
        assert refused.value.attempts == 1  # a refusal, not retried
        assert isinstance(refused.value.__cause__, ssl.SSLCertVerificationError)
