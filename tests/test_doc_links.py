"""Every relative link in README.md and docs/*.md points at a file that exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
_CODE = re.compile(r"^```.*?^```|`[^`\n]*`", re.S | re.M)  # code is not links


def test_relative_links_resolve() -> None:
    broken = [
        f"{page.relative_to(ROOT)}: {target}"
        for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
        for target in _LINK.findall(_CODE.sub("", page.read_text()))
        if "://" not in target and not (page.parent / target).exists()
    ]
    assert not broken, broken
