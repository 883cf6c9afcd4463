"""Mutation fuzzing of the tar scanner, the indexer and the streaming reader.

Every case builds a small shard with Python's ``tarfile`` (ustar, GNU or PAX, random
member names and sizes), mutates it (byte flips, truncation, spliced, duplicated or
dropped blocks, forged size fields up to 8 EiB and beyond, forged PAX records, GNU
long-name chains) and runs one target on the result:

``scan``
    :func:`indextar.scan_tar` and :func:`indextar.index.naming.group_members`.
``index``
    :func:`indextar.build_index` on a file, then :func:`indextar.verify_index` and a
    read of every sample through :class:`indextar.IndexedTarDataset`.
``stream``
    :func:`indextar.tar.stream.iter_members` over a file object.
``streamscan``
    :func:`indextar.tar.streamscan.scan_stream` over a file object read front to back
    (how remote shards are indexed), with and without ``ignore_zeros``: exactly
    :func:`indextar.scan_tar`'s result, or its error's class, offset and message.
``native``
    :func:`indextar.scan_tar` with the C walker first (as indextar runs), from the
    bytes and from a file read with ``pread``, with and without ``ignore_zeros``:
    exactly the result of the reference alone (``INDEXTAR_PURE_PYTHON``), or its
    error's class, offset and message. PAX shards get a fractional ``mtime`` per
    member half the time, as webdataset's writer does, which the C walker folds.

A case passes if the target raises an :class:`indextar.IndextarError`, or returns a
result that is internally consistent (every member's data inside the file, offsets
increasing, the end marker inside the file, a re-scan equal) and agrees with the
references: the scan of the same bytes for the index and the stream, and
``tarfile`` wherever ``tarfile`` reads the whole mutated archive without error.
Anything else fails the case: another exception type, a hang (``--timeout`` per
case and target; a case stuck in C, out of ``SIGALRM``'s reach, is killed 5 s after
its targets' timeouts), a worker process that dies (a crash in C), or a memory
blow-up (the process runs under ``RLIMIT_AS``, and a case may not raise the peak RSS
by more than ``--max-rss-mb``). Each failure names its case (``seed:case:target``).
A ``--seconds`` run stops handing out cases at its deadline, and cuts off any case
still running 2 s later (``tools/fuzz_runner.py``).

Usage::

    python tools/fuzz.py --cases 2000 --seed 1 --target all
    python tools/fuzz.py --seconds 600 --target scan --jobs 2
    python tools/fuzz.py --replay 1:417:scan     # re-run one case (seed:case:target)

Prints the count of each outcome per target and exits 1 if any case failed.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import functools
import io
import json
import os
import random
import resource
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

BLOCK = 512
FORMATS = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}
TARGETS = ("scan", "index", "stream", "streamscan", "native")
# The formats beside the tar (tools/fuzz_formats.py): not in "all"; "formats" runs them.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from fuzz_formats import FORMAT_TARGETS, FormatFailure, run_format_target  # noqa: E402
from fuzz_runner import run_cases  # noqa: E402

EIB8 = 1 << 63


# -- shards to mutate ----------------------------------------------------------------


def random_name(rng: random.Random, fmt: str) -> str:
    """A member name: a key with dots, sometimes folders, UTF-8, or more than 100 bytes."""
    stem = "".join(rng.choice("abcxyz0189_-") for _ in range(rng.randint(1, 12)))
    if fmt != "ustar" and rng.random() < 0.2:
        stem += rng.choice(["é", "Ω", "日本", "\U0001f600"])
    if rng.random() < 0.3:
        stem = "/".join([stem, *("d" * rng.randint(1, 8) for _ in range(rng.randint(1, 3)))])
    if rng.random() < 0.15:
        # ustar holds it in the prefix field (a slash near the middle); GNU/PAX need
        # an extension header.
        stem = "long" * rng.randint(20, 40) + ("/" if fmt == "ustar" else "") + stem
    return stem + "." + rng.choice(["jpg", "cls", "txt", "json", "seg.png", "x"])


def random_members(rng: random.Random, fmt: str) -> dict[str, bytes | None]:
    """Members for one shard: regular files (sizes 0 to a few blocks) and some folders."""
    members: dict[str, bytes | None] = {}
    for i in range(rng.randint(1, 8)):
        name = f"k{i:03d}/" + random_name(rng, fmt) if rng.random() < 0.1 else random_name(rng, fmt)
        if fmt == "ustar" and len(name.encode()) > 100:
            name = name[-90:].lstrip("/") or "x.txt"
        if rng.random() < 0.05:
            members[name.rsplit(".", 1)[0] + "/"] = None
            continue
        size = rng.choice([0, 1, 511, 512, 513, rng.randint(0, 3 * BLOCK)])
        members[name] = bytes(rng.getrandbits(8) for _ in range(size))
    return members


def tar_bytes(members: dict[str, bytes | None], fmt: str, *, mtime: float = 1_700_000_000) -> bytes:
    """A tar of ``members`` in ``fmt``; a fractional ``mtime`` gives PAX shards a PAX
    header per member, as webdataset's writer (tarfile, ``time.time()``) does."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=FORMATS[fmt]) as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.mtime = mtime
            if data is None:
                info.type = tarfile.DIRTYPE
                tf.addfile(info)
            else:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


# -- mutators --------------------------------------------------------------------------


def header_offsets(buf: bytes | bytearray) -> list[int]:
    """Offsets of header blocks found by walking sizes, as far as the walk makes sense."""
    out, pos = [], 0
    while pos + BLOCK <= len(buf) and any(buf[pos : pos + BLOCK]):
        out.append(pos)
        try:
            size = tarfile.nti(bytes(buf[pos + 124 : pos + 136]))
        except tarfile.HeaderError:
            break
        if buf[pos + 156] in b"123456" or size < 0 or size > len(buf):
            size = 0
        pos += BLOCK + -(-size // BLOCK) * BLOCK
    return out


def fix_checksum(buf: bytearray, at: int) -> None:
    """Recompute the checksum of the header block at ``at``, so a forged field gets past it."""
    block = buf[at : at + BLOCK]
    block[148:156] = b" " * 8
    buf[at + 148 : at + 156] = f"{sum(block):06o}".encode() + b"\0 "


def pax_block(records: bytes, typeflag: bytes = b"x") -> bytes:
    info = tarfile.TarInfo("././@PaxHeader")
    info.size = len(records)
    info.type = typeflag
    head = info.tobuf(tarfile.USTAR_FORMAT)
    return head + records + bytes(-len(records) % BLOCK)


def pax_record(key: str, value: str) -> bytes:
    body = f" {key}={value}\n".encode()
    length = len(body) + 1
    while len(str(length)) + len(body) != length:
        length = len(str(length)) + len(body)
    return str(length).encode() + body


def gnu_block(payload: bytes, typeflag: bytes) -> bytes:
    info = tarfile.TarInfo("././@LongLink")
    info.size = len(payload)
    info.type = typeflag
    return info.tobuf(tarfile.USTAR_FORMAT) + payload + bytes(-len(payload) % BLOCK)


def _pick_header(rng: random.Random, buf: bytearray) -> int:
    headers = header_offsets(buf)
    return rng.choice(headers) if headers else 0


def mutate_flip(rng: random.Random, buf: bytearray) -> str:
    at = []
    for _ in range(rng.choice([1, 1, 2, 4, 8])):
        pos = rng.randrange(len(buf))
        buf[pos] ^= rng.randrange(1, 256)
        at.append(pos)
    if rng.random() < 0.5:  # get past the checksum: the scanner must check the rest too
        for pos in at:
            if pos - pos % BLOCK in header_offsets(buf):
                fix_checksum(buf, pos - pos % BLOCK)
    return f"flip {at}"


def mutate_truncate(rng: random.Random, buf: bytearray) -> str:
    cut = rng.choice([rng.randrange(len(buf)), rng.randrange(0, len(buf), BLOCK)])
    del buf[cut:]
    return f"truncate at {cut}"


def mutate_blocks(rng: random.Random, buf: bytearray) -> str:
    nblocks = max(1, len(buf) // BLOCK)
    start = rng.randrange(nblocks)
    count = rng.randint(1, 3)
    chunk = bytes(buf[start * BLOCK : (start + count) * BLOCK])
    how = rng.choice(["drop", "duplicate", "splice", "zero"])
    if how == "drop":
        del buf[start * BLOCK : (start + count) * BLOCK]
    elif how == "duplicate":
        buf[start * BLOCK : start * BLOCK] = chunk
    elif how == "splice":  # copy blocks over another place
        to = rng.randrange(nblocks) * BLOCK
        buf[to : to + len(chunk)] = chunk
    else:
        buf[start * BLOCK : (start + count) * BLOCK] = bytes(len(chunk))
    return f"{how} {count} blocks at block {start}"


def forged_size_field(rng: random.Random) -> tuple[bytes, str]:
    """A 12-byte size field that claims a lot, or is malformed."""
    value = rng.choice([EIB8, EIB8 - 1, EIB8 - BLOCK, (1 << 88) - 1, 1 << 40, 8**11 - 1])
    kind = rng.choice(["base256", "base256", "negative", "octal", "garbage"])
    if kind == "base256":
        return b"\x80" + value.to_bytes(11, "big"), f"base-256 {value}"
    if kind == "negative":
        return b"\xff" + ((1 << 88) - rng.randint(1, 1 << 20)).to_bytes(11, "big"), "negative"
    if kind == "octal":
        return f"{min(value, 8**11 - 1):011o}\0".encode(), f"octal {min(value, 8**11 - 1)}"
    return bytes(rng.getrandbits(8) for _ in range(12)), "garbage"


def mutate_size(rng: random.Random, buf: bytearray) -> str:
    at = _pick_header(rng, buf)
    raw, what = forged_size_field(rng)
    buf[at + 124 : at + 136] = raw
    if rng.random() < 0.9:
        fix_checksum(buf, at)
    return f"size field at {at} := {what}"


def mutate_pax(rng: random.Random, buf: bytearray) -> str:
    """Insert PAX headers (local or global) with forged records before a member."""
    at = _pick_header(rng, buf)
    block = b"".join(forged_pax_block(rng) for _ in range(rng.choice([1, 1, 1, 2, 3])))
    buf[at:at] = block
    return f"PAX {block[156:157].decode()} {block[512:572]!r} and {len(block)} bytes before {at}"


def forged_pax_block(rng: random.Random) -> bytes:
    """A PAX header with records that matter, that do not (as writers give every
    member), or that are malformed."""
    harmless = [
        ("mtime", "1700000000.25"),
        ("atime", "1700000001.123456789"),
        ("ctime", "1"),
        ("uname", rng.choice(["root", "ö", ""])),
        ("comment", "c" * rng.choice([1, 490, 600, 1500])),  # records spanning blocks
    ]
    choices = [
        ("size", str(EIB8)),
        ("size", str(EIB8 - 1)),
        ("size", "9" * rng.randint(19, 400)),
        ("size", rng.choice(["-1", "", "0x10", "²", "١٢", " 7", "1e3"])),
        ("size", str(rng.randint(0, 4 * BLOCK))),
        (
            "path",
            rng.choice(["../../etc/passwd", "/abs/x.jpg", "a\0b.jpg", "", "é.txt", "x" * 5000]),
        ),
        ("GNU.sparse.major", "1"),
        ("linkpath", "y"),
        ("mtime", "nan"),
    ]
    pool = harmless if rng.random() < 0.5 else harmless + choices
    records = b"".join(pax_record(*rng.choice(pool)) for _ in range(rng.randint(1, 3)))
    if rng.random() < 0.25:  # a malformed record: wrong length, no '=', no newline, binary
        first = pax_record(*rng.choice(harmless))
        length, _, rest = first.partition(b" ")
        records = rng.choice(
            [
                b"99999999999999999999 size=1\n",
                b"5 a=b\n",
                b"12 nokeyvalue\n",
                b"-3 x=y\n",
                b"10 \xff\xfe=\xff\n",
                records[:-1],
                b"0 " * 40,
                b"%d %s" % (int(length) + rng.choice([-1, 1, 100]), rest),  # its length lies
                b"0" + first,  # a leading zero: one byte more than the length says
                records + b"\0" * rng.randint(1, 20),  # NUL padding after the records
            ]
        )
    typeflag = b"g" if rng.random() < 0.2 else b"x"
    block = bytearray(pax_block(records, typeflag))
    if rng.random() < 0.2:  # the PAX header's own size field lies
        raw, what = forged_size_field(rng)
        block[124:136] = raw
        fix_checksum(block, 0)
    return bytes(block)


def mutate_longname(rng: random.Random, buf: bytearray) -> str:
    """GNU L/K headers: chains of them, a huge one, one with no member after it."""
    at = _pick_header(rng, buf)
    count = rng.choice([1, 2, 5, 50])
    payload = rng.choice(
        [b"x" * 300 + b".jpg\0", b"\xff\xfe.jpg\0", b"", b"a" * 3000, b"../up.jpg\0"]
    )
    chain = b"".join(gnu_block(payload, rng.choice([b"L", b"K"])) for _ in range(count))
    if rng.random() < 0.2:
        chain = bytearray(chain)
        raw, _ = forged_size_field(rng)
        chain[124:136] = raw
        fix_checksum(chain, 0)
    where = rng.choice([at, len(buf) - 2 * BLOCK if len(buf) >= 2 * BLOCK else at])
    buf[where:where] = chain
    return f"{count} GNU L/K blocks ({len(payload)} bytes each) at {where}"


MUTATORS: dict[str, Callable[[random.Random, bytearray], str]] = {
    "flip": mutate_flip,
    "truncate": mutate_truncate,
    "blocks": mutate_blocks,
    "size": mutate_size,
    "pax": mutate_pax,
    "longname": mutate_longname,
}


# -- a catalogue of bad inputs, each with the error it gets -----------------------------


def _member(
    name: str, data: bytes = b"", *, typeflag: bytes = b"0", encoding: str = "utf-8"
) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.type, info.mtime = len(data), typeflag, 1_700_000_000
    return info.tobuf(tarfile.USTAR_FORMAT, encoding=encoding) + data + bytes(-len(data) % BLOCK)


def _with_size_field(block: bytes, field: bytes) -> bytes:
    out = bytearray(block)
    out[124:136] = field
    fix_checksum(out, 0)
    return bytes(out)


def _pax(records: bytes, member: bytes, typeflag: bytes = b"x") -> bytes:
    return pax_block(records, typeflag) + member


def forged_inputs() -> dict[str, bytes]:
    """Hand-made bad shards, named by what is wrong with them."""
    import bz2

    end = bytes(2 * BLOCK)
    good = _member("s1.jpg", b"x" * 600) + _member("s1.cls", b"1")
    bad_checksum = bytearray(good)
    bad_checksum[1536] ^= 1  # the second header
    non_octal = bytearray(_member("s.jpg", b"x"))
    non_octal[124:136] = b"12345678x00\0"
    fix_checksum(non_octal, 0)
    return {
        "an empty file": b"",
        "random bytes": random.Random(0).randbytes(4096),
        # (gzip and zstd shards are indexed in place: tests/index/test_compressed.py)
        "a bzip2-compressed tar": bz2.compress(good + end),
        "cut inside a header": (good + end)[:1636],
        "cut inside a member's data": (good + end)[:1000],
        "cut at a member boundary (no end marker)": good,
        "a header with a wrong checksum": bytes(bad_checksum) + end,
        "a size field that is not octal": bytes(non_octal) + end,
        "a base-256 size of 8 EiB": _with_size_field(
            _member("s.jpg"), b"\x80" + (1 << 63).to_bytes(11, "big")
        )
        + end,
        "a base-256 size of 2**88 - 1": _with_size_field(_member("s.jpg"), b"\x80" + b"\xff" * 11)
        + end,
        "a negative base-256 size": _with_size_field(_member("s.jpg"), b"\xff" * 12) + end,
        "an octal size of 8 GiB with 1 KiB present": _with_size_field(
            _member("s.jpg"), b"77777777777\0"
        )
        + end,
        "a PAX size of 8 EiB": _pax(pax_record("size", str(1 << 63)), _member("s.jpg")) + end,
        "a PAX size of 400 digits": _pax(pax_record("size", "9" * 400), _member("s.jpg")) + end,
        "a PAX size in Arabic-Indic digits": _pax(pax_record("size", "١٢"), _member("s.jpg")) + end,
        "a global PAX size of 8 EiB": _pax(pax_record("size", str(1 << 63)), _member("s.jpg"), b"g")
        + end,
        "a PAX path with a NUL byte": _pax(pax_record("path", "a\0b.jpg"), _member("s.jpg")) + end,
        "a malformed PAX record": _pax(b"99 path=x\n", _member("s.jpg")) + end,
        "a GNU long name with no member after it": gnu_block(b"x.jpg\0", b"L") + end,
        "a GNU sparse member": _member("s.jpg", typeflag=b"S") + end,
        "data after the end marker": good + end + b"junk",
        "one extension twice in a sample": _member("s1.jpg", b"a") + _member("s1.jpg", b"b") + end,
    }


def forged_table() -> str:
    """A Markdown table: each forged input and what indexing it raises."""
    from indextar import IndextarError, scan_tar
    from indextar.index.naming import group_members

    rows = ["| input | error | message |", "|---|---|---|"]
    for name, data in forged_inputs().items():
        try:
            group_members(scan_tar(data, shard="bad.tar"), shard="bad.tar")
            error, message = "(indexed)", ""
        except IndextarError as e:
            message = str(e) if len(str(e)) < 300 else str(e)[:150] + " ... " + str(e)[-120:]
            error, message = type(e).__name__, message.replace("|", "\\|")
        rows.append(f"| {name} | `{error}` | {message} |")
    return "\n".join(rows)


@dataclass
class Case:
    """One generated input: its members, format, the mutated bytes and what was done."""

    seed: int
    number: int
    fmt: str
    members: dict[str, bytes | None]
    data: bytes
    mutations: list[str] = field(default_factory=list)


def make_case(seed: int, number: int) -> Case:
    rng = random.Random(f"{seed}:{number}")
    fmt = rng.choice(list(FORMATS))
    members = random_members(rng, fmt)
    mtime = 1_700_000_000.5 if fmt == "pax" and rng.random() < 0.5 else 1_700_000_000
    buf = bytearray(tar_bytes(members, fmt, mtime=mtime))
    mutations = []
    # A few cases stay intact: the round trip must hold exactly there.
    for _ in range(0 if rng.random() < 0.05 else rng.choice([1, 1, 1, 2, 3])):
        if not buf:
            break
        name = rng.choice(list(MUTATORS))
        mutations.append(f"{name}: {MUTATORS[name](rng, buf)}")
    return Case(seed, number, fmt, members, bytes(buf), mutations)


# -- checks ----------------------------------------------------------------------------


class CaseFailure(Exception):
    """A case broke a guarantee."""


class CaseTimeout(BaseException):
    """A case ran past its deadline (raised from SIGALRM)."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise CaseFailure(message)


def check_scan(scan, data: bytes) -> list[tuple[str, bytes]]:  # type: ignore[no-untyped-def]
    """Internal consistency of a scan; returns the regular files' (name, data)."""
    import numpy as np

    n = len(scan)
    check(scan.file_size == len(data), "file_size differs from the input")
    check(
        0 <= scan.end_offset and scan.end_offset + BLOCK <= len(data),
        f"end {scan.end_offset} outside",
    )
    check(not any(data[scan.end_offset :]), "non-zero bytes after the end marker were accepted")
    h, d, s = scan.header_offsets, scan.data_offsets, scan.sizes
    check(len(h) == len(d) == len(s) == len(scan.types) == n, "array lengths differ")
    if n:
        check(bool((h >= 0).all() and (np.diff(h) > 0).all()), "header offsets not increasing")
        check(bool((d > h).all() and (s >= 0).all()), "data before its header or negative size")
        check(bool((d % BLOCK == 0).all() and (h % BLOCK == 0).all()), "offsets not block-aligned")
        check(bool((d + s <= scan.end_offset).all()), "member data runs past the end marker")
        check(bool((d[:-1] + s[:-1] <= h[1:]).all()), "member data overlaps the next header")
    check(all(isinstance(name, str) for name in scan.names), "a name is not a str")
    regular = scan.is_regular()
    return [(scan.names[i], data[int(d[i]) : int(d[i] + s[i])]) for i in range(n) if regular[i]]


def tarfile_files(data: bytes) -> list[tuple[str, bytes]] | None:
    """Regular files as ``tarfile`` reads them, or ``None`` where it fails or stops early."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
            members = tf.getmembers()
            # tarfile stops silently at a bad header; only trust it when it reached the end.
            if tf.offset + BLOCK > len(data) or any(data[tf.offset :]):
                return None
            return [(m.name, tf.extractfile(m).read()) for m in members if m.isreg()]  # type: ignore[union-attr]
    except (tarfile.TarError, EOFError, OSError, ValueError, UnicodeError, OverflowError):
        return None


def gnu_tar_names(data: bytes) -> list[str] | None:
    """Regular files' names as GNU tar lists them, or ``None`` if it fails."""
    entries = gnu_tar_entries(data)
    return None if entries is None else [name for name, _ in entries]


def gnu_tar_entries(data: bytes) -> list[tuple[str, int]] | None:
    """Regular files' ``(name, size)`` as GNU tar lists them, or ``None`` if it fails."""
    with tempfile.TemporaryDirectory(prefix="fuzz-tar-") as folder:
        path = Path(folder) / "case.tar"
        path.write_bytes(data)
        done = subprocess.run(
            ["tar", "--quoting-style=escape", "--numeric-owner", "-tvf", str(path)],
            capture_output=True,
            timeout=30,
            env={**os.environ, "LC_ALL": "C"},
        )
    # Exit status 2 also comes with warnings (an invalid PAX mtime, an empty name)
    # after which GNU tar lists on: its listing is the reference either way.
    if done.returncode not in (0, 2):
        return None
    entries = []
    for line in done.stdout.split(b"\n"):
        # "-rw-r--r-- 0/0  12 2023-11-14 22:13 name": regular files start with "-"; in
        # the escape style a name is ASCII with C escapes (\\n, \\ooo per byte).
        if line.startswith(b"-"):
            fields = line.split(None, 5)
            raw = codecs.escape_decode(fields[5])[0] if len(fields) > 5 else b""
            entries.append((raw.decode("utf-8", "surrogateescape"), int(fields[2])))
    return entries


def run_scan(case: Case, outcome: Counter[str]) -> list[tuple[str, bytes]] | None:
    from indextar import IndextarError, scan_tar
    from indextar.index.naming import group_members

    try:
        scan = scan_tar(case.data, shard="fuzz.tar")
        group_members(scan, shard="fuzz.tar")
    except IndextarError as e:
        outcome[f"refused: {type(e).__name__}"] += 1
        return None
    files = check_scan(scan, case.data)
    again = scan_tar(bytearray(case.data))
    check(
        again.names == scan.names and again.sizes.tolist() == scan.sizes.tolist(), "re-scan differs"
    )
    # A regular file whose name ends in "/" is never indexed (no extension), and GNU
    # tar lists it as a folder: compare the others.
    files = [(n, b) for n, b in files if not n.endswith("/")]
    reference = tarfile_files(case.data)
    if reference is not None:
        reference = [(n, b) for n, b in reference if not n.endswith("/")]
        if files == reference:
            outcome["indexed, equals tarfile"] += 1
        else:
            # tarfile and GNU tar differ on stacked extension headers (tarfile lets the
            # first of two long names or PAX headers win, GNU tar the last): GNU tar
            # decides, by names and sizes.
            entries = gnu_tar_entries(case.data)
            if entries is not None:
                entries = [(n, size) for n, size in entries if not n.endswith("/")]
            ours = [(n, len(b)) for n, b in files]
            check(
                entries == ours and entries != [(n, len(b)) for n, b in reference],
                f"scan and tarfile disagree: {[n for n, _ in files]} vs {[n for n, _ in reference]}"
                f" (GNU tar: {entries})",
            )
            outcome["indexed, equals GNU tar (tarfile differs)"] += 1
    else:
        outcome["indexed, tarfile fails or stops early"] += 1
    if not case.mutations:
        expected = [(n, b) for n, b in case.members.items() if b is not None]
        check(files == expected, "an unmutated shard does not give the members written")
    return files


def run_index(case: Case, outcome: Counter[str], folder: Path) -> None:
    from indextar import IndexedTarDataset, IndextarError, build_index, scan_tar
    from indextar.index.naming import group_members
    from indextar.index.verify import verify_index

    shard = folder / "fuzz.tar"
    shard.write_bytes(case.data)
    try:
        expected_scan = scan_tar(case.data)
        grouping = group_members(expected_scan)
    except IndextarError:
        expected_scan = None
    try:
        index = build_index(shard, force=True)
    except IndextarError as e:
        check(expected_scan is None, f"build_index refused a shard the scanner accepts: {e}")
        left = sorted(p.name for p in folder.iterdir())
        check(left == ["fuzz.tar"], f"a refused shard left files behind: {left}")
        outcome[f"refused: {type(e).__name__}"] += 1
        return
    check(expected_scan is not None, "build_index accepted a shard the scanner refuses")
    report = verify_index(shard)
    check(report.ok, f"verify_index: {report.problems}")
    check(len(index) == len(grouping.keys), "sample count differs from the scan")
    with contextlib.closing(IndexedTarDataset(shard)) as ds:  # type: ignore[type-var]
        got = []
        for i in range(len(ds)):
            sample = ds[i]
            got.extend(v for k, v in sample.items() if not k.startswith("__"))
    entries = grouping.entries.tolist()
    wanted = [
        case.data[
            int(expected_scan.data_offsets[i]) : int(
                expected_scan.data_offsets[i] + expected_scan.sizes[i]
            )
        ]
        for i in entries
    ]
    check(sorted(got) == sorted(wanted), "dataset bytes differ from the scan's members")
    outcome["indexed, verified, read back"] += 1


def run_stream(case: Case, outcome: Counter[str], scanned: list[tuple[str, bytes]] | None) -> None:
    from indextar import IndextarError
    from indextar.tar.stream import iter_members

    try:
        got = [
            (m.name, m.data)
            for m in iter_members(io.BufferedReader(io.BytesIO(case.data)), shard="fuzz.tar")
        ]  # type: ignore[arg-type]
    except IndextarError as e:
        outcome[f"refused: {type(e).__name__}"] += 1
        return
    got = [(n, b) for n, b in got if not n.endswith("/")]  # as in run_scan
    if scanned is not None:
        check(
            got == scanned,
            f"stream and scan disagree: {[n for n, _ in got][:5]} vs {[n for n, _ in scanned][:5]}",
        )
        outcome["streamed, equals scan"] += 1
    else:
        # The stream stops at the first zero block and does not look further, so it
        # reads shards with damaged padding that the scanner refuses.
        outcome["streamed, scanner refuses"] += 1


def run_streamscan(case: Case, outcome: Counter[str]) -> None:
    from indextar import IndextarError, scan_tar
    from indextar.tar.streamscan import FileReader, StreamedBytes, scan_stream

    def result(scan: Callable[[], object]) -> tuple[object, ...]:
        try:
            s = scan()
        except IndextarError as e:
            return ("refused", type(e).__name__, getattr(e, "offset", None), str(e))
        fields = ("names", "types", "header_offsets", "data_offsets", "sizes")
        return ("scanned", *(list(getattr(s, f)) for f in fields), s.end_offset)  # type: ignore[attr-defined]

    def streamed(ignore_zeros: bool) -> object:
        reader = FileReader(io.BufferedReader(io.BytesIO(case.data)))  # type: ignore[arg-type]
        view = StreamedBytes(reader, len(case.data), shard="fuzz.tar", edges=64 << 10)
        return scan_stream(view, ignore_zeros=ignore_zeros)

    for ignore_zeros in (False, True):
        expected = result(lambda: scan_tar(case.data, shard="fuzz.tar", ignore_zeros=ignore_zeros))  # noqa: B023
        got = result(lambda: streamed(ignore_zeros))  # noqa: B023
        check(got == expected, f"streamed scan differs: {got[:4]!r} vs {expected[:4]!r}")
    outcome["equals scan_tar" if expected[0] == "scanned" else "refused alike"] += 1


def run_native(case: Case, outcome: Counter[str], folder: Path) -> None:
    import mmap

    from indextar import IndextarError, native, scan_tar
    from indextar.tar import extensions as tar_extensions

    walker = tar_extensions.tarwalk()
    if walker is None:
        outcome["skipped: the C walker is not built"] += 1
        return
    path = folder / "fuzz.tar"
    path.write_bytes(case.data)

    def result(pure: bool, from_file: bool, ignore_zeros: bool) -> tuple[object, ...]:
        if pure:
            os.environ[native.PURE_PYTHON_ENV] = "1"
        try:
            with open(path, "rb") as f:
                # The map is left to the collector: an error's traceback may hold views.
                mapped = from_file and case.data
                buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if mapped else case.data
                s = scan_tar(buf, shard="fuzz.tar", fd=f.fileno() if mapped else None,
                             ignore_zeros=ignore_zeros)  # fmt: skip
        except IndextarError as e:
            return ("refused", type(e).__name__, getattr(e, "offset", None), str(e))
        finally:
            os.environ.pop(native.PURE_PYTHON_ENV, None)
        fields = ("names", "types", "header_offsets", "data_offsets", "sizes")
        return ("scanned", *(list(getattr(s, f)) for f in fields), s.end_offset,
                s.extension_headers)  # fmt: skip

    for ignore_zeros in (False, True):
        expected = result(True, False, ignore_zeros)
        for from_file in (False, True):
            got = result(False, from_file, ignore_zeros)
            check(
                got == expected,
                f"C-first scan ({'file' if from_file else 'bytes'}, ignore_zeros={ignore_zeros}) "
                f"differs from the reference: {got[:4]!r} vs {expected[:4]!r}",
            )
    status, *_, folded = walker.walk(case.data)
    how = "C walked" if status == 0 else "C handed over"
    if status == 0 and folded:
        how += ", PAX folded"
    outcome[f"{'equals reference' if expected[0] == 'scanned' else 'refused alike'}: {how}"] += 1


# -- running ---------------------------------------------------------------------------


def _alarm(signum: int, frame: object) -> None:
    raise CaseTimeout()


def run_case(
    seed: int, number: int, targets: tuple[str, ...], timeout: float, max_rss_mb: float
) -> dict[str, Counter[str] | list[str]]:
    """Run one case through ``targets``; returns the outcome counts and any failures."""
    counts: dict[str, Counter[str]] = {t: Counter() for t in targets}
    failures: list[str] = []
    case = make_case(seed, number)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    scanned = None
    for target in targets:
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            with tempfile.TemporaryDirectory(prefix="fuzz-") as folder:
                if target in FORMAT_TARGETS:
                    run_format_target(target, seed, number, counts[target], Path(folder))
                elif target == "scan":
                    scanned = run_scan(case, counts[target])
                elif target == "index":
                    run_index(case, counts[target], Path(folder))
                elif target == "streamscan":
                    run_streamscan(case, counts[target])
                elif target == "native":
                    run_native(case, counts[target], Path(folder))
                else:
                    if "scan" not in targets:
                        with contextlib.suppress(Exception):
                            scanned = run_scan(case, Counter())
                    run_stream(case, counts[target], scanned)
        except CaseTimeout:
            counts[target]["FAILED: hang"] += 1
            failures.append(
                f"{seed}:{number}:{target} hang over {timeout} s ({'; '.join(case.mutations)})"
            )
        except (CaseFailure, FormatFailure) as e:
            counts[target]["FAILED: wrong result"] += 1
            failures.append(f"{seed}:{number}:{target} {e} ({'; '.join(case.mutations)})")
        except Exception as e:  # noqa: BLE001 - exactly what the fuzzer is looking for
            counts[target][f"FAILED: {type(e).__name__}"] += 1
            failures.append(
                f"{seed}:{number}:{target} {type(e).__name__}: {e} ({'; '.join(case.mutations)})\n"
                + "".join(traceback.format_exc(limit=-3))
            )
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    if grown_mb > max_rss_mb:
        counts[targets[0]]["FAILED: memory"] += 1
        failures.append(f"{seed}:{number} peak RSS grew by {grown_mb:.0f} MB")
    return {"counts": counts, "failures": failures}  # type: ignore[dict-item]


def _worker_init(memory_limit_mb: int, scratch: str) -> None:
    signal.signal(signal.SIGALRM, _alarm)
    # Every temporary file of the worker's cases (and the ztables target's base shards)
    # goes under the run's folder, which the parent removes even if it killed the worker.
    tempfile.tempdir = scratch
    if memory_limit_mb:
        limit = memory_limit_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    import indextar  # noqa: F401 - import before the first deadline starts


@dataclass
class FuzzResult:
    cases: int
    counts: dict[str, Counter[str]]
    failures: list[str]
    seconds: float


def fuzz(
    *,
    seed: int = 0,
    cases: int | None = None,
    seconds: float | None = None,
    targets: tuple[str, ...] = TARGETS,
    jobs: int = 1,
    timeout: float = 10.0,
    max_rss_mb: float = 200.0,
    memory_limit_mb: int = 4096,
) -> FuzzResult:
    """Run cases ``0, 1, ...`` of ``seed`` until ``cases`` are done or ``seconds`` pass.

    A case that does not answer within ``timeout`` per target and 5 s more (stuck where
    ``SIGALRM`` cannot reach it, in C), or whose worker process dies, is a failure that
    names it; a case still running at the end of ``seconds`` is cut off 2 s later and
    not counted.
    """
    start = time.monotonic()
    total: dict[str, Counter[str]] = {t: Counter() for t in targets}
    failures: list[str] = []

    def add(number: int, result: dict[str, object]) -> None:
        for target, counter in result["counts"].items():  # type: ignore[attr-defined]
            total[target].update(counter)
        failures.extend(result["failures"])  # type: ignore[arg-type]

    # An import that fails must fail here, not in every worker's start-up.
    import indextar  # noqa: F401

    # Worker processes: RLIMIT_AS and SIGALRM stay out of the caller.
    with tempfile.TemporaryDirectory(prefix="fuzz-run-") as scratch:
        done, lost = run_cases(
            functools.partial(
                run_case, seed, targets=targets, timeout=timeout, max_rss_mb=max_rss_mb
            ),
            add,
            cases=cases,
            seconds=None if seconds is None else seconds - (time.monotonic() - start),
            jobs=jobs,
            hang_after=timeout * len(targets) + 5.0,
            initializer=_worker_init,
            initargs=(memory_limit_mb, scratch),
        )
    for case in lost:
        total[targets[0]][f"FAILED: {case.kind}"] += 1
        replay = f"{seed}:{case.number}" + (f":{targets[0]}" if len(targets) == 1 else "")
        what = ""
        if set(targets) & set(TARGETS):
            what = f" ({'; '.join(make_case(seed, case.number).mutations)})"
        failures.append(
            f"{seed}:{case.number}:{','.join(targets)} {case.why}{what}; "
            f"replay: python tools/fuzz.py --replay {replay}"
        )
    return FuzzResult(done + len(lost), total, failures, time.monotonic() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--cases", type=int, help="number of cases (default 500)")
    budget.add_argument("--seconds", type=float, help="run for this long instead")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--target", choices=(*TARGETS, *FORMAT_TARGETS, "all", "formats"), default="all"
    )
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per case and target")
    parser.add_argument(
        "--max-rss-mb", type=float, default=200.0, help="peak RSS growth allowed per case"
    )
    parser.add_argument(
        "--memory-limit-mb", type=int, default=4096, help="RLIMIT_AS of the workers"
    )
    parser.add_argument("--replay", metavar="SEED:CASE[:TARGET]", help="run one case and show it")
    parser.add_argument("--json", action="store_true", help="print the counts as JSON")
    parser.add_argument(
        "--forged", action="store_true", help="print the catalogue of bad inputs and their errors"
    )
    args = parser.parse_args(argv)
    if args.forged:
        print(forged_table())
        return 0
    groups = {"all": TARGETS, "formats": FORMAT_TARGETS}
    targets = groups.get(args.target, (args.target,))
    if args.replay:
        seed, number, *rest = args.replay.split(":")
        case = make_case(int(seed), int(number))
        print(f"case {seed}:{number} ({case.fmt}, {len(case.data)} bytes): {case.mutations}")
        signal.signal(signal.SIGALRM, _alarm)
        result = run_case(
            int(seed), int(number), tuple(rest) or targets, args.timeout, args.max_rss_mb
        )
        print({t: dict(c) for t, c in result["counts"].items()})  # type: ignore[union-attr]
        print("\n".join(result["failures"]))  # type: ignore[arg-type]
        return 1 if result["failures"] else 0
    result = fuzz(
        seed=args.seed,
        cases=args.cases if args.cases is not None or args.seconds is not None else 500,
        seconds=args.seconds,
        targets=targets,
        jobs=args.jobs,
        timeout=args.timeout,
        max_rss_mb=args.max_rss_mb,
        memory_limit_mb=args.memory_limit_mb,
    )
    if args.json:
        print(
            json.dumps(
                {
                    "cases": result.cases,
                    "seconds": round(result.seconds, 1),
                    "counts": {t: dict(c) for t, c in result.counts.items()},
                    "failures": len(result.failures),
                }
            )
        )
    else:
        print(f"{result.cases} cases (seed {args.seed}) in {result.seconds:.1f} s")
        for target, counter in result.counts.items():
            print(f"  {target}:")
            for outcome, n in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0])):
                print(f"    {n:7d}  {outcome}")
    for failure in result.failures[:20]:
        print("FAIL", failure, file=sys.stderr)
    if len(result.failures) > 20:
        print(f"... and {len(result.failures) - 20} more failures", file=sys.stderr)
    return 1 if result.failures else 0


if __name__ == "__main__":
    sys.exit(main())
