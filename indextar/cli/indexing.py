"""``indextar index``: build many shards' indexes, on this machine or a Dask cluster.

The work is :func:`indextar.index.build.iter_builds`; this module chooses the
executor (``--dask ADDRESS``, else a process pool of ``--jobs``), shows progress
(a bar with shards/s, samples/s and bytes/s, or ``--json-lines``), says what a
``--dry-run`` would do, keeps the failures in a file that ``--retry-failed`` reads
back, and prints the summary.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ..atomic import write_atomic
from ..errors import IndextarError, StaleIndexError
from ..index.build import fresh_indexes, iter_builds
from ..index.jobs import ShardOutcome
from ..index.manifest import append_to_manifest, write_manifest
from ..index.options import BuildOptions
from ..index.remote import default_index_dir
from ..source.location import ShardLocation, remote_shards
from ..source.patterns import expand_shards
from .options import count

__all__ = ["run_index", "add_index_options", "dask_executor", "FAILURES_FILE"]

#: Where a run lists the shards that failed, in the current folder (``--failed-file``
#: changes it, ``--no-failed-file`` writes none).
FAILURES_FILE = "indextar-failed.json"


def add_index_options(parser: argparse.ArgumentParser) -> None:
    """The options of ``indextar index`` that choose where and how it runs."""
    parser.add_argument(
        "--dask",
        metavar="ADDRESS",
        help="build on a Dask cluster (its scheduler, e.g. tcp://10.0.0.1:8786); the workers "
        "must reach the shards and --index-dir (needs the dask extra)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="say which shards would be built and which are up to date; build nothing",
    )
    failed_file = parser.add_mutually_exclusive_group()
    failed_file.add_argument(
        "--failed-file",
        "--failures",
        dest="failures",
        metavar="FILE.json",
        default=FAILURES_FILE,
        help=f"where a run lists the shards that failed (default: {FAILURES_FILE} in the "
        "current folder); removed by a run where none did",
    )
    failed_file.add_argument(
        "--no-failed-file",
        dest="failures",
        action="store_const",
        const=None,
        help="write (and remove) no failures file: the failures are only printed",
    )
    parser.add_argument(
        "--retry-failed",
        action="store_true",
        help="index only the shards listed in --failed-file by the last run (of those given)",
    )
    parser.add_argument(
        "--append",
        action="store_true",
        help="add the shards to the end of an existing --manifest instead of writing it anew, "
        "without reading the shards it lists (give only new shards)",
    )
    parser.add_argument(
        "--json-lines",
        action="store_true",
        help="one JSON object per shard on stdout as each finishes, then one with the summary",
    )


def run_index(args: argparse.Namespace) -> int:
    """``indextar index``: returns the exit status."""
    shards = _shards(args)
    options = BuildOptions(
        index_dir=_index_dir(args, shards),
        force=args.force,
        ignore_zeros=args.ignore_zeros,
        meta=args.meta,
        on_error=args.on_error,
        upload=args.upload,
        seek_spacing=args.seek_spacing,
        checksums=args.checksums,
    )
    if args.dry_run:
        return _dry_run(shards, options, args)
    start = time.perf_counter()
    outcomes: list[ShardOutcome] = []
    with dask_executor(args.dask) as executor, _Progress(len(shards), args) as progress:
        for outcome in iter_builds(shards, options, workers=args.jobs, executor=executor):
            outcomes.append(progress.update(outcome))
    order = {shard: i for i, shard in enumerate(shards)}
    outcomes.sort(key=lambda o: order[o.shard])
    summary = _summary(outcomes, time.perf_counter() - start)
    if args.json_lines:
        print(json.dumps({"summary": summary}), flush=True)
    elif args.json:
        per_shard = [_shard_json(o) for o in outcomes]
        print(json.dumps({"summary": summary, "shards": per_shard}))
    elif not args.quiet:
        _print_summary(summary)
    status = _report_failures(outcomes, args)
    if args.manifest:
        if status:
            print(
                f"indextar: error: not writing {args.manifest}: some shards failed", file=sys.stderr
            )
        else:
            indexes = [o.index for o in outcomes if o.index is not None]
            if args.append and Path(args.manifest).exists():
                path = append_to_manifest(args.manifest, indexes)
            else:
                path = write_manifest(args.manifest, indexes)
            if not args.quiet and not args.json and not args.json_lines:
                print(f"wrote manifest {path} ({len(outcomes)} shards)")
    return status


# -- which shards, where ----------------------------------------------------------------


def _shards(args: argparse.Namespace) -> list[str]:
    shards = expand_shards(args.shards)
    if not args.retry_failed:
        return shards
    if args.failures is None:
        raise IndextarError("--retry-failed reads --failed-file: not with --no-failed-file")
    try:
        listed = json.loads(Path(args.failures).read_text())["failed"]
    except FileNotFoundError:
        raise IndextarError(
            f"--retry-failed: no {args.failures} (a run writes it when some shards fail)"
        ) from None
    except (ValueError, KeyError, TypeError) as e:
        raise IndextarError(f"--retry-failed: {args.failures} is not a failures list: {e}") from e
    failed = {entry["shard"] for entry in listed}
    return [shard for shard in shards if shard in failed]


def _index_dir(args: argparse.Namespace, shards: list[str]) -> str | None:
    if args.index_dir is None and remote_shards(shards):
        return str(default_index_dir())  # remote indexes' default home
    return None if args.index_dir is None else str(args.index_dir)


@contextlib.contextmanager
def dask_executor(address: str | None) -> Iterator[Executor | None]:
    """The executor of the Dask cluster at ``address`` (``None``: no cluster, ``None``)."""
    if address is None:
        yield None
        return
    try:
        from distributed import Client
    except ImportError as e:
        raise IndextarError(
            f"--dask needs the Dask distributed scheduler: pip install 'indextar[dask]' ({e})"
        ) from e
    with Client(address) as client:  # type: ignore[no-untyped-call]
        yield client.get_executor()


# -- what it prints ---------------------------------------------------------------------------


class _Progress:
    """The bar (shards/s and an ETA from tqdm; samples/s and MB/s beside them), or JSON lines."""

    def __init__(self, total: int, args: argparse.Namespace):
        self.lines = bool(args.json_lines)
        quiet = args.quiet or self.lines
        self.bar = tqdm(
            total=total, desc="indexing", unit="shard", disable=quiet or None, file=sys.stderr
        )
        self.start = time.perf_counter()
        self.samples = 0
        self.bytes = 0

    def __enter__(self) -> _Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.close()

    def update(self, outcome: ShardOutcome) -> ShardOutcome:
        if outcome.index is not None:
            self.samples += outcome.index.meta.num_samples
            self.bytes += outcome.index.meta.shard_size
        if self.lines:
            print(json.dumps(_shard_json(outcome)), flush=True)
            return outcome
        seconds = max(time.perf_counter() - self.start, 1e-9)
        self.bar.set_postfix_str(
            f"{self.samples / seconds:,.0f} samples/s, {self.bytes / seconds / 1e6:,.1f} MB/s",
            refresh=False,
        )
        self.bar.update()
        return outcome


def _shard_json(outcome: ShardOutcome) -> dict[str, Any]:
    result = None
    if outcome.index is not None:
        path = outcome.index.path
        result = {
            "index": str(path),
            "samples": outcome.index.meta.num_samples,
            "members": outcome.index.meta.num_members,
            "bytes": outcome.index.meta.shard_size,
            "index_bytes": _size(path),
            "seconds": outcome.seconds,
            "built": outcome.built,
            "scan": outcome.scan,
            "bytes_fetched": outcome.bytes_fetched,
        }
        if outcome.uploaded is not None:
            result["uploaded"] = outcome.uploaded
    return {"shard": outcome.shard, "ok": outcome.ok, "result": result, "error": outcome.error}


def _size(path: Path) -> int | None:
    try:
        return os.stat(path).st_size
    except OSError:  # on a worker's disk only
        return None


def _summary(outcomes: list[ShardOutcome], seconds: float) -> dict[str, Any]:
    done = [(o, o.index.meta) for o in outcomes if o.index is not None]
    members = sum(meta.num_members for _, meta in done)
    return {
        "shards": len(done),
        "failed": len(outcomes) - len(done),
        "built": sum(1 for o, _ in done if o.built),
        "samples": sum(meta.num_samples for _, meta in done),
        "members": members,
        "bytes": sum(meta.shard_size for _, meta in done),
        "bytes_fetched": sum(o.bytes_fetched for o, _ in done),
        "seconds": seconds,
        "members_per_second": members / seconds if seconds else 0.0,
    }


def _print_summary(summary: dict[str, Any]) -> None:
    reused = summary["shards"] - summary["built"]
    failed = f", {summary['failed']} failed" if summary["failed"] else ""
    fetched = summary["bytes_fetched"]
    remote = f", {fetched / 1e6:,.1f} MB fetched" if fetched else ""
    print(
        f"indexed {count(summary['shards'], 'shard')} ({summary['built']} built, "
        f"{reused} up to date{failed}): {summary['samples']:,} samples, "
        f"{summary['members']:,} members, {summary['bytes'] / 1e6:,.1f} MB{remote} in "
        f"{summary['seconds']:.2f} s ({summary['members_per_second']:,.0f} members/s)"
    )


def _report_failures(outcomes: list[ShardOutcome], args: argparse.Namespace) -> int:
    """Print every failure, list them in ``--failed-file`` (or remove it); the exit status."""
    failed = [o for o in outcomes if not o.ok]
    for o in failed:
        if args.debug and o.traceback:
            print(o.traceback, file=sys.stderr, end="")
        hint = (
            " (or run: indextar index --force)" if o.error_type == StaleIndexError.__name__ else ""
        )
        print(f"indextar: error: {o.error}{hint}", file=sys.stderr)
    if args.failures is None:
        return 1 if failed else 0
    path = Path(args.failures)
    if failed:
        listed = [{"shard": o.shard, "error": o.error, "error_type": o.error_type} for o in failed]
        write_atomic(path, json.dumps({"failed": listed}, indent=1) + "\n")
        if not (args.quiet or args.json or args.json_lines):
            print(
                f"{count(len(failed), 'failed shard')} listed in {path}: "
                "run again with --retry-failed to index only those"
            )
        return 1
    path.unlink(missing_ok=True)
    return 0


def _dry_run(shards: list[str], options: BuildOptions, args: argparse.Namespace) -> int:
    """Print what a run would do: each shard to build or check, and those up to date."""
    plan = []
    for shard, fresh in zip(shards, fresh_indexes(shards, options)):
        location = ShardLocation.of(shard)
        if fresh is not None:
            action = "up to date"
        elif location.remote:
            have = options.index_dir and location.index_path(options.index_dir).exists()
            action = "check" if have and not options.force else "build"
        else:
            action = "build"
        plan.append((shard, action))
    counts = {action: sum(1 for _, a in plan if a == action) for action in ("build", "check")}
    counts["up to date"] = len(plan) - counts["build"] - counts["check"]
    if args.json or args.json_lines:
        for shard, action in plan:
            print(json.dumps({"shard": shard, "action": action}))
        print(json.dumps({"summary": {"shards": len(plan), **counts}}))
        return 0
    for shard, action in plan:
        if action != "up to date":
            print(f"would {action} {shard}")
    print(
        f"dry run: {count(len(plan), 'shard')}: {counts['build']} to build, "
        f"{counts['check']} to check against the store, {counts['up to date']} up to date"
    )
    return 0
