"""The README's comparison table, measured: how webdataset and wids handle bad shards.

If a new webdataset or wids release changes any of this, this test fails and the
table in README.md must change with it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import webdataset as wds
import wids
from conftest import tar_bytes

import indextar

SAMPLES = {f"s{i:03d}.{ext}": b"%d" % i for i in range(20) for ext in ("cls", "txt")}


def _wids_keys(path: Path, nsamples: int) -> list[str]:
    ds = wids.ShardListDataset([{"url": str(path.resolve()), "nsamples": nsamples}])
    return [ds[i]["__key__"] for i in range(len(ds))]


@pytest.fixture
def shards(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WIDS_CACHE", str(tmp_path / "wids-cache"))
    data = tar_bytes(SAMPLES, "gnu")
    (tmp_path / "ok.tar").write_bytes(data)
    corrupt = bytearray(data)
    corrupt[10 * 1024 + 148 : 10 * 1024 + 156] = b"0000000\0"  # the 11th header's checksum
    (tmp_path / "corrupt.tar").write_bytes(bytes(corrupt))
    (tmp_path / "truncated.tar").write_bytes(data[: 15 * 1024 + 100])
    long_names = {f"{'d' * 120}/s{i:03d}.cls": b"%d" % i for i in range(5)}
    (tmp_path / "long.tar").write_bytes(tar_bytes(long_names, "gnu"))
    utf8 = {f"\u00fc{i:03d}.cls": b"%d" % i for i in range(5)}
    (tmp_path / "utf8.tar").write_bytes(tar_bytes(utf8, "pax"))
    return tmp_path


@pytest.mark.filterwarnings("ignore")
def test_webdataset_stops_silently_at_a_bad_header(shards: Path) -> None:
    assert sum(1 for _ in wds.WebDataset("ok.tar", shardshuffle=False)) == 20
    assert sum(1 for _ in wds.WebDataset("corrupt.tar", shardshuffle=False)) == 5
    assert sum(1 for _ in wds.WebDataset("truncated.tar", shardshuffle=False)) == 8
    with pytest.raises(indextar.ShardFormatError, match="at byte offset 10240"):
        indextar.build_index("corrupt.tar")
    with pytest.raises(indextar.TruncatedShardError, match="at byte offset 15360"):
        indextar.build_index("truncated.tar")


@pytest.mark.filterwarnings("ignore")
def test_wids_misses_bad_headers_and_misreads_names(shards: Path) -> None:
    assert len(_wids_keys(shards / "corrupt.tar", 20)) == 20  # checksums never checked
    with pytest.raises(Exception, match="unpack requires a buffer"):
        _wids_keys(shards / "truncated.tar", 20)
    with pytest.raises(IndexError):
        _wids_keys(shards / "long.tar", 5)
    assert _wids_keys(shards / "utf8.tar", 5)[0] == "?000"  # 'ü000' mangled
    assert indextar.IndexedTarDataset("long.tar")[0]["__key__"] == f"{'d' * 120}/s000"
    assert indextar.IndexedTarDataset("utf8.tar")[0]["__key__"] == "\u00fc000"
    # wids copies even local shards into its cache folder (and never evicts them).
    copies = [p for p in (shards / "wids-cache").iterdir() if p.is_file() and not p.is_symlink()]
    assert any(p.stat().st_size == (shards / "utf8.tar").stat().st_size for p in copies)
