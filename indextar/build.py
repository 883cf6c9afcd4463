"""Build the indexes of many shards, in parallel processes."""

from __future__ import annotations

import logging
import multiprocessing
import os
import warnings
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

from .index import PathLike, ShardIndex, build_index

__all__ = ["build_indexes"]

log = logging.getLogger(__name__)


def _build_one(shard: str, index_dir: str | None) -> ShardIndex:
    return build_index(shard, index_dir=index_dir)


def build_indexes(
    shards: Sequence[str],
    *,
    index_dir: PathLike | None = None,
    workers: int | None = None,
    progress: bool = False,
) -> list[ShardIndex]:
    """Build (or open, where valid) the index of every shard; return them in order.

    Parameters
    ----------
    shards
        Local shard paths.
    index_dir
        Folder for the indexes instead of next to each shard.
    workers
        Processes to build in; default: the number of CPUs, at most one per shard.
        ``1`` builds in this process. Workers are forked where the platform can, so
        that a script without an ``if __name__ == "__main__":`` guard works; they only
        scan and write files, which is safe to do in a fork.
    progress
        Show a tqdm progress bar on stderr.

    Raises
    ------
    ShardFormatError, ShardNotFoundError, IndexWriteError
        As :func:`~indextar.build_index`, for the first shard that fails.
    """
    folder = None if index_dir is None else os.fspath(index_dir)
    if workers is None:
        workers = os.cpu_count() or 1
    workers = max(1, min(workers, len(shards)))
    log.info("building %d shard indexes in %d process(es)", len(shards), workers)
    bar = _progress_bar(len(shards)) if progress else None
    results: dict[int, ShardIndex] = {}
    try:
        if workers == 1:
            for position, shard in enumerate(shards):
                results[position] = _build_one(shard, folder)
                if bar is not None:
                    bar.update()
        else:
            method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
            context = multiprocessing.get_context(method)
            with warnings.catch_warnings(), ProcessPoolExecutor(workers, mp_context=context) as pool:
                # Python >= 3.12 warns about fork in a process with threads; the
                # children never touch the parent's threads or their locks.
                warnings.filterwarnings("ignore", message=".*fork.*", category=DeprecationWarning)
                futures = {pool.submit(_build_one, shard, folder): n for n, shard in enumerate(shards)}
                try:
                    for future in as_completed(futures):
                        results[futures[future]] = future.result()
                        if bar is not None:
                            bar.update()
                except BaseException:
                    pool.shutdown(cancel_futures=True)
                    raise
    finally:
        if bar is not None:
            bar.close()
    return [results[n] for n in range(len(shards))]


def _progress_bar(total: int) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="indexing shards", unit="shard")
