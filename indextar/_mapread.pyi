"""Type stub for the guarded copy out of shard maps (indextar/_mapread.c)."""

def members(
    map: object,
    base: int,
    member_ints: object,
    first: int,
    count: int,
    ext_names: tuple[str, ...],
    /,
) -> list[tuple[str, bytes]] | None: ...
def install() -> None: ...

MAX_MEMBERS: int
