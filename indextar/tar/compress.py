"""Recognising compressed shards by their first bytes, and saying how to decompress one.

Random access needs an uncompressed tar: :mod:`indextar.tar.scan` refuses a
compressed shard with the command that turns it into a plain one, and
the streaming reader's opening (:mod:`indextar.read.opening`) names the format it must
decompress.
"""

from __future__ import annotations

import shlex

__all__ = ["compressed_message", "sniff_compression"]

# (magic, format, its command-line tool, the file name suffixes it goes with)
_COMPRESSION_MAGIC = (
    (b"\x1f\x8b", "gzip", "gzip", (".gz", ".tgz")),
    (b"BZh", "bzip2", "bzip2", (".bz2",)),
    (b"\xfd7zXZ\x00", "xz", "xz", (".xz",)),
    (b"\x28\xb5\x2f\xfd", "zstd", "zstd", (".zst", ".zstd")),
    (b"\x04\x22\x4d\x18", "lz4", "lz4", (".lz4",)),
)


def sniff_compression(head: bytes) -> str | None:
    """Name the compression format ``head`` starts with, or ``None``."""
    for magic, name, _, _ in _COMPRESSION_MAGIC:
        if head.startswith(magic):
            return name
    return None


def compressed_message(head: bytes, shard: str | None) -> str | None:
    """Why ``shard``, starting with ``head``, cannot be scanned, or ``None`` if not compressed."""
    for magic, name, tool, suffixes in _COMPRESSION_MAGIC:
        if head.startswith(magic):
            hint = _decompress_command(tool, suffixes, shard or "SHARD")
            return (
                f"shard is {name}-compressed; random access needs an uncompressed tar "
                f"(decompress it first, for example: {hint})"
            )
    return None


def _decompress_command(tool: str, suffixes: tuple[str, ...], shard: str) -> str:
    """A shell command that turns the compressed ``shard`` into a plain tar.

    ``gunzip`` and friends refuse names without their suffix, and compressed shards
    are often named ``.tar``: ``tool -dc`` works whatever the name.
    """
    quote = shlex.quote
    for suffix in suffixes:
        if shard.endswith(suffix) and len(shard) > len(suffix):
            plain = shard[: -len(suffix)] + (".tar" if suffix == ".tgz" else "")
            return f"{tool} -dc {quote(shard)} > {quote(plain)}"
    tmp = shard + ".tmp"
    return f"{tool} -dc {quote(shard)} > {quote(tmp)} && mv {quote(tmp)} {quote(shard)}"
