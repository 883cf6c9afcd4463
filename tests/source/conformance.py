"""One conformance suite for every :class:`~indextar.source.base.ByteSource`.

Written once, run over every source, as zarr-python's ``zarr/testing/store.py`` and
fsspec's ``tests/abstract/`` do: a subclass of :class:`ByteSourceConformance` provides
a ``source`` fixture (class scope: built once, shared by the class's tests, including
hypothesis's examples), the bytes it must serve (``expected``) and a ``changing``
fixture (a source of its own copy, and what changes that copy); every test here then
runs on it. ``tests/source/test_source_conformance.py`` has the subclasses.

The contract, as the sources keep it today:

* ``size`` is the number of bytes; ``read(offset, length)`` is exactly those bytes, for
  any range inside ``[0, size]``, at either edge, one byte or all of them;
  ``read_many`` is the reads, in order;
* an empty read inside the shard is ``b""``;
* a range that runs past the end, or starts before 0, raises ``past_end`` (a
  :class:`~indextar.errors.TruncatedShardError` for local and decompressed bytes, a
  :class:`~indextar.errors.RemoteReadError` for ranged remote reads): never short bytes;
* once the bytes under a source change, ``check_unchanged()`` or the next read raises
  :class:`~indextar.errors.StaleIndexError` or
  :class:`~indextar.errors.TruncatedShardError`;
* a source pickles into a spawned or forked process, and a forked child can use the
  one it inherited (a DataLoader worker's case), and reads the same bytes there; two
  sources of one shard read side by side, and the parent's still reads after its
  children opened theirs;
* reads from many threads at once are each exact.

Where a source breaks the contract today, its subclass names the test in
``known_failures``, with the error it fails with and why: the test is then an xfail
that must fail with that error (any other failure fails the run), and shows as XPASS
once fixed, when the entry goes. Not strict: some of these depend on timestamps a
few milliseconds apart.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import pickle
import random
from collections.abc import Callable, Sequence
from multiprocessing.pool import Pool
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from indextar.errors import IndextarError, StaleIndexError, TruncatedShardError
from indextar.source.base import ByteSource

Ranges = Sequence[tuple[int, int]]

# Few examples, derandomized: each is one read (one request for a remote source), and
# the suite runs over six sources on a shared 2-core machine.
EXAMPLES = settings(
    max_examples=15,
    derandomize=True,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.differing_executors,  # one test method, run by each subclass
        HealthCheck.function_scoped_fixture,  # a source is meant to serve many reads
    ],
)


def read_ranges(source: ByteSource, ranges: Ranges) -> list[bytes]:
    """Each range of ``source`` (what a spawned or forked child runs)."""
    return [source.read(offset, length) for offset, length in ranges]


def _read_in_forked_child(source: ByteSource, ranges: Ranges, sender: Any) -> None:
    try:
        sender.send(read_ranges(source, ranges))
    except Exception as e:  # raised again in the parent
        try:
            sender.send(e)
        except Exception:  # not picklable: the parent's assertion shows it
            sender.send(repr(e))


def edge_ranges(size: int, seed: int = 0, count: int = 24) -> list[tuple[int, int]]:
    """The edges of a ``size``-byte shard (its first and last byte, a tar block on each
    side of 512, all of it) and ``count`` seeded ranges in between."""
    rng = random.Random(seed)
    ranges = [(0, 1), (size - 1, 1), (0, size), (511, 2), (size - 512, 512), (1, size - 1)]
    for _ in range(count):
        length = rng.choice([1, 7, 512, 4096, 70_000])
        length = min(length, size)
        ranges.append((rng.randrange(size - length + 1), length))
    return ranges


class ByteSourceConformance:
    """The tests every byte source must pass; subclasses provide the fixtures."""

    past_end: tuple[type[IndextarError], ...] = (TruncatedShardError,)
    """What a read past the end (or before 0) raises."""
    known_failures: ClassVar[dict[str, tuple[type[Exception], str]]] = {}
    """Test name -> the error this source fails it with today, and why."""

    @pytest.fixture(autouse=True)
    def _known_failure(self, request: pytest.FixtureRequest) -> None:
        known = self.known_failures.get(request.node.originalname)
        if known:
            request.applymarker(pytest.mark.xfail(raises=known[0], reason=known[1]))

    @pytest.fixture(scope="class")
    @classmethod
    def expected(cls) -> bytes:
        """The bytes ``source`` must serve."""
        raise NotImplementedError

    @pytest.fixture(scope="class")
    @classmethod
    def source(cls, expected: bytes) -> ByteSource:
        """The source under test, built once for the class."""
        raise NotImplementedError

    @pytest.fixture
    def changing(self, expected: bytes) -> tuple[ByteSource, Callable[[], None]]:
        """A source of its own copy of ``expected``, and what changes that copy in place
        (or replaces the object, for a remote one)."""
        raise NotImplementedError

    # -- sizes and ranges ----------------------------------------------------------------

    def test_size(self, source: ByteSource, expected: bytes) -> None:
        assert source.size == len(expected)

    def test_ranges_at_the_edges(self, source: ByteSource, expected: bytes) -> None:
        for offset, length in edge_ranges(len(expected)):
            got = source.read(offset, length)
            assert got == expected[offset : offset + length], (offset, length)

    def test_read_many_is_the_reads_in_order(self, source: ByteSource, expected: bytes) -> None:
        ranges = edge_ranges(len(expected), seed=1)[::-1]  # out of order, overlapping
        got = source.read_many([o for o, _ in ranges], [n for _, n in ranges])
        assert got == [expected[o : o + n] for o, n in ranges]
        assert source.read_many([], []) == []

    def test_empty_reads(self, source: ByteSource, expected: bytes) -> None:
        size = len(expected)
        for offset in (0, 1, size // 2, size):
            assert source.read(offset, 0) == b"", offset

    def test_reads_past_the_end_are_refused(self, source: ByteSource, expected: bytes) -> None:
        size = len(expected)
        for offset, length in [(size - 10, 11), (size - 1, 2), (size, 1), (size + 512, 5)]:
            with pytest.raises(self.past_end):
                source.read(offset, length)
        with pytest.raises(self.past_end):
            source.read(-1, 5)

    @EXAMPLES
    @given(data=st.data())
    def test_any_range(self, source: ByteSource, expected: bytes, data: st.DataObject) -> None:
        size = len(expected)
        offset = data.draw(st.integers(0, size - 1), label="offset")
        length = data.draw(st.integers(1, size - offset), label="length")
        assert source.read(offset, length) == expected[offset : offset + length]

    @EXAMPLES
    @given(data=st.data())
    def test_any_range_past_the_end(
        self, source: ByteSource, expected: bytes, data: st.DataObject
    ) -> None:
        size = len(expected)
        offset = data.draw(st.integers(0, size + 1024), label="offset")
        length = data.draw(st.integers(max(1, size - offset + 1), size + 2048), label="length")
        with pytest.raises(self.past_end):
            source.read(offset, length)

    @EXAMPLES
    @given(data=st.data())
    def test_any_batch(self, source: ByteSource, expected: bytes, data: st.DataObject) -> None:
        size = len(expected)
        offsets = data.draw(st.lists(st.integers(0, size - 1), max_size=6), label="offsets")
        lengths = [data.draw(st.integers(1, size - o), label="length") for o in offsets]
        got = source.read_many(offsets, lengths)
        assert got == [expected[o : o + n] for o, n in zip(offsets, lengths)]

    # -- a changed shard -----------------------------------------------------------------

    def test_a_changed_source_is_refused(
        self, changing: tuple[ByteSource, Callable[[], None]], expected: bytes
    ) -> None:
        source, change = changing
        assert source.read(0, 1024) == expected[:1024]  # opened, as a reader would have it
        source.check_unchanged()
        change()
        with pytest.raises((StaleIndexError, TruncatedShardError)):
            source.check_unchanged()
            source.read(0, 1024)

    # -- other processes and threads -----------------------------------------------------

    def test_pickles_into_a_spawned_process(
        self, source: ByteSource, expected: bytes, spawn_pool: Pool
    ) -> None:
        ranges = edge_ranges(len(expected), seed=2, count=8)
        source.read(0, 1)  # opened here first: nothing opened may travel
        got = spawn_pool.apply(read_ranges, (source, ranges))
        assert got == [expected[o : o + n] for o, n in ranges]
        assert source.read(0, 512) == expected[:512]  # the parent's still reads

    def test_pickles_into_a_forked_process(self, source: ByteSource, expected: bytes) -> None:
        ranges = edge_ranges(len(expected), seed=3, count=8)
        source.read(0, 1)
        with multiprocessing.get_context("fork").Pool(1) as pool:
            got = pool.apply(read_ranges, (source, ranges))
        assert got == [expected[o : o + n] for o, n in ranges]
        assert source.read(0, 512) == expected[:512]

    def test_a_forked_child_reads_the_source_it_inherited(
        self, source: ByteSource, expected: bytes
    ) -> None:
        ranges = edge_ranges(len(expected), seed=4, count=8)
        source.read(0, 1)
        context = multiprocessing.get_context("fork")
        receiver, sender = context.Pipe(duplex=False)
        child = context.Process(target=_read_in_forked_child, args=(source, ranges, sender))
        child.start()
        got = receiver.recv() if receiver.poll(60) else "no answer in 60 s"
        child.join(60)
        if isinstance(got, Exception):
            raise got
        assert got == [expected[o : o + n] for o, n in ranges]
        assert child.exitcode == 0
        # The parent's source still reads after the child used (and closed) its copy.
        assert source.read(0, 512) == expected[:512]

    def test_two_sources_of_one_shard_read_side_by_side(
        self, source: ByteSource, expected: bytes
    ) -> None:
        source.read(0, 1)
        copy = pickle.loads(pickle.dumps(source))  # another worker's, in this process
        assert type(copy) is type(source) and copy.url == source.url
        assert copy.size == len(expected)
        assert copy.read(len(expected) - 600, 600) == expected[-600:]
        assert source.read(600, 600) == expected[600:1200]
        copy.close()
        assert source.read(0, 600) == expected[:600]

    def test_concurrent_reads(self, source: ByteSource, expected: bytes) -> None:
        ranges = edge_ranges(len(expected), seed=5, count=120)
        source.read(0, 1)  # opened first, as a dataset's first sample opens it
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            got = list(pool.map(lambda r: source.read(*r), ranges))
        assert got == [expected[o : o + n] for o, n in ranges]

    def test_closed_source_reopens(self, source: ByteSource, expected: bytes) -> None:
        source.read(0, 1)
        source.close()
        assert source.read(100, 400) == expected[100:500]

    # -- members ---------------------------------------------------------------------------

    def test_headers_that_fail_their_checksums_name_the_sample(
        self, source: ByteSource, expected: bytes
    ) -> None:
        """A span whose first block is not a valid header is refused by read_members and
        read_members_many, names and checksums checked or checksums only (a shard whose
        global PAX header names its members), and the error names the sample by its key
        (for a compressed source, the error it chains), never as sample ''."""
        import io
        import tarfile

        import numpy as np

        with tarfile.open(fileobj=io.BytesIO(expected)) as tar:
            info = tar.getmember("s000007.jpg")
        offset = info.offset_data  # a member's data where its header should be
        rows = np.array([[512, 4, 0]], dtype=np.int64)
        for check_names in (True, False):
            reads = (
                lambda names=check_names: source.read_members(
                    offset, 516, rows, 0, 1, ("jpg",), b"s000007", check_names=names
                ),
                lambda names=check_names: source.read_members_many(
                    [(offset, 516, 0, 1, b"s000007")], rows, ("jpg",), check_names=names
                ),
            )
            for read in reads:
                with pytest.raises(IndextarError) as caught:
                    read()
                chain, error = [], caught.value
                while error is not None:
                    chain.append(str(error))
                    error = error.__cause__
                assert any("'s000007'" in message for message in chain), chain
                assert not any("sample ''" in message for message in chain), chain
