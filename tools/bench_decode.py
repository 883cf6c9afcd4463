"""Images at training size (issue 19): ``python tools/bench.py decode``.

Writes (once) 4,000 photo-like 1024x768 JPEGs (smooth gradients plus noise and shapes,
quality 90) into 4 shards under ``bench-data/decode/``, then measures, in one run:

* **libraries**, one thread, bytes already in memory: a full decode; a full decode then
  the resize to 256 (what ``decode="rgb8"`` plus a resize in ``transform`` does);
  ``image_decoder`` (simplejpeg's DCT scale where it is installed, the ``bench``
  extra), and with ``backend="pillow"`` (Pillow's DCT-domain ``draft``); bare
  ``simplejpeg`` and PyTurboJPEG decoding at a DCT scale, then the same resize (rows
  appear when they are installed);
* **threads**: ``image_decoder`` over a batch of 64 in one process, decoded in the
  calling thread and in the ``decode_threads=2`` pool;
* **DataLoader**, 2 workers, batch 64, 256-pixel ``rgb8`` arrays: webdataset with
  ``.decode("rgb8")`` and a PIL resize in ``.map``; indextar with ``decode="rgb8"``
  and the same resize in ``transform``; indextar with ``image_decoder(size=256)``,
  with and without ``decode_threads``, and with ``backend="pillow"``; and the in-memory
  limit, ``image_decoder`` over bytes already in RAM; then 1 worker, with and without 2
  decode threads.

Every row is the best of ``ROUNDS`` runs, interleaved, with the range over the runs:
this machine is shared. Targets are printed as PASS/FAIL, never asserted. A bar chart
(``docs/benchmarks-decode.png``) needs matplotlib, the ``bench`` extra.
"""

from __future__ import annotations

import io
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import benchlib  # noqa: E402
from photos import photo_noise, photo_scenes  # noqa: E402

import indextar  # noqa: E402
from indextar import image_decoder  # noqa: E402
from indextar.read.image import _jpeg_module  # noqa: E402

BACKEND = "simplejpeg" if _jpeg_module("auto") is not None else "pillow"
"""Who decodes JPEGs for ``image_decoder()`` here: simplejpeg where installed."""
from indextar.read.decode import make_decoder  # noqa: E402

WIDTH, HEIGHT, SIZE = 1024, 768, 256
TARGET = (int(SIZE * WIDTH / HEIGHT), SIZE)  # PIL (w, h): 341 x 256, torchvision's rule
SHARDS, IMAGES, QUICK_IMAGES = 4, 4000, 128
BATCH, WORKERS = 64, 2
ROUNDS, QUICK_ROUNDS = 3, 1
CHART = ROOT / "docs" / "benchmarks-decode.png"

Report = Callable[[str], None]


# -- data ---------------------------------------------------------------------------


def photo_jpegs(count: int, seed: int = 0) -> list[bytes]:
    """``count`` photo-like 1024x768 JPEGs: 16 shaded scenes with shapes, each image one
    of them shifted, with its own noise, at quality 90."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    scenes = photo_scenes(rng, 16, WIDTH, HEIGHT)
    noise = photo_noise(rng, 8, WIDTH, HEIGHT)
    out = []
    for i in range(count):
        pixels = np.roll(scenes[i % 16], 7 * i, axis=1) + np.roll(noise[i % 8], 13 * i, axis=0)
        buf = io.BytesIO()
        Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def make_shards(folder: Path, count: int, report: Report) -> list[str]:
    """Write (once) ``count`` JPEG+cls samples in ``SHARDS`` shards; return their paths."""
    import webdataset

    folder = folder / f"decode-{count}x{WIDTH}x{HEIGHT}-q90-v1"
    paths = [str(folder / f"photos-{n:06d}.tar") for n in range(SHARDS)]
    if (folder / "done").exists():
        return paths
    report(f"generating {count} JPEGs in {folder} ...")
    folder.mkdir(parents=True, exist_ok=True)
    jpegs = photo_jpegs(count)
    per_shard = -(-count // SHARDS)
    for n, path in enumerate(paths):
        with webdataset.TarWriter(path) as sink:
            for i in range(n * per_shard, min(count, (n + 1) * per_shard)):
                sink.write({"__key__": f"p{i:07d}", "jpg": jpegs[i], "cls": b"%d" % (i % 10)})
    (folder / "done").touch()
    return paths


# -- rows ---------------------------------------------------------------------------


@dataclass
class Row:
    name: str
    rates: list[float] = field(default_factory=list)  # images/s, one per round

    @property
    def best(self) -> float:
        return max(self.rates)

    def range(self) -> str:
        return f"{min(self.rates):,.0f}–{max(self.rates):,.0f}"


def interleaved(cases: dict[str, Callable[[], float]], rounds: int) -> list[Row]:
    """Each case ``rounds`` times, round-robin, so that passing load hits every case."""
    return [Row(name, rates) for name, rates in benchlib.interleaved(cases, rounds).items()]


def resize(array: np.ndarray) -> np.ndarray:
    """The resize a user writes after a full decode: PIL, bilinear, shorter side 256."""
    from PIL import Image

    img = Image.fromarray(array)
    return np.array(img.resize(TARGET if img.width >= img.height else TARGET[::-1]))


def library_cases(jpegs: list[bytes]) -> dict[str, Callable[[], float]]:
    """One thread, bytes in memory: images/s of each way to a 341x256 rgb8 array."""
    from PIL import Image

    full = make_decoder("rgb8")
    assert full is not None
    ours = image_decoder("rgb8", SIZE)
    ours_pillow = image_decoder("rgb8", SIZE, backend="pillow")

    def rate(fn: Callable[[bytes], Any]) -> Callable[[], float]:
        def case() -> float:
            start = time.perf_counter()
            for data in jpegs:
                fn(data)
            return len(jpegs) / (time.perf_counter() - start)

        return case

    def pillow_draft(data: bytes) -> np.ndarray:
        img = Image.open(io.BytesIO(data))
        img.draft("RGB", TARGET)
        return np.asarray(img.resize(TARGET, Image.BILINEAR, (0, 0, WIDTH / 2, HEIGHT / 2)))

    cases = {
        'Pillow full decode (`decode="rgb8"`)': rate(lambda d: full("jpg", d)),
        "Pillow full decode + resize": rate(lambda d: resize(full("jpg", d))),
        f"`image_decoder` (backend {BACKEND})": rate(lambda d: ours(".jpg", d)),
        'Pillow `draft` + resize (`image_decoder(backend="pillow")`)': rate(
            lambda d: ours_pillow(".jpg", d)
        ),
        "Pillow `draft` + resize, bare": rate(pillow_draft),
    }
    try:
        import simplejpeg

        def simple(data: bytes) -> np.ndarray:
            pixels = simplejpeg.decode_jpeg(data, "RGB", min_height=SIZE, min_width=TARGET[0])
            return np.asarray(Image.fromarray(pixels).resize(TARGET, Image.BILINEAR))

        cases[f"simplejpeg {simplejpeg.__version__} DCT scale + resize"] = rate(simple)
    except ImportError:
        pass
    try:
        import turbojpeg

        jpeg = turbojpeg.TurboJPEG()

        def turbo(data: bytes) -> np.ndarray:
            pixels = jpeg.decode(data, pixel_format=turbojpeg.TJPF_RGB, scaling_factor=(1, 2))
            return np.asarray(Image.fromarray(pixels).resize(TARGET, Image.BILINEAR))

        cases["PyTurboJPEG DCT scale + resize"] = rate(turbo)
    except (ImportError, OSError, RuntimeError):  # the package, or libturbojpeg, missing
        pass
    return cases


def thread_cases(paths: list[str]) -> dict[str, Callable[[], float]]:
    """One process, ``__getitems__`` batches of 64, without and with 2 decode threads."""

    def case(threads: int) -> Callable[[], float]:
        def run() -> float:
            ds = indextar.IndexedTarDataset(
                paths, decode=image_decoder(size=SIZE), keys=("jpg", "cls"), decode_threads=threads
            )
            order = np.random.default_rng(1).permutation(min(len(ds), 512)).tolist()
            start = time.perf_counter()
            for at in range(0, len(order), BATCH):
                ds.__getitems__(order[at : at + BATCH])
            ds.close()
            return len(order) / (time.perf_counter() - start)

        return run

    return {"`__getitems__`, 1 thread": case(0), "`__getitems__`, `decode_threads=2`": case(2)}


class InMemory:
    """The samples' bytes already in RAM, decoded as the dataset does: the limit."""

    def __init__(self, samples: list[tuple[bytes, bytes]]):
        self.samples = samples
        self.decode = image_decoder(size=SIZE)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        jpg, cls = self.samples[i]
        return self.decode(".jpg", jpg), int(cls)


def with_resize(sample: tuple[np.ndarray, int]) -> tuple[np.ndarray, int]:
    return resize(sample[0]), sample[1]


def loader_cases(paths: list[str]) -> dict[str, Callable[[], float]]:
    import torch
    import webdataset
    from torch.utils.data import DataLoader

    torch.set_num_threads(1)

    def timed(make: Callable[[], Any]) -> Callable[[], float]:
        def run() -> float:
            loader = make()
            start = time.perf_counter()
            count = sum(len(batch[1]) for batch in loader)
            return count / (time.perf_counter() - start)

        return run

    def ours(decode: Any, workers: int = WORKERS, **kwargs: Any) -> Callable[[], Any]:
        def make() -> Any:
            ds = indextar.IndexedTarDataset(paths, decode=decode, keys=("jpg", "cls"), **kwargs)
            return DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=workers)

        return make

    def wds() -> Any:
        pipeline = (
            webdataset.WebDataset(paths, shardshuffle=False, empty_check=False)
            .decode("rgb8")
            .to_tuple("jpg", "cls")
            .map(with_resize)
            .batched(BATCH)
        )
        return webdataset.WebLoader(pipeline, batch_size=None, num_workers=WORKERS)

    raw = indextar.IndexedTarDataset(paths, keys=("jpg", "cls"))
    memory = InMemory([raw[i] for i in range(len(raw))])

    def limit() -> Any:
        return DataLoader(memory, batch_size=BATCH, shuffle=True, num_workers=WORKERS)

    small = image_decoder(size=SIZE)
    return {
        WDS: timed(wds),
        FULL: timed(ours("rgb8", transform=with_resize)),
        OURS: timed(ours(small)),
        OURS_THREADS: timed(ours(small, decode_threads=2)),
        LIMIT: timed(limit),
        OURS_PILLOW: timed(ours(image_decoder(size=SIZE, backend="pillow"))),
        "indextar `image_decoder`, 1 worker": timed(ours(small, 1)),
        "indextar `image_decoder`, 1 worker, `decode_threads=2`": timed(
            ours(small, 1, decode_threads=2)
        ),
    }


WDS = 'webdataset `.decode("rgb8")` + resize in `.map`'
FULL = 'indextar `decode="rgb8"` + resize in `transform`'
OURS = "indextar `image_decoder(size=256)`"
OURS_PILLOW = 'indextar `image_decoder(size=256, backend="pillow")`'
OURS_THREADS = "indextar `image_decoder(size=256)`, `decode_threads=2`"
LIMIT = "in-memory limit: `image_decoder` on bytes in RAM"


# -- report -------------------------------------------------------------------------


def table(title: str, rows: list[Row], base: Row, base_name: str) -> list[str]:
    lines = [
        title,
        "",
        f"| | images/s (best) | range over runs | × {base_name} |",
        "| --- | ---: | ---: | ---: |",
    ]
    for row in rows:
        lines.append(
            f"| {row.name} | {row.best:,.0f} | {row.range()} | {row.best / base.best:.2f} |"
        )
    return lines + [""]


def targets(loaders: dict[str, Row]) -> list[str]:
    ours, wds, limit = loaders[OURS], loaders[WDS], loaders[LIMIT]
    threads = loaders[OURS_THREADS]

    def line(ok: bool, text: str) -> str:
        return f"- {'PASS' if ok else 'FAIL'}: {text}"

    ratio, of_limit = ours.best / wds.best, ours.best / limit.best
    return [
        "Targets:",
        "",
        line(ratio >= 2.5, f"`image_decoder` >= 2.5x webdataset's images/s ({ratio:.2f}x)"),
        line(of_limit >= 0.9, f"`image_decoder` >= 0.9 of its in-memory limit ({of_limit:.2f})"),
        line(
            threads.best >= 0.97 * ours.best,
            "2 workers on 2 cores: `decode_threads=2` no slower than none "
            f"({threads.best / ours.best:.2f}x)",
        ),
        "",
    ]


def chart(libraries: list[Row], loaders: list[Row], path: Path) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "(no chart: matplotlib is not installed; pip install -e '.[bench]')"
    fig, axes = plt.subplots(2, 1, figsize=(9, 7.5), height_ratios=[len(libraries), len(loaders)])
    for ax, rows, title in (
        (axes[0], libraries, "One thread, bytes in memory, 1024x768 JPEG → 341x256 rgb8"),
        (axes[1], loaders, f"DataLoader, batch {BATCH}, 256-pixel rgb8 arrays"),
    ):
        names = [row.name.replace("`", "") for row in rows][::-1]
        best = [row.best for row in rows][::-1]
        low = [row.best - min(row.rates) for row in rows][::-1]
        colours = ["#c44e52" if "webdataset" in n else "#4c72b0" for n in names]
        ax.barh(names, best, xerr=[low, [0] * len(low)], color=colours, capsize=3)
        for y, value in enumerate(best):
            ax.text(value, y, f" {value:,.0f}", va="center", fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("images/s (bar: best run; whisker: slowest run)")
        ax.tick_params(axis="y", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"Chart: `{path.relative_to(ROOT)}`"


def run(report: Report = print, *, quick: bool = False, data_dir: Path | None = None) -> Any:
    count, rounds = (QUICK_IMAGES, QUICK_ROUNDS) if quick else (IMAGES, ROUNDS)
    paths = make_shards(data_dir or ROOT / "bench-data", count, report)
    raw = indextar.IndexedTarDataset(paths, keys=("jpg",))
    jpegs = [raw[i][0] for i in range(min(len(raw), 64))]
    libraries = interleaved(library_cases(jpegs), max(rounds, 5))
    threads = interleaved(thread_cases(paths), max(rounds, 3))
    loaders = interleaved(loader_cases(paths), rounds)
    by_name = {row.name: row for row in loaders}
    lines = [f"{count} photo-like {WIDTH}x{HEIGHT} JPEGs (quality 90) in {SHARDS} shards.", ""]
    lines += table("One thread, bytes in memory:", libraries, libraries[1], "full + resize")
    lines += table("One process, 512 samples:", threads, threads[0], "1 thread")
    lines += table(
        f"DataLoader, {WORKERS} workers unless said, batch {BATCH}, shuffled (webdataset: "
        "in shard order):",
        loaders,
        by_name[WDS],
        "webdataset",
    )
    lines += targets(by_name)
    if not quick:
        lines.append(chart(libraries, loaders, CHART))
    lines.append(
        f"Load average (1 min) at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    for line in lines:
        report(line)
    return {
        "libraries": {row.name: row.rates for row in libraries},
        "threads": {row.name: row.rates for row in threads},
        "loaders": {row.name: row.rates for row in loaders},
    }


if __name__ == "__main__":
    results = run(quick="--quick" in sys.argv)
    if "--json" in sys.argv:
        print(json.dumps(results, indent=2))
