"""The ``indextar`` commands that make and inspect shards: create, reshard, ls, cat,
get, export. Part of the command line (with :mod:`indextar.cli.commands`): they print and exit.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from tqdm import tqdm

from ..index.shard import ShardIndex
from ..read.dataset import IndexedTarDataset
from ..read.lookup import SampleInfo, describe_sample, read_member, shard_members
from ..read.subset import read_keys, report_unmatched
from ..source.patterns import expand_shards
from ..write.create import create_shards
from ..write.export import export_dali, export_wids
from ..write.export_parquet import export_parquet
from ..write.reshard import reshard
from .joins import add_join_options, describe_joined, joined_json, joined_rows, open_joined
from .options import add_options

__all__ = ["add_tool_commands"]


_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_SIZE_UNITS |= {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def _size(text: str) -> float:
    """A byte count such as ``3e9``, ``500MB`` or ``1GiB``, for argparse."""
    number = text.strip().lower().rstrip("bkmgtio")
    unit = text.strip().lower()[len(number) :]
    try:
        value = float(number) * _SIZE_UNITS[unit]
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError(
            f"invalid size {text!r}; use bytes or a unit: 3e9, 500MB, 1GiB"
        ) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive, got {text!r}")
    return value


def _skipped_summary(skipped: dict[str, list[str]]) -> str:
    return ", ".join(f"{reason} {len(paths):,}" for reason, paths in skipped.items())


def _cmd_create(args: argparse.Namespace) -> int:
    bar = tqdm(desc="writing", unit="shard", disable=args.quiet or None, file=sys.stderr)

    def progress(index: ShardIndex, planned: int) -> None:
        bar.total = planned
        bar.update()

    try:
        result = create_shards(
            args.src,
            args.pattern,
            maxcount=args.maxcount,
            maxsize=args.maxsize,
            start_shard=args.start_shard,
            class_from_dir=args.class_from_dir,
            jobs=args.jobs,
            manifest=args.manifest,
            progress=progress,
            compress=args.compress,
        )
    finally:
        bar.close()
    if args.json:
        summary = asdict(result) | {"shards": [ix.shard for ix in result.shards]}
        print(json.dumps(summary))
        return 0
    for reason, paths in result.skipped.items():
        examples = ", ".join(paths[:3]) + (", ..." if len(paths) > 3 else "")
        print(
            f"indextar: warning: skipped {len(paths):,} {reason} files: {examples}", file=sys.stderr
        )
    if not args.quiet:
        skipped = _skipped_summary(result.skipped)
        classes = f", {len(result.classes)} classes" if args.class_from_dir else ""
        print(
            f"created {len(result.shards)} shards: {result.samples:,} samples from "
            f"{result.files:,} files{classes}, {result.bytes / 1e6:,.1f} MB in "
            f"{result.seconds:.2f} s; skipped {sum(map(len, result.skipped.values())):,} files"
            + (f" ({skipped})" if skipped else "")
        )
    return 0


def _cmd_reshard(args: argparse.Namespace) -> int:
    shards = expand_shards(args.shards)
    bar = tqdm(
        desc="resharding", unit="B", unit_scale=True, disable=args.quiet or None, file=sys.stderr
    )
    try:
        result = reshard(
            shards,
            args.pattern,
            maxcount=args.maxcount,
            maxsize=args.maxsize,
            shuffle=args.shuffle,
            seed=args.seed,
            start_shard=args.start_shard,
            index_dir=args.index_dir,
            manifest=args.manifest,
            progress=lambda samples, nbytes: bar.update(nbytes),
            compress=args.compress,
        )
    finally:
        bar.close()
    if args.json:
        print(json.dumps(asdict(result)))
    elif not args.quiet:
        print(
            f"resharded {len(shards)} shards into {len(result.shards)}: {result.samples:,} "
            f"samples, {result.bytes / 1e6:,.1f} MB in {result.seconds:.2f} s "
            f"({result.bytes / 1e6 / max(result.seconds, 1e-9):,.0f} MB/s)"
        )
    return 0


def _cmd_ls(args: argparse.Namespace) -> int:
    if args.join:
        return _print_rows(joined_rows(open_joined(args.shard, args), args), args)
    table = shard_members(args.shard, index_dir=args.index_dir)
    listed: Sequence[int] = range(len(table))
    if args.select or args.exclude:
        keys = {
            k.decode("utf-8", "surrogateescape") for k in read_keys(args.select or args.exclude)
        }
        listed = [i for i in listed if (table.keys[i] in keys) == bool(args.select)]
        unmatched = sorted(keys - set(table.keys))
        report_unmatched([k.encode("utf-8", "surrogateescape") for k in unmatched], len(keys),
                         strict=False, what=repr(args.shard))  # fmt: skip
    rows = [
        (table.keys[i], [(table.exts[m], int(table.sizes[m])) for m in table.members_of(i)])
        for i in listed
    ]
    return _print_rows(rows, args)


def _print_rows(rows: list[tuple[str, list[tuple[str, int]]]], args: argparse.Namespace) -> int:
    if args.json:  # a reader that goes away (| head) is main's BrokenPipeError
        print(json.dumps([{"key": key, "members": dict(members)} for key, members in rows]))
    else:
        for key, members in rows:
            print(key + "\t" + " ".join(f"{ext}:{size}" for ext, size in members))
    return 0


def _cmd_cat(args: argparse.Namespace) -> int:
    data = read_member(args.shard, args.member, index_dir=args.index_dir)
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
    return 0


def _cmd_get(args: argparse.Namespace) -> int:
    if args.join:
        return _get_joined(args)
    if args.select or args.exclude:  # INDEX counts the selected samples
        dataset = IndexedTarDataset(args.dataset, index_dir=args.index_dir, build_missing=False)
        view = dataset.select(args.select) if args.select else dataset.exclude(args.exclude)
        info = describe_sample(dataset, int(view.base_indices(args.index)))
    else:
        info = describe_sample(args.dataset, args.index, index_dir=args.index_dir)
    if args.json:
        members = [asdict(m) | {"head": m.head.decode("utf-8", "replace")} for m in info.members]
        print(json.dumps(asdict(info) | {"members": members}))
        return 0
    _print_info(info, f"sample {info.index}: key {info.key!r}")
    return 0


def _print_info(info: SampleInfo, title: str) -> None:
    print(
        f"{title}\n  shard {info.shard}, sample {info.shard_sample}, "
        f"bytes {info.start_offset}..{info.end_offset}"
    )
    for m in info.members:
        print(f"  {m.ext:<10} {m.size:>12,} bytes  {_preview(m.head, m.size)}")


def _get_joined(args: argparse.Namespace) -> int:
    """``get --join``: INDEX counts the joined (and selected) samples."""
    joined = open_joined(args.dataset, args)
    index = args.index
    if args.select or args.exclude:
        view = joined.select(args.select) if args.select else joined.exclude(args.exclude)
        index = int(view.base_indices(index))
    left, right = describe_joined(joined, index)
    if args.json:
        print(joined_json(left, right))
        return 0
    _print_info(left, f"sample {index % len(joined)}: key {left.key!r}")
    if right is None:
        print(f"  nothing joined from {args.join}")
    else:
        _print_info(right, "joined:")
    return 0


def _preview(head: bytes, size: int) -> str:
    """The start of a member that is printable text, quoted; nothing for binary data."""
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return ""
    if not text.replace("\n", " ").replace("\t", " ").isprintable():
        return ""
    return repr(text) + ("..." if size > len(head) else "")


def _cmd_export(args: argparse.Namespace) -> int:
    shards = expand_shards(args.shards)
    if args.dali:
        paths = export_dali(shards, args.dali, index_dir=args.index_dir)
        written = [str(p) for p in paths]
    elif args.parquet:
        written = [str(export_parquet(shards, args.parquet, index_dir=args.index_dir))]
    else:
        written = [str(export_wids(shards, args.wids, index_dir=args.index_dir))]
    if args.json:
        print(json.dumps({"written": written}))
    elif not args.quiet:
        what = f"{len(written)} DALI index files in {args.dali}" if args.dali else written[0]
        print(f"exported {len(shards)} shards: wrote {what}")
    return 0


def _add_output_shards(p: argparse.ArgumentParser) -> None:
    p.add_argument("pattern", help="output shard names with a %%-format: 'out-%%06d.tar'")
    p.add_argument("--maxcount", type=int, default=100_000, help="samples per shard (100000)")
    p.add_argument(
        "--maxsize", type=_size, default=3e9, help="bytes per shard on disk: 3e9, 1GB, 512MiB (3e9)"
    )
    p.add_argument("--start-shard", type=int, default=0, help="number of the first shard")
    p.add_argument("--manifest", metavar="FILE.json", help="also write a dataset manifest")
    p.add_argument(
        "--compress",
        choices=("gzip", "zstd"),
        help="write each sample as its own gzip member or zstd frame: a .tar.gz / .tar.zst "
        "that tar and webdataset read, with random access per sample (--maxsize counts "
        "uncompressed bytes)",
    )


def _add_key_filter(p: argparse.ArgumentParser, what: str) -> None:
    keys = p.add_mutually_exclusive_group()
    keys.add_argument(
        "--select", metavar="FILE", help=f"only {what} whose key is in FILE (one a line)"
    )
    keys.add_argument("--exclude", metavar="FILE", help=f"{what} whose key is not in FILE")


def add_tool_commands(sub: Any) -> None:
    p = sub.add_parser(
        "create",
        help="make indexed shards from a folder tree",
        description="Files sharing a key (path up to the first dot of the name) form a "
        "sample; samples are written sorted by key into deterministic, indexed shards.",
    )
    add_options(p, json=True, quiet=True)
    p.add_argument("src", help="the folder to read")
    _add_output_shards(p)
    p.add_argument(
        "-j", "--jobs", type=int, default=os.cpu_count() or 1, help="shards written in parallel"
    )
    p.add_argument(
        "--class-from-dir",
        action="store_true",
        help="add a 'cls' member: the number of the sample's top folder, sorted by name",
    )
    p.set_defaults(func=_cmd_create)

    p = sub.add_parser(
        "reshard",
        help="copy samples into new shards (no decoding)",
        description="Copy every sample's bytes from indexed shards into new indexed shards, "
        "in order or in a seeded global random order.",
    )
    add_options(p, index_dir=True, json=True, quiet=True)
    p.add_argument("shards", nargs="+", help="source shard paths, globs or brace patterns")
    _add_output_shards(p)
    p.add_argument("--shuffle", action="store_true", help="write samples in a random order")
    p.add_argument("--seed", type=int, default=0, help="seed of --shuffle (0)")
    p.set_defaults(func=_cmd_reshard)

    p = sub.add_parser("ls", help="list a shard's samples and members")
    add_options(p, index_dir=True, json=True)
    p.add_argument("shard")
    _add_key_filter(p, "the samples")
    add_join_options(p)
    p.set_defaults(func=_cmd_ls)

    p = sub.add_parser("cat", help="write one member's bytes to stdout")
    add_options(p, index_dir=True)
    p.add_argument("shard")
    p.add_argument("member", metavar="KEY.EXT", help="the member, such as 'train/0001.jpg'")
    p.set_defaults(func=_cmd_cat)

    p = sub.add_parser("get", help="describe sample INDEX of a dataset")
    add_options(p, index_dir=True, json=True)
    p.add_argument("dataset", help="shard pattern ('data-{000..009}.tar') or manifest (.json)")
    p.add_argument("index", type=int, help="sample number (negative counts from the end)")
    _add_key_filter(p, "count the samples")
    add_join_options(p)
    p.set_defaults(func=_cmd_get)

    p = sub.add_parser(
        "export",
        help="write DALI indexes, a wids shard list, or the attributes as parquet",
        description="Write DALI wds2idx v1.2 index files, a wids shard list, or a parquet "
        "table of every sample's shard, index, key and attributes, from the indexes.",
    )
    add_options(p, index_dir=True, json=True, quiet=True)
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--dali", metavar="OUTDIR", help="write <shard>.idx files into OUTDIR")
    target.add_argument("--wids", metavar="FILE.json", help="write a wids shard list")
    target.add_argument(
        "--parquet", metavar="FILE.parquet", help="write the samples' attributes as parquet"
    )
    p.add_argument("shards", nargs="+", help="shard paths, globs or brace patterns")
    p.set_defaults(func=_cmd_export)
