"""InFlightLimit: what the read-ahead keeps in flight against a store that throttles."""

from __future__ import annotations

import pytest

from indextar.source.throttle import InFlightLimit


def test_it_starts_low_and_doubles_a_round_until_the_first_cut() -> None:
    limit = InFlightLimit(128, initial=16)
    assert limit.limit == 16 and InFlightLimit(128).limit == 64  # the default: half
    for _ in range(16):  # a round: every request of it succeeds
        limit.answered(sent=0.0, now=0.1, ok=True, status=None)
    assert limit.limit == 32
    for _ in range(200):
        limit.answered(sent=0.2, now=0.3, ok=True, status=None)
    assert limit.limit == 128  # and no further
    limit.answered(sent=0.4, now=0.5, ok=False, status=503)
    for _ in range(60):  # after a cut: one more a round of successes, not one each
        limit.answered(sent=0.6, now=0.7, ok=True, status=None)
    assert limit.limit == 89


def test_a_throttled_answer_cuts_the_limit_once_a_round() -> None:
    limit = InFlightLimit(128, initial=128)
    limit.answered(sent=0.0, now=1.0, ok=False, status=503)
    assert limit.limit == 89 and limit.cuts == 1  # 0.7 of 128
    # requests sent before that cut were sent at the old rate: they cut nothing more
    for _ in range(50):
        limit.answered(sent=0.5, now=1.1, ok=False, status=503)
    assert limit.limit == 89
    limit.answered(sent=1.2, now=1.3, ok=False, status=429)  # sent after it: again
    assert limit.limit == 62 and limit.cuts == 2 and limit.throttled == 52


def test_only_slow_down_answers_cut_it() -> None:
    limit = InFlightLimit(16)
    for status in (None, 500, 502, 404, 416):  # no answer, a fault, a wrong range...
        limit.answered(sent=1.0, now=2.0, ok=False, status=status)
    assert limit.limit == 16 and limit.cuts == 0 and limit.throttled == 0


def test_successes_grow_it_back_by_one_a_round_up_to_the_maximum() -> None:
    limit = InFlightLimit(8, minimum=2)
    for at in range(10):
        limit.answered(sent=float(at), now=at + 0.5, ok=False, status=503)
    assert limit.limit == 2  # never below the minimum
    grown = []
    for _ in range(100):
        limit.answered(sent=20.0, now=21.0, ok=True, status=None)
        grown.append(limit.limit)
    assert grown[:2] == [2, 3]  # 2 successes at 2 in flight: one more
    assert grown[2:5] == [3, 3, 4]  # then 3 at 3
    assert max(grown) == 8 and grown[-1] == 8  # and never past the maximum


def test_a_maximum_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        InFlightLimit(0)
    assert InFlightLimit(1).minimum == 1
