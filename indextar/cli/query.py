"""``indextar query`` (select samples by SQL over their indexes) and ``indextar meta
import`` (join a parquet table into the indexes by key). Part of the command line."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import asdict
from typing import Any

import numpy as np

from ..errors import IndextarError, MissingAttributesError
from ..index.attribute_import import import_attributes
from ..read.dataset import IndexedTarDataset
from ..read.lookup import sample_keys
from ..read.selection import where_rows
from ..source.patterns import expand_shards
from .joins import add_join_options, open_joined
from .options import add_options, count

__all__ = ["add_query_commands"]


def _blob_as_hex(value: object) -> str:
    """A BLOB attribute (bytes) in ``--json`` output: its hex digits."""
    if isinstance(value, bytes):
        return value.hex()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _cli_hint(e: MissingAttributesError) -> IndextarError:
    """``e`` with the command that adds the missing attributes, not the library call."""
    shards = " ".join(shlex.quote(shard) for shard in e.shards[:5])
    more = " ..." if len(e.shards) > 5 else ""
    if e.source.startswith("import:"):
        table = shlex.quote(e.source.removeprefix("import:"))
        command = f"indextar meta import {table} {shards}{more}"
    else:
        ext = e.source.removeprefix("json:") or "json"
        command = f"indextar index {shards}{more} --meta {shlex.quote(ext)} --force"
    message = str(e).rsplit("; add them with ", 1)[0]
    return IndextarError(f"{message}; add them with: {command}")


def _cmd_query(args: argparse.Namespace) -> int:
    try:
        return _query(args)
    except MissingAttributesError as e:
        raise _cli_hint(e) from e


def _query(args: argparse.Namespace) -> int:
    if args.join:
        return _query_joined(args)
    ds = IndexedTarDataset(args.shards, index_dir=args.index_dir, build_missing=False)
    if args.json:
        for row in where_rows(ds, args.where):
            print(json.dumps(row, ensure_ascii=False, default=_blob_as_hex))
        return 0
    view = ds.where(args.where, cache_dir=False if args.no_cache else args.cache_dir)
    if args.count:
        print(len(view))
    elif args.keys:
        out = sys.stdout.buffer
        for key in sample_keys(ds, view.base_indices(np.arange(len(view)))):
            out.write(key.encode("utf-8", "surrogateescape") + b"\n")
        out.flush()
    else:
        print(
            f"{len(view):,} of {len(ds):,} samples in {count(len(ds.shards), 'shard')} match "
            f"{args.where!r}"
        )
    return 0


def _query_joined(args: argparse.Namespace) -> int:
    """``query --join``: the condition over either side's attributes (the left's first)."""
    joined = open_joined(args.shards, args)
    view = joined.where(args.where, cache_dir=False if args.no_cache else args.cache_dir)
    lefts, _ = joined.sides(view.base_indices(np.arange(len(view))))
    if args.count:
        print(len(view))
    elif args.keys or args.json:
        out = sys.stdout.buffer
        for index, key in zip(view.base_indices(np.arange(len(view))).tolist(),
                              sample_keys(joined.left, lefts)):  # fmt: skip
            line = json.dumps({"__index__": index, "__key__": key}) if args.json else key
            out.write(line.encode("utf-8", "surrogateescape") + b"\n")
        out.flush()
    else:
        print(f"{len(view):,} of {len(joined):,} joined samples match {args.where!r}")
    return 0


def _cmd_meta_import(args: argparse.Namespace) -> int:
    columns = None if args.columns is None else [c for c in args.columns.split(",") if c]
    report = import_attributes(
        expand_shards(args.shards),
        args.table,
        key=args.key,
        columns=columns,
        index_dir=args.index_dir,
        missing=args.missing,
    )
    if args.json:
        print(json.dumps(asdict(report)))
    else:
        print(
            f"imported {', '.join(report.columns) or 'no columns'} into {report.shards:,} "
            f"indexes: {report.matched:,} of {report.samples:,} samples matched, "
            f"{report.missing:,} without a row (NULL), {report.unused:,} rows unused"
        )
    return 0


def add_query_commands(sub: Any) -> None:
    """Register ``query`` and ``meta import`` on the parser's subcommands."""
    p = sub.add_parser(
        "query",
        help="select samples by SQL over their indexes",
        description="Evaluate an SQL condition over every shard's index: attribute columns "
        "(index --meta json, meta import), __key__ and size(ext). See docs/metadata.md.",
    )
    p.add_argument("shards", nargs="+", help="shard paths, globs or brace patterns")
    p.add_argument(
        "--where",
        required=True,
        help='an SQL condition, such as "aesthetic > 5 AND width >= 512 AND size(jpg) < 1e6"',
    )
    output = p.add_mutually_exclusive_group()
    output.add_argument("--count", action="store_true", help="print the number of samples")
    output.add_argument(
        "--keys",
        action="store_true",
        help="print the samples' keys, one a line (a key file for select / --select)",
    )
    p.add_argument(
        "--cache-dir",
        help="folder of cached selections (default: ~/.cache/indextar/selections)",
    )
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")
    add_join_options(p)
    add_options(p, index_dir=True, json=True)
    p.set_defaults(func=_cmd_query)

    p = sub.add_parser(
        "meta",
        help="per-sample attributes in the indexes",
        description="Manage the per-sample attributes stored in the shards' indexes.",
    )
    meta = p.add_subparsers(dest="meta_command", required=True, metavar="ACTION")
    p = meta.add_parser(
        "import",
        help="join a parquet table into the indexes by key",
        description="Join the rows of a parquet table into the shards' indexes by sample "
        "key; each index is rewritten to a temporary file and renamed into place.",
    )
    p.add_argument("table", help="a parquet file with a key column")
    p.add_argument("shards", nargs="+", help="shard paths, globs or brace patterns")
    p.add_argument("--key", default="key", help="the table's key column (default: key)")
    p.add_argument("--columns", help="comma-separated columns to import (default: all but the key)")
    p.add_argument(
        "--missing",
        choices=("null", "fail"),
        default="null",
        help="a sample without a row: NULL columns (default), or fail before writing",
    )
    add_options(p, index_dir=True, json=True)
    p.set_defaults(func=_cmd_meta_import)
