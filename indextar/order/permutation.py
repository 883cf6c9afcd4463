"""A keyed pseudorandom permutation of ``range(size)`` for any size, in O(1) memory.

The sampler needs the position → index map of a shuffled epoch without storing it:
``torch.randperm(10**10)`` would take 80 GB. :class:`KeyedPermutation` evaluates that
map on demand, for a numpy chunk of positions at a time.

Construction
------------
1. **Domain.** Let ``n = max(2, (size - 1).bit_length())``, so ``2**n`` is the smallest
   power of two ``>= size`` (at least 4). A position is split into a left half of
   ``ceil(n / 2)`` bits and a right half of ``floor(n / 2)`` bits.
2. **Feistel network.** :data:`ROUNDS` (six) rounds of
   ``(L, R) -> (R, L ^ F_i(R))``. When ``n`` is odd the two halves differ by one bit
   and swap widths every round (an *alternating* unbalanced Feistel network); after an
   even number of rounds they are back where they started. Every round is a bijection
   whatever ``F_i`` is, so the network is a permutation of ``range(2**n)``.
3. **Round function.** With ``w`` the width of the half being xored and all arithmetic
   on uint64, modulo ``2**64``::

       z = (R ^ k_i) * 0x9E3779B97F4A7C15
       z = z ^ (z >> 32)
       z = z * 0xD6E8FEB86659FD93
       F_i(R) = z >> (64 - w)

   Taking the *top* ``w`` bits of a 64-bit product makes every output bit depend on
   every input bit.
4. **Round keys.** ``k_0 .. k_5`` are the 48-byte BLAKE2b digest (personalisation
   ``b"indextar.perm.v1"``) of the little-endian uint64 encodings of ``seed mod 2**64``
   followed by each integer of ``tweak`` (for example the epoch), read as six
   little-endian uint64 words.
5. **Cycle walking.** To permute ``range(size)`` rather than ``range(2**n)``, an output
   ``>= size`` is fed through the network again until it lands below ``size``. This
   restricts the permutation to ``range(size)`` and stays a bijection. Since
   ``2**n < 2 * size`` (for ``size > 4``), fewer than two passes are needed on average.
   Only the elements still out of range are iterated.

Where the C extension is built (:func:`indextar.order.extensions.permute`),
:meth:`KeyedPermutation.permute` and :func:`permute_grouped` run each element through
the network there, in registers; the numpy code below is the reference, and the tests
check that the two agree.

Everything is integer arithmetic with a documented hash, so the same ``(size, seed,
tweak)`` gives the same order on every machine and numpy version. The network is a
pseudorandom permutation (Luby-Rackoff), not a uniform draw from all ``size!``
orders; the tests check that positions are uniform and orders differ between keys.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from . import extensions

__all__ = ["ROUNDS", "KeyedPermutation", "derive_round_keys", "permute_grouped"]

ROUNDS = 6
"""Number of Feistel rounds; even, so the halves end at their starting widths."""

_PERSON = b"indextar.perm.v1"
_MASK64 = (1 << 64) - 1
_MULT_1 = np.uint64(0x9E3779B97F4A7C15)
_MULT_2 = np.uint64(0xD6E8FEB86659FD93)
_SHIFT_32 = np.uint64(32)
_CHUNK = 1 << 15
"""Elements per inner pass: keeps the few temporaries in L2 cache."""


def derive_round_keys(seed: int, *tweak: int) -> tuple[int, ...]:
    """Derive the :data:`ROUNDS` round keys for ``seed`` and ``tweak``.

    Parameters
    ----------
    seed
        Any integer; only ``seed mod 2**64`` is used.
    *tweak
        Integers in ``[0, 2**64)`` that select an independent permutation for the same
        seed (the sampler passes a purpose tag and the epoch).

    Returns
    -------
    tuple of int
        :data:`ROUNDS` integers in ``[0, 2**64)``.
    """
    parts = [seed & _MASK64]
    for value in tweak:
        if not 0 <= value <= _MASK64:
            raise ValueError(f"tweak values must be in [0, 2**64); got {value}")
        parts.append(value)
    message = struct.pack(f"<{len(parts)}Q", *parts)
    digest = hashlib.blake2b(message, digest_size=8 * ROUNDS, person=_PERSON).digest()
    return struct.unpack(f"<{ROUNDS}Q", digest)


@dataclass(frozen=True, slots=True)
class KeyedPermutation:
    """A bijection of ``range(size)`` chosen by ``round_keys``; see the module docstring.

    Parameters
    ----------
    size
        Number of elements, ``>= 1``; any size below ``2**62``.
    round_keys
        :data:`ROUNDS` integers in ``[0, 2**64)``, usually from :meth:`from_seed`.

    Examples
    --------
    >>> perm = KeyedPermutation.from_seed(10, seed=0)
    >>> sorted(perm.permute(np.arange(10)).tolist()) == list(range(10))
    True
    """

    size: int
    round_keys: tuple[int, ...]
    _bits: int = field(init=False, repr=False)
    _keys: tuple[np.uint64, ...] = field(init=False, repr=False)
    _key_array: npt.NDArray[np.uint64] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.size, int) or not 1 <= self.size < 1 << 62:
            raise ValueError(f"size must be an int in [1, 2**62); got {self.size!r}")
        if len(self.round_keys) != ROUNDS:
            raise ValueError(f"need {ROUNDS} round keys; got {len(self.round_keys)}")
        object.__setattr__(self, "_bits", max(2, (self.size - 1).bit_length()))
        object.__setattr__(self, "_keys", tuple(np.uint64(k & _MASK64) for k in self.round_keys))
        object.__setattr__(self, "_key_array", np.array(self._keys, dtype=np.uint64))

    @classmethod
    def from_seed(cls, size: int, seed: int, *tweak: int) -> KeyedPermutation:
        """Build the permutation of ``range(size)`` for ``seed`` and ``tweak``.

        See :func:`derive_round_keys` for the meaning of ``seed`` and ``tweak``.
        """
        return cls(size, derive_round_keys(seed, *tweak))

    def permute(self, positions: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """Map positions in ``[0, size)`` to the elements at those positions.

        Parameters
        ----------
        positions
            Integer array (any shape) of positions in ``[0, size)``.

        Returns
        -------
        numpy.ndarray
            int64 array of the same shape: the permuted elements.
        """
        source = np.asarray(positions)
        if source.dtype.kind not in "iu":
            raise TypeError(f"positions must be integers; got dtype {source.dtype}")
        flat = source.reshape(-1)
        result = flat.astype(np.uint64)  # always a fresh copy we may overwrite
        fast = extensions.permute()
        if fast is not None:
            try:  # the C code checks the range itself (a negative one is cast to >= 2**63)
                fast.permute(result, self.size, self._key_array)
            except ValueError:  # one out of range: the check below says which
                fast, result = None, flat.astype(np.uint64)
        if fast is None:
            if flat.size and (int(flat.min()) < 0 or int(flat.max()) >= self.size):
                raise ValueError(
                    f"positions must be in [0, {self.size}); "
                    f"got values in [{int(flat.min())}, {int(flat.max())}]"
                )
            self._encrypt_chunked(result)
            if 1 << self._bits != self.size:
                self._walk_cycles(result, self._encrypt_chunked)
        return result.view(np.int64).reshape(source.shape)

    def position_of(self, element: int) -> int:
        """The position whose element is ``element``: the inverse of :meth:`permute`.

        One element at a time (the Feistel rounds run backwards, with cycle walking);
        used where an order needs to know where one element landed.
        """
        if not 0 <= element < self.size:
            raise ValueError(f"element must be in [0, {self.size}); got {element}")
        value = self._decrypt(element)
        while value >= self.size:
            value = self._decrypt(value)
        return value

    def unpermute(self, elements: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The positions of ``elements`` (int64, in ``[0, size)``): :meth:`position_of` for
        an array, the Feistel rounds run backwards in numpy, with cycle walking."""
        result = np.asarray(elements, dtype=np.int64).astype(np.uint64)
        self._decrypt_array(result)
        self._walk_cycles(result, self._decrypt_array)
        return result.view(np.int64)

    def _walk_cycles(
        self, values: npt.NDArray[np.uint64], step: Callable[[npt.NDArray[np.uint64]], None]
    ) -> None:
        """Apply ``step`` again to every value ``>= size`` until all are below it: over
        the whole call, not per chunk, so the long tail of rare multi-pass elements
        costs few numpy calls."""
        limit = np.uint64(self.size)
        walking = np.flatnonzero(values >= limit)
        while walking.size:
            picked = values[walking]
            step(picked)
            values[walking] = picked
            walking = walking[picked >= limit]

    def _decrypt_array(self, values: npt.NDArray[np.uint64]) -> None:
        """:meth:`_decrypt` for an array, in place."""
        right_width = self._bits // 2
        left_width = self._bits - right_width
        left = values >> np.uint64(right_width)
        right = values & np.uint64((1 << right_width) - 1)
        for key in reversed(self._keys):
            z = (left ^ key) * _MULT_1
            z ^= z >> _SHIFT_32
            z *= _MULT_2
            previous_left = right ^ (z >> np.uint64(64 - right_width))
            left, right = previous_left, left
            left_width, right_width = right_width, left_width
        np.bitwise_or(left << np.uint64(right_width), right, out=values)

    def _decrypt(self, value: int) -> int:
        """The inverse of one pass of :meth:`_encrypt`, for one Python int."""
        right_width = self._bits // 2
        left_width = self._bits - right_width
        if ROUNDS % 2:  # pragma: no cover - ROUNDS is even: the widths end where they began
            left_width, right_width = right_width, left_width
        left, right = value >> right_width, value & ((1 << right_width) - 1)
        for key in reversed(self.round_keys):
            # Forward: (L, R) -> (R, L ^ F(R)) with F's width that of L. Backward: the
            # previous R is the current L, the previous L is R ^ F(that).
            z = (((left ^ key) & _MASK64) * int(_MULT_1)) & _MASK64
            z ^= z >> 32
            z = (z * int(_MULT_2)) & _MASK64
            previous_left = right ^ (z >> (64 - right_width))
            left, right = previous_left, left
            left_width, right_width = right_width, left_width
        return (left << right_width) | right

    def _encrypt_chunked(self, values: npt.NDArray[np.uint64]) -> None:
        scratch = np.empty(min(values.size, _CHUNK), dtype=np.uint64)
        shifted = np.empty_like(scratch)
        for start in range(0, values.size, _CHUNK):
            chunk = values[start : start + _CHUNK]
            self._encrypt(chunk, scratch[: chunk.size], shifted[: chunk.size])

    def _encrypt(
        self,
        values: npt.NDArray[np.uint64],
        scratch: npt.NDArray[np.uint64],
        shifted: npt.NDArray[np.uint64],
    ) -> None:
        """One pass of the Feistel network over ``range(2**bits)``, in place.

        ``scratch`` and ``shifted`` are preallocated temporaries of ``values``' size.
        """
        right_width = self._bits // 2
        left_width = self._bits - right_width
        left = values >> np.uint64(right_width)
        right = values & np.uint64((1 << right_width) - 1)
        for key in self._keys:
            # (L, R) -> (R, L ^ F(R)); F's output width is L's width.
            np.bitwise_xor(right, key, out=scratch)
            np.multiply(scratch, _MULT_1, out=scratch)
            np.right_shift(scratch, _SHIFT_32, out=shifted)
            np.bitwise_xor(scratch, shifted, out=scratch)
            np.multiply(scratch, _MULT_2, out=scratch)
            np.right_shift(scratch, np.uint64(64 - left_width), out=scratch)
            np.bitwise_xor(left, scratch, out=left)
            left, right = right, left
            left_width, right_width = right_width, left_width
        np.left_shift(left, np.uint64(right_width), out=left)
        np.bitwise_or(left, right, out=values)


def permute_grouped(
    positions: npt.NDArray[np.int64],
    group: npt.NDArray[np.int64],
    sizes: npt.NDArray[np.int64],
    round_keys: npt.NDArray[np.uint64],
) -> npt.NDArray[np.int64]:
    """Many keyed permutations at once: element ``i`` through group ``group[i]``'s.

    The result equals ``KeyedPermutation(sizes[g], round_keys[g]).permute(positions)``
    for each group ``g`` (the tests check it), computed in one numpy pass over all
    elements rather than one call per group, which for many small groups (a mixture's
    parts, each in its own pass) would be dominated by per-call overhead.

    Parameters
    ----------
    positions
        int64 positions, ``positions[i]`` in ``[0, sizes[group[i]])``.
    group
        The group of each position, indexing ``sizes`` and ``round_keys``.
    sizes
        int64 size of each group's permutation, each in ``[1, 2**62)``.
    round_keys
        uint64 array of shape ``(groups, ROUNDS)``.
    """
    fast = extensions.permute()
    if fast is not None:
        values = positions.astype(np.uint64)  # a fresh copy, permuted in place
        fast.permute_grouped(
            values,
            np.ascontiguousarray(group, dtype=np.int64),
            np.ascontiguousarray(sizes, dtype=np.int64),
            np.ascontiguousarray(round_keys, dtype=np.uint64),
        )
        return values.view(np.int64)
    return _permute_grouped_numpy(positions, group, sizes, round_keys)


def _permute_grouped_numpy(
    positions: npt.NDArray[np.int64],
    group: npt.NDArray[np.int64],
    sizes: npt.NDArray[np.int64],
    round_keys: npt.NDArray[np.uint64],
) -> npt.NDArray[np.int64]:
    """:func:`permute_grouped` in numpy: the reference for the C code."""
    bits = np.maximum(2, _bit_lengths(np.maximum(sizes - 1, 0)))[group]
    keys = np.ascontiguousarray(round_keys.T)[:, group]  # (ROUNDS, n): one gather per round
    values = positions.astype(np.uint64)
    limit = sizes.astype(np.uint64)[group]
    _encrypt_grouped(values, bits, keys)
    walking = np.flatnonzero(values >= limit)
    while walking.size:
        picked = values[walking]
        _encrypt_grouped(picked, bits[walking], keys[:, walking])
        values[walking] = picked
        walking = walking[picked >= limit[walking]]
    return values.view(np.int64)


def _bit_lengths(values: npt.NDArray[np.int64]) -> npt.NDArray[np.uint64]:
    """``int.bit_length`` of each value (exact: no float ``log2`` near ``2**62``)."""
    return np.fromiter((int(v).bit_length() for v in values.tolist()), np.uint64, values.size)


def _encrypt_grouped(
    values: npt.NDArray[np.uint64], bits: npt.NDArray[np.uint64], keys: npt.NDArray[np.uint64]
) -> None:
    """:meth:`KeyedPermutation._encrypt` with per-element widths and round keys, in place."""
    right_width = bits >> np.uint64(1)
    left_width = bits - right_width
    one = np.uint64(1)
    left = values >> right_width
    right = values & ((one << right_width) - one)
    scratch = np.empty_like(values)
    shifted = np.empty_like(values)
    sixty_four = np.uint64(64)
    for key in keys:
        np.bitwise_xor(right, key, out=scratch)
        np.multiply(scratch, _MULT_1, out=scratch)
        np.right_shift(scratch, _SHIFT_32, out=shifted)
        np.bitwise_xor(scratch, shifted, out=scratch)
        np.multiply(scratch, _MULT_2, out=scratch)
        np.right_shift(scratch, sixty_four - left_width, out=scratch)
        np.bitwise_xor(left, scratch, out=left)
        left, right = right, left
        left_width, right_width = right_width, left_width
    np.left_shift(left, right_width, out=left)
    np.bitwise_or(left, right, out=values)
