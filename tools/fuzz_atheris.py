"""Coverage-guided fuzzing of :func:`indextar.scan_tar` with atheris (libFuzzer).

Usage::

    python tools/fuzz_atheris.py --seconds 60 [--corpus DIR]

Seeds the corpus with small ustar, GNU and PAX shards from ``tools/fuzz.py``. Any
exception other than an :class:`indextar.IndextarError`, and any scan result that
fails the consistency checks of ``tools/fuzz.py``, is a crash: libFuzzer writes the
input to ``crash-*`` in the current folder. ``-rss_limit_mb`` bounds memory, so a
forged size that allocates is a crash too.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzz  # noqa: E402

with atheris.instrument_imports():
    from indextar import IndextarError, scan_tar
    from indextar.index.naming import group_members


def one_input(data: bytes) -> None:
    try:
        scan = scan_tar(data, shard="atheris.tar")
        group_members(scan, shard="atheris.tar")
    except IndextarError:
        return
    fuzz.check_scan(scan, data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--corpus", type=Path, help="corpus folder (default: a temporary one)")
    args, rest = parser.parse_known_args()
    corpus = args.corpus or Path(tempfile.mkdtemp(prefix="indextar-atheris-"))
    corpus.mkdir(parents=True, exist_ok=True)
    for number in range(30):
        case = fuzz.make_case(0, number)
        (corpus / f"seed-{number}.tar").write_bytes(fuzz.tar_bytes(case.members, case.fmt))
    argv = [
        sys.argv[0],
        str(corpus),
        f"-max_total_time={args.seconds}",
        "-rss_limit_mb=2048",
        "-max_len=65536",
        *rest,
    ]
    atheris.Setup(argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
