"""``check`` (the preflight) and ``status`` on the real vLLM releases.

- ``needed`` equals the probes' result on vLLM as released, taken from a child
  with KIMI_HOTFIX=0 (the bugs, reproduced in this run); every needed patch
  fixes its probe; the shim's own decision agrees; exit 0;
- with KIMI_HOTFIX=0 check finds the same needs, says disabled, exits 1;
- the decisions per release (the brief's version table): 0.28.0 plain needs
  nothing (RecoverSSM "not affected"), -O only -O parity on every release,
  0.29.0 -O all four, 0.30.0 plain only kda_overlong_rows, 0.33.0 plain none;
- every optimize level is reported: a plain run's checks name what -O needs and
  an -O run's what plain needs, and the two runs agree; ``removable`` only
  where no level needs anything (never on 0.28.0 to 0.33.0: -O needs -O
  parity everywhere);
- ``status``'s version-based expectation matches what check finds;
- ``--json`` is exactly one object on stdout; check leaves the states as found;
  ``python -m kimi_hotfix check`` (run first in the child, before anything else
  is imported) prints the report's verdict and exits as ``--json`` says;
- a check that raises is never "not needed": on 0.33.0 with a spec constructor
  that fails in the probe, plain and -O apply to be safe and warn (under -O
  parity keeps the merges' asserts live: the grouping is plain Python's),
  strict raises;
- scripts/demo shows the probes side by side on 0.29.0 under -O (its preflight
  half, ``--quick``; the served half, scripts/serve-demo, starts real servers and
  runs in scripts/test's end-to-end phase).
"""

from __future__ import annotations

import json
import subprocess

import pytest

from harness import child, reference, venv_python
from helpers import PATCHES, REPO, hermetic_env, run_python, summaries, warning_lines

CHECKED = ("0.28.0", "0.29.0", "0.30.0", "0.33.0", "0.29.0-py3.12")
PROBED = ["o_parity", *PATCHES]  # what check reports: -O parity, then the patches
# the brief's version table, release by release: what check must find (-O: -O parity
# too, on every release: vLLM steers by assert in all of them)
NEEDED = {
    ("0.28.0", "plain"): [],
    ("0.28.0", "O"): ["o_parity"],
    ("0.29.0", "plain"): ["kv_spec_merge", "capture_workspace", "kda_overlong_rows"],
    ("0.29.0", "O"): PROBED,
    ("0.30.0", "plain"): ["kda_overlong_rows"],
    ("0.30.0", "O"): ["o_parity", "kda_overlong_rows"],
    ("0.33.0", "plain"): [],
    ("0.33.0", "O"): ["o_parity"],
}


def check_report(run):
    section = run["check"]
    return json.loads(section["stdout"]), section  # one JSON object, or this raises


@pytest.mark.releases(*CHECKED)
@pytest.mark.parametrize("mode", ["plain", "O"])
def test_check_finds_what_the_brief_says(release, mode):
    report, section = check_report(child(release, "on", mode))
    expected = NEEDED[(release.split("-")[0], mode)]
    assert report["needed"] == expected, report["verdict"]
    assert [p["name"] for p in report["patches"]] == PROBED
    assert all(isinstance(p["needed"], bool) for p in report["patches"])
    here = "plain" if mode == "plain" else "-O"
    other = "-O" if mode == "plain" else "plain"
    assert report["levels"][here]["here"] is True and report["levels"][other]["here"] is False
    assert [n["name"] for n in report["levels"][here]["needed"]] == expected
    assert [n["name"] for n in report["levels"][other]["needed"]] == \
        NEEDED[(release.split("-")[0], "O" if mode == "plain" else "plain")]
    assert [n["name"] for n in report["levels"]["-OO"]["needed"]] == \
        [n["name"] for n in report["levels"]["-O"]["needed"]]
    assert report["removable"] is False  # every release up to 0.33.0 needs -O parity under -O
    assert section["rc"] == report["exit_status"] == 0, report["verdict"]
    for entry in report["patches"]:
        assert entry["problems"] == [], entry
        assert entry["fixes"] is True, entry
        if entry["needed"]:
            assert entry["kind"] == "applied", entry
        else:
            assert entry["kind"] in ("not_needed", "not_affected"), entry
    parity = report["patches"][0]
    assert parity["state"] == ("applied (package: vLLM's modules load with plain Python's bytecode)"
                               if mode == "O" else
                               "not affected (python without -O keeps vLLM's asserts)")
    if release.startswith("0.28"):  # RecoverSSM does not exist there: not affected
        kinds = {p["name"]: p["kind"] for p in report["patches"]}
        assert kinds["capture_workspace"] == kinds["kda_overlong_rows"] == "not_affected"
        assert kinds["kv_spec_merge"] == "not_needed"  # 0.28.0's merge keeps the capability (any)
        for entry in report["patches"]:
            if entry["name"] in ("capture_workspace", "kda_overlong_rows"):
                assert entry["affected"] is False and "no RecoverSSM" in entry["without"]["detail"]


@pytest.mark.parametrize("mode", ["plain", "O"])
def test_needed_is_what_the_unpatched_probes_show(release, mode):
    on, _ = check_report(child(release, "on", mode))
    off, off_section = check_report(child(release, "off", mode))
    for mine, ref in zip(on["patches"], off["patches"]):
        unpatched = ref["without"]  # vLLM as released, the shim off
        assert isinstance(unpatched["ok"], bool) and not unpatched["error"], unpatched
        assert mine["needed"] is (not unpatched["ok"]), (mine, unpatched)
        assert mine["state"].startswith(("applied",) if mine["needed"]
                                        else ("not needed", "not affected")), mine
    # KIMI_HOTFIX=0: the same needs, nothing applied, so this setup is exposed
    assert off["needed"] == on["needed"]
    assert all(p["kind"] == "disabled" for p in off["patches"])
    # each toggled on alone fixes its probe; but under -O with the shim off, parity is off
    # too, and the capability wrapper alone cannot keep the planner's merges apart (the
    # KDA-first set mixes layers): kv_spec_merge relies on parity there, and says so
    for entry in off["patches"]:
        alone = mode == "O" and entry["name"] == "kv_spec_merge" and entry["needed"]
        assert entry["fixes"] is not alone, entry
    assert off_section["rc"] == (1 if on["needed"] else 0)
    if on["needed"]:
        assert off["verdict"].startswith("kimi-hotfix check FAILED") and not off["removable"]
        for entry in off["patches"]:
            assert not entry["needed"] or any("disabled" in p for p in entry["problems"])


def test_each_level_is_reported_and_the_runs_agree(release):
    """A plain run decides -O's needs from the checks, an -O run plain's: each
    agrees with what the other run's probes found."""
    plain, _ = check_report(child(release, "on", "plain"))
    optimized, _ = check_report(child(release, "on", "O"))

    def names(report, label):
        return [n["name"] for n in report["levels"][label]["needed"]]

    assert names(plain, "-O") == optimized["needed"] == names(optimized, "-O")
    assert names(optimized, "plain") == plain["needed"] == names(plain, "plain")
    only_O = [n for n in optimized["needed"] if n not in plain["needed"]]
    for name in only_O:
        assert f"{name} under -O" in plain["verdict"], plain["verdict"]
    if not plain["needed"]:
        assert plain["verdict"].startswith("nothing needs kimi-hotfix in this interpreter; "
                                           "other optimize levels need it too")


@pytest.mark.releases(*CHECKED)
@pytest.mark.parametrize("mode", ["plain", "O"])
def test_status_expectation_agrees_with_check(release, mode):
    flags = ["-O"] if mode == "O" else []
    proc = run_python(["-m", "kimi_hotfix", "status", "--json"], python=venv_python(release),
                      flags=flags, cwd=REPO)
    status = json.loads(proc.stdout)
    report, _ = check_report(child(release, "on", mode))
    assert status["vllm"]["version"] == report["vllm"] == release.split("-")[0]
    entries = [status["o_parity"], *status["patches"]]
    expected = {p["name"]: p["expected_needed"] for p in entries}
    assert expected == {p["name"]: p["needed"] for p in report["patches"]}
    assert status["o_parity"]["kind"] == ("pending" if mode == "O" else "not_affected")
    assert {p["kind"] for p in status["patches"]} == {"pending"}


@pytest.mark.releases(*CHECKED)
@pytest.mark.parametrize("mode", ["plain", "O"])
def test_check_leaves_the_shim_as_it_found_it(release, mode):
    run = child(release, "on", mode)
    section, cli = run["check"], run["cli"]
    assert section["states_after"] == section["states_before"]
    assert cli["rc"] == section["rc"]
    text = cli["stdout"]
    assert text.count("without the patch") == len(PROBED)
    verdict = [line for line in text.splitlines() if line.startswith("verdict: ")]
    assert verdict == [f"verdict: {json.loads(section['stdout'])['verdict']}"]


# -- a check that raises is never "not needed" (issue 8) -------------------------------


@pytest.mark.releases("0.33.0")
def test_O_keeps_the_merges_plain_even_when_the_probe_raises(release):
    """0.33.0 -O, MLAAttentionSpec's constructor failing while the shim decides:
    kv_spec_merge cannot tell and applies to be safe; -O parity keeps the merges'
    asserts live, so the grouping is the reference's (plain Python's)."""
    run = child(release, "ctor", "O")
    assert run["process"]["mla_ctor_broken_at_import"] is True
    assert run.states["kv_spec_merge"].startswith("applied (cannot tell: its decide raised TypeError")
    assert run["wrapped"]["merge"]["MLAAttentionSpec"] is True
    warnings = warning_lines(run.stderr)
    assert len(warnings) == 1 and "cannot tell whether kv_spec_merge is needed" in warnings[0]
    assert run["kv"]["groupings"] == reference()["kv"]["groupings"]
    assert run["kv"]["probe"]["ok"] is True
    # the same release without the shim under -O groups wrongly (the reproduction): -O's
    # merges (parity's to restore; the capability is 0.33.0's own)
    off = child(release, "off", "O")["kv"]
    assert off["groupings"] != reference()["kv"]["groupings"]
    assert "-O parity's" in off["probe"]["detail"], off["probe"]


@pytest.mark.releases("0.33.0")
def test_plain_probe_that_raises_applies_and_warns(release):
    run = child(release, "ctor", "plain")
    state = run.states["kv_spec_merge"]
    assert state == ("applied (cannot tell: its decide raised TypeError: MLAAttentionSpec."
                     "__init__() missing 1 required argument: 'new_field'; applied to be safe)")
    warnings = warning_lines(run.stderr)
    assert len(warnings) == 1 and "cannot tell whether kv_spec_merge is needed" in warnings[0]
    (lines,) = summaries(run.stderr).values()
    assert any(f"kv_spec_merge: {state} |" in line for line in lines), lines
    assert run["kv"]["groupings"] == reference()["kv"]["groupings"]  # harmless where fixed


@pytest.mark.releases("0.33.0")
def test_strict_mode_raises_when_a_check_cannot_tell(release):
    """The ctor child decides kv_spec_merge again in strict mode, its last section
    (a process of its own before issue 30); that strict mode's error fails the
    import itself is the shim's mechanics (tests/unit/test_states.py)."""
    raised = child(release, "ctor", "plain")["strict_cannot_tell"]
    assert raised.startswith("kimi_hotfix.runtime.base.KimiHotfixError: kv_spec_merge: cannot tell "
                             "whether it is needed: its decide raised TypeError"), raised


# -- the main job ------------------------------------------------------------------------


@pytest.mark.releases("0.29.0")
def test_demo_shows_the_probes_side_by_side(release):
    proc = subprocess.run([str(REPO / "scripts" / "demo"), "--quick", "0.29.0"],
                          env=hermetic_env(shim=False),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    out = proc.stdout
    assert "python -O -m kimi_hotfix check" in out
    assert out.count("without the patch") == len(PROBED)
    assert out.count("-> NEEDED, fixed by the patch") == len(PROBED)
    for name in PROBED:
        assert f"  {name}: " in out
    assert "mla_target_draft" in out and "AttributeError" in out
    assert "largest mixed graph" in out and "ValueError: KDA RecoverSSM" in out
    verdict = [line for line in out.splitlines() if line.startswith("verdict: ")]
    report, _ = check_report(child(release, "on", "O"))
    assert verdict == [f"verdict: {report['verdict']}"]
    assert "shim log: " in out and "kv_spec_merge: applied" in out
    proc = subprocess.run([str(REPO / "scripts" / "demo"), "x", "y"], capture_output=True,
                          text=True)
    assert proc.returncode == 2 and "usage" in proc.stderr
