"""The path from a shard number to its byte source, traced on a real open
(``tools/shard_path.py``, ``sys.setprofile``): which of indextar's files
``IndexedTarDataset`` crosses to open a shard, local or over HTTP, plain, gzip or zstd.

No call climbs back up from a lower room into a higher one, and every shard's open
crosses at most 8 files: a plain one's 7, a compressed one's also its decompressing
source (``source/frames.py``, ``source/gzipped.py``, which looks up its C extension at
the first read, not at open), its frames or seek points read beside its arrays
(``index/arrays.py``). A new layer on the way shows here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from shard_path import make_shards, trace_open

import indextar

FILES = {"plain.tar": 8, "packed.tar.zst": 8, "packed.tar.gz": 8}


@pytest.fixture(scope="module")
def http_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("paths")
    make_shards(folder)
    return folder


@pytest.mark.parametrize("name", sorted(FILES))
@pytest.mark.parametrize("remote", [False, True], ids=["local", "http"])
def test_a_shard_number_reaches_its_bytes_through_few_files_and_no_climb(
    http_root: Path, http: object, name: str, remote: bool, tmp_path: Path
) -> None:
    shard = http.url(name) if remote else str(http_root / name)  # type: ignore[attr-defined]
    dataset = indextar.IndexedTarDataset([shard], index_dir=tmp_path if remote else None)
    trace = trace_open(dataset)
    assert trace.files[0] == "read/dataset.py", trace.describe()
    assert trace.climbs == (), trace.describe()
    assert len(trace.files) <= FILES[name], trace.describe()
    assert dataset[0]["__key__"] == "s000"  # the source it opened reads
