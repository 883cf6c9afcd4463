"""Reference readers and test data shared by tests of several rooms.

webdataset's own reader (the reference for keys and samples), samples read back
through an index, a tar's members by tarfile, and a folder tree for ``create``.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

from indexrows import load_samples
from webdataset.tariterators import group_by_keys, tar_file_expander

from indextar import build_index

Sample = dict[str, Any]


TREE = {
    "cat/0001.jpg": b"cat-1-jpg",
    "cat/0001.json": b'{"n": 1}',
    "cat/0002.jpg": b"cat-2-jpg" * 100,
    "dog/deep/er/0003.jpg": b"dog-3",
    "dog/deep/er/0003.seg.png": b"dog-3-seg",  # dots: key dog/deep/er/0003, ext seg.png
    "dog/img.v2.JPG": b"dog-v2",  # key dog/img, extension v2.JPG
    "dog/README": b"no extension",
    "dog/.DS_Store": b"hidden",
    ".git/objects/ab.jpg": b"in a hidden folder",
}


def make_tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def wds_read(paths: list[str], *decode: str) -> list[Sample]:
    """Samples as webdataset's streaming reader yields them (:func:`wds_samples` of each
    file, then its decoder)."""
    from webdataset import autodecode

    found = [sample for path in paths for sample in wds_samples(Path(path).read_bytes())]
    if decode:
        found = [autodecode.Decoder([autodecode.imagehandler(d) for d in decode])(s) for s in found]
    return found


def tar_members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tf:
        return {m.name: tf.extractfile(m).read() for m in tf.getmembers()}  # type: ignore[union-attr]


def wds_samples(buf: bytes) -> list[Sample]:
    """Samples as webdataset's ``tar_file_expander`` + ``group_by_keys`` yield them."""
    files = tar_file_expander([{"url": "shard.tar", "stream": io.BytesIO(buf)}])
    return [{k: v for k, v in s.items() if k != "__url__"} for s in group_by_keys(files)]


def indexed_samples(path: Path) -> list[Sample]:
    """The same samples read back through the built index."""
    index = build_index(path)
    table = load_samples(index)
    buf = path.read_bytes()
    samples: list[Sample] = []
    for key, first, count in zip(
        index.keys(), table.first_member.tolist(), table.member_count.tolist()
    ):
        sample: Sample = {"__key__": key}
        for m in range(first, first + count):
            ext = table.ext_names[table.member_ext_code[m]]
            start = int(table.member_data_offset[m])
            sample[ext] = buf[start : start + int(table.member_size[m])]
        samples.append(sample)
    return samples
