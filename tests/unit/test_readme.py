"""The README is the operator's page: at most 12 KB (details go to docs/), and
every relative link in it, or in the docs it links to, lands on a file and, for
``#anchor`` links, on a heading of that file (GitHub's anchors)."""

from __future__ import annotations

import re

from helpers import REPO

LIMIT = 12 * 1024
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(path) -> set:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to -."""
    out = set()
    for line in path.read_text().splitlines():
        m = re.match(r"#+ (.*)", line)
        if m:
            text = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower())
            out.add(text.replace(" ", "-"))
    return out


def test_the_readme_stays_under_12_kb():
    size = len((REPO / "README.md").read_bytes())
    assert size <= LIMIT, f"README.md is {size} bytes, over {LIMIT}: move details to docs/"


def test_relative_links_land():
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
             *sorted((REPO / "deploy").rglob("*.md"))]
    broken = []
    for page in pages:
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
            elif anchor and (dest.is_dir() or anchor not in anchors(dest)):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert broken == []
