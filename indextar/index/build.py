"""Build the indexes of many shards: in parallel processes, or on any executor.

The driver checks shards cheaply first (:mod:`~indextar.index.fresh`: local ones on
a stat, remote ones by listing their folder) and sends only the rest out as jobs
(:func:`~indextar.index.jobs.build_shard`), so a re-run over 100k mostly indexed shards
starts no pool at all. The executor can be anything with ``submit``: a process pool
here, Dask's ``Client.get_executor()`` on a cluster. Each job writes its own index and
returns a small outcome.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, as_completed
from typing import Any, TypeVar

from .. import errors
from ..errors import IndextarError
from ..source.location import remote_shards
from .attribute_json import OnError, attributes_member
from .checksums import ChecksumsArg
from .decompress import DEFAULT_SEEK_SPACING
from .fresh import fresh_by_listing, fresh_on_stat
from .jobs import ShardOutcome, build_shard, build_shards
from .options import BuildOptions
from .shard import PathLike, ShardIndex

__all__ = ["build_indexes", "iter_builds", "fresh_indexes", "parallel_map", "default_workers"]

# The error classes a failure's type name maps back to.
_ERROR_CLASSES = [
    cls for cls in vars(errors).values() if isinstance(cls, type) and issubclass(cls, IndextarError)
]

T = TypeVar("T")

log = logging.getLogger(__name__)


def build_indexes(
    shards: Sequence[str],
    *,
    index_dir: PathLike | None = None,
    workers: int | None = None,
    progress: bool = False,
    ignore_zeros: bool = False,
    attributes_from: str | None = None,
    on_error: OnError = "fail",
    executor: Executor | None = None,
    storage_options: dict[str, Any] | None = None,
    checksums: ChecksumsArg = False,
    force: bool = False,
    seek_spacing: int = DEFAULT_SEEK_SPACING,
    options: BuildOptions | None = None,
    meta: str | None = None,
) -> list[ShardIndex]:
    """Build (or open, where valid) the index of every shard; return them in order.

    Parameters
    ----------
    shards
        Local shard paths, or URLs (their indexes go into ``index_dir``).
    index_dir
        Folder for the indexes instead of next to each shard.
    workers
        Processes to build in; default: :func:`default_workers`, at most one per
        shard. ``1`` builds in this process (see :func:`parallel_map`).
    progress
        Show a tqdm progress bar on stderr.
    ignore_zeros
        As :func:`~indextar.build_index`: index every member of concatenated archives.
    attributes_from, on_error
        As :func:`~indextar.build_index`: store each sample's JSON attributes.
    executor
        Any :class:`concurrent.futures.Executor` to build in instead of a process
        pool, such as Dask's ``Client.get_executor()``. Each job writes its index
        where it belongs and sends back only its outcome, so the workers must see
        the shards and ``index_dir`` (shared storage or URLs).
    storage_options
        fsspec options for remote shards (endpoint, credentials), sent to each job.
    checksums
        As :func:`~indextar.build_index`: record a hash of each sample (local shards).
    force, seek_spacing
        As :func:`~indextar.build_index`: rebuild valid indexes too; the spacing of a
        ``.tar.gz``'s seek points.
    options
        All of the above that say how each shard is built, as one
        :class:`~indextar.index.options.BuildOptions` (what ``indextar index`` passes;
        also its ``upload`` and ``remote_mode``), instead of them one by one.
    meta
        The deprecated name of ``attributes_from`` (a :class:`DeprecationWarning`).

    Raises
    ------
    ShardFormatError, ShardNotFoundError, IndexWriteError
        As :func:`~indextar.build_index`, for the first shard that failed, once every
        shard has been tried; its notes name the other failures.
    """
    given = BuildOptions(
        index_dir=None if index_dir is None else os.fspath(index_dir),
        force=force,
        ignore_zeros=ignore_zeros,
        meta=attributes_member(attributes_from, meta, call="build_indexes"),
        on_error=on_error,
        storage_options=storage_options,
        seek_spacing=seek_spacing,
        checksums=checksums,
    )
    if options is None:
        options = given
    elif given != BuildOptions():
        raise TypeError("build_indexes() takes options= or the build options one by one, not both")
    log.info("building %d shard indexes", len(shards))
    bar = _progress_bar(len(shards)) if progress else None
    outcomes: dict[str, ShardOutcome] = {}
    try:
        for outcome in iter_builds(shards, options, workers=workers, executor=executor):
            outcomes[outcome.shard] = outcome
            if bar is not None:
                bar.update()
    finally:
        if bar is not None:
            bar.close()
    failed = [outcomes[shard] for shard in shards if not outcomes[shard].ok]
    if failed:
        raise _failure(failed, len(shards))
    return [outcomes[shard].index for shard in shards]  # type: ignore[misc]


def iter_builds(
    shards: Sequence[str],
    options: BuildOptions,
    *,
    workers: int | None = None,
    executor: Executor | None = None,
) -> Iterator[ShardOutcome]:
    """Every shard's :class:`~indextar.index.jobs.ShardOutcome`, as each finishes.

    Shards whose index is fresh, local ones on a stat
    (:func:`~indextar.index.fresh.fresh_on_stat`) and remote ones by a listing of their
    folder (:func:`~indextar.index.fresh.fresh_by_listing`), are answered here, first
    and without a job; the rest run as jobs on ``executor``,
    or else in a process pool of ``workers`` (none is started for fewer than two
    jobs). A failed shard is an outcome with its error; the others go on.
    """
    pending = []
    for shard, fresh in zip(shards, fresh_indexes(shards, options)):
        if fresh is None:
            pending.append(shard)
        else:
            yield ShardOutcome(shard, fresh)
    if not pending:
        return
    log.info("%d of %d shards need a build or a full check", len(pending), len(shards))
    if executor is not None:
        yield from _run_on(executor, pending, options)
        return
    count = max(1, min(workers or default_workers(), len(pending)))
    if count == 1:
        for shard in pending:
            yield build_shard(shard, options)
        return
    with _process_pool(count) as pool:
        yield from _run_on(pool, pending, options)


def fresh_indexes(shards: Sequence[str], options: BuildOptions) -> list[ShardIndex | None]:
    """Each shard's index if the driver's quick check finds it fresh, else ``None``: a
    local shard's on a stat (:func:`~indextar.index.fresh.fresh_on_stat`), the remote
    ones' by a listing of their folders (:func:`~indextar.index.fresh.fresh_by_listing`)."""
    remote = remote_shards(shards)
    listed = fresh_by_listing([shards[n] for n in sorted(remote)], options)
    return [
        listed.get(shard) if n in remote else fresh_on_stat(shard, options)
        for n, shard in enumerate(shards)
    ]


# Shards per job: enough jobs to spread over any cluster and to show progress, few
# enough that a scheduler's cost per job (a few ms on Dask) stays small beside a build.
_MIN_JOBS = 256
_MAX_BATCH = 32


def _run_on(executor: Executor, shards: list[str], options: BuildOptions) -> Iterator[ShardOutcome]:
    batch = max(1, min(_MAX_BATCH, len(shards) // _MIN_JOBS))
    batches = [shards[i : i + batch] for i in range(0, len(shards), batch)]
    futures = {executor.submit(build_shards, part, options): part for part in batches}
    try:
        for future in as_completed(futures):
            try:
                yield from future.result()
            except Exception as e:  # noqa: BLE001 - the worker itself died: those shards failed
                for shard in futures[future]:
                    yield ShardOutcome(
                        shard, error=f"{type(e).__name__}: {e}", error_type=type(e).__name__
                    )
    except BaseException:  # an error, or the caller stopped iterating
        for future in futures:
            future.cancel()
        raise


def _failure(failed: list[ShardOutcome], total: int) -> IndextarError:
    """The first failure's error (its class, from its text), naming every other failure."""
    first = failed[0]
    classes = {cls.__name__: cls for cls in _ERROR_CLASSES}
    message = first.error or "failed"
    if len(failed) > 1:
        listed = "; ".join(f"{o.shard!r}: {o.error}" for o in failed[1:6])
        more = f" and {len(failed) - 6} more" if len(failed) > 6 else ""
        message += f" ({len(failed)} of {total} shards failed; also {listed}{more})"
    try:
        return classes.get(first.error_type or "", IndextarError)(message)
    except TypeError:  # a class that takes more than a message
        return IndextarError(message)


@contextlib.contextmanager
def _process_pool(workers: int) -> Iterator[ProcessPoolExecutor]:
    """A pool of forked processes where the platform can fork (see :func:`parallel_map`)."""
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    context = multiprocessing.get_context(method)
    with warnings.catch_warnings(), ProcessPoolExecutor(workers, mp_context=context) as pool:
        # Python >= 3.12 warns about fork in a process with threads; the children
        # never touch the parent's threads or their locks.
        warnings.filterwarnings("ignore", message=".*fork.*", category=DeprecationWarning)
        try:
            yield pool
        except BaseException:
            pool.shutdown(cancel_futures=True)
            raise


def default_workers() -> int:
    """Processes for indexing: two per CPU, and at most four more than the CPUs.

    A build waits on the disk for much of its time on small shards (the index's fsync
    and rename): with more processes than CPUs one scans while another waits. Measured
    on 200 shards of 2,000 members on 2 CPUs: 1.98 s with 2 processes, 1.31 s with 4.
    A few waiting processes are enough on any machine; each build holds its shard's
    names in memory, so a 64-core machine runs 68, not 128.
    """
    cpus = os.cpu_count() or 1
    return min(2 * cpus, cpus + 4)


def parallel_map(
    fn: Callable[..., T], items: Sequence[Any], args: tuple[Any, ...] = (), *, workers: int | None
) -> Iterator[T]:
    """``fn(item, *args)`` for every item, yielded in order, from up to ``workers`` processes.

    ``workers=None`` means :func:`default_workers`, never more than one per item; ``1``
    runs in this process. Workers are forked where the platform can, so that a script
    without an ``if __name__ == "__main__":`` guard works; ``fn`` must only scan and
    write files, which is safe in a fork. If ``fn`` raises, the items not yet started
    are cancelled and the error propagates.
    """
    workers = max(1, min(workers or default_workers(), len(items)))
    if workers == 1:
        for item in items:
            yield fn(item, *args)
        return
    with _process_pool(workers) as pool:
        futures = [pool.submit(fn, item, *args) for item in items]
        try:
            for future in futures:
                yield future.result()
        except BaseException:  # an error, or the caller stopped iterating
            pool.shutdown(cancel_futures=True)
            raise


def _progress_bar(total: int) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="indexing shards", unit="shard")
