"""The GPU image stage against the CPU paths (issue 28): ``python tools/bench_gpu.py``.

Makes a corpus of photo-like 1024x768 JPEGs (smooth random fields, shapes and noise,
quality 90; 8,000 by default) in indexed shards under a temporary folder in /tmp, in
parallel processes, and measures in one run, each case one pass over a warm page cache,
images decoded to a shorter side of 256 in batches of 64:

* webdataset ``.decode("rgb8")`` + a PIL resize, 15 workers (over fewer images: it is
  the slow row, and webdataset gives each worker whole shards);
* indextar ``image_decoder("rgb8", 256)``, 15 workers;
* the stage, ``on_gpu(loader, 256)`` with ``encoded_collate()``, 2, 4 and 8 workers end
  to end; with ``encoded_collate(reuse=False)`` (a new shared-memory block a batch, the
  hand-off before reused blocks), 4 and 8 workers; 4 workers with two batches decoded
  ahead, and with the GIL switched between threads every 0.5 ms;
* the hand-off alone, 4 and 8 workers: workers returning a list of ``bytes`` against one
  uint8 tensor with offsets (``encoded_collate``), in a new block a batch and in reused
  blocks, nothing decoded;
* the in-memory ceiling of each backend present: batches already collated in memory,
  decoded by ``ImageStage`` (and through ``on_gpu``'s thread for the default backend).

Each row gives images/s, its ratio to the 15-worker ``image_decoder`` row, and the CPU
it used (this process and its reaped children, DataLoader workers included): cores,
and cores per 1,000 images/s. Then the PSNR of the stage against ``image_decoder`` on a
sample, and the issue's targets as PASS/FAIL (never asserted). ``--small`` runs it on a
CPU in seconds (200 images, at most 2 workers, backend ``cpu`` without CUDA). Results
are rewritten after each row to ``--out`` (markdown) and ``--json-out``, so that a run
cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import inspect
import io
import json
import os
import platform
import re
import shutil
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import procstats  # noqa: E402
from photos import photo_noise, photo_scenes  # noqa: E402

WIDTH, HEIGHT, SIZE, BATCH = 1024, 768, 256, 64
PER_SHARD = 125


# -- corpus -------------------------------------------------------------------------


def write_shard(args: tuple[str, int, int]) -> str:
    """Write ``count`` photo-like JPEG+cls samples from ``first`` into ``path`` and index it."""
    from PIL import Image

    from indextar import build_index

    path, first, count = args
    rng = np.random.default_rng(first)
    scenes = photo_scenes(rng, 3, WIDTH, HEIGHT)
    noise = photo_noise(rng, 4, WIDTH, HEIGHT)
    with tarfile.open(path, "w") as tar:
        for i in range(first, first + count):
            pixels = np.roll(scenes[i % 3], 7 * i, axis=1) + np.roll(noise[i % 4], 13 * i, axis=0)
            buf = io.BytesIO()
            Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
            for ext, data in (("jpg", buf.getvalue()), ("cls", b"%d" % (i % 1000))):
                info = tarfile.TarInfo(f"p{i:07d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    build_index(path)
    return path


def make_corpus(folder: Path, images: int, processes: int) -> list[str]:
    jobs = []
    for n, first in enumerate(range(0, images, PER_SHARD)):
        jobs.append((str(folder / f"photos-{n:06d}.tar"), first, min(PER_SHARD, images - first)))
    with get_context("fork").Pool(processes) as pool:
        return pool.map(write_shard, jobs, chunksize=1)


# -- collates (module level: picklable for any start method) ---------------------------


def bytes_collate(samples: list[tuple[bytes, int]]) -> tuple[list[bytes], Any]:
    """The old hand-off: a list of ``bytes``, pickled through the workers' pipes."""
    import torch

    return [jpeg for jpeg, _ in samples], torch.tensor([label for _, label in samples])


def wds_resize(array: np.ndarray) -> np.ndarray:
    from PIL import Image

    img = Image.fromarray(array)
    w, h = img.size
    new = (int(SIZE * w / h), SIZE) if w >= h else (SIZE, int(SIZE * h / w))
    return np.asarray(img.resize(new, Image.Resampling.BILINEAR))


def identity(value: Any) -> Any:
    return value


# -- measuring --------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rows: list[dict[str, Any]] = []
        self.info: dict[str, Any] = {}
        self.notes: list[str] = []

    def measure(
        self, name: str, workers: int, run: Callable[[], int | tuple[int, dict[str, Any]]]
    ) -> dict[str, Any] | None:
        """Run one case; its images/s and CPU (and what ``run`` adds: a staged pass's
        rate after its first batch, its timings, its threads' CPU). A failing case is
        noted, not fatal."""
        import torch

        if self.args.only and not any(part in name for part in self.args.only):
            return None
        log(f"{name} ...")
        cpu0, start = procstats.cpu_seconds(), time.perf_counter()
        try:
            got = run()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - one row's failure is reported, the rest run
            self.notes.append(f"{name}: failed: {type(e).__name__}: {e}")
            log(self.notes[-1])
            self.write()
            return None
        wall = time.perf_counter() - start
        count, extra = got if isinstance(got, tuple) else (got, {})
        cores = (procstats.cpu_seconds() - cpu0) / wall
        rate = count / wall
        row = {
            "path": name,
            "workers": workers,
            "images": count,
            "seconds": wall,
            "images_per_s": rate,
            "cpu_cores": cores,
            "cores_per_1000_per_s": cores / (rate / 1000),
            **extra,
        }
        self.rows.append(row)
        steady = extra.get("steady_images_per_s")
        steady = f", {steady:,.0f} after the first batch" if steady is not None else ""
        log(f"  {rate:,.0f} images/s{steady}, {cores:.1f} cores")
        for key in ("timings", "threads"):
            if key in extra:
                log(f"  {key}: {extra[key]}")
        self.write()
        return row

    def rate(self, name: str) -> float | None:
        return next((r["images_per_s"] for r in self.rows if r["path"] == name), None)

    def table(self) -> str:
        base = self.rate(ID_ROW)
        lines = [
            "| path | workers | images | images/s | × image_decoder | after the first batch | "
            "CPU cores | cores per 1,000 images/s |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for r in self.rows:
            ratio = f"{r['images_per_s'] / base:.2f}×" if base else "–"
            steady = f"{r['steady_images_per_s']:,.0f}" if "steady_images_per_s" in r else "–"
            lines.append(
                f"| {r['path']} | {r['workers'] or '–'} | {r['images']:,} | "
                f"{r['images_per_s']:,.0f} | {ratio} | {steady} | {r['cpu_cores']:.1f} | "
                f"{r['cores_per_1000_per_s']:.2f} |"
            )
        head = [f"- {k}: {v}" for k, v in self.info.items()]
        notes = [f"- {note}" for note in self.notes]
        return "\n".join([*head, "", *lines, "", *notes]) + "\n"

    def write(self) -> None:
        if self.args.out:
            Path(self.args.out).write_text(self.table())
        if self.args.json_out:
            Path(self.args.json_out).write_text(json.dumps(self.result(), indent=1))

    def result(self) -> dict[str, Any]:
        return {"info": self.info, "rows": self.rows, "notes": self.notes}


ID_ROW = 'indextar `image_decoder("rgb8", 256)`'


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def consume(batches: Iterable[Any]) -> int:
    """Iterate, touching each batch's images as training would; the images seen."""
    import torch

    count = 0
    for batch in batches:
        images = batch[0]
        if isinstance(images, torch.Tensor):
            images.view(-1)[:1].sum()  # a kernel on the caller's stream, reading the batch
            count += images.shape[0]
        else:
            count += len(images)
    return count


def staged_pass(staged: Any) -> tuple[int, dict[str, Any]]:
    """One pass over an ``on_gpu`` loader, as :func:`consume`; with its rate after the
    first batch (the workers' start left out), where its time went
    (``StagedLoader.timings``), and the busiest threads of this process, in cores after
    the first batch (the caller, the fetching and the decoding threads by name)."""
    import threading

    import torch

    names = {threading.get_native_id(): "caller"}
    count, first, start = 0, 0, time.perf_counter()
    for n, batch in enumerate(staged):
        images = batch[0]
        images.view(-1)[:1].sum()
        if not count:
            first, first_at = images.shape[0], time.perf_counter()
            names.update({t.native_id: t.name for t in threading.enumerate() if t.native_id})
            cpu0 = procstats.thread_cpu_seconds()
        if n % 16 == 0:  # the threads end with the pass: read them while they run
            cpu1, cpu1_at = procstats.thread_cpu_seconds(), time.perf_counter()
        count += images.shape[0]
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    end = time.perf_counter()
    span = max(cpu1_at - first_at, 1e-9)
    used = {tid: (cpu - cpu0.get(tid, 0.0)) / span for tid, cpu in cpu1.items()}
    busiest = sorted(used.items(), key=lambda item: -item[1])[:5]
    timings = staged.timings
    return count, {
        "steady_images_per_s": (count - first) / (end - first_at) if count > first else 0.0,
        "first_batch_s": first_at - start,
        "timings": {
            "batches": timings.batches,
            "fetch_s": round(timings.fetch_s, 3),
            "decode_s": round(timings.decode_s, 3),
            "starved_s": round(timings.starved_s, 3),
            "waited_s": round(timings.waited_s, 3),
            "pass_s": round(end - start, 3),
        },
        "threads": {f"{names.get(tid, tid)}": round(cpu, 2) for tid, cpu in busiest},
    }


def run_cases(bench: Bench, paths: list[str], images: int) -> None:
    import torch
    from torch.utils.data import DataLoader

    import indextar
    from indextar import ImageStage, IndexedTarDataset, encoded_collate, image_decoder, on_gpu

    args = bench.args
    cap = 2 if args.small else 64
    many = min(15, cap)
    backend = ImageStage(SIZE, backend=args.backend).backend
    bench.info["stage backend"] = backend
    raw = IndexedTarDataset(paths, keys=("jpg", "cls"), decode=[])

    def loader(dataset: Any, workers: int, collate: Any = None, **options: Any) -> Any:
        return DataLoader(
            dataset,
            batch_size=BATCH,
            num_workers=min(workers, cap),
            collate_fn=collate,
            shuffle=False,
            **options,
        )

    # webdataset: whole shards per worker; enough shards for every worker to get two
    try:
        import webdataset

        shards = paths[: max(1, min(len(paths), 2 * many))]
        wds = (
            webdataset.WebDataset(shards, shardshuffle=False, empty_check=False)
            .decode("rgb8")
            .to_tuple("jpg", "cls")
            .map_tuple(wds_resize, identity)
        )
        bench.measure(
            'webdataset `.decode("rgb8")` + PIL resize', many, lambda: consume(loader(wds, many))
        )
    except ImportError:
        bench.notes.append("webdataset is not installed: its row is left out")

    decoded = IndexedTarDataset(paths, keys=("jpg", "cls"), decode=image_decoder("rgb8", SIZE))
    bench.measure(ID_ROW, many, lambda: consume(loader(decoded, many)))

    for workers in (2, 4, 8):
        bench.measure(
            f"stage `on_gpu(loader, 256)`, {backend}",
            workers,
            lambda w=workers: staged_pass(
                on_gpu(loader(raw, w, encoded_collate()), SIZE, backend=backend)
            ),
        )
    for _ in range(args.repeat - 1):  # the target's row again: how much it varies
        bench.measure(
            f"stage `on_gpu(loader, 256)`, {backend}, again",
            4,
            lambda: staged_pass(on_gpu(loader(raw, 4, encoded_collate()), SIZE, backend=backend)),
        )
    default_decoders = inspect.signature(on_gpu).parameters["decoders"].default
    other = 1 if default_decoders != 1 else 2  # the default's alternative, measured too
    for _ in range(args.repeat):
        bench.measure(
            f"stage, {backend}, `decoders={other}`",
            4,
            lambda: staged_pass(
                on_gpu(loader(raw, 4, encoded_collate()), SIZE, backend=backend, decoders=other)
            ),
        )
    for workers in (4, 8):  # the hand-off before reused blocks: a new block a batch
        bench.measure(
            f"stage, {backend}, `encoded_collate(reuse=False)`",
            workers,
            lambda w=workers: staged_pass(
                on_gpu(loader(raw, w, encoded_collate(reuse=False)), SIZE, backend=backend)
            ),
        )
    if backend != "cpu":
        bench.measure(
            f"stage, {backend}, two batches decoded ahead",
            4,
            lambda: staged_pass(
                on_gpu(loader(raw, 4, encoded_collate()), SIZE, backend=backend, prefetch=2)
            ),
        )
        previous_interval = sys.getswitchinterval()
        sys.setswitchinterval(0.0005)  # the GIL handed between threads 10x as often
        try:
            bench.measure(
                f"stage, {backend}, `sys.setswitchinterval(0.0005)`",
                4,
                lambda: staged_pass(
                    on_gpu(loader(raw, 4, encoded_collate()), SIZE, backend=backend)
                ),
            )
        finally:
            sys.setswitchinterval(previous_interval)

    for workers in (4, 8):
        bench.measure(
            "hand-off alone: list of `bytes`",
            workers,
            lambda w=workers: consume(loader(raw, w, bytes_collate)),
        )
        for reuse, how in ((False, "a new block a batch"), (True, "reused blocks")):
            bench.measure(
                f"hand-off alone: one uint8 tensor + offsets, {how}",
                workers,
                lambda w=workers, r=reuse: consume(
                    (b.offsets[1:], b) for b in loader(raw, w, encoded_collate(reuse=r))
                ),
            )

    # in-memory ceilings: batches collated in memory, decoded without a loader
    count = min(images, 256 if args.small else 4096)
    samples = [raw[i] for i in range(count)]
    jpegs = [jpeg for jpeg, _ in samples]
    batches = [encoded_collate()(samples[i : i + BATCH]) for i in range(0, count, BATCH)]
    ceilings: list[tuple[str, dict[str, Any]]] = [(backend, {})]
    if backend != "cpu":
        ceilings.append((backend, {"pin_memory": True}))
    if backend != "dali" and torch.cuda.is_available():
        try:
            import nvidia.dali  # noqa: F401

            ceilings.append(("dali", {}))
        except ImportError:
            bench.notes.append("DALI (nvidia-dali) is not installed: no dali rows")
    if backend != "cpu":
        ceilings.append(("cpu", {}))
    for name, options in ceilings:
        try:
            stage = ImageStage(SIZE, backend=name, **options)
        except indextar.DecodeSpecError as e:
            bench.notes.append(f"backend {name}: {e}")
            continue
        todo = batches if name != "cpu" else batches[: max(1, 256 // BATCH)]
        for warm in todo[:2]:
            stage.decode(warm)
        label = f"in-memory ceiling: `ImageStage`, {name}" + (
            ", with a pinned copy" if options else ""
        )
        bench.measure(label, 0, lambda s=stage, t=todo: consume((s.decode(b),) for b in t))
        if name == backend and not options and name != "cpu":
            bench.measure(
                f"in-memory: `ImageStage(batch)`, labels moved too, {name}",
                0,
                lambda s=stage, t=todo: consume((s(b)[0],) for b in t),
            )
            for decoders in (1, 2):
                bench.measure(
                    f"in-memory: through `on_gpu`, {name}, `decoders={decoders}`",
                    0,
                    lambda n=name, d=decoders: staged_pass(
                        on_gpu(batches, SIZE, backend=n, decoders=d)
                    ),
                )

    psnr_check(bench, jpegs[:64], backend)


def psnr_check(bench: Bench, jpegs: list[bytes], backend: str) -> None:
    from indextar import ImageStage, encoded_collate, image_decoder

    got = ImageStage(SIZE, backend=backend).decode(encoded_collate()(jpegs))
    want = image_decoder("rgb8", SIZE)
    values, shapes = [], True
    for image, jpeg in zip(got, jpegs):
        reference = want(".jpg", jpeg)
        pixels = image.permute(1, 2, 0).cpu().numpy()
        shapes &= pixels.shape == reference.shape
        mse = float(np.mean((pixels.astype(np.float64) - reference) ** 2)) if shapes else 1e9
        values.append(float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse))
    bench.info["PSNR stage vs image_decoder"] = (
        f"{backend}, {len(values)} images: mean {np.mean(values):.1f} dB, "
        f"min {min(values):.1f} dB, shapes {'equal' if shapes else 'DIFFER'}"
    )
    bench.info["psnr_min_db"] = min(values)


def targets(bench: Bench) -> list[str]:
    """The issue's targets, read from the median of each worker count's passes (the
    4-worker row runs ``--repeat`` times): PASS/FAIL lines, never asserted."""
    base = bench.rate(ID_ROW)
    passes: dict[int, list[dict[str, Any]]] = {}
    for r in bench.rows:
        if r["path"].startswith("stage `on_gpu"):
            passes.setdefault(r["workers"], []).append(r)

    def median(rows: list[dict[str, Any]], key: str) -> float:
        return float(np.median([r[key] for r in rows]))

    # the stage's own ceiling: its best rate over batches already in memory (the
    # default backend's rows: ImageStage alone and through on_gpu's threads)
    default = bench.info.get("stage backend", "")
    in_memory = [
        r
        for r in bench.rows
        if r["path"].startswith("in-memory")
        and re.search(rf", {default}(,|$)", r["path"])
        and "pinned" not in r["path"]
    ]
    ceiling = max(in_memory, key=lambda r: r["images_per_s"], default=None)
    out = []
    few = {w: rows for w, rows in passes.items() if w <= 4}
    if few:
        workers = max(few, key=lambda w: median(few[w], "images_per_s"))
        rows = few[workers]
        rate = median(rows, "images_per_s")
        every = ", ".join(f"{r['images_per_s']:,.0f}" for r in rows)
        if base:
            ratio = rate / base
            out.append(
                f"{'PASS' if ratio >= 2.5 else 'FAIL'} stage with <= 4 workers >= 2.5x "
                f"image_decoder with 15: {ratio:.2f}x ({workers} workers, median of "
                f"{len(rows)} passes: {every} images/s)"
            )
        if ceiling:
            share = rate / ceiling["images_per_s"]
            out.append(
                f"{'PASS' if share >= 0.8 else 'FAIL'} stage >= 0.8 of its in-memory "
                f"ceiling: {share:.2f} ({workers} workers, start included; {every} images/s; "
                f"ceiling {ceiling['images_per_s']:,.0f}: {ceiling['path']})"
            )
            steady = median(rows, "steady_images_per_s") / ceiling["images_per_s"]
            out.append(f"INFO after the first batch (start left out): {steady:.2f} of the ceiling")
        id_row = next((r for r in bench.rows if r["path"] == ID_ROW), None)
        if id_row:
            out.append(
                f"INFO cores per 1,000 images/s: stage "
                f"{median(rows, 'cores_per_1000_per_s'):.2f}, "
                f"image_decoder {id_row['cores_per_1000_per_s']:.2f}"
            )
    if "psnr_min_db" in bench.info:
        ok = bench.info["psnr_min_db"] >= 30
        out.append(f"{'PASS' if ok else 'FAIL'} PSNR >= 30 dB: {bench.info['psnr_min_db']:.1f}")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", action="store_true", help="200 images, <= 2 workers")
    parser.add_argument("--images", type=int, help="corpus size (default 8000; 200 small)")
    parser.add_argument("--backend", default="auto", choices=["auto", "nvjpeg", "dali", "cpu"])
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument("--out", help="write the markdown table here too")
    parser.add_argument("--json-out", help="write the JSON here too")
    parser.add_argument("--keep", action="store_true", help="keep the corpus folder")
    parser.add_argument("--only", nargs="+", help="run only the rows whose name holds one of these")
    parser.add_argument(
        "--repeat", type=int, default=3, help="passes of the 4-worker stage row (default 3)"
    )
    args = parser.parse_args(argv)
    images = args.images or (200 if args.small else 8000)

    import torch

    import indextar
    from indextar.read.image import _jpeg_module

    bench = Bench(args)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    try:
        import torchvision

        vision = torchvision.__version__
    except ImportError:
        vision = "not installed"
    bench.info.update(
        {
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, GPU {gpu}",
            "versions": f"Python {platform.python_version()}, torch {torch.__version__}, "
            f"torchvision {vision}, indextar {indextar.__version__}",
            "image_decoder JPEG library": "simplejpeg" if _jpeg_module("auto") else "Pillow",
            "corpus": f"{images:,} photo-like {WIDTH}x{HEIGHT} JPEGs (q90) -> shorter side "
            f"{SIZE}, batches of {BATCH}, one pass each, warm page cache",
        }
    )
    folder = Path(tempfile.mkdtemp(prefix="indextar-bench-gpu-", dir="/tmp"))
    try:
        start = time.perf_counter()
        paths = make_corpus(folder, images, min(16, os.cpu_count() or 1))
        bench.info["corpus seconds"] = f"{time.perf_counter() - start:.1f}"
        log(f"corpus: {len(paths)} shards in {folder}")
        run_cases(bench, paths, images)
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    bench.info["targets"] = targets(bench)
    bench.write()
    if args.json:
        print(json.dumps(bench.result(), indent=1))
    else:
        print(bench.table())


if __name__ == "__main__":
    main()
