"""The C grouping (indextar/_tarwalk.c) against the numpy and regex reference."""

from __future__ import annotations

import numpy as np
from conftest import tar_bytes
from hypothesis import given, settings
from hypothesis import strategies as st

from indextar import scan_tar
from indextar.naming import _group_c, _group_numpy, group_members

_name_lists = st.lists(
    st.text(alphabet=st.sampled_from(list("ab_./\nÄ日AB")), min_size=1, max_size=10),
    max_size=30,
)
_simple_names = st.lists(
    st.from_regex(r"[a-zA-Z0-9Ä日/]{0,6}[a-zA-Z0-9Ä日]\.[a-zA-Z.Ä]{0,5}", fullmatch=True),
    max_size=30,
)


def _same_groups(names: list[str]) -> bool:
    """Whether the C grouping took the names; if it did, it must equal the reference."""
    rows = np.arange(len(names), dtype=np.int64)
    fast = _group_c(names, rows)
    if fast is None:
        return False
    reference = _group_numpy(names, rows, skipped := [])
    assert skipped == []
    assert fast[0].tolist() == reference[0].tolist()  # member rows
    assert fast[1].tolist() == reference[1].tolist()  # each sample's first member
    assert fast[2] == reference[2]  # sample keys
    # The same extension for every member, whatever order each lists them in.
    assert [fast[3][c] for c in fast[4].tolist()] == [reference[3][c] for c in reference[4]]
    return True


@settings(max_examples=400, derandomize=True, deadline=None)
@given(_name_lists)
def test_c_grouping_equals_the_reference_or_declines(names: list[str]) -> None:
    _same_groups(names)


@settings(max_examples=200, derandomize=True, deadline=None)
@given(_simple_names)
def test_c_grouping_takes_every_simple_name(names: list[str]) -> None:
    assert _same_groups(names)  # the common case never falls back


def test_c_grouping_declines_over_256_extensions_and_the_result_is_the_same() -> None:
    names = [f"s{i}.e{i}" for i in range(300)]
    rows = np.arange(300, dtype=np.int64)
    assert _group_c(names, rows) is None
    buf = tar_bytes({name: b"x" for name in names})
    grouping = group_members(scan_tar(buf))
    assert len(grouping.ext_names) == 300 and grouping.keys == [f"s{i}" for i in range(300)]
