"""The rewrites ``tools/crash_storm.py`` kills: each puts its old state in place, runs its
rewrite (in a forked child: :func:`run_action`), and tells the old state from the new.

A scenario's folder holds everything it reads and writes; the child is given only the
folder. :meth:`Scenario.check` raises ``AssertionError`` on any file that is neither
old nor new, and on any file but the scenario's own and the writers' hidden
temporary (``.<name>.<hex>.tmp``) and lock (``.<name>.lock``) files.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import re
import shutil
import sqlite3
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from indextar.index.shard import INDEX_SUFFIX as INDEX

__all__ = ["SCENARIOS", "Scenario", "run_action", "warm_up"]

_HIDDEN = re.compile(r"^\.(.+)\.(?:[0-9a-f]{12}\.tmp|lock)$")


def write_tar(path: Path, members: dict[str, bytes]) -> None:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 1_700_000_000
            tf.addfile(info, io.BytesIO(data))


def digest(path: Path) -> str:
    return hashlib.blake2b(path.read_bytes(), digest_size=16).hexdigest()


class Scenario:
    """One rewrite, its old and new states. Use as a context manager (it sets up)."""

    name: ClassVar[str]

    def __init__(self, folder: Path, *, small: bool = False) -> None:
        """``small``: a quarter of the data or less (for the suite)."""
        self.folder = folder
        self.small = small
        folder.mkdir(parents=True, exist_ok=True)

    def __enter__(self) -> Scenario:
        self.setup()
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def setup(self) -> None:
        raise NotImplementedError

    def reset(self, kill: int, run: Callable[[str], object]) -> None:
        """Put the old state back before kill number ``kill`` (``run(name)`` runs an
        action to the end in a child)."""
        raise NotImplementedError

    def own_files(self) -> set[str]:
        """Names of the scenario's files (old or new state) in any of its folders."""
        raise NotImplementedError

    def state(self) -> str:
        """Which state each file is in; raises ``AssertionError`` if neither."""
        raise NotImplementedError

    def folders(self) -> list[Path]:
        return [self.folder]

    def check(self, *, expect: str | None = None) -> str:
        own = self.own_files()
        for folder in self.folders():
            for path in folder.iterdir():
                hidden = _HIDDEN.match(path.name)
                assert path.name in own or (hidden and hidden.group(1) in own), (
                    f"{self.name}: unexpected file after a kill: {path}"
                )
        state = self.state()
        assert expect is None or state == expect, f"{self.name}: {state!r}, not {expect!r}"
        return state

    def writing(self) -> bool:
        """Whether a rewrite's temporary file (or a download's ``.part``) exists."""
        return any(
            path.name.endswith((".tmp", ".part"))
            for folder in self.folders()
            for path in folder.iterdir()
        )

    def remove_temps(self) -> None:
        for folder in self.folders():
            for path in folder.glob(".*.tmp"):
                path.unlink()


def _quiet_main(argv: list[str]) -> int:
    from indextar.cli.commands import main

    with contextlib.redirect_stdout(io.StringIO()):
        return main(argv)


class ImportScenario(Scenario):
    """``indextar meta import`` of a table into 4 indexes that hold another import."""

    name = "import"

    def shards(self) -> list[Path]:
        return [self.folder / f"s{s}.tar" for s in range(4)]

    def setup(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        from indextar import build_index, import_attributes

        samples = 300 if self.small else 1500
        keys = [f"s{s}k{i:05d}" for s in range(4) for i in range(samples)]
        for s, shard in enumerate(self.shards()):
            write_tar(shard, {f"s{s}k{i:05d}.cls": str(i).encode() for i in range(samples)})
            build_index(shard)
        count = len(keys)
        pq.write_table(pa.table({"key": keys, "x": list(range(count))}), self.folder / "old.pq")
        new = {"key": keys, "x": [i * 0.5 for i in range(count)], "y": [str(i) for i in keys]}
        pq.write_table(pa.table(new), self.folder / "new.pq")
        import_attributes(self.shards(), self.folder / "old.pq")
        self.old = [self._attributes(shard) for shard in self.shards()]
        self.old_bytes = [self._index(shard).read_bytes() for shard in self.shards()]
        import_attributes(self.shards(), self.folder / "new.pq")
        self.new = [self._attributes(shard) for shard in self.shards()]
        assert self.old != self.new

    def _index(self, shard: Path) -> Path:
        return shard.with_name(shard.name + INDEX)

    def _attributes(self, shard: Path) -> tuple[Any, ...]:
        from indextar import open_index

        open_index(shard)  # a complete, fresh index, or this raises
        with contextlib.closing(
            sqlite3.connect(f"file:{self._index(shard)}?mode=ro", uri=True)
        ) as c:
            columns = c.execute("SELECT name, type FROM attribute_columns ORDER BY name").fetchall()
            rows = c.execute("SELECT * FROM attributes ORDER BY __sample__").fetchall()
        return tuple(columns), tuple(rows)

    def reset(self, kill: int, run: Callable[[str], object]) -> None:
        for shard, old in zip(self.shards(), self.old_bytes):
            self._index(shard).write_bytes(old)

    def own_files(self) -> set[str]:
        shards = {p.name for p in self.shards()}
        return shards | {name + INDEX for name in shards} | {"old.pq", "new.pq"}

    def state(self) -> str:
        states = []
        for shard, old, new in zip(self.shards(), self.old, self.new):
            got = self._attributes(shard)
            assert got in (old, new), f"import: {shard.name}'s index is neither old nor new"
            states.append("new" if got == new else "old")
        return "new" if set(states) == {"new"} else f"{states.count('new')} of 4 new"


class RecompressScenario(Scenario):
    """``indextar recompress`` of a plain tar over a ``.tar.zst`` (and its index), or
    into a folder without one."""

    name = "recompress"

    def setup(self) -> None:
        from indextar.write.recompress import recompress

        self.counts = {"new": 600, "old": 200} if self.small else {"new": 3000, "old": 800}
        for name, count in (("src.tar", self.counts["new"]), ("old.tar", self.counts["old"])):
            write_tar(
                self.folder / name,
                {
                    f"{name[0]}{i:05d}.{ext}": bytes([i % 251]) * size
                    for i in range(count)
                    for ext, size in (("jpg", 900 + i % 300), ("cls", 3))
                },
            )
        self.target = self.folder / "t.tar.zst"
        recompress(self.folder / "old.tar", self.target, compress="zstd")
        self.digests = {digest(self.target): "old"}
        recompress(self.folder / "src.tar", self.target, compress="zstd")
        self.digests[digest(self.target)] = "new"
        recompress(self.folder / "src.tar", self.target, compress="zstd")
        assert digest(self.target) in self.digests and len(self.digests) == 2, "not repeatable"

    def reset(self, kill: int, run: Callable[[str], object]) -> None:
        from indextar.write.recompress import recompress

        if kill % 2:
            recompress(self.folder / "old.tar", self.target, compress="zstd")
        else:
            self.target.unlink(missing_ok=True)
            self.target.with_name(self.target.name + INDEX).unlink(missing_ok=True)

    def own_files(self) -> set[str]:
        return {"src.tar", "old.tar", "t.tar.zst", "t.tar.zst" + INDEX}

    def state(self) -> str:
        from indextar import open_index
        from indextar.errors import IndextarError
        from indextar.index.verify import verify_index

        shard = "none"
        if self.target.exists():
            shard = self.digests.get(digest(self.target), "")
            assert shard, "recompress: the target is neither the old shard nor the new"
        index = "none"
        if self.target.with_name(self.target.name + INDEX).exists():
            try:
                opened = open_index(self.target)
            except IndextarError as e:  # reads would fail until it was rebuilt by hand
                raise AssertionError(f"recompress: an index beside another shard: {e}") from e
            report = verify_index(self.target)
            assert report.ok, report.problems
            assert len(opened) == self.counts[shard]
            index = shard
        return "new" if (shard, index) == ("new", "new") else f"shard {shard}, index {index}"


class AppendScenario(Scenario):
    """``indextar index --manifest M --append`` of 20 shards to a manifest of 40."""

    name = "append"

    def shards(self) -> list[Path]:
        return [self.folder / f"a{s:03d}.tar" for s in range(self.old_count + self.new_count)]

    def setup(self) -> None:
        from indextar import build_index
        from indextar.index.manifest import append_to_manifest, write_manifest

        self.old_count, self.new_count = (8, 4) if self.small else (40, 20)
        (self.folder / "config.json").write_text(json.dumps([self.old_count, self.new_count]))
        indexes = []
        for s, shard in enumerate(self.shards()):
            write_tar(shard, {f"a{s}k{i}.cls": str(i).encode() for i in range(5)})
            indexes.append(build_index(shard))
        self.manifest = self.folder / "m.json"
        write_manifest(self.manifest, indexes[: self.old_count])
        self.old = self.manifest.read_bytes()
        append_to_manifest(self.manifest, indexes[self.old_count :])
        self.new = self.manifest.read_bytes()

    def reset(self, kill: int, run: Callable[[str], object]) -> None:
        self.manifest.write_bytes(self.old)

    def own_files(self) -> set[str]:
        shards = {p.name for p in self.shards()}
        return shards | {name + INDEX for name in shards} | {"m.json", "config.json"}

    def state(self) -> str:
        from indextar.index.manifest import read_manifest

        got = self.manifest.read_bytes()
        assert got in (self.old, self.new), (
            f"append: the manifest is neither old nor new ({len(got)} bytes, not "
            f"{len(self.old)} or {len(self.new)}): {got[-200:]!r}"
        )
        total = (self.old_count, self.old_count + self.new_count)
        assert len(read_manifest(self.manifest).shards) in total
        return "new" if got == self.new else "old"


class CacheScenario(Scenario):
    """A ``remote="cache"`` read that downloads a 16 MB shard into a cache of 1.5 shards,
    which holds nothing, or another shard it must evict."""

    name = "cache"

    @staticmethod
    def payload(shard: str, i: int, size: int) -> bytes:
        return hashlib.blake2b(f"{shard}{i}".encode()).digest() * (size // 64)

    def setup(self) -> None:
        import sys

        from indextar import IndexedTarDataset

        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from loopback_servers import HttpServer

        served = self.folder / "served"
        served.mkdir(exist_ok=True)
        sample = 125_000 if self.small else 500_000
        for name in ("big.tar", "other.tar"):
            members = {f"k{i:03d}.bin": self.payload(name, i, sample) for i in range(32)}
            write_tar(served / name, members)
        self.server = HttpServer(served).__enter__()
        size = (served / "big.tar").stat().st_size
        self.config = {
            "big": self.server.url("big.tar"),
            "other": self.server.url("other.tar"),
            "limit": size * 3 // 2,
            "sample": sample,
        }
        (self.folder / "config.json").write_text(json.dumps(self.config))
        IndexedTarDataset(
            [self.config["big"], self.config["other"]], index_dir=self.folder / "idx"
        ).close()
        self.digests = {
            digest(served / name): name.split(".")[0] for name in ("big.tar", "other.tar")
        }

    def __exit__(self, *exc: object) -> None:
        self.server.__exit__(*exc)

    def folders(self) -> list[Path]:
        (self.folder / "cache").mkdir(exist_ok=True)
        return [self.folder, self.folder / "cache"]

    def reset(self, kill: int, run: Callable[[str], object]) -> None:
        shutil.rmtree(self.folder / "cache", ignore_errors=True)
        if kill % 2:
            run("cache-other")

    def own_files(self) -> set[str]:
        cache = self.folders()[1]
        cached = {p.name for p in cache.iterdir() if not p.name.startswith(".")}
        for name in cached:  # a shard (checked in state()), its download, its lock
            assert re.fullmatch(r"[0-9a-f]{16}-(big|other)\.tar(\.part|\.lock)?", name), name
        return cached | {"served", "idx", "cache", "config.json", "cache.lock"}

    def state(self) -> str:
        found = []
        for path in sorted((self.folder / "cache").iterdir()):
            if path.name.endswith(".part"):
                found.append("part")
            elif not path.name.startswith(".") and not path.name.endswith(".lock"):
                shard = self.digests.get(digest(path))
                assert shard, f"cache: {path.name} is a complete file of neither shard"
                found.append(shard)
        return "new" if found == ["big"] else " + ".join(sorted(found)) or "empty"


def _read_through_cache(folder: Path, which: str) -> int:
    from indextar import IndexedTarDataset

    config = json.loads((folder / "config.json").read_text())
    url = config[which]
    ds = IndexedTarDataset(
        [url],
        index_dir=folder / "idx",
        remote="cache",
        cache_dir=folder / "cache",
        cache_limit=config["limit"],
    )
    name = url.rpartition("/")[2]
    for i in (0, len(ds) - 1):
        if ds[i]["bin"] != CacheScenario.payload(name, i, config["sample"]):
            return 3  # a wrong byte served
    return 0


def run_action(name: str, folder_name: str) -> int:
    """Run ``name``'s rewrite in ``folder`` (in the forked child); its exit status."""
    folder = Path(folder_name)
    if name == "import":
        shards = [str(folder / f"s{s}.tar") for s in range(4)]
        return _quiet_main(["meta", "import", str(folder / "new.pq"), *shards])
    if name == "recompress":
        return _quiet_main(["recompress", "-q", str(folder / "src.tar"), str(folder / "t.tar.zst")])
    if name == "append":
        old, new_count = json.loads((folder / "config.json").read_text())
        new = [str(folder / f"a{s:03d}.tar") for s in range(old, old + new_count)]
        manifest = str(folder / "m.json")
        return _quiet_main(
            ["index", "-q", "--no-failed-file", "--manifest", manifest, "--append", *new]
        )
    if name in ("cache", "cache-other"):
        return _read_through_cache(folder, "big" if name == "cache" else "other")
    raise ValueError(f"no scenario {name!r}")


def warm_up() -> None:
    """Import what the rewrites use, once, before the server forks."""
    import aiohttp  # noqa: F401
    import filelock  # noqa: F401
    import fsspec.implementations.http  # noqa: F401
    import pyarrow.parquet  # noqa: F401

    import indextar.cli.commands  # noqa: F401
    import indextar.index.attribute_import  # noqa: F401
    import indextar.read.dataset  # noqa: F401
    import indextar.source.cache  # noqa: F401
    import indextar.source.remote  # noqa: F401
    import indextar.write.recompress  # noqa: F401


SCENARIOS: dict[str, type[Scenario]] = {
    s.name: s for s in (ImportScenario, RecompressScenario, AppendScenario, CacheScenario)
}
