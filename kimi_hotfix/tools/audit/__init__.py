"""``python -m kimi_hotfix audit [--json]``: where the installed vLLM steers by
AssertionError, and what ``python -O`` does to each place.

A static scan (kimi_hotfix.tools.audit.scan): it imports nothing of vLLM, reads its
source, caches per-module summaries by file hash (kimi_hotfix.tools.audit.cache) and
lists

- handlers that catch AssertionError (alone or in a tuple),
- ``contextlib.suppress(AssertionError)`` blocks,
- pydantic validators that hold ``assert`` (pydantic turns AssertionError into
  ValidationError: ``-O`` removes the validation),

each with the functions holding bare asserts that its guarded block reaches.

With ``--tests DIR`` (a vLLM sdist's ``tests/``: the wheel ships none), one more
kind: ``raises``, a ``pytest.raises(AssertionError)`` block of vLLM's own tests,
with the asserting functions of vLLM its calls reach. vLLM steers by those
asserts in its tests, not in its code: the package scan cannot see them.
Each site and each reached function is classified from the one reviewed table
(kimi_hotfix.tools.audit.reviewed), by qualified name and normalised source hash:
covered by a patch, harmless (why), uncovered (why), or not reviewed (new, or
changed since review).

Exit status: 0 every site and reached function is reviewed; 1 some are not
(new or changed since review); 2 vLLM is not installed (or --root is not a
package directory).
"""

from __future__ import annotations

import json
import sys
import textwrap

from kimi_hotfix.tools.audit import reviewed as _reviewed

CLASSES = (_reviewed.COVERED, _reviewed.HARMLESS, _reviewed.UNCOVERED, _reviewed.NOT_REVIEWED)


def _classify(entry):
    row, changed = _reviewed.lookup(entry["qualname"], entry["hash"])
    if row is None:
        entry["verdict"] = _reviewed.NOT_REVIEWED
        entry["patch"] = None
        entry["changed"] = changed
        entry["why"] = ("changed since review (reviewed sources: " + ", ".join(
            f"{h} in {rel}" for h, rel in _reviewed.reviewed_hashes(entry["qualname"]).items())
            + ")") if changed else "not in the reviewed table"
    else:
        entry["verdict"] = row.verdict
        entry["patch"] = row.patch or None
        entry["changed"] = False
        entry["why"] = row.why
    entry["patch_armed"] = _armed(entry["patch"]) if entry["patch"] else None
    return entry


def _armed(patch):
    """Whether the shim arms ``patch`` (-O parity, or listed in PATCHES), not only ships it."""
    from kimi_hotfix.patches import PATCHES

    return patch == _reviewed.O_PARITY or patch in PATCHES


def classify(result: dict) -> dict:
    """Add verdicts and counts to a raw ``scan.scan()`` result (in place)."""
    reached: dict = {}
    for site in result["sites"]:
        _classify(site)
        for hit in site["reaches"]:
            _classify(hit)
            reached.setdefault(hit["qualname"], hit)
    result["reached"] = [reached[k] for k in sorted(reached)]
    kinds = ("except", "suppress", "validator") + (("raises",) if "tests" in result else ())
    result["counts"] = {
        "sites": {c: sum(s["verdict"] == c for s in result["sites"]) for c in CLASSES},
        "kinds": {k: sum(s["kind"] == k for s in result["sites"]) for k in kinds},
        "reached": {c: sum(r["verdict"] == c for r in result["reached"]) for c in CLASSES},
        "changed": sum(bool(s["changed"]) for s in result["sites"])
        + sum(bool(r["changed"]) for r in result["reached"]),
    }
    result["all_reviewed"] = (result["counts"]["sites"][_reviewed.NOT_REVIEWED] == 0
                              and result["counts"]["reached"][_reviewed.NOT_REVIEWED] == 0)
    return result


def run(root=None, *, tests=None, depth=None, use_cache=True, keep=None) -> dict:
    """Scan and classify; ``{"error": ...}`` where there is nothing to scan.
    ``tests``: a vLLM sdist's ``tests/`` directory (its ``pytest.raises
    (AssertionError)`` blocks are sites too); ``keep``: see ``scan.scan``."""
    import time

    from kimi_hotfix import __version__
    from kimi_hotfix.tools.audit import scan

    t0 = time.perf_counter()
    result = scan.scan(root, depth=depth or scan.DEFAULT_DEPTH, use_cache=use_cache,
                       tests=tests, keep=keep)
    if "error" in result:
        return result
    t1 = time.perf_counter()
    classify(result)
    result["timings"]["classify_s"] = round(time.perf_counter() - t1, 3)
    result["timings"]["total_s"] = round(time.perf_counter() - t0, 3)
    result["kimi_hotfix"] = __version__
    result["python"] = sys.version.split()[0]
    return result


# -- text report ------------------------------------------------------------------


def _wrap(text, indent, width=100):
    return textwrap.fill(text, width, initial_indent=indent, subsequent_indent=indent) + "\n"


def _label(entry):
    if entry["verdict"] == _reviewed.COVERED:
        armed = "" if entry["patch_armed"] else " (shipped, not armed yet)"
        return f"covered by {entry['patch']}{armed}"
    if entry["verdict"] == _reviewed.NOT_REVIEWED and entry["changed"]:
        return "NOT REVIEWED (changed since review)"
    return entry["verdict"].upper() if entry["verdict"] == _reviewed.NOT_REVIEWED else entry["verdict"]


def print_report(result, out=None, verbose=False):
    out = out or sys.stdout
    w = out.write
    c = result["counts"]
    dist = f" ({result['distribution']})" if result.get("distribution") else ""
    w(f"kimi-hotfix audit: vLLM {result['version']}{dist} at {result['root']}\n")
    if "tests" in result:
        w(f"and its tests at {result['tests']} ({result['test_files']} files)\n")
    w(f"{len(result['sites'])} sites steer by AssertionError: "
      + ", ".join(f"{n} {k}" for k, n in c["kinds"].items()) + "\n")
    w("  " + ", ".join(f"{k}: {n}" for k, n in c["sites"].items()) + "\n")
    w(f"{len(result['reached'])} functions with bare asserts reached from them "
      f"(up to {result['depth']} calls deep): "
      + ", ".join(f"{k}: {n}" for k, n in c["reached"].items()) + "\n\n")
    order = {k: i for i, k in enumerate((_reviewed.NOT_REVIEWED, _reviewed.UNCOVERED,
                                         _reviewed.COVERED, _reviewed.HARMLESS))}
    for site in sorted(result["sites"], key=lambda s: (order[s["verdict"]], s["file"], s["line"])):
        what = {"except": "except " + ", ".join(site["catches"]),
                "suppress": "suppress(" + ", ".join(site["catches"]) + ")",
                "validator": "pydantic validator with assert",
                "raises": "a test's pytest.raises(" + ", ".join(site["catches"]) + ")",
                }[site["kind"]]
        w(f"[{_label(site)}] {site['file']}:{site['line']}  {what}\n")
        w(f"    {site.get('test') or site['qualname']}\n")
        if site["asserts_in_block"]:
            w(f"    asserts in the guarded block: lines "
              f"{', '.join(map(str, site['asserts_in_block']))}\n")
        if site.get("raises_in_block") or site.get("mentions_in_block"):
            w(f"    AssertionError named in the block (kept under -O): lines "
              f"{', '.join(map(str, site['raises_in_block'] + site['mentions_in_block']))}\n")
        if verbose or site["verdict"] != _reviewed.HARMLESS:
            w(_wrap(site["why"], "    "))
        for hit in site["reaches"]:
            how = "by name, " if hit["how"] == "by name" else ""
            w(f"    -> {hit['qualname']} ({how}{hit['depth']} call{'s' * (hit['depth'] > 1)}; "
              f"{len(hit['asserts'])} assert{'s' * (len(hit['asserts']) != 1)}) "
              f"[{_label(hit)}]\n")
        for src in site.get("sources", []):
            how = "by name, " if src["how"] == "by name" else ""
            w(f"    -> {src['qualname']} ({how}{src['depth']} call{'s' * (src['depth'] > 1)}): "
              f"{src['kind']}, kept under -O (lines {', '.join(map(str, src['lines']))})\n")
        w("\n")
    t = result["timings"]
    cache = result["cache"]
    cache_text = (f"cache {cache['directory']}: {cache['read']} read, {cache['written']} written"
                  + (f", {cache['why']}" if cache.get("why") else "")) if cache.get("used") \
        else f"no cache ({cache.get('why')})"
    w(f"{result['files']} modules, {result['parsed']} parsed, {result['cache_hits']} from the "
      f"cache; {cache_text}\n")
    w(f"timings: read and hash {t['read_and_hash_s']:.2f} s, scan {t['scan_s']:.2f} s, "
      f"total {t['total_s']:.2f} s\n")
    if result["unparsed"]:
        w(f"could not parse: {', '.join(result['unparsed'])}\n")
    if not result["all_reviewed"]:
        w("some sites or reached functions are not reviewed: see kimi_hotfix/tools/audit/reviewed.py\n")


# -- command line ---------------------------------------------------------------------


def add_parser(sub):
    """The ``audit`` subcommand (kimi_hotfix.tools.cli)."""
    au = sub.add_parser("audit", help="static scan of the installed vLLM for code that steers "
                                      "by AssertionError (does not import vLLM)")
    au.add_argument("--json", action="store_true", help="print one JSON object")
    au.add_argument("--root", help="scan this vllm package directory instead of the installed one")
    au.add_argument("--tests", metavar="DIR",
                    help="also scan vLLM's own tests (a vLLM sdist's tests/ directory: "
                         "scripts/get-sdist) for pytest.raises(AssertionError) blocks")
    au.add_argument("--depth", type=int, default=None,
                    help="call hops followed from a guarded block (default 2)")
    au.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")
    au.add_argument("-v", "--verbose", action="store_true", help="print every reason")
    return au


def main(args) -> int:
    import os

    if args.root and not os.path.isfile(os.path.join(args.root, "__init__.py")):
        message = f"kimi-hotfix audit: {args.root} is not a package directory"
        result = {"error": message}
    elif args.tests and not os.path.isdir(args.tests):
        result = {"error": f"kimi-hotfix audit: --tests {args.tests} is not a directory"}
    else:
        result = run(args.root, tests=args.tests, depth=args.depth, use_cache=not args.no_cache)
    if "error" in result:
        if args.json:
            print(json.dumps(result))
        print(result["error"], file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print_report(result, verbose=args.verbose)
    return 0 if result["all_reviewed"] else 1
