"""The path from a shard number to its bytes: which of indextar's files a first read
crosses, traced with ``sys.setprofile``.

:func:`trace_first_read` opens shard ``n`` of an :class:`~indextar.IndexedTarDataset`
(its index and its byte source, as ``ds[i]`` does the first time) and reads the bytes
of its first sample, and records every call into a file of ``indextar/``. A step down
goes from a room to the same or a lower one (``read`` > ``index`` > ``source`` >
``tar`` > the shared modules); a *climb* goes from a lower room back up into a higher
one (a callback, or a record of a higher room asked from below).
``tests/test_shard_path.py`` holds the open of each kind of shard (plain, gzip, zstd;
local or remote) to no climb and at most 8 files.

``python tools/shard_path.py`` prints the traces of a plain, a gzip and a zstd shard,
on disk and over HTTP (a loopback server).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import indextar

PACKAGE = Path(indextar.__file__).resolve().parent
# Higher rooms first: a call from a room to one earlier in this list is a climb.
RANKS = {"read": 4, "index": 3, "source": 2, "tar": 1}


@dataclass(frozen=True, slots=True)
class Trace:
    """The files a traced call crossed, in the order first entered (relative to
    ``indextar/``), and the calls that climbed back up: ``(caller, callee)``."""

    files: tuple[str, ...]
    climbs: tuple[tuple[str, str], ...]
    steps: int

    def describe(self) -> str:
        climbs = "".join(f"\n    climb: {a} -> {b}" for a, b in self.climbs)
        return f"{len(self.files)} files, {self.steps} calls: " + " -> ".join(self.files) + climbs


def rank(file: str) -> int:
    """A file's room's height (0: a shared module)."""
    return RANKS.get(file.partition("/")[0], 0) if "/" in file else 0


def traced(call: Callable[[], Any]) -> tuple[Any, Trace]:
    """``call()`` and the trace of the calls it made into indextar's files."""
    files: dict[str, None] = {}
    climbs: list[tuple[str, str]] = []
    steps = 0
    root = str(PACKAGE) + "/"

    def relative(frame: FrameType | None) -> str | None:
        name = frame.f_code.co_filename if frame is not None else ""
        return name[len(root) :] if name.startswith(root) else None

    def profile(frame: FrameType, event: str, arg: object) -> None:
        nonlocal steps
        if event != "call":
            return
        callee = relative(frame)
        if callee is None:
            return
        steps += 1
        files.setdefault(callee)
        caller = relative(frame.f_back)
        if caller is not None and caller != callee and rank(callee) > rank(caller):
            climbs.append((caller, callee))

    sys.setprofile(profile)
    try:
        result = call()
    finally:
        sys.setprofile(None)
    return result, Trace(tuple(files), tuple(dict.fromkeys(climbs)), steps)


def trace_open(dataset: indextar.IndexedTarDataset, shard_no: int = 0) -> Trace:
    """The trace of opening shard ``shard_no`` of ``dataset`` to its byte source: the
    dataset's own ``_lease``, which ``ds[i]`` calls the first time."""

    def open_it() -> None:
        with dataset._leased(shard_no):
            pass

    return traced(open_it)[1]


def trace_first_read(dataset: indextar.IndexedTarDataset, shard_no: int = 0) -> Trace:
    """The trace of :func:`trace_open` and then reading the shard's first sample."""

    def read_first() -> None:
        with dataset._leased(shard_no) as shard:
            shard.read(0)

    return traced(read_first)[1]


def make_shards(folder: Path) -> list[Path]:
    """A plain, a gzip and a zstd shard in ``folder``, each indexed beside it."""
    import gzip
    import io
    import tarfile

    from indextar.write.recompress import recompress

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        for n in range(20):
            for ext, data in (("txt", b"x" * 300), ("cls", str(n).encode())):
                info = tarfile.TarInfo(f"s{n:03d}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    plain = folder / "plain.tar"
    plain.write_bytes(buf.getvalue())
    gz = folder / "packed.tar.gz"
    gz.write_bytes(gzip.compress(buf.getvalue()))
    zst = folder / "packed.tar.zst"
    recompress(plain, zst, compress="zstd")
    for shard in (plain, gz):
        indextar.build_index(shard)
    return [plain, gz, zst]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.parse_args()
    from loopback_servers import HttpServer

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        shards = make_shards(folder)
        idx = folder / "idx"
        with HttpServer(folder) as server:
            for shard in shards:
                for name, index_dir in ((str(shard), None), (server.url(shard.name), idx)):
                    for label, trace in (("open", trace_open), ("open+read", trace_first_read)):
                        dataset = indextar.IndexedTarDataset([name], index_dir=index_dir)
                        described = trace(dataset).describe()
                        print(f"{name.replace(tmp, '')} {label}: {described}")


if __name__ == "__main__":
    main()
