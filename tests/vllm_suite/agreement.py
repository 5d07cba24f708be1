"""``audit`` agrees with the tier (issue 37 item 3): every test that ``-O`` changes
is explained by the audit, and every test site the audit can decide is one that
``-O`` changes. Used by test_vllm_suite.py on the runs it made; static (the audit
reads source, it imports nothing of vLLM), stdlib and kimi_hotfix.tools.audit only.

**Forward.** Each test whose outcome under ``-O`` without the shim differs from
plain Python is explained by one of, in this order:

- ``test site``: the audit lists a ``pytest.raises(AssertionError)`` block in that
  test (``audit --tests``), reviewed, that reaches a reviewed asserting vLLM
  function (the test steers by a vLLM assert ``-O`` strips);
- ``frame``: the deepest vLLM frame of its failure (the plugin records
  ``vllm/x.py:LINE in func``; under ``-O``, else in plain Python for a test that
  fails there only) lies in a function with a reviewed row for its source;
- ``exercises a site``: the test function's own calls reach, through imports
  only (no by-name hop), within the audit's depth, a vLLM function that holds a
  reviewed AssertionError-steered site of the package (``except
  AssertionError``, ...): the planner's fallbacks, which the merges feed;
- ``by hand``: ``BY_HAND`` (test_vllm_suite.py) names the vLLM function and why
  (an assert with a side effect in an earlier test: nothing static ties them);
  the function must have a reviewed row for its current source.

A row explains when it is ``covered`` or ``uncovered``, or ``harmless`` with
``serves_tests`` set: the reviewer said the path serves tests, not servers (a
harmless row without it claims ``-O`` changes nothing, which a differing test
contradicts).

**Reverse, where the audit can tell.** Each test site of the audit in the tier's
selected files is decided, or not, by these rules, in order (the first that
applies is the reason it cannot tell):

1. not in a test function (a helper: which tests call it is not known statically),
   or in a function nested in a test (whether it runs is not known statically);
2. no test with its id ran (the file marks other tests ``cpu_test``, or it was not
   collected);
3. it reaches no asserting vLLM function within the audit's depth: the audit
   predicts nothing;
4. an AssertionError ``-O`` keeps may satisfy it: an assert or ``raise
   AssertionError`` in the block itself, ``AssertionError`` named there
   (``side_effect=AssertionError``), an explicit ``raise AssertionError`` in a vLLM
   function it reaches, or a helper of the tests it reaches (pytest rewrites their
   asserts into raises);
5. none of its tests passed in plain Python (the block's outcome is not observed).

Every other site is decided: vLLM's assert is the only AssertionError the block can
give, ``-O`` strips it, so its test must differ under ``-O`` without the shim (any
of its parametrizations: a block may run for some parameters only).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kimi_hotfix.tools.audit import reviewed

FRAME = re.compile(r"^(vllm/\S+\.py):(\d+) in (\S+)$")
RAISES = "raises"


def test_key(nodeid: str) -> str:
    """A node id less its parameters: ``file::Class::test``."""
    return nodeid.split("[", 1)[0]


def explains(row) -> bool:
    """A reviewed row that accounts for a test that -O changes (module docstring)."""
    return row is not None and (row.verdict != reviewed.HARMLESS or row.serves_tests)


def _module_of(path: str) -> str:
    module = path[:-len(".py")].replace("/", ".")
    return module[:-len(".__init__")] if module.endswith(".__init__") else module


def enclosing_def(tree, path: str, line: int):
    """(qualified name, hash) of the innermost def of ``path`` around ``line``."""
    module = _module_of(path)
    s = tree.summary(module)
    if s is None:
        return None
    best = None
    for qual, info in s["defs"].items():
        if info["line"] <= line <= info["end"] and (best is None or info["line"] >= best[1]["line"]):
            best = (qual, info)
    return (f"{module}.{best[0]}", best[1]["hash"]) if best else None


def find_def(tree, qualname: str):
    """(qualified name, hash) of a vLLM function named in full, or None."""
    parts = qualname.split(".")
    for i in range(len(parts) - 1, 0, -1):
        module, qual = ".".join(parts[:i]), ".".join(parts[i:])
        s = tree.summary(module) if module in tree.files else None
        if s and qual in s["defs"]:
            return qualname, s["defs"][qual]["hash"]
    return None


def _row(qualname_hash):
    if not qualname_hash or not qualname_hash[1]:
        return None
    return reviewed.lookup(*qualname_hash)[0]


def exercised(tree, resolver, test: str, targets: set, depth: int) -> list:
    """The functions of ``targets`` the test's own calls reach through imports."""
    path, _, qual = test.partition("::")
    module, qual = _module_of(path), qual.replace("::", ".")
    s = tree.summary(module) if module in tree.files else None
    info = s["defs"].get(qual) if s else None
    if info is None:
        return []
    found, seen = [], set()
    frontier = [(module, qual, text) for text in info["calls"]]
    for _level in range(depth):
        following = []
        for mod, fq, text in frontier:
            for ref, how in resolver.call(mod, fq, text):
                if how != "import":
                    continue
                _, target_mod, target_qual = ref
                name = f"{target_mod}.{target_qual}"
                if name in seen:
                    continue
                seen.add(name)
                if name in targets:
                    found.append(name)
                following += [(target_mod, target_qual, t)
                              for t in tree.summary(target_mod)["defs"][target_qual]["calls"]]
        frontier = following
    return sorted(found)


def _reviewed(entry) -> bool:
    return entry["verdict"] != reviewed.NOT_REVIEWED


def test_sites(result) -> list:
    return [s for s in result["sites"] if s["kind"] == RAISES]


def forward(diffs: dict, plain, other, result, tree, resolver, by_hand: dict, depth: int) -> dict:
    """{nodeid: (how, what) or None} for each test in ``diffs`` (files that failed to
    collect in one mode only are left out: no test of theirs ran)."""
    sites: dict = {}
    for site in test_sites(result):
        if site["test"] and _reviewed(site) and any(_reviewed(h) for h in site["reaches"]):
            sites.setdefault(site["test"], []).append(site)
    steering = {s["qualname"] for s in result["sites"]
                if s["kind"] != RAISES and _reviewed(s)
                and explains(reviewed.lookup(s["qualname"], s["hash"])[0])}
    out = {}
    for nodeid in diffs:
        if "::" not in nodeid:
            continue
        key = test_key(nodeid)
        if key in sites:
            site = sites[key][0]
            reached = ", ".join(h["qualname"] for h in site["reaches"] if _reviewed(h))
            out[nodeid] = ("test site", f"{site['file']}:{site['line']} reaches {reached}")
            continue
        frames = [r.results[nodeid]["vllm"] for r in (other, plain)
                  if nodeid in r.results and r.results[nodeid]["vllm"]]
        found = None
        for frame in frames[:1]:
            match = FRAME.match(frame)
            where = enclosing_def(tree, match.group(1), int(match.group(2))) if match else None
            if explains(_row(where)):
                found = ("frame", f"{frame}: {where[0]} ({_row(where).verdict})")
        if found is None:
            hit = exercised(tree, resolver, key, steering, depth)
            if hit:
                found = ("exercises a site", ", ".join(hit))
        if found is None and nodeid in by_hand:
            qualname, _why = by_hand[nodeid]
            if explains(_row(find_def(tree, qualname))):
                found = ("by hand", qualname)
        out[nodeid] = found
    return out


@dataclass
class Reverse:
    decided: dict = field(default_factory=dict)  # "file:line" -> (site, differs: bool)
    cannot: dict = field(default_factory=dict)  # "file:line" -> why


def _kept(site) -> str:
    parts = []
    if site["asserts_in_block"]:
        parts.append(f"an assert in the block (line {', '.join(map(str, site['asserts_in_block']))})")
    if site["raises_in_block"]:
        parts.append("raise AssertionError in the block")
    if site["mentions_in_block"]:
        parts.append("AssertionError named in the block")
    parts += [f"{src['kind']} {src['qualname']}" for src in site["sources"]]
    return "; ".join(parts)


def reverse(result, files, plain, diffs: dict) -> Reverse:
    """Decide each test site in ``files`` (module docstring) and check it."""
    out = Reverse()
    selected = set(files)
    ran: dict = {}
    for nodeid in plain.results:
        ran.setdefault(test_key(nodeid), []).append(nodeid)
    for site in test_sites(result):
        if site["file"] not in selected:
            continue
        where = f"{site['file']}:{site['line']}"
        test = site["test"] or ""
        name = test.rsplit("::", 1)[-1]
        nodeids = ran.get(test, [])
        kept = _kept(site)
        if not name.startswith("test"):
            why = "in a helper, not a test: which tests call it is not known statically"
        elif site["nested"]:
            why = "in a function nested in the test: whether it runs is not known statically"
        elif not nodeids:
            why = "no test with this id ran (deselected: its file marks others cpu_test; or not collected)"
        elif not site["reaches"]:
            why = "reaches no asserting vLLM function within the audit's depth"
        elif kept:
            why = "an AssertionError -O keeps may satisfy it: " + kept
        elif not any(plain.results[n]["outcome"] == "passed" for n in nodeids):
            outcomes = sorted({plain.results[n]["outcome"] for n in nodeids})
            why = f"did not pass in plain Python ({', '.join(outcomes)})"
        else:
            out.decided[where] = (site, any(n in diffs for n in nodeids))
            continue
        out.cannot[where] = why
    return out
