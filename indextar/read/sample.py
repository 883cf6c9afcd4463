"""What a dataset returns for one sample: its members decoded, or the ``keys=`` tuple.

Shared by :class:`~indextar.IndexedTarDataset` and
:class:`~indextar.StreamingTarDataset`, so that ``decode=`` and ``keys=`` mean the
same in both. A sample dict holds its fields, ``__key__`` and ``__shard__`` (and
``__index__`` in the map-style dataset), beside its members; fields are never decoded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import SampleKeyError
from .decode import DecodeArg, Decoder, make_decoder

__all__ = ["Sample", "SampleBuilder", "parse_keys", "select_field"]

Sample = dict[str, Any]

Fields = tuple[tuple[str, ...], ...]
"""``keys=`` parsed: for each place in the tuple, its alternatives (``"jpg;png"``)."""


@dataclass(frozen=True, slots=True)
class SampleBuilder:
    """A dataset's ``decode=``, ``keys=`` and ``transform=``, applied to one sample at a time.

    Attributes
    ----------
    decoder
        ``None`` keeps members as ``bytes``.
    fields
        ``None`` returns the sample dict; otherwise a tuple of these members, and only
        they are decoded.
    transform
        Applied last, to the dict or tuple.
    """

    decoder: Decoder | None
    fields: Fields | None
    transform: Callable[[Any], Any] | None = None

    @classmethod
    def make(
        cls,
        *,
        decode: DecodeArg,
        keys: str | Sequence[str] | None,
        allow_unsafe: bool,
        transform: Callable[[Any], Any] | None = None,
    ) -> SampleBuilder:
        """Check a dataset's ``decode=``, ``keys=`` and ``allow_unsafe=`` arguments."""
        return cls(make_decoder(decode, allow_unsafe=allow_unsafe), parse_keys(keys), transform)

    def build(self, sample: Sample, members: Iterable[tuple[str, bytes]]) -> Any:
        """``sample`` (its fields) with ``members`` ``(ext, data)`` added and decoded, or
        the ``keys=`` tuple of them; then transformed."""
        # A method, not __call__: this runs once per ds[i], and calling an instance
        # costs about 100 ns more.
        decoder = self.decoder
        if self.fields is not None:
            sample.update(members)
            result: Any = tuple(
                select_field(sample, alternatives, decoder) for alternatives in self.fields
            )
        elif decoder is None:
            sample.update(members)
            result = sample
        else:
            key, shard = sample["__key__"], sample["__shard__"]
            for ext, data in members:
                sample[ext] = decoder.decode_member(ext, data, shard=shard, key=key)
            result = sample
        return result if self.transform is None else self.transform(result)


def fields_template(fields: Sample) -> Sample:
    """``fields`` in a dict whose copies (``template.copy()``) have room for members:
    for a mixture part's four fields, four more keys before they grow.

    A sample's dict starts with its fields and then takes its members. Four fields
    and two members fill a fresh dict's first table past its five keys, and growing
    it costs a third of building the dict. ``dict.copy()`` keeps the table of a dict
    with few deleted keys, so a template built larger and trimmed gives copies with
    room; where it does not (another Python), a copy is an ordinary dict.
    """
    spare = ["\0spare0", "\0spare1"]  # two deleted keys: the table of 8 becomes 16
    template: Sample = dict.fromkeys([*fields, *spare])
    for name in spare:
        del template[name]
    template.update(fields)
    return template


def parse_keys(keys: str | Sequence[str] | None) -> Fields | None:
    """``keys=`` as alternatives per place: ``("jpg;png", "cls")`` or ``"jpg;png cls"``.

    Raises
    ------
    ValueError
        If ``keys`` is empty or holds something other than non-empty strings.
    """
    if keys is None:
        return None
    fields = keys.split() if isinstance(keys, str) else list(keys)
    if not fields or not all(isinstance(field, str) and field for field in fields):
        raise ValueError(
            f"keys= must be non-empty member names such as ('jpg;png', 'cls'); got {keys!r}"
        )
    return tuple(tuple(field.split(";")) for field in fields)


def select_field(sample: Sample, alternatives: tuple[str, ...], decoder: Decoder | None) -> Any:
    """The first of ``alternatives`` (as in ``"jpg;png"``) that ``sample`` has, decoded.

    Raises
    ------
    SampleKeyError
        Naming the sample, its shard and the members it does have.
    """
    for name in alternatives:
        if name in sample:
            value = sample[name]
            if decoder is not None and not name.startswith("__"):
                value = decoder.decode_member(
                    name, value, shard=sample["__shard__"], key=sample["__key__"]
                )
            return value
    present = sorted(name for name in sample if not name.startswith("__"))
    index = f" (index {sample['__index__']})" if "__index__" in sample else ""
    raise SampleKeyError(
        f"sample {sample['__key__']!r}{index} in shard {sample['__shard__']!r} has no "
        f"{' or '.join(repr(a) for a in alternatives)} member; it has {present}"
    )
