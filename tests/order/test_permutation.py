"""KeyedPermutation: a bijection for every size, uniform-looking, bit-exact."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from indextar.order.permutation import ROUNDS, KeyedPermutation, derive_round_keys


def chi_square(counts: np.ndarray, expected: float) -> float:
    return float(((counts - expected) ** 2 / expected).sum())


def chi_square_bound(dof: int) -> float:
    """About 8 standard deviations above the mean: never reached by a sound mixer.

    The tests are deterministic (fixed seeds, bit-exact arithmetic), so they cannot
    flake; the bound only has to catch a broken construction.
    """
    return dof + 8 * math.sqrt(2 * dof)


@pytest.mark.parametrize("seed", [0, 1, 2**64 - 1])
def test_every_size_up_to_2000_is_a_permutation(seed: int) -> None:
    for size in range(1, 2001):
        out = KeyedPermutation.from_seed(size, seed, size).permute(np.arange(size))
        assert np.array_equal(np.sort(out), np.arange(size)), size


@pytest.mark.parametrize("bits", [20, 33, 40])
@pytest.mark.parametrize("offset", [-1, 0, 1])
def test_large_sizes_are_injective_on_a_sample(bits: int, offset: int) -> None:
    size = 2**bits + offset
    positions = np.random.default_rng(bits).choice(size, 50_000, replace=False)
    positions = np.concatenate((positions, [0, size - 1]))
    out = KeyedPermutation.from_seed(size, 7, 0).permute(positions)
    assert out.min() >= 0 and out.max() < size
    assert np.unique(out).size == np.unique(positions).size


def test_size_1e12_is_in_range_and_injective() -> None:
    size = 10**12
    positions = np.arange(size - 200_000, size)
    out = KeyedPermutation.from_seed(size, 3, 1).permute(positions)
    assert out.min() >= 0 and out.max() < size and np.unique(out).size == positions.size


@settings(max_examples=40, deadline=None)
@given(size=st.integers(1, 10**12), seed=st.integers(0, 2**64 - 1), data=st.data())
def test_any_size_maps_distinct_positions_to_distinct_indices(
    size: int, seed: int, data: st.DataObject
) -> None:
    positions = data.draw(st.sets(st.integers(0, size - 1), min_size=1, max_size=64))
    out = KeyedPermutation.from_seed(size, seed).permute(np.array(sorted(positions)))
    assert len(set(out.tolist())) == len(positions)
    assert all(0 <= value < size for value in out.tolist())


def test_first_element_is_uniform_over_seeds_small_size() -> None:
    size, draws = 7, 7000
    firsts = [
        KeyedPermutation.from_seed(size, seed).permute(np.zeros(1, np.int64))[0]
        for seed in range(draws)
    ]
    counts = np.bincount(firsts, minlength=size)
    assert chi_square(counts, draws / size) < chi_square_bound(size - 1)


def test_first_element_is_uniform_over_seeds_large_size() -> None:
    size, draws, bins = 10**10 + 7, 4000, 20
    firsts = np.array(
        [
            KeyedPermutation.from_seed(size, seed, 5).permute(np.array([0]))[0]
            for seed in range(draws)
        ]
    )
    counts = np.bincount(firsts * bins // size, minlength=bins)
    assert chi_square(counts, draws / bins) < chi_square_bound(bins - 1)


def test_positions_of_one_permutation_spread_uniformly() -> None:
    size, bins = 10**10, 100
    out = KeyedPermutation.from_seed(size, 11).permute(np.arange(200_000))
    counts = np.bincount(out * bins // size, minlength=bins)
    assert chi_square(counts, out.size / bins) < chi_square_bound(bins - 1)
    # Neighbouring positions must not land near each other: for independent uniform
    # draws the median distance is (1 - 1/sqrt(2)) * size, about 0.29 * size.
    assert np.median(np.abs(np.diff(out))) > size / 4


def test_every_element_is_uniform_over_positions_for_a_mid_size() -> None:
    """Where element e lands, over many keys: uniform for each e (a 2-d check)."""
    size, keys = 12, 6000
    landing = np.zeros((size, size), dtype=np.int64)  # landing[element, position]
    for key in range(keys):
        out = KeyedPermutation.from_seed(size, 99, key).permute(np.arange(size))
        landing[out, np.arange(size)] += 1
    for element in range(size):
        assert chi_square(landing[element], keys / size) < chi_square_bound(size - 1)


def test_different_tweaks_give_different_orders() -> None:
    orders = {
        tuple(KeyedPermutation.from_seed(1000, 0, epoch).permute(np.arange(20)).tolist())
        for epoch in range(50)
    }
    assert len(orders) == 50


def test_round_keys_are_bit_exact() -> None:
    assert derive_round_keys(0, 1, 0)[:2] == (15870028893343988890, 2790187308977679609)
    assert len(derive_round_keys(-1)) == ROUNDS
    assert derive_round_keys(-1) == derive_round_keys(2**64 - 1)


def test_fixed_orders_are_bit_exact() -> None:
    small = KeyedPermutation.from_seed(10, 0, 1, 0).permute(np.arange(10)).tolist()
    assert small == [7, 5, 0, 3, 8, 2, 4, 9, 6, 1]
    huge = KeyedPermutation.from_seed(10**10, 42, 1, 3).permute(np.arange(4)).tolist()
    assert huge == [2668816908, 5492381421, 6031253260, 2161054801]


def test_shape_and_dtype_are_kept() -> None:
    perm = KeyedPermutation.from_seed(100, 1)
    out = perm.permute(np.arange(12, dtype=np.uint32).reshape(3, 4))
    assert out.shape == (3, 4) and out.dtype == np.int64
    assert perm.permute(np.array([], dtype=np.int64)).size == 0


@pytest.mark.parametrize(
    ("positions", "error"),
    [([0, 100], ValueError), ([-1], ValueError), ([0.5], TypeError)],
)
def test_bad_positions_are_refused(positions: list[float], error: type[Exception]) -> None:
    with pytest.raises(error, match="positions"):
        KeyedPermutation.from_seed(100, 1).permute(np.array(positions))


@pytest.mark.parametrize("size", [0, -3, 2**62])
def test_bad_sizes_are_refused(size: int) -> None:
    with pytest.raises(ValueError, match="size"):
        KeyedPermutation.from_seed(size, 1)


def test_bad_keys_are_refused() -> None:
    with pytest.raises(ValueError, match="round keys"):
        KeyedPermutation(10, (1, 2))
    with pytest.raises(ValueError, match="tweak"):
        derive_round_keys(0, -1)


@settings(max_examples=300, derandomize=True, deadline=None)
@given(
    size=st.one_of(st.integers(1, 70), st.integers(1, 2**62 - 1)),
    seed=st.integers(0, 2**64 - 1),
    fraction=st.floats(0, 1, exclude_max=True),
)
def test_position_of_inverts_permute(size: int, seed: int, fraction: float) -> None:
    perm = KeyedPermutation.from_seed(size, seed, 9)
    position = min(int(fraction * size), size - 1)
    element = int(perm.permute(np.array([position], dtype=np.int64))[0])
    assert perm.position_of(element) == position


def test_position_of_refuses_elements_outside_the_range() -> None:
    perm = KeyedPermutation.from_seed(10, 0)
    assert sorted(perm.position_of(e) for e in range(10)) == list(range(10))
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        perm.position_of(10)
