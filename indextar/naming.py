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

import dataclasses
import re
from collections import Counter
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .errors import SampleFormatError
from .tarscan import TarScan

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
        Row in the :class:`~indextar.tarscan.TarScan` of each indexed member.
    exts
        Extension of each indexed member.
    keys
        Key of each sample.
    first_member
        Position (into ``entries``) of each sample's first member.
    member_count
        Number of members of each sample.
    skipped
        ``(scan row, reason)`` for each entry that belongs to no sample.
    scattered_keys
        Keys that occur in more than one sample (their members are not adjacent).
    """

    entries: npt.NDArray[np.int64]
    exts: list[str]
    keys: list[str]
    first_member: npt.NDArray[np.int64]
    member_count: npt.NDArray[np.int64]
    skipped: list[tuple[int, str]]
    scattered_keys: list[str]

    @property
    def sample_of_member(self) -> npt.NDArray[np.int64]:
        """Sample number of each indexed member."""
        return np.repeat(np.arange(len(self.keys), dtype=np.int64), self.member_count)


def group_members(scan: TarScan, *, shard: str | None = None) -> Grouping:
    """Group a scanned shard's members into samples by the naming rules.

    Raises
    ------
    SampleFormatError
        If an extension repeats within one sample.
    """
    names = scan.names
    skipped: list[tuple[int, str]] = []
    regular = scan.is_regular()
    rows = np.flatnonzero(regular).tolist()
    if len(rows) < len(names):
        skipped.extend((row, scan.kind(row)) for row in np.flatnonzero(~regular).tolist())
    member_rows: list[int] = []
    member_keys: list[str] = []
    raw_exts: list[str] = []
    for row in rows:
        name = names[row]
        # Fast path, equal to webdataset's regex whenever it applies: a base name
        # with a dot that is not its first character, no newline, not a meta name.
        base = name.rfind("/") + 1
        dot = name.find(".", base)
        if dot > base and "\n" not in name and not name.startswith("__"):
            member_keys.append(name[:dot])
            raw_exts.append(name[dot + 1 :])
        else:
            reason = skip_reason(name)
            if reason is not None:
                skipped.append((row, reason))
                continue
            key, ext = _WDS_KEY_EXT.match(name).groups()  # type: ignore[union-attr]
            member_keys.append(key)
            raw_exts.append(ext)
        member_rows.append(row)
    skipped.sort()
    rows = member_rows
    lowered = {ext: ext.lower() for ext in set(raw_exts)}
    exts = [lowered[ext] for ext in raw_exts]
    if _RESERVED_EXTS.intersection(lowered.values()):
        _raise_reserved_extension(exts, rows, scan, shard)

    starts = [
        i for i, (key, before) in enumerate(zip(member_keys, [None, *member_keys])) if key != before
    ]
    first = np.asarray(starts, dtype=np.int64)
    count = np.diff(np.append(first, len(rows))).astype(np.int64)
    grouping = Grouping(
        entries=np.asarray(rows, dtype=np.int64),
        exts=exts,
        keys=[member_keys[i] for i in starts],
        first_member=first,
        member_count=count,
        skipped=skipped,
        scattered_keys=[],
    )
    if len(starts) < len(rows):  # some sample has several members: check extensions
        codes = {ext: i for i, ext in enumerate(lowered.values())}
        pairs = grouping.sample_of_member * len(codes) + np.fromiter(
            (codes[ext] for ext in exts), np.int64, len(exts)
        )
        if len(np.unique(pairs)) < len(pairs):
            _raise_repeated_extension(grouping, scan, grouping.sample_of_member.tolist(), shard)
    keys = grouping.keys
    if len(set(keys)) < len(keys):
        repeated = sorted(key for key, n in Counter(keys).items() if n > 1)
        grouping = dataclasses.replace(grouping, scattered_keys=repeated)
    return grouping


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


def _raise_reserved_extension(exts: list[str], rows: list[int], scan: TarScan, shard: str | None) -> None:
    position = next(i for i, ext in enumerate(exts) if ext in _RESERVED_EXTS)
    row = rows[position]
    raise SampleFormatError(
        f"member {scan.names[row]!r} has the extension {exts[position]!r}, which names a field "
        "every sample already has (webdataset refuses it as a duplicate); rename the member",
        shard=shard,
        offset=int(scan.header_offsets[row]),
    )
