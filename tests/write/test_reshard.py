"""indextar.write.reshard: byte-span copies into new shards."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from indexrows import assert_index_matches_scan
from readers import tar_members, wds_read

from indextar.errors import WriterError
from indextar.write.reshard import reshard
from indextar.write.shardwriter import ShardWriter


@pytest.fixture
def sources(tmp_path: Path) -> list[str]:
    rng = np.random.default_rng(7)
    with ShardWriter(str(tmp_path / "src-%02d.tar"), maxcount=13) as sink:
        for i in range(50):
            sink.write(
                {
                    "__key__": f"k{i:03d}",
                    "bin": rng.bytes(int(rng.integers(0, 3000))),
                    "cls": i % 5,
                }
            )
    return sink.shards


def multiset(paths: list[str]) -> Counter[tuple[tuple[str, object], ...]]:
    return Counter(tuple(sorted(s.items())) for s in wds_read(paths))


@pytest.mark.parametrize("shuffle", [False, True])
def test_reshard_preserves_the_samples(tmp_path: Path, sources: list[str], shuffle: bool) -> None:
    out = tmp_path / "out"
    out.mkdir()
    result = reshard(sources, str(out / "r-%d.tar"), maxcount=20, shuffle=shuffle, seed=3)
    assert result.samples == 50 and len(result.shards) == 3
    assert multiset(result.shards) == multiset(sources)
    keys = [s["__key__"] for s in wds_read(result.shards)]
    assert (keys == sorted(keys)) is not shuffle
    for shard in result.shards:
        assert_index_matches_scan(Path(shard), Path(shard + ".idx.sqlite"), tmp_path / "ref")
    assert result.bytes == sum(Path(s).stat().st_size - 1024 for s in result.shards)


def test_shuffle_is_seeded(tmp_path: Path, sources: list[str]) -> None:
    def order(seed: int, name: str) -> list[object]:
        result = reshard(sources, str(tmp_path / f"{name}-%d.tar"), shuffle=True, seed=seed)
        return [s["__key__"] for s in wds_read(result.shards)]

    assert order(1, "a") == order(1, "b") != order(2, "c")


def test_reshard_honours_maxsize(tmp_path: Path, sources: list[str]) -> None:
    result = reshard(sources, str(tmp_path / "m-%02d.tar"), maxsize=10_000)
    assert len(result.shards) > 5
    assert all(Path(s).stat().st_size <= 10_000 for s in result.shards)
    assert multiset(result.shards) == multiset(sources)


def test_members_separated_by_other_entries(make_tar, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # A directory entry between two members of one sample: only the members are copied.
    shard = make_tar({"a.jpg": b"1" * 600, "dir": None, "a.txt": b"2", "b.txt": b"3"})
    result = reshard([shard], str(tmp_path / "o-%d.tar"))
    assert tar_members(Path(result.shards[0])) == {
        "a.jpg": b"1" * 600,
        "a.txt": b"2",
        "b.txt": b"3",
    }
    assert_index_matches_scan(
        Path(result.shards[0]), Path(result.shards[0] + ".idx.sqlite"), tmp_path / "ref"
    )


def test_duplicate_keys_across_sources_are_refused(tmp_path: Path, sources: list[str]) -> None:
    with pytest.raises(WriterError, match="duplicate key.*src-00.tar"):
        reshard([sources[0], sources[0]], str(tmp_path / "d-%d.tar"))
    assert not list(tmp_path.glob("d-*"))
