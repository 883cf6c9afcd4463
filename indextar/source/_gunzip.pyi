"""Type stub for the one-pass gzip decompression with seek points (indextar/source/_gunzip.c)."""

def gunzip(
    data: object, spacing: int, /
) -> tuple[
    bytearray,
    list[tuple[int, int, int, int]],
    list[tuple[int, int, int, int]],
    tuple[str, int, int, int, str] | None,
]: ...
