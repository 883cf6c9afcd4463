"""One options bundle from the CLI through build_indexes, the jobs and build_index."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import sample_members, tar_bytes

from indextar import build_indexes
from indextar.index.options import BuildOptions


def _rebuilt(path: Path) -> bool:
    """Whether the index at ``path`` was written since :func:`_mark` (a rebuild is a
    new file, renamed into place: the mark goes)."""
    return os.stat(path).st_mtime_ns != 0


def _mark(path: Path) -> None:
    os.utime(path, ns=(0, 0))


def test_build_indexes_takes_force_and_the_options_bundle(tmp_path: Path) -> None:
    shard = tmp_path / "a.tar"
    shard.write_bytes(tar_bytes(sample_members(3, ("txt",))))
    (first,) = build_indexes([str(shard)], workers=1)
    _mark(first.path)
    (reused,) = build_indexes([str(shard)], workers=1)
    assert not _rebuilt(reused.path)  # a valid index is kept
    (forced,) = build_indexes([str(shard)], workers=1, force=True)
    assert _rebuilt(forced.path)
    _mark(forced.path)
    (bundled,) = build_indexes([str(shard)], workers=1, options=BuildOptions(force=True))
    assert _rebuilt(bundled.path) and bundled.meta.num_samples == 3
    with pytest.raises(TypeError, match="not both"):
        build_indexes([str(shard)], workers=1, force=True, options=BuildOptions())
