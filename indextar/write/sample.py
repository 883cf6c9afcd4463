"""Encode one sample dict into the tar bytes a writer appends, and check its key.

A :class:`TarSample` holds a sample's headers, data and padding, plus where each
member starts, so a writer can append it and index it without looking inside.
Members are sorted by extension and every header comes from
:mod:`indextar.tar.header`, so equal samples encode to equal bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import EncodeError, WriterError
from ..index.naming import skip_reason, split_name
from ..tar.header import member_header, padded_size, padding
from .encode import encode_value

__all__ = [
    "Buffer",
    "TarSample",
    "check_key",
    "encode_sample",
]

Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True)
class TarSample:
    """One sample ready to be appended to a tar.

    Attributes
    ----------
    key
        The sample's key.
    parts
        Its bytes, written in order: headers, data and padding of every member.
    names
        Member names, in archive order.
    header_offsets, data_offsets
        Where each member's first header block and its data start, relative to the
        sample's first byte.
    sizes
        Each member's data size.
    nbytes
        Total bytes of ``parts``: what the sample adds to the shard.
    """

    key: str
    parts: tuple[Buffer, ...]
    names: tuple[str, ...]
    header_offsets: tuple[int, ...]
    data_offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    nbytes: int


def check_key(key: object, *, shard: str | None = None) -> str:
    """Return ``key`` if it is a safe sample key; raise :class:`WriterError` if not.

    A key is a relative ``/``-separated path without empty, ``.`` or ``..``
    components whose last component has no dot (readers split member names at the
    first dot of their last component).
    """
    if not isinstance(key, str):
        raise WriterError(f"'__key__' must be a str, got {type(key).__name__} {key!r}", shard=shard)

    def bad(why: str) -> WriterError:
        return WriterError(f"invalid key: {why}", shard=shard, key=key)

    if not key:
        raise bad("it is empty")
    if key.startswith("/"):
        raise bad("it is an absolute path; keys are relative paths inside the shard")
    if "\0" in key or "\n" in key:
        raise bad("it contains a NUL or newline character")
    parts = key.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise bad(
                f"it has a {part or 'empty'!r} path component; extracting the shard could "
                "write outside its folder or collide with other members"
                if part == ".."
                else f"it has a {part or 'empty'!r} path component"
            )
    if "." in parts[-1]:
        raise bad(
            f"its last component {parts[-1]!r} contains a dot; readers split member names at "
            "that dot, so the sample would read back under another key"
        )
    if skip_reason(key + ".x") == "meta":
        raise bad("webdataset readers treat names like '__name__' as metadata and skip them")
    return key


def _member_bytes(value: Any, ext: str, *, encoder: bool, shard: str | None, key: str) -> Buffer:
    if encoder:
        return encode_value(ext, value, shard=shard, key=key)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return value
    raise EncodeError(
        f"encoder=False takes bytes-like values only, got {type(value).__name__}",
        shard=shard,
        key=key,
        ext=ext,
    )


def encode_sample(
    sample: Mapping[str, Any], *, encoder: bool = True, shard: str | None = None
) -> TarSample:
    """Encode a sample dict into a :class:`TarSample`, members sorted by extension.

    Entries whose name starts with ``_`` (``__key__``, ``__url__``, ...) are not
    members; ``__key__`` is required.

    Raises
    ------
    WriterError
        For a missing or unsafe key, a bad or repeated extension, or no members.
    EncodeError
        For a value that cannot be encoded for its extension.
    """
    if "__key__" not in sample:
        raise WriterError(
            f"sample has no '__key__' (entries: {', '.join(map(repr, sample))})", shard=shard
        )
    key = check_key(sample["__key__"], shard=shard)
    exts = sorted(ext for ext in sample if not (isinstance(ext, str) and ext.startswith("_")))
    if not exts:
        raise WriterError("sample has no members besides its '_' entries", shard=shard, key=key)
    parts: list[Buffer] = []
    names: list[str] = []
    header_offsets: list[int] = []
    data_offsets: list[int] = []
    sizes: list[int] = []
    seen: dict[str, str] = {}
    pos = 0
    for ext in exts:
        if not isinstance(ext, str):
            raise WriterError(f"extension {ext!r} is not a str", shard=shard, key=key)
        name = f"{key}.{ext}"
        if not ext or split_name(name) != (key, ext.lower()):
            raise WriterError(
                f"invalid extension {ext!r}: it must be non-empty, without '/', NUL or newline",
                shard=shard,
                key=key,
            )
        if ext.lower() in seen:
            raise WriterError(
                f"extensions {seen[ext.lower()]!r} and {ext!r} are the same to readers "
                "(extensions are lowercased)",
                shard=shard,
                key=key,
            )
        seen[ext.lower()] = ext
        data = _member_bytes(sample[ext], ext, encoder=encoder, shard=shard, key=key)
        size = data.nbytes if isinstance(data, memoryview) else len(data)
        try:
            header = member_header(name, size)
        except UnicodeEncodeError as e:
            raise WriterError(
                f"member name {name!r} is not valid UTF-8 ({e.reason})", shard=shard, key=key
            ) from None
        names.append(name)
        header_offsets.append(pos)
        data_offsets.append(pos + len(header))
        sizes.append(size)
        parts += (header, data, padding(size))
        pos += len(header) + padded_size(size)
    return TarSample(
        key=key,
        parts=tuple(parts),
        names=tuple(names),
        header_offsets=tuple(header_offsets),
        data_offsets=tuple(data_offsets),
        sizes=tuple(sizes),
        nbytes=pos,
    )
