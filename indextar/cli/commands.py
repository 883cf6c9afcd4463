"""The ``indextar`` command line: the only module that prints or exits."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from tqdm import tqdm

from .._version import __version__
from ..errors import IndextarError
from ..index.build import default_workers, parallel_map
from ..index.decompress import DEFAULT_SEEK_SPACING
from ..index.opener import open_shard_index
from ..index.shard import ShardIndex
from ..index.verify import verify_index
from ..source.patterns import expand_shards
from .compress import add_compress_commands
from .convert import add_convert_command
from .indexing import FAILURES_FILE, add_index_options, run_index
from .messages import error_message
from .options import add_options, count
from .query import add_query_commands
from .tools import add_tool_commands

__all__ = ["main", "build_parser"]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What happened to one shard, as sent back from a worker process."""

    shard: str
    ok: bool
    result: dict[str, Any] | None = None
    error: str | None = None
    traceback: str | None = None
    index: ShardIndex | None = None


# -- per-shard work (runs in worker processes) ----------------------------------------


def _guard(shard: str, index_dir: str | None, work: Callable[[], dict[str, Any]]) -> Outcome:
    try:
        result = work()
        return Outcome(shard, True, result=result, index=result.pop("_index", None))
    except (IndextarError, OSError) as e:
        message = error_message(e, index_dir=index_dir)
        return Outcome(shard, False, error=message, traceback=traceback.format_exc())
    except Exception as e:  # noqa: BLE001 - reported per shard; the others still run
        return Outcome(
            shard, False, error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc()
        )


def _info_one(shard: str, index_dir: str | None) -> Outcome:
    def work() -> dict[str, Any]:
        ix = open_shard_index(shard, index_dir=index_dir)
        data_bytes = ix.data_bytes()
        samples = ix.meta.num_samples
        return {
            "index": str(ix.path),
            "samples": samples,
            "members": ix.meta.num_members,
            "shard_bytes": ix.meta.shard_size,
            "data_bytes": data_bytes,
            "overhead_per_sample": (ix.meta.end_offset - data_bytes) / samples if samples else 0.0,
            "extensions": ix.extension_counts(),
            "skipped": ix.skipped_counts(),
            "scattered_keys": len(ix.scattered_keys()),
            "compression": ix.meta.compression or None,
            "uncompressed_bytes": ix.meta.uncompressed_size or ix.meta.shard_size,
            "checksum": ix.meta.checksum or None,
        }

    return _guard(shard, index_dir, work)


def _verify_one(shard: str, index_dir: str | None) -> Outcome:
    def work() -> dict[str, Any]:
        report = verify_index(shard, index_dir=index_dir)
        if not report.ok:
            raise IndextarError(
                f"{shard!r}: index does not match the shard: {'; '.join(report.problems)}"
            )
        return asdict(report)

    return _guard(shard, index_dir, work)


# -- running over many shards --------------------------------------------------------


def _run(
    fn: Callable[..., Outcome],
    shards: list[str],
    args: tuple[Any, ...],
    jobs: int,
    desc: str,
    quiet: bool,
) -> Iterator[Outcome]:
    bar = tqdm(total=len(shards), desc=desc, unit="shard", disable=quiet or None, file=sys.stderr)
    try:
        for outcome in parallel_map(fn, shards, args, workers=jobs):
            yield outcome
            bar.update()
    finally:
        bar.close()


def _report_errors(outcomes: Sequence[Outcome], debug: bool) -> int:
    failed = [o for o in outcomes if not o.ok]
    for o in failed:
        if debug and o.traceback:
            print(o.traceback, file=sys.stderr, end="")
        print(f"indextar: error: {o.error}", file=sys.stderr)
    return 1 if failed else 0


def _cmd_index(args: argparse.Namespace) -> int:
    return run_index(args)


def _cmd_info(args: argparse.Namespace) -> int:
    shards = expand_shards(args.shards)
    outcomes = list(_run(_info_one, shards, (args.index_dir,), args.jobs, "reading", True))
    good = [o for o in outcomes if o.ok and o.result]
    if args.json:
        print(json.dumps([{"shard": o.shard, **(o.result or {})} for o in good], indent=None))
    else:
        for o in good:
            r = o.result or {}
            exts = ", ".join(f"{ext} {n:,}" for ext, n in r["extensions"].items()) or "none"
            skipped = ", ".join(f"{kind} {n:,}" for kind, n in r["skipped"].items()) or "none"
            packed = (
                f" ({r['compression']}: a {r['uncompressed_bytes']:,}-byte tar)"
                if r["compression"]
                else ""
            )
            print(
                f"{o.shard}: {r['samples']:,} samples, {r['members']:,} members, "
                f"{r['data_bytes']:,} data bytes in {r['shard_bytes']:,}{packed}; "
                f"tar overhead {r['overhead_per_sample']:,.0f} bytes/sample\n"
                f"  extensions: {exts}\n  skipped: {skipped}"
            )
        if len(good) > 1:
            total_samples = sum((o.result or {})["samples"] for o in good)
            total_bytes = sum((o.result or {})["shard_bytes"] for o in good)
            print(f"total: {len(good)} shards, {total_samples:,} samples, {total_bytes:,} bytes")
    return _report_errors(outcomes, args.debug)


def _cmd_verify(args: argparse.Namespace) -> int:
    shards = expand_shards(args.shards)
    outcomes = list(
        _run(_verify_one, shards, (args.index_dir,), args.jobs, "verifying", args.quiet)
    )
    for o in outcomes:
        for warning in (o.result or {}).get("warnings", []):
            print(f"indextar: warning: {o.shard!r}: {warning}", file=sys.stderr)
    good = [o for o in outcomes if o.ok]
    if args.json:
        print(json.dumps([{"shard": o.shard, "ok": o.ok, "error": o.error} for o in outcomes]))
    elif not args.quiet:
        print(
            f"verified {len(good)} of {count(len(outcomes), 'shard')}: "
            + ("all OK" if len(good) == len(outcomes) else "FAILED")
        )
    return _report_errors(outcomes, args.debug)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (also used to generate docs/cli.md)."""
    parser = argparse.ArgumentParser(
        prog="indextar",
        description="Index WebDataset-style tar shards for random access.",
    )
    parser.add_argument("--version", action="version", version=f"indextar {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "shards",
        nargs="+",
        help="shard paths, folders (their .tar files), globs or brace patterns "
        "('data-{000..099}.tar')",
    )
    common.add_argument(
        "-j",
        "--jobs",
        type=int,
        default=default_workers(),
        help="parallel processes (default: two per core, at most cores + 4: builds also wait "
        "on the disk)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "index",
        parents=[common],
        help="build missing indexes",
        description="Scan shards and write one SQLite index per shard. The shards that "
        f"failed are listed in the current folder, in {FAILURES_FILE}, for --retry-failed "
        "(see --failed-file and --no-failed-file).",
    )
    add_options(p, index_dir=True, json=True, quiet=True)
    p.add_argument(
        "--force", action="store_true", help="rebuild indexes even if they are up to date or stale"
    )
    p.add_argument(
        "--ignore-zeros",
        action="store_true",
        help="read on past zero blocks, as GNU tar -i: index every member of concatenated "
        "archives (cat a.tar b.tar > c.tar); local shards only",
    )
    p.add_argument(
        "--checksums",
        nargs="?",
        const="crc32",
        default=False,
        choices=("crc32", "xxh3_64"),
        help="also record a hash of each sample, which every read then checks (default "
        "crc32; xxh3_64 is faster and needs pip install indextar[checksums]); local shards "
        "only (see docs/format.md)",
    )
    p.add_argument(
        "--upload",
        action="store_true",
        help="put each remote shard's index next to it as <url>.idx.sqlite",
    )
    p.add_argument(
        "--meta",
        metavar="EXT",
        help="also store each sample's attributes, the top-level fields of its EXT member "
        "(json), as columns in its index (see docs/metadata.md)",
    )
    p.add_argument(
        "--on-error",
        choices=("fail", "skip"),
        default="fail",
        help="with --meta, a sample whose member is missing or not a JSON object: fail the "
        "shard (default), or log it and record it in the index's attribute_errors table",
    )
    p.add_argument(
        "--manifest",
        metavar="FILE.json",
        help="also write a dataset manifest (a superset of wids' shard list) of all the shards",
    )
    add_index_options(p)
    p.add_argument(
        "--seek-spacing",
        type=int,
        default=DEFAULT_SEEK_SPACING,
        metavar="BYTES",
        help="single-stream .tar.gz shards: uncompressed bytes between seek points "
        f"(default {DEFAULT_SEEK_SPACING}, at least 65536; each adds a window of up to 32 KiB, "
        "compressed, to the index)",
    )
    p.set_defaults(func=_cmd_index)

    p = sub.add_parser(
        "info",
        parents=[common],
        help="summarise indexed shards",
        description="Samples, members, bytes, extensions, skipped entries, tar overhead.",
    )
    add_options(p, index_dir=True, json=True)
    p.set_defaults(func=_cmd_info)

    p = sub.add_parser(
        "verify",
        parents=[common],
        help="re-scan shards and check their indexes",
        description="Re-scan every shard and compare it with its index, row by row.",
    )
    add_options(p, index_dir=True, json=True, quiet=True)
    p.set_defaults(func=_cmd_verify)
    add_tool_commands(sub)
    add_convert_command(sub)
    add_query_commands(sub)
    add_compress_commands(sub)
    return parser


def _quiet_broken_pipe() -> None:
    # Keep Python from reporting the failed flush of stdout at exit.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 on success)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.WARNING,
        format="indextar: %(levelname)s: %(message)s",
    )
    try:
        return int(args.func(args))
    except BrokenPipeError:  # the reader (head, less) went away: not an error
        _quiet_broken_pipe()
        return 0
    except (IndextarError, OSError) as e:  # OSError: a file named on the command line
        if args.debug:
            traceback.print_exc()
        message = error_message(e, index_dir=getattr(args, "index_dir", None))
        print(f"indextar: error: {message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
