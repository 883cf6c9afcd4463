"""Type stub for the C header walker and grouping (indextar/_tarwalk.c)."""

def walk(
    buffer: object, fd: int = -1, /
) -> tuple[
    int,
    int,
    bytes | None,
    bytes | None,
    bytes | None,
    bytes | None,
    list[str] | None,
    int,
]: ...
def group(
    names: list[str], rows: object, /
) -> tuple[bytes, list[str], bytes, list[str]] | None: ...
