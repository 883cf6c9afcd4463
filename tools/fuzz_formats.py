"""Fuzz targets for the formats beside the tar (``tools/fuzz.py --target formats``):

``ztables``
    The index tables of compressed shards: a single-stream ``.tar.gz`` (seek points and
    their windows), a per-sample ``.tar.gz`` and a multi-frame ``.tar.zst`` (frame
    tables). A copy of a good index has rows changed (offsets and sizes moved, zeroed,
    huge or negative; rows dropped, duplicated or swapped; windows flipped, cut,
    replaced or emptied), then every sample is read. Each read returns the sample's own
    bytes or raises an :class:`indextar.IndextarError`. A window replaced by other valid
    deflate history can only be caught by checksums: without them, a wrong answer from
    that mutation is counted (``undetectable``), not failed; half the shards carry
    checksums (``build_index(checksums=True)``), and there any wrong byte fails.
``jsonattr``
    ``.json`` attribute members (``build_index(meta="json")``): deep nesting, huge
    integers, NaN and Infinity, duplicate keys, BOMs, UTF-16/32 and Latin-1, invalid
    UTF-8, lone surrogates, odd top levels, long and odd names. The build succeeds or
    raises an ``IndextarError``; where it succeeds, a query on each column runs.
``parquet``
    :func:`indextar.import_attributes` of tables with wrong key types, NULL keys, 0 rows,
    duplicate keys, nested, binary, decimal, time and dictionary columns, unsigned
    64-bit and NaN values, and odd or reserved column names. The import succeeds (and
    its report adds up, and a query on each column runs) or raises an ``IndextarError``.
"""

from __future__ import annotations

import atexit
import contextlib
import gzip
import io
import json
import logging
import math
import random
import shutil
import sqlite3
import tarfile
import tempfile
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

__all__ = ["FORMAT_TARGETS", "run_format_target"]

FORMAT_TARGETS = ("ztables", "jsonattr", "parquet")


class FormatFailure(Exception):
    """A wrong answer (raised to tools/fuzz.py as its ``CaseFailure``)."""


def _tar(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 1_700_000_000
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


# -- ztables ---------------------------------------------------------------------------

_BASES: dict[str, tuple[Path, dict[str, bytes], bytes]] = {}  # per worker process


def _bases() -> dict[str, tuple[Path, dict[str, bytes], bytes]]:
    """The pristine shards (built once per process, removed at its exit, or with the
    fuzz run's temporary folder: atexit does not run in its workers): name ->
    (shard, samples, index bytes)."""
    if _BASES:
        return _BASES
    folder = Path(tempfile.mkdtemp(prefix="fuzz-ztables-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    from indextar import build_index
    from indextar.index.shard import index_path
    from indextar.write.recompress import recompress

    rng = random.Random(5)
    samples = {
        f"k{i:03d}": bytes(rng.choice(b"abcdefgh \n") for _ in range(rng.randint(100, 9000)))
        for i in range(40)
    }
    plain = folder / "plain.tar"
    plain.write_bytes(_tar({f"{k}.txt": v for k, v in samples.items()}))
    made = {
        "stream.tar.gz": lambda p: p.write_bytes(gzip.compress(plain.read_bytes(), mtime=0)),
        "frames.tar.gz": lambda p: recompress(plain, p, compress="gzip", index=False),
        "frames.tar.zst": lambda p: recompress(plain, p, compress="zstd", index=False),
    }
    for name, make in made.items():
        for checksums in (False, True):
            shard = folder / f"{'sum-' if checksums else ''}{name}"
            make(shard)
            build_index(shard, seek_spacing=32768, checksums=checksums)
            _BASES[shard.name] = (shard, samples, index_path(shard).read_bytes())
    return _BASES


def _mutate_tables(rng: random.Random, conn: sqlite3.Connection) -> list[str]:
    done = []
    table = (
        "seek_points"
        if conn.execute("SELECT count(*) FROM seek_points").fetchone()[0]
        else "frames"
    )
    columns = [r[1] for r in conn.execute(f"PRAGMA table_info({table})")][1:]
    ids = [r[0] for r in conn.execute(f"SELECT rowid FROM {table}")]
    for _ in range(rng.randint(1, 3)):
        row = rng.choice(ids)
        kind = rng.choice(["value", "value", "value", "drop", "dup", "swap", "window"])
        if kind == "window" and table == "seek_points":
            (window,) = conn.execute(
                "SELECT window FROM seek_points WHERE rowid=?", (row,)
            ).fetchone()
            window = bytearray(window or b"")
            how = rng.choice(["flip", "cut", "random", "null", "zeros", "other"])
            if how == "flip" and window:
                window[rng.randrange(len(window))] ^= 1 << rng.randrange(8)
            elif how == "cut":
                window = window[: rng.randrange(len(window) + 1)]
            elif how == "random":
                window = bytearray(rng.randbytes(rng.randint(0, 40000)))
            elif how == "zeros":
                window = bytearray(zlib.compress(bytes(32768)))
            elif how == "other":
                (window,) = conn.execute(
                    "SELECT window FROM seek_points ORDER BY random()"
                ).fetchone()
            value = None if how == "null" else bytes(window or b"")
            conn.execute("UPDATE seek_points SET window=? WHERE rowid=?", (value, row))
            done.append(f"window {row} {how}")
        elif kind == "drop" and len(ids) > 1:
            conn.execute(f"DELETE FROM {table} WHERE rowid=?", (row,))
            ids.remove(row)
            done.append(f"drop {row}")
        elif kind == "dup":
            new = max(ids) + 1
            listed = ", ".join(columns)
            conn.execute(
                f"INSERT INTO {table} SELECT {new}, {listed} FROM {table} WHERE rowid=?", (row,)
            )
            ids.append(new)
            done.append(f"dup {row}")
        elif kind == "swap" and len(ids) > 1:
            other = rng.choice(ids)
            conn.execute(f"UPDATE {table} SET rowid=-1 WHERE rowid=?", (row,))
            conn.execute(f"UPDATE {table} SET rowid=? WHERE rowid=?", (row, other))
            conn.execute(f"UPDATE {table} SET rowid=? WHERE rowid=-1", (other,))
            done.append(f"swap {row} {other}")
        else:
            column = rng.choice([c for c in columns if c != "window"])
            (value,) = conn.execute(
                f"SELECT {column} FROM {table} WHERE rowid=?", (row,)
            ).fetchone()
            new = rng.choice(
                [value + 1, value - 1, value + rng.randint(2, 5000), value - rng.randint(2, 5000),
                 0, -1, 2**62, -(2**63), value * 2, rng.randint(0, 1 << 20), 8, 255]
            )  # fmt: skip
            conn.execute(f"UPDATE {table} SET {column}=? WHERE rowid=?", (new, row))
            done.append(f"{column}[{row}] {value}->{new}")
    return done


def run_ztables(rng: random.Random, outcome: Counter[str], folder: Path) -> None:
    from indextar import IndexedTarDataset
    from indextar.errors import IndextarError
    from indextar.index.shard import index_path

    bases = _bases()
    name = rng.choice(sorted(bases))
    shard, samples, pristine = bases[name]
    target = index_path(shard, index_dir=folder)
    target.write_bytes(pristine)
    with contextlib.closing(sqlite3.connect(target)) as conn:
        mutations = _mutate_tables(rng, conn)
        conn.commit()
    # Other deflate history gives other bytes that nothing but a checksum can tell.
    undetectable = not name.startswith("sum-") and any(m.startswith("window") for m in mutations)
    try:
        ds = IndexedTarDataset([str(shard)], index_dir=folder, build_missing=False)
    except IndextarError as e:
        outcome[f"open: {type(e).__name__}"] += 1
        return
    with contextlib.closing(ds):
        for i in rng.sample(range(len(ds)), min(len(ds), 12)):
            try:
                sample = ds[i]
            except IndextarError as e:
                outcome[f"read: {type(e).__name__}"] += 1
                continue
            if samples.get(sample["__key__"]) != sample.get("txt"):
                if undetectable:
                    outcome["undetectable: wrong bytes after a window change, no checksums"] += 1
                    return
                raise FormatFailure(f"{name}: sample {i} wrong after {mutations}")
            outcome["read: right bytes"] += 1


# -- jsonattr ----------------------------------------------------------------------------


def _json_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(10 if depth < 3 else 6)
    if kind == 0:
        return rng.choice([10**400, -(10**30), 2**63, 2**64 - 1, -(2**63) - 1, 0, 1.5e308])
    if kind == 1:
        return rng.choice([math.nan, math.inf, -math.inf, -0.0, 1e-320])
    if kind == 2:
        return rng.choice(["", "x" * rng.randint(0, 70000), "\ud800", "\x00", "é日本\U0001f600"])
    if kind == 3:
        return rng.choice([True, False, None])
    if kind in (4, 5):
        return rng.randint(-1000, 1000)
    if kind in (6, 7):
        return [_json_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {_json_name(rng): _json_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def _json_name(rng: random.Random) -> str:
    return rng.choice(
        ["a", "A", "b", "", " ", "a b", '"q"', "'", "__key__", "__sample__", "x" * 300,
         "é", "\x00", "a.b", "[", "rowid", "select", f"n{rng.randint(0, 3000)}"]
    )  # fmt: skip


def _json_member(rng: random.Random) -> bytes:
    kind = rng.randrange(12)
    if kind == 0:  # deep nesting
        depth = rng.choice([50, 1000, 5000, 100000])
        return b'{"a":' * depth + b"1" + b"}" * depth
    if kind == 1:  # duplicate keys
        return b'{"a": 1, "a": "two", "A": 3}'
    if kind == 2:  # not JSON, or not an object
        return rng.choice([b"", b" ", b"[1,2]", b"1", b'"s"', b"null", b"{", b"{}}", b"\xff\xfe"])
    text = json.dumps(
        {_json_name(rng): _json_value(rng) for _ in range(rng.randint(0, 6))}, allow_nan=True
    )
    encoding = rng.choice(
        ["utf-8", "utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-32", "latin-1"]
    )
    data = text.encode(encoding, "surrogatepass" if "utf" in encoding else "replace")
    if kind == 3 and data:  # one bad byte
        spot = rng.randrange(len(data))
        data = data[:spot] + bytes([rng.choice([0x80, 0xFF, 0xC0, 0x00])]) + data[spot + 1 :]
    return data


def run_jsonattr(rng: random.Random, outcome: Counter[str], folder: Path) -> None:
    from indextar import IndexedTarDataset, build_index
    from indextar.errors import IndextarError

    members = {}
    for i in range(rng.randint(1, 8)):
        members[f"k{i}.json"] = _json_member(rng)
        members[f"k{i}.cls"] = b"1"
    shard = folder / "attrs.tar"
    shard.write_bytes(_tar(members))
    try:
        index = build_index(shard, meta="json", on_error=rng.choice(["fail", "skip"]))
    except IndextarError as e:
        outcome[f"build: {type(e).__name__}"] += 1
        return
    outcome["build: ok"] += 1
    with contextlib.closing(sqlite3.connect(index.path)) as conn:
        names = [r[0] for r in conn.execute("SELECT name FROM attribute_columns")]
    _query_columns(IndexedTarDataset([str(shard)]), names, outcome)


def _query_columns(ds: Any, names: list[str], outcome: Counter[str]) -> None:
    from indextar.errors import IndextarError

    with contextlib.closing(ds):
        for name in names[:5]:
            quoted = '"' + name.replace('"', '""') + '"'
            try:
                len(ds.where(f"{quoted} IS NOT NULL", cache_dir=False))
                outcome["query: ok"] += 1
            except IndextarError as e:
                outcome[f"query: {type(e).__name__}"] += 1


# -- parquet -----------------------------------------------------------------------------


def _parquet_table(rng: random.Random, keys: list[str]) -> Any:
    import decimal

    import pyarrow as pa

    rows = rng.choice([0, 1, len(keys), len(keys), len(keys) + 3])
    chosen = [rng.choice(keys) if rng.random() < 0.9 else "nokey" for _ in range(rows)]
    if rng.random() < 0.5:
        chosen = keys[:rows] if rows <= len(keys) else chosen
    key_kind = rng.choice(["str", "str", "str", "null", "int", "binary", "large", "dict", "none"])
    columns: dict[str, Any] = {}
    if key_kind == "str":
        columns["key"] = pa.array(chosen, pa.string())
    elif key_kind == "null":
        columns["key"] = pa.array([None if rng.random() < 0.3 else k for k in chosen], pa.string())
    elif key_kind == "int":
        columns["key"] = pa.array(list(range(rows)), pa.int64())
    elif key_kind == "binary":
        columns["key"] = pa.array([k.encode() for k in chosen], pa.binary())
    elif key_kind == "large":
        columns["key"] = pa.array(chosen, pa.large_string())
    elif key_kind == "dict":
        columns["key"] = pa.array(chosen, pa.string()).dictionary_encode()
    makers = {
        "int": lambda: pa.array([rng.randint(-9, 9) for _ in range(rows)], pa.int64()),
        "uint64": lambda: pa.array([2**64 - 1 - i for i in range(rows)], pa.uint64()),
        "float": lambda: pa.array(
            [rng.choice([math.nan, math.inf, 1.5, None]) for _ in range(rows)]
        ),
        "half": lambda: pa.array([1.0] * rows, pa.float32()).cast(pa.float16()),
        "bool": lambda: pa.array([rng.random() < 0.5 for _ in range(rows)]),
        "str": lambda: pa.array([rng.choice(["", "é", "\x00x", None]) for _ in range(rows)]),
        "binary": lambda: pa.array([b"\xff\x00" for _ in range(rows)], pa.binary()),
        "list": lambda: pa.array([[1, 2] for _ in range(rows)], pa.list_(pa.int64())),
        "struct": lambda: pa.array([{"a": 1} for _ in range(rows)]),
        "decimal": lambda: pa.array([decimal.Decimal("1.5")] * rows, pa.decimal128(5, 2)),
        "time": lambda: pa.array([0] * rows, pa.timestamp("ns")),
        "date": lambda: pa.array([0] * rows, pa.date32()),
        "null": lambda: pa.nulls(rows),
        "dict": lambda: pa.array(["a"] * rows).dictionary_encode(),
    }
    names = ["score", "Score", "SCORE", "", " ", '"', "__key__", "__shard__", "__sample__", "rowid",
             "key", "é", "a" * 300, "x;DROP TABLE samples", "NaN"]  # fmt: skip
    for _ in range(rng.randint(0, 4)):
        columns[rng.choice(names)] = makers[rng.choice(sorted(makers))]()
    return pa.table(columns) if columns else pa.table({"key": pa.array([], pa.string())})


def run_parquet(rng: random.Random, outcome: Counter[str], folder: Path) -> None:
    import pyarrow.parquet as pq

    from indextar import IndexedTarDataset, build_index, import_attributes
    from indextar.errors import IndextarError

    shard = folder / "p.tar"
    keys = [f"k{i}" for i in range(rng.randint(1, 6))]
    shard.write_bytes(_tar({f"{k}.cls": b"1" for k in keys}))
    build_index(shard)
    table = _parquet_table(rng, keys)
    path = folder / "t.parquet"
    pq.write_table(table, path)
    try:
        report = import_attributes([shard], path, missing=rng.choice(["null", "fail"]))
    except IndextarError as e:
        outcome[f"import: {type(e).__name__}"] += 1
        return
    if report.matched + report.missing != report.samples or report.samples != len(keys):
        raise FormatFailure(f"report does not add up: {report}")
    outcome["import: ok"] += 1
    _query_columns(IndexedTarDataset([str(shard)]), list(report.columns), outcome)


def run_format_target(
    target: str, seed: int, number: int, outcome: Counter[str], folder: Path
) -> None:
    """Run one case of ``target`` (``seed``, ``number`` pick its input)."""
    rng = random.Random(f"{seed}:{number}:{target}")
    # on_error="skip" and unmatched rows are logged as warnings: thousands of cases'
    # worth; quiet for the case only, so that a test process's logging stays as it was
    logger = logging.getLogger("indextar")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        {"ztables": run_ztables, "jsonattr": run_jsonattr, "parquet": run_parquet}[target](
            rng, outcome, folder
        )
    finally:
        logger.setLevel(level)
