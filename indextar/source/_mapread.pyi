"""Type stub for the guarded copy out of shard maps (indextar/_mapread.c)."""

def members(
    map: object,
    base: int,
    member_ints: object,
    first: int,
    count: int,
    ext_names: tuple[str, ...],
    key: bytes | None = None,
    fd: int = -1,
    ino: int = 0,
    size: int = 0,
    mtime_ns: int = 0,
    /,
) -> list[tuple[str, bytes]] | None | int: ...
def first_failing(
    map: object, starts: object, header_lens: object, keys: list[bytes], /
) -> int: ...
def install() -> None: ...

MAX_MEMBERS: int
MAX_MEMBER_SIZE: int

FILE_CHANGED: int
BAD_CHECKSUM: int
OTHER_NAME: int
