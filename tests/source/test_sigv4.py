"""The direct S3 client's requests are botocore's: the same URL for every key and
endpoint, and the same SigV4 signature, byte for byte (no network needed)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials as BotoCredentials
from botocore.session import Session

from indextar.source.s3direct import direct_client
from indextar.source.sigv4 import Credentials, SigV4Signer, quote_key

KEYS = [
    "data-000001.tar",
    "a b/c d.tar",
    "ünï/çødé-日本.tar",
    "plus+sign.tar",
    "~tilde/x~y.tar",
    "deep/er/and/deeper.tar",
    "odd%25=&;,$@:!'()*[].tar",
    "a//double.tar",
]
ENDPOINTS = [
    None,  # AWS
    "http://127.0.0.1:8333",
    "http://localhost:9000",
    "https://minio.example.com",
    "https://objects.example.com:443",
    "http://aistore-proxy:51080/s3",  # AIStore's S3 gateway, under a path
]
BUCKETS = ["shards", "my.dotted.bucket", "Upper_Case"]


class _Sent(Exception):
    """Raised by the hook below once botocore has built its request."""


def _botocore_urls(endpoint: str | None, region: str) -> Any:
    """A function giving the URL botocore's client sends a GET of ``bucket/key`` to."""
    client = Session().create_client(
        "s3", region_name=region, endpoint_url=endpoint,
        aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="secret",
    )  # fmt: skip
    seen: dict[str, Any] = {}

    def capture(request: Any, **_: Any) -> None:
        seen["url"] = request.url
        raise _Sent

    client.meta.events.register("before-send", capture)

    def url(bucket: str, key: str) -> str:
        with pytest.raises(_Sent):
            client.get_object(Bucket=bucket, Key=key, Range="bytes=0-9", IfMatch='"abc"')
        return str(seen["url"])

    return url


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_urls_are_the_ones_botocore_sends(endpoint: str | None) -> None:
    options: dict[str, Any] = {"key": "AKIDEXAMPLE", "secret": "secret"}
    options["client_kwargs"] = {"region_name": "eu-west-1"}
    if endpoint:
        options["endpoint_url"] = endpoint
    client = direct_client(options)
    assert client is not None
    botocore_url = _botocore_urls(endpoint, "eu-west-1")
    for bucket in BUCKETS:
        for key in KEYS:
            url, _ = client.request(bucket, key, 0, 10, "abc")
            assert url == botocore_url(bucket, key), (bucket, key)


@pytest.mark.parametrize("token", [None, "FwoGZXIvYXdzE//session+token=="])
@pytest.mark.parametrize("region", ["us-east-1", "ap-southeast-2"])
def test_signatures_are_botocores_byte_for_byte(token: str | None, region: str) -> None:
    credentials = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token)
    signer = SigV4Signer(credentials, region)
    boto = S3SigV4Auth(BotoCredentials(credentials.access_key, credentials.secret_key, token),
                       "s3", region)  # fmt: skip
    for host in ("127.0.0.1:8333", "shards.s3.amazonaws.com", "example.com"):
        for key in KEYS:
            for extra in ({}, {"if-match": '"0123abcd"'}, {"x-amz-request-payer": "requester"}):
                path = "/shards/" + quote_key(key)
                headers = {"range": "bytes=1024-2047", **extra}
                request = AWSRequest("GET", f"https://{host}{path}", headers=dict(headers))
                boto.add_auth(request)
                now = datetime.datetime.strptime(
                    request.headers["X-Amz-Date"], "%Y%m%dT%H%M%SZ"
                ).replace(tzinfo=datetime.timezone.utc)
                ours = signer.sign("GET", host, path, "", headers, now=now)
                assert ours["authorization"] == request.headers["Authorization"], (host, key)
                assert ours["x-amz-content-sha256"] == request.headers["X-Amz-Content-SHA256"]
                assert ours.get("x-amz-security-token") == request.headers.get(
                    "X-Amz-Security-Token"
                )


def test_a_new_day_derives_a_new_signing_key() -> None:
    signer = SigV4Signer(Credentials("AKIDEXAMPLE", "secret"), "us-east-1")
    boto = S3SigV4Auth(BotoCredentials("AKIDEXAMPLE", "secret"), "s3", "us-east-1")
    for day in (1, 2):
        now = datetime.datetime(2026, 11, day, 23, 59, 59, tzinfo=datetime.timezone.utc)
        stamp = now.strftime("%Y%m%dT%H%M%SZ")
        request = AWSRequest("GET", "http://h/b/k", headers={"X-Amz-Date": stamp})
        request.context["timestamp"] = stamp
        boto._modify_request_before_signing(request)  # botocore's own steps, at that time
        canonical = boto.canonical_request(request)
        expected = boto.signature(boto.string_to_sign(request, canonical), request)
        ours = signer.sign("GET", "h", "/b/k", "", {}, now=now)["authorization"]
        assert ours.endswith(f"Signature={expected}")


def test_options_only_botocore_honours_keep_the_botocore_path() -> None:
    base = {"key": "k", "secret": "s", "endpoint_url": "http://127.0.0.1:1"}
    assert direct_client(base) is not None
    assert direct_client({**base, "anon": True}) is not None
    assert direct_client({**base, "requester_pays": True}) is not None
    for refused in (
        {"s3_additional_kwargs": {"SSECustomerAlgorithm": "AES256", "SSECustomerKey": "x"}},
        {"version_aware": True},
        {"session": object()},
        {"config_kwargs": {"signature_version": "s3"}},
        {"client_kwargs": {"aws_session_token": "t"}},
    ):
        assert direct_client({**base, **refused}) is None, refused
