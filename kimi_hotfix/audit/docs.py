"""docs/audit.md's generated part: the audit's table for each release.

    python -m kimi_hotfix.audit.docs docs/audit.md RELEASE=VLLM_PACKAGE_DIR ...

Rewrites the text between ``<!-- audit-tables -->`` and ``<!-- /audit-tables -->``
in the given file with one table per release (the audit of that ``vllm/``
directory, no cache), then the reasons, once per reviewed function. The
real-wheel tests regenerate it and compare (tests/real/test_audit.py).
"""

from __future__ import annotations

import re
import sys

from kimi_hotfix import audit
from kimi_hotfix.audit import reviewed

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


def release_table(release, result) -> str:
    c = result["counts"]
    out = [f"### vLLM {release}", ""]
    out.append(f"{len(result['sites'])} sites ("
               + ", ".join(f"{n} {k}" for k, n in c["kinds"].items()) + "): "
               + ", ".join(f"{n} {k}" for k, n in c["sites"].items() if n) + ". "
               + f"{len(result['reached'])} asserting functions reached (up to {result['depth']} "
               "calls): " + ", ".join(f"{n} {k}" for k, n in c["reached"].items() if n) + ".")
    out += ["", "| site | where | kind | verdict | reaches (asserting functions) |",
            "|---|---|---|---|---|"]
    for site in result["sites"]:
        reaches = "<br>".join(
            f"`{_short(h['qualname'])}`{' (by name)' if h['how'] == 'by name' else ''}: "
            f"{_verdict(h)}" for h in site["reaches"]) or ""
        kind = KIND[site["kind"]]
        if site["kind"] != "validator":
            kind += " " + ", ".join(c.rsplit(".", 1)[-1] for c in site["catches"])
        if site["asserts_in_block"]:
            kind += f"; assert in the block (line {', '.join(map(str, site['asserts_in_block']))})"
        out.append(f"| `{_short(site['qualname'])}` | `{site['file']}:{site['line']}` | {kind} | "
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


def generated(releases: dict) -> str:
    """{release: vllm package dir} -> the text between the markers."""
    results = {release: audit.run(root, use_cache=False) for release, root in releases.items()}
    parts = [release_table(release, result) for release, result in results.items()]
    return "\n".join(parts) + "\n" + reasons(results)


def rewrite(path, releases: dict) -> bool:
    text = open(path, encoding="utf-8").read()
    new = re.sub(re.escape(BEGIN) + r"\n.*?" + re.escape(END),
                 lambda _: f"{BEGIN}\n{generated(releases)}{END}", text, flags=re.S)
    if new != text:
        with open(path, "w", encoding="utf-8") as f:
            f.write(new)
    return new != text


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    releases = dict(arg.split("=", 1) for arg in args[1:])
    changed = rewrite(args[0], releases)
    print(f"{args[0]}: {'rewritten' if changed else 'unchanged'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
