"""The format fuzz targets of ``tools/fuzz_formats.py`` in a short form: compressed
index tables (seek points, windows, frames), ``.json`` attribute members and parquet
imports. Every case ends in the right answer or an ``IndextarError``; the long runs
and their counts are in docs/reliability.md."""

from __future__ import annotations

import fuzz
import pytest
from fuzz_formats import FORMAT_TARGETS


@pytest.mark.parametrize("target", FORMAT_TARGETS)
def test_format_target_finds_nothing(target: str) -> None:
    result = fuzz.fuzz(seed=0, cases=60, targets=(target,), jobs=1, timeout=20.0)
    assert not result.failures, "\n".join(result.failures[:3])
    counts = result.counts[target]
    assert sum(counts.values()) >= 60, counts
