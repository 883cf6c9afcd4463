"""Packs planned from lengths (``order/packing.py``, ``_pack.c``).

Every plan is checked for what a plan must be: each document in it once (its tokens
once, in order, for ``concat-split``), no pack over ``max_length``, and the same plan
from the same ``(seed, epoch)``. The C fits are compared with the Python references
pack for pack.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from indextar import native
from indextar.order import extensions
from indextar.order.packing import STRATEGIES, PackPlan, fit_reference, plan_packs

assert native.built()["_pack"], "the C packing did not build"


@pytest.fixture(autouse=True)
def c_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with the C code, even in a run with ``INDEXTAR_PURE_PYTHON``."""
    monkeypatch.delenv(native.PURE_PYTHON_ENV, raising=False)


def check(plan: PackPlan, lengths: np.ndarray, max_length: int) -> None:
    """Each non-empty document's tokens exactly once (truncated or split), no pack over."""
    sizes = np.add.reduceat(plan.lengths, plan.offsets[:-1]) if len(plan) else np.empty(0)
    assert (sizes <= max_length).all() and (sizes > 0).all()
    assert plan.lengths.min(initial=1) >= 1
    documents = plan.documents.astype(np.int64)
    if plan.starts is None:  # fit: each document once, truncated
        assert np.array_equal(np.sort(documents), np.flatnonzero(lengths > 0))
        assert np.array_equal(plan.lengths, np.minimum(lengths[documents], max_length))
        assert plan.overlong == np.count_nonzero(lengths > max_length)
    else:  # concat-split: each document's tokens once, its pieces in order
        order = np.lexsort((plan.starts, documents))
        docs, starts, pieces = documents[order], plan.starts[order], plan.lengths[order]
        first = np.r_[True, docs[1:] != docs[:-1]][: docs.size]
        assert (starts[first] == 0).all()
        assert (starts[~first] == (starts + pieces)[:-1][~first[1:]]).all()
        assert np.array_equal(np.bincount(docs, pieces, len(lengths)), lengths)
        assert (sizes[:-1] == max_length).all()  # only the last pack pads
    assert plan.empty == np.count_nonzero(lengths == 0)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 300), max_size=400),
    st.integers(1, 200),
    st.sampled_from(STRATEGIES),
    st.integers(0, 3),
)
def test_every_plan_holds_each_document_once(
    lengths: list[int], max_length: int, strategy: str, seed: int
) -> None:
    array = np.asarray(lengths, dtype=np.int64)
    plan = plan_packs(array, max_length, strategy=strategy, seed=seed)  # type: ignore[arg-type]
    check(plan, array, max_length)
    again = plan_packs(array, max_length, strategy=strategy, seed=seed)  # type: ignore[arg-type]
    assert np.array_equal(plan.documents, again.documents)
    assert np.array_equal(plan.offsets, again.offsets)


@pytest.mark.parametrize("best", [True, False])
def test_c_fits_match_the_python_references(best: bool) -> None:
    rng = np.random.default_rng(7)
    for _ in range(20):
        n, max_length = int(rng.integers(0, 2000)), int(rng.integers(1, 5000))
        lengths = rng.integers(1, max_length + 1, n).astype(np.int32)
        order = rng.permutation(n).astype(np.int32)
        scratch, packed = np.empty_like(lengths), np.empty_like(lengths)
        module = extensions.pack()
        assert module is not None
        raw = module.fit_decreasing(lengths, order.copy(), scratch, packed, max_length, best)
        offsets, reference = fit_reference(lengths, order, max_length, best=best)
        assert np.array_equal(np.frombuffer(raw, np.int64), offsets)
        assert np.array_equal(packed, reference)


def test_pure_python_plans_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    lengths = np.random.default_rng(3).integers(1, 900, 3000)
    plans = {}
    for pure in (False, True):
        if pure:
            monkeypatch.setenv(native.PURE_PYTHON_ENV, "1")
        plans[pure] = plan_packs(lengths, 1024, strategy="best-fit", seed=5)
    assert np.array_equal(plans[False].documents, plans[True].documents)
    assert np.array_equal(plans[False].offsets, plans[True].offsets)


@pytest.mark.parametrize(
    "lengths, max_length",
    [
        (np.random.default_rng(4).integers(0, 3000, 5000), 1024),  # empties and overlong
        (np.random.default_rng(5).integers(1, 50, 4000).astype(np.int32), 64),
        (np.array([8, 8, 8]), 8),  # cuts at document ends
        (np.array([0, 0]), 16),  # nothing to pack
        (np.array([5]), 1),
    ],
)
def test_concat_split_in_c_plans_what_numpy_plans(
    monkeypatch: pytest.MonkeyPatch, lengths: np.ndarray, max_length: int
) -> None:
    plans = {}
    for pure in (False, True):
        if pure:
            monkeypatch.setenv(native.PURE_PYTHON_ENV, "1")
        plans[pure] = plan_packs(lengths, max_length, strategy="concat-split", seed=9)
    for field in ("offsets", "documents", "lengths", "starts"):
        c, numpy = getattr(plans[False], field), getattr(plans[True], field)
        assert c.dtype == numpy.dtype and np.array_equal(c, numpy), field
    assert (plans[False].overlong, plans[False].empty) == (plans[True].overlong, plans[True].empty)


def test_best_fit_fills_packs_and_seeds_change_only_who_shares() -> None:
    lengths = np.clip(np.random.default_rng(0).lognormal(5, 1, 20_000), 1, 4096).astype(int)
    a = plan_packs(lengths, 2048, seed=0)
    b = plan_packs(lengths, 2048, seed=0, epoch=1)
    check(a, lengths, 2048)
    # equal lengths trade places: the same packs' sizes, other documents in them
    assert len(a) == len(b) and a.padding == b.padding < 0.001
    assert not np.array_equal(a.documents, b.documents)
    lower_bound = -(-int(np.minimum(lengths, 2048).sum()) // 2048)
    assert len(a) <= lower_bound * 1.01
    assert a.nbytes <= 12 * len(lengths)


def test_concat_split_splits_overlong_documents() -> None:
    lengths = np.array([10, 25, 3, 0, 7])
    plan = plan_packs(lengths, 8, strategy="concat-split", seed=1)
    check(plan, lengths, 8)
    assert (plan.overlong, plan.empty, len(plan)) == (2, 1, 6)


@pytest.mark.parametrize(
    "lengths, max_length, message",
    [
        ([1, -2], 4, "negative"),
        ([1.5], 4, "integers"),
        ([[1]], 4, "1-D"),
        ([1], 0, "max_length"),
        ([1], 1 << 30, "max_length"),
    ],
)
def test_bad_arguments_are_refused(lengths: list, max_length: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_packs(lengths, max_length)
    with pytest.raises(ValueError, match="strategy"):
        plan_packs([1], 4, strategy="worst-fit")  # type: ignore[arg-type]
