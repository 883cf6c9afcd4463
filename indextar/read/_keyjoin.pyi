"""Type stub for the hash join of keys in C (indextar/read/_keyjoin.c)."""

def join(
    left_blob: object,
    left_starts: object,
    left_ends: object,
    right_blob: object,
    right_starts: object,
    right_ends: object,
    found: object,
    /,
) -> int: ...
