"""Type stub for the one-pass gzip decompression with seek points (indextar/source/_gunzip.c)."""

def gunzip(
    data: object, spacing: int, level: int = -1, /
) -> tuple[
    bytearray,
    list[tuple[int, int, int, int]],
    list[tuple[int, int, int, int]],
    tuple[str, int, int, int, str] | None,
    list[bytes] | None,
]: ...
def sparse_windows(
    compressed: object, data: object, points: list[tuple[int, int, int]], level: int, /
) -> list[bytes]: ...
def inflate_from(compressed: object, bits: int, window: object, length: int, /) -> bytes: ...
