"""The exceptions indextar raises.

Every error derives from :class:`IndextarError`, so ``except indextar.IndextarError``
catches all of them. Each subclass also derives from the builtin that fits it
(``ValueError`` for malformed input, ``FileNotFoundError`` for a missing file, ...),
so code written against the builtins keeps working.

Messages say what, where, what was expected and what was found: the shard, the key
and the byte offset wherever they are known.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "IndextarError",
    "ShardFormatError",
    "TruncatedShardError",
    "CompressedShardError",
    "UnsupportedMemberError",
    "SampleFormatError",
    "IndexFormatError",
    "StaleIndexError",
    "MissingIndexError",
    "ShardNotFoundError",
    "IndexWriteError",
    "SamplerStateError",
    "DecodeError",
    "UnsafeMemberError",
    "DecodeSpecError",
    "SampleKeyError",
    "SampleIndexError",
    "ManifestError",
    "WriterError",
    "EncodeError",
    "RemoteReadError",
    "WrongRangeError",
    "PipeRefusedError",
    "CacheFullError",
    "ExportError",
    "SampleAttributeError",
    "SelectionError",
    "ChecksumMismatchError",
    "MissingAttributesError",
    "ConvertError",
]


class IndextarError(Exception):
    """Base class of every error indextar raises."""


class ShardFormatError(IndextarError, ValueError):
    """A shard is not a well-formed uncompressed tar.

    Attributes
    ----------
    shard
        The shard's path or URL, or ``None`` when scanning anonymous bytes.
    offset
        Byte offset in the shard where the problem was found, when known.
    """

    def __init__(self, message: str, *, shard: str | None = None, offset: int | None = None):
        self.shard = shard
        self.offset = offset
        where = []
        if shard is not None:
            where.append(repr(shard))
        if offset is not None:
            where.append(f"at byte offset {offset}")
        super().__init__(f"{' '.join(where)}: {message}" if where else message)


class ChecksumMismatchError(ShardFormatError):
    """A sample's bytes do not hash to the checksum its index recorded (bit rot, a
    corrupted copy, a server that answered other bytes): nothing is returned.

    Attributes
    ----------
    shard, offset
        As :class:`ShardFormatError`'s: the sample's span starts at ``offset``.
    key
        The sample's ``__key__``.
    """

    def __init__(
        self,
        message: str,
        *,
        shard: str | None = None,
        offset: int | None = None,
        key: str | None = None,
    ):
        self.key = key
        super().__init__(
            f"sample {key!r}: {message}" if key is not None else message,
            shard=shard,
            offset=offset,
        )


class TruncatedShardError(ShardFormatError):
    """A shard ends in the middle of a header or of a member's data."""


class CompressedShardError(ShardFormatError):
    """A shard is gzip/bz2/xz/zstd-compressed; random access needs a plain tar."""


class UnsupportedMemberError(ShardFormatError):
    """A member uses a tar feature indextar cannot index (sparse or multi-volume)."""


class SampleFormatError(ShardFormatError):
    """Members do not form valid samples (for example a repeated extension in one sample)."""


class IndexFormatError(IndextarError, ValueError):
    """An index file is corrupt, foreign, or from an incompatible format version."""


class StaleIndexError(IndextarError):
    """An index no longer matches its shard (size, mtime or content changed)."""


class MissingIndexError(IndextarError, FileNotFoundError):
    """A shard has no index and building one was not allowed.

    Attributes
    ----------
    problem
        The message without the remedy it ends with. The remedy names library calls
        (``build_index()``); the command line names its own command instead.
    shards
        Every shard without an index (the message may list only the first few).
    remedy
        What to call to build the indexes.
    """

    def __init__(
        self, problem: str, shards: Sequence[str] = (), remedy: str = "build it with build_index()"
    ):
        self.problem = problem
        self.shards = tuple(shards)
        self.remedy = remedy
        super().__init__(f"{problem}; {remedy}")

    def __reduce__(self) -> tuple[type[MissingIndexError], tuple[str, tuple[str, ...], str]]:
        # The default rebuilds from the whole message and would add the remedy twice.
        return type(self), (self.problem, self.shards, self.remedy)


class ShardNotFoundError(IndextarError, FileNotFoundError):
    """A shard path or pattern matched no file."""


class IndexWriteError(IndextarError, OSError):
    """An index could not be written where it was meant to go."""


class SamplerStateError(IndextarError, ValueError):
    """A sampler state dict does not fit the sampler it is loaded into."""


class DecodeError(IndextarError, ValueError):
    """A sample's member could not be decoded.

    Attributes
    ----------
    shard, key, ext
        The shard, the sample's ``__key__`` and the member's extension, when known.
    """

    def __init__(
        self,
        message: str,
        *,
        shard: str | None = None,
        key: str | None = None,
        ext: str | None = None,
    ):
        self.shard = shard
        self.key = key
        self.ext = ext
        super().__init__(_located(message, shard=shard, key=key, ext=ext))


class UnsafeMemberError(DecodeError):
    """A pickle or torch member would run code to decode; refused without ``allow_unsafe=True``."""


class DecodeSpecError(IndextarError, ValueError):
    """A ``decode=`` argument is not a known spec string or a callable handler."""


class SampleKeyError(IndextarError, KeyError):
    """A sample lacks a requested member, or no sample has the requested ``__key__``."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class SampleIndexError(IndextarError, IndexError):
    """A dataset index is out of range."""


class ManifestError(IndextarError, ValueError):
    """A dataset manifest is malformed or does not match its shards."""


class WriterError(IndextarError, ValueError):
    """A sample cannot be written: a bad or repeated key, or a writer that is closed.

    Attributes
    ----------
    shard, key
        The shard being written and the sample's ``__key__``, when known.
    """

    def __init__(self, message: str, *, shard: str | None = None, key: str | None = None):
        self.shard = shard
        self.key = key
        super().__init__(_located(message, shard=shard, key=key))


class EncodeError(WriterError):
    """A sample's value cannot be encoded for its extension.

    Attributes
    ----------
    ext
        The extension whose value could not be encoded.
    """

    def __init__(
        self,
        message: str,
        *,
        shard: str | None = None,
        key: str | None = None,
        ext: str | None = None,
    ):
        self.ext = ext
        super().__init__(
            f"member {ext!r}: {message}" if ext is not None else message, shard=shard, key=key
        )


class RemoteReadError(IndextarError, OSError):
    """A remote read failed, after retries where the failure looked transient.

    Attributes
    ----------
    url
        The object's URL.
    offset, length
        The byte range asked for; ``None`` for a whole-object request.
    attempts
        How many times it was tried.
    key
        The sample whose bytes these were, where a sample was read.
    status
        The last HTTP status answered, where there was one.
    """

    def __init__(
        self,
        message: str,
        *,
        url: str,
        offset: int | None = None,
        length: int | None = None,
        attempts: int = 1,
        key: str | None = None,
        status: int | None = None,
    ):
        self.url = url
        self.offset = offset
        self.length = length
        self.attempts = attempts
        self.key = key
        self.status = status
        self.reason = message
        where = repr(url)
        if offset is not None and length is not None:
            where += f" bytes {offset}-{offset + length - 1} ({length} bytes)"
        if key is not None:
            where += f" of sample {key!r}"
        tries = f"{attempts} attempt{'s' if attempts != 1 else ''}"
        last = f", last status {status}" if status is not None else ""
        super().__init__(f"reading {where} failed after {tries}{last}: {message}")

    def for_sample(self, key: str) -> RemoteReadError:
        """This error, naming the sample ``key`` whose bytes were read."""
        if self.key is not None:
            return self
        return RemoteReadError(
            self.reason, url=self.url, offset=self.offset, length=self.length,
            attempts=self.attempts, key=key, status=self.status,
        )  # fmt: skip


class WrongRangeError(IndextarError, OSError):
    """A server answered a ranged read with other bytes than those asked for: another
    ``Content-Range``, a status other than 206, the whole object, or a body of another
    length. Transient: the read is retried, and the answer is never served.

    Attributes
    ----------
    url, offset, length
        The object and the byte range asked for.
    status
        The status answered.
    """

    def __init__(self, message: str, *, url: str, offset: int, length: int, status: int | None):
        self.url = url
        self.offset = offset
        self.length = length
        self.status = status
        super().__init__(
            f"{url!r} answered a read of bytes {offset}-{offset + length - 1} with {message}"
        )


class PipeRefusedError(IndextarError, PermissionError):
    """A ``pipe:`` shard would run a shell command and was not allowed."""


class CacheFullError(IndextarError, OSError):
    """A shard does not fit into the shard cache, even after evicting unused shards."""


class ExportError(IndextarError, ValueError):
    """A shard's index cannot be expressed in another tool's format (DALI, wids)."""


class ConvertError(IndextarError, ValueError):
    """A dataset cannot be converted to shards: an unknown or malformed source format, a
    column that cannot be stored, or a conversion resumed with other options.

    Attributes
    ----------
    source
        The source dataset's path (a folder or a file), when known.
    """

    def __init__(self, message: str, *, source: str | None = None):
        self.source = source
        super().__init__(f"{source!r}: {message}" if source is not None else message)


class SampleAttributeError(IndextarError, ValueError):
    """A sample's attributes cannot be read: its metadata member is missing, not valid
    JSON or not a JSON object, or an imported table names a key twice.

    Attributes
    ----------
    shard, key
        The shard and the sample's ``__key__``, when known.
    """

    def __init__(self, message: str, *, shard: str | None = None, key: str | None = None):
        self.shard = shard
        self.key = key
        super().__init__(_located(message, shard=shard, key=key))


class SelectionError(IndextarError, ValueError):
    """A ``where`` expression cannot be evaluated over a shard's index, or a value used
    for buckets is missing."""


class MissingAttributesError(SelectionError):
    """A ``where`` condition or a value names an attribute, and some shards' indexes have
    no attributes at all (built without ``attributes_from=``): their samples would all
    read as NULL.

    Attributes
    ----------
    shards
        The shards whose indexes have no attributes.
    column
        The attribute named, as the other indexes spell it.
    source
        Where the other indexes' column came from: ``"json:<ext>"`` (``build_index(...,
        attributes_from=ext)``) or ``"import:<file name>"`` (``import_attributes``).
    """

    def __init__(self, message: str, *, shards: tuple[str, ...], column: str, source: str):
        self.shards = shards
        self.column = column
        self.source = source
        super().__init__(message)


class JoinError(IndextarError, ValueError):
    """Two shard sets cannot be joined by key: a member extension on both sides (without
    ``prefix=`` or ``rename=``), or a key held by more than one sample of the joined side."""


def _located(message: str, *, shard: str | None, key: str | None, ext: str | None = None) -> str:
    """``message`` after the shard, sample and member it concerns (those known):
    ``"shard 'a.tar', sample 'k': message"``."""
    where = [
        f"{what} {value!r}"
        for what, value in (("shard", shard), ("sample", key), ("member", ext))
        if value is not None
    ]
    return f"{', '.join(where)}: {message}" if where else message
