"""Per-sample attributes read from each sample's JSON member: ``attributes_from="json"``.

``build_index(..., attributes_from="json")`` reads each sample's ``.json`` member once,
and ``ShardWriter(..., attributes_from="json")`` takes it from the bytes it writes
(``meta=`` is the deprecated name of ``attributes_from=``: :func:`attributes_member`);
either way an
:class:`AttributeBuilder` turns the members' top-level fields into the columns of an
:class:`~indextar.index.attributes.AttributeTable`, which
:func:`~indextar.index.attributes.write_attributes` stores in the index.

A sample whose member is missing, is not valid UTF-8 JSON or is not a JSON object is
an error naming the shard and the key (``on_error="fail"``), or (``"skip"``) is
logged, has no attributes (NULL in every column) and is listed in the index's
``attribute_errors`` table. It is never dropped from the index or left unreported.
"""

from __future__ import annotations

import itertools
import json
import logging
import mmap
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Literal

import numpy as np

from ..errors import SampleAttributeError
from .attributes import (
    MAX_COLUMNS,
    RESERVED_NAMES,
    AttributeTable,
    Value,
    json_source,
    sql_value,
)
from .naming import Grouping

__all__ = [
    "AttributeBuilder",
    "OnError",
    "attributes_member",
    "parse_attributes",
    "read_json_attributes",
]

log = logging.getLogger(__name__)

OnError = Literal["fail", "skip"]


def attributes_member(attributes_from: str | None, meta: str | None, *, call: str) -> str | None:
    """The member to read attributes from: ``attributes_from=``, or ``meta=``, its
    deprecated name (until indextar 0.3), with a :class:`DeprecationWarning`."""
    if meta is None:
        return attributes_from
    if attributes_from is not None:
        raise TypeError(f"{call}() takes attributes_from= or meta= (its old name), not both")
    warnings.warn(
        f"{call}(meta=...) is deprecated; use {call}(attributes_from=...): the member whose "
        "JSON fields become the attributes (meta= goes in indextar 0.3)",
        DeprecationWarning,
        stacklevel=3,
    )
    return meta


_SHOWN = 5  # errors named in a skip's log message

_decode_json = json.JSONDecoder().decode
# The C scanner on its own: half the cost of json.loads per call (no type checks, no
# regular expressions); anything it does not take whole goes to _decode_json.
_scan_json: Callable[[str, int], tuple[object, int]]
_scan_json = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
_PLAIN = frozenset({int, float, str, type(None)})  # stored as they are (ints checked below)


class AttributeBuilder:
    """Collects one shard's attributes sample by sample (a writer's, or a build's).

    :meth:`add` takes each sample's member text in order; with ``on_error="fail"`` a
    bad one raises before anything of it is recorded, so a writer can refuse the
    sample and stay usable. The parsed objects are kept until :meth:`table` turns them
    into columns, one list comprehension a column: per sample that is a JSON parse and
    a set check of its field names, the least Python a sample can cost.
    """

    def __init__(self, *, shard: str, ext: str, on_error: OnError = "fail") -> None:
        if on_error not in ("fail", "skip"):
            raise ValueError(f"on_error must be 'fail' or 'skip'; got {on_error!r}")
        self.shard, self.ext, self.on_error = shard, ext, on_error
        self._records: list[dict[str, object] | None] = []
        self._names: dict[str, None] = {}  # every field name seen, in first-seen order
        self._folded: dict[str, str] = {}  # SQLite column names ignore ASCII case
        self._errors: list[tuple[int, str]] = []
        self._keys: dict[int, str] = {}  # the keys of samples in error, for the log

    def _problem(self, text: bytes | None) -> tuple[dict[str, object] | None, str | None]:
        """The sample's fields, or the problem with its member."""
        ext = self.ext
        if text is None:
            return None, f"has no {ext!r} member"
        try:  # decoded as json.loads(bytes) decodes: a BOM, UTF-16 or UTF-32 too
            string = text.decode(json.detect_encoding(text), "surrogatepass")
            try:
                parsed, end = _scan_json(string, 0)
                if end != len(string) and not string[end:].isspace():
                    raise ValueError("more after the value")
            except (StopIteration, ValueError):  # leading or trailing space, or an error
                parsed = _decode_json(string)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            return None, f"its {ext!r} member is not valid JSON ({e})"
        except RecursionError:  # json.loads fails so too
            return None, f"its {ext!r} member nests deeper than Python's json module reads"
        if type(parsed) is not dict:
            return None, f"its {ext!r} member is a JSON {type(parsed).__name__}, not an object"
        if self._names.keys() >= parsed.keys():  # no new field: the common case
            return parsed, None
        refused = self._refused(parsed)
        if refused is not None:
            return None, f"its {ext!r} member has the field {refused}"
        return parsed, None

    def add(self, text: bytes | None, key: str) -> None:
        """Record the next sample's member (``None``: it has none).

        Raises
        ------
        SampleAttributeError
            If the member is missing or not a JSON object, with ``on_error="fail"``.
        """
        fields, problem = self._problem(text)
        if problem is not None:
            if self.on_error == "fail":
                raise SampleAttributeError(problem, shard=self.shard, key=key)
            self._errors.append((len(self._records), problem))
            self._keys[len(self._records)] = key
        elif not self._names.keys() >= fields.keys():  # type: ignore[union-attr]
            for name in fields:  # type: ignore[union-attr]
                if name not in self._names:
                    self._names[name] = None
                    self._folded[name.lower()] = name
        self._records.append(fields)

    def add_fields(self, fields: dict[str, object], key: str) -> None:
        """Record the next sample's fields, already parsed: a writer's that writes them
        as the member's JSON itself (``convert``), so nothing is parsed back.

        Raises
        ------
        SampleAttributeError
            If a field may not be a column, with ``on_error="fail"``.
        """
        if not self._names.keys() >= fields.keys():
            refused = self._refused(fields)
            if refused is not None:
                problem = f"its {self.ext!r} member has the field {refused}"
                if self.on_error == "fail":
                    raise SampleAttributeError(problem, shard=self.shard, key=key)
                self._errors.append((len(self._records), problem))
                self._keys[len(self._records)] = key
                self._records.append(None)
                return
            for name in fields:
                if name not in self._names:
                    self._names[name] = None
                    self._folded[name.lower()] = name
        self._records.append(fields)

    def add_many(self, texts: Sequence[bytes | None], keys: Sequence[str]) -> None:
        """:meth:`add` for each of ``texts`` in turn: a build's loop.

        The common case, a whole member that is an object, is inline, and its field
        names are checked once for all of them at the end (the union of their keys,
        in C); if any new name is refused, the samples go through :meth:`add` one by
        one so that each error names its sample."""
        scan, records = _scan_json, self._records
        append, first = records.append, len(records)
        for text, key in zip(texts, keys):
            if text is not None:
                try:
                    string = text.decode("utf-8")
                    parsed, end = scan(string, 0)
                    if end == len(string) and type(parsed) is dict:
                        append(parsed)
                        continue
                except (StopIteration, ValueError, RecursionError):  # UnicodeDecodeError
                    pass  # is a ValueError; add() names the problem
            self.add(text, key)  # anything else: checked, reported or added one by one
        added = records[first:]
        union = dict.fromkeys(itertools.chain.from_iterable(r for r in added if r is not None))
        new = [name for name in union if name not in self._names]
        if new and self._refused(new) is not None:
            del records[first:]
            self._errors = [(s, m) for s, m in self._errors if s < first]
            for text, key in zip(texts, keys):
                self.add(text, key)
            return
        for name in new:
            self._names[name] = None
            self._folded[name.lower()] = name

    def _refused(self, names: Iterable[str]) -> str | None:
        """The first of these field names that may not become a column beside the known
        ones and each other, and why; ``None`` if they all may."""
        folded = dict(self._folded)
        for name in names:
            known = folded.setdefault(name.lower(), name)
            if name.lower() in RESERVED_NAMES:
                return f"{name!r}, whose name is reserved"
            if known != name:  # SQLite column names ignore ASCII case
                return f"{name!r}, whose name differs from {known!r} only in case"
            if len(folded) > MAX_COLUMNS:
                return (
                    f"{name!r}, which would be column {len(folded):,} of the shard's "
                    f"attributes; an index holds at most {MAX_COLUMNS:,}"
                )
        return None

    def table(self) -> AttributeTable:
        """The attributes of the samples added so far (and a warning for the bad ones)."""
        errors = self._errors
        if errors:
            shown = "; ".join(f"{self._keys[s]!r}: {m}" for s, m in errors[:_SHOWN])
            more = "; ..." if len(errors) > _SHOWN else ""
            log.warning(
                "%r: %d of %d samples have no attributes (on_error='skip'): %s%s",
                self.shard,
                len(errors),
                len(self._records),
                shown,
                more,
            )
        records = [{} if r is None else r for r in self._records]
        columns: dict[str, list[Value]] = {}
        for name in self._names:
            values = [r.get(name) for r in records]
            kinds = set(map(type, values))
            if not kinds <= _PLAIN or (int in kinds and not _fits_int64(values)):
                values = [sql_value(v) for v in values]
            columns[name] = _utf8_text(values)  # type: ignore[arg-type]
        return AttributeTable(len(records), columns, json_source(self.ext), list(errors))


def _utf8_text(values: list[Value]) -> list[Value]:
    """``values`` with each lone surrogate in a string (JSON may escape one: "\\ud800")
    as U+FFFD, as TEXT holds a name that is not UTF-8 (SQLite text must be UTF-8)."""
    strings = [v for v in values if type(v) is str]
    try:
        "".join(strings).encode("utf-8")  # every string at once, in C: the common case
        return values
    except UnicodeEncodeError:
        return [
            v.encode("utf-16", "surrogatepass").decode("utf-16", "replace") if type(v) is str else v
            for v in values
        ]


def _fits_int64(values: list[object]) -> bool:
    ints = [v for v in values if type(v) is int]
    return -(1 << 63) <= min(ints) and max(ints) < (1 << 63)


def parse_attributes(
    texts: Sequence[bytes | None],
    keys: Sequence[str],
    *,
    shard: str,
    ext: str,
    on_error: OnError = "fail",
) -> AttributeTable:
    """Parse each sample's JSON member (``None``: the sample has none) into columns.

    Raises
    ------
    SampleAttributeError
        For the first bad sample, with ``on_error="fail"``.
    """
    builder = AttributeBuilder(shard=shard, ext=ext, on_error=on_error)
    builder.add_many(texts, keys)
    return builder.table()


def read_json_attributes(
    shard: Path,
    data_offsets: np.ndarray,
    sizes: np.ndarray,
    grouping: Grouping,
    *,
    ext: str = "json",
    on_error: OnError = "fail",
) -> AttributeTable:
    """Read and parse the ``ext`` member of every sample of a scanned local shard.

    ``data_offsets`` and ``sizes`` are the scan's, by scan row. One read of the map per
    sample; a sample without the member has ``None`` text.
    """
    texts: list[bytes | None] = [None] * len(grouping.keys)
    if ext in grouping.ext_names and len(grouping.keys):
        code = grouping.ext_names.index(ext)
        members = np.flatnonzero(grouping.ext_codes == code)
        samples = grouping.sample_of_member[members].tolist()
        rows = grouping.entries[members]
        starts = data_offsets[rows].tolist()
        ends = (data_offsets[rows] + sizes[rows]).tolist()
        with open(shard, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            found = [mm[start:end] for start, end in zip(starts, ends)]
        if len(found) == len(texts):  # every sample has one: they are in sample order
            texts = found  # type: ignore[assignment]
        else:
            for sample, text in zip(samples, found):
                texts[sample] = text
    return parse_attributes(texts, grouping.keys, shard=str(shard), ext=ext, on_error=on_error)
