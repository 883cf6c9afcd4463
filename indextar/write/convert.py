"""Convert parquet, a saved Hugging Face dataset, Mosaic MDS or LitData into indexed shards.

:func:`convert` reads a source dataset through one reader per format
(:mod:`~indextar.write.convert_arrow`, :mod:`~indextar.write.convert_mds`,
:mod:`~indextar.write.convert_litdata`), and writes each row as a sample: its binary
columns as members, its other columns as attributes, stored both in the sample's
``json`` member and, as each shard is written, in the shard index's attribute table
(no second pass over the shards).

**Shards.** Shard ``n`` holds the source's rows ``n * maxcount`` to ``(n + 1) *
maxcount``: known before any row is read (every format states its row counts), so the
shards are written in parallel, by a process pool or a Dask cluster, and their bytes
do not depend on how many ran at once.

**Keys.** With ``key=`` a column's values are the keys; otherwise a row's key is its
position in the source (``000000042``, zero-padded to at least 9 digits), the number
``dataset[42]`` reads in Hugging Face, Mosaic and LitData alike: stable for a given
source, and sorted as the source is.

**Skipped rows**, counted by reason: ``null-key``, ``invalid-key`` (a key a writer
refuses, such as one with a dot in its last part), ``duplicate-key`` (a key already in
the same shard) and ``no-data`` (every member column null).

**Resuming.** A state file next to the shards (``.<name>.convert.json``) records the
options and the source's files, and each shard as it is finished; run again with the
same arguments, a conversion skips the finished shards and writes the rest. Another
source or other options are refused (``resume=False`` starts over).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..atomic import write_atomic
from ..errors import ConvertError, WriterError
from ..index.build import parallel_map
from ..index.shard import PathLike, index_path
from .closing import compressor_for
from .convert_arrow import is_hf_dataset, read_arrow, scan_hf, scan_parquet
from .convert_litdata import is_litdata_dataset, read_litdata, scan_litdata
from .convert_mds import is_mds_dataset, read_mds, scan_mds
from .convert_source import JSON_EXT, ColumnPlan, Source, SourcePiece, SourceRow, plan_columns
from .sample import check_key, encode_sample
from .tarwriter import TarWriter

__all__ = ["FORMATS", "ConvertResult", "ConvertedShard", "convert", "scan_source"]

log = logging.getLogger(__name__)

_Reader = Callable[[Source, SourcePiece, ColumnPlan, int, int], Iterator[SourceRow]]
_FORMATS: dict[str, tuple[Callable[[Path], Source], _Reader]] = {
    "parquet": (scan_parquet, read_arrow),
    "hf": (scan_hf, read_arrow),
    "mds": (scan_mds, read_mds),
    "litdata": (scan_litdata, read_litdata),
}
FORMATS = tuple(_FORMATS)
"""The source formats :func:`convert` reads."""


@dataclass(frozen=True, slots=True)
class ConvertedShard:
    """One shard :func:`convert` wrote: its path, samples, bytes and skipped rows
    (``(row number, reason)``)."""

    path: str
    samples: int
    bytes: int
    skipped: tuple[tuple[int, str], ...]


@dataclass(frozen=True, slots=True)
class ConvertResult:
    """What :func:`convert` did.

    Attributes
    ----------
    shards
        Every shard of the conversion, in order (``resumed`` of them written before).
    rows, samples, bytes
        Rows read from the source; samples and bytes in the shards.
    skipped
        Reason to the numbers of the rows skipped for it.
    resumed
        Shards an earlier, interrupted run had finished.
    seconds
        Time this run took.
    """

    shards: list[ConvertedShard]
    rows: int
    samples: int
    bytes: int
    skipped: dict[str, list[int]]
    resumed: int
    seconds: float


@dataclass(frozen=True, slots=True)
class _Task:
    path: str
    first_row: int
    slices: tuple[tuple[SourcePiece, int, int], ...]


def scan_source(path: PathLike, *, format: str | None = None) -> Source:
    """Read a source dataset's layout (pieces, columns); ``format=None`` recognises it.

    Raises
    ------
    ConvertError
        If the format is unknown, or cannot be recognised.
    """
    root = Path(path)
    if format is None:
        if root.suffix == ".parquet" or (root.is_dir() and next(root.rglob("*.parquet"), None)):
            format = "parquet"
        elif root.is_dir() and is_hf_dataset(root):
            format = "hf"
        elif root.is_dir() and is_mds_dataset(root):
            format = "mds"
        elif root.is_dir() and is_litdata_dataset(root):
            format = "litdata"
        else:
            raise ConvertError(
                f"not a dataset of a known format ({', '.join(FORMATS)}); name one with format=",
                source=str(root),
            )
    if format not in _FORMATS:
        raise ConvertError(f"unknown format {format!r}; known: {FORMATS}", source=str(root))
    if not root.exists():
        raise ConvertError("no such file or folder", source=str(root))
    return _FORMATS[format][0](root)


def _tasks(source: Source, names: list[str], maxcount: int) -> list[_Task]:
    """Shard ``i`` takes rows ``i * maxcount`` up to the next shard's, from the pieces
    that hold them."""
    tasks: list[_Task] = []
    pending: list[tuple[SourcePiece, int, int]] = []
    first = filled = 0
    for piece in source.pieces:
        start = 0
        while start < piece.rows:
            take = min(piece.rows - start, maxcount - filled)
            pending.append((piece, start, start + take))
            start, filled = start + take, filled + take
            if filled == maxcount:
                tasks.append(_Task(names[len(tasks)], first, tuple(pending)))
                pending, first, filled = [], first + filled, 0
    if filled:
        tasks.append(_Task(names[len(tasks)], first, tuple(pending)))
    return tasks


def _key(row: SourceRow, number: int, width: int) -> tuple[str | None, str | None]:
    """The row's key, or ``None`` and why it has none that a shard takes."""
    if row.key is None and width:
        return f"{number:0{width}d}", None
    if row.key is None:
        return None, "null-key"
    key = row.key.decode("utf-8", "replace") if isinstance(row.key, bytes) else str(row.key)
    try:
        return check_key(key), None
    except WriterError:
        return None, "invalid-key"


def write_converted_shard(
    task: _Task, source: Source, plan: ColumnPlan, width: int, compress: str | None
) -> ConvertedShard:
    """Write one shard of a conversion (in a worker process); return what it holds.

    ``width``: the digits of keys made from row numbers (0 with ``plan.key``)."""
    read = _FORMATS[source.format][1]
    skipped: list[tuple[int, str]] = []
    exts = [ext for ext, _ in plan.members]
    names = plan.attributes
    attributes_from = JSON_EXT if names else None
    seen: set[str] = set()
    number = task.first_row
    with TarWriter(
        task.path, encoder=False, compress=compress, attributes_from=attributes_from
    ) as writer:
        for piece, start, stop in task.slices:
            for row in read(source, piece, plan, start, stop):
                key, problem = _key(row, number, width)
                if key is not None and key in seen:
                    problem = "duplicate-key"
                record: dict[str, Any] = {
                    ext: data for ext, data in zip(exts, row.members) if data is not None
                }
                if problem is None and not record:
                    problem = "no-data"
                if problem is not None:
                    skipped.append((number, problem))
                    number += 1
                    continue
                assert key is not None
                seen.add(key)
                number += 1
                record["__key__"] = key
                fields = dict(zip(names, row.attributes)) if names else None
                if fields is not None:
                    record[JSON_EXT] = json.dumps(
                        fields, ensure_ascii=False, separators=(",", ":")
                    ).encode("utf-8")
                writer.append(
                    encode_sample(record, encoder=False, shard=task.path), attributes=fields
                )
    return ConvertedShard(task.path, writer.count, Path(task.path).stat().st_size, tuple(skipped))


def state_path(pattern: str) -> Path:
    """Where a conversion to ``pattern`` keeps its state: beside the shards, hidden."""
    folder = Path(pattern % 0).parent
    return folder / f".{Path(pattern).name.split('%')[0].rstrip('-_.') or 'shards'}.convert.json"


def _fingerprint(source: Source, plan: ColumnPlan, options: dict[str, Any]) -> dict[str, Any]:
    return {
        "format": source.format,
        "files": [list(f) for f in source.files],
        "members": [list(m) for m in plan.members],
        "attributes": list(plan.attributes),
        "key": plan.key,
        **options,
    }


def _load_state(path: Path, fingerprint: dict[str, Any], resume: bool) -> dict[str, Any]:
    if not resume or not path.exists():
        return {}
    try:
        state = json.loads(path.read_text())
        done, recorded = state["done"], state["fingerprint"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConvertError(
            f"cannot read the conversion state {str(path)!r} ({e}); delete it to start over"
        ) from e
    if recorded != fingerprint:
        changed = sorted(k for k in fingerprint if fingerprint[k] != recorded.get(k))
        raise ConvertError(
            f"the shards were begun by a conversion with another {', '.join(changed)} "
            f"(state {str(path)!r}); convert with resume=False to start over"
        )
    return dict(done)


def _recorded(path: str, entry: dict[str, Any]) -> ConvertedShard:
    """A shard as the state file recorded it."""
    skipped = tuple((int(number), str(reason)) for number, reason in entry["skipped"])
    return ConvertedShard(path, int(entry["samples"]), int(entry["bytes"]), skipped)


def convert(
    source: PathLike,
    pattern: str,
    *,
    format: str | None = None,
    members: Mapping[str, str] | None = None,
    attributes: Sequence[str] | None = None,
    key: str | None = None,
    maxcount: int = 10_000,
    start_shard: int = 0,
    compress: str | None = None,
    jobs: int = 1,
    executor: Executor | None = None,
    resume: bool = True,
    progress: Callable[[ConvertedShard, int], None] | None = None,
) -> ConvertResult:
    """Write the rows of a source dataset to indexed shards named by ``pattern``.

    Parameters
    ----------
    source, format
        The dataset (a parquet file or folder, a ``save_to_disk`` folder, an MDS or
        LitData folder) and its format, one of :data:`FORMATS` (``None``: recognised).
    members
        Extension to column of each member (default: every binary column, named by
        its column, lowercased).
    attributes
        Columns stored as attributes (default: every other column that holds values).
    key
        The column of keys; ``None``: each row's position in the source.
    maxcount, start_shard, compress
        Rows per shard (the last has fewer), the first shard's number, and
        ``"gzip"``/``"zstd"`` as for :class:`~indextar.ShardWriter`.
    jobs, executor
        Shards written at once by a pool of ``jobs`` processes, or by ``executor``
        (a Dask ``client.get_executor()``, whose workers must reach the files).
    resume
        Skip the shards an interrupted run with the same arguments finished.
    progress
        Called with each shard written, and the number of shards to write.
    """
    began = time.perf_counter()
    compressor_for(compress)
    if maxcount < 1:
        raise ConvertError(f"maxcount must be positive, got {maxcount}")
    scanned = scan_source(source, format=format)
    plan = plan_columns(scanned, members=members, attributes=attributes, key=key)
    rows = scanned.rows
    count = max(2, -(-rows // maxcount))
    try:
        names = [pattern % (start_shard + i) for i in range(count)]
    except (TypeError, ValueError) as e:
        raise ConvertError(
            f"shard pattern {pattern!r} needs one %-format, such as 'out-%06d.tar' ({e})"
        ) from None
    if len(set(names)) < len(names):
        raise ConvertError(f"shard pattern {pattern!r} gives the same name for several shards")
    width = 0 if key is not None else max(9, len(str(max(rows - 1, 0))))
    tasks = _tasks(scanned, names, maxcount)
    state = state_path(pattern)
    fingerprint = _fingerprint(
        scanned, plan, {"maxcount": maxcount, "start_shard": start_shard, "compress": compress}
    )
    done = _load_state(state, fingerprint, resume)
    finished = {
        t.path: _recorded(t.path, done[t.path])
        for t in tasks
        if t.path in done and Path(t.path).is_file() and index_path(t.path).is_file()
    }
    resumed = len(finished)
    todo = [t for t in tasks if t.path not in finished]
    Path(names[0]).parent.mkdir(parents=True, exist_ok=True)
    log.info(
        "converting %d rows of %s into %d shards (%d done before)",
        rows,
        scanned.root,
        len(tasks),
        resumed,
    )
    args = (scanned, plan, width, compress)
    for shard in _run(todo, args, jobs, executor):
        finished[shard.path] = shard
        done[shard.path] = {
            "samples": shard.samples,
            "bytes": shard.bytes,
            "skipped": [list(s) for s in shard.skipped],
        }
        write_atomic(state, json.dumps({"fingerprint": fingerprint, "done": done}, indent=1))
        if progress is not None:
            progress(shard, len(todo))
    shards = [finished[t.path] for t in tasks]
    skipped: dict[str, list[int]] = {}
    for shard in shards:
        for number, reason in shard.skipped:
            skipped.setdefault(reason, []).append(number)
    return ConvertResult(
        shards,
        rows,
        sum(s.samples for s in shards),
        sum(s.bytes for s in shards),
        dict(sorted(skipped.items())),
        resumed,
        time.perf_counter() - began,
    )


def _run(
    tasks: list[_Task], args: tuple[Any, ...], jobs: int, executor: Executor | None
) -> Iterator[ConvertedShard]:
    if executor is None:
        yield from parallel_map(write_converted_shard, tasks, args, workers=max(1, jobs))
        return
    futures = [executor.submit(write_converted_shard, task, *args) for task in tasks]
    try:
        for future in futures:
            yield future.result()
    except BaseException:
        for future in futures:
            future.cancel()
        raise
