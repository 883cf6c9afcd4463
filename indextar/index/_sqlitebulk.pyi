"""Type stub for the SQLite bulk writer (indextar/_sqlitebulk.c)."""

from typing import Any

def insert_rows(path: str, members: tuple[Any, ...], samples: tuple[Any, ...], /) -> None: ...
