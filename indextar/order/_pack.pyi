"""Type stub for best/first fit decreasing in C (indextar/order/_pack.c)."""

def fit_decreasing(
    lengths: object, order: object, sorted: object, packed: object, max_length: int, best: bool, /
) -> bytes: ...
def concat_split(
    lengths: object,
    pieces: object,
    piece_lengths: object,
    piece_starts: object,
    offsets: object,
    max_length: int,
    /,
) -> int: ...
