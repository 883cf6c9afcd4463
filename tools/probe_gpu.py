"""Where a batch's time goes in the GPU stage (issue 28), on a GPU machine, in-memory.

P1-P3: torchvision's batched decode alone, from pageable memory, from the same memory
registered with CUDA (cudaHostRegister), from pinned copies; P4/P5: ImageStage.decode
(pageable, registered), with the time inside the decoder call; P6: on_gpu over batches
in memory, 1 and 2 decoding threads; P7: the same while a DataLoader (4 workers, its
batches taken at ~7,000 images/s) runs beside it in a thread of this process; P8: the
same loader in another process; P10: decode with blocking sync (host CPU without the
spin), in a subprocess; P11: nvidia-smi's jpg engine use while the decoder runs.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import procstats  # noqa: E402

IMAGES = 2048
BATCH = 64
results: dict[str, Any] = {}
saved_to: Path | None = None  # main()'s probe.json, written after each step: the device
# script stops a probe that runs long, and what was measured by then still comes back


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def timed(name: str, fn: Any, images: int, reps: int = 3) -> None:
    import torch

    rates, cores = [], []
    for _ in range(reps):
        torch.cuda.synchronize()
        cpu0, t0 = procstats.cpu_seconds(), time.perf_counter()
        extra = fn()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        rates.append(images / wall)
        cores.append((procstats.cpu_seconds() - cpu0) / wall)
    median = statistics.median(rates)
    results[name] = {
        "rates": [round(r) for r in rates],
        "median": round(median),
        "cores": [round(c, 2) for c in cores],
        "ms_per_batch": round(1000 * BATCH / median, 2),
        **({"extra": extra} if isinstance(extra, dict) else {}),
    }
    log(f"{name}: {results[name]}")
    save()


def save() -> None:
    if saved_to is not None:
        saved_to.write_text(json.dumps(results, indent=1))


def loader_beside(raw: Any, stop: threading.Event, per_s: float) -> None:
    from torch.utils.data import DataLoader

    from indextar import encoded_collate

    order = list(range(len(raw))) * 50
    loader = DataLoader(
        raw, batch_size=BATCH, num_workers=4, collate_fn=encoded_collate(), sampler=order
    )
    it = iter(loader)
    tick = time.perf_counter()
    for batch in it:
        if stop.is_set():
            break
        tick += BATCH / per_s
        delay = tick - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        del batch
    del it


def blobs_of(b: Any, data: Any = None) -> list[Any]:
    """An EncodedBatch's images, as views of ``data`` (default: its own bytes)."""
    sizes = b.offsets.diff().tolist()
    d = b.data if data is None else data
    return list(d[int(b.offsets[0]) : int(b.offsets[-1])].split(sizes))


def beside_process(paths: list[str], stop_file: str, per_s: float) -> None:
    from indextar import IndexedTarDataset

    raw = IndexedTarDataset(paths, keys=("jpg", "cls"), decode=[])
    stop = threading.Event()
    t = threading.Thread(target=loader_beside, args=(raw, stop, per_s), daemon=True)
    t.start()
    while not os.path.exists(stop_file):
        time.sleep(0.05)
    stop.set()
    t.join(10)


def main() -> None:
    import torch
    import torchvision.io as tvio
    from bench_gpu import make_corpus

    from indextar import ImageStage, IndexedTarDataset, encoded_collate, on_gpu

    global saved_to
    saved_to = Path(os.environ.get("OUT", "/tmp"), "probe.json")
    folder = Path(tempfile.mkdtemp(prefix="probe-", dir="/tmp"))
    paths = make_corpus(folder, IMAGES, 16)
    raw = IndexedTarDataset(paths, keys=("jpg", "cls"), decode=[])
    samples = [raw[i] for i in range(IMAGES)]
    batches = [encoded_collate()(samples[i : i + BATCH]) for i in range(0, IMAGES, BATCH)]
    rgb = tvio.ImageReadMode.RGB
    dev = torch.device("cuda", 0)

    for b in batches[:2]:
        tvio.decode_jpeg(blobs_of(b), mode=rgb, device=dev)
    pageable = [blobs_of(b) for b in batches]
    timed(
        "P1 decode_jpeg alone, pageable",
        lambda: [tvio.decode_jpeg(x, mode=rgb, device=dev) for x in pageable],
        IMAGES,
    )

    cudart = torch.cuda.cudart()
    registered = []
    for b in batches:
        err = cudart.cudaHostRegister(b.data.data_ptr(), b.data.numel(), 0)
        registered.append(int(err) == 0)
    results["registered ok"] = sum(registered)
    timed(
        "P2 decode_jpeg alone, registered",
        lambda: [tvio.decode_jpeg(x, mode=rgb, device=dev) for x in pageable],
        IMAGES,
    )
    pinned = [blobs_of(b, b.data.pin_memory()) for b in batches]
    timed(
        "P3 decode_jpeg alone, pinned copies",
        lambda: [tvio.decode_jpeg(x, mode=rgb, device=dev) for x in pinned],
        IMAGES,
    )

    stage = ImageStage(256, backend="nvjpeg")
    inner = stage._gpu
    spent = [0.0]

    def timed_gpu(blobs: list[Any]) -> Any:
        t = time.perf_counter()
        try:
            return inner(blobs)
        finally:
            spent[0] += time.perf_counter() - t

    stage._gpu = timed_gpu

    def stage_pass() -> dict[str, float]:
        spent[0] = 0.0
        t = time.perf_counter()
        for b in batches:
            stage.decode(b)
        return {
            "in_decoder_ms_per_batch": round(1000 * spent[0] / len(batches), 2),
            "total_ms_per_batch": round(1000 * (time.perf_counter() - t) / len(batches), 2),
        }

    timed("P5 ImageStage.decode, registered", stage_pass, IMAGES)
    for b, ok in zip(batches, registered):
        if ok:
            cudart.cudaHostUnregister(b.data.data_ptr())
    timed("P4 ImageStage.decode, pageable", stage_pass, IMAGES)

    def staged(n: int) -> Any:
        def go() -> dict[str, Any]:
            spent[0] = 0.0
            s = on_gpu(batches, 256, backend="nvjpeg", decoders=n)
            s.stage._gpu = timed_gpu
            count = 0
            for images, _labels in s:
                images.view(-1)[:1].sum()
                count += images.shape[0]
            t = s.timings
            return {
                "in_decoder_ms_per_batch": round(1000 * spent[0] / t.batches, 2),
                "decode_ms_per_batch": round(1000 * t.decode_s / t.batches, 2),
                "starved_s": round(t.starved_s, 3),
                "waited_s": round(t.waited_s, 3),
            }

        return go

    for n in (1, 2, 1, 2):
        timed(f"P6 on_gpu in memory, {n} decoders", staged(n), IMAGES, reps=2)

    for per_s in (7000.0,):
        stop = threading.Event()
        t = threading.Thread(target=loader_beside, args=(raw, stop, per_s), daemon=True)
        t.start()
        time.sleep(1.0)
        for n in (1, 2, 1, 2):
            timed(
                f"P7 on_gpu in memory, {n} decoders, loader beside (thread) {per_s:.0f}/s",
                staged(n),
                IMAGES,
                reps=2,
            )
        stop.set()
        t.join(20)

    import multiprocessing as mp

    stop_file = str(folder / "stop")
    proc = mp.get_context("spawn").Process(target=beside_process, args=(paths, stop_file, 7000.0))
    proc.start()
    time.sleep(6.0)
    for n in (1, 2, 1, 2):
        timed(
            f"P8 on_gpu in memory, {n} decoders, loader beside (process)", staged(n), IMAGES, reps=2
        )
    Path(stop_file).touch()
    proc.join(20)

    dmon = subprocess.Popen(
        ["nvidia-smi", "dmon", "-s", "u", "-c", "3"], stdout=subprocess.PIPE, text=True
    )
    end = time.perf_counter() + 3.5
    while time.perf_counter() < end:
        for x in pageable:
            tvio.decode_jpeg(x, mode=rgb, device=dev)
    results["P11 dmon"] = dmon.communicate(timeout=20)[0]
    log(results["P11 dmon"])

    results["P10 blocking sync"] = subprocess.run(
        [sys.executable, __file__, "--blocking", str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout[-3000:]
    log(results["P10 blocking sync"])
    save()


def blocking(folder: str) -> None:
    try:
        from cuda.bindings import driver

        driver.cuInit(0)
        _, device = driver.cuDeviceGet(0)
        print(
            "set flags",
            driver.cuDevicePrimaryCtxSetFlags(
                device, driver.CUctx_flags.CU_CTX_SCHED_BLOCKING_SYNC
            ),
        )
    except Exception as e:  # noqa: BLE001
        print("no blocking sync:", e)
    import torch
    import torchvision.io as tvio

    from indextar import ImageStage, IndexedTarDataset, encoded_collate

    paths = sorted(str(p) for p in Path(folder).glob("*.tar"))
    raw = IndexedTarDataset(paths, keys=("jpg", "cls"), decode=[])
    batches = [
        encoded_collate()([raw[i] for i in range(j, j + BATCH)]) for j in range(0, IMAGES, BATCH)
    ]
    dev = torch.device("cuda", 0)
    rgb = tvio.ImageReadMode.RGB
    pageable = [blobs_of(b) for b in batches]
    for x in pageable[:2]:
        tvio.decode_jpeg(x, mode=rgb, device=dev)
    timed(
        "P10 decode_jpeg alone, blocking sync",
        lambda: [tvio.decode_jpeg(x, mode=rgb, device=dev) for x in pageable],
        IMAGES,
    )
    stage = ImageStage(256, backend="nvjpeg")
    timed(
        "P10 ImageStage.decode, blocking sync", lambda: [stage.decode(b) for b in batches], IMAGES
    )
    print(json.dumps(results))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--blocking":
        blocking(sys.argv[2])
    else:
        main()
