"""The keyed permutation in C (``_permute.c``) against the numpy reference.

``order_extensions.permute()`` is the C code unless ``INDEXTAR_PURE_PYTHON`` is set; then
``KeyedPermutation.permute`` and ``permute_grouped`` run in numpy. Both must give the
same elements bit for bit, since saved sampler states name positions in these orders.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from indextar import native
from indextar.order import extensions as order_extensions
from indextar.order.mixture import MixtureOrder
from indextar.order.permutation import (
    KeyedPermutation,
    _permute_grouped_numpy,
    derive_round_keys,
    permute_grouped,
)

assert native.built()["_permute"], "the C permutation did not build"

# Around powers of two (no cycle walking, or nearly every element walking), tiny ones
# (the 2-bit minimum domain) and the largest size allowed.
EDGE_SIZES = [1, 2, 3, 4, 5, 7, 8, 9, 61440, 65535, 65536, 65537, 10**8, 2**40 + 1, 2**62 - 1]


def pure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(native.PURE_PYTHON_ENV, "1")
    assert order_extensions.permute() is None


@pytest.fixture(autouse=True)
def c_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with the C code, even in a run with ``INDEXTAR_PURE_PYTHON``."""
    monkeypatch.delenv(native.PURE_PYTHON_ENV, raising=False)
    assert order_extensions.permute() is not None


def random_positions(rng: np.random.Generator, size: int, count: int) -> np.ndarray:
    return rng.integers(0, size, count, dtype=np.int64)


@pytest.mark.parametrize("size", EDGE_SIZES)
def test_permute_equals_numpy(size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(size % 1000)
    perm = KeyedPermutation.from_seed(size, int(rng.integers(2**63)), 7, size)
    positions = random_positions(rng, size, 5000)
    fast = perm.permute(positions)
    pure(monkeypatch)
    assert fast.dtype == np.int64
    assert np.array_equal(fast, perm.permute(positions))


@settings(max_examples=60, deadline=None)
@given(
    size=st.integers(1, 2**62 - 1),
    seed=st.integers(0, 2**64 - 1),
    data=st.data(),
)
def test_permute_equals_numpy_on_random_inputs(size: int, seed: int, data: st.DataObject) -> None:
    positions = np.array(
        data.draw(st.lists(st.integers(0, size - 1), min_size=0, max_size=50)), dtype=np.int64
    )
    perm = KeyedPermutation.from_seed(size, seed)
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(native.PURE_PYTHON_ENV, raising=False)
        fast = perm.permute(positions)
        pure(patch)
        assert np.array_equal(fast, perm.permute(positions))


def test_permute_whole_range_is_a_bijection_in_both() -> None:
    perm = KeyedPermutation.from_seed(1000, seed=3)
    assert sorted(perm.permute(np.arange(1000)).tolist()) == list(range(1000))


def test_permute_takes_other_integer_dtypes_and_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    perm = KeyedPermutation.from_seed(200, seed=5)
    positions = np.arange(200, dtype=np.uint8).reshape(10, 20)
    fast = perm.permute(positions)
    pure(monkeypatch)
    assert fast.shape == (10, 20)
    assert np.array_equal(fast, perm.permute(positions))


@pytest.mark.parametrize("bad", [-1, 100, 2**40])
def test_permute_out_of_range_says_so_either_way(bad: int, monkeypatch: pytest.MonkeyPatch) -> None:
    perm = KeyedPermutation.from_seed(100, seed=1)
    positions = np.array([3, bad, 5], dtype=np.int64)
    with pytest.raises(ValueError, match=r"positions must be in \[0, 100\)") as fast:
        perm.permute(positions)
    pure(monkeypatch)
    with pytest.raises(ValueError) as reference:
        perm.permute(positions)
    assert str(fast.value) == str(reference.value)


def grouped_case(rng: np.random.Generator, groups: int, count: int) -> tuple[np.ndarray, ...]:
    sizes = rng.choice(EDGE_SIZES, groups).astype(np.int64)
    keys = np.array([derive_round_keys(int(rng.integers(2**63)), g) for g in range(groups)])
    group = rng.integers(0, groups, count, dtype=np.int64)
    positions = (rng.random(count) * sizes[group]).astype(np.int64)
    return positions, group, sizes, keys.astype(np.uint64)


@pytest.mark.parametrize("seed", range(8))
def test_permute_grouped_equals_numpy(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(seed)
    positions, group, sizes, keys = grouped_case(rng, int(rng.integers(1, 200)), 20_000)
    fast = permute_grouped(positions, group, sizes, keys)
    assert np.array_equal(fast, _permute_grouped_numpy(positions, group, sizes, keys))
    pure(monkeypatch)
    assert np.array_equal(fast, permute_grouped(positions, group, sizes, keys))
    for g in np.unique(group)[:5].tolist():  # and each group as its own permutation
        mine = group == g
        alone = KeyedPermutation(int(sizes[g]), tuple(int(k) for k in keys[g]))
        assert np.array_equal(fast[mine], alone.permute(positions[mine]))


def test_permute_grouped_empty_and_bad_input() -> None:
    rng = np.random.default_rng(0)
    positions, group, sizes, keys = grouped_case(rng, 3, 10)
    empty = np.empty(0, dtype=np.int64)
    assert permute_grouped(empty, empty, sizes, keys).size == 0
    c_code = order_extensions.permute()
    assert c_code is not None
    values = positions.astype(np.uint64)
    with pytest.raises(ValueError, match="out of range"):
        c_code.permute_grouped(values, group, sizes * 0 + 1, keys)
    with pytest.raises(ValueError, match="group 3"):
        c_code.permute_grouped(values, np.full(10, 3, dtype=np.int64), sizes, keys)
    with pytest.raises(ValueError, match="round keys"):
        c_code.permute_grouped(values, group, sizes, keys[:2])


def test_mixture_order_is_the_same_without_the_c_code(monkeypatch: pytest.MonkeyPatch) -> None:
    order = MixtureOrder(
        part_sizes=(1000, 37, 100_000, 5),
        counts=(3000, 500, 150_000, 0),
        drawn_before=(2500, 90, 0, 3),
        seed=11,
        epoch=2,
    )
    positions = np.concatenate([np.arange(3, 153_500, 7), [153_499, 0, 61_440, 61_439]])
    fast = order.indices(positions)
    pure(monkeypatch)
    reference = MixtureOrder(
        part_sizes=order.part_sizes,
        counts=order.counts,
        drawn_before=order.drawn_before,
        seed=order.seed,
        epoch=order.epoch,
    )
    assert np.array_equal(fast, reference.indices(positions))


def mixture_case(rng: np.random.Generator) -> MixtureOrder:
    """Up to 120 parts: some empty, some tiny (their draws cross passes inside a
    window), some large; counts that up- and downsample them."""
    parts = int(rng.choice([1, 2, 3, 7, 120]))
    kind = rng.integers(0, 3, parts)
    sizes = np.where(kind == 0, 0, np.where(kind == 1, rng.integers(1, 60, parts),
                                            rng.integers(1, 300_000, parts)))  # fmt: skip
    if not sizes.any():
        sizes[0] = 3
    counts = np.where(sizes > 0, rng.integers(0, 200_000, parts), 0)
    if not counts.any():
        counts[int(np.flatnonzero(sizes)[0])] = 1
    return MixtureOrder(
        part_sizes=tuple(sizes.tolist()),
        counts=tuple(counts.tolist()),
        drawn_before=tuple(rng.integers(0, 10**7, parts).tolist()),
        seed=int(rng.integers(2**63)),
        epoch=int(rng.integers(0, 1000)),
    )


@pytest.mark.parametrize("seed", range(12))
def test_mixture_window_equals_the_numpy_order(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``mixture_window`` (one C call a window) gives the numpy path's indices: dense
    runs as the sampler asks, scattered and unsorted positions, crossing passes."""
    rng = np.random.default_rng(seed)
    order = mixture_case(rng)
    length = sum(order.counts)
    dense = np.arange(int(rng.integers(0, length)), length, dtype=np.int64)[:70_000]
    scattered = rng.integers(0, length, 3000)
    fast = [order.indices(dense), order.indices(scattered)]
    pure(monkeypatch)
    reference = MixtureOrder(order.part_sizes, order.counts, order.drawn_before,
                             seed=order.seed, epoch=order.epoch)  # fmt: skip
    assert np.array_equal(fast[0], reference.indices(dense))
    assert np.array_equal(fast[1], reference.indices(scattered))


def test_mixture_window_bad_input_says_what() -> None:
    c_code = order_extensions.permute()
    assert c_code is not None
    keys = np.array(derive_round_keys(1, 2), dtype=np.uint64)
    part_keys = np.tile(keys, 2)
    composition = np.array([0, 4, 10], dtype=np.int64)
    args = (composition, np.array([0, -4], dtype=np.int64), np.array([5, 6], dtype=np.int64),
            part_keys, np.array([0, 5], dtype=np.int64))  # fmt: skip
    values = np.arange(100, 110, dtype=np.int64)
    owners = np.empty_like(values)
    c_code.mixture_window(values, owners, 100, 10, keys, *args)
    assert np.array_equal(np.bincount(owners, minlength=2), [4, 6])
    assert set(values[owners == 0].tolist()) <= set(range(5))
    assert set(values[owners == 1].tolist()) <= set(range(5, 11))
    with pytest.raises(ValueError, match=r"position 99 at \[0\] is not in \[100, 110\)"):
        c_code.mixture_window(np.array([99], dtype=np.int64), owners[:1], 100, 10, keys, *args)
    with pytest.raises(ValueError, match="composition must run from 0 to the width 11"):
        c_code.mixture_window(values.copy(), owners, 100, 11, keys, *args)
    with pytest.raises(ValueError, match="past its pass"):
        shifted = (composition, np.array([3, -4], dtype=np.int64), *args[2:])
        c_code.mixture_window(np.arange(100, 110, dtype=np.int64), owners, 100, 10, keys, *shifted)
    with pytest.raises(ValueError, match="window keys"):
        c_code.mixture_window(np.arange(100, 110, dtype=np.int64), owners, 100, 10, keys[:3], *args)
    with pytest.raises(ValueError, match=r"sizes must be in \[1, 2\*\*62\); got 0 at \[1\]"):
        unsized = (*args[:2], np.array([5, 0], dtype=np.int64), *args[3:])
        c_code.mixture_window(np.arange(100, 110, dtype=np.int64), owners, 100, 10, keys, *unsized)
    with pytest.raises(ValueError, match="composition decreases at part 1"):
        backwards = (np.array([0, 11, 10], dtype=np.int64), *args[1:])
        values = np.arange(100, 110, dtype=np.int64)
        c_code.mixture_window(values, owners, 100, 10, keys, *backwards)
