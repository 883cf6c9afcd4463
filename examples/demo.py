"""The README's demo: make a small synthetic image dataset, index it, read it back.

Run it with ``make demo`` (or ``python examples/demo.py [OUT_DIR]``). It writes
WebDataset-style shards of JPEG images with class labels and JSON metadata,
indexes them with the ``indextar`` CLI, then reads random samples straight from
the shards through the index and checks them against what was written.
"""

from __future__ import annotations

import io
import json
import random
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from PIL import Image

SHARDS = 4
SAMPLES_PER_SHARD = 250
CLASSES = ["red", "green", "blue"]


def make_image(label: int, rng: random.Random) -> bytes:
    """A 32x32 JPEG dominated by the class colour."""
    colour = [rng.randrange(0, 80) for _ in range(3)]
    colour[label] = rng.randrange(170, 256)
    buf = io.BytesIO()
    Image.new("RGB", (32, 32), tuple(colour)).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def write_shards(out: Path) -> list[Path]:
    rng = random.Random(0)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for shard in range(SHARDS):
        path = out / f"demo-{shard:06d}.tar"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
            for i in range(SAMPLES_PER_SHARD):
                key = f"sample{shard * SAMPLES_PER_SHARD + i:07d}"
                label = rng.randrange(len(CLASSES))
                members = {
                    "cls": str(label).encode(),
                    "jpg": make_image(label, rng),
                    "json": json.dumps({"class": CLASSES[label], "shard": shard}).encode(),
                }
                for ext, data in members.items():
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size, info.mtime = len(data), 0
                    tf.addfile(info, io.BytesIO(data))
        paths.append(path)
    return paths


def indextar(*args: str) -> None:
    """Run the indextar CLI as a user would, echoing the command."""
    print(f"$ indextar {' '.join(args)}", flush=True)
    subprocess.run([sys.executable, "-m", "indextar", *args], check=True)


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "demo-data")
    start = time.perf_counter()
    shards = write_shards(out)
    total = SHARDS * SAMPLES_PER_SHARD
    print(f"wrote {len(shards)} shards with {total} samples (jpg, cls, json) to {out}/")

    pattern = str(out / f"demo-{{000000..{SHARDS - 1:06d}}}.tar")
    indextar("index", pattern, "--force")
    indextar("info", str(out / "demo-000000.tar"))
    indextar("verify", "-q", pattern)

    import indextar as it
    from indextar.index.members import load_members

    tables = [load_members(it.open_index(path)) for path in shards]
    rng = random.Random(1)
    checked = 0
    for _ in range(100):
        shard_no = rng.randrange(SHARDS)
        table = tables[shard_no]
        i = rng.randrange(len(table))
        sample = {}
        with open(table.shard, "rb") as f:
            for m in table.members_of(i):
                f.seek(int(table.data_offsets[m]))
                sample[table.exts[m]] = f.read(int(table.sizes[m]))
        label = int(sample["cls"])
        meta = json.loads(sample["json"])
        pixel = Image.open(io.BytesIO(sample["jpg"])).convert("RGB").getpixel((16, 16))
        assert meta["class"] == CLASSES[label] and meta["shard"] == shard_no
        assert max(range(3), key=lambda c: pixel[c]) == label, (pixel, label)
        checked += 1
    print(
        f"read {checked} random samples back through the index: labels, metadata and image "
        f"colours all match ({time.perf_counter() - start:.1f} s in all)"
    )


if __name__ == "__main__":
    main()
