"""Write the Mosaic MDS and LitData fixtures of tests/write/test_convert.py with the real writers.

The tests read these formats with indextar's own readers, which import neither library;
the fixtures are written by the libraries themselves so that the tests check indextar
against their real output. Neither library installs beside the project's pinned CPU torch
(Mosaic's package imports torchvision and transformers at import), so they are installed
apart and this script is run by hand, not by the tests::

    pip install --no-deps --target /tmp/convert-peers mosaicml-streaming==0.13.0 \
        litdata==0.2.76 brotli python-snappy cramjam zstd boto3 botocore s3transfer jmespath
    PYTHONPATH=/tmp/convert-peers python tests/data/convert/write_fixtures.py

MDSWriter is imported from its own module, without running the ``streaming`` package's
``__init__`` (which imports the torch-dependent loaders, not the writer's code).
The samples are those of ``fixture_samples`` in tests/write/test_convert.py.
"""

from __future__ import annotations

import importlib.util
import io
import os
import shutil
import sys
import types
from pathlib import Path

HERE = Path(__file__).parent
COUNT = 12


def png(i: int) -> bytes:
    """A small PNG whose pixels depend on ``i``."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (4, 3), (i * 20 % 256, 7, 99)).save(buffer, format="PNG")
    return buffer.getvalue()


def samples() -> list[dict[str, object]]:
    return [
        {"image": png(i), "label": i % 3, "caption": f"sample {i}", "score": i / 4}
        for i in range(COUNT)
    ]


def write_mds(out: Path) -> None:
    root = importlib.util.find_spec("streaming").submodule_search_locations[0]
    for name in ("streaming", "streaming.base", "streaming.base.format", "streaming.base.storage"):
        package = types.ModuleType(name)
        package.__path__ = [os.path.join(root, *name.split(".")[1:])]
        sys.modules[name] = package
    from streaming.base.format.mds.writer import MDSWriter

    columns = {"image": "bytes", "label": "int", "caption": "str", "score": "float64"}
    # size_limit small enough for several shard files
    with MDSWriter(out=str(out), columns=columns, size_limit=800) as writer:
        for sample in samples():
            writer.write(sample)


def write_litdata(out: Path, with_array: bool = False) -> None:
    """Items of bytes and values: LitData stores their chunks as Arrow IPC. With an
    array leaf (a tensor-like leaf), it stores them in its PyTreeLoader layout."""
    import numpy as np
    from litdata.streaming.writer import BinaryWriter

    writer = BinaryWriter(str(out), chunk_size=5)
    for i, sample in enumerate(samples()):
        if with_array:
            sample["pixels"] = np.arange(6, dtype=np.uint8) + i
        writer[i] = sample
    writer.done()
    writer.merge()


if __name__ == "__main__":

    def write_litdata_array(out: Path) -> None:
        write_litdata(out, with_array=True)

    writers = (
        ("mds", write_mds),
        ("litdata", write_litdata),
        ("litdata-array", write_litdata_array),
    )
    for name, write in writers:
        out = HERE / name
        shutil.rmtree(out, ignore_errors=True)
        write(out)
        print(name, sorted(p.name for p in out.iterdir()))
