"""``write_sidecar``: a function of every sample written as shards keyed like the
source, in parallel workers; deterministic, and resumed after a real ``kill -9``."""

from __future__ import annotations

import hashlib
import io
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import indextar

HERE = Path(__file__).resolve().parent
SIZES = (9, 4, 12)


def embed(sample: dict[str, Any]) -> dict[str, Any] | None:
    """32 floats of the sample's jpg bytes; none for a key ending in 5; a kill -9 of
    this process at the key in ``$SIDECAR_KILL_AT``."""
    key = sample["__key__"]
    if os.environ.get("SIDECAR_KILL_AT") == key:
        os.kill(os.getpid(), signal.SIGKILL)
    if key.endswith("5"):
        return None
    digest = hashlib.blake2b(sample["jpg"], digest_size=32).digest()
    return {
        "npy": np.frombuffer(digest, np.uint8).astype(np.float32) / 255,
        "txt": f"caption of {key}",
    }


def embed_batch(samples: list[dict[str, Any]]) -> list[dict[str, Any] | None]:
    return [embed(sample) for sample in samples]


@pytest.fixture
def source(make_tar: Callable[..., Path]) -> list[str]:
    """Three shards of 9, 4 and 12 samples written by tarfile."""
    shards, number = [], 0
    for n, size in enumerate(SIZES):
        members = {}
        for _ in range(size):
            members[f"k{number:04d}.jpg"] = f"image {number}".encode() * (1 + number % 3)
            members[f"k{number:04d}.cls"] = str(number % 7).encode()
            number += 1
        shards.append(str(make_tar(members, name=f"images-{n}.tar")))
    return shards


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.tar"))}


def test_a_sidecar_joins_back_to_its_source(source: list[str], tmp_path: Path) -> None:
    ds = indextar.IndexedTarDataset(source)
    written = indextar.write_sidecar(ds, embed, str(tmp_path / "clip" / "clip-%02d.tar"), workers=2)
    assert [s.samples for s in written] == [8, 4, 11]  # k0005, k0015, k0025 have none
    assert not any(s.resumed for s in written)
    clip = indextar.IndexedTarDataset([s.path for s in written], build_missing=False)
    joined = ds.join(clip, how="left", cache_dir=False)
    assert len(joined) == sum(SIZES)
    for i in range(len(joined)):
        sample = joined[i]
        want = embed(ds[i])
        if want is None:
            assert "npy" not in sample
        else:
            assert np.array_equal(np.load(io.BytesIO(sample["npy"])), want["npy"])
            assert sample["txt"] == want["txt"].encode()


def test_the_output_is_the_same_bytes_however_it_is_written(
    source: list[str], tmp_path: Path
) -> None:
    ds = indextar.IndexedTarDataset(source)
    indextar.write_sidecar(ds, embed, str(tmp_path / "a" / "c-%d.tar"), workers=2)
    indextar.write_sidecar(
        ds, embed_batch, str(tmp_path / "b" / "c-%d.tar"), workers=0, batched=True, batch_size=5
    )
    a, b = _files(tmp_path / "a"), _files(tmp_path / "b")
    assert len(a) == 3 and a == b


def test_a_killed_run_resumes_to_the_same_bytes(source: list[str], tmp_path: Path) -> None:
    ds = indextar.IndexedTarDataset(source)
    reference = tmp_path / "reference"
    indextar.write_sidecar(ds, embed, str(reference / "c-%d.tar"), workers=0)
    pattern = str(tmp_path / "run" / "c-%d.tar")
    script = (
        f"import sys; sys.path.insert(0, {str(HERE)!r})\n"
        "import indextar\nfrom test_sidecar import embed\n"
        f"ds = indextar.IndexedTarDataset({source!r})\n"
        f"indextar.write_sidecar(ds, embed, {pattern!r}, workers=0, batch_size=2)\n"
    )
    env = {**os.environ, "SIDECAR_KILL_AT": "k0020"}  # in the third shard
    killed = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    run = tmp_path / "run"
    assert sorted(p.name for p in run.glob("*.tar")) == ["c-0.tar", "c-1.tar"]
    leftovers = [p.name for p in run.iterdir() if not p.name.startswith("c-")]
    assert leftovers  # the third shard's hidden temporary file, never renamed
    resumed = indextar.write_sidecar(ds, embed, pattern, workers=2)
    assert [s.resumed for s in resumed] == [True, True, False]
    assert _files(run) == _files(reference)


def test_a_bad_pattern_or_result_is_refused(source: list[str], tmp_path: Path) -> None:
    ds = indextar.IndexedTarDataset(source)
    with pytest.raises(indextar.WriterError, match="%-format"):
        indextar.write_sidecar(ds, embed, str(tmp_path / "c.tar"))
    with pytest.raises(indextar.WriterError, match="2 results for a batch of 3"):
        indextar.write_sidecar(
            ds, lambda batch: [{}, {}], str(tmp_path / "c-%d.tar"), workers=0, batched=True,
            batch_size=3,
        )  # fmt: skip
