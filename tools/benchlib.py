"""Timing helpers the benchmark scripts share: one run, the best of several, and cases
interleaved round by round."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["best_of", "interleaved", "timed"]

T = TypeVar("T")


def timed(run: Callable[[], T]) -> tuple[float, T]:
    """Call ``run`` once; return the seconds it took and what it returned."""
    start = time.perf_counter()
    result = run()
    return time.perf_counter() - start, result


def best_of(run: Callable[[], T], repeats: int) -> tuple[float, T]:
    """Call ``run`` ``repeats`` times; return the fastest run's seconds and the last result."""
    runs = [timed(run) for _ in range(repeats)]
    return min(seconds for seconds, _ in runs), runs[-1][1]


def interleaved(cases: dict[str, Callable[[], T]], rounds: int) -> dict[str, list[T]]:
    """Each case's figure ``rounds`` times, round-robin, so that passing load hits every
    case alike: for each case's name, its figures in round order."""
    figures: dict[str, list[T]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, case in cases.items():
            figures[name].append(case())
    return figures
