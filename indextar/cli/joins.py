"""``--join PATTERN`` of ``indextar ls``, ``get`` and ``query``: the dataset joined by key
with another shard set (``IndexedTarDataset.join``), as the command's dataset.
Part of the command line: it prints."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import asdict, replace
from typing import Any

import numpy as np

from ..index.members import MemberTable
from ..read.dataset import IndexedTarDataset
from ..read.joined import JoinedDataset
from ..read.lookup import SampleInfo, describe_sample, shard_members
from ..read.subset import read_keys

__all__ = ["add_join_options", "open_joined", "joined_rows", "describe_joined", "joined_json"]


def add_join_options(p: argparse.ArgumentParser) -> None:
    """``--join PATTERN``, ``--join-how`` and ``--join-prefix``."""
    p.add_argument(
        "--join",
        metavar="PATTERN",
        help="join the shards of PATTERN (a shard pattern or a manifest) by key: their "
        "members are added to each sample's (see docs/joins.md)",
    )
    p.add_argument(
        "--join-how",
        choices=("inner", "left"),
        default="inner",
        help="inner: only samples that both sides have (default); left: every sample",
    )
    p.add_argument(
        "--join-prefix",
        default="",
        metavar="PREFIX",
        help="put before the joined members' extensions ('clip.' makes npy clip.npy); "
        "needed when both sides have an extension",
    )


def open_joined(dataset: str | Sequence[str], args: argparse.Namespace) -> JoinedDataset:
    """``dataset`` joined with ``--join``'s shards as the options say (indexes needed)."""
    left = IndexedTarDataset(dataset, index_dir=args.index_dir, build_missing=False)
    right = IndexedTarDataset(args.join, index_dir=args.index_dir, build_missing=False)
    return left.join(right, how=args.join_how, prefix=args.join_prefix)


class _Tables:
    """Each shard's member table, read once when first needed."""

    def __init__(self, index_dir: str | None) -> None:
        self.index_dir = index_dir
        self.tables: dict[str, MemberTable] = {}

    def members(self, shard: str, local: int) -> list[tuple[str, int]]:
        table = self.tables.get(shard)
        if table is None:
            table = self.tables[shard] = shard_members(shard, index_dir=self.index_dir)
        return [(table.exts[m], int(table.sizes[m])) for m in table.members_of(local)]


def joined_rows(
    joined: JoinedDataset, args: argparse.Namespace
) -> list[tuple[str, list[tuple[str, int]]]]:
    """``ls``'s rows of a joined shard: each sample's key, and its members and their
    sizes on both sides, from the indexes (``--select``/``--exclude`` applied)."""
    view: Any = joined
    if args.select or args.exclude:
        keys = [
            k.decode("utf-8", "surrogateescape") for k in read_keys(args.select or args.exclude)
        ]
        view = joined.select(keys) if args.select else joined.exclude(keys)
    indices = np.arange(len(view)) if view is joined else view.base_indices(np.arange(len(view)))
    lefts, rights = joined.sides(indices)
    tables = _Tables(args.index_dir)
    rows = []
    for left, right in zip(lefts.tolist(), rights.tolist()):
        shard_no, local = joined.left.locate(left)
        members = tables.members(joined.left.shards[shard_no], local)
        key = tables.tables[joined.left.shards[shard_no]].keys[local]
        if right >= 0:
            right_shard, right_local = joined.right.locate(right)
            members += [
                (joined.member_name(ext), size)
                for ext, size in tables.members(joined.right.shards[right_shard], right_local)
            ]
        rows.append((key, members))
    return rows


def describe_joined(joined: JoinedDataset, index: int) -> tuple[SampleInfo, SampleInfo | None]:
    """``get``'s description of sample ``index`` of a joined dataset: its left sample's,
    and its right sample's with the members named as in the joined sample."""
    lefts, rights = joined.sides([index])
    left = describe_sample(joined.left, int(lefts[0]))
    if rights[0] < 0:
        return left, None
    right = describe_sample(joined.right, int(rights[0]))
    members = tuple(replace(m, ext=joined.member_name(m.ext)) for m in right.members)
    return left, replace(right, members=members)


def joined_json(left: SampleInfo, right: SampleInfo | None) -> str:
    """``get --json``'s line for a joined sample: the left sample, and ``joined``."""

    def plain(info: SampleInfo) -> dict[str, Any]:
        members = [asdict(m) | {"head": m.head.decode("utf-8", "replace")} for m in info.members]
        return asdict(info) | {"members": members}

    return json.dumps(plain(left) | {"joined": None if right is None else plain(right)})
