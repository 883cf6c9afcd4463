"""WebDataset naming rules: member name -> (key, extension), and members -> samples.

The rules follow webdataset 1.0's streaming reader (``tar_file_expander`` plus
``group_by_keys``), which is the reference where in doubt:

* a member's **key** is its path up to the first dot after the last ``/``; the
  rest is its **extension**, lowercased;
* **consecutive** members with the same key form one sample;
* skipped, and counted by reason: entries that are not regular files, names
  with no extension (webdataset's ``^((?:.*/|)[^.]+)[.]([^/]*)$`` does not match:
  no dot after the last ``/``, or a name that starts with a dot), and
  webdataset's meta entries (names matching ``__[^/]*__($|/)``, such as
  ``__meta__`` or ``__dir__/x``; ``__meta__.json`` is an ordinary sample);
* a repeated extension inside one sample is an error, and so is the extension
  ``__key__`` or ``__url__`` (webdataset's own sample fields).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ..errors import SampleFormatError
from ..tar.extensions import tarwalk
from ..tar.scan import TarScan

__all__ = ["split_name", "skip_reason", "Grouping", "group_members"]

# The exact expressions webdataset uses: its behaviour on odd names (a base name
# starting with a dot, a newline in a name) is ours too.
_WDS_KEY_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_WDS_META = re.compile(r"__[^/]*__($|/)")
# Fields webdataset puts in every sample dict: a member with such an extension
# would overwrite them, and webdataset refuses it as a duplicate.
_RESERVED_EXTS = frozenset({"__key__", "__url__"})


def split_name(name: str) -> tuple[str, str] | None:
    """Split a member name into ``(key, extension)``; ``None`` if it has no extension.

    >>> split_name("train/0001.seg.png")
    ('train/0001', 'seg.png')
    >>> split_name("a.b/c.JPG")
    ('a.b/c', 'jpg')
    >>> split_name("README") is None
    True
    """
    match = _WDS_KEY_EXT.match(name)
    return (match.group(1), match.group(2).lower()) if match else None


def skip_reason(name: str) -> str | None:
    """Why a regular file's name is not part of any sample, or ``None`` if it is."""
    if _WDS_META.match(name):
        return "meta"
    if _WDS_KEY_EXT.match(name) is None:
        return "hidden" if name.startswith(".") else "no-extension"
    return None


@dataclass(frozen=True, slots=True)
class Grouping:
    """Members of one shard grouped into samples.

    Attributes
    ----------
    entries
        Row in the :class:`~indextar.tar.scan.TarScan` of each indexed member.
    ext_names
        The distinct extensions, sorted.
    ext_codes
        Position in ``ext_names`` of each indexed member's extension.
    keys
        Key of each sample.
    first_member
        Position (into ``entries``) of each sample's first member.
    member_count
        Number of members of each sample.
    skipped
        ``(scan row, reason)`` for each entry that belongs to no sample.
    """

    entries: npt.NDArray[np.int64]
    ext_names: tuple[str, ...]
    ext_codes: npt.NDArray[np.int64]
    keys: list[str]
    first_member: npt.NDArray[np.int64]
    member_count: npt.NDArray[np.int64]
    skipped: list[tuple[int, str]]

    # Derived on demand, not on every build: only verify, the error paths and the
    # Python reference writer ask for them.

    @property
    def exts(self) -> list[str]:
        """Extension of each indexed member."""
        if not len(self.ext_codes):
            return []
        return np.array(self.ext_names, dtype=object)[self.ext_codes].tolist()  # type: ignore[no-any-return]

    @property
    def scattered_keys(self) -> list[str]:
        """Keys that occur in more than one sample (their members are not adjacent)."""
        if len(set(self.keys)) == len(self.keys):
            return []
        return sorted(key for key, n in Counter(self.keys).items() if n > 1)

    @property
    def sample_of_member(self) -> npt.NDArray[np.int64]:
        """Sample number of each indexed member."""
        return np.repeat(np.arange(len(self.keys), dtype=np.int64), self.member_count)


def group_members(scan: TarScan, *, shard: str | None = None) -> Grouping:
    """Group a scanned shard's members into samples by the naming rules.

    Raises
    ------
    SampleFormatError
        If an extension repeats within one sample, or names a sample field.
    """
    regular = scan.is_regular()
    rows = np.flatnonzero(regular)
    skipped = [(row, scan.kind(row)) for row in np.flatnonzero(~regular).tolist()]
    fast = _group_c(scan.names, rows)
    if fast is None:
        fast = _group_numpy(scan.names, rows, skipped)
    rows, first, sample_keys, distinct, raw_codes = fast

    # Extensions as codes into a short table of distinct, lowercased extensions.
    ext_names = sorted({ext.lower() for ext in distinct})
    lower_code = np.array([ext_names.index(ext.lower()) for ext in distinct], dtype=np.int64)
    codes = lower_code[raw_codes] if len(raw_codes) else raw_codes
    count = np.diff(np.append(first, len(rows))).astype(np.int64)
    grouping = Grouping(
        entries=np.asarray(rows, dtype=np.int64),
        ext_names=tuple(ext_names),
        ext_codes=np.asarray(codes, dtype=np.int64),
        keys=sample_keys,
        first_member=first,
        member_count=count,
        skipped=skipped,
    )
    if _RESERVED_EXTS.intersection(ext_names):
        _raise_reserved_extension(grouping.exts, rows.tolist(), scan, shard)
    if len(first) < len(rows):  # some sample has several members: check extensions
        pairs = grouping.sample_of_member * max(1, len(ext_names)) + codes
        ordered = np.sort(pairs)  # np.unique hashes, far slower on many distinct values
        if (ordered[1:] == ordered[:-1]).any():
            _raise_repeated_extension(grouping, scan, grouping.sample_of_member.tolist(), shard)
    return grouping


# Member rows, each sample's first position in them and its key, the distinct raw
# extensions and each member's code into them.
_Groups = tuple[
    npt.NDArray[np.int64], npt.NDArray[np.int64], list[str], list[str], npt.NDArray[np.int64]
]


def _group_c(names: list[str], rows: npt.NDArray[np.int64]) -> _Groups | None:
    """The C walker's grouping of the common case (``None`` where it does not apply)."""
    walker = tarwalk()
    if walker is None:
        return None
    try:
        grouped = walker.group(names, np.ascontiguousarray(rows, dtype=np.int64))
    except UnicodeEncodeError:  # a name that was not UTF-8: the reference grouping reads it
        return None
    if grouped is None:
        return None
    first, keys, codes, exts = grouped
    return (
        np.asarray(rows, dtype=np.int64),
        np.frombuffer(first, np.int64),
        keys,
        exts,
        np.frombuffer(codes, np.int64),
    )


def _group_numpy(
    names: list[str], rows: npt.NDArray[np.int64], skipped: list[tuple[int, str]]
) -> _Groups:
    """The reference grouping: array operations, or webdataset's regex name by name."""
    split = _split_vectorised(names, rows)
    if split is None:  # names the fast path cannot decide: webdataset's regex, per name
        split = _split_python(names, rows, skipped)
        skipped.sort()
    rows, keys, raw_exts = split
    distinct, raw_codes = _distinct(raw_exts)
    boundary = np.ones(len(keys), dtype=bool)
    boundary[1:] = keys[1:] != keys[:-1]
    first = np.flatnonzero(boundary).astype(np.int64)
    return rows, first, keys[first].tolist(), distinct, raw_codes


def _distinct(strings: npt.NDArray[np.str_]) -> tuple[list[str], npt.NDArray[np.int64]]:
    """Distinct values of a string array and each element's code into them.

    Short ASCII strings (extensions, almost always) are packed into integers, which
    numpy sorts far faster than strings; anything else goes through a dict.
    """
    width = strings.dtype.itemsize // 4
    points = strings.view(np.uint32).reshape(len(strings), width) if len(strings) else None
    if points is not None and width <= 9 and bool((points < 128).all()):
        shifts = (7 * np.arange(width - 1, -1, -1)).astype(np.uint64)
        packed = (points.astype(np.uint64) << shifts).sum(axis=1)
        _, first, inverse = np.unique(packed, return_index=True, return_inverse=True)
        return strings[first].tolist(), inverse.astype(np.int64).ravel()
    table: dict[str, int] = {}
    codes = [table.setdefault(value, len(table)) for value in strings.tolist()]
    return list(table), np.asarray(codes, dtype=np.int64)


_Split = tuple[npt.NDArray[np.int64], npt.NDArray[np.str_], npt.NDArray[np.str_]]
_MAX_VECTOR_NAME = 256  # longer names: the per-name path, not (n, width) arrays


def _split_vectorised(names: list[str], rows: npt.NDArray[np.int64]) -> _Split | None:
    """Split every regular member's name into key and extension with array operations.

    Handles the names where the simple rule *key = up to the first dot after the last
    slash* provably equals webdataset's regex: the base name has a dot that is not its
    first character, there is no newline, and the name cannot be a meta entry (does
    not start with ``__``). Returns ``None`` if any name falls outside that.
    """
    if len(rows) == 0:
        empty = np.zeros(0, dtype=str)
        return rows.astype(np.int64), empty, empty
    chosen = np.array(names if len(rows) == len(names) else [names[i] for i in rows], dtype=str)
    width = chosen.dtype.itemsize // 4
    if width > _MAX_VECTOR_NAME or width < 2:
        return None
    points = chosen.view(np.uint32).reshape(len(chosen), width)  # one code point a column
    columns = np.arange(width)
    slash = points == ord("/")
    base = np.where(slash.any(axis=1), width - np.argmax(slash[:, ::-1], axis=1), 0)
    dots = (points == ord(".")) & (columns >= base[:, None])
    dot = np.argmax(dots, axis=1)
    length = np.count_nonzero(points, axis=1)
    fast = (
        dots.any(axis=1)
        & (dot > base)
        & ~(points == ord("\n")).any(axis=1)
        & ~((points[:, 0] == ord("_")) & (points[:, 1] == ord("_")))
        & (np.char.str_len(chosen) == length)  # no NUL inside a name
    )
    if not fast.all():
        return None
    keys = np.where(columns < dot[:, None], points, np.uint32(0))
    ext_len = length - dot - 1
    ext_width = max(int(ext_len.max()), 1)
    take = np.minimum(dot[:, None] + 1 + np.arange(ext_width), width - 1)
    ext_points = np.take_along_axis(points, take, axis=1)
    ext_points[np.arange(ext_width) >= ext_len[:, None]] = 0
    return (
        rows.astype(np.int64),
        keys.view(f"U{width}").ravel(),
        np.ascontiguousarray(ext_points, dtype=np.uint32).view(f"U{ext_width}").ravel(),
    )


def _split_python(
    names: list[str], rows: npt.NDArray[np.int64], skipped: list[tuple[int, str]]
) -> _Split:
    """Split names one by one with webdataset's regex; appends skipped names to ``skipped``."""
    member_rows: list[int] = []
    member_keys: list[str] = []
    raw_exts: list[str] = []
    for row in rows.tolist():
        name = names[row]
        reason = skip_reason(name)
        if reason is not None:
            skipped.append((row, reason))
            continue
        key, ext = _WDS_KEY_EXT.match(name).groups()  # type: ignore[union-attr]
        member_rows.append(row)
        member_keys.append(key)
        raw_exts.append(ext)
    return (
        np.asarray(member_rows, dtype=np.int64),
        np.array(member_keys, dtype=str),
        np.array(raw_exts, dtype=str),
    )


def _raise_repeated_extension(
    grouping: Grouping, scan: TarScan, sample_of_member: list[int], shard: str | None
) -> None:
    seen: set[tuple[int, str]] = set()
    for position, pair in enumerate(zip(sample_of_member, grouping.exts)):
        if pair in seen:
            row = int(grouping.entries[position])
            key = grouping.keys[pair[0]]
            raise SampleFormatError(
                f"sample {key!r} has the extension {pair[1]!r} twice (member "
                f"{scan.names[row]!r}); each extension may occur once per sample",
                shard=shard,
                offset=int(scan.header_offsets[row]),
            )
        seen.add(pair)


def _raise_reserved_extension(
    exts: list[str], rows: list[int], scan: TarScan, shard: str | None
) -> None:
    position = next(i for i, ext in enumerate(exts) if ext in _RESERVED_EXTS)
    row = rows[position]
    raise SampleFormatError(
        f"member {scan.names[row]!r} has the extension {exts[position]!r}, which names a field "
        "every sample already has (webdataset refuses it as a duplicate); rename the member",
        shard=shard,
        offset=int(scan.header_offsets[row]),
    )


def sql_text(name: str) -> str:
    """``name`` as SQLite TEXT, which must be UTF-8: each byte read by surrogateescape
    (a name that was not UTF-8) becomes U+FFFD; :func:`raw_name` keeps the exact bytes."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return name


def raw_name(name: str) -> bytes | None:
    """The bytes of a ``name`` that was not UTF-8 in the tar; ``None`` for every other."""
    raw = name.encode("utf-8", "surrogateescape")
    return None if sql_text(name) is name else raw


def from_sql(text: str, raw: bytes | None) -> str:
    """A name or key from its TEXT column and its raw_* column (see docs/format.md)."""
    return text if raw is None else raw.decode("utf-8", "surrogateescape")
