"""Type stub for the hash join of keys in C (indextar/read/_keyjoin.c)."""

class KeyTable:
    """The right keys of a join in a hash table, probed with the left keys in pieces."""

    def __init__(self, blob: object, starts: object, ends: object, /) -> None: ...
    @property
    def duplicate(self) -> int:
        """-1, or the position of a right key that an earlier right key already has."""
    def probe(self, blob: object, starts: object, ends: object, found: object, /) -> None: ...
