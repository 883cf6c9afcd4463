"""decode_threads= (issue 19): a batch decoded in a thread pool is the batch decoded in
order, errors included, in the main process and in fork and spawn DataLoader workers."""

from __future__ import annotations

import pickle
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tar_bytes
from photos import encode, photo
from torch.utils.data import DataLoader

from indextar import DecodeError, IndexedTarDataset, image_decoder
from indextar.read import pool
from indextar.read.pool import BatchPool, resolve_threads


@pytest.fixture(scope="module")
def shard(tmp_path_factory: pytest.TempPathFactory) -> Path:
    members = {}
    for i in range(24):
        members[f"p{i:03d}.jpg"] = encode(photo(160, 120, i))
        members[f"p{i:03d}.cls"] = str(i).encode()
    path = tmp_path_factory.mktemp("pool") / "photos.tar"
    path.write_bytes(tar_bytes(members))
    return path


def dataset(shard: Path, threads: int | str) -> IndexedTarDataset:
    return IndexedTarDataset(
        shard,
        decode=image_decoder("torchrgb8", 48),
        keys=("jpg", "cls"),
        decode_threads=threads,  # type: ignore[arg-type]
    )


def test_map_keeps_order_and_uses_the_threads() -> None:
    seen: set[int] = set()

    def work(i: int) -> int:
        seen.add(threading.get_ident())
        time.sleep(0.002)
        return i * i

    batch = BatchPool(3)
    assert batch.map(work, [(i,) for i in range(20)]) == [i * i for i in range(20)]
    assert len(seen) == 3 and threading.get_ident() in seen  # the caller runs a chunk
    batch.close()
    assert BatchPool(0).map(work, [(2,)]) == [4] and BatchPool(1).threads() == 1


def test_the_first_failure_in_order_raises() -> None:
    def work(i: int) -> int:
        if i in (5, 17):
            raise ValueError(f"item {i}")
        return i

    with pytest.raises(ValueError, match="item 5"):
        BatchPool(2).map(work, [(i,) for i in range(20)])
    with pytest.raises(ValueError, match="item 17"):
        BatchPool(2).map(work, [(i,) for i in range(10, 20)])


def test_auto_leaves_cores_to_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool, "_cpus", lambda: 8)
    monkeypatch.setattr(pool, "_loader_workers", lambda: 1)
    assert resolve_threads("auto") == 8
    monkeypatch.setattr(pool, "_loader_workers", lambda: 3)
    assert resolve_threads("auto") == 2
    monkeypatch.setattr(pool, "_loader_workers", lambda: 8)
    assert resolve_threads("auto") == 1  # as many workers as cores: no pool
    assert resolve_threads(0) == resolve_threads(1) == 1


@pytest.mark.parametrize("bad", [-1, 1.5, "many", None])
def test_bad_settings_are_refused(shard: Path, bad: object) -> None:
    with pytest.raises(ValueError, match="decode_threads="):
        dataset(shard, bad)  # type: ignore[arg-type]


def test_batches_equal_serial_decoding(shard: Path) -> None:
    order = np.random.default_rng(0).permutation(24).tolist()
    serial = dataset(shard, 0).__getitems__(order)
    threaded = dataset(shard, 3)
    for _ in range(2):  # the pool made on the first batch serves the next
        for (a, la), (b, lb) in zip(serial, threaded.__getitems__(order)):
            assert torch.equal(a, b) and la == lb
    threaded.close()


def test_a_decode_error_in_a_thread_names_its_sample(tmp_path: Path) -> None:
    members = {f"p{i}.jpg": encode(photo(64, 48, i)) for i in range(8)}
    members["p6.jpg"] = b"not a jpeg"
    path = tmp_path / "bad.tar"
    path.write_bytes(tar_bytes(members))
    ds = IndexedTarDataset(path, decode=image_decoder(size=16), decode_threads=2)
    with pytest.raises(DecodeError, match=r"sample 'p6', member 'jpg'"):
        ds.__getitems__(list(range(8)))


def test_pickling_drops_the_threads(shard: Path) -> None:
    ds = dataset(shard, 2)
    ds.__getitems__([0, 1, 2, 3])
    clone = pickle.loads(pickle.dumps(ds))
    assert clone._pool._executor is None and clone._pool.setting == 2
    assert [label for _, label in clone.__getitems__([3, 2])] == [3, 2]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers(shard: Path, context: str) -> None:
    ds = dataset(shard, 2)
    expected = {label: image for image, label in dataset(shard, 0).__getitems__(list(range(24)))}
    if context == "fork":
        ds.__getitems__([0, 1, 2])  # the parent's pool exists: children must not use it
    loader = DataLoader(
        ds,
        batch_size=6,
        shuffle=True,
        num_workers=2,
        multiprocessing_context=context,
        timeout=60,
        generator=torch.Generator().manual_seed(0),
    )
    seen = []
    for images, labels in loader:
        for image, label in zip(images, labels.tolist()):
            assert torch.equal(image, expected[label])
            seen.append(label)
    assert sorted(seen) == list(range(24))
    ds.close()


def test_threads_really_run_in_workers(shard: Path) -> None:
    """Each forked worker decodes in its own threads: the handler sees more than the
    workers' main threads."""
    idents = DataLoader(
        IndexedTarDataset(
            shard,
            decode=[lambda key, data: threading.get_ident() if key == ".jpg" else None],
            keys=("jpg",),
            decode_threads=3,
            transform=lambda sample: (time.sleep(0.002), sample)[1],
        ),
        batch_size=12,
        num_workers=1,
        multiprocessing_context="fork",
        timeout=60,
    )
    threads = {int(i) for (batch,) in idents for i in batch}
    assert len(threads) == 3
