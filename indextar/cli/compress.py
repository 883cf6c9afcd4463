"""``indextar recompress``: rewrite a shard into per-sample frames (or back to a plain tar)."""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from ..errors import IndextarError
from ..tar.compress import CODECS, split_compression_suffix
from ..write.recompress import recompress
from .options import add_options

__all__ = ["add_compress_commands"]


def _codec(target: str, given: str | None) -> str | None:
    """The target's compression: ``--to``, else its suffix; ``None`` for a plain tar."""
    if given is not None:
        return None if given == "none" else given
    codec = split_compression_suffix(target)[1]
    if codec in CODECS:
        return codec
    if codec is None and target.lower().endswith(".tar"):
        return None
    raise IndextarError(
        f"cannot tell the compression of {target!r} from its name; end it in .tar, "
        ".tar.gz or .tar.zst, or give --to gzip|zstd|none"
    )


def _cmd_recompress(args: argparse.Namespace) -> int:
    codec = _codec(args.target, args.to)
    start = time.perf_counter()
    index = recompress(args.source, args.target, compress=codec)
    assert index is not None
    summary: dict[str, Any] = {
        "source": args.source,
        "target": args.target,
        "compression": codec or "none",
        "samples": index.meta.num_samples,
        "source_bytes": os.path.getsize(args.source),
        "target_bytes": index.meta.shard_size,
        "index": str(index.path),
        "seconds": time.perf_counter() - start,
    }
    if args.json:
        print(json.dumps(summary))
    elif not args.quiet:
        print(
            f"recompressed {args.source} ({summary['source_bytes']:,} bytes) into "
            f"{args.target} ({codec or 'plain'}, {summary['target_bytes']:,} bytes): "
            f"{summary['samples']:,} samples, one frame each, in {summary['seconds']:.2f} s"
        )
    return 0


def add_compress_commands(sub: Any) -> None:
    p = sub.add_parser(
        "recompress",
        help="rewrite a shard with a gzip member or zstd frame per sample, and index it",
        description="Read a shard front to back (plain, .tar.gz, or .tar.zst of one frame or "
        "many) and copy every entry, header blocks and all, to a new shard, each sample its "
        "own gzip member or zstd frame, indexed in the same pass: random access per sample, "
        "and still a .tar.gz / .tar.zst that tar and webdataset read, listing the same "
        "entries, modes, owners and times.",
    )
    add_options(p, json=True, quiet=True)
    p.add_argument("source", help="the shard to read (a local file)")
    p.add_argument("target", help="the shard to write: .tar, .tar.gz or .tar.zst")
    p.add_argument(
        "--to",
        choices=("gzip", "zstd", "none"),
        help="the target's compression (default: from its name)",
    )
    p.set_defaults(func=_cmd_recompress)
