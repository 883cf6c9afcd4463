"""How many requests the read-ahead keeps in flight against a store that throttles it.

A store asked faster than it will serve says so: S3 answers ``503 SlowDown``, others
``429 Too Many Requests``. Each such answer is retried later by the reading batch
(:mod:`.retry`), but a prefetcher that kept its 128 requests in flight regardless
would go on asking at the rate the store refused, and most of what it sent would be
refused again. :class:`InFlightLimit` sizes what the prefetcher sends as TCP sizes
its window (additive increase, multiplicative decrease): a throttled answer cuts the
limit to :data:`DECREASE` of itself (CUBIC's factor), once a round (only an answer to
a request sent after the last cut cuts it again: the requests already out were sent
at the old rate), and each ``limit`` answers that succeed raise it by one, up to the
most it was given. Against nginx refusing what passed 3,000 GETs a second (2
workers), cutting to 0.7 read 2,649-2,736 samples/s at 1.06 requests a sample,
halving 2,185-2,480 at 1.03 (docs/benchmarks-remote.md). Other failures
(a reset, a 500, a wrong range) are not the store's rate, and leave it alone.

It starts as TCP does, too (slow start): at :data:`INITIAL` in flight, each answer
that succeeds adds one (the limit doubles a round) until the maximum or the first
cut, so a job whose every worker starts at once opens with half the requests against
a store that may refuse them. Measured (2 workers, nginx + 20 ms, 8,000 samples,
three interleaved runs each): starting at 64 cost nothing against starting at 128
(1.02-1.09 s against 1.03-1.10 s), at 16 or 32 about 5% (1.10-1.17 s); against a
store refusing what passes 1,000 GETs a second, 800 samples took 1.28 (0 workers)
and 1.69 (2) requests a sample starting at 64, 1.19 and 1.49 at 16, and 1.68 and
1.97 with no limit at all.
"""

from __future__ import annotations

__all__ = ["DECREASE", "INITIAL", "THROTTLED", "InFlightLimit"]

THROTTLED = frozenset({429, 503})
"""The statuses of a store that asks its client to slow down."""
DECREASE = 0.7
"""What a throttled answer leaves of the limit."""
INITIAL = 64
"""The limit to start at (slow start), where the maximum is higher."""


class InFlightLimit:
    """Requests to keep in flight: ``maximum`` until the store throttles, then AIMD.

    Parameters
    ----------
    maximum
        The most in flight (the prefetcher's ``in_flight``).
    minimum
        The fewest it falls to (never below 1).
    initial
        Where it starts; each success adds one until the first cut (slow start).
    """

    def __init__(self, maximum: int, minimum: int = 2, initial: int = INITIAL) -> None:
        if maximum < 1:
            raise ValueError(f"maximum must be at least 1, got {maximum}")
        self.maximum = maximum
        self.minimum = max(1, min(minimum, maximum))
        self.limit = max(self.minimum, min(initial, maximum))
        self.throttled = 0  # answers that said slow down
        self.cuts = 0  # how often one of them cut the limit
        self._last_cut = float("-inf")
        self._good = 0  # answers that succeeded since the limit last moved

    def answered(self, sent: float, now: float, *, ok: bool, status: int | None) -> None:
        """A request sent at ``sent`` was answered at ``now``: ``ok``, or failed with
        ``status`` (``None``: no HTTP answer)."""
        if ok:
            if self.limit < self.maximum:
                self._good += 1
                if not self.cuts or self._good >= self.limit:  # slow start, then one a round
                    self.limit += 1
                    self._good = 0
        elif status in THROTTLED:
            self.throttled += 1
            if sent >= self._last_cut:
                self.limit = max(self.minimum, int(self.limit * DECREASE))
                self._last_cut = now
                self._good = 0
                self.cuts += 1
