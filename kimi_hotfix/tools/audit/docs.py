"""docs/audit.md's generated part: the audit's table for each release.

    python -m kimi_hotfix.tools.audit.docs docs/audit.md RELEASE=VLLM_PACKAGE_DIR ... \
        [--tests RELEASE=SDIST_TESTS_DIR ...]

Rewrites the text between ``<!-- audit-tables -->`` and ``<!-- /audit-tables -->``
in the given file with one table per release (the audit of that ``vllm/``
directory, no cache), one table of the release's own tests' ``pytest.raises
(AssertionError)`` sites where ``--tests`` names its sdist's ``tests/`` (the same
audit run: ``audit --tests``), then the reasons, once per reviewed function. The
real-wheel tests regenerate it and compare (tests/real/test_audit.py).
"""

from __future__ import annotations

import re
import sys

from kimi_hotfix.tools import audit
from kimi_hotfix.tools.audit import reviewed

BEGIN, END = "<!-- audit-tables -->", "<!-- /audit-tables -->"
KIND = {"except": "except", "suppress": "suppress", "validator": "validator"}


def _short(qualname):
    return qualname[len("vllm."):] if qualname.startswith("vllm.") else qualname


def _verdict(entry):
    if entry["verdict"] == reviewed.COVERED:
        armed = "" if entry["patch_armed"] else " (not armed yet)"
        return f"covered: `{entry['patch']}`{armed}"
    if entry["changed"]:
        return "NOT REVIEWED (changed)"
    return entry["verdict"]


def _counts(sites):
    """(verdicts of the sites, the reached functions, their verdicts) of ``sites``."""
    reached = {h["qualname"]: h for site in sites for h in site["reaches"]}
    verdicts = (reviewed.COVERED, reviewed.HARMLESS, reviewed.UNCOVERED, reviewed.NOT_REVIEWED)

    def count(entries):
        return ", ".join(f"{n} {v}" for v in verdicts
                         if (n := sum(e["verdict"] == v for e in entries)))

    return count(sites), reached, count(reached.values())


def _reaches(site):
    return "<br>".join(
        f"`{_short(h['qualname'])}`{' (by name)' if h['how'] == 'by name' else ''}: "
        f"{_verdict(h)}" for h in site["reaches"]) or ""


def release_table(release, result) -> str:
    sites = [s for s in result["sites"] if s["kind"] != "raises"]
    site_verdicts, reached, reached_verdicts = _counts(sites)
    kinds = {k: sum(s["kind"] == k for s in sites) for k in ("except", "suppress", "validator")}
    out = [f"### vLLM {release}", ""]
    out.append(f"{len(sites)} sites ("
               + ", ".join(f"{n} {k}" for k, n in kinds.items()) + "): "
               + site_verdicts + ". "
               + f"{len(reached)} asserting functions reached (up to {result['depth']} "
               "calls): " + reached_verdicts + ".")
    out += ["", "| site | where | kind | verdict | reaches (asserting functions) |",
            "|---|---|---|---|---|"]
    for site in sites:
        reaches = _reaches(site)
        kind = KIND[site["kind"]]
        if site["kind"] != "validator":
            kind += " " + ", ".join(c.rsplit(".", 1)[-1] for c in site["catches"])
        if site["asserts_in_block"]:
            kind += f"; assert in the block (line {', '.join(map(str, site['asserts_in_block']))})"
        out.append(f"| `{_short(site['qualname'])}` | `{site['file']}:{site['line']}` | {kind} | "
                   f"{_verdict(site)} | {reaches} |")
    return "\n".join(out) + "\n"


def tests_table(release, result) -> str:
    """The ``pytest.raises(AssertionError)`` sites of the release's own tests."""
    sites = [s for s in result["sites"] if s["kind"] == "raises"]
    site_verdicts, reached, reached_verdicts = _counts(sites)
    kept = sum(bool(s["sources"] or s["raises_in_block"] or s["mentions_in_block"]
                    or s["asserts_in_block"]) for s in sites)
    out = [f"### vLLM {release}'s own tests (`audit --tests`, its sdist's `tests/`)", ""]
    out.append(f"{len(sites)} `pytest.raises(AssertionError)` blocks in "
               f"{len({s['test'] for s in sites})} tests ({result['test_files']} files "
               f"scanned): {site_verdicts}; {kept} also meet an AssertionError -O keeps. "
               f"{len(reached)} asserting vLLM functions reached (up to {result['depth']} "
               f"calls): {reached_verdicts}.")
    out += ["", "| test | where | verdict | reaches (asserting vLLM functions) |",
            "|---|---|---|---|"]
    for site in sites:
        kept = [f"{src['kind']}: `{_short(src['qualname'])}`" for src in site["sources"]]
        if site["asserts_in_block"] or site["raises_in_block"] or site["mentions_in_block"]:
            kept.append("AssertionError in the block itself")
        cell = [_reaches(site)] if site["reaches"] else []
        cell += [f"kept under -O: {k}" for k in kept]
        reaches = "<br>".join(cell)
        out.append(f"| `{site['test'].split('::', 1)[1]}` | `{site['file']}:{site['line']}` | "
                   f"{_verdict(site)} | {reaches} |")
    return "\n".join(out) + "\n"


def reasons(results) -> str:
    seen = {}
    for result in results.values():
        for entry in [*result["sites"], *result["reached"]]:
            seen.setdefault(entry["qualname"], entry)
    out = ["### Why, per function", ""]
    for qualname in sorted(seen):
        entry = seen[qualname]
        out.append(f"- `{_short(qualname)}` ({_verdict(entry)}): {entry['why']}")
    return "\n".join(out) + "\n"


def generated(releases: dict, tests: dict = None) -> str:
    """{release: vllm package dir}, {release: its sdist's tests/ dir} -> the text
    between the markers."""
    tests = tests or {}
    results = {release: audit.run(root, tests=tests[release], use_cache=False)
               if release in tests else audit.run(root, use_cache=False)
               for release, root in releases.items()}
    parts = [release_table(release, result) for release, result in results.items()]
    parts += [tests_table(release, results[release]) for release in tests]
    return "\n".join(parts) + "\n" + reasons(results)


def rewrite(path, releases: dict, tests: dict = None) -> bool:
    text = open(path, encoding="utf-8").read()
    new = re.sub(re.escape(BEGIN) + r"\n.*?" + re.escape(END),
                 lambda _: f"{BEGIN}\n{generated(releases, tests)}{END}", text, flags=re.S)
    if new != text:
        with open(path, "w", encoding="utf-8") as f:
            f.write(new)
    return new != text


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    tests_at = [i for i, arg in enumerate(args) if arg == "--tests"]
    tests = {}
    for i in reversed(tests_at):
        tests.update([args[i + 1].split("=", 1)])
        del args[i:i + 2]
    releases = dict(arg.split("=", 1) for arg in args[1:])
    changed = rewrite(args[0], releases, tests)
    print(f"{args[0]}: {'rewritten' if changed else 'unchanged'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
