"""``on_gpu``: a loader's batches decoded on the device while the caller trains.

A thread takes batches from the loader while two others run the :class:`ImageStage`
on the next ones in turn, each on a CUDA stream of its own, and the caller's stream
trains on batch N. So the DataLoader's hand-off, the decoder's host work (nvJPEG
parsing each image and driving the hardware JPEG engines, one batch at a time) and
the resizing of the batch decoded before all overlap, with training and with each
other. Each batch comes
with a CUDA event; the caller's stream waits for it before the batch is handed out, and
its tensors are recorded on the caller's stream, so the allocator does not give their
memory back while the caller still reads them.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import DecodeSpecError
from .encoded import EncodedBatch
from .gpu import ImageStage, StageBackend
from .image import Backend as JpegBackend
from .image import Fit
from .shmblocks import map_leaves

if TYPE_CHECKING:
    import torch

__all__ = ["StageTimings", "StagedLoader", "on_gpu"]

_POLL_S = 0.1


@dataclass(slots=True)
class StageTimings:
    """Where a :class:`StagedLoader`'s pass spent its time, in seconds, so far: which of
    the loader, the decoder or the caller holds the others back.

    ``fetch_s`` is the fetching thread's time taking batches from the loader (waiting for
    the workers included); ``decode_s`` the decoding threads' time in the stage, and
    ``starved_s`` their time waiting for a batch to decode (summed over the decoding
    threads where there are several); ``waited_s`` the caller's time
    waiting for a decoded batch. A decoder starved for much of the pass is held by the
    loader (more workers); a caller that waits while the decoder is never starved is
    held by the decoder."""

    batches: int = 0
    fetch_s: float = 0.0
    decode_s: float = 0.0
    starved_s: float = 0.0
    waited_s: float = 0.0


@dataclass(frozen=True, slots=True)
class _Failure:
    error: BaseException


_END = object()


class _Stop:
    """Set when the caller's pass ends; the threads poll it between batches. A plain
    attribute, not a :class:`threading.Event`: setting an Event takes a lock, and an
    exception raised in the caller's thread by a signal handler just after the lock is
    taken leaves it taken, so the next set() waits for ever."""

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


class StagedLoader:
    """An iterable over a loader's batches with their images decoded on the device;
    made by :func:`on_gpu`. ``stage`` is the :class:`ImageStage` (its ``fallbacks``
    count the images decoded on the CPU); ``timings``, the :class:`StageTimings` of the
    latest pass (a new pass starts them again)."""

    def __init__(
        self,
        loader: Iterable[EncodedBatch],
        stage: ImageStage,
        *,
        prefetch: int = 1,
        decoders: int = 2,
    ):
        self.loader = loader
        self.stage = stage
        if decoders < 1:
            raise DecodeSpecError(f"on_gpu decoders= must be at least 1; got {decoders}")
        self.prefetch = max(1, prefetch)
        self.decoders = decoders
        self.timings = StageTimings()
        self._timings_lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        # Batch i goes to decoding thread i % decoders, through a queue of that thread's
        # own, and comes back through another: the caller takes them in turn, in order.
        n = self.decoders
        fetched: list[queue.Queue[Any]] = [queue.Queue(self.prefetch + 1) for _ in range(n)]
        ready: list[queue.Queue[Any]] = [queue.Queue(self.prefetch) for _ in range(n)]
        stop = _Stop()
        self.timings = timings = StageTimings()
        # The DataLoader forks its workers here, in the caller's thread: forking from a
        # second thread while the caller's runs could copy a lock that thread holds.
        batches = iter(self.loader)
        # A thread takes batch N+2 from the loader (the hand-off: waiting on the workers'
        # queue, mapping the shared memory) while batch N+1 decodes: one thread doing
        # both ran at 1 / (1 / hand-off + 1 / decode). With two decoding threads, one
        # resizes its batch (and waits for the GIL) while the other is in the decoder.
        threads = [
            threading.Thread(
                target=self._fetch,
                args=(batches, fetched, stop, timings),
                name="indextar-fetch",
                daemon=True,
            )
        ]
        threads += [
            threading.Thread(
                target=self._produce,
                args=(fetched[k], ready[k], stop, timings),
                name="indextar-on-gpu" if n == 1 else f"indextar-on-gpu-{k}",
                daemon=True,
            )
            for k in range(n)
        ]
        try:
            for thread in threads:
                thread.start()
            for turn in itertools.count():
                since = time.perf_counter()
                item = ready[turn % n].get()
                timings.waited_s += time.perf_counter() - since
                if item is _END:
                    return
                if isinstance(item, _Failure):
                    raise item.error
                batch, event = item
                if event is not None:
                    _hand_over(batch, event, self.stage.device)
                yield batch
        finally:
            # The DataLoader's SIGCHLD handler raises its "worker exited unexpectedly" in
            # this thread wherever it is, and more than once (a signal each worker that
            # ends). So stopping takes no lock a raise could leave taken (a flag; no
            # join(), which, interrupted while the thread runs, marks it ended), is
            # inside the try, and is taken again until every thread has ended; what was
            # raised meanwhile is raised after.
            raised: BaseException | None = None
            while True:
                try:
                    stop.set()
                    while any(thread.is_alive() for thread in threads):
                        time.sleep(_POLL_S / 10)
                    break
                except BaseException as e:  # noqa: BLE001 - raised below, once they end
                    raised = raised or e
            if raised is not None:
                raise raised

    @staticmethod
    def _fetch(
        batches: Iterator[EncodedBatch],
        fetched: list[queue.Queue[Any]],
        stop: _Stop,
        timings: StageTimings,
    ) -> None:
        turn = 0
        try:
            while True:
                started = time.perf_counter()
                encoded = next(batches, _END)
                timings.fetch_s += time.perf_counter() - started
                if encoded is _END:
                    break
                if not _put(fetched[turn % len(fetched)], encoded, stop):
                    return
                turn += 1
                del encoded  # not held while the loader waits: its block can be reused
            for k in range(len(fetched)):  # each decoding thread ends; the caller meets
                _put(fetched[(turn + k) % len(fetched)], _END, stop)  # the first in turn
        except BaseException as e:  # handed to the caller's thread, raised there
            _put(fetched[turn % len(fetched)], _Failure(e), stop)

    def _produce(
        self,
        fetched: queue.Queue[Any],
        ready: queue.Queue[Any],
        stop: _Stop,
        timings: StageTimings,
    ) -> None:
        import torch

        try:
            cuda = self.stage.device.type == "cuda"
            stream = None
            if cuda:
                torch.cuda.set_device(self.stage.device)
                stream = torch.cuda.Stream(self.stage.device)  # type: ignore[no-untyped-call]
            while not stop.is_set():
                waiting = time.perf_counter()
                try:
                    encoded = fetched.get(timeout=_POLL_S)
                except queue.Empty:
                    continue
                finally:
                    started = time.perf_counter()
                    with self._timings_lock:
                        timings.starved_s += started - waiting
                if encoded is _END or isinstance(encoded, _Failure):
                    _put(ready, encoded, stop)
                    return
                with torch.cuda.stream(stream) if stream is not None else nullcontext():
                    batch = self.stage(encoded)
                    encoded = None  # its bytes are read: the worker may reuse its block
                    event = None
                    if stream is not None:
                        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
                        event.record(stream)
                with self._timings_lock:  # decoding threads add to one record
                    timings.decode_s += time.perf_counter() - started
                    timings.batches += 1
                if not _put(ready, (batch, event), stop):
                    return
        except BaseException as e:  # handed to the caller's thread, raised there
            _put(ready, _Failure(e), stop)


def _put(into: queue.Queue[Any], item: Any, stop: _Stop) -> bool:
    """Put ``item`` unless ``stop`` is set first; whether it was put."""
    while not stop.is_set():
        try:
            into.put(item, timeout=_POLL_S)
            return True
        except queue.Full:
            pass
    return False


def _hand_over(batch: Any, event: torch.cuda.Event, device: torch.device) -> None:
    """Make the caller's stream wait for ``batch``'s decode, and keep its memory from
    being reused until the caller's stream is done with it."""
    import torch

    current = torch.cuda.current_stream(device)
    current.wait_event(event)

    def record(item: Any) -> Any:
        if isinstance(item, torch.Tensor) and item.is_cuda:
            item.record_stream(current)
        return item

    map_leaves(record, batch)


def on_gpu(
    loader: Iterable[EncodedBatch],
    size: int | tuple[int, int] | None = 256,
    *,
    fit: Fit = "crop",
    resample: str = "bilinear",
    orient: bool = True,
    device: str | torch.device | None = None,
    backend: StageBackend = "auto",
    jpeg_backend: JpegBackend = "auto",
    pin_memory: bool = False,
    normalize: tuple[Sequence[float], Sequence[float]] | None = None,
    dtype: torch.dtype | None = None,
    prefetch: int = 1,
    decoders: int = 2,
) -> StagedLoader:
    """Iterate over ``loader``'s batches with their images decoded and resized on the GPU.

    ``loader`` is a DataLoader whose ``collate_fn`` is :func:`encoded_collate`: its
    workers only read each sample's encoded image. Each batch comes back shaped as its
    samples (a tuple, a dict, or the images alone) with a uint8 NCHW tensor on
    ``device`` in the image's place (float, with ``normalize``) and the other tensors
    moved there too::

        loader = DataLoader(ds, batch_size=64, num_workers=4, collate_fn=encoded_collate())
        for images, labels in on_gpu(loader, size=(224, 224)):
            ...

    Parameters
    ----------
    size, fit, resample, orient
        As :func:`image_decoder`: the same sizes and shapes. On the GPU ``resample`` is
        ``nearest``, ``bilinear`` or ``bicubic``. An int ``size`` keeps each image's
        aspect, so a batch of mixed aspects comes back as a list of CHW tensors.
    device
        Where the images go; default ``"cuda"`` where CUDA is present, else ``"cpu"``.
    backend
        ``"nvjpeg"`` (``torchvision.io.decode_jpeg`` on the GPU), ``"dali"``
        (``nvidia-dali``'s mixed decoder), ``"cpu"`` (``image_decoder``), or ``"auto"``:
        nvjpeg where CUDA and torchvision are present, else cpu. ``"reference"`` is the
        GPU path's twin on any device (Pillow's full decode, torch's resize). Images the
        GPU decoder refuses are decoded on the CPU, counted in ``.stage.fallbacks``.
    jpeg_backend
        ``image_decoder``'s ``backend=`` for the images decoded on the CPU.
    pin_memory
        Copy each batch's bytes to pinned memory before the GPU decoder reads them. Off
        by default: torchvision's decoder copies its input to the device itself, and on
        an H100 with 16 cores the pinned copy cost 4 times the CPU (10.6 cores against
        2.5 at 4 workers) for 0.71 of the rate (``tools/bench_gpu.py``).
    normalize, dtype
        ``normalize=(mean, std)``, three numbers each (R, G, B, as fractions of 255, as
        torchvision's ``Normalize`` takes them after ``ToTensor``), gives the images as
        ``(pixels / 255 - mean) / std`` in ``dtype`` (default ``torch.float32``; say
        ``torch.bfloat16`` or ``torch.float16`` for half the bytes), on the decoding
        thread's stream. Without it images are uint8.
    prefetch
        Decoded batches waiting for the caller (1: double buffering), per decoding thread.
    decoders
        Threads decoding batches, in turn (the caller gets them in the loader's order).
        With two, one resizes its batch while the other is in the GPU decoder, which
        decodes one batch at a time: on an H100 with 4 workers, 6,816 and 7,314 images/s
        (medians of two runs) against 5,883 and 6,083 with one (``tools/bench_gpu.py``).
        On the CPU backend each thread decodes on a core of its own.

    Raises
    ------
    DecodeSpecError
        For an unknown ``backend``, a GPU backend without CUDA or its library,
        ``decoders`` under 1, a ``normalize`` that is not three means and three stds
        above 0 (or a ``dtype`` without it), or an argument ``image_decoder`` refuses.
    """
    stage = ImageStage(
        size,
        fit=fit,
        resample=resample,
        orient=orient,
        device=device,
        backend=backend,
        jpeg_backend=jpeg_backend,
        pin_memory=pin_memory,
        normalize=normalize,
        dtype=dtype,
    )
    return StagedLoader(loader, stage, prefetch=prefetch, decoders=decoders)
