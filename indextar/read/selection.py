"""Selections by SQL over the shards' indexes: ``ds.where(...)`` and per-sample values.

A ``where`` expression is SQL, evaluated per shard over a view of each sample: its
attribute columns (:mod:`indextar.index.attributes`; NULL where a sample has none, or
its shard's attributes have no such column), ``__key__``, and ``size(ext)``, the size
of the sample's member with that extension (from the ``members`` table every index
has). Shards are queried in
parallel threads (SQLite releases the GIL while it steps); the result is one sorted
int64 array of the dataset's indices, O(selected), which :class:`~indextar.KeySubset`
holds as a view. An expression that names an attribute is refused
(:class:`~indextar.errors.MissingAttributesError`) where some shards' indexes have no
attributes at all (built without ``attributes_from=``): it would read every one of
their samples as NULL, which is not what those samples hold.

The result is cached in a small ``.npy`` file keyed by the expression and every
shard's index file (path, inode, size, mtime) and shard fingerprint: the same query on
unchanged indexes loads it instead of querying; a rebuilt index, an import into one or
a changed shard (refused as stale on open) makes another key.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import re
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..atomic import write_atomic
from ..errors import MissingAttributesError, SelectionError
from ..index.attributes import attribute_columns, attribute_sources, has_attribute_table, quote
from ..index.remote import default_cache_root
from ..index.shard import PathLike, ShardIndex, index_path
from ..source.location import ShardLocation
from .lookup import sample_keys
from .protocols import IndexedShards, KeyedView

__all__ = [
    "where_indices",
    "where_rows",
    "attribute_values",
    "bucket_ids",
    "default_selection_cache",
    "nonempty_shards",
    "update_identity",
]

log = logging.getLogger(__name__)

Array = npt.NDArray[np.int64]

_CACHE_VERSION = b"indextar.selection.v2"  # v1 read a shard without attributes as NULL
_THREADS = 8

# A string literal or quoted identifier (left alone), or a size(ext) call.
_SIZE_CALL = re.compile(
    r"""('(?:[^']|'')*'|"(?:[^"]|"")*")|\bsize\(\s*(?:'([^']*)'|([A-Za-z0-9_.-]+))\s*\)""",
    re.IGNORECASE,
)


def default_selection_cache() -> Path:
    """``$XDG_CACHE_HOME/indextar/selections``: where selections are cached by default."""
    return default_cache_root() / "selections"


def _expand_sizes(expression: str) -> str:
    """``size(jpg)`` (or ``size('jpg')``) as the sample's member size of that extension."""

    def replace(match: re.Match[str]) -> str:
        if match.group(1) is not None:
            return match.group(1)
        ext = (match.group(2) if match.group(2) is not None else match.group(3)).lower()
        literal = "'" + ext.replace("'", "''") + "'"
        return (
            "(SELECT size FROM members WHERE member_id >= __first__ AND "
            f"member_id < __first__ + __count__ AND ext = {literal})"
        )

    return _SIZE_CALL.sub(replace, expression)


def _sample_view(conn: sqlite3.Connection, columns: Sequence[str]) -> str:
    """A subquery with one row per sample: the index's own columns and the attributes
    (NULL for a column this shard does not have)."""
    present = {name.lower() for name in attribute_columns(conn)}
    parts = [
        "s.sample_id AS __sample__",
        "s.key AS __key__",
        "s.first_member AS __first__",
        "s.member_count AS __count__",
    ]
    parts += [
        f"a.{quote(name)} AS {quote(name)}" if name.lower() in present else f"NULL AS {quote(name)}"
        for name in columns
    ]
    join = (
        " LEFT JOIN attributes AS a ON a.__sample__ = s.sample_id"
        if has_attribute_table(conn)
        else ""
    )
    return f"SELECT {', '.join(parts)} FROM samples AS s{join}"


def _columns_of(indexes: Sequence[ShardIndex]) -> tuple[dict[str, str], list[ShardIndex]]:
    """Every attribute column of any of the indexes, in first-seen order (ASCII case
    folded, as SQLite compares column names), with where it came from; and the indexes
    with no attributes at all."""
    seen: dict[str, tuple[str, str]] = {}
    bare = []
    for index in indexes:
        with contextlib.closing(index.connect()) as conn:
            if not has_attribute_table(conn):
                bare.append(index)
                continue
            sources = attribute_sources(conn)
            for name in attribute_columns(conn):
                seen.setdefault(name.lower(), (name, sources.get(name, "")))
    return dict(seen.values()), bare


_NO_SUCH_COLUMN = re.compile(r"no such column: (.+)$")


def _refuse_bare(
    bare: Sequence[ShardIndex], columns: dict[str, str], expression: str, what: str, total: int
) -> None:
    """Raise if ``expression`` names an attribute that ``bare`` indexes (those with no
    attributes) lack: their samples would all be NULL for it, silently. Each is asked to
    compile the expression over its own columns only (``LIMIT 0``: no row is read)."""
    folded = {name.lower(): name for name in columns}
    lacking: list[str] = []
    named = ""
    for index in bare:
        with contextlib.closing(index.connect()) as conn:
            sql = f"SELECT ({expression}) FROM ({_sample_view(conn, [])}) LIMIT 0"
            try:
                conn.execute(sql)  # the caller's SQL, on a read-only connection, as _run's
            except sqlite3.OperationalError as e:
                found = _NO_SUCH_COLUMN.search(str(e))
                if found is not None and found.group(1).lower() in folded:
                    lacking.append(index.shard)
                    named = folded[found.group(1).lower()]
    if not lacking:
        return
    source = columns[named]
    if source.startswith("import:"):
        how = f"import_attributes(shards, {source.removeprefix('import:')!r})"
    else:
        member = source.removeprefix("json:") or "json"
        how = f"build_index(shard, attributes_from={member!r}, force=True)"
    listed = ", ".join(map(repr, lacking[:5])) + (" ..." if len(lacking) > 5 else "")
    raise MissingAttributesError(
        f"{what} names the attribute {named!r}, but the indexes of {len(lacking)} of {total} "
        f"shards have no attributes (and would read it as NULL for every sample): {listed}; "
        f"add them with {how}",
        shards=tuple(lacking),
        column=named,
        source=source,
    )


def _run(index: ShardIndex, sql: str, what: str) -> list[Any]:
    try:
        with contextlib.closing(index.connect()) as conn:
            return conn.execute(sql).fetchall()
    except sqlite3.Error as e:
        raise SelectionError(f"{what} fails on the index of {index.shard!r}: {e}") from e


def _shard_rows(
    dataset: IndexedShards,
    fields: Callable[[list[str]], str],
    condition: str | None,
    what: str,
    *,
    uses: str,
    parallel: bool = True,
) -> Iterator[tuple[ShardIndex, int, list[str], list[Any]]]:
    """``SELECT fields(columns) FROM <each sample> [WHERE condition]`` on every
    non-empty shard's index, in sample order: ``(index, first dataset index, columns,
    rows)`` shard by shard. ``uses``: the caller's expression (the condition, or the
    value), which may not name an attribute that a shard without attributes lacks
    (:class:`~indextar.errors.MissingAttributesError`). ``parallel``: the shards queried
    in threads (SQLite releases the GIL while it steps), else one at a time as they are
    consumed."""
    _, indexes, starts = _shards(dataset)
    sources, bare = _columns_of(indexes)
    if sources and bare:
        _refuse_bare(bare, sources, _expand_sizes(uses), what, len(indexes))
    columns = list(sources)
    chosen = fields(columns)
    where = "" if condition is None else f" WHERE ({_expand_sizes(condition)})"

    def one(index: ShardIndex) -> list[Any]:
        with contextlib.closing(index.connect()) as conn:
            view = _sample_view(conn, columns)
        return _run(index, f"SELECT {chosen} FROM ({view}){where} ORDER BY __sample__", what)

    if not parallel or len(indexes) <= 1:
        for index, start in zip(indexes, starts.tolist()):
            yield index, start, columns, one(index)
        return
    with ThreadPoolExecutor(min(_THREADS, len(indexes))) as pool:
        for index, start, rows in zip(indexes, starts.tolist(), pool.map(one, indexes)):
            yield index, start, columns, rows


def _shards(dataset: IndexedShards) -> tuple[list[int], list[ShardIndex], Array]:
    """The non-empty shards of an IndexedTarDataset: numbers, opened indexes (validated:
    a changed shard raises ``StaleIndexError``) and first dataset index of each."""
    numbers = nonempty_shards(dataset)
    indexes = [dataset.shard_index(n) for n in numbers]
    starts = np.asarray(dataset.shard_starts[numbers], dtype=np.int64)
    return numbers, indexes, starts


def _cache_key(expression: str, dataset: IndexedShards, numbers: Sequence[int]) -> str:
    """The cache key of a selection: the expression and the indexes' identities
    (:func:`update_identity`)."""
    digest = hashlib.blake2b(_CACHE_VERSION, digest_size=16)
    digest.update(f"{len(dataset)}\0{expression}\0".encode())
    update_identity(digest, dataset, numbers)
    return digest.hexdigest()


def nonempty_shards(dataset: IndexedShards) -> list[int]:
    """The numbers of ``dataset``'s shards that hold samples (the others have no index
    worth reading)."""
    return [n for n in range(len(dataset.shards)) if dataset.shard_sizes[n] > 0]


def update_identity(digest: Any, dataset: IndexedShards, numbers: Sequence[int]) -> None:
    """Add to ``digest`` (a ``hashlib`` object), per shard of ``numbers``, the index
    file's identity (path, inode, size, mtime: a rebuild or an import is a new file) and
    the shard's (its size and mtime, or for a URL its fingerprint). Stats only, so that
    a cached result opens in milliseconds; a shard changed since (another key) is then
    refused as stale when its index is opened to compute it again. The key of cached
    selections and joins."""
    for number in numbers:
        entry = dataset.shard_entries[number]
        if ShardLocation.of(entry.url).remote:
            index = dataset.shard_index(number)
            path, shard = index.path, index.meta.fingerprint
        else:
            path = Path(entry.index or index_path(entry.url, index_dir=dataset.index_dir))
            st = os.stat(entry.url)
            shard = f"{st.st_size}:{st.st_mtime_ns}"
        st = os.stat(path)
        identity = f"{os.path.abspath(path)}\0{st.st_ino}\0{st.st_size}\0{st.st_mtime_ns}"
        digest.update(f"{identity}\0{shard}\0".encode("utf-8", "surrogateescape"))


def where_indices(
    dataset: IndexedShards,
    expression: str,
    *,
    cache_dir: PathLike | None | bool = None,
) -> Array:
    """Sorted indices of ``dataset`` (an IndexedTarDataset) whose sample satisfies the
    SQL ``expression``; see the module docstring for what it may name.

    ``cache_dir``: the folder of cached selections (default
    :func:`default_selection_cache`); ``False`` neither reads nor writes a cache.

    Raises
    ------
    SelectionError
        If the expression is not valid SQL over a shard's samples, with the shard.
    StaleIndexError
        If a shard changed since it was indexed.
    """
    if not isinstance(expression, str) or not expression.strip():
        raise SelectionError(f"where= needs an SQL expression; got {expression!r}")
    cache_file = None
    if cache_dir is not False:
        folder = (
            default_selection_cache() if cache_dir is None or cache_dir is True else Path(cache_dir)
        )
        numbers = nonempty_shards(dataset)
        with contextlib.suppress(FileNotFoundError, ValueError, OSError):
            cache_file = folder / f"{_cache_key(expression, dataset, numbers)}.npy"
            cached: Array = np.load(cache_file, allow_pickle=False)
            if cached.dtype == np.int64 and cached.ndim == 1:
                log.debug("selection %r from the cache %s", expression, cache_file)
                return cached
    shards = _shard_rows(
        dataset, lambda _: "__sample__", expression, f"where={expression!r}", uses=expression
    )
    parts = [
        start + np.fromiter((r[0] for r in rows), np.int64, len(rows))
        for _, start, _, rows in shards
    ]
    selected = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
    if selected.size and (
        (np.diff(selected) <= 0).any() or selected[0] < 0 or selected[-1] >= len(dataset)
    ):  # only an expression that closes the WHERE's parenthesis can do this
        raise SelectionError(
            f"where={expression!r} changed the query: its samples are not one each, in order"
        )
    if cache_file is not None:
        buffer = io.BytesIO()
        np.save(buffer, selected, allow_pickle=False)
        try:
            write_atomic(cache_file, buffer.getvalue())
        except OSError as e:  # a read-only home still selects, uncached
            log.warning("cannot cache the selection in %s: %s", cache_file.parent, e)
    return selected


def where_rows(dataset: IndexedShards, expression: str) -> Iterator[dict[str, Any]]:
    """Each selected sample's row, shard by shard: ``__shard__``, ``__index__`` (in the
    dataset), ``__key__`` and every attribute column (``None`` for NULL)."""
    shards = _shard_rows(
        dataset,
        lambda columns: ", ".join(["__sample__", "__key__", *map(quote, columns)]),
        expression,
        f"where={expression!r}",
        uses=expression,
        parallel=False,  # one shard's rows at a time
    )
    for index, start, columns, rows in shards:
        for row in rows:
            fields = {"__shard__": index.shard, "__index__": start + row[0], "__key__": row[1]}
            yield fields | dict(zip(columns, row[2:]))


def attribute_values(dataset: IndexedShards, expression: str) -> npt.NDArray[np.float64]:
    """The numeric value of the SQL ``expression`` for every sample of ``dataset`` (an
    IndexedTarDataset), in dataset order; NaN where it is NULL.

    The expression may name what a ``where`` may (attributes, ``__key__``, ``size(ext)``),
    for example ``"width * 1.0 / height"``.
    """
    value = f"({_expand_sizes(expression)})"
    shards = _shard_rows(
        dataset, lambda _: value, None, f"the value {expression!r}", uses=expression
    )
    out = np.empty(len(dataset), np.float64)
    at = 0
    for _, _, _, found in shards:
        try:
            out[at : at + len(found)] = [np.nan if r[0] is None else r[0] for r in found]
        except (TypeError, ValueError) as e:
            raise SelectionError(f"the value {expression!r} is not a number: {e}") from e
        at += len(found)
    return out


def bucket_ids(data: Any, expression: str, boundaries: Sequence[float]) -> npt.NDArray[np.int64]:
    """The bucket of every sample of ``data`` (an IndexedTarDataset or a view of one, in
    its order): bucket ``b`` holds values in ``[boundaries[b-1], boundaries[b])``, as
    ``np.digitize``; ``len(boundaries) + 1`` buckets. For ``BucketBatchSampler``.

    Raises
    ------
    SelectionError
        If the value is NULL or not a number for some sample (named, with a count).
    """
    edges = np.asarray(boundaries, dtype=np.float64)
    if edges.ndim != 1 or (np.diff(edges) <= 0).any():
        raise ValueError(f"boundaries must be increasing numbers; got {list(boundaries)}")
    base = getattr(data, "base", data)
    keyed = isinstance(base, KeyedView)  # a joined view: its own values, by its index
    values = base.attribute_values(expression) if keyed else attribute_values(base, expression)
    if base is not data:
        values = values[data.base_indices(np.arange(len(data)))]
    missing = np.flatnonzero(np.isnan(values))
    if missing.size and keyed:
        raise SelectionError(
            f"{missing.size} of {values.size} samples have no value for {expression!r} "
            f"(the first: sample {int(missing[0])} of {data!r})"
        )
    if missing.size:
        first = int(missing[0])
        position = first if base is data else int(data.base_indices(first))
        shard_no, _ = base.locate(position)
        key = next(sample_keys(base, [position]))
        raise SelectionError(
            f"{missing.size} of {values.size} samples have no value for {expression!r} "
            f"(the first: {key!r} in {base.shards[shard_no]!r}); select them out first "
            f"with where={expression + ' IS NOT NULL'!r}"
        )
    return np.digitize(values, edges).astype(np.int64)
