"""``indextar convert``: parquet, a saved Hugging Face dataset, Mosaic MDS or LitData into
indexed shards (:func:`indextar.write.convert.convert`), with a progress bar and a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from typing import Any

from tqdm import tqdm

from ..errors import IndextarError
from ..write.convert import FORMATS, ConvertedShard, convert
from .indexing import dask_executor
from .options import add_options, count

__all__ = ["add_convert_command"]


def _members(pairs: list[str] | None) -> dict[str, str] | None:
    if not pairs:
        return None
    members = {}
    for pair in pairs:
        ext, sep, column = pair.partition("=")
        if not sep or not ext or not column:
            raise IndextarError(f"--member takes EXT=COLUMN, such as jpg=image; got {pair!r}")
        members[ext] = column
    return members


def _cmd_convert(args: argparse.Namespace) -> int:
    bar = tqdm(desc="converting", unit="shard", disable=args.quiet or None, file=sys.stderr)
    samples = 0

    def progress(shard: ConvertedShard, todo: int) -> None:
        nonlocal samples
        samples += shard.samples
        bar.total = todo
        bar.set_postfix_str(f"{samples:,} samples", refresh=False)
        bar.update()

    with dask_executor(args.dask) as executor:
        try:
            result = convert(
                args.src,
                args.pattern,
                format=args.format,
                members=_members(args.member),
                attributes=args.attributes.split(",") if args.attributes is not None else None,
                key=args.key,
                maxcount=args.maxcount,
                start_shard=args.start_shard,
                compress=args.compress,
                jobs=args.jobs,
                executor=executor,
                resume=not args.restart,
                progress=progress,
            )
        finally:
            bar.close()
    if args.json:
        summary: dict[str, Any] = asdict(result)
        summary["shards"] = [shard.path for shard in result.shards]
        print(json.dumps(summary))
        return 0
    if args.quiet:
        return 0
    resumed = f" ({count(result.resumed, 'shard')} written before)" if result.resumed else ""
    print(
        f"converted {count(result.rows, 'row')} into {count(result.samples, 'sample')} in "
        f"{count(len(result.shards), 'shard')}{resumed}, {result.bytes / 1e6:,.1f} MB, "
        f"in {result.seconds:.1f} s"
    )
    for reason, rows in result.skipped.items():
        shown = ", ".join(map(str, rows[:5])) + (", ..." if len(rows) > 5 else "")
        print(f"skipped {count(len(rows), 'row')}: {reason} (rows {shown})")
    return 0


def add_convert_command(sub: Any) -> None:
    """Add ``indextar convert``."""
    p = sub.add_parser(
        "convert",
        help="convert parquet, a saved Hugging Face dataset, MDS or LitData into shards",
        description="Write each row of a dataset as a sample of indexed shards: binary "
        "columns as members, the other columns as attributes (in each sample's json member "
        "and in the index). Keys are a column's (--key) or each row's position, zero-padded. "
        "Run again with the same arguments, it resumes an interrupted conversion.",
    )
    add_options(p, json=True, quiet=True)
    p.add_argument(
        "src", help="a parquet file or folder, a save_to_disk folder, an MDS or LitData folder"
    )
    p.add_argument("pattern", help="output shard names with a %%-format: 'out-%%06d.tar'")
    p.add_argument("--format", choices=FORMATS, help="the source's format (default: recognised)")
    p.add_argument(
        "--member",
        action="append",
        metavar="EXT=COLUMN",
        help="store COLUMN as the member EXT (repeat it; default: every binary "
        "column under its own name)",
    )
    p.add_argument(
        "--attributes",
        metavar="COL,COL",
        help="columns stored as attributes (default: every column of values)",
    )
    p.add_argument("--key", metavar="COLUMN", help="the column of keys (default: row numbers)")
    p.add_argument("--maxcount", type=int, default=10_000, help="rows per shard (10000)")
    p.add_argument("--start-shard", type=int, default=0, help="number of the first shard")
    p.add_argument(
        "--compress",
        choices=("gzip", "zstd"),
        help="write each sample as its own gzip member or zstd frame",
    )
    p.add_argument(
        "-j", "--jobs", type=int, default=os.cpu_count() or 1, help="shards written in parallel"
    )
    p.add_argument(
        "--dask",
        metavar="ADDRESS",
        help="write the shards on a Dask cluster (its scheduler); the workers must "
        "reach the source and the output folder (needs the dask extra)",
    )
    p.add_argument(
        "--restart",
        action="store_true",
        help="start over instead of resuming an interrupted conversion",
    )
    p.set_defaults(func=_cmd_convert)
