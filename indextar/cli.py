"""The ``indextar`` command line: the only module that prints or exits."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from tqdm import tqdm

from ._version import __version__
from .create import create_shards
from .errors import IndextarError, StaleIndexError
from .export import export_dali, export_wids
from .index import ShardIndex, build_index, index_path, open_index
from .lookup import describe_sample, read_member, shard_members
from .manifest import write_manifest
from .patterns import expand_shards, is_url
from .remote_index import build_remote_index, open_remote_index, remote_index_path, upload_index
from .remote_options import default_cache_root
from .reshard import reshard
from .verify import verify_index

__all__ = ["main", "build_parser"]

T = TypeVar("T")


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


def _guard(shard: str, work: Callable[[], dict[str, Any]]) -> Outcome:
    try:
        result = work()
        return Outcome(shard, True, result=result, index=result.pop("_index", None))
    except (IndextarError, OSError) as e:
        return Outcome(shard, False, error=str(e), traceback=traceback.format_exc())
    except Exception as e:  # noqa: BLE001 - reported per shard; the others still run
        return Outcome(
            shard, False, error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc()
        )


def _index_one(shard: str, index_dir: str | None, force: bool, upload: bool = False) -> Outcome:
    def work() -> dict[str, Any]:
        start = time.perf_counter()
        if is_url(shard):
            ix, built = _index_remote(shard, index_dir, force)
        else:
            if upload:
                raise IndextarError(f"--upload is for remote shards; {shard!r} is a local file")
            before = _identity(index_path(shard, index_dir=index_dir))
            try:
                ix = build_index(shard, index_dir=index_dir, force=force)
            except StaleIndexError as e:
                raise StaleIndexError(f"{e} (or run: indextar index --force)") from e
            # A rebuilt index is a new file (renamed into place), so a new inode.
            built = before is None or before != _identity(ix.path)
        result = {
            "index": str(ix.path),
            "samples": ix.meta.num_samples,
            "members": ix.meta.num_members,
            "bytes": ix.meta.shard_size,
            "seconds": time.perf_counter() - start,
            "built": built,
            "_index": ix,
        }
        if upload:
            result["uploaded"] = upload_index(ix)
        return result

    return _guard(shard, work)


def _index_remote(url: str, index_dir: str | None, force: bool) -> tuple[ShardIndex, bool]:
    """Index a remote shard into ``index_dir`` (default: the remote cache's index folder)."""
    folder = Path(index_dir) if index_dir is not None else default_cache_root() / "indexes"
    if force:
        return build_remote_index(url, index_dir=folder), True
    before = _identity(remote_index_path(url, folder))
    ix = open_remote_index(url, index_dir=folder)
    return ix, before is None or before != _identity(ix.path)


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


def _info_one(shard: str, index_dir: str | None) -> Outcome:
    def work() -> dict[str, Any]:
        ix = open_index(shard, index_dir=index_dir)
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
        }

    return _guard(shard, work)


def _verify_one(shard: str, index_dir: str | None) -> Outcome:
    def work() -> dict[str, Any]:
        report = verify_index(shard, index_dir=index_dir)
        if not report.ok:
            raise IndextarError(
                f"{shard!r}: index does not match the shard: {'; '.join(report.problems)}"
            )
        return asdict(report)

    return _guard(shard, work)


# -- running over many shards --------------------------------------------------------


def _run(
    fn: Callable[..., Outcome],
    shards: list[str],
    args: tuple[Any, ...],
    jobs: int,
    desc: str,
    quiet: bool,
) -> Iterator[Outcome]:
    jobs = max(1, min(jobs, len(shards)))
    bar = tqdm(total=len(shards), desc=desc, unit="shard", disable=quiet or None, file=sys.stderr)
    try:
        if jobs == 1:
            for shard in shards:
                yield fn(shard, *args)
                bar.update()
        else:
            with ProcessPoolExecutor(max_workers=jobs) as pool:
                futures = [pool.submit(fn, shard, *args) for shard in shards]
                for future in futures:
                    yield future.result()
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
    shards = expand_shards(args.shards)
    start = time.perf_counter()
    outcomes = list(
        _run(
            _index_one,
            shards,
            (args.index_dir, args.force, args.upload),
            args.jobs,
            "indexing",
            args.quiet,
        )
    )
    seconds = time.perf_counter() - start
    done = [o.result for o in outcomes if o.ok and o.result]
    members = sum(r["members"] for r in done)
    summary = {
        "shards": len(done),
        "failed": len(outcomes) - len(done),
        "built": sum(1 for r in done if r["built"]),
        "samples": sum(r["samples"] for r in done),
        "members": members,
        "bytes": sum(r["bytes"] for r in done),
        "seconds": seconds,
        "members_per_second": members / seconds if seconds else 0.0,
    }
    if args.json:
        per_shard = [
            {"shard": o.shard, "ok": o.ok, "result": o.result, "error": o.error} for o in outcomes
        ]
        print(json.dumps({"summary": summary, "shards": per_shard}))
    elif not args.quiet:
        reused = summary["shards"] - summary["built"]
        print(
            f"indexed {summary['shards']} shards ({summary['built']} built, {reused} up to date"
            f"{', ' + str(summary['failed']) + ' failed' if summary['failed'] else ''}): "
            f"{summary['samples']:,} samples, {members:,} members, "
            f"{summary['bytes'] / 1e6:,.1f} MB in {seconds:.2f} s "
            f"({summary['members_per_second']:,.0f} members/s)"
        )
    status = _report_errors(outcomes, args.debug)
    if args.manifest:
        if status:
            print(
                f"indextar: error: not writing {args.manifest}: some shards failed", file=sys.stderr
            )
        else:
            path = write_manifest(args.manifest, [o.index for o in outcomes if o.index is not None])
            if not args.quiet and not args.json:
                print(f"wrote manifest {path} ({len(outcomes)} shards)")
    return status


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
            print(
                f"{o.shard}: {r['samples']:,} samples, {r['members']:,} members, "
                f"{r['data_bytes']:,} data bytes in {r['shard_bytes']:,}; "
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
            f"verified {len(good)} of {len(outcomes)} shards: "
            + ("all OK" if len(good) == len(outcomes) else "FAILED")
        )
    return _report_errors(outcomes, args.debug)


# -- making and inspecting shards (create, reshard, ls, cat, get, export) --------------

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
    table = shard_members(args.shard, index_dir=args.index_dir)
    rows = [
        (table.keys[i], [(table.exts[m], int(table.sizes[m])) for m in table.members_of(i)])
        for i in range(len(table))
    ]
    try:
        if args.json:
            print(json.dumps([{"key": key, "members": dict(members)} for key, members in rows]))
        else:
            for key, members in rows:
                print(key + "\t" + " ".join(f"{ext}:{size}" for ext, size in members))
    except BrokenPipeError:
        _quiet_broken_pipe()
    return 0


def _cmd_cat(args: argparse.Namespace) -> int:
    data = read_member(args.shard, args.member, index_dir=args.index_dir)
    try:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    except BrokenPipeError:
        _quiet_broken_pipe()
    return 0


def _quiet_broken_pipe() -> None:
    # The reader (head, less) went away: not an error. Keep Python from
    # reporting the failed flush of stdout at exit.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _cmd_get(args: argparse.Namespace) -> int:
    info = describe_sample(args.dataset, args.index, index_dir=args.index_dir)
    if args.json:
        members = [asdict(m) | {"head": m.head.decode("utf-8", "replace")} for m in info.members]
        print(json.dumps(asdict(info) | {"members": members}))
        return 0
    print(
        f"sample {info.index}: key {info.key!r}\n  shard {info.shard}, sample {info.shard_sample}, "
        f"bytes {info.start_offset}..{info.end_offset}"
    )
    for m in info.members:
        print(f"  {m.ext:<10} {m.size:>12,} bytes  {_preview(m.head, m.size)}")
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


def _add_tool_commands(sub: Any) -> None:
    output = argparse.ArgumentParser(add_help=False)
    output.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    output.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summary")
    output.add_argument("--debug", action="store_true", help="show tracebacks and debug logging")
    output.add_argument("--index-dir", help="where the (source) shards' indexes live")

    p = sub.add_parser(
        "create",
        parents=[output],
        help="make indexed shards from a folder tree",
        description="Files sharing a key (path up to the first dot of the name) form a "
        "sample; samples are written sorted by key into deterministic, indexed shards.",
    )
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
        parents=[output],
        help="copy samples into new shards (no decoding)",
        description="Copy every sample's bytes from indexed shards into new indexed shards, "
        "in order or in a seeded global random order.",
    )
    p.add_argument("shards", nargs="+", help="source shard paths, globs or brace patterns")
    _add_output_shards(p)
    p.add_argument("--shuffle", action="store_true", help="write samples in a random order")
    p.add_argument("--seed", type=int, default=0, help="seed of --shuffle (0)")
    p.set_defaults(func=_cmd_reshard)

    p = sub.add_parser("ls", parents=[output], help="list a shard's samples and members")
    p.add_argument("shard")
    p.set_defaults(func=_cmd_ls)

    p = sub.add_parser("cat", parents=[output], help="write one member's bytes to stdout")
    p.add_argument("shard")
    p.add_argument("member", metavar="KEY.EXT", help="the member, such as 'train/0001.jpg'")
    p.set_defaults(func=_cmd_cat)

    p = sub.add_parser("get", parents=[output], help="describe sample INDEX of a dataset")
    p.add_argument("dataset", help="shard pattern ('data-{000..009}.tar') or manifest (.json)")
    p.add_argument("index", type=int, help="sample number (negative counts from the end)")
    p.set_defaults(func=_cmd_get)

    p = sub.add_parser(
        "export",
        parents=[output],
        help="write DALI indexes or a wids shard list",
        description="Write DALI wds2idx v1.2 index files, or a wids shard list, from the indexes.",
    )
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--dali", metavar="OUTDIR", help="write <shard>.idx files into OUTDIR")
    target.add_argument("--wids", metavar="FILE.json", help="write a wids shard list")
    p.add_argument("shards", nargs="+", help="shard paths, globs or brace patterns")
    p.set_defaults(func=_cmd_export)


# -- parser ---------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (also used to generate docs/cli.md)."""
    parser = argparse.ArgumentParser(
        prog="indextar",
        description="Index WebDataset-style tar shards for random access.",
    )
    parser.add_argument("--version", action="version", version=f"indextar {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "shards", nargs="+", help="shard paths, globs or brace patterns ('data-{000..099}.tar')"
    )
    common.add_argument(
        "--index-dir", help="keep indexes in this folder instead of next to the shards"
    )
    common.add_argument(
        "-j",
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        help="parallel processes (default: all cores)",
    )
    common.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    common.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summary")
    common.add_argument("--debug", action="store_true", help="show tracebacks and debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "index",
        parents=[common],
        help="build missing indexes",
        description="Scan shards and write one SQLite index per shard.",
    )
    p.add_argument(
        "--force", action="store_true", help="rebuild indexes even if they are up to date or stale"
    )
    p.add_argument(
        "--upload",
        action="store_true",
        help="put each remote shard's index next to it as <url>.idx.sqlite",
    )
    p.add_argument(
        "--manifest",
        metavar="FILE.json",
        help="also write a dataset manifest (a superset of wids' shard list) of all the shards",
    )
    p.set_defaults(func=_cmd_index)

    p = sub.add_parser(
        "info",
        parents=[common],
        help="summarise indexed shards",
        description="Samples, members, bytes, extensions, skipped entries, tar overhead.",
    )
    p.set_defaults(func=_cmd_info)

    p = sub.add_parser(
        "verify",
        parents=[common],
        help="re-scan shards and check their indexes",
        description="Re-scan every shard and compare it with its index, row by row.",
    )
    p.set_defaults(func=_cmd_verify)
    _add_tool_commands(sub)
    return parser


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
    except IndextarError as e:
        if args.debug:
            traceback.print_exc()
        print(f"indextar: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
