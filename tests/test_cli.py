"""The operator commands, ``python -m kimi_hotfix status|check`` (issue 4 items 1-2),
in real interpreters of each vLLM venv.

status (cheap, no vLLM import):
- imports no vllm, torch or wrapt (``sys.modules`` after the command and
  ``-X importtime``), and its imports add up to well under a second;
- the resolved toggles, with the config parser's own warnings for garbage values,
  and the per-patch decision (disabled / forced / decided when vLLM imports ...);
- whether this interpreter loaded the shim's sitecustomize, the container
  sitecustomize it chained, and why it did not load under -S, -I and -E;
- the optimize level (-O, -OO, PYTHONOPTIMIZE, which -E ignores);
- the vLLM plugin entry point (a dist-info on sys.path) and VLLM_PLUGINS.

check (the preflight, real vLLM, plain and -O):
- ``needed`` equals the probes' result on vLLM as released, taken from a second
  check run where the shim never loads and is off (no PYTHONPATH, KIMI_HOTFIX=0):
  that is the reproduction of each bug, in the same test run; every needed patch
  fixes its probe, the shim's own decision agrees, exit 0;
- that shim-off run finds the same needs, says disabled, and exits 1 where
  something is needed (the setup as configured would hit the bug);
- it agrees with ``status``'s version-based expectation on every release
  (0.29.0: all three; 0.30.0: kda_overlong_rows, and kv_spec_merge under -O;
  0.33.0: kv_spec_merge under -O only);
- without -O, the -O-only need is announced and equals what the -O run finds;
- --json prints exactly one object on stdout (vLLM's stdout logging goes to stderr);
- scripts/demo (0.29.0): the side-by-side output and the verdict of the -O run;
- usage errors exit 2; a Python without vLLM gets a message and exit 2, no traceback.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import JSON_MARK, REPO, VLLM_VERSION, hermetic_env, json_lines, run_python

pytestmark = pytest.mark.vllm("0.29.0", "0.30.0", "0.33.0")

PACKAGE_DIR = str(REPO / "kimi_hotfix")  # ``python <dir>`` works under -I/-E too
HEAVY = ("vllm", "torch", "wrapt")
TOGGLES = (
    "KIMI_HOTFIX",
    "KIMI_HOTFIX_DISABLE",
    "KIMI_HOTFIX_FORCE",
    "KIMI_HOTFIX_STRICT",
    "KIMI_HOTFIX_LOG_LEVEL",
)


def patch_names():
    from kimi_hotfix import core

    return core.patch_names()


def status(flags=(), env=None, args=("--json",), python=None):
    proc = run_python([PACKAGE_DIR, "status", *args], flags=flags, env=env, python=python)
    return json.loads(proc.stdout) if "--json" in args else proc.stdout


# -- status -------------------------------------------------------------------


def test_status_imports_no_vllm_torch_wrapt():
    code = (
        "import sys\n"
        "from kimi_hotfix.cli import main\n"
        "rc = main(['status', '--json'])\n"
        f"print({JSON_MARK!r} + __import__('json').dumps({{'rc': rc, 'modules': sorted(sys.modules)}}))\n"
    )
    proc = run_python(["-X", "importtime", "-c", code], env=hermetic_env())
    result = json_lines(proc.stdout)[0]
    assert result["rc"] == 0
    assert "kimi_hotfix_sitecustomize" in result["modules"]  # the shim is active here
    assert "kimi_hotfix.cli" in result["modules"]
    assert [m for m in result["modules"] if m.split(".")[0] in HEAVY] == []
    # -X importtime: "import time: self [us] | cumulative | name", one per import.
    rows = [line.split("|") for line in proc.stderr.splitlines() if line.startswith("import time:")]
    names = [r[2].strip() for r in rows if r[0].split(":")[1].strip().isdigit()]
    assert "kimi_hotfix.cli" in names
    assert [n for n in names if n.split(".")[0] in HEAVY] == []
    total_us = sum(int(r[0].split(":")[1]) for r in rows if r[0].split(":")[1].strip().isdigit())
    assert total_us < 1_000_000, f"status imports took {total_us} us"
    # The module entry point itself (python -m), under importtime too.
    proc = run_python(["-X", "importtime", "-m", "kimi_hotfix", "status"], env=hermetic_env(), cwd=REPO)
    imported = [line.split("|")[2].strip() for line in proc.stderr.splitlines() if line.startswith("import time:") and "|" in line]
    assert "kimi_hotfix.__main__" in imported or "kimi_hotfix.cli" in imported
    assert [n for n in imported if n.split(".")[0] in HEAVY] == []


def test_status_reports_interpreter_vllm_and_patches():
    from importlib.metadata import version

    from kimi_hotfix import core

    report = status(flags=["-O"])
    assert report["python"]["optimize"] == 1 and report["python"]["executable"] == sys.executable
    assert report["vllm"] == {"installed": True, "version": version("vllm")}
    assert report["wrapt"]["installed"] is True
    assert [p["name"] for p in report["patches"]] == list(patch_names())
    for entry in report["patches"]:
        patch = core.patches()[entry["name"]]
        assert entry["target"] == patch.target and entry["fixed_in"] == patch.fixed_in
        assert entry["upstream"] == patch.upstream and entry["wraps"] == list(patch.wraps)
        assert entry["decision"].startswith(f"decided when vLLM imports {patch.target}: ")
        assert isinstance(entry["expected_needed"], bool) and entry["expectation"]
    by_name = {p["name"]: p for p in report["patches"]}
    # Under -O the merges' bare asserts make kv_spec_merge needed (every release here).
    assert by_name["kv_spec_merge"]["expected_needed"] is True
    assert "-O" in by_name["kv_spec_merge"]["expectation"]
    text = status(flags=["-O"], args=())
    assert "optimize 1 (-O)" in text and f"vllm       {version('vllm')}" in text
    for name in patch_names():
        assert re.search(rf"^    {name} +\S", text, re.M), text


def test_status_toggles_and_their_warnings():
    from kimi_hotfix import config

    garbage = {
        "KIMI_HOTFIX": "maybe",
        "KIMI_HOTFIX_DISABLE": "kv_spec_merge, nonsense",
        "KIMI_HOTFIX_FORCE": "capture_workspace,,kv_spec_merge",
        "KIMI_HOTFIX_STRICT": "2",
        "KIMI_HOTFIX_LOG_LEVEL": "loud",
    }
    report = status(env=hermetic_env(**garbage))
    expected = config.parse(patch_names(), environ=garbage)  # the shim's own parser
    toggles = report["toggles"]
    assert toggles["warnings"] == list(expected.warnings)
    assert len(toggles["warnings"]) == 5  # each variable, and disabled+forced
    for variable in ("KIMI_HOTFIX=", "KIMI_HOTFIX_DISABLE", "KIMI_HOTFIX_STRICT", "KIMI_HOTFIX_LOG_LEVEL"):
        assert any(variable in w for w in toggles["warnings"]), variable
    assert toggles["enabled"] is True and toggles["strict"] is False
    assert toggles["disabled"] == ["kv_spec_merge"] and toggles["forced"] == ["capture_workspace"]
    assert toggles["set"] == garbage
    decisions = {p["name"]: p["decision"] for p in report["patches"]}
    assert decisions["kv_spec_merge"] == "disabled (KIMI_HOTFIX_DISABLE)"
    assert decisions["capture_workspace"].startswith("forced (KIMI_HOTFIX_FORCE)")
    assert decisions["kda_overlong_rows"].startswith("decided when vLLM imports")
    text = status(env=hermetic_env(**garbage), args=())
    warning_lines = [line for line in text.splitlines() if line.startswith("  WARNING")]
    assert len(warning_lines) == 5 and "'nonsense'" in text and "'loud'" in text
    # The master switch off: every patch disabled, and status says the shim is off.
    report = status(env=hermetic_env(KIMI_HOTFIX="off"))
    assert report["toggles"]["warnings"] == [] and report["active"].startswith("OFF")
    assert {p["decision"] for p in report["patches"]} == {"disabled (KIMI_HOTFIX=off)"}


def test_status_sees_the_shim_and_the_chained_sitecustomize(tmp_path):
    container = tmp_path / "container"
    container.mkdir()
    (container / "sitecustomize.py").write_text("CONTAINER_SITE = True\n")
    env = hermetic_env(PYTHONPATH=os.pathsep.join([str(REPO), str(container)]))
    shim = status(env=env)["shim"]
    assert shim["sitecustomize_loaded"] is True
    assert shim["loaded_from"] == str(REPO / "sitecustomize.py")
    assert shim["chained"] == [str(container / "sitecustomize.py")]
    text = status(env=env, args=())
    assert f"loaded by this interpreter from {REPO / 'sitecustomize.py'}" in text
    assert f"chained    {container / 'sitecustomize.py'}" in text
    # The repository as the working directory is not enough: site.py runs first.
    proc = run_python(["-m", "kimi_hotfix", "status", "--json"], env=hermetic_env(shim=False), cwd=REPO)
    report = json.loads(proc.stdout)
    assert report["shim"]["sitecustomize_loaded"] is False
    assert "not on PYTHONPATH" in report["shim"]["why"]
    assert report["active"].startswith("INACTIVE")


@pytest.mark.parametrize("flag", ["-S", "-I", "-E"])
def test_status_explains_why_the_shim_cannot_load(flag):
    report = status(flags=[flag], env=hermetic_env(PYTHONOPTIMIZE="1"))
    py = report["python"]
    assert py["no_site"] is (flag == "-S")
    assert py["isolated"] is (flag == "-I")
    assert py["ignore_environment"] is (flag in ("-I", "-E"))
    assert report["shim"]["sitecustomize_loaded"] is False
    assert report["active"].startswith("INACTIVE")
    notes = " ".join(py["notes"])
    if flag == "-S":
        assert "no sitecustomize runs" in notes and "-S" in report["shim"]["why"]
        assert py["optimize"] == 1  # PYTHONOPTIMIZE is honoured under -S
    else:
        assert f"{flag}: PYTHON* variables are ignored, PYTHONPATH included" in notes
        assert "PYTHONPATH is ignored" in report["shim"]["why"]
        assert "KIMI_HOTFIX_* variables are still read" in notes
        assert py["optimize"] == 0 and "PYTHONOPTIMIZE is set but ignored" in notes
    text = status(flags=[flag], args=())
    assert "note" in text and ("-S yes" if flag == "-S" else f"{flag} yes") in text


def test_status_optimize_levels():
    assert status(flags=["-OO"])["python"]["optimize"] == 2
    report = status(env=hermetic_env(PYTHONOPTIMIZE="2"))
    assert report["python"]["optimize"] == 2 and report["python"]["PYTHONOPTIMIZE"] == "2"
    assert any("docstrings" in n for n in report["python"]["notes"])
    assert status()["python"]["optimize"] == 0


def test_status_sees_the_vllm_plugin_entry_point(tmp_path):
    """An installed distribution is a dist-info on sys.path with the entry point."""
    dist = tmp_path / "kimi_hotfix-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kimi-hotfix\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text(
        "[vllm.general_plugins]\nkimi_hotfix = kimi_hotfix.plugin:register\n"
    )
    path = os.pathsep.join([str(tmp_path), str(REPO)])
    plugin = status(env=hermetic_env(PYTHONPATH=path))["plugin"]
    assert plugin["installed"] is True and plugin["loads"] is True
    assert plugin["value"] == "kimi_hotfix.plugin:register"
    plugin = status(env=hermetic_env(PYTHONPATH=path, VLLM_PLUGINS="other"))["plugin"]
    assert plugin["installed"] is True and plugin["loads"] is False
    assert "VLLM_PLUGINS" in plugin["why"]
    # Without that directory: the repository checkout itself has no dist-info.
    assert status(env=hermetic_env(shim=False))["plugin"]["installed"] is False


def test_usage_errors_exit_2():
    for args in ([], ["bogus"], ["status", "--bogus"], ["check", "--nope"], ["status", "extra"]):
        proc = run_python([PACKAGE_DIR, *args], check=False)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "usage:" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_python([PACKAGE_DIR, "--help"])
    assert "status" in proc.stdout and "check" in proc.stdout


def test_without_vllm_status_works_and_check_exits_2(tmp_path):
    """A Python that has no vLLM: status says so; check explains and exits 2."""
    venv = tmp_path / "novllm"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    report = status(python=python)
    assert report["vllm"] == {"installed": False, "version": None}
    assert report["wrapt"]["installed"] is False
    assert all(p["expected_needed"] is None for p in report["patches"])
    proc = run_python([PACKAGE_DIR, "check"], python=python, check=False)
    assert proc.returncode == 2
    assert "vLLM is not installed" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_python([PACKAGE_DIR, "check", "--json"], python=python, check=False)
    assert proc.returncode == 2 and json.loads(proc.stdout)["vllm"] is None


# -- check (real vLLM) ----------------------------------------------------------

_runs: dict = {}


def check_json(flags, env):
    proc = run_python([PACKAGE_DIR, "check", "--json"], flags=flags, env=env, check=False)
    try:
        report = json.loads(proc.stdout)  # exactly one object on stdout
    except ValueError:
        pytest.fail(f"check --json stdout is not one JSON object:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return report, proc


def runs(mode: str) -> dict:
    """For one mode ("plain" or "O"), computed once per module: check --json with
    the shim on PYTHONPATH; the reference, check --json where the shim never
    loads and is off (no PYTHONPATH, KIMI_HOTFIX=0), whose "without" runs are
    the probes on vLLM as released; and status."""
    if mode not in _runs:
        flags = ["-O"] if mode == "O" else []
        on, proc = check_json(flags, hermetic_env())
        off, off_proc = check_json(flags, hermetic_env(shim=False, KIMI_HOTFIX="0"))
        _runs[mode] = {
            "check": on,
            "rc": proc.returncode,
            "stderr": proc.stderr,
            "off": off,
            "off_rc": off_proc.returncode,
            "status": status(flags=flags),
        }
    return _runs[mode]


@pytest.mark.parametrize("mode", ["plain", "O"])
def test_check_needed_matches_the_unpatched_probes(mode):
    run = runs(mode)
    report, reference = run["check"], {p["name"]: p for p in run["off"]["patches"]}
    assert run["rc"] == 0, report["verdict"]
    assert report["vllm"] == VLLM_VERSION
    assert report["python"]["optimize"] == (1 if mode == "O" else 0)
    assert [p["name"] for p in report["patches"]] == list(patch_names())
    for entry in report["patches"]:
        ref = reference[entry["name"]]["without"]  # vLLM as released, shim never loaded
        assert isinstance(ref["ok"], bool) and "error" not in ref, ref
        # needed <=> the probe fails on the unpatched vLLM.
        assert entry["needed"] is (not ref["ok"]), (entry, ref)
        assert entry["without"]["ok"] is ref["ok"]
        assert entry["with"]["ok"] is True and entry["fixes"] is True, entry
        assert entry["problems"] == []
        # The shim's own decision agrees with the probe.
        assert entry["state"].startswith("applied" if entry["needed"] else "not needed"), entry
    needed = [p["name"] for p in report["patches"] if p["needed"]]
    assert report["needed"] == needed
    assert report["removable"] is (not needed)
    if needed:
        assert report["verdict"].startswith(f"kimi-hotfix is needed here for {needed[0]}")
        assert all(name in report["verdict"] for name in needed)
    else:
        assert report["verdict"].startswith("nothing here needs kimi-hotfix")
    # The shim's summary line, on stderr.
    assert "kimi-hotfix 0.1.0 (vllm" in run["stderr"]


@pytest.mark.parametrize("mode", ["plain", "O"])
def test_check_with_the_shim_off_finds_the_same_needs_and_fails(mode):
    """KIMI_HOTFIX=0: the same needs are found, the shim applies nothing, so a
    needed patch leaves this setup exposed: exit 1 (0 where nothing is needed)."""
    run = runs(mode)
    on, off = run["check"], run["off"]
    assert [p["needed"] for p in off["patches"]] == [p["needed"] for p in on["patches"]]
    assert all(p["state"].startswith("disabled") for p in off["patches"])
    assert all(p["fixes"] for p in off["patches"])  # forced for the probe, it fixes
    assert run["off_rc"] == (1 if on["needed"] else 0)
    for entry in off["patches"]:
        if entry["needed"]:
            assert any("disabled" in p for p in entry["problems"]), entry
    if on["needed"]:
        assert off["verdict"].startswith("kimi-hotfix check FAILED") and off["removable"] is False


@pytest.mark.parametrize("mode", ["plain", "O"])
def test_check_agrees_with_status_expectations(mode):
    """status' version-based expectation (fixed_in; -O: the merges' asserts) is
    what the probes find on the real release."""
    run = runs(mode)
    expected = {p["name"]: p["expected_needed"] for p in run["status"]["patches"]}
    found = {p["name"]: p["needed"] for p in run["check"]["patches"]}
    assert found == expected
    if VLLM_VERSION == "0.29.0":  # the brief: every patch needed, plain and -O
        assert all(found.values()) and run["check"]["removable"] is False


def test_check_announces_the_O_only_need():
    """Without -O, check names the patches that -O would need; the -O run of the
    same release finds exactly those (on top of the plain needs)."""
    plain, optimized = runs("plain")["check"], runs("O")["check"]
    announced = [u["name"] for u in plain["needed_under_O"]]
    assert announced == [n for n in optimized["needed"] if n not in plain["needed"]]
    assert optimized["needed_under_O"] == []
    if announced:
        assert "python -O" in plain["verdict"] and all(n in plain["verdict"] for n in announced)
        assert optimized["removable"] is False
    if plain["removable"]:
        assert plain["verdict"].startswith("nothing here needs kimi-hotfix")


@pytest.mark.vllm("0.29.0")
def test_demo_shows_the_probes_side_by_side():
    """scripts/demo: python -O check on the real 0.29.0, without and with each patch."""
    proc = subprocess.run(
        [str(REPO / "scripts" / "demo"), "0.29.0"],
        env=hermetic_env(shim=False),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    out = proc.stdout
    assert "python -O -m kimi_hotfix check" in out
    assert out.count("without the patch") == len(patch_names())
    for name in patch_names():
        assert f"  {name}: " in out
    assert out.count("-> NEEDED, fixed by the patch") == len(patch_names())
    # The grouping per layer set, the capture plan and the over-long row, both ways.
    assert "mla_target_draft" in out and "AttributeError" in out
    # (cells wrap, so only phrases that start a cell are looked for)
    assert "largest mixed graph" in out and "ValueError: KDA RecoverSSM" in out
    verdict = [line for line in out.splitlines() if line.startswith("verdict: ")]
    assert verdict == [f"verdict: {runs('O')['check']['verdict']}"]
    assert "shim log: " in out and "kv_spec_merge: applied" in out
    proc = subprocess.run([str(REPO / "scripts" / "demo"), "x", "y"], capture_output=True, text=True)
    assert proc.returncode == 2 and "usage" in proc.stderr


RESTORES = (
    "import json\n"
    "from kimi_hotfix import core, preflight\n"
    "report = preflight.run()\n"
    "print('KIMI_JSON:' + json.dumps({'decided': {p['name']: p['state'] for p in report['patches']},\n"
    "                                 'after': core.states()}))\n"
)


@pytest.mark.vllm("0.33.0")
def test_check_leaves_the_shim_as_it_found_it():
    """check toggles every patch, needed or not; afterwards each state (and the
    methods) are what the shim had decided, e.g. "not needed: ...", not "undone"."""
    proc = run_python(["-c", RESTORES], env=hermetic_env(), cwd=REPO)
    out = json_lines(proc.stdout)[0]
    assert any(s.startswith("not needed") for s in out["decided"].values()), out
    assert out["after"] == out["decided"]
