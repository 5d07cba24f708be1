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


def _releases_run() -> list:
    """The vLLM releases the real tier runs (tests/real/harness.py, RELEASES)."""
    import ast

    tree = ast.parse((REPO / "tests" / "real" / "harness.py").read_text())
    (value,) = [n.value for n in tree.body if isinstance(n, ast.Assign)
                and [t.id for t in n.targets if isinstance(t, ast.Name)] == ["RELEASES"]]
    return sorted({r.split("-")[0] for r in ast.literal_eval(value)})


def test_the_releases_said_to_be_verified_are_the_ones_run():
    """Issue 30 item 5: the README and docs/verify.md name exactly what the real tier runs."""
    run = _releases_run()
    said = ", ".join(run[:-1]) + " and " + run[-1]
    readme = " ".join((REPO / "README.md").read_text().split())
    verify = " ".join((REPO / "docs" / "verify.md").read_text().split())
    assert f"Released wheels {said} on CPU" in readme, said
    assert f"The real vLLM code of {said} (the released wheels)" in verify, said


def test_verify_names_every_exit_code_of_check():
    """Issue 30 item 6: docs/verify.md listed check's exit codes without 3."""
    from kimi_hotfix.tools import cli
    text = " ".join((REPO / "docs" / "verify.md").read_text().split())
    part = text[text.index("`python -O -m kimi_hotfix check`"):]
    part = part[:part.index("`--json` for pipelines")]
    codes = [code for code, meaning in cli.EXIT_CODES if meaning.get("check")]
    assert codes and all(f"{code}: " in part for code in codes), (codes, part)
