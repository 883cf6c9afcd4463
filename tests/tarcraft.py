"""Hand-crafted tar headers for tests: the odd corners no tar writer produces on request.

Everything here is built from bytes, so a test can say exactly which field is odd:
base-256 sizes, malformed octal, names with an embedded NUL, the ustar ``prefix``,
signed checksums, V7 headers, PAX records, GNU long names, sparse type flags, a lone
zero block, GNU record padding.

:func:`craft` returns the archive together with where every member landed, so tests
can check a scan without another tar reader.
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from indextar.tar.scan import TarScan

BLOCK = 512
RECORD = 20 * BLOCK  # GNU tar's default record size

MAGICS = {
    "ustar": b"ustar\x0000",  # POSIX ustar and PAX
    "gnu": b"ustar  \x00",  # GNU
    "v7": b"\x00" * 8,  # no magic at all
}


def octal(value: int, width: int) -> bytes:
    """``value`` as a zero-padded octal field ending in a NUL, as GNU tar writes it."""
    digits = f"{value:0{width - 1}o}".encode()
    assert len(digits) == width - 1, f"{value} does not fit {width - 1} octal digits"
    return digits + b"\0"


def base256(value: int, width: int = 12) -> bytes:
    """``value`` in GNU's base-256 form: a 0x80 (or 0xFF, negative) lead byte, big-endian."""
    if value < 0:
        return b"\xff" + (value + (1 << (8 * (width - 1)))).to_bytes(width - 1, "big")
    return b"\x80" + value.to_bytes(width - 1, "big")


def blocks(data: bytes) -> bytes:
    """``data`` zero-padded to whole 512-byte blocks."""
    return data + b"\0" * (-len(data) % BLOCK)


def header(
    name: bytes | str,
    size: int = 0,
    *,
    typeflag: bytes = b"0",
    magic: str = "ustar",
    prefix: bytes | str = b"",
    linkname: bytes | str = b"",
    size_field: bytes | None = None,
    fields: Mapping[str, bytes] | None = None,
    checksum: str = "unsigned",
) -> bytes:
    """One 512-byte header block.

    ``size_field`` replaces the size field's bytes as given (for base-256 or bad
    octal); ``fields`` replaces others by name (``mode``, ``uid``, ``gid``,
    ``mtime``). ``checksum`` is ``"unsigned"`` (what writers use), ``"signed"``
    (what some old tars wrote; only differs for bytes >= 128) or ``"bad"``.
    """
    name = name.encode() if isinstance(name, str) else name
    prefix = prefix.encode() if isinstance(prefix, str) else prefix
    linkname = linkname.encode() if isinstance(linkname, str) else linkname
    assert len(name) <= 100 and len(prefix) <= 155 and len(linkname) <= 100
    layout = {
        "mode": (100, octal(0o644, 8)),
        "uid": (108, octal(1000, 8)),
        "gid": (116, octal(1000, 8)),
        "size": (124, size_field if size_field is not None else octal(size, 12)),
        "mtime": (136, octal(1_700_000_000, 12)),
    }
    for key, value in (fields or {}).items():
        layout[key] = (layout[key][0], value)
    block = bytearray(BLOCK)
    block[0 : len(name)] = name
    for offset, value in layout.values():
        assert len(value) == (12 if offset >= 124 else 8), value
        block[offset : offset + len(value)] = value
    block[148:156] = b" " * 8
    block[156:157] = typeflag
    block[157 : 157 + len(linkname)] = linkname
    block[257:265] = MAGICS[magic]
    if magic != "v7":
        block[265:273] = b"indextar"
        block[297:305] = b"indextar"
        block[345 : 345 + len(prefix)] = prefix
    if checksum == "signed":
        total = sum(b - 256 if b >= 128 else b for b in block)
    else:
        total = sum(block) + (1 if checksum == "bad" else 0)
    block[148:156] = f"{total & 0o777777:06o}".encode() + b"\0 "
    return bytes(block)


def pax_records(records: Mapping[str, str]) -> bytes:
    """PAX extended header data: ``"%d %s=%s\\n"`` records whose length counts itself."""
    out = b""
    for key, value in records.items():
        body = f" {key}={value}\n".encode()
        length = len(body) + 1
        while len(str(length).encode()) + len(body) != length:
            length += 1
        out += str(length).encode() + body
    return out


@dataclass(frozen=True)
class Placed:
    """Where a crafted member landed: its name, first header, data and size."""

    name: str
    header_offset: int
    data_offset: int
    size: int
    typeflag: bytes = b"0"


class Crafter:
    """Builds an archive piece by piece, recording where each member lands."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.length = 0
        self.placed: list[Placed] = []
        self.extension_start: int | None = None

    def raw(self, data: bytes) -> Crafter:
        self.parts.append(data)
        self.length += len(data)
        return self

    def member(
        self,
        name: str,
        data: bytes = b"",
        *,
        header_name: bytes | str | None = None,
        typeflag: bytes = b"0",
        stored_size: int | None = None,
        **header_options: object,
    ) -> Crafter:
        """A member with ``data``; ``name`` is the name a reader should report.

        ``header_name`` is what goes in the name field (default: ``name``);
        ``stored_size`` is the header's size field (default: ``len(data)``).
        """
        start = self.extension_start if self.extension_start is not None else self.length
        size = len(data) if stored_size is None else stored_size
        block = header(
            name if header_name is None else header_name,
            size,
            typeflag=typeflag,
            **header_options,  # type: ignore[arg-type]
        )
        self.raw(block)
        self.placed.append(Placed(name, start, self.length, len(data), typeflag))
        self.raw(blocks(data))
        self.extension_start = None
        return self

    def extension(self, typeflag: bytes, payload: bytes, *, name: str = "././@LongLink") -> Crafter:
        """An extension header (``L``, ``K``, ``x``, ``g``) for the next member."""
        if self.extension_start is None:
            self.extension_start = self.length
        self.raw(header(name, len(payload), typeflag=typeflag))
        self.raw(blocks(payload))
        return self

    def pax(self, records: Mapping[str, str], *, typeflag: bytes = b"x") -> Crafter:
        return self.extension(typeflag, pax_records(records), name="PaxHeader/x")

    def finish(self, *, end_blocks: int = 2, record: int | None = None) -> bytes:
        """The archive with ``end_blocks`` zero blocks, then padded to ``record`` bytes."""
        out = b"".join(self.parts) + b"\0" * (end_blocks * BLOCK)
        if record:
            out += b"\0" * (-len(out) % record)
        return out


def craft(members: Iterable[tuple[str, bytes]], **finish: int) -> tuple[bytes, list[Placed]]:
    """A plain ustar archive of ``(name, data)`` pairs, and where each member is."""
    crafter = Crafter()
    for name, data in members:
        crafter.member(name, data)
    return crafter.finish(**finish), crafter.placed


# -- comparing with tarfile ------------------------------------------------------------


def tarfile_members(buf: bytes) -> list[tuple[str, int, int, int, bool]]:
    """``(name, offset, offset_data, size, is regular)`` of each member, by tarfile."""
    with tarfile.open(fileobj=io.BytesIO(buf)) as tf:
        return [(m.name, m.offset, m.offset_data, m.size, m.isreg()) for m in tf.getmembers()]


def scanned_members(scan: TarScan) -> list[tuple[str, int, int, int, bool]]:
    """The same view of a scan (tarfile drops a directory name's trailing slash)."""
    regular = scan.is_regular()
    return [
        (
            name.rstrip("/") if scan.kind(i) == "directory" else name,
            int(scan.header_offsets[i]),
            int(scan.data_offsets[i]),
            int(scan.sizes[i]),
            bool(regular[i]),
        )
        for i, name in enumerate(scan.names)
    ]


# -- GNU tar ---------------------------------------------------------------------------

GNU_TAR = "/usr/bin/tar"
_TAR_ENV = {**os.environ, "LC_ALL": "C.UTF-8", "TZ": "UTC"}


def write_tree(root: Path, files: Mapping[str, bytes | str | None]) -> None:
    """Create files under ``root``: bytes for a file, ``None`` for a directory,
    ``"->target"`` for a symlink and ``"=>other"`` for a hard link to ``other``."""
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if data is None:
            path.mkdir(exist_ok=True)
        elif isinstance(data, str) and data.startswith("->"):
            path.symlink_to(data[2:])
        elif isinstance(data, str) and data.startswith("=>"):
            os.link(root / data[2:], path)
        else:
            assert isinstance(data, bytes)
            path.write_bytes(data)


def gnu_tar(archive: Path, root: Path, members: Iterable[str | bytes], *options: str) -> Path:
    """Run GNU tar: ``tar OPTIONS -cf archive -C root MEMBERS`` (UTF-8 locale); members
    given as bytes need not be UTF-8."""
    subprocess.run(
        [GNU_TAR, *options, "-cf", str(archive), "-C", str(root), "--", *members],
        check=True,
        env=_TAR_ENV,
        capture_output=True,
    )
    return archive


def gnu_tar_list(archive: Path) -> subprocess.CompletedProcess[str]:
    """``tar -tf archive``: its exit code, the names it lists and its complaints."""
    return subprocess.run(
        [GNU_TAR, "--quoting-style=literal", "-tf", str(archive)],
        env=_TAR_ENV,
        capture_output=True,
        text=True,
    )
