"""The project's benchmarks: ``python tools/bench.py [index|sampler|dataset|...|all]``.

Options: ``--quick`` (tiny sizes, a smoke run), ``--data-dir DIR`` (where generated
shards are cached; default ``bench-data/`` in the repository) and ``--json``
(machine-readable results on stdout instead of Markdown).

``index`` measures index build throughput, in one run on the same generated shards,
for indextar (whole ``build_index``, the scan alone and the scan with grouping),
``tarfile``, ratarmountcore's
``SQLiteIndexedTar``, a bare pure-Python header walk (the floor a Python indexer must
beat) and GNU ``tar tf`` (for reference). ``sampler`` runs ``tools/bench_sampler.py``;
``dataset`` runs ``tools/bench_dataset.py`` when it exists; ``decode`` runs
``tools/bench_decode.py`` (images at training size); ``meta`` runs ``tools/bench_meta.py``
(per-sample attributes: building, ``where`` selections, against filtering in a webdataset
loop); ``scale`` runs ``tools/bench_scale.py`` (10k and 100k shards, a Dask cluster,
remote shards scanned as they stream); ``compressed`` runs ``tools/bench_compressed.py``
(per-sample gzip and zstd shards next to plain ones, a foreign ``.tar.gz`` against
ratarmountcore); ``checksums`` runs ``tools/bench_checksums.py`` (what per-sample
checksums cost a read and a build); ``convert`` runs ``tools/bench_convert.py``
(``indextar convert`` from parquet with image bytes, against webdataset's
``ShardWriter`` fed row by row, img2dataset-style); ``grain`` runs
``tools/bench_grain.py`` (per-record reads against ArrayRecord); ``ray`` runs
``tools/bench_ray.py`` (rows/s against ``ray.data.read_webdataset``, with and without
a ``where``); ``join`` runs ``tools/bench_join.py`` (joins by key: planning from cold
indexes, the cached open, joined reads, sidecar writing). Each ``tools/bench_*.py``
module offers ``run(report=print)``, optionally with a ``quick`` keyword.

Targets are printed as PASS/FAIL lines and never asserted: timings belong here, not in
the tests.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import inspect
import io
import json
import logging
import mmap
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import ratarmountcore
from procstats import bytes_read
from ratarmountcore.mountsource.formats.tar import SQLiteIndexedTar

from indextar import __version__, build_index
from indextar.index.naming import group_members
from indextar.tar.scan import scan_tar

REPO = Path(__file__).resolve().parent.parent
TOOLS_DIR = Path(__file__).resolve().parent
BLOCK = 512
MIN_REPEATS, MAX_REPEATS, MIN_SECONDS = 3, 10, 2.0
SEED = 20240229
MTIME = 1_700_000_000
# Bump when the way shards are generated changes, so cached shards are rebuilt.
GENERATOR_VERSION = 1
# Data sets with members this large also measure how much of the shard the scan reads.
LARGE_MEMBER_BYTES = 64 * 1024

Report = Callable[[str], None]


# -- generated data -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DataSet:
    """A deterministic shard: ``samples`` samples, one member per extension."""

    label: str
    samples: int
    exts: tuple[str, ...]
    member_bytes: int

    @property
    def members(self) -> int:
        return self.samples * len(self.exts)

    @property
    def file_name(self) -> str:
        exts = "-".join(self.exts)
        return f"{self.label}-{self.samples}x{exts}-{self.member_bytes}B-v{GENERATOR_VERSION}.tar"


DATA_SETS = (
    DataSet("tiny", 100_000, ("cls", "txt"), 100),
    DataSet("large", 2_000, ("bin",), 256 * 1024),
)
QUICK_DATA_SETS = (
    DataSet("tiny", 500, ("cls", "txt"), 100),
    DataSet("large", 8, ("bin",), 256 * 1024),
)


def ensure_shard(data_set: DataSet, data_dir: Path, report: Report) -> Path:
    """The cached shard for ``data_set``, generated on first use."""
    path = data_dir / data_set.file_name
    if path.exists():
        return path
    report(f"generating {path} ...")
    data_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    rng = np.random.default_rng(SEED)
    # tarfile's default (PAX) format with a whole-second mtime: plain ustar headers for
    # these short ASCII names. (webdataset's TarWriter sets a fractional mtime, so each
    # of its members gets a PAX header too: the dataset and compressed sections' shards.)
    with tarfile.open(tmp, "w") as tar:
        for i in range(data_set.samples):
            for ext in data_set.exts:
                info = tarfile.TarInfo(f"sample{i:07d}.{ext}")
                info.size = data_set.member_bytes
                info.mtime = MTIME
                info.uname = info.gname = "bench"
                tar.addfile(info, io.BytesIO(rng.bytes(data_set.member_bytes)))
    os.replace(tmp, path)
    return path


def warm_page_cache(path: Path) -> None:
    """Read the whole file once, so that every tool starts from a warm page cache."""
    with open(path, "rb") as f:
        while f.read(8 << 20):
            pass


# -- the tools measured: each indexes or lists ``shard`` and returns its member count --


def indextar_build(shard: Path, scratch: Path) -> int:
    """The whole ``build_index``: scan, grouping, fingerprint and the SQLite write."""
    return build_index(shard, index_dir=scratch, force=True).meta.num_members


def indextar_scan(shard: Path, scratch: Path) -> int:
    """indextar's tar scanner alone (issue 2's "scan"): every header checked, names decoded.

    As ``build_index`` calls it: the shard mapped, headers read with pread (``fd=``).
    """
    with open(shard, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        return len(scan_tar(mm, shard=str(shard), fd=f.fileno()).names)


def indextar_scan_grouped(shard: Path, scratch: Path) -> int:
    """The scanner plus the naming rules (samples grouped), still without SQLite."""
    with open(shard, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        return len(group_members(scan_tar(mm, shard=str(shard), fd=f.fileno())).entries)


def tarfile_getmembers(shard: Path, scratch: Path) -> int:
    with tarfile.open(shard, "r:") as tar:
        return len(tar.getmembers())


def ratarmount_index(shard: Path, scratch: Path) -> int:
    """ratarmountcore's ``SQLiteIndexedTar`` building a new index file in ``scratch``."""
    # Its "Writing out TAR index to ..." line is printed only when warnings are enabled;
    # its progress lines ("Position ... of ...") always are, on stdout.
    logging.getLogger("ratarmountcore").setLevel(logging.ERROR)
    index_file = scratch / "ratarmount.index.sqlite"
    with contextlib.redirect_stdout(io.StringIO()):
        archive = SQLiteIndexedTar(str(shard), indexFilePath=str(index_file), writeIndex=True)
    with archive:
        if not index_file.exists():
            raise RuntimeError(f"ratarmountcore wrote no index at {index_file}")
        (count,) = (
            archive.index.get_connection()
            .execute('SELECT COUNT(*) FROM "files" WHERE (mode & 0xF000) == 0x8000')
            .fetchone()
        )
    return int(count)


def header_walk(shard: Path, scratch: Path) -> int:
    """The floor: read each 512-byte header, parse its octal size, jump over the data.

    No checksums and no checks of any kind; stops at the first header whose name is
    empty (the end marker).
    """
    count = 0
    with open(shard, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        pos, end = 0, len(mm) - BLOCK
        while pos <= end:
            header = mm[pos : pos + BLOCK]
            if header[0] == 0:
                break
            size = int(header[124:136].strip(b"\0 "), 8)
            pos += BLOCK + (size + BLOCK - 1) // BLOCK * BLOCK
            count += 1
    return count


def gnu_tar_list(shard: Path, scratch: Path) -> None:
    subprocess.run(["tar", "tf", str(shard)], stdout=subprocess.DEVNULL, check=True)


BUILD = "indextar build_index"
SCAN = "indextar scan only"
GROUPED = "indextar scan + grouping"
FLOOR = "bare header walk (floor)"
TOOLS: dict[str, Callable[[Path, Path], int | None]] = {
    BUILD: indextar_build,
    SCAN: indextar_scan,
    GROUPED: indextar_scan_grouped,
    "tarfile getmembers": tarfile_getmembers,
    "ratarmountcore SQLiteIndexedTar": ratarmount_index,
    FLOOR: header_walk,
    "GNU tar tf": gnu_tar_list,
}


# -- timing -------------------------------------------------------------------------


@dataclass(slots=True)
class Result:
    tool: str
    seconds: list[float]
    members: int
    file_bytes: int

    @property
    def best(self) -> float:
        return min(self.seconds)

    @property
    def members_per_s(self) -> float:
        return self.members / self.best

    @property
    def mb_per_s(self) -> float:
        return self.file_bytes / 1e6 / self.best


def time_once(
    tool: Callable[[Path, Path], int | None], shard: Path, scratch_root: Path
) -> tuple[float, int | None]:
    """Run ``tool`` once in a fresh, empty scratch folder; return seconds and its count."""
    scratch = Path(tempfile.mkdtemp(prefix="scratch-", dir=scratch_root))
    try:
        gc.collect()
        started = time.perf_counter()
        count = tool(shard, scratch)
        return time.perf_counter() - started, count
    finally:
        shutil.rmtree(scratch)


def measure_tools(
    data_set: DataSet, shard: Path, *, min_seconds: float, report: Report
) -> list[Result]:
    """Time every tool, round-robin so that machine noise is shared between them.

    At least ``MIN_REPEATS`` rounds, more (up to ``MAX_REPEATS``) while the rounds so
    far took under ``min_seconds``: fast measurements get more tries.
    """
    results = {name: Result(name, [], data_set.members, shard.stat().st_size) for name in TOOLS}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-", dir=shard.parent) as scratch_root:
        for repeat in range(MAX_REPEATS):
            if repeat >= MIN_REPEATS and time.perf_counter() - started >= min_seconds:
                break
            for name, tool in TOOLS.items():
                seconds, count = time_once(tool, shard, Path(scratch_root))
                if count is not None and count != data_set.members:
                    raise RuntimeError(
                        f"{name} saw {count} members in {shard}; expected {data_set.members}"
                    )
                results[name].seconds.append(seconds)
                report(f"  {data_set.label} #{repeat + 1} {name}: {seconds:.3f} s")
    return list(results.values())


def bytes_touched_by_scan(shard: Path) -> int | None:
    """Bytes of ``shard`` that indextar's scan reads, as ``build_index`` scans it.

    The shard is mapped and its headers read with pread. Bytes read are the kernel's
    count of bytes returned by read calls (``rchar``), and bytes touched through the map
    are its major page faults after the file is dropped from the page cache, with
    read-ahead off (``MADV_RANDOM``): one 4 KiB page each. Returns ``None`` where
    ``/proc/self/io`` is missing.
    """
    if not Path("/proc/self/io").exists():
        return None
    with open(shard, "rb") as f:
        os.fsync(f.fileno())  # dirty pages (a freshly generated shard) cannot be dropped
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            mm.madvise(mmap.MADV_RANDOM)
            faults, read = resource.getrusage(resource.RUSAGE_SELF).ru_majflt, bytes_read()
            group_members(scan_tar(mm, shard=str(shard), fd=f.fileno()))
            read = bytes_read() - read
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_majflt - faults
    return read + faults * mmap.PAGESIZE


# -- the index benchmark --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    passed: bool
    detail: str


def index_targets(data_set: DataSet, results: list[Result], touched: int | None) -> list[Target]:
    rate = {r.tool: r.members_per_s for r in results}
    build, scan, floor = rate[BUILD], rate[SCAN], rate[FLOOR]
    targets = [
        Target(
            f"{data_set.label}: scan only >= bare header walk",
            scan >= floor,
            f"{scan / floor:.2f}x the floor",
        ),
    ]
    for other in ("ratarmountcore SQLiteIndexedTar", "tarfile getmembers"):
        ratio = build / rate[other]
        targets.append(
            Target(
                f"{data_set.label}: build_index >= 10x {other}",
                ratio >= 10,
                f"{ratio:.1f}x; the bare header walk is {floor / rate[other]:.1f}x",
            )
        )
    if data_set.member_bytes >= LARGE_MEMBER_BYTES:
        # Reading only the headers touches one page per member, plus a few.
        header_pages = data_set.members * mmap.PAGESIZE
        passed = touched is not None and touched <= 2 * header_pages
        detail = (
            "not measurable (no /proc/self/io)"
            if touched is None
            else f"{_size(touched)} touched of {_size(results[0].file_bytes)}; "
            f"one {mmap.PAGESIZE}-byte page per header would be {_size(header_pages)}"
        )
        targets.append(Target(f"{data_set.label}: scan reads only the headers", passed, detail))
    return targets


def _size(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB" if n >= 2**20 else f"{n / 2**10:,.0f} KiB"


def report_index_table(
    data_set: DataSet, shard: Path, results: list[Result], report: Report
) -> None:
    rate = {r.tool: r.members_per_s for r in results}
    size = results[0].file_bytes
    report(
        f"### {data_set.label}: {data_set.members:,} members of {data_set.member_bytes:,} bytes "
        f"({data_set.samples:,} samples x {{{', '.join(data_set.exts)}}}), "
        f"{size / 1e6:,.1f} MB (`{shard.name}`)"
    )
    report("")
    report(
        f"| tool | members/s | MB/s | seconds (best of {len(results[0].seconds)}) "
        "| speed vs indextar build | speed vs header walk |"
    )
    report("|---|---:|---:|---:|---:|---:|")
    for r in results:
        report(
            f"| {r.tool} | {r.members_per_s:,.0f} | {r.mb_per_s:,.1f} | {r.best:.3f} "
            f"| {r.members_per_s / rate[BUILD]:.2f}x | {r.members_per_s / rate[FLOOR]:.2f}x |"
        )
    report("")


def indextar_revision() -> str:
    """indextar's version and git commit, marked when indextar/ has uncommitted changes."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return __version__
    modified = (
        ", indextar/ modified"
        if git("status", "--porcelain", "--untracked-files=no", "--", "indextar")
        else ""
    )
    return f"{__version__} (commit {commit}{modified})"


def machine() -> dict[str, str]:
    cpu = "unknown"
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    tar_version = subprocess.run(["tar", "--version"], capture_output=True, text=True).stdout
    return {
        "indextar": indextar_revision(),
        "cpus": str(len(os.sched_getaffinity(0))),
        "cpu": cpu,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "ratarmountcore": ratarmountcore.__version__,
        "tar": tar_version.splitlines()[0] if tar_version else "unknown",
    }


def run_index(*, quick: bool, data_dir: Path, report: Report, log: Report) -> dict[str, Any]:
    info = machine()
    report("## Index build")
    report("")
    report(", ".join(f"{k}: {v}" for k, v in info.items()))
    report("")
    data_sets = QUICK_DATA_SETS if quick else DATA_SETS
    out: dict[str, Any] = {"machine": info, "data_sets": [], "targets": []}
    targets: list[Target] = []
    for data_set in data_sets:
        shard = ensure_shard(data_set, data_dir, log)
        warm_page_cache(shard)
        results = measure_tools(
            data_set, shard, min_seconds=0 if quick else MIN_SECONDS, report=log
        )
        touched = (
            bytes_touched_by_scan(shard) if data_set.member_bytes >= LARGE_MEMBER_BYTES else None
        )
        report_index_table(data_set, shard, results, report)
        targets += index_targets(data_set, results, touched)
        out["data_sets"].append(
            {
                **asdict(data_set),
                "shard": str(shard),
                "bytes": results[0].file_bytes,
                "members": data_set.members,
                "touched_bytes": touched,
                "results": [
                    {
                        "tool": r.tool,
                        "seconds": r.seconds,
                        "best_seconds": r.best,
                        "median_seconds": statistics.median(r.seconds),
                        "members_per_s": r.members_per_s,
                        "mb_per_s": r.mb_per_s,
                    }
                    for r in results
                ],
            }
        )
    out["load_average"] = os.getloadavg()[0]
    report(
        f"Load average (1 min) at the end: {out['load_average']:.1f} on {info['cpus']} CPUs "
        "(this benchmark alone accounts for about 1)."
    )
    report("")
    report("Targets:")
    report("")
    for target in targets:
        report(f"- {'PASS' if target.passed else 'FAIL'}: {target.name} ({target.detail})")
    report("")
    out["targets"] = [asdict(t) for t in targets]
    return out


# -- the other benchmarks -------------------------------------------------------------


def run_module(name: str, *, quick: bool, report: Report) -> Any:
    """Run the benchmark in ``tools/<name>.py``; ``None`` when it has no results to return.

    A module with ``run(report=print)`` (and optionally ``quick=``) is called in this
    process; otherwise the script runs on its own, with its default arguments.
    """
    script = TOOLS_DIR / f"{name}.py"
    if not script.exists():
        report(f"tools/{name}.py is not there yet; skipped.")
        report("")
        return None
    if str(TOOLS_DIR) not in sys.path:
        sys.path.insert(0, str(TOOLS_DIR))
    module = importlib.import_module(name)
    if hasattr(module, "run"):
        kwargs: dict[str, Any] = {"report": report}
        if "quick" in inspect.signature(module.run).parameters:
            kwargs["quick"] = quick
        elif quick and hasattr(module, "SIZES"):
            # bench_sampler has no quick mode; its smallest size is a smoke run.
            module.SIZES = module.SIZES[:1]
        return module.run(**kwargs)
    if quick:
        report(f"tools/{name}.py has no quick mode; skipped (run it directly).")
        report("")
        return None
    done = subprocess.run(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, check=True
    )
    for line in done.stdout.splitlines():
        report(line)
    return None


#: The benchmarks after ``index``, in the order ``all`` runs them: each runs
#: ``tools/bench_<name>.py`` under its Markdown heading.
SECTIONS = {
    "sampler": "Sampler",
    "dataset": "Dataset",
    "writer": "Writing and resharding",
    "remote": "Remote shards",
    "decode": "Images at training size",
    "meta": "Metadata",
    "scale": "Indexing at scale",
    "compressed": "Compressed shards",
    "checksums": "Checksums",
    "pack": "Sequence packing",
    "collate": "Batches from workers",
    "convert": "Converting parquet",
    "grain": "Grain data source",
    "ray": "Ray Data",
    "join": "Joins by key",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "what",
        nargs="?",
        default="all",
        choices=("index", *SECTIONS, "all"),
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke run")
    parser.add_argument(
        "--data-dir", type=Path, default=REPO / "bench-data", help="cache of generated shards"
    )
    parser.add_argument(
        "--json", action="store_true", help="print results as JSON instead of Markdown"
    )
    args = parser.parse_args(argv)

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    report: Report = log if args.json else print
    results: dict[str, Any] = {}
    if args.what in ("index", "all"):
        results["index"] = run_index(
            quick=args.quick, data_dir=args.data_dir, report=report, log=log
        )
    for what, title in SECTIONS.items():
        if args.what in (what, "all"):
            report(f"## {title}")
            report("")
            results[what] = run_module(f"bench_{what}", quick=args.quick, report=report)
    if args.json:
        print(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
