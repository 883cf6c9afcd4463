"""Create shards from a folder tree: files that share a key form a sample.

A file's key and extension follow the same rules as members of a shard
(:func:`~indextar.split_name`): ``cat/0001.jpg`` and ``cat/0001.json`` are one
sample with key ``cat/0001``, and ``a/img.v2.png`` has key ``a/img`` and
extension ``v2.png``. Samples are written sorted by key, so the output does not
depend on the order the filesystem lists files in.

Files that cannot be members are counted and skipped, by reason: ``no-extension``
(``README``), ``hidden`` (a name or folder starting with a dot), ``meta``
(``__name__``), ``invalid-key`` (a key a writer would refuse) and, with
``class_from_dir``, ``outside-class-folder``.

Every file's size is known before anything is written, so the samples are split
into shards up front (:func:`~indextar.write.shardwriter.plan_shards`) and the shards are
written in parallel.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import WriterError
from ..index.build import parallel_map
from ..index.manifest import write_manifest
from ..index.naming import skip_reason, split_name
from ..index.shard import PathLike, ShardIndex
from ..tar.header import member_header, padded_size
from .closing import compressor_for
from .sample import check_key
from .shardwriter import plan_shards
from .tarwriter import TarWriter

__all__ = ["TreeSample", "Tree", "CreateResult", "walk_tree", "create_shards"]

CLASS_EXT = "cls"


@dataclass(frozen=True, slots=True)
class TreeSample:
    """One sample found in a folder tree.

    Attributes
    ----------
    key
        Relative path up to the first dot of the file name.
    files
        ``(extension as written, relative path, size)`` of each file, sorted by extension.
    label
        Class number from the sample's top folder (``class_from_dir``), else ``None``.
    nbytes
        Bytes the sample takes in a shard.
    """

    key: str
    files: tuple[tuple[str, str, int], ...]
    label: int | None
    nbytes: int


@dataclass(frozen=True, slots=True)
class Tree:
    """A walked folder tree: its samples sorted by key, and what was skipped."""

    root: Path
    samples: list[TreeSample]
    classes: list[str]
    skipped: dict[str, list[str]]

    @property
    def num_files(self) -> int:
        """Files that are members of samples."""
        return sum(len(s.files) for s in self.samples)


@dataclass(frozen=True, slots=True)
class CreateResult:
    """What :func:`create_shards` wrote, and what it found in the tree."""

    shards: list[ShardIndex]
    samples: int
    files: int
    bytes: int
    classes: list[str]
    skipped: dict[str, list[str]]
    seconds: float


def _walk_files(root: Path) -> Iterator[tuple[str, int]]:
    """``(relative posix path, size)`` of every regular file under ``root`` (symlinks followed)."""
    stack = [(root, "")]
    while stack:
        folder, prefix = stack.pop()
        with os.scandir(folder) as entries:
            for entry in entries:
                rel = prefix + entry.name
                if entry.is_dir():
                    stack.append((Path(entry.path), rel + "/"))
                elif entry.is_file():
                    yield rel, entry.stat().st_size


def _skip_reason(rel: str, class_from_dir: bool) -> str | None:
    if any(part.startswith(".") for part in rel.split("/")):
        return "hidden"
    reason = skip_reason(rel)
    if reason is not None:
        return reason
    if class_from_dir and "/" not in rel:
        return "outside-class-folder"
    key = rel[: rel.find(".", rel.rfind("/") + 1)]
    try:
        check_key(key)
    except WriterError:
        return "invalid-key"
    return None


def walk_tree(root: PathLike, *, class_from_dir: bool = False) -> Tree:
    """Find the samples under ``root``.

    Parameters
    ----------
    root
        The folder to read.
    class_from_dir
        Give each sample a ``cls`` member: the position of its top folder among all
        top folders holding samples, sorted by name (as torchvision's ImageFolder).

    Raises
    ------
    WriterError
        If two files of one sample have the same extension up to case, or a sample
        has a ``cls`` file and ``class_from_dir`` is set.
    """
    root_path = Path(root)
    if not root_path.is_dir():
        raise WriterError(f"{str(root_path)!r} is not a folder")
    groups: dict[str, list[tuple[str, str, int]]] = defaultdict(list)
    skipped: dict[str, list[str]] = defaultdict(list)
    for rel, size in _walk_files(root_path):
        reason = _skip_reason(rel, class_from_dir)
        if reason is not None:
            skipped[reason].append(rel)
            continue
        split = split_name(rel)
        assert split is not None
        key = split[0]
        groups[key].append((rel[len(key) + 1 :], rel, size))
    classes = sorted({key.split("/", 1)[0] for key in groups}) if class_from_dir else []
    class_number = {name: i for i, name in enumerate(classes)}
    samples = []
    for key in sorted(groups):
        files = tuple(sorted(groups[key]))
        lowered = [ext.lower() for ext, _, _ in files]
        if len(set(lowered)) < len(lowered):
            raise WriterError(
                "files "
                + ", ".join(repr(rel) for _, rel, _ in files)
                + " have the same extension up to case; readers would see it twice",
                key=key,
            )
        label = class_number[key.split("/", 1)[0]] if class_from_dir else None
        members = [(key + "." + ext, size) for ext, _, size in files]
        if label is not None:
            if CLASS_EXT in lowered:
                raise WriterError(
                    f"sample has a {CLASS_EXT!r} file and class_from_dir would add another",
                    key=key,
                )
            members.append((f"{key}.{CLASS_EXT}", len(str(label))))
        nbytes = sum(len(member_header(name, size)) + padded_size(size) for name, size in members)
        samples.append(TreeSample(key=key, files=files, label=label, nbytes=nbytes))
    return Tree(
        root=root_path,
        samples=samples,
        classes=classes,
        skipped={reason: sorted(paths) for reason, paths in sorted(skipped.items())},
    )


def write_tree_shard(
    shard: tuple[str, list[TreeSample]], root: Path, compress: str | None = None
) -> ShardIndex:
    """Write the shard ``(path, samples)`` of tree samples, read from ``root``; return its index."""
    path, samples = shard
    with TarWriter(path, encoder=False, compress=compress) as writer:
        for sample in samples:
            record: dict[str, object] = {"__key__": sample.key}
            for ext, rel, _ in sample.files:
                record[ext] = (root / rel).read_bytes()
            if sample.label is not None:
                record[CLASS_EXT] = str(sample.label).encode("ascii")
            writer.write(record)
    assert writer.index is not None
    return writer.index


def create_shards(
    root: PathLike,
    pattern: str,
    *,
    maxcount: int = 100_000,
    maxsize: float = 3e9,
    start_shard: int = 0,
    class_from_dir: bool = False,
    jobs: int = 1,
    manifest: PathLike | None = None,
    progress: Callable[[ShardIndex, int], None] | None = None,
    compress: str | None = None,
) -> CreateResult:
    """Write the samples of the folder tree ``root`` to indexed shards named by ``pattern``.

    Parameters
    ----------
    root, class_from_dir
        As for :func:`walk_tree`.
    pattern, maxcount, maxsize, start_shard, manifest, compress
        As for :class:`~indextar.ShardWriter`; the shards are the ones it would write.
    jobs
        Shards written in parallel by this many processes.
    progress
        Called with each shard's index, and the number of shards planned, as each
        shard is finished.
    """
    began = time.perf_counter()
    compressor_for(compress)  # an unknown codec fails before any work
    tree = walk_tree(root, class_from_dir=class_from_dir)
    plan = plan_shards([s.nbytes for s in tree.samples], maxcount=maxcount, maxsize=maxsize)
    try:
        names = [pattern % (start_shard + i) for i in range(max(2, len(plan)))]
    except (TypeError, ValueError) as e:
        raise WriterError(
            f"shard pattern {pattern!r} needs one %-format, such as 'out-%06d.tar' ({e})"
        ) from None
    if len(set(names)) < len(names):
        raise WriterError(f"shard pattern {pattern!r} gives the same name for several shards")
    shards = [(names[i], tree.samples[r.start : r.stop]) for i, r in enumerate(plan)]
    indexes: list[ShardIndex] = []
    # max(1, jobs): parallel_map reads workers=0 as "the default", create_shards as one.
    args = (tree.root, compress)
    for index in parallel_map(write_tree_shard, shards, args, workers=max(1, jobs)):
        indexes.append(index)
        if progress is not None:
            progress(index, len(shards))
    if manifest is not None:
        write_manifest(manifest, indexes)
    return CreateResult(
        shards=indexes,
        samples=len(tree.samples),
        files=tree.num_files,
        bytes=sum(ix.meta.shard_size for ix in indexes),
        classes=tree.classes,
        skipped=tree.skipped,
        seconds=time.perf_counter() - began,
    )
