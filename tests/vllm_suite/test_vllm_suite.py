"""vLLM's own tests, from its release sdist, three ways (issue 37): under ``python -O``
with the shim, vLLM passes its own tests exactly as in plain Python.

vLLM 0.29.0's sdist carries its ``tests/``; the tier runs the files selection.py picks
(the KV-cache core, the connector and planner tests, the files that import what the
shim patches or what the audit found steering by AssertionError) against the installed
0.29.0 wheel, in three modes at once, and compares them test by test (nodeid ->
outcome):

- plain Python, the shim off PYTHONPATH: the reference;
- ``python -O``, the shim off PYTHONPATH: proves the runs see ``-O`` (it must differ);
- ``python -O``, the repository root first on PYTHONPATH (as operators deploy it).

pytest rewrites the test modules' asserts (and, through kimi_suite_plugin, those of
vLLM's test helpers), so under ``-O`` the tests still check while vLLM's own asserts
are stripped. Any test whose outcome under ``-O`` with the shim differs from plain
Python fails the tier, unless ``ALLOWED`` names it with a reason; an allowed test that
no longer differs (stale) or is gone fails too. Tests that fail the same way in every
mode (models from the hub, offline here) do not count: only differences do.

``audit`` agrees with the tier (agreement.py): every test that ``-O`` changes (without
the shim) is explained by a site or a reviewed function of the audit, which the tier runs
with ``--tests`` on the sdist's tests (static: it imports nothing of vLLM); and every test
site the audit can decide, in the selected files, is a test that ``-O`` changes.

Cost: one pytest process per mode (three that import vLLM), plus whatever vLLM's tests
start themselves (counted by the plugin); the summary line gives the CPU-seconds.
"""

from __future__ import annotations

import re
import resource
import time
from pathlib import Path

import agreement
import pytest
import selection
import suite

from kimi_hotfix.patches import PATCHES

# nodeid -> why its outcome under -O with the shim may differ from plain Python without
# it. The one accepted kind: the test pins a behaviour that a patch deliberately replaces
# with a later upstream fix, named by its PR. "The test expects an AssertionError" is not
# a reason: that is the difference the tier exists to find.
ALLOWED = {
    "tests/v1/attention/test_mla_noncausal.py::test_mla_cache_marker_is_a_group_property":
        "pins 0.29.0's MLAAttentionSpec.merge refusing to merge a marked (DSpark draft) and an "
        "unmarked MLA spec; the shim's kv_spec_merge merges the non-causal capability with "
        "any(), upstream's own fix (vLLM PR #55234, in 0.30.0)",
}
UPSTREAM_PR = re.compile(r"PR #\d+")
# nodeid -> (the vLLM function, why): differences under -O without the shim that nothing
# static ties to vLLM code (agreement.py's last resort). The function must have a reviewed
# row for its current source; an entry whose test no longer differs, or that the audit
# explains by itself, is stale.
BY_HAND = {
    f"tests/v1/worker/test_mamba_utils.py::{name}": (
        "vllm.distributed.kv_transfer.kv_connector.v1.ssm_conv_transfer_utils."
        "derive_mamba_conv_split",
        "fails in plain Python, passes under -O: an earlier test_nixl_connector_hma.py test "
        "sets VLLM_SSM_CONV_STATE_LAYOUT=DS and derive_mamba_conv_split's `assert "
        "is_conv_state_dim_first()` caches that layout (lru_cache) for the process; -O "
        "strips the assert and its call, so this test sees the default layout")
    for name in ("test_mamba_groups_support_different_state_specs",
                 "test_mamba_groups_support_mixed_specs_in_uniform_group")
}
# what each mode must be, written here rather than read from suite.MODES: (optimize
# flag, the shim loaded and armed)
EXPECTED = {"plain": (0, False), "O": (1, False), "O+shim": (1, True), "plain+shim": (0, True)}


@pytest.fixture(scope="session")
def tier(request, tmp_path_factory):
    """Everything the tier computes once: the selection, the runs, their differences."""
    t0, cpu0 = time.monotonic(), _own_cpu()
    from kimi_hotfix.tools import audit
    python = suite.vllm_python()
    venv = suite.site_packages(Path(python).parents[1])
    tree = suite.sdist()
    scanned: dict = {}  # the audit's tree and resolver: agreement.py asks them more
    result = audit.run(root=venv / "vllm", tests=tree / "tests", keep=scanned)
    if "error" in result:
        pytest.fail(f"audit of {venv / 'vllm'}: {result['error']}")
    modules = set(PATCHES.values()) | selection.audit_modules(result)
    found = selection.rule_files(tree, modules)
    files = selection.selected(found)
    modes = suite.MODES + ((suite.PLAIN_SHIM,) if request.config.getoption("--plain-shim") else ())
    work = tmp_path_factory.mktemp("vllm-suite")
    runs = suite.run_modes(python, files, modes, work=work, tree=suite.run_tree(tree, work),
                           deps=suite.suite_deps())
    plain = runs[suite.PLAIN.name]
    diffs = {name: suite.differences(plain, run) for name, run in runs.items() if run is not plain}
    t = {"python": python, "site": venv, "sdist": tree, "modules": modules, "found": found,
         "files": files, "runs": runs, "diffs": diffs, "work": work, "audit": result,
         "scanned": scanned}
    t["forward"], t["reverse"] = agree(t)
    _report(t, time.monotonic() - t0, _own_cpu() - cpu0)
    return t


def agree(t, result=None, by_hand=None):
    """(forward, reverse) of agreement.py on this session's runs; ``result`` and
    ``by_hand`` default to the audit's and BY_HAND (the broken variants pass others)."""
    result = t["audit"] if result is None else result
    plain, off = t["runs"][suite.PLAIN.name], t["runs"][suite.O_OFF.name]
    diffs = t["diffs"][suite.O_OFF.name]
    forward = agreement.forward(diffs, plain, off, result, t["scanned"]["tree"],
                                t["scanned"]["resolver"], BY_HAND if by_hand is None else by_hand,
                                result["depth"])
    return forward, agreement.reverse(result, t["files"], plain, diffs)


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _report(t, wall, own_cpu):
    runs, diffs, say = t["runs"], t["diffs"], suite.REPORT.append
    say(f"vLLM {suite.RELEASE}'s own tests (its sdist), {len(t['files'])} files ({len(t['found'])} "
        f"found by the rule, {len(selection.EXCLUDED)} excluded), PYTHONHASHSEED={suite.HASH_SEED}:")
    for run in runs.values():
        say(f"  {run.mode.label:15} {suite.describe(run)}")
    counts = ", ".join(f"{runs[name].mode.label} {len(d)}" for name, d in diffs.items())
    say(f"  tests whose outcome differs from plain Python without the shim: {counts} "
        f"(allowed: {len(ALLOWED)})")
    shimmed = [name for name in diffs if runs[name].mode.shim]
    for name, d in diffs.items():
        label = runs[name].mode.label
        if runs[name].mode.shim:
            rows = {n: ("allowed" if n in ALLOWED else "DIFFERS") for n in d}
            say(f"  {label}, differing from plain Python without the shim ({len(d)}):")
        else:  # the ones the shim does not give back are listed under its mode
            rows = {n: "" for n in d if not any(n in diffs[m] for m in shimmed)}
            say(f"  {label}, differing; the shim gives these back ({len(rows)} of {len(d)}):")
        for nodeid, mark in rows.items():
            a, b, line, frame = d[nodeid]
            say(f"    {mark + ': ' if mark else ''}{nodeid}: {a} -> {b}"
                + (f": {line[:160]}" if line else "") + (f" [{frame}]" if frame else ""))
    forward, reverse = t["forward"], t["reverse"]
    how: dict = {}
    for found in forward.values():
        key = found[0] if found else "UNEXPLAINED"
        how[key] = how.get(key, 0) + 1
    sites = agreement.test_sites(t["audit"])
    say(f"  audit --tests agreement: {len(sites)} test sites in vLLM's tests "
        f"({len({h['qualname'] for s in sites for h in s['reaches']})} asserting vLLM functions "
        f"reached); forward: {sum(map(bool, forward.values()))} of {len(forward)} differences "
        f"under -O without the shim explained (" + ", ".join(f"{k} {n}" for k, n in how.items())
        + f"); reverse: {len(reverse.decided) + len(reverse.cannot)} test sites in the selected "
        f"files, {len(reverse.decided)} decided ({sum(d for _, d in reverse.decided.values())} "
        f"differ), {len(reverse.cannot)} it cannot tell:")
    for where, why in reverse.cannot.items():
        say(f"    cannot tell: {where}: {why}")
    started = {k: sum(r.data.get("started", {}).get(k, 0) for r in runs.values())
               for k in ("forks", "subprocesses")}
    commands: dict = {}
    for r in runs.values():
        for program, n in r.data.get("started", {}).get("commands", {}).items():
            commands[program] = commands.get(program, 0) + n
    programs = ", ".join(f"{p} {n}" for p, n in sorted(commands.items()))
    pythons = sum(n for p, n in commands.items() if p.startswith("python"))
    cpu = sum(r.cpu for r in runs.values())
    say(f"vLLM-suite tier, processes that import vLLM: {len(runs) + pythons} ({len(runs)} pytest, "
        f"one per mode, at once; {pythons} pythons vLLM's tests started: vLLM's model registry "
        f"inspects models in a subprocess); in all, vLLM and its tests forked {started['forks']} "
        f"times and started {started['subprocesses']} subprocesses ({programs}); "
        f"{cpu + own_cpu:.0f} CPU-s ({cpu:.0f} in the runs, {own_cpu:.0f} selecting), "
        f"{wall:.0f} s")


def _outcome_line(run, nodeid):
    entry = run.results.get(nodeid)
    return f"{run.outcome(nodeid)}" + (f": {entry['line'][:200]}" if entry and entry["line"] else "")


def test_the_selection_is_the_rule_less_the_reviewed_exclusions(tier):
    found, files = tier["found"], tier["files"]
    assert selection.check_exclusions(found) == []
    assert set(selection.NAMED) <= set(files), set(selection.NAMED) - set(files)
    # every file the rule finds is run or excluded with a reason, and the run covers
    # every test file under tests/v1/core/
    assert set(found) == set(files) | set(selection.EXCLUDED)
    core = sorted(p.relative_to(tier["sdist"]).as_posix()
                  for p in (tier["sdist"] / "tests" / "v1" / "core").rglob("test_*.py"))
    assert set(core) <= set(files)


def test_every_run_tested_the_installed_wheel_in_its_mode(tier):
    site = str(tier["site"])
    problems = []
    for run in tier["runs"].values():
        data, label = run.data, run.mode.label
        if not data:
            problems.append(f"{label}: no record (rc {run.rc}):\n{run.tail()}")
            continue
        # pytest ran to its end (0: all passed, 1: some failed), not interrupted or refused
        if run.rc not in (0, 1) or data["exitstatus"] not in (0, 1):
            problems.append(f"{label}: exit {run.rc}:\n{run.tail()}")
        if not data["vllm_file"].startswith(site + "/vllm/"):
            problems.append(f"{label}: imported vllm from {data['vllm_file']}, not {site}")
        optimize, armed = EXPECTED[run.mode.name]
        if data["optimize"] != optimize:
            problems.append(f"{label}: sys.flags.optimize {data['optimize']}, not {optimize}")
        if not data.get("cleanups"):  # vLLM's cleanup ran after the tests, its gc made young
            problems.append(f"{label}: vLLM's cleanup never ran through the plugin's collections")
        if data["hash_seed"] != suite.HASH_SEED:
            problems.append(f"{label}: PYTHONHASHSEED {data['hash_seed']}")
        shim = data["shim"]
        if not armed and shim != {"loaded": False}:
            problems.append(f"{label}: the shim is loaded: {shim}")
        elif armed:
            states = shim.get("states", {})
            if not shim.get("armed") or "error" in shim or set(states) != set(PATCHES):
                problems.append(f"{label}: the shim is not armed with every patch: {shim}")
            elif [n for n, st in states.items() if st["kind"] == "failed"] or \
                    states["kv_spec_merge"]["kind"] != "applied":  # ALLOWED's reason
                problems.append(f"{label}: patch states {states}")
    assert problems == [], "\n".join(problems)


def test_every_mode_ran_the_same_tests_and_every_selected_file_ran(tier):
    runs = tier["runs"]
    plain = runs[suite.PLAIN.name]
    ran = {nodeid.split("::", 1)[0] for nodeid in plain.results}
    assert sorted(set(tier["files"]) - ran) == [], "selected files that ran no test in plain Python"
    for run in runs.values():
        assert set(run.results) == set(plain.results), run.mode.label
        assert run.data["collect_errors"] == plain.data["collect_errors"], run.mode.label


def test_the_runs_see_python_O(tier):
    """Without the shim, -O must change some outcome: else the tier measures nothing."""
    assert tier["diffs"][suite.O_OFF.name], "no test differs under -O without the shim"


def unexplained(diffs: dict, allowed: dict) -> dict:
    """The differences no allow-list entry names."""
    return {nodeid: d for nodeid, d in diffs.items() if nodeid not in allowed}


def allow_list_problems(plain, diffs: dict, allowed: dict) -> list:
    """Each entry must name a test that ran, that still differs, with a reason naming
    the upstream PR; an entry that no longer differs is stale."""
    problems = []
    for nodeid, why in allowed.items():
        if nodeid not in plain.results:
            problems.append(f"{nodeid}: allowed, but not run (gone)")
        elif nodeid not in diffs:
            problems.append(f"{nodeid}: allowed, but no longer differs (stale)")
        if not UPSTREAM_PR.search(why):
            problems.append(f"{nodeid}: its reason names no upstream PR")
    return problems


def test_under_O_the_shim_gives_vllm_its_own_test_results(tier):
    runs = tier["runs"]
    plain, shim = runs[suite.PLAIN.name], runs[suite.O_SHIM.name]
    differ = {nodeid: f"{_outcome_line(plain, nodeid)} -> {_outcome_line(shim, nodeid)}"
              + (f" [{d[3]}]" if d[3] else "")
              for nodeid, d in unexplained(tier["diffs"][suite.O_SHIM.name], ALLOWED).items()}
    assert differ == {}, f"{len(differ)} tests differ under -O with the shim:\n" + "\n".join(
        f"{k}: {v}" for k, v in differ.items())


def test_the_allow_list_is_current(tier):
    plain = tier["runs"][suite.PLAIN.name]
    assert allow_list_problems(plain, tier["diffs"][suite.O_SHIM.name], ALLOWED) == []


def test_the_gate_fails_on_what_it_must(tier):
    """The gate on this session's own runs, with broken allow-lists and comparisons (no
    process more): without its entry the allowed test fails the tier; an entry for a test
    that passes alike in every mode is stale; one for a test that did not run is gone; a
    reason without a PR is refused; and the comparison sees an outcome changed, a test
    missing and a file that failed to collect in one mode only."""
    plain = tier["runs"][suite.PLAIN.name]
    diffs = tier["diffs"][suite.O_SHIM.name]
    assert set(ALLOWED) <= set(unexplained(diffs, {}))
    same = next(n for n, e in sorted(plain.results.items())
                if e["outcome"] == "passed" and n not in diffs)
    assert allow_list_problems(plain, diffs, {same: "PR #1"}) == [f"{same}: allowed, but no "
                                                                   "longer differs (stale)"]
    assert allow_list_problems(plain, diffs, {"tests/gone.py::test": "PR #1"}) == [
        "tests/gone.py::test: allowed, but not run (gone)"]
    assert allow_list_problems(plain, diffs, {same: "expects an AssertionError"}) == [
        f"{same}: allowed, but no longer differs (stale)", f"{same}: its reason names no upstream PR"]
    entry = {"outcome": "passed", "line": "", "vllm": ""}
    base = suite.Run(suite.PLAIN, [], data={"results": {"a::t": entry, "b::t": entry},
                                            "collect_errors": {}})
    other = suite.Run(suite.O_SHIM, [], data={
        "results": {"a::t": dict(entry, outcome="failed", line="boom")},
        "collect_errors": {"c.py": "ImportError"}})
    assert suite.differences(base, other) == {
        "a::t": ("passed", "failed", "boom", ""), "b::t": ("passed", "absent", "", ""),
        "c.py": ("collected", "collection error", "ImportError", "")}
    assert suite.differences(base, base) == {}


def test_every_difference_under_O_is_explained_by_the_audit(tier):
    """Forward (agreement.py): each test -O changes is a test site of the audit, or fails
    in a reviewed function, or exercises a reviewed site, or is in BY_HAND."""
    unexplained = sorted(n for n, found in tier["forward"].items() if found is None)
    diffs = tier["diffs"][suite.O_OFF.name]
    assert unexplained == [], "\n".join(f"{n}: {diffs[n][:2]} {diffs[n][3]}" for n in unexplained)
    assert tier["audit"]["all_reviewed"], "audit --tests on 0.29.0: not every site is reviewed"


def test_every_test_site_the_audit_decides_differs_under_O(tier):
    """Reverse (agreement.py): a test site in the selected files whose block can give an
    AssertionError only through vLLM's bare asserts is a test that -O changes."""
    reverse = tier["reverse"]
    same = {where: site["test"] for where, (site, differs) in reverse.decided.items()
            if not differs}
    assert same == {}, "decided by the audit, but their tests do not differ under -O"
    assert reverse.decided, "the audit decides no test site of the selected files"


def test_the_by_hand_list_is_current(tier):
    diffs = tier["diffs"][suite.O_OFF.name]
    problems = [f"{n}: no longer differs (stale)" for n in BY_HAND if n not in diffs]
    alone = agree(tier, by_hand={})[0]
    problems += [f"{n}: the audit explains it by itself ({alone[n][0]}): stale"
                 for n in BY_HAND if alone.get(n)]
    assert problems == []


def test_the_agreement_fails_on_what_it_must(tier, monkeypatch):
    """Both checks on this session's runs (no process more), broken: a reviewed row
    dropped leaves the differences it explained unexplained (a test site's row, a
    frame's row, BY_HAND's function); a harmless row that does not say its path serves
    tests explains nothing; a fake test site, decided, for a test that passes alike in
    every mode is a reverse failure."""
    import copy

    from kimi_hotfix.tools import audit
    from kimi_hotfix.tools.audit import reviewed

    forward = tier["forward"]
    original = reviewed.TABLE

    def without(*names):
        table = {k: v for k, v in original.items() if k not in names}
        monkeypatch.setattr(reviewed, "TABLE", table)
        result = audit.classify(copy.deepcopy(tier["audit"]))
        return {n for n, found in agree(tier, result)[0].items() if found is None}

    pinned = "tests/v1/core/test_single_type_kv_cache_manager.py::" \
        "test_mamba_speculative_block_relocation_requires_exclusive_ownership"
    assert forward[pinned][0] == "test site"
    assert without("tests.v1.core.test_single_type_kv_cache_manager."
                   "test_mamba_speculative_block_relocation_requires_exclusive_ownership") == {pinned}
    framed = {n for n, found in forward.items()
              if found and found[0] == "frame" and "AttentionImplBase.__new__" in found[1]}
    assert framed and without("vllm.v1.attention.backend.AttentionImplBase.__new__") == framed
    assert without(BY_HAND[next(iter(BY_HAND))][0]) == set(BY_HAND)
    monkeypatch.undo()
    # the same row, harmless but not marked as serving tests: the frames it explained fail
    rows = reviewed.TABLE["vllm.v1.attention.backend.AttentionImplBase.__new__"]
    monkeypatch.setitem(reviewed.TABLE, "vllm.v1.attention.backend.AttentionImplBase.__new__",
                        [reviewed.Review(r.qualname, r.hashes, r.verdict, r.why) for r in rows])
    assert {n for n, found in agree(tier)[0].items() if found is None} == framed
    monkeypatch.undo()
    # a fake site: a test that passes in every mode, its block reaching a covered merge
    plain = tier["runs"][suite.PLAIN.name]
    diffs = tier["diffs"][suite.O_OFF.name]
    same = next(n for n, e in sorted(plain.results.items()) if e["outcome"] == "passed"
                and n not in diffs and "[" not in n and n.startswith("tests/v1/core/"))
    real = next(site for site, _ in tier["reverse"].decided.values())  # a block it decides
    fake = dict(real, file=same.split("::")[0], line=99999, test=same)
    broken = dict(tier["audit"], sites=[*tier["audit"]["sites"], fake])
    reverse = agree(tier, broken)[1]
    assert reverse.decided[f"{fake['file']}:99999"] == (fake, False)
    assert [w for w, (_, d) in reverse.decided.items() if not d] == [f"{fake['file']}:99999"]


def test_plain_python_with_the_shim(tier):
    """Only with --plain-shim (a fourth vLLM process; conftest.py deselects it otherwise):
    in plain Python too, the shim changes no outcome beyond the allow-list."""
    assert unexplained(tier["diffs"][suite.PLAIN_SHIM.name], ALLOWED) == {}
